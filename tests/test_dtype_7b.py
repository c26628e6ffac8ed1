"""16-bit checkpoints at the real LLaMA-7B width (2 layers, d_model 4096, d_ff 11008, 32 heads, vocab 32000):
memory-mapped loading, bf16/fp16 logits against float32, hook names and shapes, the refusal with its estimate.

Writing the 2.7 GB of checkpoints takes ~10 s, hence `slow`."""
from __future__ import annotations

import pytest
import torch

from explorer_model import memory
from explorer_model.families import FAMILIES
from explorer_model.loaders import LoadError, load, read_config
from explorer_model.recording import record

pytestmark = pytest.mark.slow

PROMPT = torch.tensor([[1, 306, 4997, 304, 263, 2217, 310, 13563, 29892, 322, 1951, 2055, 29889, 450, 17, 900]])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from synth_big import SEVEN_B, write_hf, write_meta

    root = tmp_path_factory.mktemp("width7b")
    # bf16 HF in two shards (embedding + layer 0 | layer 1), fp16 Meta in one consolidated.00.pth with the same
    # weights (drawing new ones would take as long as writing both folders)
    hf = write_hf(root / "hf", SEVEN_B, n_layers=2, dtype=torch.bfloat16, layers_per_shard=1)
    return {"hf": hf, "meta": write_meta(root / "meta", SEVEN_B, n_layers=2, dtype=torch.float16, like=hf)}


@pytest.fixture(scope="module")
def float32(folders):
    """A folder's model widened to float32; the HF folder's, which two tests read, loaded once (2.7 GB: a load is
    mostly the kernel handing out fresh pages), the Meta folder's for its one test."""
    kept: dict = {}

    def model(fmt: str):
        if fmt != "hf":
            return load(folders[fmt], dtype="float32").model
        if fmt not in kept:
            kept[fmt] = load(folders[fmt], dtype="float32").model
        return kept[fmt]
    yield model
    kept.clear()


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))


@pytest.mark.parametrize("fmt,dtype", [("hf", "bfloat16"), ("meta", "float16")])
def test_memory_mapped_loading(folders, fmt, dtype):
    from synth_big import file_bytes

    size = file_bytes(folders[fmt])
    before = _rss()
    loaded = load(folders[fmt], dtype=dtype)
    grown = _rss() - before
    cfg = loaded.cfg
    assert loaded.dtype_name == dtype and (cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.vocab_size) == (4096, 11008, 32, 32000)
    # HF's Q and K rows must be permuted into our RoPE layout: those pages (and only those) become private
    # copies of the mapping. Every other weight stays on disk until the first forward reads it.
    rewritten = 2 * cfg.n_layers * cfg.d_model * cfg.d_model * 2 if fmt == "hf" else 0
    assert grown < 0.10 * size + rewritten, f"RSS grew {grown / 2**20:.0f} MB for a {size / 2**20:.0f} MB file"
    assert torch.isfinite(loaded.model(PROMPT[:, :4])).all()


@pytest.mark.parametrize("fmt,dtype", [("hf", torch.bfloat16), ("meta", torch.float16)])
def test_16bit_logits_within_tolerance_of_float32(folders, float32, fmt, dtype):
    ref = float32(fmt)(PROMPT)  # the same weights, widened: only arithmetic differs
    low = load(folders[fmt], dtype=dtype).model(PROMPT)
    assert low.dtype == torch.float32
    # Stated tolerance: max |logit difference| under 2% of the largest |logit| (measured: 0.7% for bf16,
    # 0.09% for fp16), and the same top token at >= 90% of positions.
    err = (ref - low).abs().max() / ref.abs().max()
    assert err < 0.02, f"relative max error {err:.4f}"
    assert (ref.argmax(-1) == low.argmax(-1)).float().mean() >= 0.9


def test_hook_names_and_shapes_identical_across_dtypes(folders, float32):
    n = 12
    a = record(float32("hf"), PROMPT[:, :n])
    b = record(load(folders["hf"], dtype="bfloat16").model, PROMPT[:, :n])
    shapes = {k: tuple(a[k].shape) for k in a}
    assert list(a) == list(b) and shapes == {k: tuple(b[k].shape) for k in b}
    # and both are what the weight-free shape table says for this config
    assert shapes == memory.hook_shapes(read_config(folders["hf"]), n)


def test_refusal_with_estimate_unless_mapped_in_place(folders, monkeypatch):
    cfg = read_config(folders["hf"])
    monkeypatch.setenv(memory.AVAILABLE_ENV, "2GB")
    f32 = memory.estimate(cfg, torch.float32)
    with pytest.raises(LoadError) as e:
        load(folders["hf"], dtype="float32")  # 2.7 GB of float32 copies cannot fit in 2 GB
    msg = str(e.value)
    assert f"needs about {memory.size_text(f32.total)}" in msg and "only 2.0 GiB is available" in msg
    assert f"bfloat16 would need {memory.size_text(memory.estimate(cfg, torch.bfloat16).total)}" in msg
    # The same limit with the weights used in place from the mapped bf16 files: they are paged from disk
    loaded = load(folders["hf"], dtype="bfloat16")
    assert torch.isfinite(loaded.model(PROMPT[:, :3])).all()


def test_refusal_of_the_real_7b_config(monkeypatch):
    monkeypatch.setenv(memory.AVAILABLE_ENV, "8GB")
    cfg = FAMILIES["LLaMA-1 7B"]
    msg = memory.refusal(cfg, torch.bfloat16, mapped=False)
    est = memory.estimate(cfg, torch.bfloat16)
    assert est.weights == 2 * 6738415616 and f"needs about {memory.size_text(est.total)}" in msg and "8.0 GiB" in msg
    assert memory.refusal(cfg, torch.bfloat16, mapped=True) is None  # only the runtime must fit
