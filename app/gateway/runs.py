"""Part of the gateway (app/gateway/__init__.py re-exports it): every run of a model a page can ask for, each checked
(gateway_costs.admit) before it waits for the forward lock (the logit lens: for its own) and cached in the one
result cache: a prompt's recording (or one step after a cached one), a continuation, the logit lens, a what-if run
and its KL, a head sweep, the lab twins' recordings, view data derived from a recording, and one layer's weight
matrices.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from app.gateway.costs import _admit_unless_cached, _record_measured, intervention_seconds, pass_seconds
from app.gateway.exports import npz_file
from app.gateway.lanes import FLIGHTS, SWITCHES
from app.gateway.state import (_FORWARD, KL_MAX_POS, SMALL_FORWARD_FLOPS, WHATIF_NAMES, LANE, _forward, _ident, _model,
                               check_interventions, encode_prompt, result_cache, try_load)
from explorer_model import memory as _memory
from explorer_model.analysis import measures as M
from explorer_model.lab import normlab as lab
from explorer_model.lab.corpus import HELDOUT_LINE
from explorer_model.memory import forward_flops
from explorer_model.recording import Recording, record
from explorer_model.generate.sampling import generate


def recording(source: str, ids, progress=None, base=()) -> Recording:
    """The full recording of a prompt (cached); progress(layers_done, n_layers) is called as each block finishes.
    Refused (PromptTooBig) when it cannot fit in this server's memory (prompt_cost, at the end of this file).
    `base`: a prompt that shares its first tokens with ids (a generation step's prompt, a prompt with one token
    replaced); when its recording is cached, only the positions after the shared tokens run, equal to recording
    ids whole within float32 rounding (explorer_model.recording.extend)."""
    ids, base = tuple(int(i) for i in ids), tuple(int(i) for i in base)

    def run() -> Recording:
        rec = _record_measured(source, ids, progress, _cached_prefix(source, ids, base))
        _forward()
        return rec
    small = forward_flops(_model(source).model.cfg, len(ids)) < SMALL_FORWARD_FLOPS
    return result_cache().get(("recording", _ident(source), ids), run, None if small else _FORWARD)


def _cached_prefix(source: str, ids: tuple, base: tuple) -> tuple[Recording, int] | None:
    """(base's cached recording, how many first tokens it shares with ids), when that saves a position."""
    shared = next((i for i, (a, b) in enumerate(zip(ids, base)) if a != b), min(len(ids), len(base)))
    if not 1 <= shared < len(ids):
        return None
    rec = result_cache().peek(("recording", _ident(source), base))
    return None if rec is None else (rec, shared)


def extend(source: str, ids, new_id: int) -> Recording:
    """Step generation: the recording of the prompt with one more token, one KV-cache step when the prompt's
    recording is cached (see `recording`)."""
    ids = tuple(int(i) for i in ids)
    return recording(source, ids + (int(new_id),), base=ids)


def continuation(source: str, ids, n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0) -> list[int]:
    """Up to n new token ids after ids, decoded with the KV cache and nothing recorded (explorer_model.generate.sampling
    .generate: greedy at temperature 0, else the filtered distribution drawn with `seed`); stops after the
    model's end-of-text token. Cached: the same request gives the same tokens without running again."""
    ids = tuple(int(i) for i in ids)
    n = max(0, min(int(n), _model(source).model.cfg.max_seq_len - len(ids)))

    def run() -> list[int]:
        loaded = _model(source)
        eos = loaded.tokenizer.eos_id
        new = generate(loaded.model, list(ids), n, float(temperature), int(top_k), float(top_p), int(seed),
                       stop_ids={eos} if eos is not None else None)
        _forward()
        return new
    key = ("continuation", _ident(source), ids, n, float(temperature), int(top_k), float(top_p), int(seed))
    if not n:
        return []
    cfg = _model(source).cfg  # the prompt once, then each new token one row through every matrix
    _admit_unless_cached(key, source, pass_seconds(source, len(ids)) + pass_seconds(
        source, 1, n * _memory.forward_flops(cfg, 1)))
    return result_cache().get(key, run, _FORWARD)


def recording_npz(source: str, ids):
    """The recording as an .npz download: an open file built on disk (gateway_exports), refused (RunRefused) when
    over this server's download cap."""
    ids = tuple(ids)
    return npz_file(source, len(ids), lambda: recording(source, ids))


def derived(name: str, source: str, ids, fn, *args):
    """fn(recording, *args) cached under (name, source, ids, args): view data worth keeping (no model runs),
    computed once however many pages ask for it at the same time (FLIGHTS)."""
    ids = tuple(ids)

    def compute():
        rec = recording(source, ids)
        with LANE.released(), SWITCHES.during():  # array work, mostly outside the GIL: other pages draw meanwhile
            return fn(rec, *args)
    key = (f"view:{name}", _ident(source), ids, args)
    return result_cache().get(key, compute, FLIGHTS.one(key))


def derived_cached(name: str, source: str, ids, *args) -> bool:
    """Whether derived(name, source, ids, fn, *args) would be answered from the cache."""
    return result_cache().peek((f"view:{name}", _ident(source), tuple(ids), args)) is not None


class RecordingRef:
    """Stands in for a drawn page's Recording. Widgets' format functions and download callables close over
    the ViewContext for the whole session; through this they keep only (source, ids), so the cache stays the
    only owner of recordings. Reading fetches it again (recomputed if it was evicted)."""

    def __init__(self, source: str, ids):
        self._key = (source, tuple(ids))

    def __getattr__(self, name):
        if name == "_key":  # not set yet (e.g. a copy being made): no recursion
            raise AttributeError(name)
        return getattr(recording(*self._key), name)

    def __getitem__(self, name):
        return recording(*self._key)[name]

    def __contains__(self, name) -> bool:
        return name in recording(*self._key)

    def __iter__(self):
        return iter(recording(*self._key))

    def __len__(self) -> int:
        return len(recording(*self._key))


# --------------------------------------------------------------------------- analyses that run the model
# The logit lens runs beside forward passes, not behind them in the forward lock's queue: a view switch to the
# residual stream, a fraction of a second of work, otherwise waited for every new prompt's recording asked for
# before it. One lens at a time (its logits are layers × positions × vocab floats). Hook points fire only in the
# thread that attached their hooks, so a recording or a what-if run meanwhile neither sees the lens nor changes it.
_LENS = threading.Lock()


def logit_lens(source: str, ids, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Top token id and its probability after each layer (final norm + unembedding) at positions start…."""
    ids = tuple(ids)

    def run():
        rec, cache, ident, n = recording(source, ids), result_cache(), _ident(source), len(ids)
        # Only positions no cached lens holds run; a position's rows agree with the lens computed at once to within
        # float32 rounding (other row counts may take other kernels), and its top token with them. Cached pieces:
        # the prompt one token shorter with the same start (a generation step: the new position runs), or this
        # prompt with a narrower window (a wider one asked for: the positions left of it run).
        left = cache.peek(("lens", ident, ids[:-1], int(start))) if n - 1 > start else None
        right = None if left else next((hit for s in range(int(start) + 1, n)
                                        if (hit := cache.peek(("lens", ident, ids, s))) is not None), None)
        first = n - 1 if left else int(start)
        last = n - right[0].shape[1] if right else n
        resid = rec.stack("hook_resid_post")[:, 0, first:last]  # [layer, pos, d_model]
        with LANE.released(), SWITCHES.during(), _LENS:  # other pages draw meanwhile
            arg, prob = M.lens_top(_model(source).model, resid)  # [layer, pos] each
        _forward()
        parts = [p for p in (left, (arg.numpy(), prob.numpy()), right) if p is not None]
        return np.concatenate([p[0] for p in parts], 1), np.concatenate([p[1] for p in parts], 1)
    key, cfg = ("lens", _ident(source), ids, int(start)), _model(source).cfg
    _admit_unless_cached(key, source, pass_seconds(source, 0, 2.0 * cfg.n_layers * max(1, len(ids) - int(start))
                                                   * cfg.vocab_size * cfg.d_model))
    return result_cache().get(key, run, FLIGHTS.one(key))


def lens_cached(source: str, ids, start: int = 0) -> bool:
    """Whether logit_lens(source, ids, start) would be answered from the cache."""
    return result_cache().peek(("lens", _ident(source), tuple(ids), int(start))) is not None


def whatif_run(source: str, ids, specs: str, source_ids=()) -> dict:
    """The changed run, reduced to what the What-if view draws: last-position logits, p(own next token) per
    position, the loss, rotated Q/K per layer (for patterns) and resid_post at the last KL_MAX_POS positions.
    ValueError (one line) for an intervention that does not fit (e.g. a patch beyond the source prompt)."""
    ids, source_ids = tuple(ids), tuple(source_ids)

    def run() -> dict:
        rec = record(_model(source).model, list(ids), names=WHATIF_NAMES, interventions=ivs,
                     source_tokens=list(source_ids) or None)
        _forward(1 + bool(source_ids))
        start = max(0, len(ids) - KL_MAX_POS)
        return {"last": rec.logits[0, -1].clone(), "own": M.next_token_logprobs(rec.logits, ids).exp().numpy(),
                "loss": M.prompt_loss(rec.logits, ids),
                "rot": [(rec[f"blocks.{l}.attn.hook_rot_q"], rec[f"blocks.{l}.attn.hook_rot_k"])
                        for l in range(rec.cfg.n_layers)],
                "resid": {n: rec[n][:, start:].clone() for n in rec.names if n.endswith("hook_resid_post")}}
    key = ("whatif", _ident(source), ids, specs, source_ids)
    ivs = check_interventions(source, specs) if result_cache().peek(key) is None else []
    _admit_unless_cached(key, source, pass_seconds(source, len(ids)) + pass_seconds(source, len(source_ids))
                         + intervention_seconds(source, ivs, len(ids)),
                         _memory.recording_bytes(_model(source).cfg, len(ids), names=WHATIF_NAMES), len(ids))
    return result_cache().get(key, run, _FORWARD)


def whatif_kl(source: str, ids, specs: str, source_ids=()) -> np.ndarray:
    """KL(unchanged ‖ changed) of the logit lens after each layer, mean over the last KL_MAX_POS positions."""
    ids, source_ids = tuple(ids), tuple(source_ids)

    def run() -> np.ndarray:
        clean, changed = recording(source, ids), whatif_run(source, ids, specs, source_ids)
        start = max(0, len(ids) - KL_MAX_POS)
        kl = M.lens_kl(_model(source).model, {n: clean[n][:, start:] for n in changed["resid"]}, changed["resid"])
        _forward()
        return kl.numpy()
    key, cfg = ("whatif_kl", _ident(source), ids, specs, source_ids), _model(source).cfg
    _admit_unless_cached(key, source, pass_seconds(source, 0, 4.0 * cfg.n_layers * min(len(ids), KL_MAX_POS)
                                                   * cfg.vocab_size * cfg.d_model))
    return result_cache().get(key, run, _FORWARD)


def head_sweep(source: str, ids, n_layers: int, mean: bool, progress=None, first: int = 0) -> dict:
    """Change of p(top token) at the last position when each head of n_layers layers from `first` is ablated."""
    ids = tuple(ids)

    def run() -> dict:
        layers = range(int(first), int(first) + int(n_layers))
        res = M.head_sweep(_model(source).model, recording(source, ids), layers, mean, progress)
        _forward()
        return {**res, "delta": res["delta"].numpy() if torch.is_tensor(res["delta"]) else res["delta"]}
    key = ("sweep", _ident(source), ids, int(n_layers), bool(mean), int(first))
    _admit_unless_cached(key, source, sweep_seconds(source, len(ids), int(first), int(n_layers)))
    return result_cache().get(key, run, _FORWARD)


def sweep_seconds(source: str, n_tokens: int, first: int, n_layers: int) -> float:
    """A head sweep's time: from each swept layer on, n_heads more copies of the prompt run through every block."""
    cfg = _model(source).cfg
    last = min(first + n_layers, cfg.n_layers)
    copies = sum(cfg.n_heads * (min(layer, last - 1) - first + 1) for layer in range(first, cfg.n_layers))
    return pass_seconds(source, n_tokens) * copies / max(1, cfg.n_layers)


def cached_head_sweep(source: str, ids, n_layers: int, mean: bool, first: int = 0) -> dict | None:
    return result_cache().peek(("sweep", _ident(source), tuple(ids), int(n_layers), bool(mean), int(first)))


def twin_recordings(prompt: str, max_tokens: int) -> tuple[dict | None, str | None]:
    """{"pre"/"post": {"facts", "ids", "rec", "line_rec"}} for the shipped twins on the prompt and on the held-out
    line, or (None, reason) when a twin is missing."""
    out = {}
    for v, source in zip(("pre", "post"), lab.TWINS):
        f, err = try_load(source)
        if f is None:
            return None, f"{source}: {err}"
        ids, _ = encode_prompt(source, prompt, max_tokens)
        line = _model(source).tokenizer.encode(HELDOUT_LINE, add_bos=True)
        out[v] = {"facts": f, "ids": ids, "rec": recording(source, ids), "line_rec": recording(source, line)}
    return out, None


# --------------------------------------------------------------------------- one layer's weight matrices
def layer_weights(source: str, layer: int) -> dict[str, np.ndarray]:
    """Copies of one block's FFN matrices, its W_v and W_O, float32 numpy in nn.Linear layout ("W_up" [d_ff, d],
    "W_down" [d, d_ff], "W_gate" [d_ff, d] only for a gated FFN, "W_v" [n_kv·d_k, d], "W_O" [d, n_heads·d_k],
    "b_O" [d] only when the output projection has a bias), cached: the SwiGLU view recomputes the FFN from a
    recorded input, the RoPE view shows what an added position vector does to V, the attention view projects
    the recorded concatenation of heads with W_O."""
    def take() -> dict[str, np.ndarray]:
        block = _model(source).model.blocks[int(layer)]
        mats = {"W_up": block.mlp.up_proj, "W_down": block.mlp.down_proj, "W_v": block.attn.v_proj,
                "W_O": block.attn.o_proj}
        if hasattr(block.mlp, "gate_proj"):
            mats["W_gate"] = block.mlp.gate_proj
        out = {k: m.weight.detach().float().numpy().copy() for k, m in mats.items()}
        if block.attn.o_proj.bias is not None:
            out["b_O"] = block.attn.o_proj.bias.detach().float().numpy().copy()
        return out
    return result_cache().get(("layer_weights", _ident(source), int(layer)), take)
