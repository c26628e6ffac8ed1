"""The feed-forward network, position by position, and what its gates do.

Position-wise. For the token at position i (Pre-Norm LLaMA block, n_i = γ ⊙ h_i / rms(h_i)):
    FFN(n_i) = W_down · (SiLU(W_gate · n_i) ⊙ (W_up · n_i))          (ReLU variant: W_down · ReLU(W_up · n_i))
Only n_i enters: no other position is read. `ffn_at_position` recomputes it from the recorded input and compares
with hook_mlp_out[i]; `position_wise_comparison` takes two prompts that differ at one position and shows that a
position's FFN output changed only where its FFN input changed (the change reaches later positions only through
attention, which mixes positions before the FFN).

Gates. In SwiGLU the gate value g = SiLU(W_gate · n) (hook_act) multiplies the candidate u = W_up · n feature by
feature. SiLU(z) = z·σ(z) ranges over (−0.278, ∞): a gate can close (≈ 0), weaken (small, or slightly negative:
weakened and sign-flipped), partly keep, or keep (≈ 1 and above: kept, or amplified beyond 1). `GATE_KINDS` and
`GATE_BOUNDS` fix the thresholds on |g|, chosen so that the tutorial's example g = [0.9, 0.1, 0.0, 0.7] reads
keep, weaken, close, partly keep.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._arrays import arr

GATE_KINDS = ("close", "weaken", "partly keep", "keep")
GATE_BOUNDS = (0.05, 0.5, 0.85)  # |g| < 0.05 close; < 0.5 weaken; < 0.85 partly keep; ≥ 0.85 keep (≥ 1: amplify)


def silu(z: np.ndarray) -> np.ndarray:
    """SiLU(z) = z · σ(z) = z / (1 + e^(−z)), computed stably for large |z|."""
    z = np.asarray(z, dtype=np.float64)
    return z * np.exp(-np.logaddexp(0.0, -z))


def ffn_input(rec, layer: int, pos: int | slice, gamma: np.ndarray | None, batch: int = 0) -> np.ndarray:
    """The FFN's input at pos: γ ⊙ ln2.hook_normalized (Pre-Norm); resid_mid for the Post-Norm variant."""
    if rec.cfg.norm_placement == "post":
        return arr(rec[f"blocks.{layer}.hook_resid_mid"], batch)[pos]
    if rec.cfg.norm_type == "layer":
        raise ValueError("the LayerNorm variant has a bias after γ; its FFN input is not rebuilt here")
    if gamma is None:
        raise ValueError("a Pre-Norm block needs the ln2 γ to rebuild its FFN input")
    return arr(rec[f"blocks.{layer}.ln2.hook_normalized"], batch)[pos] * np.asarray(gamma, dtype=np.float64)


def ffn_forward(n: np.ndarray, w_up: np.ndarray, w_down: np.ndarray, w_gate: np.ndarray | None = None) -> dict:
    """The FFN on input rows n [..., d_model], weights in nn.Linear layout (W_gate, W_up [d_ff, d], W_down [d, d_ff]).

    Returns {'gate' SiLU(W_gate·n) (ReLU(W_up·n) without a gate), 'up' W_up·n, 'post' (the input of W_down),
    'out' W_down·post}. No biases (LLaMA has none).
    """
    n = np.asarray(n, dtype=np.float64)
    up = n @ np.asarray(w_up, dtype=np.float64).T
    if w_gate is None:
        gate = np.maximum(up, 0.0)
        post = gate
    else:
        gate = silu(n @ np.asarray(w_gate, dtype=np.float64).T)
        post = gate * up
    return {"gate": gate, "up": up, "post": post, "out": post @ np.asarray(w_down, dtype=np.float64).T}


def ffn_at_position(rec, layer: int, pos: int, w_up, w_down, w_gate=None, gamma=None, batch: int = 0) -> dict:
    """Recompute the FFN output at one position from the recorded input there alone.

    Returns {'input' [d], 'recomputed' [d], 'recorded' [d] (hook_mlp_out[pos]), 'max_abs_diff', 'rel_diff'
    (max |diff| / max |recorded|)}.
    """
    if rec.cfg.mlp_bias:
        raise ValueError("this checkpoint has FFN biases; ffn_at_position rebuilds bias-free FFNs only")
    if (w_gate is None) != (rec.cfg.ffn_type == "relu"):
        raise ValueError(f"a {rec.cfg.ffn_type} FFN {'needs' if w_gate is None else 'has no'} W_gate")
    n_pos = rec.n_pos
    if not -n_pos <= pos < n_pos:
        raise ValueError(f"position {pos} is outside the prompt (0…{n_pos - 1})")
    n = ffn_input(rec, layer, pos, gamma, batch)
    y = ffn_forward(n, w_up, w_down, w_gate)["out"]
    recorded = arr(rec[f"blocks.{layer}.hook_mlp_out"], batch)[pos]
    diff = float(np.abs(y - recorded).max())
    return {"input": n, "recomputed": y, "recorded": recorded, "max_abs_diff": diff,
            "rel_diff": diff / max(float(np.abs(recorded).max()), 1e-300)}


