"""The shipped Pre-Norm / Post-Norm twins, their corpus and tokenizer, and the train-tiny command."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from explorer_model.cli import main
from explorer_model.lab.corpus import HELDOUT_LINE, HELDOUT_LINE_ZH, load_corpus, unigram_entropy
from explorer_model.loaders import LoadError, load
from explorer_model.loaders.native import ASSETS
from explorer_model.lab.train import TokenData, heldout_loss, line_loss

TWINS = ("tiny-pre", "tiny-post")


def read_json(path):
    return json.loads(path.read_text(encoding="utf-8"))


def shipped_heldout_loss(model, tokenizer, train_log: dict) -> dict[str, float]:
    """Recompute a shipped model's final held-out losses from its train_log.json settings."""
    tc = train_log["train_config"]
    data = TokenData(tokenizer, tc["context"], {"en": tc["eval_windows_en"], "zh": tc["eval_windows_zh"]},
                     splits=("heldout",))
    return heldout_loss(model, data)


@pytest.fixture(scope="module")
def twins():
    return {name: load(name) for name in TWINS}


# --------------------------------------------------------------------------- corpus
def test_corpus_splits_and_heldout_lines():
    train, heldout = load_corpus("train"), load_corpus("heldout")
    assert HELDOUT_LINE in heldout and HELDOUT_LINE not in train
    assert HELDOUT_LINE_ZH[:12] in heldout and HELDOUT_LINE_ZH[:5] not in train
    assert "Romeo" in load_corpus("train", "en") and "作者：李白" in load_corpus("train", "zh")
    size = sum(p.stat().st_size for p in (ASSETS / "corpus").glob("*.txt"))
    assert size < 2_000_000


def test_unigram_entropy():
    assert unigram_entropy([5, 5, 5]) == 0.0
    assert unigram_entropy([1, 2] * 50) == pytest.approx(math.log(2))
    assert unigram_entropy(range(8)) == pytest.approx(math.log(8))


