"""Where the shipped files are: assets/ beside the package (an editable install imports from the work tree)."""
import functools
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"


def shipped_json(path) -> object | None:
    """A shipped JSON file (a training log, the lab's curves and numbers) parsed, or None when it is missing or
    not JSON. Parsed once per version of the file (its size and modification time): pages read these at every
    run. The answer is shared by every caller: read it, never change it."""
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _parsed(path: str, mtime_ns: int, size: int) -> object | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
