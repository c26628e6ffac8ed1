"""Train the tiny teaching LLaMAs: Pre-Norm and Post-Norm twins on the shipped corpus.

    llama-explorer train-tiny --norm pre  --out assets/tiny-pre
    llama-explorer train-tiny --norm post --out assets/tiny-post

Both twins get the same initial weights (same seed; Post-Norm merely lacks ln_final), the same batches
in the same order and the same schedule (AdamW, linear warmup then cosine decay), so the only difference
in what they learn comes from where the norm sits. Training uses the model the explorer inspects, with
its hook points idle (identity) and attention on the fused SDPA path.

Every `log_every` steps the log gets the mean training loss, the held-out loss (fixed windows of Hamlet
and of held-out poems) and per-layer gradient norms of attn.o_proj and mlp.down_proj: the quantities
that tell the Pre-Norm / Post-Norm story. The output folder holds what loaders/native.py reads.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..config import ModelConfig
from .corpus import HELDOUT_LINE, HELDOUT_LINE_ZH, LANGS, load_corpus, unigram_cross_entropy, unigram_entropy
from ..analysis.measures import token_loss
from ..model import LlamaModel
from .tiny_tokenizer import TOKENIZER_PATH
from .variants import init_weights, threads


@dataclass(frozen=True)
class TrainConfig:
    norm: str = "pre"  # the one setting in which the twins differ
    layers: int = 6
    d_model: int = 256
    heads: int = 8
    kv_heads: int = 4  # GQA: two query heads share each KV head
    d_ff: int = 688  # LLaMA's 8/3 * d_model, rounded to a multiple of 16
    context: int = 256
    batch: int = 8  # x context = 2048 tokens a step: more updates for the ~15 minutes we have
    steps: int = 400
    lr: float = 1e-3  # peak; at 2e-3 (40 warmup steps) Post-Norm stalled at the unigram loss, Pre-Norm did not
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup: int = 80  # Post-Norm needs it; Pre-Norm gets the same for a fair comparison
    weight_decay: float = 0.1  # on matrices only, not on norm gains
    grad_clip: float = 1.0  # norms are logged before clipping
    zh_fraction: float = 0.15  # share of windows drawn from the (small) Chinese text
    seed: int = 0
    log_every: int = 20
    eval_windows_en: int = 24
    eval_windows_zh: int = 8
    threads: int = 1  # fastest for a model this small; two trainings then share two cores


def model_config(tc: TrainConfig, vocab_size: int, bos_id: int | None, eos_id: int | None) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab_size, d_model=tc.d_model, n_layers=tc.layers, n_heads=tc.heads, n_kv_heads=tc.kv_heads,
        head_dim=tc.d_model // tc.heads, d_ff=tc.d_ff, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=tc.context,
        tie_embeddings=False, bos_id=bos_id, eos_id=eos_id, norm_placement=tc.norm, name=f"tiny-{tc.norm}",
    )


# --------------------------------------------------------------------------- data
class TokenData:
    """The corpus as token ids per split and language, and the fixed held-out evaluation windows."""

    def __init__(self, tokenizer, context: int, eval_windows: dict[str, int], splits=("train", "heldout")):
        self.tokenizer, self.context = tokenizer, context
        self.ids = {(split, lang): torch.tensor(tokenizer.encode(load_corpus(split, lang)), dtype=torch.long)
                    for split in splits for lang in LANGS}
        self.eval = {lang: self._fixed_windows(self.ids["heldout", lang], n) for lang, n in eval_windows.items()}

    def _window(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[BOS] + ids[start : start+ctx-1] as input, ids[start : start+ctx] as targets: the first
        prediction is made from BOS alone, as for a prompt typed into the app."""
        chunk = ids[start:start + self.context]
        bos = torch.tensor([self.tokenizer.bos_id])
        return torch.cat([bos, chunk[:-1]]), chunk

    def _fixed_windows(self, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        last = len(ids) - self.context
        starts = [round(i * last / max(n - 1, 1)) for i in range(n)]  # evenly spread over the whole text
        xs, ys = zip(*(self._window(ids, s) for s in starts))
        return torch.stack(xs), torch.stack(ys)

    def batch(self, gen: torch.Generator, size: int, zh_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for _ in range(size):
            lang = "zh" if torch.rand((), generator=gen).item() < zh_fraction else "en"
            ids = self.ids["train", lang]
            start = int(torch.randint(len(ids) - self.context + 1, (), generator=gen))
            x, y = self._window(ids, start)
            xs.append(x)
            ys.append(y)
        return torch.stack(xs), torch.stack(ys)


def lm_loss(model: LlamaModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return token_loss(model(x), y)


@torch.no_grad()
def heldout_loss(model: LlamaModel, data: TokenData, chunk: int = 8) -> dict[str, float]:
    """Mean loss on the fixed held-out windows: per language and over all windows (equal weights)."""
    out, total, n = {}, 0.0, 0
    for lang, (xs, ys) in data.eval.items():
        s = sum(lm_loss(model, xs[i:i + chunk], ys[i:i + chunk]).item() * len(xs[i:i + chunk])
                for i in range(0, len(xs), chunk))
        out[f"heldout_loss_{lang}"] = s / len(xs)
        total, n = total + s, n + len(xs)
    out["heldout_loss"] = total / n
    return out


@torch.no_grad()
def line_loss(model: LlamaModel, tokenizer, text: str) -> float:
    """Mean loss of the tokens of one line after BOS: what the app's held-out-line comparison shows."""
    ids = tokenizer.encode(text, add_bos=True)
    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    return lm_loss(model, x, y).item()


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup to tc.lr, then cosine down to tc.lr * min_lr_ratio at the last step."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    t = (step - tc.warmup) / max(tc.steps - tc.warmup, 1)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def _grad_norms(model: LlamaModel) -> dict[str, list[float]]:
    return {kind: [blk.get_submodule(path).weight.grad.norm().item() for blk in model.blocks]
            for kind, path in (("o_proj", "attn.o_proj"), ("down_proj", "mlp.down_proj"))}


# --------------------------------------------------------------------------- training
def train_tiny(tc: TrainConfig, out: Path | None, tokenizer_path: Path = TOKENIZER_PATH,
               progress: Callable[[str], None] | None = print) -> dict:
    """Train one twin; writes the model folder to `out` (unless None) and returns the training log."""
    from ..tokenizer import Tokenizer

    t_start, cpu_start = time.perf_counter(), time.process_time()
    with threads(tc.threads):  # an offline script (python -m explorer_model.lab.train), never the server
        tokenizer = Tokenizer.from_sentencepiece(tokenizer_path)
        data = TokenData(tokenizer, tc.context, {"en": tc.eval_windows_en, "zh": tc.eval_windows_zh})
        cfg = model_config(tc, tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id)
        torch.manual_seed(tc.seed)
        model = LlamaModel(cfg)
        # GPT-2/LLaMA-style: N(0, 0.02), the residual outputs shrunk by 1/sqrt(2 * layers)
        init_weights(model, "llama", tc.seed, gain=1 / math.sqrt(2 * cfg.n_layers),
                     scaled=("o_proj.weight", "down_proj.weight"))
        model.train()

        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.95), eps=1e-8)
        gen = torch.Generator().manual_seed(tc.seed)  # batches: identical for both twins

        train_ids = torch.cat([data.ids["train", lang] for lang in LANGS]).tolist()
        heldout_ids = torch.cat([data.eval[lang][1].reshape(-1) for lang in LANGS]).tolist()
        log = {
            "model_config": cfg.to_dict(),
            "train_config": asdict(tc),
            "tokenizer_sha256": hashlib.sha256(Path(tokenizer_path).read_bytes()).hexdigest(),
            "tokens": {f"{s}_{lang}": len(data.ids[s, lang]) for s, lang in data.ids},
            # "learned nothing but token frequencies": its loss on the training text, and on the held-out windows
            "unigram_entropy_train": unigram_entropy(train_ids),
            "unigram_cross_entropy_heldout": unigram_cross_entropy(train_ids, heldout_ids, cfg.vocab_size),
            "torch_version": torch.__version__,
            "log": [],
        }

        def record(step: int, losses: list[float], norms: list[dict], seconds: float) -> None:
            model.eval()
            entry = {"step": step, "lr": lr_at(min(step, tc.steps - 1), tc),
                     "train_loss": sum(losses) / len(losses) if losses else None, **heldout_loss(model, data)}
            model.train()
            if norms:
                entry["grad_norm"] = sum(n["total"] for n in norms) / len(norms)
                for kind in ("o_proj", "down_proj"):  # mean over the steps since the last entry
                    entry[f"grad_norm_{kind}"] = [sum(n[kind][i] for n in norms) / len(norms) for i in range(cfg.n_layers)]
            entry["elapsed_s"] = round(seconds, 1)
            log["log"].append(entry)
            if progress:
                tl = "   -  " if entry["train_loss"] is None else f"{entry['train_loss']:.3f}"
                progress(f"[{tc.norm}] step {step:>5}/{tc.steps}  train {tl}  held-out {entry['heldout_loss']:.3f} "
                         f"(en {entry['heldout_loss_en']:.3f}, zh {entry['heldout_loss_zh']:.3f})  {seconds:.0f}s")

        record(0, [], [], time.perf_counter() - t_start)
        losses, norms = [], []
        t_train = time.perf_counter()
        for step in range(tc.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, tc)
            x, y = data.batch(gen, tc.batch, tc.zh_fraction)
            loss = lm_loss(model, x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            n = _grad_norms(model)
            n["total"] = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip).item()
            opt.step()
            losses.append(loss.item())
            norms.append(n)
            if not math.isfinite(losses[-1]):
                raise FloatingPointError(f"[{tc.norm}] loss is {losses[-1]} at step {step}")
            if (step + 1) % tc.log_every == 0 or step + 1 == tc.steps:
                record(step + 1, losses, norms, time.perf_counter() - t_start)
                log["tokens_per_s"] = round((step + 1) * tc.batch * tc.context / (time.perf_counter() - t_train))
                losses, norms = [], []

        model.eval().requires_grad_(False)
        # The shipped weights are float16: score those, so the loader reproduces these numbers exactly.
        state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
        shipped = LlamaModel.from_weights(cfg, state)
        last = log["log"][-1]
        log["final"] = {
            "step": tc.steps, "train_loss": last["train_loss"], "weights_dtype": "float16",
            **heldout_loss(shipped, data),
            "heldout_line": HELDOUT_LINE, "heldout_line_loss": line_loss(shipped, tokenizer, HELDOUT_LINE),
            "heldout_line_zh": HELDOUT_LINE_ZH, "heldout_line_zh_loss": line_loss(shipped, tokenizer, HELDOUT_LINE_ZH),
        }
        log["seconds"] = round(time.perf_counter() - t_start, 1)
        log["cpu_seconds"] = round(time.process_time() - cpu_start, 1)  # wall time depends on who else runs
    if out is not None:
        save_model(Path(out), cfg, state, tokenizer_path, log)
    return log


def save_model(out: Path, cfg: ModelConfig, state: dict[str, torch.Tensor], tokenizer_path: Path, log: dict) -> None:
    """The folder loaders/native.py reads: weights, config, tokenizer, and the training log."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt", "name": cfg.name})
    (out / "explorer_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n", encoding="utf-8")
    if Path(tokenizer_path).resolve() != (out / "tokenizer.model").resolve():
        shutil.copyfile(tokenizer_path, out / "tokenizer.model")
    (out / "train_log.json").write_text(json.dumps(log, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
