"""Core benchmark: recording cost vs our plain forward vs HF transformers, recording memory, load time.

All timings are medians of interleaved repeats in one process, reported as ratios, because this machine
is shared and noisy. Usage: .venv/bin/python bench/bench_core.py [--lengths 256 1024] [--repeats 5] [--skip-hf]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from explorer_model.loaders import load  # noqa: E402
from explorer_model.recording import record  # noqa: E402
from explorer_model.rope import adjacent_to_hf  # noqa: E402
from explorer_model.runtime import keep_freed_memory  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

keep_freed_memory()  # as the app and the CLI run


def hf_twin(model):
    """The same weights in transformers' LlamaForCausalLM (eager attention), Q/K back in HF layout."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.cfg
    hf_cfg = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps,
                         rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_seq_len,
                         tie_word_embeddings=cfg.tie_embeddings, attn_implementation="eager")
    hf = LlamaForCausalLM(hf_cfg).eval()
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.ln_final.weight,
          "lm_head.weight": model.unembed.weight}
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = b.ln1.weight
        sd[p + "post_attention_layernorm.weight"] = b.ln2.weight
        sd[p + "self_attn.q_proj.weight"] = adjacent_to_hf(b.attn.q_proj.weight, cfg.n_heads)
        sd[p + "self_attn.k_proj.weight"] = adjacent_to_hf(b.attn.k_proj.weight, cfg.n_kv_heads)
        sd[p + "self_attn.v_proj.weight"] = b.attn.v_proj.weight
        sd[p + "self_attn.o_proj.weight"] = b.attn.o_proj.weight
        for n in ("gate_proj", "up_proj", "down_proj"):
            sd[p + f"mlp.{n}.weight"] = getattr(b.mlp, n).weight
    hf.load_state_dict(sd, strict=False)
    return hf


def timed(fn) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (all threads) and minor page faults of one call."""
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


def bench_length(model, hf, T: int, repeats: int) -> dict:
    torch.manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (1, T))
    runs = {
        "plain": lambda: model(ids),
        "record_all_fp32": lambda: record(model, ids),
        "record_all_fp16": lambda: record(model, ids, dtype=torch.float16),
    }
    if hf is not None:
        runs["hf_eager_attn_hidden"] = lambda: hf(ids, output_attentions=True, output_hidden_states=True)
    times = {k: [] for k in runs}
    with torch.no_grad():
        for fn in runs.values():  # warm-up
            fn()
        for _ in range(repeats):  # interleaved, so drift hits every contender alike
            for k, fn in runs.items():
                times[k].append(timed(fn))
    med = {k: statistics.median(w for w, _, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c, _ in v) for k, v in times.items()}
    faults = {k: int(statistics.median(f for _, _, f in v)) for k, v in times.items()}
    with torch.no_grad():
        rec16, rec32 = record(model, ids, dtype=torch.float16), record(model, ids)
    out = {
        "tokens": T,
        "median_seconds": {k: round(v, 4) for k, v in med.items()},
        "median_cpu_seconds": {k: round(v, 4) for k, v in cpu.items()},
        "median_page_faults": faults,
        "cpu_ratio_record_fp32_vs_plain": round(cpu["record_all_fp32"] / cpu["plain"], 3),
        "ratio_record_fp32_vs_plain": round(med["record_all_fp32"] / med["plain"], 3),
        "ratio_record_fp16_vs_plain": round(med["record_all_fp16"] / med["plain"], 3),
        "recorded_tensors": len(rec32),
        "recording_MB_fp32": round(rec32.stored_bytes() / 2**20, 1),
        "recording_MB_fp16": round(rec16.stored_bytes() / 2**20, 1),
    }
    if hf is not None:
        with torch.no_grad():
            hf_out = hf(ids, output_attentions=True, output_hidden_states=True)
        hf_tensors = (*hf_out.attentions, *hf_out.hidden_states, hf_out.logits)
        out["ratio_record_fp32_vs_hf"] = round(med["record_all_fp32"] / med["hf_eager_attn_hidden"], 3)
        out["hf_outputs_MB"] = round(sum(t.numel() * t.element_size() for t in hf_tensors) / 2**20, 1)
        out["max_abs_logit_diff_vs_hf"] = (rec32.logits - hf_out.logits).abs().max().item()
    return out


def load_times(repeats: int = 3) -> dict:
    """Fresh processes: cold (empty cache folder) and warm (cache filled by the cold run)."""
    code = ("import time; t0=time.perf_counter(); import explorer_model.loaders as L; t1=time.perf_counter(); "
            "L.load('smollm2'); t2=time.perf_counter(); print(t1-t0, t2-t1)")
    out = {"import": [], "cold": [], "warm": []}
    for _ in range(repeats):
        cache = tempfile.mkdtemp(prefix="le-cache-")
        env = dict(os.environ, LLAMA_EXPLORER_CACHE=cache)
        for kind in ("cold", "warm"):
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            imp, secs = map(float, r.stdout.strip().splitlines()[-1].split())
            out[kind].append(secs)
            out["import"].append(imp)
        shutil.rmtree(cache, ignore_errors=True)
    # "import" is Python importing torch and the package, paid by any program before its first load.
    return {k: {"median_s": round(statistics.median(v), 2), "all_s": [round(x, 2) for x in v]} for k, v in out.items()}


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="*", default=[256, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-hf", action="store_true", help="time only our plain forward and recordings")
    args = ap.parse_args()
    loaded = load("smollm2")
    model = loaded.model
    hf = None if args.skip_hf else hf_twin(model)
    report = {"threads": torch.get_num_threads(), "model": loaded.description, "lengths": []}
    for T in args.lengths:
        report["lengths"].append(bench_length(model, hf, T, args.repeats))
        print(json.dumps(report["lengths"][-1]), flush=True)
    if not args.skip_load:
        report["load_seconds"] = load_times()
        print(json.dumps(report["load_seconds"]), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
