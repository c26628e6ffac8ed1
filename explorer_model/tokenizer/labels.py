"""Readable names for tokens that are pieces of a UTF-8 character.

Byte-level vocabularies (SmolLM2, GPT-2) cut most Chinese characters into two or three tokens: 深 is the three
bytes E6 B7 B1, and a token may hold only the first two. Shown alone such a token is unreadable (`\\xe6\\xb7`).
Here a fragment is named by the character it belongs to and which of that character's tokens it is: `深·1/2`,
`深·2/2`. A token holding whole characters keeps its text; one holding the end of one character and the start
of the next shows both parts (`深·2/2 度·1/2`).
"""
from __future__ import annotations


def _char_spans(data: bytes) -> list[tuple[int, int, str]]:
    """(start, end, text) of every character of `data`; a byte that starts no valid character stands alone."""
    spans, i = [], 0
    while i < len(data):
        for n in (1, 2, 3, 4):
            try:
                text = data[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                continue
            spans.append((i, i + n, text))
            i += n
            break
        else:  # invalid or cut-off sequence: show the byte itself
            spans.append((i, i + 1, f"\\x{data[i]:02x}"))
            i += 1
    return spans


def fragment_labels(token_bytes: list[bytes]) -> list[str]:
    """One label per token of a sequence, naming each part of a split character `char·k/n`."""
    bounds, pos = [], 0
    for b in token_bytes:
        bounds.append((pos, pos + len(b)))
        pos += len(b)
    chars = _char_spans(b"".join(token_bytes))
    labels = []
    for start, end in bounds:
        parts = []  # (text, is a piece of a character)
        for c0, c1, text in chars:
            if c1 <= start or c0 >= end:
                continue
            if start <= c0 and c1 <= end:
                parts.append((text, False))
                continue
            owners = [i for i, (s, e) in enumerate(bounds) if s < c1 and e > c0]  # tokens sharing this character
            parts.append((f"{text}·{owners.index(bounds.index((start, end))) + 1}/{len(owners)}", True))
        # whole characters keep their exact text (spaces included); a piece is set apart from what precedes it
        label = "".join((" " if piece and i and not parts[i - 1][0].isspace() else "") + text
                        for i, (text, piece) in enumerate(parts))
        labels.append(label or "∅")
    return labels


def completion(prefix_bytes: bytes, candidate: bytes) -> str | None:
    """What a candidate token would complete after a prompt ending in part of a character, or None.

    `completion(b"\\xe5\\xbe", b"\\x88")` is "很": the prompt's last, unfinished character with the candidate's
    bytes added, as far as they make whole characters.
    """
    tail = _unfinished_tail(prefix_bytes)
    if not tail and not _unfinished_tail(candidate):
        return None
    joined = _char_spans(tail + candidate)
    whole = "".join(t for _, _, t in joined if not t.startswith("\\x"))
    return whole or None


def _unfinished_tail(data: bytes) -> bytes:
    """The last bytes of `data` that start a character without finishing it."""
    for n in (1, 2, 3):
        if len(data) < n:
            break
        lead = data[-n]
        need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 0
        if need > n:
            return data[-n:]
        if lead >> 6 != 0b10:
            break
    return b""
