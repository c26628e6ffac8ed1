"""The Pre-Norm / Post-Norm lab: small, fast experiments behind the app's "Pre vs Post-Norm lab" view.

Three variants of the same decoder, built from `LlamaModel` at a small width:
    pre       x + F(Norm(x))                         (LLaMA)
    post      Norm(x + F(x))                         (the 2017 Transformer)
    deepnorm  Norm(α·x + F(x)), α = (2N)^(1/4), and the FFN, V and output projections initialised
              β times smaller, β = (8N)^(-1/4)        (Wang et al. 2022, decoder-only constants)
DeepNorm is not a model flag: it is a Post-Norm model whose residual is scaled through hook points
(hook_attn_out / hook_mlp_out return F(x) + (α − 1)·x, so the norm reads α·x + F(x)).

Experiments (deterministic for a given seed and thread count). They never set torch's thread count, which
is process-wide: the app runs them in its one lab worker process (lab/worker.py), which uses one thread;
offline runs (`python -m explorer_model.lab.normlab`) use `threads(1)` around the whole job.
  - `init_gradients`: at initialization, the gradient norm of every layer's FFN output weight
    (mlp.down_proj), the residual RMS per layer, and how far the output moves after one Adam step,
    for depths 2…48 (Xiong et al. 2020, Fig. 3; Liu et al. 2020's amplification).
  - `race`: Pre and Post, each with and without learning-rate warmup, trained side by side on the
    shipped corpus; `precompute_race_curves` ships three seeds of it in assets/lab/race_curves.json.

Training data for the gradient probe are random tokens drawn with Zipf-law frequencies (like words in
text), so the probe needs neither the corpus nor a tokenizer and takes a few seconds.
"""
from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..model import LlamaModel
from ..paths import ASSETS

VARIANTS = ("pre", "post", "deepnorm")
DEPTHS = (2, 4, 6, 8, 12, 16, 24, 32, 48)  # depths one can pick for the per-layer profile
SWEEP_DEPTHS = (2, 4, 8, 12, 24, 48)  # the "against depth" curves (doubling, to fit the time budget)
RACE_RUNS = (("pre", True), ("pre", False), ("post", True), ("post", False))  # (placement, warmup)
RACE_CURVES_PATH = ASSETS / "lab" / "race_curves.json"


