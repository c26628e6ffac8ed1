"""Compare mode's data layer: what two recordings A and B have in common, and how B differs from A.

Everything here reads Recordings (batch row 0, the prompt the app shows) and returns numpy arrays, plain
dicts and dataclasses, so views can draw A, B and their difference without touching a model.

Three levels of comparability (`comparable`):
  "tensors"  same model shape and token count: every hook tensor has a B − A, attention rows a divergence;
  "aligned"  same model shape, other token count: differences on aligned positions (`align_minimal_pair`,
             or pairs the user picks, `alignment_from_pairs`);
  "curves"   other widths or depths: only per-layer curves on a relative-depth axis (`layer_curves`), and
             next-token distributions (`compare_next_token`).
The token alignment of two prompts is in alignment.py (re-exported here).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .alignment import (Alignment, AlignmentError, CompareError, _ids, align_minimal_pair,  # noqa: F401
                        alignment_from_pairs)
from .measures import kl_divergence

LOG2 = math.log(2.0)
# Config fields that fix every hook tensor's shape (ffn_type decides whether hook_pre_linear exists).
SHAPE_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "ffn_type")
LESSON_KEYS = ("identical", "pre_vs_post", "two_models", "two_prompts", "intervention", "mixed")
# What layer_curves reads: a recording limited to these names (record(..., names=CURVE_HOOKS)) is enough.
CURVE_HOOKS = ("blocks.*.hook_resid_pre", "blocks.*.hook_resid_post", "blocks.*.ln1.hook_scale",
               "blocks.*.ln2.hook_scale", "blocks.*.attn.hook_pattern", "blocks.*.mlp.hook_act")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()

# --------------------------------------------------------------------------- comparability
@dataclass(frozen=True)
class Comparability:
    level: str  # "tensors" | "aligned" | "curves"
    reason: str  # message key: "same_shape" | "token_count" | "model_shape"
    differing: tuple[str, ...] = ()  # the SHAPE_FIELDS that differ (level "curves" only)

    @property
    def tensors(self) -> bool:
        return self.level == "tensors"

    @property
    def positions(self) -> bool:
        """Per-position differences possible (directly or through an alignment)."""
        return self.level != "curves"


def comparable(a, b) -> Comparability:
    differing = tuple(f for f in SHAPE_FIELDS if getattr(a.cfg, f) != getattr(b.cfg, f))
    if differing:
        return Comparability("curves", "model_shape", differing)
    if a.n_pos != b.n_pos:
        return Comparability("aligned", "token_count")
    return Comparability("tensors", "same_shape")


def _require_shape(a, b, fields: Sequence[str] = SHAPE_FIELDS) -> None:
    bad = [f"{f} {getattr(a.cfg, f)} vs {getattr(b.cfg, f)}" for f in fields if getattr(a.cfg, f) != getattr(b.cfg, f)]
    if bad:
        raise CompareError("the two models differ in shape (" + ", ".join(bad) + "); only per-layer curves compare")


def _index(a, b, pairs) -> tuple[np.ndarray, np.ndarray]:
    """pairs None (same token count: position i with i), an Alignment, or a list of (i, j)."""
    if pairs is None:
        if a.n_pos != b.n_pos:
            raise CompareError(f"A has {a.n_pos} tokens and B has {b.n_pos}: align them first")
        return np.arange(a.n_pos), np.arange(b.n_pos)
    if not isinstance(pairs, Alignment):
        pairs = alignment_from_pairs(pairs, a.n_pos, b.n_pos)
    elif (pairs.n_a, pairs.n_b) != (a.n_pos, b.n_pos):
        raise CompareError(f"the alignment is for {pairs.n_a} and {pairs.n_b} tokens, not {a.n_pos} and {b.n_pos}")
    return pairs.index()


# --------------------------------------------------------------------------- per-layer curves
def relative_depth(n: int) -> np.ndarray:
    """Layer l of n at l / (n − 1), so a 6-layer and a 30-layer model share one axis from 0 to 1."""
    return np.zeros(1) if n == 1 else np.arange(n) / (n - 1)


def _stream_rows(rec) -> list[torch.Tensor]:
    L = rec.cfg.n_layers
    return [rec[f"blocks.{l}.hook_resid_pre"][0] for l in range(L)] + [rec[f"blocks.{L - 1}.hook_resid_post"][0]]


def stream(rec) -> np.ndarray:
    """The residual stream after k blocks, k = 0 … n_layers: resid_pre of every block, then the last
    resid_post (before any final norm): [n_layers + 1, pos, d_model], float64."""
    return _np(torch.stack(_stream_rows(rec)))


@dataclass
class LayerCurves:
    """Per-layer numbers of one recording, each a mean over the prompt's tokens.

    Block curves ([n_layers], at `depth` = l / (n_layers − 1)):
      ln1_scale, ln2_scale  the norms' divisors hook_scale (RMS, or the std for LayerNorm) of their input;
      attn_entropy          entropy in nats of attention rows, mean over heads and query positions ≥ 1
                            (position 0 can only look at itself);
      sink_share            the weight those rows give to the first token;
      gate_sparsity         fraction of |mlp.hook_act| < threshold (SiLU(gate); ReLU models: ReLU(up) = hook_post).
    Stream curves ([n_layers + 1], at `stream_depth` = k / n_layers): the residual stream after k blocks
    (`stream`), stream_norm = ‖x‖ and stream_rms = ‖x‖ / √d_model per token.
      Pre-Norm  the stream is the running sum embed + Σ attn_out + Σ mlp_out; nothing rescales it, so its RMS
                grows with depth (ln_final, after the last point, normalizes it only for the unembedding).
      Post-Norm after every block the stream is ln2(h + mlp_out) = normalized · γ (+ β for LayerNorm): its RMS
                is ≈ RMS(γ of that block's ln2), ≈ 1 for a γ near 1, at every depth; only k = 0 (the
                embeddings) is unnormalized. What a Post-Norm block adds before the norm shows in ln2_scale.
    """
    norm_placement: str
    depth: np.ndarray
    ln1_scale: np.ndarray
    ln2_scale: np.ndarray
    attn_entropy: np.ndarray
    sink_share: np.ndarray
    gate_sparsity: np.ndarray
    stream_depth: np.ndarray
    stream_norm: np.ndarray
    stream_rms: np.ndarray


def _mean_scale(rec, name: str) -> np.ndarray:
    return _np(rec.stack(name)[:, 0]).reshape(rec.cfg.n_layers, -1).mean(1)


def layer_curves(rec, threshold: float = 0.01, attention: bool = True) -> LayerCurves:
    """See LayerCurves. The attention curves rebuild every layer's pattern (heads × tokens² each), most of the
    cost at long prompts: attention=False leaves them NaN, for views that do not draw them."""
    L = rec.cfg.n_layers
    entropy, sink = np.full(L, np.nan), np.full(L, np.nan)
    for l in range(L if attention else 0):  # layer by layer, in float32 where a float64 copy of all layers would be hundreds of MB
        p = rec.pattern(l)[0, :, 1:].float()  # rows of query positions ≥ 1: [head, pos − 1, k_pos]
        if p.shape[1]:  # a one-token prompt has no row to average
            entropy[l] = -float(torch.special.xlogy(p, p).sum(-1).double().mean())  # 0·log 0 = 0
            sink[l] = float(p[..., 0].double().mean())
    sparsity = np.array([float((rec[f"blocks.{l}.mlp.hook_act"][0].abs() < threshold).double().mean())
                         for l in range(L)])
    norm = np.array([float(torch.linalg.vector_norm(x.double(), dim=-1).mean()) for x in _stream_rows(rec)])
    return LayerCurves(
        norm_placement=rec.cfg.norm_placement, depth=relative_depth(L),
        ln1_scale=_mean_scale(rec, "ln1.hook_scale"), ln2_scale=_mean_scale(rec, "ln2.hook_scale"),
        attn_entropy=entropy, sink_share=sink, gate_sparsity=sparsity,
        stream_depth=np.arange(L + 1) / L, stream_norm=norm, stream_rms=norm / math.sqrt(rec.cfg.d_model))


# --------------------------------------------------------------------------- differences
_ATTN = (".attn.hook_pattern", ".attn.hook_attn_scores")


def hook_difference(a, b, name: str, pairs=None) -> np.ndarray:
    """B − A of one hook tensor, batch row 0, float32 (bfloat16 recordings are widened; a float64 copy of the
    logits would be 400 MB at 1024 tokens). With `pairs` (an Alignment or (i, j) list) the positions are taken
    pairwise: axis pos for [pos, ...] tensors, both query and key axes for attention [head, q, k] (the
    aligned sub-matrix; unaligned keys are left out). Scores are −inf above the diagonal in both, so their
    difference is NaN there."""
    ta, tb = a[name][0], b[name][0]
    if pairs is not None or ta.shape != tb.shape:
        ia, ib = (torch.from_numpy(x) for x in _index(a, b, pairs))
        if name.endswith(_ATTN):
            ta, tb = ta[:, ia][:, :, ia], tb[:, ib][:, :, ib]
        else:  # every other hook (and logits) is [pos, ...] once the batch row is taken
            ta, tb = ta[ia], tb[ib]
        if ta.shape != tb.shape:
            raise CompareError(f"{name!r} has shape {list(ta.shape)} in A and {list(tb.shape)} in B")
    wide = torch.promote_types(torch.promote_types(ta.dtype, tb.dtype), torch.float32)
    return (tb.to(wide) - ta.to(wide)).numpy()


def resid_change_map(a, b, pairs=None) -> dict:
    """‖stream_B − stream_A‖ / ‖stream_A‖ per (k blocks passed, aligned position): the minimal-pairs map.

    Returns {"depth": [L + 1] k / L, "pos_a", "pos_b": [P], "ratio": [L + 1, P]} (see `stream`)."""
    _require_shape(a, b, ("n_layers", "d_model"))
    ia, ib = _index(a, b, pairs)
    ratio = []
    for xa, xb in zip(_stream_rows(a), _stream_rows(b)):  # one depth at a time: no float64 copy of the whole stream
        xa, xb = _np(xa[ia]), _np(xb[ib])
        ratio.append(np.linalg.norm(xb - xa, axis=-1) / np.linalg.norm(xa, axis=-1))
    ratio = np.stack(ratio)
    L = a.cfg.n_layers
    return {"depth": np.arange(L + 1) / L, "pos_a": ia, "pos_b": ib, "ratio": ratio}


def _js(p: torch.Tensor, q: torch.Tensor, rest_p=0.0, rest_q=0.0) -> torch.Tensor:
    """Jensen–Shannon divergence (nats, ≤ ln 2) over the last axis. rest_p / rest_q: mass on outcomes the other
    side cannot have (there the mixture is half of it, so each contributes ½·mass·ln 2)."""
    m = (p + q) / 2
    rest = torch.as_tensor(rest_p).clamp(min=0) + torch.as_tensor(rest_q).clamp(min=0)
    # ½KL(p‖m) + ½KL(q‖m) = ½Σ(p log p + q log q) − Σ m log m: three log passes instead of four (float64, so
    # the cancellation of these O(1) sums costs ~1e-15, far below any divergence worth drawing)
    xlogx = torch.special.xlogy
    return (0.5 * (xlogx(p, p) + xlogx(q, q)) - xlogx(m, m)).sum(-1) + 0.5 * LOG2 * rest


def attention_js(a, b, pairs=None, layers=None) -> dict:
    """Jensen–Shannon divergence between A's and B's attention rows, per layer, head and aligned query.

    With an alignment the outcomes are the aligned key pairs; weight on a key without a partner (or whose
    partner lies after the other side's query) counts as an outcome only that side has. `layers` (default
    all) limits the work, which grows with heads × tokens²: a view showing one layer asks for that one.
    Returns {"layers": [n], "pos_a", "pos_b": [P], "js": [n, n_heads, P]} in nats."""
    _require_shape(a, b, ("n_layers", "n_heads"))
    ia, ib = (torch.from_numpy(x) for x in _index(a, b, pairs))
    layers = list(range(a.cfg.n_layers)) if layers is None else [int(l) for l in layers]
    if any(not 0 <= l < a.cfg.n_layers for l in layers):
        raise CompareError(f"layers must lie in 0…{a.cfg.n_layers - 1}, got {layers}")
    out = []
    for l in layers:
        pa, pb = a.pattern(l)[0, :, ia].double(), b.pattern(l)[0, :, ib].double()  # [head, P, k_pos]
        qa, qb = pa[..., ia], pb[..., ib]  # weight on aligned keys; causal zeros past the query
        # unaligned mass as a difference of two sums over the same numbers: exactly 0 when all keys align
        out.append(_js(qa, qb, pa.sum(-1) - qa.sum(-1), pb.sum(-1) - qb.sum(-1)).numpy())
    return {"layers": np.array(layers, dtype=np.int64), "pos_a": ia.numpy(), "pos_b": ib.numpy(),
            "js": np.stack(out) if out else np.zeros((0, a.cfg.n_heads, len(ia)))}


# --------------------------------------------------------------------------- next-token distributions
def _logprobs(rec, pos: int) -> torch.Tensor:
    return torch.log_softmax(rec.logits[0, pos].to(torch.float64), -1)


def _probs(rec, pos: int) -> torch.Tensor:
    return _logprobs(rec, pos).exp()


def next_token_distances(a, b, pos_a: int = -1, pos_b: int = -1) -> dict:
    """KL both ways, Jensen–Shannon (nats) and total variation of the next-token distributions, for two
    models with one tokenizer (same id = same piece)."""
    lp, lq = _logprobs(a, pos_a), _logprobs(b, pos_b)
    if lp.shape != lq.shape:
        raise CompareError(f"vocabularies differ ({lp.shape[0]} vs {lq.shape[0]} ids): compare top-k lists instead")
    p, q = lp.exp(), lq.exp()
    return {"kl_ab": float(kl_divergence(lp, lq)), "kl_ba": float(kl_divergence(lq, lp)), "js": float(_js(p, q)),
            "tv": float(0.5 * (p - q).abs().sum())}


@functools.lru_cache(maxsize=8)
def _vocab_texts(piece: Callable[[int], str], n: int) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """A vocabulary by decoded text: (distinct texts, sorted; text index of every id; text -> index).

    Spelling out a 49k vocabulary takes a second or two of piece() calls, so it is kept for the few
    tokenizers in use (a bound method such as tokenizer.piece hashes by its tokenizer)."""
    texts = [piece(i) for i in range(n)]
    uniq, inverse = np.unique(np.array(texts, dtype=object), return_inverse=True)
    uniq = [str(t) for t in uniq]
    return uniq, inverse.reshape(-1), {t: i for i, t in enumerate(uniq)}


def shares_vocabulary(piece_a: Callable[[int], str], piece_b: Callable[[int], str], n_a: int, n_b: int) -> bool:
    """Whether two tokenizers spell every id alike (then distributions compare id by id)."""
    if n_a != n_b:
        return False
    (ta, ia, _), (tb, ib, _) = _vocab_texts(piece_a, n_a), _vocab_texts(piece_b, n_b)
    return ta == tb and bool(np.array_equal(ia, ib))


def _by_text(rec, pos: int, piece: Callable[[int], str]) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """(texts, probability of each text, text -> index); ids spelled alike (e.g. duplicates) add up."""
    p = _probs(rec, pos).numpy()
    texts, inverse, where = _vocab_texts(piece, p.shape[0])
    return texts, np.bincount(inverse, weights=p, minlength=len(texts)), where


def top_k_side_by_side(a, b, piece_a: Callable[[int], str], piece_b: Callable[[int], str],
                       pos_a: int = -1, pos_b: int = -1, k: int = 10) -> dict:
    """Each side's k most likely next pieces by decoded text, and one row per text in either list.

    Returns {"a": [(text, p)], "b": [(text, p)], "rows": [{"text", "p_a", "p_b", "rank_a", "rank_b"}]}: p is
    the probability of all ids spelled that way on that side (0.0 if its vocabulary has no such piece),
    rank is 1-based within that side's top k, or None; rows by max(p_a, p_b), highest first."""
    if k < 1:
        raise CompareError(f"k must be at least 1, got {k}")
    sides = [_by_text(a, pos_a, piece_a), _by_text(b, pos_b, piece_b)]
    tops = []
    for texts, p, _ in sides:  # texts are sorted, so a stable sort breaks ties alphabetically
        tops.append([(texts[i], float(p[i])) for i in np.argsort(-p, kind="stable")[:k]])

    def prob(side, text):
        _, p, where = sides[side]
        return float(p[where[text]]) if text in where else 0.0

    ranks = [{t: r + 1 for r, (t, _) in enumerate(top)} for top in tops]
    rows = [{"text": t, "p_a": prob(0, t), "p_b": prob(1, t), "rank_a": ranks[0].get(t), "rank_b": ranks[1].get(t)}
            for t in dict.fromkeys([t for top in tops for t, _ in top])]
    rows.sort(key=lambda r: (-max(r["p_a"], r["p_b"]), r["text"]))
    return {"a": tops[0], "b": tops[1], "rows": rows}


