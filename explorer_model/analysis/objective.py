"""The training objective made visible: the next-token loss at every position of the prompt.

    loss_t = −ln p(x_{t+1} | x_0 … x_t) = −ln softmax(logits_t)[x_{t+1}],   t = 0 … T−2   (nats)
    L = (1 / (T−1)) · Σ_t loss_t

L is exactly what a training step on this prompt minimises (cross-entropy with the targets shifted by one).
Every loss_t comes out of ONE forward pass, because the causal mask keeps position t from seeing x_{t+1}:
training is parallel over positions, while generation must append a token and run again (serial).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._arrays import ids_of
from .measures import next_token_logprobs, prompt_loss


@dataclass(frozen=True)
class PositionLosses:
    losses: np.ndarray  # [T−1] loss_t in nats; entry t is about predicting token t+1 from position t
    mean: float  # L, the loss a training step sees (NaN for a one-token prompt)
    targets: np.ndarray  # [T−1] int, the actual next tokens x_{t+1}
    target_prob: np.ndarray  # [T−1] p(x_{t+1} | …) = exp(−loss_t)
    predicted: np.ndarray  # [T−1] int, the model's top-1 token at position t
    target_rank: np.ndarray  # [T−1] int, 0 when the actual next token was the top-1 guess


def position_losses(rec, batch: int = 0) -> PositionLosses:
    """Per-position cross-entropy of the actual next token, from a recording's logits and token ids."""
    ids = ids_of(rec, batch)
    logits = rec.logits[batch]
    if ids.size < 2:
        empty = np.zeros(0)
        return PositionLosses(empty, float("nan"), empty.astype(np.int64), empty, empty.astype(np.int64),
                              empty.astype(np.int64))
    lp = next_token_logprobs(logits, ids).double().numpy()
    logits_np = logits[:-1].float().numpy()
    targets = ids[1:]
    target_logit = logits_np[np.arange(targets.size), targets]
    rank = (logits_np > target_logit[:, None]).sum(-1)
    return PositionLosses(losses=-lp, mean=prompt_loss(logits, ids), targets=targets, target_prob=np.exp(lp),
                          predicted=logits_np.argmax(-1).astype(np.int64), target_rank=rank.astype(np.int64))
