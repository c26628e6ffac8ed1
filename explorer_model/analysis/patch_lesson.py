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

from ..model import KVCache, LlamaModel
from ..interventions import absolute_position
from .measures import kl_divergence


@torch.no_grad()
def patch_layer_sweep(model: LlamaModel, ids, source_ids, hook: str = "hook_resid_post", pos: int = -1) -> dict:
    """{"kl": [layer] KL at the last position, "top": [layer] top token id after patching, "top_clean": id,
    "p_top_clean": [layer] probability the patched run gives the unchanged top token}.

    One batched run instead of one run per layer: row L of the batch is patched at layer L, the last row is the
    unchanged prompt. A patch at position p changes nothing before p in a causal model, so the positions before
    p run once and every row continues from their keys and values (a KV cache shared by the rows)."""
    ids, n_layers = list(ids), model.cfg.n_layers
    p, p_src = absolute_position(pos, len(ids)), absolute_position(pos, len(source_ids))
    names = [f"blocks.{layer}.{hook}" for layer in range(n_layers)]
    src: dict[str, torch.Tensor] = {}  # the source's values at its position, from one run
    with model.hooks([(n, lambda x, hp: src.__setitem__(hp.name, x[0, p_src].detach())) for n in names]):
        model(torch.as_tensor(list(source_ids), dtype=torch.long)[None])
    tokens = torch.as_tensor(ids, dtype=torch.long)[None]
    cache = KVCache(n_layers)
    if p:
        model(tokens[:, :p], cache)
    cache.share(n_layers + 1)

    def patch(row: int):
        def fn(x, hp):  # x: [row, position from p on, ...]; this row's position p takes the source's value
            x = x.clone()
            x[row, 0] = src[hp.name].to(x.dtype)
            return x
        return fn

    with model.hooks([(name, patch(layer)) for layer, name in enumerate(names)]):
        lp = F.log_softmax(model(tokens[:, p:].expand(n_layers + 1, -1), cache)[:, -1].double(), -1)
    clean, patched = lp[n_layers], lp[:n_layers]
    top_clean = int(clean.argmax())
    return {"kl": np.array([float(kl_divergence(clean, q)) for q in patched]),
            "top": patched.argmax(-1).numpy(), "top_clean": top_clean,
            "p_top_clean": patched[:, top_clean].exp().numpy()}


def lesson_layer(sweep: dict, min_kl: float = 0.5) -> int:
    """The earliest layer whose patch flips the top prediction and moves it by at least min_kl nats; failing that,
    the layer with the largest KL (the latest layers mostly copy the source's prediction wholesale, so the earliest
    layer that already carries the other meaning is the lesson)."""
    kl, top = sweep["kl"], sweep["top"]
    flips = [l for l in range(len(kl)) if top[l] != sweep["top_clean"] and kl[l] >= min_kl]
    return int(flips[0]) if flips else int(np.argmax(kl))
