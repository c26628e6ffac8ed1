"""What a prompt will cost, said before it runs, and the recording run with a bar per layer when it is long.

The page asks the gateway (gateway.prompt_cost) for the recording's bytes, the memory this server can give it
and a rough time class, shows them in the sidebar, and refuses in one line, without running anything, a prompt
whose recording would not fit. A recording estimated at a second or more, or of a big model (gateway.BIG_LAYERS
layers of gateway.BIG_WIDTH or wider), runs under an st.progress bar advanced by the gateway after every block.
"""
from __future__ import annotations

import streamlit as st

from app import gateway
from app.plots import waiting
from app.sidebar import tr
from explorer_model.memory import size_text

TIME_KEYS = {"instant": "big.time.instant", "seconds": "big.time.seconds", "minute": "big.time.minute",
             "minutes": "big.time.minutes"}


def cost_line(cost: dict) -> str:
    """The sidebar's line: tokens, recording size, time class (or "recorded" when it is already cached)."""
    when = tr("big.cached") if cost["cached"] else tr(TIME_KEYS[cost["time_class"]])
    return tr("big.cost", tokens=cost["tokens"], size=size_text(cost["recording"]), when=when)


def recording_or_refusal(source: str, ids: list[int]):
    """The prompt's recording, or None after saying in one line why it was not run."""
    cost = gateway.prompt_cost(source, ids)
    st.sidebar.caption(cost_line(cost))
    if cost["refused"]:
        st.error(tr("big.refused", tokens=cost["tokens"], size=size_text(cost["recording"]),
                    budget=size_text(max(cost["budget"], 0))))
        return None
    if cost["too_long"]:
        st.error(tr("run.too_long", seconds=f"{cost['seconds']:.0f}", bound=f"{cost['bound']:.0f}"))
        return None
    if not cost["progress"]:
        ahead = 0 if cost["cached"] else gateway.forwards_ahead()
        with waiting(tr("app.running_queue", n=ahead) if ahead else tr("app.running"), not cost["cached"]):
            return gateway.recording(source, tuple(ids))
    bar = st.progress(0.0, text=tr("big.progress", done=0, total=cost["layers"]))

    def advance(done: int, total: int) -> None:
        bar.progress(done / total, text=tr("big.progress", done=done, total=total))
    rec = gateway.recording(source, tuple(ids), progress=advance)
    bar.empty()
    return rec
