"""App latency, measured as server time with streamlit's AppTest on the default model.

- prompt: a new 30-token prompt entered -> recording made and every view drawn once
- switch: changing layer, head, token or view on an existing recording (no forward pass)
- generation step: "take the top token" in the Residual view (one KV-cache step, the lens of the new position)
Usage: .venv/bin/python bench/bench_app.py
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
APP = str(Path(__file__).resolve().parents[1] / "app" / "main.py")


def run_app(timeout: float = 300, **query):
    """Open the app as a link with these query parameters would (AppTest; bench/ never imports tests/)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=timeout)
    for k, v in query.items():
        at.query_params[k] = str(v)
    return at.run()

PROMPTS = [
    "The animal didn't cross the street because it was too tired, so it lay down under a tree and slept there.",
    "In the morning the teacher wrote three equations on the board and asked the class to explain each term.",
    "The bank near the river collapsed after weeks of heavy rain, and the town council met to decide the plan.",
]


def generation_steps(at, state, prompt: str, n: int) -> dict:
    """Residual view, "take the top token" n times: seconds per click (the page with the longer prompt drawn) and
    the forward passes each click started (one KV-cache step: the recording, and the lens for the new position)."""
    at.sidebar.text_area(key="prompt").set_value(prompt).run()
    at.segmented_control(key="view").set_value("residual").run()
    times, forwards = [], []
    for _ in range(n):
        before = state.FORWARDS["count"]
        t0 = time.perf_counter()
        at.button(key="pred_greedy").click().run()
        times.append(time.perf_counter() - t0)
        forwards.append(state.FORWARDS["count"] - before)
    assert not at.exception, [e.value for e in at.exception]
    return {"median": round(statistics.median(times), 3), "max": round(max(times), 3), "forwards": forwards,
            "tokens_at_start": len(state._model("smollm2").tokenizer.encode(prompt))}


def main() -> None:
    from app import explorer as state
    from app.panels import VIEWS

    at = run_app(view="tokens", prompt="warm up")  # loads the model once, as a running server would have
    views = [v[0] for v in VIEWS]
    prompt_times, forwards, switch_times = [], [], {"layer": [], "head": [], "token": [], "view": []}
    for text in PROMPTS:
        n_tokens = len(state._model("smollm2").tokenizer.encode(text))
        before = state.FORWARDS["count"]
        t0 = time.perf_counter()
        at.sidebar.text_area(key="prompt").set_value(text).run()
        for v in views[1:] + views[:1]:
            at.segmented_control(key="view").set_value(v).run()
        prompt_times.append(time.perf_counter() - t0)
        forwards.append(state.FORWARDS["count"] - before)  # 1, plus the SwiGLU comparison pair the first time
        before = state.FORWARDS["count"]
        for v in views:
            at.segmented_control(key="view").set_value(v).run()
            for key, value in (("layer", 7), ("head", 5), ("token", n_tokens - 2), ("layer", 20)):
                t0 = time.perf_counter()
                at.sidebar.slider(key=key).set_value(value).run()
                switch_times[key].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            at.segmented_control(key="view").set_value(views[(views.index(v) + 1) % len(views)]).run()
            switch_times["view"].append(time.perf_counter() - t0)
        assert state.FORWARDS["count"] == before, "switching must not run the model"
        assert not at.exception, [e.value for e in at.exception]
    steps = generation_steps(at, state, PROMPTS[0], 5)
    report = {
        "generation_step_s": steps,
        "prompt_tokens": n_tokens,
        "forward_passes_per_prompt": forwards,
        "prompt_to_all_views_s": {"median": round(statistics.median(prompt_times), 3), "all": [round(x, 3) for x in prompt_times]},
        "switch_s": {k: {"median": round(statistics.median(v), 3), "max": round(max(v), 3)} for k, v in switch_times.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
