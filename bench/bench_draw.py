"""Drawing time of each view, without Streamlit's page run around it: the Python a classroom server's pages share.

Each view's `draw` is called in bare mode (no browser, no AppTest) for fresh SmolLM2 prompts: "first" when the
view meets the prompt (its view data computed and cached, its figures built), "again" for the same prompt with the
gateway's cached figures and tables dropped (figures built from cached view data), "cached" for the same prompt
with its figures in the cache (what a view switch back or a rerun costs: handing cached figures to Streamlit). All three
with Plotly's property-path parser memoized (as app/plots.py sets it up) and with Plotly's own parser,
interleaved per prompt, so the ratio is measured in one run.

Usage: .venv/bin/python bench/bench_draw.py [--prompts 4]   (prints JSON: medians in seconds per view and mode)
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
logging.disable(logging.WARNING)  # bare mode: Streamlit warns that there is no page run

import plotly.basedatatypes as B  # noqa: E402
import streamlit as st  # noqa: E402

from app import gateway  # noqa: E402
from app.context import ViewContext, display_piece  # noqa: E402
from app.panels import VIEWS  # noqa: E402  (imports app.plots, which memoizes the parser)
from explorer_model.tokenizer.labels import fragment_labels  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

SOURCE = gateway.DEFAULT_SOURCE
MEMOIZED = B._str_to_dict_path_full
MODES = {"memoized": MEMOIZED, "plotly": MEMOIZED.__wrapped__}
WHEN = ("first", "again", "cached")


def context(text: str) -> ViewContext:
    facts = gateway.facts(SOURCE)
    ids = gateway.encode_prompt(SOURCE, text, 256)[0]
    st.session_state["prompt"] = text
    pieces = [display_piece(p) for p in fragment_labels([facts.token_bytes(i) for i in ids])]
    return ViewContext(facts=facts, rec=gateway.recording(SOURCE, tuple(ids)), ids=ids, pieces=pieces, layer=5,
                       head=2, token=len(ids) - 1, lang="en", extras={"source": SOURCE})


def main() -> None:
    line = machine_line()
    print(line, file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="fresh prompts per mode")
    args = ap.parse_args()
    warm = context("warm up every view once")
    for _, draw in VIEWS:
        draw(warm)
    times: dict = {}
    for r in range(args.prompts):
        for mode, parse in MODES.items():
            B._str_to_dict_path_full = parse
            ctx = context(f"The quick brown fox number {r} jumps over the lazy dog ({mode}), said the teacher.")
            for view, draw in VIEWS:
                for when in WHEN:
                    if when == "again":  # every drawn figure and table, and the built figures behind them
                        for kind in ("figure", "figure_spec", "table"):
                            gateway.result_cache().discard(kind)
                    t = time.perf_counter()
                    draw(ctx)
                    times.setdefault(mode, {}).setdefault(view, {}).setdefault(when, []).append(time.perf_counter() - t)
    B._str_to_dict_path_full = MEMOIZED
    out = {mode: {view: {when: round(statistics.median(v), 4) for when, v in by.items()} for view, by in per.items()}
           for mode, per in times.items()}
    for mode in out:
        out[mode]["all_views"] = {when: round(sum(v[when] for v in out[mode].values()), 4) for when in WHEN}
    out["ratio_memoized_vs_plotly"] = {when: round(out["memoized"]["all_views"][when] / out["plotly"]["all_views"][when], 3)
                                       for when in WHEN}
    print(json.dumps({"machine": line, **out}, indent=1))


if __name__ == "__main__":
    main()
