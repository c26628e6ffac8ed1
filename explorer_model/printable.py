"""Text from a file, an argument or a model, made safe to print on a terminal: control characters (C0, DEL, C1,
among them ESC, which starts the terminal's own commands, and the newline that would fake a second line) are
shown as escapes such as \\x1b and \\n; everything else, Chinese included, is printed as it is."""
from __future__ import annotations

import json
import re
import unicodedata

_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text, keep: str = "") -> str:
    """`text` (any object, as str) with every control character except those in `keep` escaped."""
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"),
                         str(text))


def printable_json(value, **kwargs) -> str:
    """json.dumps with non-ASCII text kept readable; C0 controls are escaped by JSON itself, DEL and C1 here."""
    return re.sub(r"[\x7f-\x9f]", lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False, **kwargs))


def padded(text: str, columns: int) -> str:
    """`text` followed by spaces up to `columns` terminal columns (at least one space): a Chinese character takes
    two columns, a combining mark none, so the next column starts at the same place on every line."""
    used = sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(1, columns - used)
