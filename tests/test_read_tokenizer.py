"""A source's tokenizer without its weights (loaders.read_tokenizer, `llama-explorer tokenize`): for every format the
same ids as the loaded model's tokenizer, also when the weights cannot be read at all."""
import json

import pytest

import explorer_model.loaders as L
import explorer_model.loaders.gguf as G
from explorer_model import cli
from explorer_model.loaders import LoadError

pytest.importorskip("transformers")  # the tiny checkpoints are written with LlamaForCausalLM

TEXT = "hello world, a tiny corpus: hello again"


def _same_tokenizer(source, loaded) -> None:
    cfg, tok = L.read_tokenizer(source)
    assert cfg.vocab_size == loaded.model.cfg.vocab_size
    assert tok.encode_prompt(TEXT) == loaded.tokenizer.encode_prompt(TEXT)
    assert [tok.token_bytes(i) for i in range(cfg.vocab_size)] == \
        [loaded.tokenizer.token_bytes(i) for i in range(cfg.vocab_size)]


def _cut(file) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 3])


@pytest.mark.parametrize("fmt", ["hf", "meta"])
def test_a_folder_is_tokenized_without_reading_its_weights(ckpt, tmp_path, gqa, fmt, capsys):
    folder = ckpt.save_hf(gqa[0], tmp_path / "m") if fmt == "hf" else ckpt.write_meta(gqa[0], tmp_path / "m", shards=2)
    _same_tokenizer(folder, L.load(folder))
    ids = L.load(folder).tokenizer.encode_prompt(TEXT)
    # a copy still under way: the HF weights cut short; a Meta folder's second shard (its config is read from the
    # first one's shapes)
    _cut(folder / ("model.safetensors" if fmt == "hf" else "consolidated.01.pth"))
    with pytest.raises(LoadError):  # the weights are unreadable now ...
        L.load(folder)
    assert cli.main(["tokenize", str(folder), "--text", TEXT, "--json"]) == 0  # ... and the text's tokens are not
    assert json.loads(capsys.readouterr().out)["ids"] == ids


def test_a_gguf_is_tokenized_from_its_metadata_or_its_caches_header(ckpt, tmp_path, gqa, monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE", str(tmp_path / "cache"))
    path = ckpt.write_gguf(gqa[0], tmp_path / "m.gguf")
    before = L.read_tokenizer(path)[1].encode_prompt(TEXT)  # no cache yet: the GGUF's own fields
    loaded = L.load(path)  # writes the cache, whose header holds the tokenizer fields
    assert before == loaded.tokenizer.encode_prompt(TEXT)

    def unread(*_):
        raise AssertionError("the GGUF was parsed although its cache's header holds the tokenizer")
    monkeypatch.setattr(G, "open_reader", unread)
    _same_tokenizer(path, loaded)


def test_the_shipped_models_tokenizers(loaded):
    _same_tokenizer("smollm2", loaded)
    _same_tokenizer("tiny-pre", L.load("tiny-pre"))


def test_a_missing_tokenizer_or_source_is_one_line(ckpt, tmp_path, gqa):
    with pytest.raises(LoadError, match="no such file or folder"):
        L.read_tokenizer(tmp_path / "nope")
    meta = ckpt.write_meta(gqa[0], tmp_path / "meta", tokenizer=False)
    with pytest.raises(LoadError, match="no tokenizer.model"):
        L.read_tokenizer(meta)
    hf = ckpt.save_hf(gqa[0], tmp_path / "hf", tokenizer=False)
    with pytest.raises(LoadError, match="tokenizer"):
        L.read_tokenizer(hf)


def test_info_on_a_folder_without_a_tokenizer_prints_only_the_refusal(ckpt, tmp_path, gqa, capsys):
    folder = ckpt.save_hf(gqa[0], tmp_path / "hf", tokenizer=False)
    capsys.readouterr()  # (transformers' progress bar while writing the folder)
    assert cli.main(["info", str(folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "tokenizer" in err, (out, err)
