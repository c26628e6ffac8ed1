"""Read-only helpers for the trained twins (tiny-pre, tiny-post): what the lab view draws from their recordings
and training logs."""
from __future__ import annotations

from pathlib import Path

import torch

from ..analysis.measures import prompt_loss
from ..paths import ASSETS, shipped_json

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
    return prompt_loss(rec.logits[0], rec.token_ids[0])


def train_log(name: str, root: Path | None = None) -> dict | None:
    """assets/<name>/train_log.json as written by explorer_model.lab.train, or None if it is not there."""
    return shipped_json((root or ASSETS) / name / "train_log.json")


def log_curves(log: dict) -> dict:
    """Steps, training and held-out loss, and per-layer ‖∇W_down‖ (steps × layers) from a training log."""
    entries = log["log"]
    grads = [(e["step"], e["grad_norm_down_proj"]) for e in entries if e.get("grad_norm_down_proj")]
    return {"step": [e["step"] for e in entries],
            "train_loss": [e.get("train_loss") for e in entries],
            "heldout_loss": [e.get("heldout_loss") for e in entries],
            "grad_step": [g[0] for g in grads], "grad_down": [g[1] for g in grads]}


