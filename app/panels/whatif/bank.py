"""The What-if view's "bank → river" lesson: patch one activation from a river-bank sentence into a money-bank
sentence and see the next-token prediction change.

The patched layer is found on the model (gateway.patch_lesson: every layer's patch of the last position, the
earliest that flips the top prediction by at least MIN_KL nats), never typed in. The lesson replaces the visitor's
prompt through the page's replace_prompt, which keeps the visitor's whole state for "back to my prompt" (offered by
the sidebar and by this view).
"""
from __future__ import annotations

import streamlit as st

from app import gateway, sections
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


def apply(source: str, replace_prompt) -> None:
    """Button callback: the lesson's prompts, intervention and layer, the visitor's state kept for the way back."""
    les = lesson(source)
    replace_prompt(BANK_TARGET, whatif_source=BANK_SOURCE, whatif_source_text=BANK_SOURCE, layer=les["layer"],
                   whatif=les["spec"], whatif_specs=les["spec"], view="whatif")
    sections.request("whatif", "results")


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
    mine = ctx.extras.get("mine_prompt")
    if mine is not None and ctx.extras.get("back"):
        st.button(t("whatif.back_to_prompt", prompt=plain(mine[:60])), key="whatif_back", on_click=ctx.extras["back"])
