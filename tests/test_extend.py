"""One KV-cache step added to a recording equals recording the longer prompt, hook by hook, to within float32
rounding of each hook's scale (tests/tolerance.py); and a recording's stored bytes count each kept tensor once."""
import pytest
import torch

from explorer_model.recording import extend, record
from explorer_model.tokenizer import PromptError
from test_model import tiny_model
from tolerance import assert_close_recording

pytestmark = pytest.mark.kernels  # rerun under other threads and CPU capabilities: test_kernel_matrix.py

# The tiny model is GQA (6 query heads, 2 KV heads) with widths that are not multiples of the SIMD block
# (d_model 48, d_ff 80), so vector tails are exercised; lengths cross the row counts where BLAS kernels switch.
LENGTHS = [1, 2, 5, 11, 12, 16, 30, 63, 64, 71]


@pytest.fixture(scope="module")
def model():
    return tiny_model(max_seq_len=136)


def ids_for(vocab: int, n: int, seed: int = 4) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("n", LENGTHS)
def test_extend_equals_recording_from_scratch(model, n):
    ids = ids_for(model.cfg.vocab_size, n + 1)
    grown = extend(model, record(model, ids[:n]), ids[n])
    scratch = record(model, ids)
    assert len(scratch.names) == len(model.hook_names())  # every hook, attention scores and patterns included
    assert_close_recording(grown, scratch)


def test_repeated_extension_and_residual_sharing(model):
    ids = ids_for(model.cfg.vocab_size, 12, seed=7)
    rec = record(model, ids[:9])
    for t in ids[9:]:
        rec = extend(model, rec, t)
    assert_close_recording(rec, record(model, ids))
    # resid_post of a layer is resid_pre of the next: still one tensor after growing
    assert rec["blocks.1.hook_resid_pre"] is rec["blocks.0.hook_resid_post"]


def test_extend_of_a_selection_and_its_refusals(model):
    ids = ids_for(model.cfg.vocab_size, 8, seed=9)
    names = ["blocks.*.attn.hook_v", "blocks.*.attn.hook_pattern", "blocks.2.hook_resid_post"]
    grown = extend(model, record(model, ids[:7], names=names), ids[7])
    assert_close_recording(grown, record(model, ids, names=names))
    with pytest.raises(ValueError, match="float32"):
        extend(model, record(model, ids, dtype=torch.float16), 3)
    with pytest.raises(ValueError, match="derived attention"):
        extend(model, record(model, ids, attention="stored"), 3)
    with pytest.raises(ValueError, match="V and rotated K"):
        extend(model, record(model, ids, names=["blocks.*.mlp.*"]), 3)
    with pytest.raises(PromptError, match=f"token id {model.cfg.vocab_size} is out of range"):  # as record() says it
        extend(model, record(model, ids), model.cfg.vocab_size)


def expected_bytes(model, n_pos: int, value_bytes: int) -> int:
    """From the shapes alone: every hook once, except resid_pre (= embed or the previous resid_post) and the
    derived scores/patterns; rotated Q and K always float32 (the derived attention is rebuilt from them); in
    float32, without SwiGLU's SiLU(gate) and product and RMSNorm's normalized x (rebuilt from their inputs)."""
    cfg, total = model.cfg, 0
    rebuilt = ("mlp.hook_act", "mlp.hook_post", "ln1.hook_normalized", "ln2.hook_normalized")
    for name in model.hook_names():
        if name.endswith(("hook_resid_pre", "hook_attn_scores", "hook_pattern")):
            continue
        if value_bytes == 4 and name.endswith(rebuilt):
            continue
        if name.endswith(("hook_q", "hook_rot_q", "hook_z")):
            width, size = cfg.n_heads * cfg.head_dim, value_bytes
        elif name.endswith(("hook_k", "hook_v", "hook_rot_k")):
            width, size = cfg.n_kv_heads * cfg.head_dim, value_bytes
        elif name.endswith("hook_scale"):
            width, size = 1, value_bytes
        elif ".mlp." in name:
            width, size = cfg.d_ff, value_bytes
        elif name == "logits":
            width, size = cfg.vocab_size, value_bytes
        else:
            width, size = cfg.d_model, value_bytes
        if "hook_rot_" in name:
            size = 4
        total += n_pos * width * size
    return total


