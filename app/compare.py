"""Compare mode: a second recording B beside the page's recording A, in every view.

B is another prompt on the same model, the same prompt on another model (any offered source, e.g. tiny-pre vs
tiny-post), or the same prompt and model run with what-if interventions (their string form, as in the What-if
view). B is recorded by the gateway exactly like A (app/gateway/__init__.py: recording / changed_recording, one cache),
so switching view, layer, head or token runs no forward pass; a new B costs one recording.

State (st.session_state, and the URL through app/url_state.py's URL_KEYS, so a shared link opens the same comparison):
  cmp         "" (off) | "prompt" | "model" | "whatif"
  cmp_prompt  B's prompt (mode "prompt"); cmp_model  B's model (mode "model"); cmp_iv  B's interventions ("whatif")
  cmp_align   positions paired by hand, "i-j, …" (mode "prompt"; empty: common prefix and suffix)
The sidebar's widgets have their own keys (a widget's state is dropped while it is not shown), copied to these.
What each view draws is in app/panels/compare/views.py (HOOKS) and compare_stream.py.
"""
from __future__ import annotations

import streamlit as st

from app import gateway, sections
from app.context import ViewContext, plain, token_labels
from app.i18n import error_text, t
from app.panels.compare.common import Pair, map_layer, partner
from app.panels.compare.views import HOOKS
from app.plots import npz_button
from explorer_model.analysis import compare as C

URL_KEYS = ("cmp", "cmp_prompt", "cmp_model", "cmp_iv", "cmp_align")
MODES = ("", "prompt", "model", "whatif")
VALUE_OF = {"prompt": "cmp_prompt", "model": "cmp_model", "whatif": "cmp_iv"}  # the one value each mode needs
DEFAULT_IV = "no-rope"
MODE_KEYS = {"": "compare.mode_off", "prompt": "compare.mode_prompt", "model": "compare.mode_model",
             "whatif": "compare.mode_whatif"}
LEVEL_KEYS = {"tensors": "compare.level.tensors", "aligned": "compare.level.aligned", "curves": "compare.level.curves"}
LESSON_KEYS = {"identical": "compare.lesson.identical", "pre_vs_post": "compare.lesson.pre_vs_post",
               "two_models": "compare.lesson.two_models", "two_prompts": "compare.lesson.two_prompts",
               "intervention": "compare.lesson.intervention", "mixed": "compare.lesson.mixed"}  # C.LESSON_KEYS


def tr(key: str, **values) -> str:
    return t(key, st.session_state.get("lang", "en"), **values)


def _default(key: str, source: str) -> str:
    """What a B widget shows before the visitor chose: A's prompt, the twin or another offered model, no-rope."""
    if key == "cmp_prompt":
        return st.session_state.get("prompt") or ""
    if key == "cmp_model":
        others = [m for m in gateway.offered_models() if m != source]
        twins = {"tiny-pre": "tiny-post", "tiny-post": "tiny-pre"}
        return twins.get(source) if twins.get(source) in others else (others[0] if others else source)
    return st.session_state.get("whatif") or DEFAULT_IV


def _copy(key: str) -> None:
    st.session_state[key] = st.session_state.get("_w_" + key) or ""


