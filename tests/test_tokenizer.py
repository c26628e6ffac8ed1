"""
Tokenizer tests against reference implementations, all built offline:
- SmolLM2's real GGUF vs transformers' GGUF tokenizer conversion: test_tokenizer_smollm2.py,
- tiny SentencePiece models trained here vs `sentencepiece` itself (as GGUF llama vocabularies: test_tokenizer_gguf.py),
- tiny byte-level BPEs trained here vs `tokenizers` / `transformers.PreTrainedTokenizerFast`.
"""

import io
import json
import random
import warnings

import pytest

from explorer_model.tokenizer import Tokenizer, TokenizerError

TEXTS = [
    "Hello world",
    " leading space",
    "tabs\tand\nnewlines\n\n",
    "  multiple   spaces",
    "深度学习很",
    "emoji 🦙🙂 ok",
    "numbers 2024 and 3.14",
    "Hello, I'm a llama. 深度学习很有趣! 🦙\n\n\tx = 12345678;  y=3.14159  ",
    "",
    " ",
    "\n",
]
CHAT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def _corpus(n=1500):
    rng = random.Random(0)
    en = ("the quick brown fox jumps over the lazy dog while llamas eat grass in the high mountains "
          "Hello world I am a llama and you are not Paris London numbers spaces tabs newlines leading "
          "multiple emoji ok deep learning").split()
    zh = list("深度学习很有趣我们今天学习语言模型的内部结构和注意力机制")
    lines = []
    for _ in range(n):
        words = [rng.choice(en) for _ in range(rng.randint(3, 12))]
        lines.append(" ".join(words) + rng.choice([".", ",", "!", "?", ""]) + f" {rng.randint(0, 99999)}")
        lines.append("".join(rng.choice(zh) for _ in range(rng.randint(4, 20))))
        lines.append("\t" + "  ".join(words[:3]) + " 3.14")
    return lines


# ---------------------------------------------------------------------------- SentencePiece

def _train_spm(model_type, **kw):
    import sentencepiece as spm

    args = dict(model_type=model_type, vocab_size=600, byte_fallback=True, normalization_rule_name="identity",
                remove_extra_whitespaces=False, split_digits=True, control_symbols=["<|im_start|>", "<|im_end|>"],
                user_defined_symbols=["<think>"], minloglevel=2)
    args.update(kw)
    bio = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_corpus()), model_writer=bio, **args)
    return bio.getvalue()


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def spm_model(request, tmp_path_factory):
    import sentencepiece as spm

    data = _train_spm(request.param)
    path = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    path.write_bytes(data)
    return path, data, spm.SentencePieceProcessor(model_proto=data)


def _gguf_fields_from_spm(data, **overrides):
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.ParseFromString(data)
    fields = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": None,
        "tokenizer.ggml.tokens": [p.piece for p in m.pieces],
        "tokenizer.ggml.scores": [p.score for p in m.pieces],
        "tokenizer.ggml.token_type": [int(p.type) for p in m.pieces],
        "tokenizer.ggml.merges": None, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": True,
    }
    fields.update(overrides)
    return fields


def _spm_with_specials(sp, text, specials):
    # the documented behaviour: split on control tokens, encode every chunk with sentencepiece
    import re
    out, pos = [], 0
    for m in re.finditer("|".join(map(re.escape, specials)), text):
        out += sp.encode(text[pos:m.start()]) + [sp.piece_to_id(m.group())]
        pos = m.end()
    return out + sp.encode(text[pos:])


def test_sentencepiece_matches_reference(spm_model):
    path, _, sp = spm_model
    tok = Tokenizer.from_sentencepiece(path)
    assert tok.kind == "sentencepiece"
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (sp.get_piece_size(), 1, 2)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == sp.encode(text), text
        assert tok.decode(ids) == text
        assert tok.encode(text, add_bos=True) == [1] + ids
    # user-defined symbols are sentencepiece's own business and must stay identical
    assert tok.encode("a <think> b") == sp.encode("a <think> b")


def test_sentencepiece_special_tokens(spm_model):
    path, _, sp = spm_model
    tok = Tokenizer.from_sentencepiece(path)
    ids = tok.encode(CHAT)
    assert ids == _spm_with_specials(sp, CHAT, ["<|im_start|>", "<|im_end|>"])
    assert ids[0] == sp.piece_to_id("<|im_start|>") and ids.count(sp.piece_to_id("<|im_end|>")) == 1
    assert tok.decode(ids) == CHAT
    assert tok.encode("<s>Hi</s>") == [1] + sp.encode("Hi") + [2]
    assert tok.decode(tok.encode("Hi <s> there</s>")) == "Hi <s> there</s>"
    assert tok.is_special(1) and tok.is_special(0) and not tok.is_special(tok.encode("x")[-1])
    assert tok.piece(3) == "<|im_start|>" and tok.token_bytes(3) == b"<|im_start|>"


