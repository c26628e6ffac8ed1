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


def test_a_token_reads_as_its_characters_and_its_unfinished_bytes():
    assert readable("有".encode() + b"\xe5\xb0") == "有‹E5\u00a0B0…›"
    assert readable(b"\x9e") == "‹9E›"
    assert readable("深度".encode()) == "深度"


def test_completion_of_a_cut_character():
    very = "很".encode()
    assert completion(b"x" + very[:2], very[2:]) == "很"
    assert completion(b"x" + very[:1], very[1:] + "好".encode()) == "很好"
    assert completion(b"abc", b" d") is None  # nothing unfinished on either side


@pytest.mark.slow
def test_smollm2_chinese_example_is_readable():
    from explorer_model.loaders import load

    tok = load("smollm2").tokenizer
    ids = tok.encode("深度学习很")
    labels = fragment_labels([tok.token_bytes(i) for i in ids])
    assert len(ids) == 10 and "\\x" not in "".join(labels) and "\ufffd" not in "".join(labels)
    assert [lab.split("·")[0] for lab in labels] == list("深深深度学学习习很很")
