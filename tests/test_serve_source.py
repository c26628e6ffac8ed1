"""`serve SOURCE`: a source that opens no model is refused before the server starts (one line, exit 2), and a good
one is what every new page opens, by its name in the model list (tests/test_app_shared.py shows the page)."""
import shutil

import pytest

from explorer_model import cli
from explorer_model.loaders import SERVED_ENV
from explorer_model.paths import ASSETS


@pytest.fixture
def started(monkeypatch, tmp_path):
    """What `serve` would start: the server's environment, or nothing."""
    seen = {}
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # a shared server's room folder: not in the user's /tmp
    monkeypatch.setenv(SERVED_ENV, "")  # recorded, so the value `serve` sets for its lecture check is undone
    monkeypatch.delenv(SERVED_ENV)
    monkeypatch.setattr("explorer_model.cli.serve.supervise", lambda commands, envs, restart: seen.update(env=envs[0]))
    return seen


def refused(capsys, started, args, *needles):
    assert cli.main(["serve", "--port", "8599", *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llama-explorer: error:") and "open http" not in out, err
    assert all(n in lines[0] for n in needles), lines[0]
    assert started == {}


def test_a_missing_or_broken_source_is_refused_before_the_server_starts(tmp_path, capsys, started, ckpt):
    refused(capsys, started, [str(tmp_path / "nowhere")], "nowhere: no such file or folder")
    folder = ckpt.save_hf(ckpt.hf_model("gqa"), tmp_path / "cut")
    capsys.readouterr()  # transformers' progress bar
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # a copy that stopped half way
        f.truncate(size // 2)
    refused(capsys, started, [str(folder)], "model.safetensors: truncated", f"the file holds {size // 2}")
    with open(weights, "wb") as f:
        f.write(b"\xff" * 64)  # not safetensors at all
    refused(capsys, started, [str(folder)], "not a readable safetensors file")
    weights.unlink()
    refused(capsys, started, [str(folder)], "no weights")


@pytest.mark.parametrize("share", [False, True])
def test_a_good_source_is_what_every_new_page_opens(tmp_path, capsys, started, monkeypatch, share):
    folder = shutil.copytree(ASSETS / "tiny-post", tmp_path / "my-twin")
    monkeypatch.chdir(tmp_path)  # a relative path: the server, which runs elsewhere, gets it whole
    assert cli.main(["serve", "my-twin", "--port", "8599", *(["--share"] if share else [])]) in (0, None)
    out = capsys.readouterr().out
    assert started["env"][SERVED_ENV] == str(folder)
    assert "/?model=" not in out  # the plain address opens it
    assert ("visitors choose from my-twin (every new page opens it)" in out) == share


def test_models_dir_entries_that_will_not_open_are_named_when_the_server_starts(tmp_path, capsys, started, ckpt):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copytree(ASSETS / "tiny-post", folder / "good")
    cut = ckpt.save_hf(ckpt.hf_model("gqa"), folder / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:len(data) // 2])
    (folder / "no-tokenizer").mkdir()
    shutil.copy(ASSETS / "tiny-post" / "explorer_config.json", folder / "no-tokenizer")
    (folder / "outside").symlink_to(ASSETS / "tiny-pre")
    with pytest.warns(UserWarning) as said:  # the CLI writes each as one line, "llama-explorer: warning: …"
        assert cli.main(["serve", "--port", "8599", "--models-dir", str(folder)]) in (0, None)
    lines = [str(w.message) for w in said]
    assert [line.split(":")[1].strip() for line in lines] == [
        "outside is not offered", "cut is offered but will not open", "no-tokenizer is offered but will not open"], lines
    assert "truncated" in lines[1] and "no tokenizer" in lines[2]
    assert started["env"]["LLAMA_EXPLORER_MODELS_DIR"] == str(folder)  # the server starts: the good one is offered
