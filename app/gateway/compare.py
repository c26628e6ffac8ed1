"""Part of the gateway (app/gateway/__init__.py re-exports it): compare mode's side B. A side is (source, ids,
specs): specs "" is the plain recording, else the same prompt and model run with what-if interventions (their
string form, as in the What-if view and the URL); B goes through the gateway's one cache and forward lock."""
from __future__ import annotations

import numpy as np

from app.gateway import costs
from app.gateway import runs
from app.gateway import state as gw
from app.gateway.exports import npz_file
from app.gateway.lanes import FLIGHTS, SWITCHES
from app.gateway.settings import DEFAULT_MAX_TOKENS
from explorer_model.recording import record
from explorer_model.recording import Recording

# A side of a comparison is (source, ids, specs): specs "" is the plain recording, else the same prompt and model
# run with what-if interventions (their string form, as in the What-if view and the URL).
def changed_recording(source: str, ids, specs: str = "", source_ids=()) -> Recording:
    """The full recording of a prompt run with interventions, cached like recording(); specs "" is recording().
    `source_ids`: the prompt a patch copies from (the What-if view's; compare mode's B has no patch). ValueError
    (one line) for a spec that does not parse or fit the model; RunRefused for a patch without its source prompt."""
    ids, specs, source_ids = tuple(int(i) for i in ids), (specs or "").strip(), tuple(int(i) for i in source_ids)
    if not specs:
        return runs.recording(source, ids)
    ivs = gw.check_interventions(source, specs)
    if any(isinstance(iv, gw.I.Patch) for iv in ivs) and not source_ids:
        raise gw.RunRefused("compare.patch_needs_source")

    def run() -> Recording:
        rec = record(gw._model(source).model, list(ids), interventions=ivs, source_tokens=list(source_ids) or None)
        gw._forward(1 + bool(source_ids))
        return rec
    key = ("recording", gw._ident(source), ids, gw.I.format_list(ivs), source_ids)
    cost = costs.prompt_cost(source, ids)  # B keeps what A's recording of these ids keeps, and runs the changes too
    costs._admit_unless_cached(key, source, cost["seconds"] + costs.pass_seconds(source, len(source_ids))
                               + costs.intervention_seconds(source, ivs, len(ids)), cost["recording"], len(ids))
    return gw.result_cache().get(key, run, gw._FORWARD)


def pair_derived(name: str, sides, fn, *args):
    """fn(recording of each side, *args) cached under (name, each side's identity, args): compare-mode data worth
    keeping between switches (per-layer curves, difference maps); no model runs. sides: (source, ids, specs)."""
    keys = tuple((gw._ident(s), tuple(int(i) for i in ids), (sp or "").strip()) for s, ids, sp in sides)
    def compute():
        recs = [changed_recording(*side) for side in sides]
        with gw.LANE.released(), SWITCHES.during():  # array work, as runs.derived
            return fn(*recs, *args)
    key = (f"pair:{name}", keys, args)
    return gw.result_cache().get(key, compute, FLIGHTS.one(key))


def changed_recording_npz(source: str, ids, specs: str = "", source_ids=()):
    """A changed run's recording as .npz (compare mode's B in the sidebar, the What-if view's changed run), an open
    file like recording_npz; its `about` names the changes and the prompt a patch copied from."""
    ids, specs, source_ids = tuple(int(i) for i in ids), (specs or "").strip(), tuple(int(i) for i in source_ids)
    if not specs:
        return runs.recording_npz(source, ids)
    return npz_file(source, len(ids), lambda: changed_recording(source, ids, specs, source_ids),
                    gw.check_interventions(source, specs), source_ids)


def compare_lesson(source: str, preset_key: str, ids) -> dict:
    """Where a comparison preset's point shows (app/presets.py, kind "compare"), found on A and the preset's B
    (cached): {"view", "layer", "head", "token", "values": placeholders of its catalog sentence}."""
    from app.presets import BY_KEY
    from explorer_model.analysis import compare as C
    preset, ids = BY_KEY[preset_key], tuple(int(i) for i in ids)
    args = dict(preset.args)

    def find() -> dict:
        a, src_b = runs.recording(source, ids), args.get("cmp_model", source)
        ids_b = ids if args["cmp"] == "whatif" else tuple(
            gw.encode_prompt(src_b, args.get("cmp_prompt", preset.prompt), DEFAULT_MAX_TOKENS)[0])
        b = changed_recording(src_b, ids_b, args.get("cmp_iv", ""))
        out = {"view": preset.view, "layer": 0, "head": 0, "token": len(ids) - 1, "values": {}}
        if args["cmp"] == "whatif":  # the head whose attention the change moves most
            js = C.attention_js(a, b)["js"].mean(-1)
            layer, head = (int(x) for x in np.unravel_index(int(np.argmax(js)), js.shape))
            out.update(layer=layer, head=head, values={"layer": layer, "head": head, "js": float(js[layer, head])})
        elif args["cmp"] == "prompt":  # the shared prefix reads alike; after the swap, a token both prompts hold
            align = C.align_minimal_pair(ids, ids_b)  # is read differently: the context, not the token, moved it
            ratio = C.resid_change_map(a, b, align)["ratio"]
            shared = [k for k, (i, j) in enumerate(align.pairs) if i >= align.prefix and ids[i] == ids_b[j]]
            k = max(shared, key=lambda k: ratio[-1, k]) if shared else int(np.argmax(ratio[-1]))
            out.update(token=int(align.pairs[k][0]), values={"prefix": align.prefix, "top": int(align.pairs[k][0]),
                                                             "ratio": float(ratio[-1, k])},
                       lesson=None if shared else "preset.compare_bank_lesson_swapped")
        else:  # Pre vs Post: the residual stream's RMS after every block
            ca, cb = C.layer_curves(a, attention=False), C.layer_curves(b, attention=False)
            out["values"] = {"pre_first": float(ca.stream_rms[0]), "pre_last": float(ca.stream_rms[-1]),
                             "post_min": float(cb.stream_rms[1:].min()), "post_max": float(cb.stream_rms[1:].max())}
        return out
    return gw.result_cache().get(("compare_lesson", gw._ident(source), preset_key, ids), find)

