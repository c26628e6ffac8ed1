"""Tutorial-sized models on this machine: LLaMA-7B shapes in 16 bits, SmolLM2 in bf16 vs float32, long prompts.

Builds its own synthetic checkpoints with random weights of the real shapes (tests/synth_big.py) in --workdir:
  7b      LLaMA-7B as bf16 sharded HF safetensors and as a Meta fp16 folder: load time, RSS after load, peak RSS,
          forward and record-all (every hook, float32 recording) at 64 and 512 tokens; HF transformers loading
          the same HF folder in bf16 (time, peak RSS, forward). fp16 matmuls have no fast CPU kernel here (~15
          GFLOPS against ~230 for bf16 with AVX512-BF16), so the fp16 Meta folder is timed at 64 tokens only, and
          also loaded with --dtype bfloat16 (converted while loading).
  smollm2 the default model in bfloat16 vs float32 (max |logit difference|, top-1 agreement on held-out prompts);
          record-all at 4096 tokens with float16 recordings: time, peak RSS, bytes against memory.recording_bytes.
  7b_long record-all (float16 recording) of --long-tokens (2048) on the 7B width with --long-layers blocks
          (default 16: the full 32 would need 12.5 GB of recording beside 12.6 GB of weights on this 24 GB machine):
          time, peak RSS, recording size against memory.recording_bytes.
  13b     a LLaMA-13B bf16 checkpoint (~26 GB, more than this machine's free memory), written one shard at a time,
          one 16-token recording paged from disk: time and peak RSS. The folder is deleted afterwards.
Every measurement runs in a fresh child process, so its peak RSS (VmHWM, file pages of mapped weights included)
is its own.

Usage: .venv/bin/python bench/bench_big.py [--parts 7b,smollm2,7b_hf,7b_long,13b] [--workdir DIR] [--keep]   (prints JSON)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

HELD_OUT = ["The old lighthouse keeper climbed the stairs every evening to",
            "In 1969, two astronauts walked on the surface of the",
            "To make bread, first mix flour, water, salt and",
            "人工智能的发展改变了我们的生活方式，",
            "def fibonacci(n):\n    if n < 2:\n        return"]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))


def _mb(n: int) -> int:
    return round(n / 2**20)


def _timed(fn, reps: int = 1):
    best = None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
    return out, round(best, 2)


# --------------------------------------------------------------------------- children
def child_ours(folder: str, dtype: str, lengths: list[int], reps: int) -> dict:
    import torch

    from explorer_model.loaders import load
    from explorer_model.recording import record
    from explorer_model.runtime import keep_freed_memory

    keep_freed_memory()  # as the CLI and the app do
    torch.manual_seed(0)
    loaded, load_s = _timed(lambda: load(folder, dtype=dtype))
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    out = {"dtype": loaded.dtype_name, "load_s": load_s, "weights_mb": _mb(weights),
           "rss_after_load_mb": _mb(_status("VmRSS"))}
    model = loaded.model
    with torch.no_grad():
        for n in lengths:
            tokens = torch.randint(3, loaded.cfg.vocab_size, (1, n))
            _, out[f"forward_{n}_first_s"] = _timed(lambda: model(tokens))  # pages the weights in from disk
            _, fwd = _timed(lambda: model(tokens), reps)
            rec, rec_s = _timed(lambda: record(model, tokens), reps)
            out[f"forward_{n}_s"], out[f"record_all_{n}_s"] = fwd, rec_s
            out[f"record_over_forward_{n}"] = round(rec_s / fwd, 2)
            out[f"recording_{n}_mb"] = _mb(rec.stored_bytes())
            del rec
            out[f"peak_rss_after_{n}_mb"] = _mb(_status("VmHWM"))
    return out


def child_transformers(folder: str, lengths: list[int], reps: int) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    model, load_s = _timed(lambda: LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval())
    out = {"load_s": load_s, "rss_after_load_mb": _mb(_status("VmRSS"))}
    with torch.no_grad():
        for n in lengths:
            tokens = torch.randint(3, 32000, (1, n))
            _, out[f"forward_{n}_first_s"] = _timed(lambda: model(tokens, use_cache=False))
            _, out[f"forward_{n}_s"] = _timed(lambda: model(tokens, use_cache=False), reps)
            out[f"peak_rss_after_{n}_mb"] = _mb(_status("VmHWM"))
    return out


def child_smollm2_dtypes() -> dict:
    import torch

    from explorer_model.loaders import load

    f32, bf = load("smollm2", dtype="float32"), load("smollm2", dtype="bfloat16")
    worst, agree, total = 0.0, 0, 0
    with torch.no_grad():
        for text in HELD_OUT:
            ids = torch.tensor([f32.tokenizer.encode(text)])
            a, b = f32.model(ids)[0], bf.model(ids)[0]
            worst = max(worst, (a - b).abs().max().item())
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            total += ids.shape[1]
    return {"prompts": len(HELD_OUT), "positions": total, "max_abs_logit_diff": round(worst, 3),
            "top1_agreement": round(agree / total, 4)}


def child_long(n: int, model_dtype: str) -> dict:
    import torch

    from explorer_model import memory
    from explorer_model.loaders import load
    from explorer_model.recording import record
    from explorer_model.runtime import keep_freed_memory

    keep_freed_memory()
    loaded = load("smollm2", dtype=model_dtype)
    text = " ".join(HELD_OUT[:3] * 200)
    ids = (loaded.tokenizer.encode(text) * 2)[:n]
    rss0 = _status("VmRSS")
    rec, seconds = _timed(lambda: record(loaded.model, ids, dtype=torch.float16))
    seen, held = set(), 0
    for t in list(rec._store.values()) + [t for qk in rec._rotated.values() for t in qk]:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            held += t.untyped_storage().nbytes()
    est = memory.recording_bytes(loaded.cfg, n, torch.float16, model_dtype=loaded.dtype)
    pattern = rec.pattern(loaded.cfg.n_layers - 1)  # rebuilt on access, one layer at a time
    return {"tokens": n, "model_dtype": loaded.dtype_name, "record_all_s": seconds, "recording_mb": _mb(held),
            "estimated_mb": _mb(est), "rss_before_mb": _mb(rss0), "peak_rss_mb": _mb(_status("VmHWM")),
            "last_layer_pattern_shape": list(pattern.shape)}


def child_record(folder: str, n: int, rec_dtype: str = "float16") -> dict:
    """One record-all of n tokens in bf16 weights, a layer-progress callback counting the blocks as they finish."""
    import torch

    from explorer_model import memory
    from explorer_model.loaders import load
    from explorer_model.recording import record
    from explorer_model.runtime import keep_freed_memory

    keep_freed_memory()
    room = memory.available_bytes() or 0
    loaded, load_s = _timed(lambda: load(folder, dtype="bfloat16"))
    rss_load = _status("VmRSS")
    steps, dtype = [], memory.DTYPES[rec_dtype]
    tokens = torch.randint(3, loaded.cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    with memory.layer_progress(loaded.model, lambda done, total: steps.append(done)):
        rec, seconds = _timed(lambda: record(loaded.model, tokens, dtype=dtype))
    return {"layers": loaded.cfg.n_layers, "d_model": loaded.cfg.d_model, "tokens": n, "recording_dtype": rec_dtype,
            "load_s": load_s, "record_all_s": seconds,
            "layers_reported": steps == list(range(1, loaded.cfg.n_layers + 1)),
            "recording_mb": _mb(rec.stored_bytes()),
            "estimated_recording_mb": _mb(memory.recording_bytes(loaded.cfg, n, dtype)),
            "available_mb_at_start": _mb(room), "rss_after_load_mb": _mb(rss_load),
            "peak_rss_mb": _mb(_status("VmHWM")), "finite": bool(torch.isfinite(rec.logits).all())}


# --------------------------------------------------------------------------- parent
def run_child(*args) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(args)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE")
    t = time.perf_counter()
    load_before = os.getloadavg()[0]  # the machine is shared: every figure carries the load it was taken at
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    load = {"load_avg_before": round(load_before, 1), "load_avg_after": round(os.getloadavg()[0], 1)}
    if p.returncode:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "wall_s": round(time.perf_counter() - t, 1),
                **load}
    return {**json.loads(p.stdout.strip().splitlines()[-1]), **load}


def build(workdir: Path) -> dict:
    from synth_big import SEVEN_B, file_bytes, write_hf, write_meta

    made = {}
    for name, fn in (("hf7b_bf16", lambda d: write_hf(d, SEVEN_B, dtype=__import__("torch").bfloat16)),
                     ("meta7b_fp16", lambda d: write_meta(d, SEVEN_B))):
        folder = workdir / name
        if not (folder / "DONE").exists():
            shutil.rmtree(folder, ignore_errors=True)
            t = time.perf_counter()
            fn(folder)
            (folder / "DONE").write_text(f"{time.perf_counter() - t:.0f}")
        made[name] = {"path": str(folder), "file_mb": _mb(file_bytes(folder))}
    return made


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="7b,smollm2")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints (reused by the next run)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--long-tokens", type=int, default=2048)
    ap.add_argument("--long-layers", type=int, default=16,
                    help="blocks of the 7B-width model for 7b_long (32 = the full 7B; its float16 recording at "
                         "2048 tokens alone is 12.5 GB)")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        kind, *rest = json.loads(a.child)
        print(json.dumps(globals()[f"child_{kind}"](*rest)))
        return
    parts = a.parts.split(",")
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="bench_big_"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "cpus": os.cpu_count()}
    try:
        if "smollm2" in parts:
            report["smollm2_bf16_vs_f32"] = run_child("smollm2_dtypes")
            report["smollm2_record_all_4096_f32"] = run_child("long", 4096, "float32")
            report["smollm2_record_all_4096_bf16"] = run_child("long", 4096, "bfloat16")
        if "7b" in parts or "7b_hf" in parts:  # 7b_hf: the HF folder only, ours against transformers
            made = report["checkpoints"] = build(workdir)
            hf, meta = made["hf7b_bf16"]["path"], made["meta7b_fp16"]["path"]
            report["ours_hf_bf16"] = run_child("ours", hf, "bfloat16", [64, 512], a.reps)
            report["transformers_hf_bf16"] = run_child("transformers", hf, [64, 512], a.reps)
        if "7b" in parts:
            report["ours_meta_fp16"] = run_child("ours", meta, "float16", [64], 1)
            # converted while loading: 13 GB of private bf16 copies, so 64 tokens only (a 512-token float32
            # recording on top, 6.7 GB, does not fit beside them on this 24 GB machine)
            report["ours_meta_as_bf16"] = run_child("ours", meta, "bfloat16", [64], 1)
        if "7b_long" in parts:  # record-all of --long-tokens on the 7B width with --long-layers blocks
            from synth_big import SEVEN_B, file_bytes, write_hf

            folder = workdir / f"hf7b_{a.long_layers}l_bf16"
            if not (folder / "DONE").exists():
                write_hf(folder, SEVEN_B, n_layers=a.long_layers)
                (folder / "DONE").write_text("")
            report["hf7b_long_file_mb"] = _mb(file_bytes(folder))
            report[f"ours_7b_{a.long_layers}_layers_record_all_{a.long_tokens}"] = run_child(
                "record", str(folder), a.long_tokens)
            if not a.keep:
                shutil.rmtree(folder, ignore_errors=True)
        if "13b" in parts:  # written one 4-layer shard at a time, never held in memory
            from synth_big import THIRTEEN_B, file_bytes, write_hf

            folder = workdir / "hf13b_bf16"
            if not (folder / "DONE").exists():
                t = time.perf_counter()
                write_hf(folder, THIRTEEN_B)
                (folder / "DONE").write_text("")
                report["hf13b_write_s"] = round(time.perf_counter() - t)
            report["hf13b_file_mb"] = _mb(file_bytes(folder))
            report["ours_13b_bf16_16_tokens"] = run_child("record", str(folder), 16)
            if not a.keep:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
