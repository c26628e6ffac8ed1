"""Weights' dtype end to end on tiny checkpoints: loading in 16 bits, float32 where it matters, the GGUF cache per
dtype, memory estimates and the refusal, recording cost, per-layer progress, the CLI's --dtype.

The 7B-width checks (memory-mapped loading, refusal at the real width) are in test_dtype_7b.py."""
from __future__ import annotations

import json

import pytest
import torch

from explorer_model import memory
from explorer_model.cli import main
from explorer_model.loaders import LoadError, load, read_config
from explorer_model.recording import record


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    from checkpoints import hf_model, save_hf

    folder = tmp_path_factory.mktemp("hf") / "tiny"
    save_hf(hf_model("gqa").to(torch.bfloat16), folder)
    return folder


def test_auto_keeps_float32_for_small_models(hf_folder):
    loaded = load(hf_folder)  # a bf16 checkpoint: auto still computes in float32 when it fits comfortably
    assert loaded.dtype == torch.float32 and loaded.dtype_name == "float32"
    assert load(hf_folder, dtype="float32").model(torch.tensor([[1, 2, 3]])).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_logits_close_to_float32(hf_folder, dtype):
    from checkpoints import random_tokens

    ref, low = load(hf_folder, dtype="float32"), load(hf_folder, dtype=str(dtype)[6:])
    assert low.dtype == dtype and all(p.dtype == dtype for p in low.model.parameters())
    tokens = random_tokens(16)
    a, b = ref.model(tokens), low.model(tokens)
    assert b.dtype == torch.float32  # logits are always float32
    # Random weights of std 1/sqrt(d) make logits of order 1-10; 16-bit activations stay within a few percent.
    assert (a - b).abs().max() < 0.05 * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


def test_bf16_weights_used_in_place_from_safetensors(hf_folder):
    # The checkpoint holds bfloat16: a bfloat16 load keeps the memory-mapped tensors (no conversion copy).
    from safetensors import safe_open

    loaded = load(hf_folder, dtype="bfloat16")
    with safe_open(hf_folder / "model.safetensors", "pt") as f:
        v_file = f.get_tensor("model.layers.0.self_attn.v_proj.weight")
    v = loaded.model.blocks[0].attn.v_proj.weight
    assert torch.equal(v, v_file)
    maps = open("/proc/self/maps").read()
    start = v.untyped_storage().data_ptr()
    owner = [line for line in maps.splitlines()
             if int(line.split("-")[0], 16) <= start < int(line.split()[0].split("-")[1], 16)]
    assert owner and owner[0].endswith("model.safetensors")


def test_hook_names_and_shapes_match_across_dtypes(hf_folder):
    from checkpoints import random_tokens

    tokens = random_tokens(9)
    a = record(load(hf_folder, dtype="float32").model, tokens)
    b = record(load(hf_folder, dtype="bfloat16").model, tokens)
    assert list(a) == list(b)
    assert {k: tuple(a[k].shape) for k in a} == {k: tuple(b[k].shape) for k in b}
    # the pattern is a softmax in float32: rows sum to one in the 16-bit model as well
    assert torch.allclose(b.pattern(1).sum(-1), torch.ones(1), atol=1e-5)


def test_gguf_cache_per_dtype(ckpt, tmp_path):
    path = ckpt.write_gguf(ckpt.hf_model("gqa"), tmp_path / "m.gguf", qtype="F16")
    cache = tmp_path / "cache"
    f32 = load(path, cache_dir=str(cache), dtype="float32")
    bf = load(path, cache_dir=str(cache), dtype="bfloat16")
    assert bf.dtype == torch.bfloat16 and len(list(cache.glob("*.safetensors"))) == 2  # neither evicts the other
    again = load(path, cache_dir=str(cache), dtype="bfloat16")  # from the cache, still bfloat16
    assert again.dtype == torch.bfloat16
    assert torch.equal(again.model.embed.weight, f32.model.embed.weight.to(torch.bfloat16))
    # auto picks float32 for this small model and finds its cache
    assert load(path, cache_dir=str(cache)).dtype == torch.float32


def test_environment_sets_the_dtype(hf_folder, monkeypatch):
    monkeypatch.setenv(memory.DTYPE_ENV, "float16")
    assert load(hf_folder).dtype == torch.float16
    assert load(hf_folder, dtype="float32").dtype == torch.float32  # an explicit argument wins
    monkeypatch.setenv(memory.DTYPE_ENV, "int3")
    with pytest.raises(LoadError, match="unknown dtype 'int3'"):
        load(hf_folder)


