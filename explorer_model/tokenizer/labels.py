"""Readable names for tokens that are pieces of a UTF-8 character.

Byte-level vocabularies (SmolLM2, GPT-2) cut most Chinese characters into two or three tokens: 深 is the three
bytes E6 B7 B1, and a token may hold only the first two. Shown alone such a token is unreadable (`\\xe6\\xb7`).
Here a fragment is named by the character it belongs to and which of that character's tokens it is: `深·1/2`,
`深·2/2`. A token holding whole characters keeps its text; one holding the end of one character and the start
of the next shows both parts (`深·2/2 度·1/2`).
"""
from __future__ import annotations

import bisect


def byte_text(data: bytes, unfinished: bool = False) -> str:
    """Bytes that make no whole character, as hex between ‹ ›, ending in … when the character goes on past them
    (‹E9 80…›: the first two bytes of a three-byte character). The bytes are set apart by no-break spaces, which a
    token label keeps (it shows a plain space as ␣)."""
    return "\u2039" + "\u00a0".join(f"{x:02X}" for x in data) + ("\u2026\u203a" if unfinished else "\u203a")


def _char_spans(data: bytes) -> list[tuple[int, int, str | None, bool]]:
    """(start, end, text, unfinished) of every character of `data`. Bytes that make no character have text None:
    the start of a character cut off at the end of `data` is one span (unfinished), any other such byte stands
    alone."""
    spans, i = [], 0
    while i < len(data):
        for n in (1, 2, 3, 4):
            try:
                text = data[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            spans.append((i, i + n, text, False))
            i += n
            break
        else:
            if _unfinished_tail(data[i:]) == data[i:]:  # a character's start with the data ending inside it
                spans.append((i, len(data), None, True))
                break
            spans.append((i, i + 1, None, False))
            i += 1
    return spans


def readable(data: bytes) -> str:
    """`data` as text, with the bytes that make no whole character as byte_text."""
    return "".join(data[c0:c1].decode("utf-8") if text is not None else byte_text(data[c0:c1], unfinished)
                   for c0, c1, text, unfinished in _char_spans(data))


def fragment_labels(token_bytes: list[bytes]) -> list[str]:
    """One label per token of a sequence, naming each part of a split character `char·k/n`; bytes that make no
    whole character (a character cut off at the end, a stray byte) as byte_text. One pass over the tokens and the
    characters together (both run in byte order): a prompt of any length costs its length, not its square."""
    starts, ends, pos = [], [], 0
    for b in token_bytes:
        starts.append(pos)
        pos += len(b)
        ends.append(pos)
    data = b"".join(token_bytes)
    chars = _char_spans(data)
    labels, first = [], 0  # chars[first] is the first character that does not end before this token starts
    for k, (start, end) in enumerate(zip(starts, ends)):
        while first < len(chars) and chars[first][1] <= start:
            first += 1
        parts = []  # (text, is a piece of a character)
        j = first
        while j < len(chars) and chars[j][0] < end:
            c0, c1, text, unfinished = chars[j]
            j += 1
            if text is None:  # this token's own bytes of it
                parts.append((byte_text(data[max(c0, start):min(c1, end)], unfinished), True))
            elif start <= c0 and c1 <= end:
                parts.append((text, False))
            else:  # the tokens sharing this character: those ending after its start and starting before its end
                lo, hi = bisect.bisect_right(ends, c0), bisect.bisect_left(starts, c1)
                parts.append((f"{text}·{k - lo + 1}/{hi - lo}", True))
        # whole characters keep their exact text (spaces included); a piece is set apart from what precedes it
        label = "".join((" " if piece and i and not parts[i - 1][0].isspace() else "") + text
                        for i, (text, piece) in enumerate(parts))
        labels.append(label or "∅")
    return labels


def completion(prefix_bytes: bytes, candidate: bytes) -> str | None:
    """What a candidate token would complete after a prompt ending in part of a character, or None.

    `completion(b"\\xe5\\xbe", b"\\x88")` is "很": the prompt's last, unfinished character with the candidate's
    bytes added, as far as they make whole characters. A candidate that does not finish that character (" so" after
    half of 你) completes nothing: None.
    """
    tail = _unfinished_tail(prefix_bytes)
    spans = _char_spans(tail + candidate) if tail else []
    if not spans or spans[0][2] is None:  # nothing unfinished, or a candidate that does not go on with it (" so")
        return None
    return "".join(text for _, _, text, _ in spans if text is not None)


def _unfinished_tail(data: bytes) -> bytes:
    """The last bytes of `data` that start a character without finishing it."""
    for n in (1, 2, 3):
        if len(data) < n:
            break
        lead = data[-n]
        if _char_size(lead) > n:
            return data[-n:]
        if lead >> 6 != 0b10:
            break
    return b""


def missing_bytes(data: bytes) -> int:
    """How many bytes the character that `data` ends inside still lacks (0: it ends on a whole character)."""
    tail = _unfinished_tail(data)
    return _char_size(tail[0]) - len(tail) if tail else 0


def _char_size(lead: int) -> int:
    """The length of the UTF-8 character a byte starts (0 for a continuation or invalid byte)."""
    return 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 0
