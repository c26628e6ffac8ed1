"""The what-if view's "bank" lesson: patching the last position's resid_post from the other sentence at every layer
in turn. The lesson's sweep (explorer_model/analysis/patch_lesson.py: one batched run, a row patched at each
layer, the positions before the patch run once) against the what-if's own patch run once per layer, on SmolLM2,
side by side in one process: CPU seconds of each (median of --repeats, interleaved), their ratio, and how far the
two agree (largest KL difference, the same top token at every layer).

Usage: .venv/bin/python bench/bench_patch_sweep.py [--repeats 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from machine import machine_line  # noqa: E402


def per_layer(model, ids, source_ids) -> dict:
    """One ordinary run per layer with the what-if's patch (explorer_model.interventions.Patch)."""
    from explorer_model.analysis.measures import kl_divergence
    from explorer_model.interventions import intervene

    tokens = torch.tensor([list(ids)])
    with torch.no_grad():
        clean = F.log_softmax(model(tokens)[0, -1].double(), -1)
        kl, top = [], []
        for layer in range(model.cfg.n_layers):
            with intervene(model, [f"patch:blocks.{layer}.hook_resid_post@-1"], list(source_ids)):
                lp = F.log_softmax(model(tokens)[0, -1].double(), -1)
            kl.append(float(kl_divergence(clean, lp)))
            top.append(int(lp.argmax()))
    return {"kl": kl, "top": top}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line(), file=sys.stderr, flush=True)
    from app.panels.whatif.bank import BANK_SOURCE, BANK_TARGET
    from explorer_model.analysis.patch_lesson import patch_layer_sweep
    from explorer_model.loaders import load

    loaded = load("smollm2")
    ids, source_ids = loaded.tokenizer.encode(BANK_TARGET), loaded.tokenizer.encode(BANK_SOURCE)
    seconds: dict[str, list[float]] = {"sweep": [], "per_layer": []}
    for _ in range(args.repeats):
        for name, run in (("sweep", lambda: patch_layer_sweep(loaded.model, ids, source_ids)),
                          ("per_layer", lambda: per_layer(loaded.model, ids, source_ids))):
            t0 = time.process_time()
            result = run()
            seconds[name].append(time.process_time() - t0)
            if name == "sweep":
                sweep = result
            else:
                reference = result
    median = {k: statistics.median(v) for k, v in seconds.items()}
    print(json.dumps({
        "tokens": len(ids), "layers": loaded.model.cfg.n_layers, "threads": torch.get_num_threads(),
        "cpu_s": {k: round(v, 3) for k, v in median.items()},
        "per_layer_over_sweep": round(median["per_layer"] / median["sweep"], 2),
        "max_kl_difference": float(max(abs(a - b) for a, b in zip(sweep["kl"], reference["kl"]))),
        "same_top_tokens": [int(t) for t in sweep["top"]] == reference["top"]}, indent=1))


if __name__ == "__main__":
    main()