def test_refusal_states_estimate_and_available_memory(hf_folder, monkeypatch):
    cfg = read_config(hf_folder)
    monkeypatch.setenv(memory.AVAILABLE_ENV, "100MB")
    need = memory.estimate(cfg, torch.float32).total
    with pytest.raises(LoadError) as e:
        load(hf_folder, dtype="float32")  # bf16 on disk -> float32 copies: must fit
    msg = str(e.value)
    assert memory.size_text(need) in msg and "100 MiB" in msg and "\n" not in msg
    assert need > 100 * 2**20 and need == memory.estimate(cfg, torch.float32, memory.DEFAULT_TOKENS).total


def test_auto_falls_back_to_the_checkpoint_dtype_when_float32_is_not_comfortable(hf_folder, monkeypatch):
    cfg = read_config(hf_folder)
    f32 = memory.estimate(cfg, torch.float32).total
    monkeypatch.setenv(memory.AVAILABLE_ENV, str(int(f32 / memory.COMFORT) - 1))
    assert memory.choose_dtype("auto", cfg, torch.float16) == torch.float16
    assert memory.choose_dtype("auto", cfg, torch.float32) == torch.bfloat16
    assert load(hf_folder).dtype == torch.bfloat16  # the checkpoint's own type
    monkeypatch.setenv(memory.AVAILABLE_ENV, str(int(f32 / memory.COMFORT) + 1))
    assert load(hf_folder).dtype == torch.float32


def test_available_bytes_parsing(monkeypatch):
    monkeypatch.setenv(memory.AVAILABLE_ENV, "1.5GB")
    assert memory.available_bytes() == int(1.5 * 2**30)
    assert memory.total_bytes() == int(1.5 * 2**30)
    monkeypatch.delenv(memory.AVAILABLE_ENV)
    total = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1]) * 1024
    assert 0 < memory.available_bytes() <= memory.total_bytes() <= total


def _unique_bytes(rec) -> int:
    """Bytes the recording really holds: every tensor once, however many names point at it."""
    seen, total = set(), 0
    tensors = list(rec._store.values()) + [t for qk in rec._rotated.values() for t in qk]
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("names", [None, ["blocks.*.attn.hook_pattern"], ["blocks.1.mlp.*", "hook_embed"]])
def test_recording_cost_is_known_before_running(hf_folder, dtype, names):
    from checkpoints import random_tokens

    loaded = load(hf_folder, dtype="float32")
    rec = record(loaded.model, random_tokens(11), names=names, dtype=dtype)
    assert memory.recording_bytes(loaded.cfg, 11, dtype, names) == _unique_bytes(rec)


def test_layer_progress_reports_every_layer(hf_folder):
    loaded = load(hf_folder)
    seen = []
    with memory.layer_progress(loaded.model, lambda done, total: seen.append((done, total))):
        record(loaded.model, [1, 2, 3])
    assert seen == [(i, loaded.cfg.n_layers) for i in range(1, loaded.cfg.n_layers + 1)]
    loaded.model(torch.tensor([[1, 2]]))  # detached afterwards
    assert len(seen) == loaded.cfg.n_layers


