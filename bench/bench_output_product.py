"""The output matrix's product with a prompt's rows: MKL's sgemm (F.linear) against oneDNN's inner product (the
kernel explorer_model/kernels.py takes for a vocabulary's matrix at 4 to 256 rows), side by side in one process.

For each row count: the median milliseconds of each (interleaved repeats) and their ratio. The matrices are random
float32 of the real shapes: SmolLM2's 49152 x 576 (its tied embedding) and LLaMA-7B's 32000 x 4096. Run it under
the settings the suite's kernel matrix uses to see the other kernels, e.g.
  OMP_NUM_THREADS=2 .venv/bin/python bench/bench_output_product.py --threads 2
  ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python bench/bench_output_product.py
  MKL_CBWR=COMPATIBLE .venv/bin/python bench/bench_output_product.py

Usage: .venv/bin/python bench/bench_output_product.py [--threads 1] [--repeats 7] [--rows 2,4,8,13,16,64,256,1024]
       (prints JSON)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from explorer_model.kernels import ONE_ROW  # noqa: E402
from machine import machine_line  # noqa: E402

SHAPES = {"smollm2": (49152, 576), "llama-7b": (32000, 4096)}


def seconds(product) -> float:
    t0 = time.perf_counter()
    product()
    return time.perf_counter() - t0


def row_counts(text: str) -> list[int]:
    """--rows: positive integers, comma-separated (argparse turns a ValueError into one line and status 2)."""
    counts = [int(r) for r in text.split(",")]
    if not all(n > 0 for n in counts):
        raise ValueError(text)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the suite's workers and the app: 1)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rows", type=row_counts, default="2,4,8,13,16,64,256,1024",
                    help="row counts, comma-separated")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)  # a benchmark process, set once before any work
    print(machine_line(), file=sys.stderr, flush=True)
    if ONE_ROW is None:
        sys.exit("this torch has no oneDNN inner product: nothing to compare")
    report = {"threads": torch.get_num_threads(), "shapes": {}}
    for name, (vocab, width) in SHAPES.items():
        weight = torch.randn(vocab, width)
        rows = {}
        for n in args.rows:
            x = torch.randn(n, width)
            mkl = lambda: F.linear(x, weight)  # noqa: E731
            onednn = lambda: ONE_ROW(x, weight, None, "none", [], "")  # noqa: E731
            mkl(), onednn()  # first calls: the kernels' set-up
            a, b = [], []
            for _ in range(args.repeats):  # interleaved: both see the same moments of the machine
                a.append(seconds(mkl))
                b.append(seconds(onednn))
            ms_mkl, ms_onednn = 1e3 * statistics.median(a), 1e3 * statistics.median(b)
            rows[n] = {"mkl_ms": round(ms_mkl, 2), "onednn_ms": round(ms_onednn, 2),
                       "onednn_over_mkl": round(ms_onednn / ms_mkl, 2)}
            print(f"{name} {n} rows: {rows[n]}", file=sys.stderr, flush=True)
        report["shapes"][name] = rows
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
