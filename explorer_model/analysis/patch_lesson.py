"""Where does activation patching visibly change a prediction? The what-if view's "bank → river" lesson, found on the
model rather than typed in.

For one target prompt and one source prompt, patch `hook` at position `pos` of every layer in turn (the value the
source prompt had there replaces the target's) and measure, at the target's last position, how far the next-token
distribution moves: KL(unchanged ‖ patched) in nats, and the top token before and after.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..model import LlamaModel
from ..interventions import Patch
from .measures import kl_divergence


@torch.no_grad()
def patch_layer_sweep(model: LlamaModel, ids, source_ids, hook: str = "hook_resid_post", pos: int = -1) -> dict:
    """{"kl": [layer] KL at the last position, "top": [layer] top token id after patching, "top_clean": id,
    "p_top_clean": [layer] probability the patched run gives the unchanged top token}. One run per layer."""
    tokens = torch.as_tensor(list(ids), dtype=torch.long)[None]
    names = [f"blocks.{layer}.{hook}" for layer in range(model.cfg.n_layers)]
    src: dict[str, torch.Tensor] = {}  # the source's values, from one run (the what-if Patch recomputes them per run)
    with model.hooks([(n, lambda x, hp: src.__setitem__(hp.name, x.detach())) for n in names]):
        model(torch.as_tensor(list(source_ids), dtype=torch.long)[None])
    clean = F.log_softmax(model(tokens)[0, -1].double(), -1)
    kl, top, p_keep = [], [], []
    top_clean = int(clean.argmax())
    for name in names:
        with model.hooks([(h, fn) for h, fn, _ in Patch(name, pos).hooks(model, src)]):  # the what-if's patch
            lp = F.log_softmax(model(tokens)[0, -1].double(), -1)
        kl.append(float(kl_divergence(clean, lp)))
        top.append(int(lp.argmax()))
        p_keep.append(float(lp[top_clean].exp()))
    return {"kl": np.array(kl), "top": np.array(top), "top_clean": top_clean, "p_top_clean": np.array(p_keep)}


def lesson_layer(sweep: dict, min_kl: float = 0.5) -> int:
    """The earliest layer whose patch flips the top prediction and moves it by at least min_kl nats; failing that,
    the layer with the largest KL (the latest layers mostly copy the source's prediction wholesale, so the earliest
    layer that already carries the other meaning is the lesson)."""
    kl, top = sweep["kl"], sweep["top"]
    flips = [l for l in range(len(kl)) if top[l] != sweep["top_clean"] and kl[l] >= min_kl]
    return int(flips[0]) if flips else int(np.argmax(kl))
