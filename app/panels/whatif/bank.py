"""The What-if view's "bank → river" lesson: patch one activation from a river-bank sentence into a money-bank
sentence and see the next-token prediction change.

The patched layer is found on the model (gateway.patch_lesson: every layer's patch of the last position, the
earliest that flips the top prediction by at least MIN_KL nats), never typed in. The preset replaces the visitor's
prompt, so the prompt it replaced is kept in session state "prompt_before_preset" (the sidebar and this view offer
the way back).
"""
from __future__ import annotations

import streamlit as st

from app import gateway
from app.context import ViewContext, display_piece, plain
from explorer_model.analysis.patch_lesson import lesson_layer

# Both end in " the" so the last position predicts a place: a bank (money) or a shore (river).
BANK_TARGET = "She walked into the bank and asked for a loan from the"
BANK_SOURCE = "She walked along the bank of the river and sat on the"
HOOK = "hook_resid_post"
MIN_KL = 0.5  # nats: below this a flipped top token is a coin toss between near-equal candidates


def other_sentence(prompt: str | None) -> str:
    """The default source prompt: the river sentence, or the money one when the prompt is the river one."""
    return BANK_TARGET if prompt == BANK_SOURCE else BANK_SOURCE


def lesson(source: str) -> dict:
    """{"layer", "spec", "sweep", "ids", "source_ids"} of the lesson on this model (cached by the gateway)."""
    cap = gateway.DEFAULT_MAX_TOKENS
    ids = gateway.encode_prompt(source, BANK_TARGET, cap)[0]
    src = gateway.encode_prompt(source, BANK_SOURCE, cap)[0]
    sweep = gateway.patch_lesson(source, ids, src)
    layer = lesson_layer(sweep, MIN_KL)
    return {"layer": layer, "spec": f"patch:blocks.{layer}.{HOOK}@-1", "sweep": sweep, "ids": ids, "source_ids": src}


def apply(source: str, set_specs) -> None:
    """Button callback: keep the visitor's prompt, load the lesson's prompts, intervention and layer."""
    ss = st.session_state
    if ss.get("prompt") != BANK_TARGET:
        ss["prompt_before_preset"] = ss.get("prompt", "")
    les = lesson(source)
    ss["prompt"] = BANK_TARGET
    ss["whatif_source"] = ss["whatif_source_text"] = BANK_SOURCE
    ss["layer"] = les["layer"]
    set_specs(les["spec"])


def restore() -> None:
    ss = st.session_state
    if "prompt_before_preset" in ss:
        ss["prompt"] = ss.pop("prompt_before_preset")


def draw_note(ctx: ViewContext, specs: str) -> None:
    """What to look for, when the lesson is on screen; and the way back to the visitor's prompt."""
    ss, t = st.session_state, ctx.t
    if ss.get("prompt") != BANK_TARGET:
        return
    les = lesson(ctx.source) if specs.startswith("patch:") else None  # (the layer search runs only for a patch)
    if les and specs == les["spec"]:
        sw, L, piece = les["sweep"], les["layer"], ctx.facts.piece
        st.info(t("whatif.bank_lesson", layer=L, before=plain(display_piece(piece(int(sw["top_clean"])))),
                  after=plain(display_piece(piece(int(sw["top"][L])))), kl=float(sw["kl"][L]),
                  kl_prev=float(sw["kl"][L - 1]) if L else 0.0))
    if ss.get("prompt_before_preset"):
        st.button(t("whatif.back_to_prompt", prompt=plain(ss["prompt_before_preset"][:60])), key="whatif_back",
                  on_click=restore)
