"""Tokens that are pieces of a UTF-8 character get the character's name and their place in it."""
from __future__ import annotations

import pytest

from explorer_model.tokenizer.labels import completion, fragment_labels, readable


def split(text: str, cuts: list[int]) -> list[bytes]:
    data = text.encode("utf-8")
    edges = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def test_whole_characters_keep_their_exact_text():
    assert fragment_labels([b"I", b" love", b" it", b"\n"]) == ["I", " love", " it", "\n"]
    assert fragment_labels(split("深度", [3])) == ["深", "度"]


def test_a_character_in_three_tokens_is_named_three_times():
    assert fragment_labels(split("深度学习很", [1, 2, 3, 6, 8, 9, 11, 12, 14])) == [
        "深·1/3", "深·2/3", "深·3/3", "度", "学·1/2", "学·2/2", "习·1/2", "习·2/2", "很·1/2", "很·2/2"]


def test_a_token_spanning_two_characters_names_both_parts():
    assert fragment_labels(split("深度", [2, 4])) == ["深·1/2", "深·2/2 度·1/2", "度·2/2"]
    assert fragment_labels([b" \xe6", b"\xb7\xb1"]) == [" 深·1/2", "深·2/2"]


def test_bytes_that_make_no_character_show_as_hex_and_empty_tokens_as_a_sign():
    assert fragment_labels([b"\xff", b"a", b""]) == ["‹FF›", "a", "∅"]
    # a prompt that ends inside a character (a generated step may stop there): its start, unfinished, in the token
    # or tokens that hold it, never Python's escapes
    assert fragment_labels([b"\xe5\xbe\x88", b"\xe9\x80"]) == ["很", "‹E9\u00a080…›"]
    assert fragment_labels([b"a", b"\xe9", b"\x80"]) == ["a", "‹E9…›", "‹80…›"]
    assert fragment_labels([b"a\x80b"]) == ["a ‹80›b"]  # a stray continuation byte: no character goes on


def labels_by_definition(token_bytes: list[bytes]) -> list[str]:
    """The labels as the module's docstring defines them, token by token against every character: each character of
    the joined bytes that a token holds whole keeps its text; one it holds part of is `char·k/n`, k counting the
    tokens that hold some of it; bytes of no character are byte_text."""
    from explorer_model.tokenizer.labels import _char_spans, byte_text

    bounds, pos = [], 0
    for b in token_bytes:
        bounds.append((pos, pos + len(b)))
        pos += len(b)
    data, out = b"".join(token_bytes), []
    for k, (start, end) in enumerate(bounds):
        parts = []
        for c0, c1, text, unfinished in _char_spans(data):
            if c1 <= start or c0 >= end:
                continue
            if text is None:
                parts.append((byte_text(data[max(c0, start):min(c1, end)], unfinished), True))
            elif start <= c0 and c1 <= end:
                parts.append((text, False))
            else:
                owners = [i for i, (s, e) in enumerate(bounds) if s < c1 and e > c0]
                parts.append((f"{text}·{owners.index(k) + 1}/{len(owners)}", True))
        out.append("".join((" " if piece and i and not parts[i - 1][0].isspace() else "") + text
                           for i, (text, piece) in enumerate(parts)) or "∅")
    return out


def test_labels_of_random_cuts_through_mixed_text_follow_the_definition():
    """Cuts anywhere (inside characters of 1 to 4 bytes, two in one character, empty tokens), a stray byte and a
    character cut off at the end, over a text long enough that the one pass must keep its place in both lists."""
    import random

    rng = random.Random(5)
    data = ("深度学习很 a😀é " * 12).encode() + b"\xff" + "很".encode()[:2]
    for _ in range(10):
        cuts = sorted(rng.choices(range(len(data) + 1), k=rng.randrange(1, len(data) // 2)))
        tokens = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        assert fragment_labels(tokens) == labels_by_definition(tokens)


def test_a_token_reads_as_its_characters_and_its_unfinished_bytes():
    assert readable("有".encode() + b"\xe5\xb0") == "有‹E5\u00a0B0…›"
    assert readable(b"\x9e") == "‹9E›"
    assert readable("深度".encode()) == "深度"


def test_a_token_of_invisible_characters_is_named_by_them_and_never_an_empty_label():
    from app.context import display_piece

    assert [display_piece(x) for x in (" ", "\n", "\u00a0", "\u3000", "\u200b", "\r", "")] == [
        "␣", "↵", "‹U+00A0›", "‹U+3000›", "‹U+200B›", "‹U+000D›", "∅"]
    # inside a visible label they stay: the no-break spaces that set a fragment's bytes apart among them
    assert display_piece(readable(b"\xe5\xb0")) == "‹E5\u00a0B0…›" and display_piece("a\u00a0b") == "a\u00a0b"


def test_completion_of_a_cut_character():
    very = "很".encode()
    assert completion(b"x" + very[:2], very[2:]) == "很"
    assert completion(b"x" + very[:1], very[1:] + "好".encode()) == "很好"
    assert completion(b"abc", b" d") is None  # nothing unfinished on either side
    assert completion(b"x" + very[:2], b" so") is None  # it leaves the character unfinished: it completes nothing
    assert completion(b"abc", very[:2]) is None  # it starts a character the prompt has not begun
    assert completion(b"abc", "好".encode() + very[:1]) is None


@pytest.mark.slow
def test_smollm2_chinese_example_is_readable():
    from explorer_model.loaders import load

    tok = load("smollm2").tokenizer
    ids = tok.encode("深度学习很")
    labels = fragment_labels([tok.token_bytes(i) for i in ids])
    assert len(ids) == 10 and "\\x" not in "".join(labels) and "\ufffd" not in "".join(labels)
    assert [lab.split("·")[0] for lab in labels] == list("深深深度学学习习很很")
