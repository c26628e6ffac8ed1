"""App latency, measured as server time with streamlit's AppTest on the default model.

- prompt: a new 30-token prompt entered -> recording made and every view drawn once
- switch: changing layer, head, token or view on an existing recording (no forward pass)
- generation step: "take the top token" in the Next token view (one KV-cache step)
- continuation: "top token × 48" in the Next token view: decoding alone (tokens/s through the gateway) and the click
- --compare: switch times in compare mode (B = a minimal pair of A) against single mode, interleaved in one run
Usage: .venv/bin/python bench/bench_app.py [--compare]
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

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
    """Next token view, "take the top token" n times: seconds per click (the page with the longer prompt drawn) and
    the forward passes each click started (one KV-cache step of the recording)."""
    at.sidebar.text_area(key="prompt").set_value(prompt).run()
    at.segmented_control(key="view").set_value("predict").run()
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


def continuation(at, state, prompt: str, n: int) -> dict:
    """"Top token × n" in the Next token view: the decoding alone (the gateway, tokens/s) and the click as a whole
    (decoding, then the longer prompt recorded and the view drawn)."""
    at.sidebar.text_area(key="prompt").set_value(prompt).run()
    at.segmented_control(key="view").set_value("predict").run()
    ids = state.encode_prompt("smollm2", prompt, 256)[0]
    t0 = time.perf_counter()
    new = state.continuation("smollm2", ids, n)
    decode_s = time.perf_counter() - t0
    state.result_cache().clear()  # the click decodes again
    at.number_input(key="pred_continue_n").set_value(n).run()
    t0 = time.perf_counter()
    at.button(key="pred_continue_greedy").click().run()
    click_s = time.perf_counter() - t0
    assert not at.exception, [e.value for e in at.exception]
    return {"new_tokens": len(new), "decode_tokens_per_s": round(len(new) / decode_s, 1),
            "click_s": round(click_s, 3)}


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    from app import gateway as state
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
        "continuation": continuation(at, state, PROMPTS[1], 48),
        "prompt_tokens": n_tokens,
        "forward_passes_per_prompt": forwards,
        "prompt_to_all_views_s": {"median": round(statistics.median(prompt_times), 3), "all": [round(x, 3) for x in prompt_times]},
        "switch_s": {k: {"median": round(statistics.median(v), 3), "max": round(max(v), 3)} for k, v in switch_times.items()},
    }
    print(json.dumps(report, indent=2))


# --------------------------------------------------------------------------- compare mode
def compare_switches(rounds: int = 3) -> dict:
    """View / layer / head switches with compare mode on (B = the same prompt with one word changed, so every view
    draws A, B and B − A; alone, and with A's own view below) against the same switches in single mode,
    interleaved switch by switch in one process, after every view was visited once in each (what a visitor who
    looked around has cached)."""
    from app import gateway as state
    from app.panels import VIEWS

    text = PROMPTS[2]
    b = dict(cmp="prompt", cmp_prompt=text.replace("river", "road"))
    pages = {"single": run_app(view="tokens", prompt=text), "compare": run_app(view="tokens", prompt=text, **b),
             "compare_and_a_view": run_app(view="tokens", prompt=text, **b)}
    pages["compare_and_a_view"].sidebar.toggle(key="cmp_full").set_value(True).run()  # A's own view drawn below too
    views = [v[0] for v in VIEWS]
    for at in pages.values():
        for v in views:
            at.segmented_control(key="view").set_value(v).run()
    times = {mode: {"view": [], "layer": [], "head": []} for mode in pages}
    before, step = state.FORWARDS["count"], 0
    for _ in range(rounds):
        for v in views:
            step += 1
            for mode, at in pages.items():
                t0 = time.perf_counter()
                at.segmented_control(key="view").set_value(v).run()
                times[mode]["view"].append(time.perf_counter() - t0)
                for key, value in (("layer", (7, 20)[step % 2]), ("head", (5, 2)[step % 2])):
                    t0 = time.perf_counter()
                    at.sidebar.slider(key=key).set_value(value).run()
                    times[mode][key].append(time.perf_counter() - t0)
                assert not at.exception, [e.value for e in at.exception]
    med = {mode: {k: statistics.median(v) for k, v in t.items()} for mode, t in times.items()}
    return {"compare_switch_s": {m: {k: round(v, 3) for k, v in d.items()} for m, d in med.items()},
            "over_single": {m: {k: round(med[m][k] / med["single"][k], 2) for k in med["single"]} for m in med if m != "single"},
            "forward_passes_on_switches": state.FORWARDS["count"] - before,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


if __name__ == "__main__":
    import sys

    if "--compare" in sys.argv[1:]:
        print(json.dumps(compare_switches(), indent=2))
    else:
        main()