def _changed(a: np.ndarray, b: np.ndarray, rtol: float) -> tuple[np.ndarray, np.ndarray]:
    """Per position: max |a − b| and whether it exceeds rtol · (largest |a| of the layer)."""
    d = np.abs(a - b).max(-1)
    return d, d > rtol * max(float(np.abs(a).max()), 1e-300)


def position_wise_comparison(rec_a, rec_b, layer: int, rtol: float = 1e-5, batch: int = 0) -> dict:
    """Two recordings of equally long prompts: per position, did the FFN input change, did its output change?

    The input is ln2.hook_normalized (γ is shared, so it changes iff γ ⊙ it does); resid_mid for Post-Norm.
    Returns {'token_changed' [T] bool, 'input_diff', 'output_diff' [T] max abs differences, 'input_changed',
    'output_changed' [T] bool (difference > rtol · the layer's largest value), 'only_through_input': True when
    no position's output changed while its input stayed the same}.
    """
    ids_a, ids_b = rec_a.token_ids[batch], rec_b.token_ids[batch]
    if ids_a.shape != ids_b.shape:
        raise ValueError(f"the prompts must have the same length ({ids_a.numel()} and {ids_b.numel()} tokens)")
    name = "hook_resid_mid" if rec_a.cfg.norm_placement == "post" else "ln2.hook_normalized"
    din, cin = _changed(arr(rec_a[f"blocks.{layer}.{name}"], batch), arr(rec_b[f"blocks.{layer}.{name}"], batch), rtol)
    dout, cout = _changed(arr(rec_a[f"blocks.{layer}.hook_mlp_out"], batch),
                          arr(rec_b[f"blocks.{layer}.hook_mlp_out"], batch), rtol)
    return {"token_changed": (ids_a != ids_b).numpy(), "input_diff": din, "output_diff": dout,
            "input_changed": cin, "output_changed": cout, "only_through_input": bool(not np.any(cout & ~cin))}


# --------------------------------------------------------------------------- gate kinds
def classify_gates(g: np.ndarray) -> np.ndarray:
    """Kind index into GATE_KINDS for each gate value, by |g| against GATE_BOUNDS."""
    return np.searchsorted(np.asarray(GATE_BOUNDS), np.abs(np.asarray(g, dtype=np.float64)), side="right")


@dataclass(frozen=True)
class GateKinds:
    layer: int
    pos: int
    kinds: tuple  # GATE_KINDS
    bounds: tuple  # GATE_BOUNDS on |g|
    kind: np.ndarray  # [d_ff] int index into kinds, per neuron
    gate: np.ndarray  # [d_ff] g = SiLU(W_gate·n)
    up: np.ndarray  # [d_ff] u = W_up·n, the candidate the gate lets through
    counts: dict  # kind -> number of neurons
    examples: dict  # kind -> list of {'neuron', 'gate', 'up', 'product'}, largest |u| first (what was at stake)
    amplified: int  # neurons with g > 1: kept and enlarged
    flipped: int  # neurons with g < 0: weakened (or closed) with the sign turned


def gate_kinds(rec, layer: int, pos: int, top: int = 5, batch: int = 0) -> GateKinds:
    """For one token and layer: each FFN neuron sorted by its gate value into close / weaken / partly keep / keep."""
    if rec.cfg.ffn_type != "swiglu":
        raise ValueError("gate kinds need a gated (SwiGLU) FFN; the ReLU variant has no gate")
    n_pos = rec.n_pos
    if not -n_pos <= pos < n_pos:
        raise ValueError(f"position {pos} is outside the prompt (0…{n_pos - 1})")
    g = arr(rec[f"blocks.{layer}.mlp.hook_act"], batch)[pos]
    u = arr(rec[f"blocks.{layer}.mlp.hook_pre_linear"], batch)[pos]
    kind = classify_gates(g)
    counts, examples = {}, {}
    for i, name in enumerate(GATE_KINDS):
        idx = np.flatnonzero(kind == i)
        counts[name] = int(idx.size)
        best = idx[np.argsort(-np.abs(u[idx]), kind="stable")[:top]]
        examples[name] = [{"neuron": int(j), "gate": float(g[j]), "up": float(u[j]), "product": float(g[j] * u[j])}
                          for j in best]
    return GateKinds(layer=layer, pos=pos % n_pos, kinds=GATE_KINDS, bounds=GATE_BOUNDS, kind=kind, gate=g, up=u,
                     counts=counts, examples=examples, amplified=int((g > 1).sum()), flipped=int((g < 0).sum()))