@contextmanager
def threads(n: int = 1) -> Iterator[None]:
    """One thread is fastest for models this small, and keeps sums in a fixed order (determinism).
    Process-wide: for offline scripts and tests only, never in a server thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- building the variants
@dataclass(frozen=True)
class LabOptions:
    ffn: str = "relu"  # "relu" | "swiglu"
    init: str = "xavier"  # "xavier" (Glorot, the 2017 Transformer) | "llama" (N(0, 0.02))
    norm: str = "layer"  # "layer" | "rms"
    d_model: int = 64
    heads: int = 4
    vocab: int = 512
    seq: int = 32
    batch: int = 4
    zipf: float = 1.3  # token frequencies ∝ 1 / rank^zipf
    seeds: int = 5  # gradient norms are averaged over this many initializations ...
    seed0: int = 0  # ... seed0, seed0 + 1, …
    probe_lr: float = 1e-3  # size of the one Adam step of the amplification probe


def lab_config(placement: str, depth: int, opts: LabOptions, vocab: int | None = None,
               max_seq_len: int = 256) -> ModelConfig:
    d = opts.d_model
    d_ff = 4 * d if opts.ffn == "relu" else 16 * math.ceil(8 * d / 3 / 16)  # same parameter count, about
    return ModelConfig(
        vocab_size=vocab or opts.vocab, d_model=d, n_layers=depth, n_heads=opts.heads, n_kv_heads=opts.heads,
        head_dim=d // opts.heads, d_ff=d_ff, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=max_seq_len,
        tie_embeddings=False, norm_placement=placement, norm_type=opts.norm, ffn_type=opts.ffn,
        name=f"lab-{placement}",
    )


def deepnorm_alpha(n_layers: int) -> float:
    return (2 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
    return (8 * n_layers) ** -0.25


_BETA_SCALED = ("attn.v_proj.weight", "attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                "mlp.down_proj.weight")


def init_weights(model: LlamaModel, init: str, seed: int, deepnorm: bool = False) -> None:
    """Xavier: Glorot-uniform matrices and unit-variance embeddings (the 2017 Transformer's embedding
    times sqrt(d)). LLaMA: N(0, 0.02) everywhere. DeepNorm shrinks V, O and the FFN by β (for Xavier as
    a Glorot gain, as in the paper). Norm gains stay 1, biases 0."""
    gen = torch.Generator().manual_seed(seed)
    beta = deepnorm_beta(model.cfg.n_layers) if deepnorm else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(0.0 if name.endswith(".bias") else 1.0)
                continue
            gain = beta if name.endswith(_BETA_SCALED) else 1.0
            if name.startswith("embed."):
                std = 1.0 if init == "xavier" else 0.02
            elif init == "xavier":
                fan_out, fan_in = p.shape
                std = gain * math.sqrt(2.0 / (fan_in + fan_out))
                # uniform on ±sqrt(3)·std has that std
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * math.sqrt(3) * std)
                continue
            else:
                std = 0.02 * gain
            p.copy_(torch.randn(p.shape, generator=gen) * std)


@contextmanager
def deepnorm_residual(model: LlamaModel, alpha: float) -> Iterator[LlamaModel]:
    """Turn a Post-Norm model into DeepNorm for the duration: Norm(x + F(x)) becomes Norm(α·x + F(x)).

    Each block's input x (hook_resid_pre) and middle h (hook_resid_mid) are remembered; the sublayer
    outputs are replaced by F + (α − 1)·input, so the sum the norm reads is α·input + F. Gradients flow
    through the added term like through the residual itself.
    """
    if model.cfg.norm_placement != "post":
        raise ValueError("DeepNorm scales a Post-Norm residual")
    seen: dict[str, torch.Tensor] = {}

    def remember(x, hp):
        seen[hp.name] = x

    def scaled(source: str):
        def fn(out, hp):
            block = hp.name.rsplit(".", 1)[0]
            return out + (alpha - 1.0) * seen[f"{block}.{source}"]
        return fn

    hooks = []
    for i in range(model.cfg.n_layers):
        b = f"blocks.{i}"
        hooks += [(f"{b}.hook_resid_pre", remember), (f"{b}.hook_resid_mid", remember),
                  (f"{b}.hook_attn_out", scaled("hook_resid_pre")), (f"{b}.hook_mlp_out", scaled("hook_resid_mid"))]
    with model.hooks(hooks):
        yield model


@contextmanager
def variant_model(variant: str, depth: int, opts: LabOptions, seed: int, vocab: int | None = None,
                  max_seq_len: int = 256) -> Iterator[LlamaModel]:
    """A freshly initialized model of one variant, in training mode, with DeepNorm's hooks if asked."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    placement = "pre" if variant == "pre" else "post"
    with torch.random.fork_rng(devices=[]):  # construction draws numbers init_weights overwrites; keep the global RNG as it was
        model = LlamaModel(lab_config(placement, depth, opts, vocab, max_seq_len))
    init_weights(model, opts.init, seed, deepnorm=variant == "deepnorm")
    model.train()
    if variant == "deepnorm":
        with deepnorm_residual(model, deepnorm_alpha(depth)):
            yield model
    else:
        yield model


