"""GGUF llama vocabularies (SentencePiece models stored in GGUF fields) against `sentencepiece` itself, and the
GGUF field reader; the SentencePiece models and texts are test_tokenizer.py's."""

import random

import pytest

from explorer_model.tokenizer import Tokenizer, TokenizerError, read_gguf_tokenizer_fields
from test_tokenizer import CHAT, TEXTS, _assert_one_line, _gguf_fields_from_spm, _spm_with_specials, _train_spm


def test_gguf_llama_matches_sentencepiece():
    import sentencepiece as spm

    data = _train_spm("bpe")  # llama.cpp's SPM tokenizer is BPE; so are LLaMA's .model files
    sp = spm.SentencePieceProcessor(model_proto=data)
    tok = Tokenizer.from_gguf_fields(_gguf_fields_from_spm(data))
    assert (tok.kind, tok.vocab_size, tok.bos_id, tok.eos_id) == ("gguf-llama", sp.get_piece_size(), 1, 2)
    assert tok.add_bos
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == sp.encode(text), text
        assert tok.decode(ids) == text
    assert tok.encode(CHAT) == _spm_with_specials(sp, CHAT, ["<|im_start|>", "<|im_end|>"])
    assert tok.decode(tok.encode(CHAT)) == CHAT
    assert tok.encode("a <think> b") == sp.encode("a <think> b")
    assert tok.encode("<s>x", add_bos=True)[:2] == [1, 1]
    assert tok.piece(sp.piece_to_id("<0x0A>")) == "\n" and tok.piece(sp.piece_to_id("▁the")) == " the"
    assert tok.is_special(sp.piece_to_id("<|im_end|>")) and not tok.is_special(sp.piece_to_id("<think>"))


def test_gguf_llama_without_space_prefix():
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    data = _train_spm("bpe")
    m = pb.ModelProto()
    m.ParseFromString(data)
    m.normalizer_spec.add_dummy_prefix = False
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    tok = Tokenizer.from_gguf_fields(_gguf_fields_from_spm(data, **{"tokenizer.ggml.add_space_prefix": False}))
    for text in TEXTS:
        assert tok.encode(text) == sp.encode(text), text
        assert tok.decode(tok.encode(text)) == text


def test_gguf_llama_construction_is_fast_for_32k_vocab():
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz深度学习"
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁"] + list(letters)
    seen = set(tokens)
    while len(tokens) < 32000:
        t = rng.choice(["▁", ""]) + "".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))
        if t not in seen:
            seen.add(t)
            tokens.append(t)
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    fields = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.scores": [-float(i) for i in range(len(tokens))], "tokenizer.ggml.token_type": types,
              "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    tok = Tokenizer.from_gguf_fields(fields)
    text = "the quick 深度学习 fox\n🦙" * 40
    assert tok.decode(tok.encode(text)) == text


def test_gguf_llama_untyped_vocab_still_matches():
    import sentencepiece as spm

    data = _train_spm("bpe", control_symbols=[], user_defined_symbols=[])
    sp = spm.SentencePieceProcessor(model_proto=data)
    tok = Tokenizer.from_gguf_fields(_gguf_fields_from_spm(data, **{"tokenizer.ggml.token_type": None}))
    for text in TEXTS:
        assert tok.encode(text) == sp.encode(text), text
    assert tok.is_special(0) and tok.is_special(1) and tok.piece(sp.piece_to_id("<0x0A>")) == "\n"


def test_gguf_file_roundtrip(tmp_path):
    """Write a real .gguf with gguf's writer, then read it back through read_gguf_tokenizer_fields."""
    import gguf
    import sentencepiece as spm

    data = _train_spm("bpe")
    sp = spm.SentencePieceProcessor(model_proto=data)
    f = _gguf_fields_from_spm(data)
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(f["tokenizer.ggml.tokens"])
    w.add_token_scores(f["tokenizer.ggml.scores"])
    w.add_token_types(f["tokenizer.ggml.token_type"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fields = read_gguf_tokenizer_fields(gguf.GGUFReader(str(path)))
    assert fields["tokenizer.ggml.tokens"] == f["tokenizer.ggml.tokens"]
    assert fields["tokenizer.ggml.merges"] is None and fields["tokenizer.ggml.add_space_prefix"] is True
    tok = Tokenizer.from_path(path)
    assert (tok.kind, tok.bos_id, tok.eos_id) == ("gguf-llama", 1, 2)
    for text in TEXTS:
        assert tok.encode(text) == sp.encode(text), text

    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_path(tmp_path / "junk.gguf")
    _assert_one_line(e, "junk.gguf")


def test_read_gguf_fields_survives_non_utf8_tokens(tmp_path):
    import gguf

    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list([b"a", b"\xff\xfe", "é".encode()])
    w.add_token_types([1, 1, 1])
    w.add_bos_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fields = read_gguf_tokenizer_fields(gguf.GGUFReader(str(path)))
    assert fields["tokenizer.ggml.tokens"] == ["a", "\ufffd\ufffd", "é"]
    assert fields["tokenizer.ggml.token_type"] == [1, 1, 1] and fields["tokenizer.ggml.bos_token_id"] == 0
    assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] is None
