"""Why the server has a drawing lane (app/gateway/lanes.py): a forward pass beside page runs that draw.

Records a prompt on the default model (a) alone, (b) beside one thread running Python (one page drawing) at
Python's default 5 ms switch interval and at the gateway's (app/gateway/lanes.py), (c) while N threads run Python the way
page runs draw figures, without the lane, and (d) with those threads taking turns through the
drawing lane while the recording runs under the gateway's ForwardLock, at the gateway's interval. Each drawing
"page run" is --page-ms of pure Python. Reports seconds per recording and the ratio to (a), and how many page runs
the drawers finished meanwhile (the lane must not starve them).

Usage: .venv/bin/python bench/bench_gil.py [--drawers 4] [--tokens 30] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def page_run(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        sum(i * i for i in range(200))


def measure(rec_once, drawers: int, page_ms: float, repeats: int, lane=None, forward=None) -> dict:
    stop, pages = threading.Event(), [0]

    def drawer():
        while not stop.is_set():
            if lane is None:
                page_run(page_ms)
            else:
                with lane.held():
                    page_run(page_ms)
            pages[0] += 1

    threads = [threading.Thread(target=drawer, daemon=True) for _ in range(drawers)]
    for th in threads:
        th.start()
    t0 = time.perf_counter()
    for _ in range(repeats):
        if forward is None:
            rec_once()
        else:
            with lane.held(), forward:  # a page run that asks for a recording, as app/main.py does
                rec_once()
    seconds = (time.perf_counter() - t0) / repeats
    stop.set()
    for th in threads:
        th.join()
    return {"s_per_recording": round(seconds, 3), "pages_drawn_meanwhile": pages[0]}


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    p = argparse.ArgumentParser()
    p.add_argument("--drawers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page-ms", type=float, default=200.0)
    a = p.parse_args()
    from app.gateway.lanes import SWITCH_INTERVAL_S, DrawingLane, ForwardLock
    from explorer_model.loaders import load
    from explorer_model.recording import record

    model = load("smollm2").model
    ids = list(range(1000, 1000 + a.tokens))
    record(model, ids)  # warm up
    default_interval = sys.getswitchinterval()
    rec_once = lambda: record(model, ids)  # noqa: E731
    alone = measure(rec_once, 0, a.page_ms, a.repeats)
    one_default = measure(rec_once, 1, a.page_ms, a.repeats)
    before = measure(rec_once, a.drawers, a.page_ms, a.repeats)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    one_gateway = measure(rec_once, 1, a.page_ms, a.repeats)
    lane = DrawingLane()
    after = measure(rec_once, a.drawers, a.page_ms, a.repeats, lane, ForwardLock(lane))
    sys.setswitchinterval(default_interval)

    def ratio(r: dict) -> float:
        return round(r["s_per_recording"] / alone["s_per_recording"], 1)
    out = {"tokens": a.tokens, "drawers": a.drawers, "page_ms": a.page_ms, "loadavg": os.getloadavg()[0],
           "switch_interval_ms": {"default": default_interval * 1000, "gateway": SWITCH_INTERVAL_S * 1000},
           "alone": alone, "one_drawer_default_interval": one_default, "one_drawer_gateway_interval": one_gateway,
           "free_drawers_default_interval": before, "lane_gateway_interval": after,
           "slowdown": {"one_drawer_default": ratio(one_default), "one_drawer_gateway": ratio(one_gateway),
                        "free_drawers_default": ratio(before), "lane_gateway": ratio(after)}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
