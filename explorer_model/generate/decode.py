"""The lean decode step: one new token through a LLaMA against its KV cache, when nothing observes the pass.

model.py's forward is written to be read and hooked: ~700 hook points, a module call per norm and product, Q and K
rotated separately. For one token that machinery costs about a sixth of a SmolLM2 float32 step, whose real work is
streaming 538 MB of weights through one-row products. `lean_step` runs the same computation with the same kernels
(the one-row product of kernels.py, the model's own norm modules, apply_rope, scaled_dot_product_attention), so its
logits are bit-identical to the unhooked forward's (tests/test_decode.py), with fewer calls. Q and K are rotated
in one call (RoPE is elementwise per position and pair).

`pack_for_decode` (for a process that owns its memory: the CLI's generate, the decode bench; never the app, whose
processes share the memory-mapped weights) copies every weight into one anonymous mapping, each parameter becoming
a view of it, with the rows of q_proj, k_proj and v_proj one after the other, gate_proj and up_proj likewise, so
each group is one product. A one-row product's output element depends only on its weight row and x (checked in
tests/test_decode.py, 1 and 2 threads), so stacking rows changes no bit. The file mapping is then released.
With `huge_pages` the mapping is advised for 2 MB pages: fewer TLB misses while streaming. Measured on SmolLM2,
1 thread, this 2-core machine: a step 30 ms unpacked, 27 ms packed, 25 ms on huge pages; the copy costs 0.2 s,
with huge pages 0.5-1.2 s (the kernel compacts memory to find them). `packing_for` picks what pays off.
The weights lie in the order a step reads them.

`generate` prefers native_step.py's compiled step (one C call per token, the same tokens, sums in another order);
the lean step is its exact fallback where no C compiler is at hand. Either applies only when no hook function is
attached at all (the recorder, interventions and progress bars take the hooked forward, unchanged), to a float32
pre-norm SwiGLU model, a cache without prefix stability, not training.
"""
from __future__ import annotations

import mmap
import threading

import torch
import torch.nn.functional as F
from torch import nn

from ..memory import available_bytes as available_memory  # MemAvailable, or the cgroup limit if lower
from ..model import KVCache, LlamaModel
from ..rope import apply_rope
from ..kernels import ONE_ROW

_GATHERING = threading.Lock()
_ALIGN = 16  # floats: each packed tensor starts on a 64-byte boundary, as torch's own allocations do


def lean_applies(model: LlamaModel, cache: KVCache, n_tokens: int) -> bool:
    cfg = model.cfg
    training = torch.is_grad_enabled() and model.embed.weight.requires_grad  # as model.py decides
    return (n_tokens == 1 and ONE_ROW is not None and not training
            and cfg.norm_placement == "pre" and cfg.ffn_type == "swiglu" and model.dtype == torch.float32
            and not any(hp.fns for hp in model.hook_dict.values()))  # any thread's: hooks are rare, stay exact


def _groups(model: LlamaModel) -> list[list[str]]:
    """Parameter names in packing order: the order a step reads them (the stacked groups where their first member
    stands, the embedding, which the tied output product reads last, at the end), so that one step streams the
    mapping from start to end and the hardware prefetcher never has to find a new stream."""
    names, starts, grouped = dict(model.named_parameters()), {}, set()
    for i in range(len(model.blocks)):
        for module, linears in ((f"blocks.{i}.attn", ("q_proj", "k_proj", "v_proj")),
                                (f"blocks.{i}.mlp", ("gate_proj", "up_proj"))):
            for kind in ("weight", "bias"):
                group = [f"{module}.{n}.{kind}" for n in linears]
                if all(g in names for g in group):
                    starts[group[0]] = group
                    grouped.update(group)
    order = [n for n in names if n != "embed.weight"] + ["embed.weight"]  # a tied matrix is listed once
    return [starts[n] if n in starts else [n] for n in order if n in starts or n not in grouped]


def packing_for(max_new_tokens: int, compiled: bool = False) -> str:
    """'huge', 'small' or 'none': the packing whose copy the steps' savings repay (measured above, worst case).
    The compiled step (native_step.py) gains nothing from small pages (bench_decode.py --new 128: 50.5 tokens/s
    packed, 51.2 not) and ~3 ms per step from huge pages."""
    if compiled:
        return "huge" if max_new_tokens >= 512 else "none"
    return "huge" if max_new_tokens >= 512 else "small" if max_new_tokens >= 96 else "none"


