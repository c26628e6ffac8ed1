"""The explorer's one cache folder (dequantized GGUF weights, the compiled decode step, the hooks' shapes per config:
shape_store.py) and the temporaries that a writer killed mid-write leaves behind. Without torch: the compiled
step's build and the CLI use it too."""
from __future__ import annotations

import contextlib
import glob
import os
import re
from pathlib import Path


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    root = cache_dir or os.environ.get("LLAMA_EXPLORER_CACHE") or Path.home() / ".cache" / "llama-explorer"
    return Path(root).expanduser()


_TMP = re.compile(r"\..+\.(\d+)\.tmp")


def remove_stale_temporaries(root: Path, name: str | None = None) -> None:
    """Temporaries `.<name>.<pid>.tmp` left by a writer that was killed mid-write (a first load: one per model,
    4 bytes a parameter; a recording; a compile): any whose writer process is gone. `name`: only that file's."""
    with contextlib.suppress(OSError):
        for tmp in root.glob(f".{glob.escape(name)}.*.tmp" if name else ".*.tmp"):
            m = _TMP.fullmatch(tmp.name)
            if m and not _alive(int(m.group(1))):
                tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's live process, or a name we cannot judge: leave it
    return True