def chooser(source: str) -> dict | None:
    """The sidebar's "Compare with… (B)"; returns B's spec {"mode", "source", "prompt", "specs"} or None (off)."""
    ss, sb = st.session_state, st.sidebar
    if ss.get("cmp") not in MODES:
        ss["cmp"] = ""
    sb.divider()
    ss["_w_cmp"] = ss.get("cmp") or None  # off is no choice (cleared with the box's ×), as for the presets
    mode = sb.selectbox(tr("compare.mode"), MODES[1:], key="_w_cmp", on_change=_copy, args=("cmp",), index=None,
                        format_func=lambda m: tr(MODE_KEYS[m]), help=tr("compare.mode_help"),
                        placeholder=tr(MODE_KEYS[""])) or ""
    kept = {VALUE_OF.get(mode)} | ({"cmp_align"} if mode == "prompt" else set())
    for other in (set(VALUE_OF.values()) | {"cmp_align"}) - kept:  # the link holds the mode and its values
        ss.pop(other, None)
    if not mode:
        return None
    key = VALUE_OF[mode]
    if not ss.get(key):
        ss[key] = _default(key, source)
    ss["_w_" + key] = ss[key]
    if mode == "prompt":
        sb.text_area(tr("compare.prompt_b"), key="_w_cmp_prompt", on_change=_copy, args=("cmp_prompt",), height=80,
                     max_chars=gateway.prompt_char_limit())
        ss["_w_cmp_align"] = ss.get("cmp_align") or ""
        sb.text_input(tr("compare.align"), key="_w_cmp_align", on_change=_copy, args=("cmp_align",),
                      help=tr("compare.align_help"))
    elif mode == "model":
        offered = gateway.offered_models()
        if ss[key] not in offered:  # a link may name a model this server does not offer
            sb.warning(tr("compare.model_not_offered", model=plain(ss[key])))
            return None
        sb.selectbox(tr("compare.model_b"), offered, key="_w_cmp_model", on_change=_copy, args=("cmp_model",))
    else:
        sb.text_input(tr("compare.iv_b"), key="_w_cmp_iv", on_change=_copy, args=("cmp_iv",),
                      help=tr("compare.iv_help"))
    sb.toggle(tr("compare.full_view"), key="cmp_full")
    value = ss[key]
    return {"mode": mode, "source": value if mode == "model" else source,
            "prompt": value if mode == "prompt" else ss.get("prompt") or "", "specs": value if mode == "whatif" else "",
            "align": ss.get("cmp_align") or ""}


LESSONS = {"compare_bank": "preset.compare_bank_lesson", "compare_twins": "preset.compare_twins_lesson",
           "compare_rope": "preset.compare_rope_lesson"}


def apply_lesson(preset, ids: list[int], pieces: list[str]) -> str | None:
    """A comparison preset's lesson (app/main.py's apply_lesson hands it here): while A and B are still the preset's,
    on its first run put the selection where its point shows (found by the gateway on the two recordings); the one
    sentence that says what to look for."""
    ss = st.session_state
    if any(str(ss.get(k if k != "model_pick" else "active_model")) != v for k, v in preset.args):
        ss.pop("lesson", None)  # the visitor changed B (or the model): the sentence would describe another pair
        return None
    try:
        target = gateway.compare_lesson(ss.active_model, preset.key, tuple(ids))
    except ValueError as e:  # e.g. a model on which the pair has no positions to compare
        st.info(tr("app.lesson_failed", error=plain(e)))
        return None
    if ss.pop("_lesson_pending", False):
        ss.update(view=target["view"], layer=target["layer"], head=target["head"], token=target["token"],
                  _token_auto=False)
    values = dict(target["values"])
    if "top" in values:
        values["top"] = pieces[values["top"]]
    return tr(target.get("lesson") or LESSONS[preset.key],  # the gateway may name the sentence that fits the pair
              **{k: plain(v) if isinstance(v, str) else v for k, v in values.items()})


def _ids_b(spec: dict, ctx: ViewContext, facts_b) -> list[int]:
    """B's token ids: the same ids for an intervention; else B's prompt as B's model reads it (with the page's BOS
    choice where the app adds BOS)."""
    if spec["mode"] == "whatif":
        return list(ctx.ids)
    bos = [facts_b.bos_id] if st.session_state.get("bos") and facts_b.bos_id is not None and not facts_b.add_bos else []
    body, _ = gateway.encode_prompt(spec["source"], spec["prompt"], max(1, int(st.session_state.get("max_tokens", 512)) - len(bos)))
    return bos + list(body)


