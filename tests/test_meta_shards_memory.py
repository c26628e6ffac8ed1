"""A Meta folder split over model-parallel shards (consolidated.00.pth, .01.pth) is concatenated once, straight
into the dtype the model runs in: peak memory is the model plus the mapped shard pages plus one tensor, not a
merged copy beside a converted one. Measured in fresh processes (peak RSS of the load alone)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(vocab=512, d_model=2048, n_layers=2, n_heads=16, d_ff=5632)  # 105 M parameters: 210 MB in float16
SPLIT = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1, "tok_embeddings": 1}

PEAK = """
import json, sys, torch
from explorer_model.runtime import keep_freed_memory
keep_freed_memory()
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))
folder, how = sys.argv[1], sys.argv[2]
import explorer_model.loaders, explorer_model.model, explorer_model.memory, explorer_model.tokenizer  # noqa: E401
from explorer_model.tokenizer import Tokenizer
Tokenizer.from_sentencepiece(f"{folder}/tokenizer.model")  # code and libraries in memory before the peak counts
if how == "load":
    from explorer_model.loaders import load
    open("/proc/self/clear_refs", "w").write("5")  # peak RSS from here on
    base = status("VmRSS")
    model = load(folder, dtype="float32").model
    q = model.blocks[1].attn.q_proj.weight
else:  # the copy-then-convert way: every tensor merged in float16, then each converted to float32
    from explorer_model.loaders.hf import load_torch_file
    from explorer_model.loaders.meta import _split_dim
    shards = [load_torch_file(f"{folder}/consolidated.0{r}.pth") for r in (0, 1)]
    open("/proc/self/clear_refs", "w").write("5")
    base = status("VmRSS")
    merged = {k: torch.cat([s[k] for s in shards], _split_dim(k)) if _split_dim(k) is not None else shards[0][k]
              for k in shards[0]}
    state = {k: v.to(torch.float32) for k, v in merged.items()}
    q = state["layers.1.attention.wq.weight"]
print(json.dumps({"peak": status("VmHWM") - base, "q_sum": float(q.double().sum())}))
"""


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A 2-shard Meta folder in float16 and the full (unsplit) state it was cut from."""
    import checkpoints
    from synth_big import _meta_tensors

    folder = tmp_path_factory.mktemp("meta2")
    state = dict(_meta_tensors(SHAPE, range(SHAPE["n_layers"]), torch.Generator().manual_seed(3), torch.float16, True))
    for rank in range(2):
        part = {k: v if SPLIT.get(k.split(".")[-2]) is None else v.chunk(2, SPLIT[k.split(".")[-2]])[rank].clone()
                for k, v in state.items()}
        torch.save(part, folder / f"consolidated.{rank:02d}.pth")
    (folder / "params.json").write_text(json.dumps({"dim": SHAPE["d_model"], "n_layers": SHAPE["n_layers"],
                                                    "n_heads": SHAPE["n_heads"], "multiple_of": 256,
                                                    "norm_eps": 1e-6, "vocab_size": -1}))
    (folder / "tokenizer.model").write_bytes(checkpoints.sentencepiece_model())
    return folder, state


def peak(folder: Path, how: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run([sys.executable, "-c", PEAK, str(folder), how], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a child process measuring its memory
def test_sharded_meta_is_merged_once_into_the_running_dtype(sharded):
    folder, state = sharded
    model_bytes = sum(v.numel() for v in state.values()) * 4  # float32
    file_bytes = sum(f.stat().st_size for f in folder.glob("consolidated.*.pth"))  # mapped pages, reclaimable
    largest = max(v.numel() for v in state.values()) * 4
    bound = model_bytes + file_bytes + largest  # the model, the shards' pages, a margin of one tensor
    ours, old = peak(folder, "load"), peak(folder, "old")
    expected_q = float(state["layers.1.attention.wq.weight"].double().sum())
    assert ours["q_sum"] == pytest.approx(expected_q, rel=1e-6) and old["q_sum"] == pytest.approx(expected_q, rel=1e-6)
    assert ours["peak"] < bound, (ours["peak"] >> 20, old["peak"] >> 20, bound >> 20)
    assert old["peak"] > bound, (old["peak"] >> 20, bound >> 20)  # the measurement tells the two ways apart
