"""The lean decode step: one new token through a LLaMA against its KV cache, when nothing observes the pass.

model.py's forward is written to be read and hooked: ~700 hook points, a module call per norm and product, Q and K
rotated separately. For one token that machinery costs about a third of a SmolLM2 float32 step, whose real work is
streaming 538 MB of weights through one-row products. `lean_step` runs the same computation with the same kernels
(the one-row product of stable.py, the model's own norm modules, apply_rope, scaled_dot_product_attention), so its
logits are bit-identical to the unhooked forward's (tests/test_decode.py), with fewer calls:

- Q, K and V come from one product with the rows of q_proj, k_proj and v_proj stacked, gate and up likewise. A
  one-row product's output element depends only on its weight row and x (checked there, 1 and 2 threads), so
  stacking rows changes no bit. The stacked matrix is the only copy: `fuse_rows` makes each projection's weight a
  view of its rows, so the hooked and prefix-stable paths read the same memory with their original shapes.
- Q and K are rotated in one call (RoPE is elementwise per position and pair).

It applies only when no hook function is attached at all (the recorder, interventions and progress bars take the
hooked forward, unchanged), to a float32 pre-norm SwiGLU model, a cache without prefix stability, not training.
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from .model import KVCache, LlamaModel
from .rope import apply_rope
from .stable import _ONE_ROW

_FUSING = threading.Lock()


def lean_applies(model: LlamaModel, cache: KVCache, n_tokens: int) -> bool:
    cfg = model.cfg
    training = torch.is_grad_enabled() and model.embed.weight.requires_grad  # as model.py decides
    return (n_tokens == 1 and _ONE_ROW is not None and not cache.stable and not training
            and cfg.norm_placement == "pre" and cfg.ffn_type == "swiglu" and model.dtype == torch.float32
            and not any(hp.fns for hp in model.hook_dict.values()))  # any thread's: hooks are rare, stay exact


def fuse_rows(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One matrix holding the rows of `linears` in order (and their biases); each weight becomes a view of its rows,
    so the weights take no more memory than before (the separate tensors are freed)."""
    ws = [lin.weight for lin in linears]
    fused = torch.cat([w.detach() for w in ws])
    row = 0
    for lin, w in zip(linears, ws):  # values unchanged: every other path reads the same numbers, original shapes
        lin.weight = nn.Parameter(fused[row:row + w.shape[0]], requires_grad=w.requires_grad)
        row += w.shape[0]
    biases = [lin.bias for lin in linears]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    return fused, bias


def _params(block) -> list[torch.Tensor]:
    attn, mlp = block.attn, block.mlp
    return [lin.weight for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                   mlp.gate_proj, mlp.up_proj, mlp.down_proj)]


class _Layer:
    """One block's stacked matrices and its modules, gathered once per model."""

    def __init__(self, block):
        attn, mlp = block.attn, block.mlp
        self.ln1, self.ln2, self.layer = block.ln1, block.ln2, attn.layer
        self.qkv, self.qkv_bias = fuse_rows([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up, self.gate_up_bias = fuse_rows([mlp.gate_proj, mlp.up_proj])
        self.o, self.o_bias = attn.o_proj.weight, attn.o_proj.bias
        self.down, self.down_bias = mlp.down_proj.weight, mlp.down_proj.bias
        self.n_q, self.n_kv = attn.n_heads, attn.n_kv_heads
        self.d_head, self.d_ff = attn.d_head, mlp.down_proj.weight.shape[1]
        self.params = _params(block)

    def current(self, block) -> bool:
        """Whether the block still holds these weights (load_weights may have replaced them since)."""
        return all(a is b for a, b in zip(self.params, _params(block)))


def _layers(model: LlamaModel) -> list[_Layer]:
    layers = getattr(model, "_lean_layers", None)
    if layers is None or not all(l.current(b) for l, b in zip(layers, model.blocks)):
        with _FUSING:  # two threads' first steps must not both restack the weights
            layers = getattr(model, "_lean_layers", None)
            if layers is None or not all(l.current(b) for l, b in zip(layers, model.blocks)):
                layers = model._lean_layers = [_Layer(b) for b in model.blocks]
    return layers


def lean_step(model: LlamaModel, token: int, cache: KVCache) -> torch.Tensor:
    """Logits [vocab] of `token` at position cache.length, appending its keys and values to the cache.

    The caller checks `lean_applies` first. Every operation below is the one model.py's unhooked forward runs
    for a single position, in the same order, so the logits are the same bits.
    """
    op, pos = _ONE_ROW, cache.length
    cos, sin = model.rope_table(pos, pos + 1)  # [1, d_head / 2]
    x = model.embed.weight[token:token + 1]  # [1, d_model]
    for layer in _layers(model):
        n_q, n_kv, d = layer.n_q, layer.n_kv, layer.d_head
        qkv = op(layer.ln1.forward(x), layer.qkv, layer.qkv_bias, "none", [], "")  # [1, (n_q + 2 n_kv) d]
        rot = apply_rope(qkv[:, :(n_q + n_kv) * d].view(1, 1, n_q + n_kv, d), cos, sin)  # Q and K heads at once
        k, v = cache.extend(layer.layer, rot[:, :, n_q:], qkv[:, (n_q + n_kv) * d:].view(1, 1, n_kv, d))
        z = F.scaled_dot_product_attention(rot[:, :, :n_q].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           enable_gqa=True)  # [1, n_q, 1, d]
        h = x + op(z.reshape(1, n_q * d), layer.o, layer.o_bias, "none", [], "")
        gate_up = op(layer.ln2.forward(h), layer.gate_up, layer.gate_up_bias, "none", [], "")
        post = F.silu(gate_up[:, :layer.d_ff]) * gate_up[:, layer.d_ff:]
        x = h + op(post, layer.down, layer.down_bias, "none", [], "")
    x = model.ln_final.forward(x)
    return op(x, model.unembed.weight, None, "none", [], "")[0]
