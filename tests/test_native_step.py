"""The compiled decode step (explorer_model/generate/native_step.c) against decode.py's lean step, which is bit-identical to
the hooked forward (tests/test_decode.py).

The C step sums in another order, so logits are compared with a bound (relative to the logits' spread) and
greedy tokens exactly, at positions > 0, on a tiny GQA model with biases and widths off the SIMD block, and on
SmolLM2. The keys and values it writes into the cache are compared too: a wrong RoPE pairing or KV head would
pass a short logits check at position 0 but not these.
"""
import pytest
import torch

import explorer_model.generate.native_build as build
import explorer_model.generate.native_step as native
from explorer_model import KVCache
from explorer_model.generate.decode import lean_step, pack_for_decode
from explorer_model.generate.sampling import generate
from test_model import tiny_model

pytestmark = pytest.mark.kernels  # rerun under other threads and CPU capabilities: test_kernel_matrix.py


def native_against_lean(model, prompt: list[int], steps: int) -> list[int]:
    """Decode greedily with both steps side by side; assert close logits, equal tokens and close caches."""
    lean, fast = KVCache(model.cfg.n_layers), KVCache(model.cfg.n_layers)
    tokens = []
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), lean)[0, -1]
        model(torch.tensor([prompt]), fast)
        for _ in range(steps):
            tokens.append(int(logits.argmax()))
            assert native.native_applies(model, fast)
            logits = lean_step(model, tokens[-1], lean)
            got = native.native_step(model, tokens[-1], fast)
            spread = float(logits.max() - logits.min())
            assert float((got - logits).abs().max()) <= 2e-5 * spread, f"position {fast.length - 1}"
            assert int(got.argmax()) == int(logits.argmax())
    n = len(prompt) + steps
    assert fast.lengths == [n] * model.cfg.n_layers
    for layer in range(model.cfg.n_layers):  # within a bound relative to the layer's largest key / value
        for got, want in ((fast.k[layer][:, :n], lean.k[layer][:, :n]), (fast.v[layer][:, :n], lean.v[layer][:, :n])):
            assert float((got - want).abs().max()) <= 2e-5 * float(want.abs().max()), f"layer {layer}"
    return tokens


@pytest.fixture(scope="module")
def biased():
    # GQA (6 query heads, 2 KV heads), biases on every projection; d_model 40, d_ff 72 and 97 rows of logits are
    # not multiples of the C product's 16-float vectors and 16-row blocks, so every tail loop runs
    model = tiny_model(attention_bias=True, mlp_bias=True, d_model=40, d_ff=72)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


def test_the_step_builds_here():
    assert build.library() is not None, build.failure()  # CI machines have gcc: the fast path must be tested


def test_native_step_follows_the_lean_step_tiny_gqa(biased):
    assert biased.cfg.n_heads != biased.cfg.n_kv_heads and biased.cfg.d_model % 16 != 0 != biased.cfg.d_ff % 16
    native_against_lean(biased, [3, 14, 15, 92, 65], 30)


def test_generate_takes_the_native_step_with_the_lean_steps_tokens(biased, monkeypatch):
    calls = []
    real = native.native_forward
    monkeypatch.setattr("explorer_model.generate.sampling.native_forward", lambda m, t, c: calls.append(len(t)) or real(m, t, c))
    prompt = [5, 6, 7]
    assert generate(biased, prompt, 12) == native_against_lean(biased, prompt, 12)
    assert calls == [3] + [1] * 11  # the prompt, then every step but the last token's, which is chosen, not run
    monkeypatch.setenv("LLAMA_EXPLORER_NATIVE", "0")
    assert not native.native_applies(biased, KVCache(biased.cfg.n_layers))