def test_sentencepiece_pieces_and_bytes(spm_model):
    path, _, sp = spm_model
    tok = Tokenizer.from_sentencepiece(path)
    assert tok.piece(sp.piece_to_id("<0x0A>")) == "\n"
    assert tok.token_bytes(sp.piece_to_id("<0xF0>")) == b"\xf0"
    assert tok.piece(sp.piece_to_id("▁")) == " "
    for text in TEXTS:
        raw = b"".join(tok.token_bytes(i) for i in tok.encode(text))
        # sentencepiece's dummy prefix is a real "▁" piece; the decoder drops it again
        assert raw == (" " + text).encode() if text else raw == b""


def test_an_id_past_the_last_piece_reads_as_its_placeholder(spm_model, bpe_dir):
    """A checkpoint's embedding may have more rows than its tokenizer has pieces: the model still ranks those ids
    (a candidate for the next token, a generated one), and they read as "[id=N]" instead of failing."""
    for tok in (Tokenizer.from_sentencepiece(spm_model[0]), Tokenizer.from_path(bpe_dir)):
        past = tok.vocab_size + 4
        assert (tok.knows(tok.vocab_size - 1), tok.knows(tok.vocab_size), tok.knows(-1)) == (True, False, False)
        assert tok.piece(past) == f"[id={past}]" and tok.token_bytes(past) == f"[id={past}]".encode()
        ids = tok.encode("the cat")
        assert tok.decode(ids + [past] + ids) == f"{tok.decode(ids)}[id={past}]{tok.decode(ids)}"
        assert tok.decode(ids) == "the cat"


def test_sentencepiece_nfkc_model_matches_reference(tmp_path):
    import sentencepiece as spm

    data = _train_spm("unigram", normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True)
    (tmp_path / "tokenizer.model").write_bytes(data)
    sp = spm.SentencePieceProcessor(model_proto=data)
    tok = Tokenizer.from_path(tmp_path)
    for text in TEXTS + ["ｆｕｌｌｗｉｄｔｈ①"]:
        assert tok.encode(text) == sp.encode(text), text


# ---------------------------------------------------------------------------- byte-level BPE / tokenizer.json

@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(_corpus(), trainer)
    d = tmp_path_factory.mktemp("bpe")
    hf.save(str(d / "tokenizer.json"))
    return d


def _gguf_fields_from_json(path, pre):
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    specials = {t["content"] for t in spec["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": None, "tokenizer.ggml.token_type": [3 if t in specials else 1 for t in tokens],
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_bos_token": False}


def test_tokenizer_json_matches_reference(bpe_dir):
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import PreTrainedTokenizerFast

    ref = HFTokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(bpe_dir / "tokenizer.json"))
    tok = Tokenizer.from_path(bpe_dir)
    assert tok.kind == "tokenizer.json" and tok.vocab_size == ref.get_vocab_size()
    assert tok.bos_id is None and tok.eos_id is None  # no sibling configs
    for text in TEXTS + [CHAT]:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False).ids == fast.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    assert tok.encode(CHAT)[0] == ref.token_to_id("<|im_start|>") == 1
    assert tok.is_special(1) and tok.piece(1) == "<|im_start|>"
    assert tok.piece(ref.token_to_id("Ġthe")) == " the"
    assert tok.piece(ref.token_to_id("Ċ")) == "\n"


def test_tokenizer_json_bos_eos_from_sibling_configs(bpe_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((bpe_dir / "tokenizer.json").read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [2, 0]}))
    tok = Tokenizer.from_path(tmp_path)
    assert (tok.bos_id, tok.eos_id) == (0, 2)
    assert tok.encode("Hi", add_bos=True)[0] == 0
    # tokenizer_config.json wins over config.json, and may spell tokens as AddedToken dicts
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "add_bos_token": True}))
    tok = Tokenizer.from_path(tmp_path)
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, True)


def test_tokenizer_json_saved_truncation_is_ignored(bpe_dir, tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(bpe_dir / "tokenizer.json"))
    hf.enable_truncation(max_length=3)
    hf.enable_padding(length=64)
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_path(tmp_path)
    text = "the quick brown fox jumps over the lazy dog"
    assert tok.encode(text) == Tokenizer.from_path(bpe_dir).encode(text) and len(tok.encode(text)) > 3