# --------------------------------------------------------------------------- gradients at initialization
def zipf_tokens(vocab: int, batch: int, seq: int, exponent: float, seed: int) -> torch.Tensor:
    """[batch, seq + 1] token ids, independent draws with P(rank r) ∝ 1 / r^exponent."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    p = torch.arange(1, vocab + 1, dtype=torch.float64).pow(-exponent)
    return torch.multinomial(p / p.sum(), batch * (seq + 1), replacement=True, generator=gen).view(batch, seq + 1)


def lm_loss(model: LlamaModel, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def probe(variant: str, depth: int, opts: LabOptions, seed: int) -> dict:
    """One fresh model: loss, per-layer ‖∇W_down‖, per-layer residual RMS, and the RMS change of the
    logits after one Adam step on the blocks' weights (embeddings and unembedding held fixed)."""
    tokens = zipf_tokens(opts.vocab, opts.batch, opts.seq, opts.zipf, seed)
    with variant_model(variant, depth, opts, seed) as model:
        resid: list[torch.Tensor] = []
        keep = [(f"blocks.{i}.hook_resid_post", lambda x, hp: resid.append(x.detach())) for i in range(depth)]
        with model.hooks(keep):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        grads = [blk.mlp.down_proj.weight.grad.norm().item() for blk in model.blocks]
        # Adam's first step moves every weight by lr·g/(|g| + eps): a step of fixed size per weight.
        opt = torch.optim.Adam(model.blocks.parameters(), lr=opts.probe_lr)
        opt.step()
        with torch.no_grad():
            after = model(tokens[:, :-1])
        change = (after - logits.detach()).pow(2).mean().sqrt().item()
    return {"loss": loss.item(), "grad_down": grads,
            "resid_rms": [r.pow(2).mean().sqrt().item() for r in resid], "output_change": change}


def init_gradients(opts: LabOptions = LabOptions(), depth: int = 12, depths=SWEEP_DEPTHS, variants=VARIANTS,
                   sweep_seeds: int = 2, progress: Callable[[float, str], None] | None = None,
                   probe_fn: Callable[[str, int, LabOptions, int], dict] | None = None) -> dict:
    """The probe for every variant: at `depth` averaged over opts.seeds initializations (seed0, seed0+1, …),
    and at every depth of `depths` averaged over the first `sweep_seeds` of them (reused where they overlap).

    Returns {"options", "depth", "depths", "seeds",
             "profile": {variant: {"grad_down": per layer, "grad_down_seeds": [per seed: per layer],
                                   "resid_rms": per layer, "ratio_seeds": per seed}},
             "sweep": {variant: {"last_grad", "first_grad", "output_change", "loss": per depth}}, "seconds"}.
    Gradient norms are averaged over seeds layer by layer (the expected norm that the papers describe).
    `probe_fn` replaces `probe` (the app passes a cached one); `progress(fraction, message)` runs between probes.
    """
    probe_fn = probe_fn or probe
    t0 = time.perf_counter()
    seeds = [opts.seed0 + k for k in range(opts.seeds)]
    sweep_s = seeds[:max(1, min(sweep_seeds, len(seeds)))]
    depths = sorted(set(depths))
    jobs = [(v, depth, s) for v in variants for s in seeds]
    jobs += [(v, d, s) for d in depths for v in variants for s in sweep_s if (d, s) not in {(depth, x) for x in seeds}]
    total = sum(d for _, d, _ in jobs)  # cost is about proportional to layers
    done, runs = 0, {}
    for v, d, s in jobs:
        runs[v, d, s] = probe_fn(v, d, opts, s)
        done += d
        if progress:
            progress(done / total, f"{v} · {d} layers · seed {s}")
    profile, sweep = {}, {}
    for v in variants:
        prof = [runs[v, depth, s] for s in seeds]
        profile[v] = {"grad_down": _mean_lists([r["grad_down"] for r in prof]),
                      "grad_down_seeds": [r["grad_down"] for r in prof],
                      "ratio_seeds": [last_first_ratio(r["grad_down"]) for r in prof],
                      "resid_rms": _mean_lists([r["resid_rms"] for r in prof])}
        per = {d: [runs[v, d, s] for s in sweep_s] for d in depths}
        sweep[v] = {"last_grad": [_mean([r["grad_down"][-1] for r in per[d]]) for d in depths],
                    "first_grad": [_mean([r["grad_down"][0] for r in per[d]]) for d in depths],
                    "output_change": [_mean([r["output_change"] for r in per[d]]) for d in depths],
                    "loss": [_mean([r["loss"] for r in per[d]]) for d in depths]}
    return {"options": asdict(opts), "depth": depth, "depths": depths, "seeds": seeds, "sweep_seeds": sweep_s,
            "profile": profile, "sweep": sweep, "seconds": round(time.perf_counter() - t0, 2)}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _mean_lists(rows: list[list[float]]) -> list[float]:
    return [sum(col) / len(col) for col in zip(*rows)]


