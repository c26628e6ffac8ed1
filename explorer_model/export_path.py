"""Where a recording will be written: the --out path checked before anything is loaded (without torch, so a
wrong path is answered at once)."""
from __future__ import annotations

import os
import stat
from pathlib import Path


class ExportError(ValueError):
    """The output cannot be written where asked; the message is one line naming the file."""


# file names that promise another format than the .npz archive written under them (a model's file among them:
# writing a recording over it would lose the model)
OTHER_FORMATS = {".npy": "single .npy array", ".pt": "torch file", ".pth": "torch file", ".bin": "weights file",
                 ".safetensors": "safetensors file", ".gguf": "GGUF model", ".json": "JSON file", ".csv": "CSV table",
                 ".txt": "text file"}


def check_target(out: str | os.PathLike) -> Path:
    """The exact file that will be written. Refuses folders, devices and other non-regular files (numpy would
    append '.npz' to the name and write somewhere else) and a folder that does not exist."""
    if str(out) == "-":  # many tools read "-" as standard output: this one would write a file named "-"
        raise ExportError("a recording is a binary .npz file and is not written to standard output ('-'); give a "
                          "file name such as recording.npz")
    try:
        path = Path(out).expanduser()
    except RuntimeError:  # ~nosuchuser/...
        raise ExportError(f"{out}: no such user's home folder") from None
    path = _through_links(path)
    if path.suffix.lower() in OTHER_FORMATS:  # e.g. x.npy: numpy would open it as an archive all the same
        raise ExportError(f"{path}: a recording is an .npz archive (one array per hook), not a "
                          f"{OTHER_FORMATS[path.suffix.lower()]}; name it {path.with_suffix('.npz').name}")
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give a file name inside it, e.g. {path / 'recording.npz'}")
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise ExportError(f"{path} is not a regular file (a device, pipe or socket); give a file name")
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: the folder {path.parent} does not exist")
    _takes_new_files(path)
    return path


def _takes_new_files(path: Path) -> None:
    """The folder accepts a new file (the temporary the write starts with): a read-only folder, or one of the
    kernel's (/proc, /sys), is refused here, before the model runs, rather than later as a full disk (such folders
    report no free space)."""
    probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return
    except OSError as e:
        raise ExportError(f"cannot write {path}: the folder {path.parent} takes no new files ({e.strerror})") from None
    os.unlink(probe)


def _through_links(path: Path) -> Path:
    """Where a symbolic link leads: its target is written (the link stays a link). A link into /proc or /dev/fd
    (`--out /dev/stdout`) names a stream, not a file, and is refused: renaming over it would replace the link."""
    hop = path
    for _ in range(40):  # the kernel's own limit on links in a row
        if not hop.is_symlink():
            return Path(os.path.realpath(path))
        hop = Path(os.path.join(hop.parent, os.readlink(hop)))
        if str(hop).startswith(("/proc/", "/dev/fd/")) or str(hop) in ("/proc", "/dev/fd"):
            raise ExportError(f"{path} leads to a stream ({hop}), not a file; give a file name")
    raise ExportError(f"{path}: too many symbolic links")
