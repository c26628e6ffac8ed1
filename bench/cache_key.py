"""What keying the GGUF weight cache by content costs: SHA-256 of the whole default GGUF against a cache-hit load
(which includes that hash), in one run. Usage: python bench/cache_key.py"""
import statistics
import time

from explorer_model.loaders import default_gguf_path, load
from explorer_model.loaders.gguf import content_digest


def best(fn, n=5):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


if __name__ == "__main__":
    path = default_gguf_path()
    load("smollm2")  # make sure the cache exists
    h = best(lambda: content_digest(path))
    l = best(lambda: load("smollm2"))
    print(f"{path.name}: {path.stat().st_size / 1e6:.0f} MB")
    print(f"sha256 of the file: best {h[0]:.3f} s, median {h[1]:.3f} s")
    print(f"cache-hit load:     best {l[0]:.3f} s, median {l[1]:.3f} s  (hash = {h[1] / l[1]:.0%} of it)")