def pack_for_decode(model: LlamaModel, huge_pages: bool = True) -> LlamaModel:
    """Move every float32 parameter into one huge-page-advised mapping (see above); values and shapes unchanged.

    Only when twice the weights fit in available memory: the copy is anonymous memory, the file mapping was not."""
    if model.dtype != torch.float32 or any(p.requires_grad for p in model.parameters()):
        return model  # the lean step runs float32 only; a model in training keeps its tensors
    params = dict(model.named_parameters())
    plan, size = [], 0
    for group in _groups(model):
        size = -(-size // _ALIGN) * _ALIGN
        for name in group:
            plan.append((name, size))
            size += params[name].numel()
    free = available_memory()
    if free is None or 2 * size * 4 > free:
        return model  # the copy must fit with room to spare: a big model stays memory-mapped and pageable
    memory = mmap.mmap(-1, max(size, 1) * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE)
    flat = torch.frombuffer(memory, dtype=torch.float32)  # keeps the mapping alive as long as a view lives
    with torch.no_grad():
        for name, offset in plan:
            p = params[name]
            view = flat[offset:offset + p.numel()].view(p.shape)
            view.copy_(p)
            module, attr = name.rsplit(".", 1)
            setattr(model.get_submodule(module), attr, nn.Parameter(view, requires_grad=False))
    model.tie_weights()  # the tied output matrix is the embedding's new view
    return model


def _stacked(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The tensors as one, when they lie one after the other in memory (pack_for_decode); else None."""
    first = tensors[0]
    if first is None or any(t is None or not t.is_contiguous() for t in tensors):
        return None
    end = first.data_ptr()
    for t in tensors:
        if t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or t.data_ptr() != end:
            return None
        end += t.numel() * t.element_size()
    rows = sum(t.shape[0] for t in tensors)
    return first.as_strided((rows, *first.shape[1:]), first.stride())


def _params(block) -> list[tuple[nn.Module, torch.Tensor, torch.Tensor | None]]:
    attn, mlp = block.attn, block.mlp
    linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    return [(lin, lin.weight, lin.bias) for lin in linears]


class _Layer:
    """One block's products: [weight, bias] pairs for QKV (one, or three when the rows are not stacked),
    O, gate-up (one or two) and down, gathered once per model."""

    def __init__(self, block):
        attn, mlp = block.attn, block.mlp
        self.ln1, self.ln2, self.layer = block.ln1, block.ln2, attn.layer
        self.n_q, self.n_kv, self.d_head = attn.n_heads, attn.n_kv_heads, attn.d_head
        self.d_ff = mlp.down_proj.weight.shape[1]
        self.qkv = self._products([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up = self._products([mlp.gate_proj, mlp.up_proj])
        self.o, self.down = (attn.o_proj.weight, attn.o_proj.bias), (mlp.down_proj.weight, mlp.down_proj.bias)
        self.params = _params(block)

    @staticmethod
    def _products(linears) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        weight = _stacked([lin.weight for lin in linears])
        biases = [lin.bias for lin in linears]
        bias = None if biases[0] is None else _stacked(biases)
        if weight is not None and (bias is not None or biases[0] is None):
            return [(weight, bias)]
        return [(lin.weight, lin.bias) for lin in linears]

    def current(self) -> bool:
        """Whether the block still holds these tensors (load_weights or pack_for_decode may have replaced them).
        Read from the modules' parameter dicts: nn.Module attribute lookup would cost ~0.4 ms per step."""
        return all(lin._parameters["weight"] is w and lin._parameters["bias"] is b for lin, w, b in self.params)


def _layers(model: LlamaModel) -> list[_Layer]:
    layers = getattr(model, "_lean_layers", None)
    if layers is None or not all(layer.current() for layer in layers):
        with _GATHERING:
            layers = model._lean_layers = [_Layer(b) for b in model.blocks]
    return layers


def _product(x: torch.Tensor, products: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor:
    if len(products) == 1:
        return ONE_ROW(x, *products[0], "none", [], "")
    return torch.cat([ONE_ROW(x, w, b, "none", [], "") for w, b in products], dim=1)


def lean_step(model: LlamaModel, token: int, cache: KVCache) -> torch.Tensor:
    """Logits [vocab] of `token` at position cache.length, appending its keys and values to the cache.

    The caller checks `lean_applies` first. Every operation below is the one model.py's unhooked forward runs
    for a single position, in the same order, so the logits are the same bits.
    """
    op, pos = ONE_ROW, cache.length
    cos, sin = model.rope_table(pos, pos + 1)  # [1, d_head / 2]
    x = model.embed.weight[token:token + 1]  # [1, d_model]
    for layer in _layers(model):
        n_q, n_kv, d = layer.n_q, layer.n_kv, layer.d_head
        qkv = _product(layer.ln1.forward(x), layer.qkv)  # [1, (n_q + 2 n_kv) d]
        rot = apply_rope(qkv[:, :(n_q + n_kv) * d].view(1, 1, n_q + n_kv, d), cos, sin)  # Q and K heads at once
        k, v = cache.extend(layer.layer, rot[:, :, n_q:], qkv[:, (n_q + n_kv) * d:].view(1, 1, n_kv, d))
        z = F.scaled_dot_product_attention(rot[:, :, :n_q].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           enable_gqa=True)  # [1, n_q, 1, d]
        h = x + op(z.reshape(1, n_q * d), *layer.o, "none", [], "")
        gate_up = _product(layer.ln2.forward(h), layer.gate_up)  # [1, 2 d_ff]
        post = F.silu(gate_up[:, :layer.d_ff]) * gate_up[:, layer.d_ff:]
        x = h + op(post, *layer.down, "none", [], "")
    x = model.ln_final.forward(x)
    return op(x, model.unembed.weight, None, "none", [], "")[0]
