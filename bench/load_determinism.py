"""The load benchmark's determinism check, made apart from the server: the same prompt recorded in several threads at
once (plain `record` calls, and through app.gateway.result_cache.ResultCache with a zero budget so each get recomputes), and
in two separate `llama-explorer record` processes; every tensor must be bit-identical. Used by bench_load.py."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def array_digest(arrays: dict) -> str:
    import numpy as np

    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def determinism(model, prompt: str, threads: int = 4) -> dict:
    """Bit-identical recordings for one prompt: across threads, through the app's cache, across processes."""
    import numpy as np
    import torch

    from app.gateway.result_cache import ResultCache
    from explorer_model.export import ABOUT
    from explorer_model.recording import record

    ids = model.tokenizer.encode(prompt, add_bos=getattr(model.tokenizer, "add_bos", False))
    recs: list = [None] * threads

    def rec_into(i: int) -> None:
        recs[i] = record(model.model, ids)

    workers = [threading.Thread(target=rec_into, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()

    cache = ResultCache(budget_bytes=0)  # keeps only the newest: alternating prompts recompute
    forward = threading.Lock()  # one forward pass at a time, as the app's gateway does
    other = tuple(ids[:-1]) or (1,)
    cached: list = []

    def through_cache() -> None:
        for _ in range(2):
            cached.append(cache.get(("recording", tuple(ids)), lambda: record(model.model, list(ids)), forward))
            cache.get(("recording", other), lambda: record(model.model, list(other)), forward)

    workers = [threading.Thread(target=through_cache) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ref = recs[0]
    distinct_cached = len({id(r) for r in cached})
    unequal = sorted({name for r in recs[1:] + cached for name in ref.names
                      if not torch.equal(r[name], ref[name])} |
                     {"logits" for r in recs[1:] + cached if not torch.equal(r.logits, ref.logits)})
    digests = {"in_process": array_digest(ref.to_numpy())}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2):
            out = Path(tmp) / f"r{i}.npz"
            subprocess.run([sys.executable, "-m", "explorer_model.cli", "record", "smollm2", "--prompt", prompt,
                            "--out", str(out)], check=True, capture_output=True, cwd=ROOT,
                           env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
            with np.load(out) as data:
                # the recorded arrays (the file's `about` names the command's model and prompt: no array)
                digests[f"process_{i}"] = array_digest({k: data[k] for k in data.files if k != ABOUT})
    return {"prompt": prompt, "tokens": len(ids), "tensors": len(ref.names) + 1, "thread_recordings": threads,
            "cache_recordings": len(cached), "cache_recomputed": distinct_cached,
            "unequal_tensors": unequal, "digests": digests,
            "identical": not unequal and len(set(digests.values())) == 1}
