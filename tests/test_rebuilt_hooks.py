"""The hooks a float32 recording rebuilds on access instead of storing (SwiGLU's SiLU(gate) and SiLU(gate)·up,
RMSNorm's x / scale): bit-identical to the tensors the forward pass hands on, absent from the store, counted out by
memory.recording_bytes, and stored after all when an intervention edits them."""
import pytest
import torch

from explorer_model import memory
from explorer_model import recording as R
from explorer_model.recording import extend, record
from test_model import TOKENS, tiny_model
from tolerance import assert_close_recording

pytestmark = pytest.mark.kernels  # rerun under other threads and CPU capabilities: test_kernel_matrix.py

REBUILT = ("ln1.hook_normalized", "mlp.hook_act", "mlp.hook_post", "ln2.hook_normalized")


def hooked(model, tokens) -> dict[str, torch.Tensor]:
    """Every hook's tensor as the forward pass hands it on, cloned by a hook of our own (not the recorder).
    Scores and patterns are left out: hooking them switches the model to its explicit attention path."""
    seen = {}
    names = [n for n in model.hook_names() if not n.endswith(("hook_attn_scores", "hook_pattern"))]
    with torch.no_grad(), model.hooks([(n, lambda x, hp: seen.__setitem__(hp.name, x.detach().clone()))
                                       for n in names]):
        model(torch.as_tensor(tokens))
    return seen


def expected(cfg, suffixes) -> set[str]:
    return {f"blocks.{layer}.{s}" for layer in range(cfg.n_layers) for s in suffixes}


# The tiny model is GQA with d_ff = 80, so 11 positions × 80 is not a multiple of a SIMD block: SiLU has a tail.
CASES = {
    "pre-norm": (dict(), REBUILT),
    "post-norm": (dict(norm_placement="post"), REBUILT),
    "layernorm": (dict(norm_type="layer"), ("mlp.hook_act", "mlp.hook_post")),
    "relu-ffn": (dict(ffn_type="relu"), ("ln1.hook_normalized", "ln2.hook_normalized")),
}


@pytest.mark.parametrize("case", CASES)
def test_rebuilt_hooks_equal_what_the_forward_hooked(case):
    kw, suffixes = CASES[case]
    model = tiny_model(**kw)
    rec, truth = record(model, TOKENS), hooked(model, TOKENS)
    assert rec._rebuilt == expected(model.cfg, suffixes)
    assert not rec._rebuilt & set(rec._store)
    differ = [n for n in truth if not torch.equal(rec[n], truth[n])]
    assert not differ, differ
    assert rec.stored_bytes() == memory.recording_bytes(model.cfg, TOKENS.shape[1], torch.float32)


def test_smollm2_rebuilds_a_third_and_stays_bit_identical(loaded):
    tokens = torch.tensor([[1, 504, 3458, 5765, 17371, 33, 10077, 690, 260, 23790, 2767, 30]])
    rec, truth = record(loaded.model, tokens), hooked(loaded.model, tokens)
    assert rec._rebuilt == expected(loaded.cfg, REBUILT)
    assert [n for n in truth if not torch.equal(rec[n], truth[n])] == []
    kept = rec.stored_bytes()
    assert kept == memory.recording_bytes(loaded.cfg, tokens.shape[1], torch.float32)
    everything = memory.recording_bytes(loaded.cfg, tokens.shape[1], torch.float16) * 2  # all hooks, 4 bytes
    assert 0.65 < kept / everything < 0.72


def test_16_bit_recordings_and_16_bit_models_store_every_hook():
    model = tiny_model()
    half = record(model, TOKENS, dtype=torch.float16)
    assert half._rebuilt == set() and all(f"blocks.0.{s}" in half._store for s in REBUILT)
    bf16 = tiny_model().to(torch.bfloat16)
    rec = record(bf16, TOKENS)  # a float32 recording of bfloat16 tensors: SiLU in bf16 is not rebuilt in float32
    assert rec._rebuilt == set()
    assert rec.stored_bytes() == memory.recording_bytes(bf16.cfg, TOKENS.shape[1], torch.float32,
                                                        model_dtype=torch.bfloat16)


def test_an_intervention_that_edits_a_rebuilt_hook_keeps_it_stored():
    model = tiny_model()
    rec = record(model, TOKENS, interventions=["gate-off:blocks.1"])  # hook_act := 1, so post = up
    assert {"blocks.1.mlp.hook_act", "blocks.1.mlp.hook_post"} <= set(rec._store)
    assert "blocks.1.mlp.hook_act" not in rec._rebuilt and "blocks.0.mlp.hook_act" in rec._rebuilt
    assert torch.equal(rec["blocks.1.mlp.hook_act"], torch.ones_like(rec["blocks.1.mlp.hook_pre"]))
    assert torch.equal(rec["blocks.1.mlp.hook_post"], rec["blocks.1.mlp.hook_pre_linear"])


def test_a_rebuild_that_disagrees_by_one_bit_is_not_trusted(monkeypatch):
    model = tiny_model()
    right = R.rebuild
    monkeypatch.setattr(R, "rebuild", lambda name, sources: torch.nextafter(right(name, sources),
                                                                              torch.tensor(float("inf"))))
    rec, truth = record(model, TOKENS), hooked(model, TOKENS)
    assert rec._rebuilt == set()
    assert [n for n in truth if not torch.equal(rec[n], truth[n])] == []


def test_extend_keeps_rebuilding_and_equals_a_fresh_recording():
    model = tiny_model()
    ids = TOKENS[0].tolist()
    grown = extend(model, record(model, ids[:6]), ids[6:])
    fresh = record(model, ids)
    assert grown._rebuilt == fresh._rebuilt == expected(model.cfg, REBUILT)
    assert_close_recording(grown, fresh)  # other row counts, other kernels: within float32 rounding


def test_stack_of_a_recording_of_some_layers_says_which_it_holds():
    rec = record(tiny_model(), TOKENS, names=["blocks.*.attn.hook_pattern"], layers=[0, 2])
    assert rec.stack("attn.hook_pattern", layers=[0, 2]).shape[0] == 2
    with pytest.raises(KeyError, match=r"needs layer 1, which this recording does not hold \(it holds "
                                       r"attn.hook_pattern of layers \[0, 2\]"):
        rec.stack("attn.hook_pattern")