@pytest.mark.parametrize("n", [1, 3, 4, 7, 13])
def test_a_short_prompts_compiled_pass_follows_the_models_forward(biased, n):
    """Several tokens at once: blocks of 4 inputs and the inputs left over, after a prompt already cached."""
    ids = torch.randint(0, biased.cfg.vocab_size, (n + 5,), generator=torch.Generator().manual_seed(n)).tolist()
    torch_cache, fast = KVCache(biased.cfg.n_layers), KVCache(biased.cfg.n_layers)
    with torch.no_grad():
        want = biased(torch.tensor([ids[:n]]), torch_cache)[0, -1]
        assert native.native_applies(biased, fast, n)
        got = native.native_forward(biased, ids[:n], fast)
        assert float((got - want).abs().max()) <= 2e-5 * float(want.max() - want.min())
        for layer in range(biased.cfg.n_layers):
            assert float((fast.k[layer][:, :n] - torch_cache.k[layer][:, :n]).abs().max()) <= 2e-5 * float(
                torch_cache.k[layer][:, :n].abs().max())
        for t in ids[n:]:  # decode steps on the compiled prompt's cache, against the model's on its own
            want, got = biased(torch.tensor([[t]]), torch_cache)[0, -1], native.native_step(biased, t, fast)
            assert float((got - want).abs().max()) <= 2e-5 * float(want.max() - want.min())
    assert not native.native_applies(biased, KVCache(biased.cfg.n_layers), native.PROMPT_MAX + 1)
    assert not native.native_applies(biased, fast, 2)  # several tokens after a cached prompt: the model's forward


def test_packing_changes_no_bit_of_the_native_step():
    model = tiny_model()
    prompt = [1, 2, 3, 4]

    def run():
        cache = KVCache(model.cfg.n_layers)
        with torch.no_grad():
            model(torch.tensor([prompt]), cache)
            return torch.stack([native.native_step(model, t, cache) for t in (9, 8, 7)])

    before = run()
    pack_for_decode(model)
    assert torch.equal(run(), before)  # a new plan reads the packed views; the same kernel sums in the same order


def test_where_the_native_step_does_not_apply(biased):
    cache = KVCache(biased.cfg.n_layers)
    with torch.no_grad():
        biased(torch.tensor([[1, 2]]), cache)
    assert native.native_applies(biased, cache)
    with biased.hooks([("blocks.0.mlp.hook_post", lambda x, hp: None)]):
        assert not native.native_applies(biased, cache)  # a hooked pass (a recording) takes the model's forward
    layer_norm = tiny_model(norm_type="layer")
    with torch.no_grad():
        ln_cache = KVCache(layer_norm.cfg.n_layers)
        layer_norm(torch.tensor([[1, 2]]), ln_cache)
    assert not native.native_applies(layer_norm, ln_cache)  # C has RMSNorm only: the lean step runs
    with pytest.raises(IndexError, match="outside the vocabulary"):
        native.native_step(biased, biased.cfg.vocab_size, cache)  # C would read past the embedding
    with pytest.raises(IndexError, match="outside the vocabulary"):
        native.native_forward(biased, [1, -1], cache)


def test_without_a_compiler_generate_keeps_its_tokens(biased, monkeypatch, tmp_path):
    prompt = [5, 6, 7]
    expected = generate(biased, prompt, 10)
    monkeypatch.setattr(build, "_library", None)
    monkeypatch.setattr(build, "_failure", None)
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE", str(tmp_path))  # no built library to find
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    assert build.library() is None and build.failure().startswith("false failed")
    assert not native.native_applies(biased, KVCache(biased.cfg.n_layers))
    assert generate(biased, prompt, 10) == expected  # the lean step: the same tokens
    # no half-written library left behind (only the build lock, which a failed build takes too)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [".building.lock"]


@pytest.mark.slow
def test_native_step_follows_the_lean_step_smollm2(loaded):
    model, prompt = loaded.model, loaded.tokenizer.encode("The history of the printing press begins")
    tokens = native_against_lean(model, prompt, 32)
    assert generate(model, prompt, 32) == tokens


def test_new_weights_are_picked_up_even_outside_the_blocks():
    model = tiny_model()

    def step_after_prompt():
        cache = KVCache(model.cfg.n_layers)
        native.native_forward(model, [1, 2], cache)
        return native.native_step(model, 3, cache)

    with torch.no_grad():
        before = step_after_prompt()
        model.ln_final.weight = torch.nn.Parameter(model.ln_final.weight * 2, requires_grad=False)
        after = step_after_prompt()
        want = model(torch.tensor([[1, 2, 3]]))[0, -1]  # the model's forward with the new final norm
    assert float((after - want).abs().max()) <= 2e-5 * float(want.max() - want.min())
    assert not torch.allclose(before, after)
