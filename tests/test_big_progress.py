"""Per-layer progress on the command line: drawn on stderr only (stdout and the .npz stay clean), once per layer
in order, for `record` and for `generate` (the prompt's pass, then one step per new token)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from explorer_model import memory
from explorer_model.cli import main
from explorer_model.loaders import load, read_config
from explorer_model.recording import record


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from checkpoints import hf_model, save_hf

    return save_hf(hf_model("gqa", num_hidden_layers=5), tmp_path_factory.mktemp("p") / "five")


def bar_steps(err: str, label: str) -> list[tuple[int, int]]:
    """(done, total) of every frame of one bar, in the order drawn."""
    return [(int(a), int(b)) for a, b in re.findall(rf"{label} \[[#.]+\] (\d+)/(\d+)", err)]


def test_record_progress_goes_to_stderr_once_per_layer(folder, tmp_path, capsys):
    out = tmp_path / "r.npz"
    assert main(["record", str(folder), "--prompt", "The capital of France", "--out", str(out), "--progress"]) == 0
    cap = capsys.readouterr()
    assert bar_steps(cap.err, "recording") == [(i, 5) for i in range(1, 6)]
    assert "[#" not in cap.out and "recording [" not in cap.out
    ids = load(folder).tokenizer.encode("The capital of France")
    ref = record(load(folder).model, ids)
    with np.load(out) as z:  # the file holds tensors only, equal to a recording made without any bar
        np.testing.assert_allclose(z["blocks.4.hook_resid_post"], ref["blocks.4.hook_resid_post"].numpy(), atol=1e-6)


def test_no_bar_unless_asked_when_stderr_is_not_a_terminal(folder, tmp_path, capsys):
    assert main(["record", str(folder), "--prompt", "The capital", "--out", str(tmp_path / "r.npz")]) == 0
    assert "recording [" not in capsys.readouterr().err


def test_generate_progress_prompt_then_tokens_and_clean_json(folder, capsys):
    assert main(["generate", str(folder), "--prompt", "The capital of", "--max-new-tokens", "4", "--json",
                 "--progress"]) == 0
    cap = capsys.readouterr()
    result = json.loads(cap.out)  # stdout is the JSON alone
    assert bar_steps(cap.err, "prompt") == [(i, 5) for i in range(1, 6)]
    steps = bar_steps(cap.err, "tokens")
    # every new token but one that ended the text runs through the model once more
    assert steps == [(i, 4) for i in range(1, len(steps) + 1)] and len(steps) >= len(result["new_ids"]) - 1
    assert cap.err.endswith("\n") and "\n" not in cap.out.strip()


def test_layer_progress_is_called_per_layer_in_order_and_changes_nothing(folder):
    loaded = load(folder)
    ids = [5, 9, 17, 3]
    plain = record(loaded.model, ids)
    seen = []
    with memory.layer_progress(loaded.model, lambda done, total: seen.append((done, total))):
        hooked = record(loaded.model, ids)
    assert seen == [(i, read_config(folder).n_layers) for i in range(1, 6)]
    assert all(torch.equal(plain[n], hooked[n]) for n in plain)


@pytest.mark.parametrize("n", [1, 7, 33, 64, 100, 128])
def test_forward_flops_counts_what_a_recording_computes(folder, n, monkeypatch):
    """Against torch's own FLOP counter on the real forward (matrix products and attention batches). The counter
    sees neither oneDNN's inner product nor the fused attention kernel, so this pass takes nn.Linear's product
    and the written-out attention (stored weights), which compute the same products."""
    from torch.utils.flop_counter import FlopCounterMode

    from explorer_model import kernels

    monkeypatch.setattr(kernels, "ONE_ROW", None)  # the counter does not see oneDNN's inner product
    loaded = load(folder)
    with FlopCounterMode(display=False) as counter:
        record(loaded.model, torch.arange(3, 3 + n) % loaded.cfg.vocab_size, attention="stored")
    assert memory.forward_flops(loaded.cfg, n) == counter.get_total_flops()
    assert memory.time_class(0.5) == "instant" and memory.time_class(5) == "seconds"
    assert memory.time_class(60) == "minute" and memory.time_class(600) == "minutes"