def test_stored_bytes_count_shared_tensors_once(model):
    ids = ids_for(model.cfg.vocab_size, 20, seed=11)
    full, half = record(model, ids), record(model, ids, dtype=torch.float16)
    assert full.stored_bytes() == expected_bytes(model, 20, 4)
    assert half.stored_bytes() == expected_bytes(model, 20, 2)  # no float16 copies beside the float32 Q/K
    assert half["blocks.2.hook_resid_pre"] is half["blocks.1.hook_resid_post"]
    assert half["blocks.0.hook_resid_pre"] is half["hook_embed"]
    assert half["blocks.0.attn.hook_rot_q"].dtype == torch.float16
    assert torch.equal(half["blocks.0.attn.hook_rot_q"], full["blocks.0.attn.hook_rot_q"].half())


def test_extend_equals_recording_from_scratch_smollm2(loaded):
    model = loaded.model
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog, and then it " * 6)[:66]
    for n in (4, 30, 64):
        grown = extend(model, record(model, ids[:n]), ids[n])
        assert_close_recording(grown, record(model, ids[:n + 1]))


def test_fast_decode_keeps_the_greedy_tokens_of_full_recompute_smollm2(loaded):
    """The decode path (one-row kernel, KV cache written in place) against re-running the whole sequence."""
    from explorer_model.generate.sampling import generate

    model, seq = loaded.model, loaded.tokenizer.encode("The capital of France is")
    new = generate(model, seq, 12)
    with torch.no_grad():
        for _ in range(12):
            seq = seq + [int(model(torch.tensor([seq]))[0, -1].argmax())]
    assert new == seq[-12:]


@pytest.mark.parametrize("keep, n_new", [(1, 1), (3, 9), (16, 19), (20, 1), (62, 5), (67, 10), (5, 65)])
def test_a_kept_prefix_plus_new_tokens_equals_recording_from_scratch(model, keep, n_new):
    """A prompt changed from position `keep` on: only the changed positions run (the SwiGLU view's demo)."""
    ids = ids_for(model.cfg.vocab_size, keep + 6, seed=11)  # the recorded prompt is longer than what is kept
    changed = ids[:keep] + ids_for(model.cfg.vocab_size, n_new, seed=12)
    grown = extend(model, record(model, ids), changed[keep:], keep=keep)
    assert_close_recording(grown, record(model, changed))
    assert grown["blocks.1.hook_resid_pre"] is grown["blocks.0.hook_resid_post"]  # shared tensors stay shared


def test_extend_refuses_what_it_cannot_keep(model):
    rec = record(model, ids_for(model.cfg.vocab_size, 6))
    for keep, new in ((0, [1]), (7, [1]), (3, [])):
        with pytest.raises(ValueError, match="keeps 1..6 positions"):
            extend(model, rec, new, keep=keep)
    with pytest.raises(ValueError, match="maximum"):
        extend(model, rec, [1] * model.cfg.max_seq_len, keep=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_extend_of_a_16bit_model(model, dtype):
    """A model loaded in 16 bits (`--dtype`, or `auto` for a checkpoint too big for float32) grows its float32
    recording too: the prefix's K/V go back to the model's dtype exactly, and the step equals a fresh recording
    within that dtype's rounding of each hook's scale (its eps is 2^16 / 2^13 float32 eps)."""
    half = type(model).from_weights(model.cfg, model.state_dict(), dtype)
    ids = ids_for(model.cfg.vocab_size, 12, seed=11)
    grown = extend(half, record(half, ids[:11]), ids[11])
    assert_close_recording(grown, record(half, ids), ulps=4 * torch.finfo(dtype).eps / torch.finfo(torch.float32).eps)
