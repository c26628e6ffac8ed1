"""The training race: Pre and Post, each with and without learning-rate warmup, trained side by side on the
shipped corpus; `precompute_race_curves` ships three seeds of a small grid in assets/lab/race_curves.json
(`python -m explorer_model.lab.race` rebuilds it)."""
from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..paths import ASSETS, shipped_json
from .probe import lm_loss
from .variants import LabOptions, threads, variant_model

RACE_RUNS = (("pre", True), ("pre", False), ("post", True), ("post", False))  # (placement, warmup)
RACE_CURVES_PATH = ASSETS / "lab" / "race_curves.json"


# --------------------------------------------------------------------------- the training race
@dataclass(frozen=True)
class RaceConfig:
    """Four small LLaMA-recipe models (RMSNorm, SwiGLU, N(0, 0.02)) that differ only in norm placement
    and warmup, trained on the same English batches with Adam (β = 0.9, 0.98, as in the 2017 Transformer)."""
    depth: int = 6
    lr: float = 1e-3
    steps: int = 300
    warmup_frac: float = 0.25  # linear warmup over this share of the steps, then constant
    d_model: int = 64
    heads: int = 4
    seq: int = 64
    batch: int = 8
    seed: int = 0
    log_every: int = 10

    def options(self) -> LabOptions:
        return LabOptions(ffn="swiglu", init="llama", norm="rms", d_model=self.d_model, heads=self.heads)

    def lr_at(self, step: int, warmup: bool) -> float:
        if not warmup:
            return self.lr
        return self.lr * min(1.0, (step + 1) / max(1.0, self.warmup_frac * self.steps))


def run_key(placement: str, warmup: bool) -> str:
    return f"{placement}_{'warmup' if warmup else 'nowarmup'}"


RUN_KEYS = tuple(run_key(p, w) for p, w in RACE_RUNS)


_RACE_DATA: dict = {}


def race_data() -> dict:
    """The English training text in the twins' tokenizer, and its unigram entropy (nats per token)."""
    if not _RACE_DATA:
        from .corpus import load_corpus, unigram_entropy
        from .tiny_tokenizer import TOKENIZER_PATH
        from ..tokenizer import Tokenizer

        tok = Tokenizer.from_sentencepiece(TOKENIZER_PATH)
        ids = tok.encode(load_corpus("train", "en"))
        _RACE_DATA.update(ids=torch.tensor(ids, dtype=torch.long), vocab=tok.vocab_size,
                          unigram_entropy=unigram_entropy(ids))
    return _RACE_DATA


def race(rc: RaceConfig = RaceConfig(), time_limit: float | None = None,
         on_log: Callable[[dict], None] | None = None, data: dict | None = None) -> dict:
    """Train the four runs of RACE_RUNS in lock step, one batch for all four; log the mean training loss
    of every `log_every` steps. Stops early (all runs at the same step) once `time_limit` seconds pass.

    Returns {"config", "steps": [step at each log point], "curves": {run key: [loss or None if diverged]},
             "unigram_entropy", "seconds", "completed": bool}. `on_log` gets that dict at every log point.
    """
    data = data or race_data()
    ids = data["ids"]
    t0 = time.perf_counter()
    out = {"config": asdict(rc), "steps": [], "curves": {k: [] for k in RUN_KEYS},
           "unigram_entropy": data["unigram_entropy"], "seconds": 0.0, "completed": False}
    with _race_models(rc, data["vocab"]) as runs:
        gen = torch.Generator().manual_seed(rc.seed)
        sums = {k: 0.0 for k in RUN_KEYS}
        for step in range(rc.steps):
            starts = torch.randint(0, len(ids) - rc.seq - 1, (rc.batch,), generator=gen)
            batch = torch.stack([ids[int(s):int(s) + rc.seq + 1] for s in starts])
            for (placement, warmup), (model, opt) in runs.items():
                key = run_key(placement, warmup)
                if not math.isfinite(sums[key]):
                    continue  # diverged: stays None
                for group in opt.param_groups:
                    group["lr"] = rc.lr_at(step, warmup)
                loss = lm_loss(model, batch)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sums[key] += loss.item()
            if (step + 1) % rc.log_every == 0 or step + 1 == rc.steps:
                n = (step + 1) - (out["steps"][-1] if out["steps"] else 0)
                out["steps"].append(step + 1)
                for k in RUN_KEYS:
                    out["curves"][k].append(sums[k] / n if math.isfinite(sums[k]) else None)
                    sums[k] = sums[k] if not math.isfinite(sums[k]) else 0.0
                out["seconds"] = round(time.perf_counter() - t0, 2)
                if on_log:
                    on_log(out)
                if time_limit is not None and time.perf_counter() - t0 > time_limit:
                    break
        out["completed"] = bool(out["steps"]) and out["steps"][-1] == rc.steps
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