# --------------------------------------------------------------------------- tokenizer
def test_tokenizer_pieces_and_round_trip(twins):
    tok = twins["tiny-pre"].tokenizer
    assert tok.kind == "sentencepiece" and tok.add_bos and tok.bos_id == 1 and tok.eos_id == 2
    sp = tok._sp
    assert sp.encode("To be, or not to be", out_type=str)[:2] == ["▁To", "▁be"]
    for text in ("To be, or not to be,--that is the question:--\nWhether 'tis nobler", HELDOUT_LINE_ZH,
                 "Romeo 与 朱丽叶 1597 🌹"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    # a character without a piece falls back to its UTF-8 bytes, never <unk>
    assert all(sp.is_byte(i) for i in tok.encode("🌹")[1:])
    assert 0 not in tok.encode("龘 🌹")


def test_tokenizer_training_is_deterministic():
    import sentencepiece

    from explorer_model.lab.tiny_tokenizer import train_tokenizer

    blob = train_tokenizer(out=None)
    assert blob == train_tokenizer(out=None)
    if sentencepiece.__version__ == "0.2.3":  # the version that made the shipped file
        assert blob == (ASSETS / "tiny" / "tokenizer.model").read_bytes()
    for name in TWINS:
        assert (ASSETS / name / "tokenizer.model").read_bytes() == (ASSETS / "tiny" / "tokenizer.model").read_bytes()


# --------------------------------------------------------------------------- the shipped twins
def test_configs_differ_only_in_norm_placement():
    pre, post = (read_json(ASSETS / n / "explorer_config.json") for n in TWINS)
    assert {k for k in pre if pre[k] != post[k]} == {"norm_placement", "name"}
    assert (pre["norm_placement"], post["norm_placement"]) == ("pre", "post")
    logs = [read_json(ASSETS / n / "train_log.json")["train_config"] for n in TWINS]
    assert {k for k in logs[0] if logs[0][k] != logs[1][k]} == {"norm"}


def test_twins_load_by_name(twins):
    pre, post = twins["tiny-pre"], twins["tiny-post"]
    for lm in (pre, post):
        assert lm.format == "native" and lm.cfg.n_kv_heads < lm.cfg.n_heads  # GQA
        assert (ASSETS / lm.cfg.name / "model.safetensors").stat().st_size < 16_000_000
    assert pre.model.ln_final is not None and post.model.ln_final is None
    keys = set(pre.model.state_dict()) - set(post.model.state_dict())
    assert keys == {"ln_final.weight"} and set(post.model.state_dict()) <= set(pre.model.state_dict())
    assert "pre-norm" in pre.description and "post-norm" in post.description


@pytest.mark.parametrize("name", TWINS)
@pytest.mark.kernels
@pytest.mark.trains
def test_twin_reproduces_its_recorded_heldout_loss(twins, name):
    lm = twins[name]
    log = read_json(ASSETS / name / "train_log.json")
    final = log["final"]
    got = shipped_heldout_loss(lm.model, lm.tokenizer, log)
    for key in ("heldout_loss", "heldout_loss_en", "heldout_loss_zh"):
        assert got[key] == pytest.approx(final[key], abs=2e-3), key
    assert line_loss(lm.model, lm.tokenizer, HELDOUT_LINE) == pytest.approx(final["heldout_line_loss"], abs=2e-3)
    # the loss curve starts at about ln(vocab) and the run took the recorded number of steps
    assert log["log"][0]["heldout_loss"] == pytest.approx(math.log(lm.cfg.vocab_size), abs=0.3)
    assert log["log"][-1]["step"] == log["train_config"]["steps"] == final["step"]
    assert len(log["log"][-1]["grad_norm_o_proj"]) == len(log["log"][-1]["grad_norm_down_proj"]) == lm.cfg.n_layers


def test_pre_norm_twin_learned_more_than_token_frequencies():
    log = read_json(ASSETS / "tiny-pre" / "train_log.json")
    assert log["final"]["heldout_loss"] < log["unigram_cross_entropy_heldout"] - 1.0
    assert log["final"]["heldout_loss"] < log["unigram_entropy_train"] - 0.5


# --------------------------------------------------------------------------- train-tiny
TINY = ["--layers", "2", "--d-model", "32", "--heads", "4", "--kv-heads", "2", "--d-ff", "64", "--context", "32",
        "--batch", "4", "--steps", "5", "--warmup", "2", "--log-every", "2", "--seed", "7"]


@pytest.mark.kernels
@pytest.mark.trains
def test_train_tiny_is_deterministic_and_writes_a_loadable_folder(tmp_path, capsys):
    logs = []
    for run in ("a", "b"):
        assert main(["train-tiny", "--norm", "post", *TINY, "--out", str(tmp_path / run)]) == 0
        files = {p.name for p in (tmp_path / run).iterdir()}
        assert files == {"model.safetensors", "explorer_config.json", "tokenizer.model", "train_log.json"}
        logs.append(read_json(tmp_path / run / "train_log.json"))
    curve = [(e["step"], e["train_loss"], e["heldout_loss"]) for e in logs[0]["log"]]
    assert [e["step"] for e in logs[0]["log"]] == [0, 2, 4, 5]
    assert curve == [(e["step"], e["train_loss"], e["heldout_loss"]) for e in logs[1]["log"]]
    weights = [load_file(tmp_path / run / "model.safetensors") for run in ("a", "b")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    lm = load(str(tmp_path / "a"))
    assert lm.format == "native" and lm.cfg.norm_placement == "post" and lm.cfg.n_layers == 2
    got = shipped_heldout_loss(lm.model, lm.tokenizer, logs[0])
    assert got["heldout_loss"] == pytest.approx(logs[0]["final"]["heldout_loss"], abs=1e-4)
    assert torch.get_num_threads() >= 1


# --------------------------------------------------------------------------- loader errors
def test_native_loader_errors(tmp_path):
    good = ASSETS / "tiny-post"
    folder = tmp_path / "m"
    shutil.copytree(good, folder)
    assert load(str(folder)).format == "native"

    (folder / "tokenizer.model").unlink()
    with pytest.raises(LoadError, match="no tokenizer.model"):
        load(str(folder))
    shutil.copyfile(good / "tokenizer.model", folder / "tokenizer.model")

    (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(LoadError, match="safetensors"):
        load(str(folder))
    (folder / "model.safetensors").unlink()
    with pytest.raises(LoadError, match="no model.safetensors"):
        load(str(folder))
    shutil.copyfile(good / "model.safetensors", folder / "model.safetensors")

    cfg = read_json(good / "explorer_config.json")
    (folder / "explorer_config.json").write_text(json.dumps({**cfg, "n_layers": cfg["n_layers"] + 1}))
    with pytest.raises(LoadError, match=f"says {cfg['n_layers'] + 1} layers but the weights hold {cfg['n_layers']}"):
        load(str(folder))
    (folder / "explorer_config.json").write_text(json.dumps({**cfg, "norm_placement": "middle"}))
    with pytest.raises(LoadError, match="norm_placement"):
        load(str(folder))
    (folder / "explorer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "d_ff"}))
    with pytest.raises(LoadError, match="explorer_config.json"):
        load(str(folder))
    (folder / "explorer_config.json").write_text("{not json")
    with pytest.raises(LoadError, match="JSON"):
        load(str(folder))
    (folder / "explorer_config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] + 8}))
    with pytest.raises(LoadError):  # weights and config disagree on the vocabulary
        load(str(folder))


def test_a_shipped_json_file_is_parsed_once_per_version_of_the_file(tmp_path):
    """explorer_model.paths.shipped_json (the twins' training logs, the lab's curves): the same parsed object
    while the file is unchanged, the new content once it is rewritten, None for a missing or broken file."""
    import os

    from explorer_model.paths import shipped_json

    path = tmp_path / "log.json"
    path.write_text('{"steps": 1}', encoding="utf-8")
    first = shipped_json(path)
    assert first == {"steps": 1} and shipped_json(path) is first
    path.write_text('{"steps": 22}', encoding="utf-8")
    os.utime(path, ns=(1, 1))  # another modification time, whatever the file system's clock resolution
    assert shipped_json(path) == {"steps": 22}
    path.write_text('{"steps": ', encoding="utf-8")
    assert shipped_json(path) is None and shipped_json(tmp_path / "missing.json") is None
