"""What keying the GGUF weight cache by content costs: SHA-256 of the whole default GGUF against a cache-hit load
as a fresh process makes it (which hashes the GGUF and checksums the cache), and against a load of the same files
again in the same process (which does neither: explorer_model/loaders/gguf.py's _CHECKED), in one run.
Usage: python bench/cache_key.py"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

from explorer_model.loaders import default_gguf_path, load  # noqa: E402
from explorer_model.loaders import gguf  # noqa: E402


def best(fn, n=5):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def first_load():
    gguf._CHECKED.clear()  # as a new process: nothing read and checked yet
    load("smollm2")


if __name__ == "__main__":
    print(machine_line())
    path = default_gguf_path()
    load("smollm2")  # make sure the cache exists
    h = best(lambda: gguf.file_sha256(path))
    l = best(first_load)
    again = best(lambda: load("smollm2"))
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB")
    print(f"sha256 of the file:         best {h[0]:.3f} s, median {h[1]:.3f} s")
    print(f"first cache-hit load:       best {l[0]:.3f} s, median {l[1]:.3f} s  (hash = {h[1] / l[1]:.0%} of it)")
    print(f"the same load again:        best {again[0]:.3f} s, median {again[1]:.3f} s")