def compare_next_token(a, b, *, same_tokenizer: bool, piece_a: Callable[[int], str],
                       piece_b: Callable[[int], str], pos_a: int = -1, pos_b: int = -1, k: int = 10) -> dict:
    """Both views of the next token: {"kind": "shared_vocab" | "top_k", "top_k": …, "distances": … or None}."""
    tk = top_k_side_by_side(a, b, piece_a, piece_b, pos_a, pos_b, k)
    shared = same_tokenizer and a.cfg.vocab_size == b.cfg.vocab_size
    return {"kind": "shared_vocab" if shared else "top_k", "top_k": tk,
            "distances": next_token_distances(a, b, pos_a, pos_b) if shared else None}


# --------------------------------------------------------------------------- the lesson of a pair
def lesson_key(a, b, *, source_a: str | None = None, source_b: str | None = None, prompt_a: str | None = None,
               prompt_b: str | None = None, interventions_a: Sequence = (), interventions_b: Sequence = ()) -> str:
    """Which contrast a pair shows, one of LESSON_KEYS, for the app's bilingual sentence catalogs.

    The model is the same when the sources are equal (or, without sources, the configs are equal: two
    checkpoints of one shape need their sources); the prompt when the texts are equal (without texts, the
    token ids). Configs differing only in norm placement (and name) are the Pre/Post twins. More than one
    change at once is "mixed": the difference cannot be put down to one cause."""
    if source_a is not None and source_b is not None:
        same_model = source_a == source_b
    else:
        same_model = a.cfg == b.cfg
    if prompt_a is not None and prompt_b is not None:
        same_prompt = prompt_a == prompt_b
    else:
        same_prompt = _ids(a.token_ids) == _ids(b.token_ids)
    same_change = [str(x) for x in interventions_a] == [str(x) for x in interventions_b]
    changed = [k for k, same in (("model", same_model), ("two_prompts", same_prompt), ("intervention", same_change))
               if not same]
    if not changed:
        return "identical"
    if len(changed) > 1:
        return "mixed"
    if changed[0] != "model":
        return changed[0]
    da, db = a.cfg.to_dict(), b.cfg.to_dict()
    fields = {f for f in da if da[f] != db[f]} - {"name"}
    return "pre_vs_post" if fields == {"norm_placement"} else "two_models"
