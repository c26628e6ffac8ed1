"""The explorer's one cache folder (dequantized GGUF weights, the compiled decode step, the hooks' shapes per config:
shape_store.py), the temporaries that a writer killed mid-write leaves behind, and the locks that let one process
at a time fill it with a conversion or a build. Without torch: the compiled step's build and the CLI use it too."""
from __future__ import annotations

import contextlib
import glob
import os
import re
import time
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


@contextlib.contextmanager
def one_at_a_time(root: Path, wait: float = 900.0, lock: str = ".converting.lock"):
    """Hold the folder's lock (`lock`, flock) for the block: processes that would each convert the same GGUF at once
    (a server's processes starting on a new machine, with a memory of it each), or compile the decode step, do it
    one after the other, and the later ones find the first one's file. Released when the holder ends, even by
    SIGKILL. Where the lock cannot be had (no flock, an unwritable folder, a holder stuck for `wait` s) the block
    runs anyway."""
    try:
        import fcntl

        root.mkdir(parents=True, exist_ok=True)
        handle = open(root / lock, "a")
    except (ImportError, OSError):
        handle = None
    if handle is None:  # (outside the except clause: an error of the block is not chained to this one)
        yield
        return
    with handle:
        end = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    break
                time.sleep(0.1)
            except OSError:  # a file system without locks
                break
        yield