def last_first_ratio(grads: list[float]) -> float:
    """‖∇W_down‖ of the last layer over the first: > 1 means gradients grow toward the output."""
    return grads[-1] / grads[0]


def profile_ratio(result: dict, variant: str) -> float:
    return last_first_ratio(result["profile"][variant]["grad_down"])


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


# --------------------------------------------------------------------------- the twins (read-only helpers)
TWINS = ("tiny-pre", "tiny-post")



def residual_norms(rec) -> list[float]:
    """Mean over positions of ‖x‖ (L2) of the residual stream: the embedding, then after every block."""
    xs = [rec["hook_embed"]] + [rec[f"blocks.{i}.hook_resid_post"] for i in range(rec.cfg.n_layers)]
    return [x[0].float().norm(dim=-1).mean().item() for x in xs]


def norm_scales(rec, which: str) -> list[float]:
    """Mean over positions of the divisor of norm `which` ("ln1" | "ln2") in every layer."""
    return rec.stack(f"{which}.hook_scale")[:, 0, :, 0].float().mean(dim=1).tolist()


def top_predictions(rec, k: int = 5, pos: int = -1) -> tuple[list[int], list[float]]:
    """The k most likely next tokens after position `pos`, and their probabilities."""
    p = torch.softmax(rec.logits[0, pos].float(), dim=-1)
    top = torch.topk(p, k)
    return top.indices.tolist(), top.values.tolist()


def sequence_loss(rec) -> float:
    """Mean next-token cross-entropy of the recorded ids (every token after the first), nats per token."""
    ids = rec.token_ids[0]
    return F.cross_entropy(rec.logits[0, :-1].float(), ids[1:]).item()


def train_log(name: str, root: Path | None = None) -> dict | None:
    """assets/<name>/train_log.json as written by explorer_model.lab.train, or None if it is not there."""
    try:
        return json.loads(((root or ASSETS) / name / "train_log.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def log_curves(log: dict) -> dict:
    """Steps, training and held-out loss, and per-layer ‖∇W_down‖ (steps × layers) from a training log."""
    entries = log["log"]
    grads = [(e["step"], e["grad_norm_down_proj"]) for e in entries if e.get("grad_norm_down_proj")]
    return {"step": [e["step"] for e in entries],
            "train_loss": [e.get("train_loss") for e in entries],
            "heldout_loss": [e.get("heldout_loss") for e in entries],
            "grad_step": [g[0] for g in grads], "grad_down": [g[1] for g in grads]}


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


def escape_step(steps: list[int], losses: list[float | None], unigram: float, margin: float = 0.15) -> int | None:
    """First logged step whose loss is `margin` below the unigram entropy (off the plateau), or None."""
    return next((s for s, y in zip(steps, losses) if y is not None and y < unigram - margin), None)


def load_race_curves(path: Path = RACE_CURVES_PATH) -> dict | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


if __name__ == "__main__":  # python -m explorer_model.lab.normlab: rebuild assets/lab/race_curves.json
    with threads(1):  # its own process: the thread count concerns nobody else
        precompute_race_curves()
