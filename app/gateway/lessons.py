"""Part of the gateway (app/gateway/__init__.py re-exports it): where a lesson's point shows on the loaded model.

The presets (app/presets.py) name what to look for; these functions find it in the prompt's recording (the layer,
head and token to open, and the numbers its catalog sentence shows), cached in the gateway's result cache.
"""
from __future__ import annotations

import torch

from app.gateway import runs
from app.gateway import state as gw
from explorer_model.analysis import measures as M


def lesson_target(source: str, preset_key: str, ids) -> dict:
    """Where preset `preset_key`'s point is visible in the recording of `ids`, found on this model (cached):
    {"view", "layer", "head", "token", "values": placeholders of its catalog sentence}. Raises ValueError when the
    prompt does not hold what the lesson looks for (e.g. the words were edited away)."""
    from app.presets import BY_KEY
    from explorer_model.analysis import lesson as LS

    preset, ids = BY_KEY[preset_key], tuple(int(i) for i in ids)

    def find() -> dict:
        rec, tok = runs.recording(source, ids), gw._model(source).tokenizer
        n, last = len(ids), len(ids) - 1
        out = {"view": preset.view, "layer": 0, "head": 0, "token": last, "values": {}}
        if preset.kind == "link":
            hit = LS.word_link_target(rec, [tok.token_bytes(i) for i in ids], *preset.args)
            out.update(layer=hit["layer"], head=hit["head"], token=hit["q"], key=hit["k"],
                       values={"layer": hit["layer"], "head": hit["head"], "weight": hit["weight"]})
        elif preset.kind == "sink":
            hit = LS.strongest(LS.sink_share(rec, 0))
            out.update(layer=hit["layer"], head=hit["head"], key=0,
                       values={"layer": hit["layer"], "head": hit["head"], "share": hit["weight"]})
        elif preset.kind == "induction":
            period = max((p for p in range(2, n // 2 + 1) if ids[n - 2 * p:n - p] == ids[n - p:]), default=0)
            if not period:
                raise ValueError("the prompt does not end in a repeated sequence")
            hit = LS.strongest(LS.induction_scores(rec, period))
            out.update(layer=hit["layer"], head=hit["head"], key=last - period + 1,
                       values={"layer": hit["layer"], "head": hit["head"], "score": hit["weight"], "period": period})
        elif preset.kind == "lens":  # the layer from which the final answer stays among the lens's top LENS_TOP
            with gw._FORWARD, torch.no_grad():
                lp = M.lens_logprobs(gw._model(source).model, rec.stack("hook_resid_post")[:, 0, last])  # [layer, vocab]
                gw._forward()
            final = int(lp[-1].argmax())
            ranks = (lp > lp[:, final:final + 1]).sum(-1).numpy()  # 0 = the top token after that layer
            layer = next(l for l in range(len(ranks)) if (ranks[l:] < LENS_TOP).all())
            out.update(layer=layer, values={"layer": layer, "n_layers": len(ranks), "top_id": final,
                                            "top": LENS_TOP, "rank0": int(ranks[0]) + 1})
        elif preset.kind == "split":
            typed = [i for i in ids if not tok.is_special(i)]  # BOS and chat markers are no characters of the text
            text = b"".join(tok.token_bytes(i) for i in typed).decode("utf-8", errors="replace")
            split = [p for p, i in enumerate(ids) if not tok.is_special(i) and _is_fragment(tok.token_bytes(i))]
            out.update(token=split[0] if split else last,
                       values={"chars": len(text), "tokens": len(typed), "split": len(split)})
        elif preset.kind == "special":
            special = [p for p, i in enumerate(ids) if tok.is_special(i)]
            out.update(token=special[0] if special else last, values={"special": len(special), "tokens": n})
        return out
    return gw.result_cache().get(("lesson", gw._ident(source), preset_key, ids), find)


LENS_TOP = 10  # the fact lesson: "enters the top 10"


def _is_fragment(data: bytes) -> bool:
    """The token's bytes are not whole UTF-8 characters (part of a character split over tokens)."""
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def patch_lesson(source: str, ids, source_ids) -> dict:
    """Per layer, how far patching the last position's resid_post from `source_ids` moves the last prediction
    (explorer_model.analysis.patch_lesson), cached: the what-if preset's lesson target, found on the model."""
    from explorer_model.analysis.patch_lesson import patch_layer_sweep
    ids, source_ids = tuple(int(i) for i in ids), tuple(int(i) for i in source_ids)

    def run() -> dict:
        r = patch_layer_sweep(gw._model(source).model, ids, source_ids)
        gw._forward(len(r["kl"]) + 2)
        return r
    return gw.result_cache().get(("patch_lesson", gw._ident(source), ids, source_ids), run, gw._FORWARD)
