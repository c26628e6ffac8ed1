"""Decode speed: greedy tokens/s of our generate() against HF transformers' LlamaForCausalLM, same weights.

"ours" is generate() as the CLI runs it (the compiled step), "ours_lean" the same with the compiled step turned
off (decode.py's torch step, as on a machine without a C compiler).
Both continue the same prompt greedily for --new tokens (HF with its end-of-text stop turned off, ours without
stop ids), interleaved repeats, medians. The memory-read ceiling is the float32 weight bytes a step must read
divided by this machine's read bandwidth, measured here as a sum over a 512 MiB tensor.
Usage: .venv/bin/python bench/bench_decode.py [--new 64] [--repeats 5] [--threads N] [--pack auto|none|small|huge]
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

from bench_core import hf_twin  # noqa: E402
from explorer_model.generate import native_build, native_step  # noqa: E402
from explorer_model.generate.decode import pack_for_decode, packing_for  # noqa: E402
from explorer_model.loaders import load  # noqa: E402
from explorer_model.runtime import keep_freed_memory  # noqa: E402
from explorer_model.generate.sampling import generate  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

keep_freed_memory()  # as the app and the CLI run

PROMPT = "The history of the printing press begins"


def read_bandwidth(repeats: int = 7) -> float:
    """Bytes per second of one pass over a tensor far larger than the caches (best of a few)."""
    x = torch.ones(128 * 2**20)  # 512 MiB of float32
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=64, help="tokens generated per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, help="torch threads for this process (default: torch's choice)")
    ap.add_argument("--pack", choices=["auto", "none", "small", "huge"], default="auto",
                    help="weights packing for our decode (explorer_model/generate/decode.py); auto: as the CLI for --new")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # a benchmark process, set once before any work
    loaded = load("smollm2")
    model, ids = loaded.model, loaded.tokenizer.encode(PROMPT)
    hf = hf_twin(model)
    packing = args.pack if args.pack != "auto" else packing_for(args.new, native_step.serves(model))  # as the CLI
    t0 = time.perf_counter()
    if packing != "none":
        pack_for_decode(model, huge_pages=packing == "huge")
    pack_seconds = time.perf_counter() - t0  # once per process, not in the figures below
    hf.generation_config.eos_token_id = None  # run the full length, as ours does without stop ids
    hf.generation_config.pad_token_id = 0
    prompt = torch.tensor([ids])

    def ours():
        return generate(model, ids, args.new)  # the compiled step (explorer_model/generate/native_step.py) when it builds

    def ours_lean():
        os.environ["LLAMA_EXPLORER_NATIVE"] = "0"  # decode.py's torch step, as on a machine without a compiler
        try:
            return generate(model, ids, args.new)
        finally:
            del os.environ["LLAMA_EXPLORER_NATIVE"]

    def theirs():
        with torch.no_grad():
            out = hf.generate(prompt, max_new_tokens=args.new, do_sample=False)
        return out[0, len(ids):].tolist()

    runs = {"ours": ours, "ours_lean": ours_lean, "hf": theirs}
    tokens = {k: fn() for k, fn in runs.items()}  # warm-up, and the tokens compared below
    secs = {k: [] for k in runs}
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            secs[k].append(time.perf_counter() - t0)
    tps = {k: round(args.new / statistics.median(v), 2) for k, v in secs.items()}
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied matrix once
    bandwidth = read_bandwidth()
    ceiling = bandwidth / weight_bytes
    same = {k: f"{sum(a == b for a, b in zip(tokens[k], tokens['hf']))}/{args.new}" for k in ("ours", "ours_lean")}
    report = {
        "threads": torch.get_num_threads(), "prompt_tokens": len(ids), "new_tokens": args.new,
        "tokens_per_s": tps, "all_tokens_per_s": {k: [round(args.new / s, 2) for s in v] for k, v in secs.items()},
        "ratio_ours_vs_hf": round(tps["ours"] / tps["hf"], 2), "ratio_lean_vs_hf": round(tps["ours_lean"] / tps["hf"], 2),
        "native_step": "compiled" if native_build.library() else f"not built: {native_build.failure()}",
        "weights_MB": round(weight_bytes / 1e6, 1), "read_GB_per_s": round(bandwidth / 1e9, 1),
        "ceiling_tokens_per_s": round(ceiling, 1), "fraction_of_ceiling": round(tps["ours"] / ceiling, 2),
        "greedy_tokens_equal_to_hf": same,
        "packing": packing, "pack_seconds": round(pack_seconds, 2), "load_average": os.getloadavg()[0],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
