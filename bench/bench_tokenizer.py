"""Tokenizer speed: rebuilding SmolLM2's vocabulary from GGUF metadata, and encoding through our front end
against the `tokenizers` object it wraps (the peer), in one run.

    python bench/bench_tokenizer.py [--repeats 5]
"""
from __future__ import annotations

import argparse

from cache_key import best  # bench/ is on sys.path when a bench runs as a script
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402


def main() -> None:
    print(machine_line(), file=sys.stderr, flush=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import gguf

    from explorer_model.loaders import default_gguf_path
    from explorer_model.tokenizer import Tokenizer, read_gguf_tokenizer_fields

    fields = read_gguf_tokenizer_fields(gguf.GGUFReader(str(default_gguf_path())))
    rebuild = best(lambda: Tokenizer.from_gguf_fields(fields), args.repeats)
    tok = Tokenizer.from_gguf_fields(fields)
    text = "The llama (Lama glama) is a domesticated South American camelid, 深度学习 🦙 2024.\n" * 40
    n = len(tok.encode(text))
    ours = best(lambda: tok.encode(text), args.repeats * 4)
    peer = best(lambda: tok._hf.encode(text, add_special_tokens=False), args.repeats * 4)
    print(f"GGUF vocabulary rebuild (49,152 tokens): best {rebuild[0]:.3f} s, median {rebuild[1]:.3f} s")
    print(f"encode {n} tokens: ours {ours[0] * 1e3:.1f} ms, tokenizers {peer[0] * 1e3:.1f} ms "
          f"(best of {args.repeats * 4}); ours / tokenizers = {ours[0] / peer[0]:.2f}")


if __name__ == "__main__":
    main()
