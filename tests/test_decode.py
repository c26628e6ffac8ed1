"""The lean decode step (explorer_model/generate/decode.py) against the hooked forward it replaces.

Compared with torch.equal, not a tolerance: the lean step runs the very kernels of the unhooked forward in the
same order (stacking projection rows changes no bit of a one-row product), so any difference is a bug, and equal
logits make equal greedy tokens certain rather than likely. Checked at positions > 0 (a cache already filled by
a prompt), on 1 and 2 threads, on a tiny GQA model with biases and odd widths and on SmolLM2.
"""
import json

import pytest
import torch

from explorer_model import KVCache
from explorer_model.generate.decode import _Layer, lean_applies, lean_step, pack_for_decode
from explorer_model.recording import record
from explorer_model.runtime import threads
from explorer_model.generate.sampling import generate
from test_model import tiny_model

pytestmark = pytest.mark.kernels  # rerun under other threads and CPU capabilities: test_kernel_matrix.py


def lean_against_hooked(model, prompt: list[int], steps: int) -> list[int]:
    """Decode greedily with both paths side by side, asserting equal logits at every step; the tokens."""
    hooked, lean = KVCache(model.cfg.n_layers), KVCache(model.cfg.n_layers)
    tokens = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), hooked)[0, -1]
        assert torch.equal(logits, model(torch.tensor([prompt]), lean)[0, -1])
        for _ in range(steps):
            token = int(logits.argmax())
            tokens.append(token)
            assert lean_applies(model, lean, 1)
            logits = model(torch.tensor([[token]]), hooked)[0, -1]
            fast = lean_step(model, token, lean)
            assert torch.equal(fast, logits), f"position {lean.length - 1}: {(fast - logits).abs().max()}"
    for layer in range(model.cfg.n_layers):  # the cache holds the same keys and values as the hooked pass wrote
        n = hooked.layer_length(layer)
        assert n == lean.layer_length(layer) == len(prompt) + steps
        assert torch.equal(hooked.k[layer][:, :n], lean.k[layer][:, :n])
        assert torch.equal(hooked.v[layer][:, :n], lean.v[layer][:, :n])
    return tokens