@contextmanager
def _race_models(rc: RaceConfig, vocab: int):
    """Pre and Post models start from the same weights (same seed; Post merely lacks the final norm)."""
    runs = {}
    for placement, warmup in RACE_RUNS:
        with variant_model(placement, rc.depth, rc.options(), rc.seed, vocab=vocab, max_seq_len=rc.seq + 1) as m:
            pass  # pre/post need no hooks, so the model outlives the context
        runs[placement, warmup] = (m, torch.optim.Adam(m.parameters(), lr=rc.lr, betas=(0.9, 0.98)))
    yield runs


# --------------------------------------------------------------------------- shipped race curves
RACE_GRID = {"depth": (6, 12), "lr": (1e-3, 3e-3), "seeds": (0, 1, 2)}


def race_grid_key(depth: int, lr: float) -> str:
    return f"depth{depth}_lr{lr:g}"


def precompute_race_curves(path: Path | None = RACE_CURVES_PATH, grid: dict = RACE_GRID, steps: int = 300,
                           progress: Callable[[str], None] | None = print) -> dict:
    """Run the race for every depth × lr × seed of `grid` (no time limit) and save the curves as JSON.

    {"config": RaceConfig defaults, "unigram_entropy", "runs": {grid key: {"steps": [...],
     "seeds": {seed: {run key: [loss, rounded to 4 decimals]}}}}}
    """
    data = race_data()
    out = {"config": asdict(RaceConfig(steps=steps)), "unigram_entropy": round(data["unigram_entropy"], 4),
           "torch_version": torch.__version__, "runs": {}}
    for depth in grid["depth"]:
        for lr in grid["lr"]:
            entry = {"steps": None, "seeds": {}}
            for seed in grid["seeds"]:
                r = race(RaceConfig(depth=depth, lr=lr, steps=steps, seed=seed), data=data)
                entry["steps"] = r["steps"]
                entry["seeds"][str(seed)] = {k: [None if x is None else round(x, 4) for x in v]
                                             for k, v in r["curves"].items()}
                if progress:
                    finals = ", ".join(f"{k} {v[-1]}" for k, v in entry["seeds"][str(seed)].items())
                    progress(f"depth {depth} lr {lr:g} seed {seed}: {finals} ({r['seconds']:.0f}s)")
            out["runs"][race_grid_key(depth, lr)] = entry
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, separators=(",", ":")) + "\n", encoding="utf-8")
    return out


PLATEAU_MARGIN = 0.15  # nats below the unigram entropy that count as off the plateau (not noise)


def escape_step(steps: list[int], losses: list[float | None], unigram: float,
                margin: float = PLATEAU_MARGIN) -> int | None:
    """First logged step whose loss is `margin` below the unigram entropy (off the plateau), or None."""
    return next((s for s, y in zip(steps, losses) if y is not None and y < unigram - margin), None)


def load_race_curves(path: Path = RACE_CURVES_PATH) -> dict | None:
    return shipped_json(path)


if __name__ == "__main__":  # rebuild assets/lab/race_curves.json
    with threads(1):  # its own process: the thread count concerns nobody else
        precompute_race_curves()


def race_lesson_numbers(curves: dict, easy: tuple[int, float] | None = None) -> dict:
    """What the lab's lesson says about the shipped runs, measured from them (`curves` as load_race_curves returns).

    easy = (depth, lr) of the mildest shipped setting (default: the smallest depth and lr); every other setting is
    "hard". Returns counts and step ranges of leaving the unigram plateau (escape_step) for Pre in every setting,
    for Post in the easy one, and how many Post runs never leave it in the hard ones."""
    grid = {key: entry for key, entry in curves["runs"].items()}
    parsed = {key: (int(key.split("_")[0][5:]), float(key.split("_lr")[1])) for key in grid}
    easy = easy or (min(d for d, _ in parsed.values()), min(lr for _, lr in parsed.values()))
    h = curves["unigram_entropy"]

    def escapes(keys, placement):
        out = []
        for key in keys:
            entry = grid[key]
            out += [escape_step(entry["steps"], seed[run], h) for seed in entry["seeds"].values()
                    for run in seed if run.startswith(placement + "_")]
        return out
    easy_keys = [k for k, v in parsed.items() if v == easy]
    hard_keys = [k for k, v in parsed.items() if v != easy]
    pre = escapes(grid, "pre")
    post_easy, post_hard = escapes(easy_keys, "post"), escapes(hard_keys, "post")
    off = [s for s in pre if s is not None]
    off_easy = [s for s in post_easy if s is not None]
    any_entry = next(iter(grid.values()))
    return {"seeds": len(any_entry["seeds"]), "steps": any_entry["steps"][-1], "unigram": h,
            "pre_off": len(off), "pre_all": len(pre), "pre_lo": min(off, default=None), "pre_hi": max(off, default=None),
            "easy_depth": easy[0], "easy_lr": easy[1], "post_easy_off": len(off_easy), "post_easy_all": len(post_easy),
            "post_easy_lo": min(off_easy, default=None), "post_easy_hi": max(off_easy, default=None),
            "hard_depth": max(d for d, _ in parsed.values()), "hard_lr": max(lr for _, lr in parsed.values()),
            "post_hard_stuck": sum(s is None for s in post_hard), "post_hard_all": len(post_hard),
            "settings": sorted(parsed.values())}