def test_tokenizer_json_llama_style(tmp_path):
    """A Llama-style tokenizer.json (Metaspace + byte fallback), as transformers converts a .model."""
    import sentencepiece as spm
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    data = _train_spm("bpe")
    sp = spm.SentencePieceProcessor(model_proto=data)
    f = _gguf_fields_from_spm(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, _ = convert_gguf_tokenizer("llama", {
            "tokenizer_type": "llama", "tokens": f["tokenizer.ggml.tokens"], "scores": f["tokenizer.ggml.scores"],
            "token_type": f["tokenizer.ggml.token_type"]})
    (tmp_path / "tokenizer.json").write_text(converted.to_str())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    hf = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_path(tmp_path)
    assert (tok.kind, tok.bos_id, tok.eos_id) == ("tokenizer.json", 1, 2)
    for text in TEXTS + [CHAT, "<s>the fox</s>"]:
        ids = tok.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids == fast.encode(text, add_special_tokens=False)
        if "<" not in text and not text.startswith(" "):
            # Metaspace(prepend_scheme="first") prepends no "▁" to text that starts with a space,
            # unlike sentencepiece; the tokenizer.json kind follows `tokenizers` there
            assert ids == sp.encode(text), text
    assert tok.piece(hf.token_to_id("▁the")) == " the"
    assert tok.token_bytes(hf.token_to_id("<0x0A>")) == b"\n" and tok.piece(hf.token_to_id("<0x0A>")) == "\n"
    assert tok.piece(1) == "<s>" and tok.is_special(1) and not tok.is_special(hf.token_to_id("<think>"))


def _pretokenized_reference(json_path, pre_tokenizer):
    from tokenizers import Tokenizer as HFTokenizer

    ref = HFTokenizer.from_file(str(json_path))
    ref.pre_tokenizer = pre_tokenizer
    return ref


def test_gguf_gpt2_pre_tokenizers(bpe_dir):
    from tokenizers import pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    path = bpe_dir / "tokenizer.json"
    smollm = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    texts = TEXTS + [CHAT, "a  1 x   22 it's WE'RE 1234567 !!!\r\n\r\n x"]
    for pre in ["default", "gpt2", "smollm", "llama-bpe", "llama3"]:
        fields = _gguf_fields_from_json(path, pre)
        tok = Tokenizer.from_gguf_fields(fields)
        assert tok.kind == "gguf-gpt2" and tok.vocab_size == len(fields["tokenizer.ggml.tokens"])
        if pre == "smollm":
            ref = _pretokenized_reference(path, smollm)
        elif pre.startswith("llama"):  # transformers knows this regex; an independent oracle
            ref, _ = convert_gguf_tokenizer("llama", {
                "tokenizer_type": "gpt2", "pre_tokenizer_type": pre, "tokens": fields["tokenizer.ggml.tokens"],
                "token_type": fields["tokenizer.ggml.token_type"], "merges": fields["tokenizer.ggml.merges"]})
        else:
            ref = _pretokenized_reference(path, pre_tokenizers.ByteLevel(add_prefix_space=False))
        for text in texts:
            ids = tok.encode(text)
            assert ids == ref.encode(text, add_special_tokens=False).ids, (pre, text)
            assert tok.decode(ids) == text
    # the splits really differ: digits alone (smollm), up to three (llama3), any run (gpt2)
    splits = {pre: [w for w, _ in Tokenizer.from_gguf_fields(_gguf_fields_from_json(path, pre))
                    ._hf.pre_tokenizer.pre_tokenize_str("x 1234567")] for pre in ["smollm", "llama3", "gpt2"]}
    assert splits == {"smollm": ["x", "Ġ", "1", "2", "3", "4", "5", "6", "7"],
                      "llama3": ["x", "Ġ", "123", "456", "7"], "gpt2": ["x", "Ġ1234567"]}


def test_gguf_gpt2_unknown_pre_falls_back_to_gpt2(bpe_dir):
    path = bpe_dir / "tokenizer.json"
    with pytest.warns(UserWarning, match="unknown tokenizer.ggml.pre"):
        tok = Tokenizer.from_gguf_fields(_gguf_fields_from_json(path, "some-future-model"))
    ref = Tokenizer.from_gguf_fields(_gguf_fields_from_json(path, "default"))
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text)


# ---------------------------------------------------------------------------- errors

def _assert_one_line(exc, name):
    msg = str(exc.value)
    assert "\n" not in msg and name in msg, msg


def test_errors_name_the_file(tmp_path, spm_model):
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_sentencepiece(tmp_path / "missing.model")
    _assert_one_line(e, "missing.model")
    (tmp_path / "trunc.model").write_bytes(spm_model[1][:1000])
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_sentencepiece(tmp_path / "trunc.model")
    _assert_one_line(e, "trunc.model")
    (tmp_path / "junk.model").write_bytes(b"this is not a model at all")
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_sentencepiece(tmp_path / "junk.model")
    _assert_one_line(e, "junk.model")
    (tmp_path / "trunc.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vo')
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_tokenizer_json(tmp_path / "trunc.json")
    _assert_one_line(e, "trunc.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_tokenizer_json(tmp_path / "other.json")
    _assert_one_line(e, "other.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_path(tmp_path / "empty")
    _assert_one_line(e, "empty")
    assert issubclass(TokenizerError, ValueError)


def test_gguf_field_errors():
    with pytest.raises(TokenizerError, match="no tokenizer.ggml.tokens"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(TokenizerError, match="unsupported tokenizer.ggml.model 'bert'"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"]})
    with pytest.raises(TokenizerError, match="token_type"):
        Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"],
                                    "tokenizer.ggml.token_type": [1]})


def test_from_path_prefers_tokenizer_json(bpe_dir, spm_model, tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(spm_model[1])
    assert Tokenizer.from_path(tmp_path).kind == "sentencepiece"
    (tmp_path / "tokenizer.json").write_bytes((bpe_dir / "tokenizer.json").read_bytes())
    assert Tokenizer.from_path(tmp_path).kind == "tokenizer.json"
