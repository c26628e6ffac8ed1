"""What the what-if's "KL per layer" costs on SmolLM2: `lens_kl` (only the rows a change reached go through the
output matrix) against its peer in the same process, every layer's every position unembedded, for a block's MLP
skipped early, in the middle and late in the model; CPU seconds on one thread (best of 3) and the largest
difference between the two.

Usage: .venv/bin/python bench/bench_whatif_kl.py [--layers 5 15 25]   (prints JSON)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run

import torch  # noqa: E402
from machine import machine_line  # noqa: E402

from explorer_model.analysis import measures as M  # noqa: E402
from explorer_model.loaders import load  # noqa: E402
from explorer_model.recording import record  # noqa: E402
from explorer_model.runtime import threads  # noqa: E402

PROMPT = "The bank near the river was flooded after the storm, so the fishermen moved their boats upstream to"


def every_row(model, clean, changed) -> torch.Tensor:
    """The peer: all layers' positions through the output matrix, in the same chunks of 1024 rows."""
    n = model.cfg.n_layers
    a = torch.cat([clean[f"blocks.{l}.hook_resid_post"][0] for l in range(n)])
    b = torch.cat([changed[f"blocks.{l}.hook_resid_post"][0] for l in range(n)])
    kl = [M.kl_divergence(M.lens_logprobs(model, a[i:i + 1024]), M.lens_logprobs(model, b[i:i + 1024]))
          for i in range(0, a.shape[0], 1024)]
    return torch.cat(kl).view(n, -1).mean(1)


def best_cpu(run, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        run()
        times.append(time.process_time() - t0)
    return round(min(times), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[5, 15, 25])
    args = ap.parse_args()
    print(machine_line())
    loaded = load("smollm2")
    model, ids = loaded.model, loaded.tokenizer.encode(PROMPT)
    rows = []
    with threads(1):
        clean = record(model, ids)
        for layer in args.layers:
            changed = record(model, ids, interventions=[f"skip:blocks.{layer}.mlp"])
            diff = float((every_row(model, clean, changed) - M.lens_kl(model, clean, changed)).abs().max())
            rows.append({"skipped": f"blocks.{layer}.mlp", "every_row_cpu_s": best_cpu(
                lambda: every_row(model, clean, changed)), "lens_kl_cpu_s": best_cpu(
                lambda: M.lens_kl(model, clean, changed)), "max_abs_difference_nats": diff})
    print(json.dumps({"tokens": len(ids), "runs": rows}))


if __name__ == "__main__":
    main()
