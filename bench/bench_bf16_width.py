"""Our bfloat16 forward and record-all against HF transformers on the same folder, at the LLaMA-7B width.

A few layers (--layers, default 4) of random weights with LLaMA-7B's shapes (d_model 4096, 32 heads, d_ff 11008,
vocab 32000) are written as a bf16 HF folder (tests/synth_big.py). Both models load it in bfloat16; at each
length the four contenders run interleaved --repeats times in this one process, so drift hits all alike:
  ours_forward      our plain forward (logits)
  hf_forward        LlamaForCausalLM with its default attention (sdpa)
  ours_record_all   every hook into a float32 recording
  hf_with_outputs   HF eager with output_attentions and output_hidden_states
Reported: median wall seconds and the ratios ours / HF (below 1: ours is faster).

Usage: .venv/bin/python bench/bench_bf16_width.py [--layers 4] [--lengths 64 512] [--repeats 5] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

from machine import machine_line  # noqa: E402


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lengths", type=int, nargs="*", default=[64, 512])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    from transformers import LlamaForCausalLM

    from explorer_model.loaders import load
    from explorer_model.recording import record
    from synth_big import SEVEN_B, write_hf

    work = Path(args.workdir or tempfile.mkdtemp(prefix="le-bf16-"))
    try:
        folder = work / f"7b-width-{args.layers}"
        if not (folder / "config.json").exists():
            write_hf(folder, SEVEN_B, n_layers=args.layers, dtype=torch.bfloat16)
        ours = load(str(folder), dtype="bfloat16").model
        hf = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16).eval()
        hf_eager = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16,
                                                    attn_implementation="eager").eval()
        report = {"layers": args.layers, "threads": torch.get_num_threads(), "lengths": []}
        for n in args.lengths:
            ids = torch.randint(0, SEVEN_B["vocab"], (1, n), generator=torch.Generator().manual_seed(n))
            runs = {
                "ours_forward": lambda: ours(ids),
                "hf_forward": lambda: hf(ids).logits,
                "ours_record_all": lambda: record(ours, ids),
                "hf_with_outputs": lambda: hf_eager(ids, output_attentions=True, output_hidden_states=True),
            }
            times = {k: [] for k in runs}
            with torch.no_grad():
                for fn in runs.values():
                    fn()  # warm-up
                for _ in range(args.repeats):
                    for k, fn in runs.items():
                        t0 = time.perf_counter()
                        fn()
                        times[k].append(time.perf_counter() - t0)
                diff = (ours(ids) - hf(ids).logits.float()).abs().max().item()
            med = {k: round(statistics.median(v), 3) for k, v in times.items()}
            row = {"tokens": n, "median_seconds": med,
                   "forward_ours_vs_hf": round(med["ours_forward"] / med["hf_forward"], 3),
                   "record_all_vs_hf_with_outputs": round(med["ours_record_all"] / med["hf_with_outputs"], 3),
                   "max_abs_logit_diff": round(diff, 4)}
            report["lengths"].append(row)
            print(json.dumps(row), flush=True)
        print(json.dumps(report, indent=2))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
