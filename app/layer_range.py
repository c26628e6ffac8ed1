"""Layers × heads grids on deep models (LLaMA-7B: 32 × 32): a layer range chosen in the view, and the grid
computed one layer at a time, each layer cached on its own, under a progress bar.

Panels call these with their ViewContext; the work itself is gateway.derived (recordings only, no model run).
"""
from __future__ import annotations

import contextlib

import streamlit as st

from app import choice_state, gateway

RANGE_FROM = 12  # a model with more layers than this gets a range control; smaller grids are shown whole
PROGRESS_FROM = 8  # layers computed in one go from which a bar is worth drawing


def layer_range(ctx, key: str) -> range:
    """The layers a grid shows: all of them, or on a deep model the range chosen with a slider under `key`."""
    n = ctx.cfg.n_layers
    if n <= RANGE_FROM:
        return range(n)
    # kept while another view is shown; a range set for a deeper model starts again from every layer
    choice_state.start(key, (0, n - 1), hi=n - 1, keep=True)
    lo, hi = st.select_slider(ctx.t("big.grid_layers"), options=list(range(n)), key=key,
                              value=(0, n - 1))  # a pair: a range slider (the value in session state wins)
    return range(int(lo), int(hi) + 1)


def per_layer(ctx, name: str, fn, layers: range, *args) -> list:
    """[fn(recording, layer, *args) for layer in layers], each through gateway.derived (cached per layer), with
    a progress bar while PROGRESS_FROM or more of them are still to compute (none when they are all cached: the
    bar's updates would be most of a redrawn page's messages)."""
    todo = sum(not gateway.derived_cached(name, ctx.source, ctx.ids, layer, *args) for layer in layers)
    bar = st.progress(0.0, text=ctx.t("big.grid_progress", done=0, total=len(layers))) \
        if todo >= PROGRESS_FROM else None
    out = []
    # the page's turn is given up once for the layers to compute, not once per layer (each time taken back only
    # after the page that drew meanwhile); a page that finds them all cached keeps its turn
    with gateway.aside() if todo else contextlib.nullcontext():
        for i, layer in enumerate(layers):
            out.append(gateway.derived(name, ctx.source, ctx.ids, fn, layer, *args))
            if bar is not None:
                bar.progress((i + 1) / len(layers), text=ctx.t("big.grid_progress", done=i + 1, total=len(layers)))
    if bar is not None:
        bar.empty()
    return out