@pytest.fixture(scope="module")
def biased():
    # GQA (6 query heads, 2 KV heads), biases on every projection, widths off the SIMD block (d_model 48, d_ff 80)
    model = tiny_model(attention_bias=True, mlp_bias=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("n_threads", [1, 2])
def test_lean_step_equals_hooked_forward_tiny_gqa(biased, n_threads):
    with threads(n_threads):
        lean_against_hooked(biased, [3, 14, 15, 92, 65], 20)


def test_generate_takes_the_lean_path_with_the_same_tokens(biased, monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_NATIVE", "0")  # as without a C compiler (tests/test_native_step.py: with one)
    prompt = [5, 6, 7]
    tokens = lean_against_hooked(biased, prompt, 15)
    assert generate(biased, prompt, 15) == tokens
    # A hook anywhere sends the steps through the hooked forward: it fires once per step, tokens unchanged.
    seen = []
    with biased.hooks([("blocks.1.attn.hook_z", lambda x, hp: seen.append(x.shape[1]))]):
        assert not lean_applies(biased, KVCache(biased.cfg.n_layers), 1)
        assert generate(biased, prompt, 15) == tokens
    assert seen == [len(prompt)] + [1] * 14  # the last token is chosen, not run
    assert lean_applies(biased, KVCache(biased.cfg.n_layers), 1)  # the hook is gone again


def test_generate_reports_progress(biased):
    calls = []
    generate(biased, [5, 6, 7], 4, progress=lambda done, total: calls.append((done, total)))
    n = biased.cfg.n_layers
    assert calls == [(i + 1, n) for i in range(n)] + [(n, n)] * 4  # prompt layer by layer, then per token


def test_lean_path_does_not_apply_where_it_would_differ(biased):
    cache = KVCache(biased.cfg.n_layers)
    assert not lean_applies(biased, cache, 2)  # several tokens: the model's forward
    with biased.hooks([("blocks.0.hook_resid_pre", lambda x, hp: None)]):
        assert not lean_applies(biased, cache, 1)  # a hooked pass (a recording) takes the model's forward
    trained = tiny_model().requires_grad_(True)
    with torch.no_grad():
        assert lean_applies(trained, cache, 1)
    assert not lean_applies(trained, cache, 1)  # training: gradients flow through the model's forward only
    assert not lean_applies(tiny_model().half(), cache, 1)  # 16-bit weights: the one-row kernel is float32's
    assert not lean_applies(tiny_model(norm_placement="post"), cache, 1)
    assert not lean_applies(tiny_model(ffn_type="relu"), cache, 1)


@pytest.mark.parametrize("huge_pages", [False, True])
def test_packing_keeps_every_value_stacks_rows_and_leaves_recordings_unchanged(huge_pages):
    model = tiny_model(attention_bias=True, mlp_bias=True)
    ids = [3, 14, 15, 92, 65, 35, 89]
    before = record(model, ids)
    values = {name: p.clone() for name, p in model.named_parameters()}
    unpacked = _Layer(model.blocks[0])
    assert len(unpacked.qkv) == 3 and len(unpacked.gate_up) == 2  # separate products before packing
    pack_for_decode(model, huge_pages)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1  # one mapping holds every weight: no second copy anywhere
    for name, p in model.named_parameters():
        assert torch.equal(p, values[name]) and p.shape == values[name].shape and p.is_contiguous(), name
        inside_a_stack = any(f"{n}_proj" in name for n in ("k", "v", "up"))
        if not inside_a_stack:  # a stack's first part: aligned as torch aligns its own tensors
            assert p.data_ptr() % 64 == 0, name
    layer, attn = _Layer(model.blocks[1]), model.blocks[1].attn
    (qkv, qkv_bias), = layer.qkv
    assert torch.equal(qkv, torch.cat([values[f"blocks.1.attn.{n}.weight"] for n in ("q_proj", "k_proj", "v_proj")]))
    assert torch.equal(qkv_bias, torch.cat([values[f"blocks.1.attn.{n}.bias"] for n in ("q_proj", "k_proj", "v_proj")]))
    assert qkv.data_ptr() == attn.q_proj.weight.data_ptr() and len(layer.gate_up) == 1
    assert [n for n in before.names if not torch.equal(before[n], record(model, ids)[n])] == []  # recorder: same bits
    lean_against_hooked(model, ids, 10)  # the stacked products


def test_new_weights_are_picked_up():
    model = tiny_model()
    first = lean_against_hooked(model, [1, 2, 3], 6)
    state = {k: v * torch.linspace(0.5, 1.5, v.shape[-1]) for k, v in model.state_dict().items()}
    model.load_weights(state)  # replaces every tensor the lean step gathered
    assert lean_against_hooked(model, [1, 2, 3], 6) != first  # the new weights decode, as the hooked forward


def test_packing_leaves_a_model_that_does_not_fit_twice_as_it_is(monkeypatch):
    import explorer_model.generate.decode as decode

    model = tiny_model()
    before = [p for p in model.parameters()]
    weight_bytes = sum(p.numel() * 4 for p in before)
    monkeypatch.setattr(decode, "available_memory", lambda: 2 * weight_bytes - 1)
    pack_for_decode(model)
    assert all(a is b for a, b in zip(before, model.parameters()))
    monkeypatch.setattr(decode, "available_memory", lambda: 4 * weight_bytes)
    pack_for_decode(model)
    assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) == 1


@pytest.mark.parametrize("n_threads, max_new", [("1", 8), ("2", 8), ("1", 100), ("2", 600)])
def test_cli_generate_keeps_the_hooked_forwards_tokens(tmp_path, capsys, n_threads, max_new):
    """8 and 100 tokens: unpacked (the compiled step gains nothing from small pages); 600 (the context ends
    first): packed on huge pages (packing_for). The tokens must be the hooked forward's whatever the step."""
    from checkpoints import hf_model, save_hf
    from explorer_model.cli import main
    from explorer_model.loaders import load

    folder = save_hf(hf_model("gqa"), tmp_path / "gqa")
    assert main(["generate", str(folder), "--prompt", "The capital of", "--max-new-tokens", str(max_new), "--json",
                 "--threads", n_threads]) == 0
    out = json.loads(capsys.readouterr().out)
    model, tokens = load(folder).model, []
    cache = KVCache(model.cfg.n_layers)
    with threads(int(n_threads)), torch.no_grad():  # the hooked forward, step by step, on the unpacked weights
        logits = model(torch.tensor([out["prompt_ids"]]), cache)[0, -1]
        while len(tokens) < len(out["new_ids"]):
            tokens.append(int(logits.argmax()))
            logits = model(torch.tensor([[tokens[-1]]]), cache)[0, -1]
    assert out["new_ids"] == tokens and len(tokens) >= 1


@pytest.mark.slow
def test_lean_step_equals_hooked_forward_smollm2(loaded):
    """Unpacked (separate products, as a caller that does not pack gets), then packed on 1 and 2 threads."""
    prompt, model = loaded.tokenizer.encode("The history of the printing press begins"), loaded.model
    steps = 6  # six positions past the prompt, each a new row of the cache
    with threads(1):
        tokens = lean_against_hooked(model, prompt, steps)
        assert generate(model, prompt, steps) == tokens
        pack_for_decode(model)
        assert len(_Layer(model.blocks[0]).qkv) == 1
        assert lean_against_hooked(model, prompt, steps) == tokens  # packing changes no token
        assert generate(model, prompt, steps) == tokens
    with threads(2):
        lean_against_hooked(model, prompt, steps)
