"""What a loader says when its input is wrong, without torch: a CLI error about a missing file or a broken config
answers at once, before the seconds that importing torch takes."""
from __future__ import annotations

import json


class LoadError(Exception):
    """A checkpoint cannot be loaded. The message is one line naming the file and what is wrong with it."""

    def __init__(self, message: str):
        super().__init__(printable(message))


def printable(text: str) -> str:
    """Text safe to print on one line: control characters (a newline in a file name) and the surrogates that
    stand for bytes which are not UTF-8 (b'\\xff' in a path from argv) become backslash escapes."""
    out = []
    for c in text:
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        elif 0xD800 <= o <= 0xDFFF or o < 0x20 or 0x7F <= o < 0xA0:
            out.append(c.encode("unicode_escape").decode("ascii") if o < 0xD800 else f"\\u{o:04x}")
        else:
            out.append(c)
    return "".join(out)


def one_line(e: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, so a LoadError never carries a multi-line dump."""
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def read_json_object(path) -> dict:
    """A config file's JSON object, or a LoadError naming the file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise LoadError(f"{path}: not a readable JSON file ({one_line(e)})") from None
    if not isinstance(raw, dict):
        raise LoadError(f"{path}: expected a JSON object")
    return raw