def build(ctx: ViewContext, spec: dict) -> tuple[Pair | None, str | None]:
    """(the pair, None) or (None, one line saying why B cannot be drawn)."""
    facts_b, err = gateway.try_load(spec["source"])
    if facts_b is None:
        return None, tr("compare.load_failed", source=plain(spec["source"]), error=plain(err))
    if not spec["prompt"].strip():
        return None, tr("compare.empty_prompt")
    try:
        ids_b = _ids_b(spec, ctx, facts_b)
        if not ids_b:
            return None, tr("compare.empty_prompt")
        rec_b = gateway.changed_recording(spec["source"], ids_b, spec["specs"])
    except gateway.PromptError:
        return None, tr("compare.prompt_refused", limit=gateway.prompt_char_limit())
    except gateway.RunRefused as e:  # too big or too long for this server, like A
        return None, error_text(e, st.session_state.get("lang", "en"))
    except ValueError as e:
        return None, tr("compare.bad_iv", error=plain(error_text(e, ctx.lang)))
    rec_a = ctx.rec
    same_vocab = spec["source"] == ctx.source or C.shares_vocabulary(
        ctx.facts.piece, facts_b.piece, ctx.cfg.vocab_size, facts_b.cfg.vocab_size)
    level = C.comparable(rec_a, rec_b)
    align, by_hand = None, bool(spec.get("align", "").strip())
    if by_hand:
        try:
            align = C.alignment_from_pairs(parse_pairs(spec["align"]), len(ctx.ids), len(ids_b), ctx.ids, ids_b)
        except C.CompareError as e:
            return None, tr("compare.bad_align", error=plain(error_text(e, ctx.lang)))
    elif same_vocab and list(ids_b) != list(ctx.ids) and level.positions:
        align = C.align_minimal_pair(ctx.ids, ids_b)
    lesson = C.lesson_key(rec_a, rec_b, source_a=ctx.source, source_b=spec["source"],
                          prompt_a=st.session_state.get("prompt") or "", prompt_b=spec["prompt"],
                          interventions_b=[s for s in spec["specs"].split(",") if s.strip()])
    cfg_b = facts_b.cfg
    ctx_b = ViewContext(facts=facts_b, rec=rec_b, ids=list(ids_b), pieces=token_labels(facts_b, ids_b),
                        layer=map_layer(ctx.layer, ctx.cfg.n_layers, cfg_b.n_layers),
                        head=min(ctx.head, cfg_b.n_heads - 1),
                        token=partner(align, ctx.token, len(ctx.ids), len(ids_b)),
                        lang=ctx.lang, presenter=ctx.presenter, screen=ctx.screen, extras={"source": spec["source"]})
    return Pair(a=ctx, b=ctx_b, specs_b=spec["specs"], level=level, align=align, lesson=lesson,
                same_vocab=same_vocab, by_hand=by_hand), None


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """"0-0, 3-5" -> [("0", "0"), ("3", "5")]; alignment_from_pairs checks the numbers and says what is wrong."""
    out = []
    for part in (p.strip() for p in text.replace(";", ",").split(",")):
        if part:
            i, sep, j = part.replace(":", "-").partition("-")
            if not sep:
                raise C.AlignmentError("not_a_pair", part=part)
            out.append((i.strip(), j.strip()))
    return out


def describe(pair: Pair, spec: dict) -> str:
    """One line: what A and B are, and what of them compares."""
    b = {"prompt": tr("compare.b_prompt", prompt=plain(spec["prompt"])),
         "model": tr("compare.b_model", model=plain(spec["source"])),
         "whatif": tr("compare.b_whatif", specs=plain(spec["specs"]))}[spec["mode"]]
    return tr("compare.describe", model=plain(pair.a.source), n_a=len(pair.a.ids), b=b, n_b=len(pair.b.ids),
              level=tr(LEVEL_KEYS[pair.level.level]))


def draw(view: str, ctx: ViewContext, spec: dict | None) -> bool:
    """Draw the view's comparison of A and B; True when that is all the page shows (A's own view folded away),
    False when the caller should draw A's view (compare mode off, B unavailable, or asked for)."""
    if spec is None:
        return False
    with st.spinner(tr("compare.running")):
        pair, err = build(ctx, spec)
    if pair is None:
        st.warning(err)
        return False
    source_b, ids_b, specs_b = pair.b.source, tuple(int(i) for i in pair.b.ids), pair.specs_b
    npz_button(st.sidebar, tr("compare.download_b"), source_b, len(ids_b),  # called after the run: plain values
               lambda: gateway.changed_recording_npz(source_b, ids_b, specs_b), "recording_B.npz", "download_npz_b",
               st.session_state.get("lang", "en"))
    st.subheader(tr("compare.title", view=tr(f"view.{view}")))
    st.caption(describe(pair, spec))
    st.caption(tr(LESSON_KEYS[pair.lesson], specs=plain(spec["specs"]), model_b=plain(spec["source"])))
    with sections.comparison(view):  # where a page that shows a comparison lands (app/sections.py)
        HOOKS[view](pair)
    if st.session_state.get("cmp_full"):
        st.divider()
        st.caption(tr("compare.full_view_below"))
        return False
    return True
