"""CSS for the whole page that belongs to no view.

A display formula wider than its column (on a phone: attention's scores and mask, the residual stream's update)
scrolls sideways inside its own box, and nothing on the page said so: the formula simply ended at the screen's edge.
Each edge it continues past now shows a soft shadow, which goes when the formula is scrolled to that end (two
backgrounds that scroll with the formula cover two that stay with the box; a formula that fits covers both).
"""
from __future__ import annotations

import streamlit as st

PAGE = "#ffffff"  # the page's background (serve runs Streamlit's light theme)
FORMULA_EDGES = (
    "[data-testid='stMain'] .katex-display {"
    f"background: linear-gradient(to right, {PAGE} 30%, rgba(255,255,255,0)) left center / 2.5rem 100% no-repeat local,"
    f" linear-gradient(to left, {PAGE} 30%, rgba(255,255,255,0)) right center / 2.5rem 100% no-repeat local,"
    " radial-gradient(farthest-side at 0 50%, rgba(0,0,0,0.25), rgba(0,0,0,0))"
    " left center / 0.9rem 100% no-repeat scroll,"
    " radial-gradient(farthest-side at 100% 50%, rgba(0,0,0,0.25), rgba(0,0,0,0))"
    " right center / 0.9rem 100% no-repeat scroll;}")


def apply() -> None:
    st.html(f"<style>{FORMULA_EDGES}</style>")
