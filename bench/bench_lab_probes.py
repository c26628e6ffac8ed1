"""What the lab's "gradients at initialisation" experiment costs when the visitor moves the depth slider: the
experiment with the default options at one depth and then at another, in CPU seconds on one thread (as the lab's
worker runs it), computed from scratch and through the worker's kept probes (explorer_model/lab/worker.py), where
the second depth reuses the depth sweep of the first.

Usage: .venv/bin/python bench/bench_lab_probes.py [--depths 12 24]   (prints JSON)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run

from machine import machine_line  # noqa: E402

from explorer_model.lab import normlab as lab  # noqa: E402
from explorer_model.lab import worker  # noqa: E402


def cpu_seconds(run) -> float:
    t0 = time.process_time()
    run()
    return round(time.process_time() - t0, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depths", type=int, nargs="+", default=[12, 24])
    args = ap.parse_args()
    print(machine_line())
    options = lab.LabOptions()
    worker.kept_probe.cache_clear()
    with lab.threads(1):
        scratch = [cpu_seconds(lambda d=d: lab.init_gradients(options, depth=d)) for d in args.depths]
        kept = [cpu_seconds(lambda d=d: worker.run_init_gradients(0, asdict(options), d)) for d in args.depths]
    print(json.dumps({"depths": args.depths, "from_scratch_cpu_s": scratch, "kept_probes_cpu_s": kept}))


if __name__ == "__main__":
    main()
