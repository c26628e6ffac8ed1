"""The measured numbers the norm lab's prose quotes, computed here and shipped in assets/lab/lesson_numbers.json so no
sentence types them: `python -m explorer_model.lab.lesson_numbers` rebuilds the file (about a minute, one thread).

    {"unigram": {"entropy", "tokens", "vocab", "text"}: the race's training text and the loss of a model that knows
                 only token frequencies,
     "init_ratio": {"<ffn>_<init>": {variant: {"lo", "hi", "mean"}}}: last/first layer ‖∇W_down‖ over the seeds at
                 depth "depth", for the four option combinations the lab's lesson text discusses,
     "depth", "seeds", "torch_version"}
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..paths import ASSETS, shipped_json
from .probe import init_gradients
from .race import race_data
from .variants import VARIANTS, LabOptions, threads

LESSON_NUMBERS_PATH = ASSETS / "lab" / "lesson_numbers.json"
COMBOS = (("relu", "xavier"), ("swiglu", "xavier"), ("relu", "llama"), ("swiglu", "llama"))
DEPTH = 12


def combo_key(ffn: str, init: str) -> str:
    return f"{ffn}_{init}"


def compute(depth: int = DEPTH, norm: str = "layer") -> dict:
    data = race_data()
    out = {"unigram": {"entropy": round(float(data["unigram_entropy"]), 4), "tokens": int(len(data["ids"])),
                       "vocab": int(data["vocab"]), "text": "train_en"},
           "depth": depth, "seeds": LabOptions().seeds, "torch_version": torch.__version__, "init_ratio": {}}
    for ffn, init in COMBOS:
        r = init_gradients(LabOptions(ffn=ffn, init=init, norm=norm), depth, depths=(depth,), sweep_seeds=1)
        out["init_ratio"][combo_key(ffn, init)] = {
            v: {"lo": round(min(r["profile"][v]["ratio_seeds"]), 3), "hi": round(max(r["profile"][v]["ratio_seeds"]), 3),
                "mean": round(sum(r["profile"][v]["ratio_seeds"]) / len(r["profile"][v]["ratio_seeds"]), 3)}
            for v in VARIANTS}
    return out


def write(path: Path = LESSON_NUMBERS_PATH) -> dict:
    out = compute()
    tmp = Path(f"{path}.tmp{os.getpid()}")  # complete file or none
    tmp.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return out


def load(path: Path = LESSON_NUMBERS_PATH) -> dict | None:
    return shipped_json(path)


if __name__ == "__main__":
    with threads(1):  # its own process
        print(json.dumps(write(), indent=1))