def test_cli_dtype(hf_folder, tmp_path, capsys, monkeypatch):
    assert main(["info", str(hf_folder), "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    cfg = read_config(hf_folder)
    n = min(512, cfg.max_seq_len)  # its context, when shorter than the 512 tokens a load leaves room for
    assert n < 512 and out.startswith(f"memory to run {n} tokens") and "bfloat16]" in out
    for name, est in memory.estimates(cfg, n).items():
        assert f"{name:<16} {memory.size_text(est.total):>9}" in out
    assert main(["record", str(hf_folder), "--prompt", "The capital", "--out", str(tmp_path / "r.npz"),
                 "--dtype", "float16", "--progress"]) == 0
    err = capsys.readouterr().err
    assert f"{read_config(hf_folder).n_layers}/{read_config(hf_folder).n_layers}" in err
    monkeypatch.setenv(memory.AVAILABLE_ENV, "10MB")
    assert main(["generate", str(hf_folder), "--prompt", "The", "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs about" in err and "only 10 MiB is available" in err


def test_cache_writer_is_safetensors(tmp_path):
    from safetensors import safe_open

    from explorer_model.loaders.common import save_streaming

    state = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "c": torch.randn(2, 2, 3).half()}
    save_streaming(state, tmp_path / "x.safetensors", {"note": "hi"})
    with safe_open(tmp_path / "x.safetensors", "pt") as f:
        assert f.metadata() == {"note": "hi"} and set(f.keys()) == set(state)
        for k, v in state.items():
            assert f.get_tensor(k).dtype == v.dtype and torch.equal(f.get_tensor(k), v)


def test_visitors_asking_a_recordings_size_at_once_compute_its_fit_once(monkeypatch, tmp_path):
    """A server's first visitors ask the cost of their prompts at the same moment: the meta forwards that fit the
    size formula run once, the others wait for the result (in a cache folder that does not hold the shapes yet)."""
    import threading

    from explorer_model.config import ModelConfig

    cfg = ModelConfig(vocab_size=97, d_model=24, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=6, d_ff=40,
                      norm_eps=1e-5, rope_theta=10000.0, max_seq_len=64, tie_embeddings=False, name="fit-once")
    runs, real = [], memory._hook_shapes.__wrapped__
    start = threading.Barrier(8)

    def counted(c, n):
        runs.append(n)
        return real(c, n)

    monkeypatch.setattr(memory, "_hook_shapes", counted)
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE", str(tmp_path))
    memory._quadratic.cache_clear()
    memory._shape_template.cache_clear()
    sizes = []

    def ask():
        start.wait()
        sizes.append(memory.recording_bytes(cfg, 17))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    memory._quadratic.cache_clear()
    assert sorted(runs) == [1, 2, 3] and len(set(sizes)) == 1


@pytest.mark.parametrize("variant", [{}, dict(norm_placement="post"), dict(norm_type="layer"), dict(ffn_type="relu"),
                                     dict(tie_embeddings=True)], ids=["pre", "post", "layernorm", "relu", "tied"])
def test_hook_shapes_of_every_length_are_those_of_a_forward_of_that_length(variant):
    """hook_shapes reads other lengths off the forwards at 1, 2 and 3 tokens of a one-block model; a forward of the
    whole model on the meta device at each length (also across the row counts where the attention goes
    blockwise) must give the same shapes."""
    from explorer_model.config import ModelConfig

    cfg = ModelConfig(vocab_size=97, d_model=24, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=4, d_ff=40,
                      norm_eps=1e-5, rope_theta=10000.0, max_seq_len=256, tie_embeddings=False,
                      name="shapes").with_(**variant)
    forward = memory._meta_forward_shapes  # the whole model, that very length
    for n in (1, 2, 3, 4, 5, 9, 63, 64, 65, 200):
        assert memory.hook_shapes(cfg, n) == dict(forward(cfg, n)), n


def test_hook_shapes_are_kept_in_the_cache_folder(tmp_path, monkeypatch):
    """A second process reads the shapes the first worked out (no forward on the meta device); a file that is
    not a list of every hook with positive sizes is ignored and written again."""
    from explorer_model.config import ModelConfig

    monkeypatch.setenv("LLAMA_EXPLORER_CACHE", str(tmp_path))
    cfg = ModelConfig(vocab_size=97, d_model=24, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=4, d_ff=40,
                      norm_eps=1e-5, rope_theta=10000.0, max_seq_len=256, tie_embeddings=False, name="kept")
    memory._shape_template.cache_clear()
    first = {n: memory.hook_shapes(cfg, n) for n in (1, 7)}
    [file] = (tmp_path / "shapes").glob("*.json")
    good = file.read_text()

    def no_forward(*args):
        raise AssertionError("the shapes were worked out again although the cache folder holds them")

    memory._shape_template.cache_clear()  # as in a new process
    with monkeypatch.context() as m:
        m.setattr(memory, "_hook_shapes", no_forward)
        assert {n: memory.hook_shapes(cfg, n) for n in (1, 7)} == first
    rows = json.loads(good)
    for bad in ("garbage", "[]", json.dumps(rows[1:]), json.dumps([[name, [-1] + sizes[1:]] for name, sizes in rows]),
                json.dumps([[name, [True] + sizes[1:]] for name, sizes in rows])):
        file.write_text(bad)
        memory._shape_template.cache_clear()
        assert {n: memory.hook_shapes(cfg, n) for n in (1, 7)} == first
        assert file.read_text() == good
    memory._shape_template.cache_clear()
