"""A decoder-only LLaMA in plain PyTorch, with a named hook point on every intermediate tensor.

    tokens [batch, pos] -> embed -> N x Block -> final norm -> unembed -> logits [batch, pos, vocab]

One Pre-Norm block (LLaMA):
    h = x + Attn(Norm(x))                      Attn: RoPE on Q and K (never V), causal mask, GQA
    y = h + W_down(SiLU(W_gate n) * W_up n),   n = Norm(h)
The Post-Norm variant (original Transformer) computes h = Norm(x + Attn(x)), y = Norm(h + FFN(h)) and
has no final norm, since every block output is already normalized.

RoPE rotates adjacent pairs (see rope.py). Hook names and meanings follow TransformerLens; docs/hooks.md lists them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .hooks import HookedModule, HookPoint
from .rope import apply_rope, cos_sin, model_inverse_frequencies
from .kernels import linear


# --------------------------------------------------------------------------- norms
class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))  # gamma
        self.hook_scale = HookPoint()  # [batch, pos, 1] the RMS divisor sqrt(mean(x^2) + eps)
        self.hook_normalized = HookPoint()  # [batch, pos, d_model] x / scale, before gamma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in float32 whatever the weights are (no-ops for a float32 model); the output keeps x's dtype.
        x32 = x.float()
        scale = self.hook_scale((x32.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return (self.hook_normalized(x32 / scale) * self.weight).to(x.dtype)


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.hook_scale = HookPoint()  # [batch, pos, 1] the std divisor sqrt(var(x) + eps)
        self.hook_normalized = HookPoint()  # [batch, pos, d_model] (x - mean) / scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # as RMSNorm: float32 statistics, output in x's dtype
        centred = x32 - x32.mean(-1, keepdim=True)
        scale = self.hook_scale((centred.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return (self.hook_normalized(centred / scale) * self.weight + self.bias).to(x.dtype)


def make_norm(cfg: ModelConfig) -> nn.Module:
    return (RMSNorm if cfg.norm_type == "rms" else LayerNorm)(cfg.d_model, cfg.norm_eps)


# --------------------------------------------------------------------------- attention
def causal_scores(rot_q: torch.Tensor, rot_k: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
    """Scaled, masked scores QK^T / sqrt(d_head): [batch, head, q_pos, k_pos], -inf where k_pos > q_pos.

    rot_q is [batch, q_pos, head, d_head]; rot_k is [batch, k_pos, kv_head, d_head]. Query head h reads
    KV head h // n_rep (repeat_interleave), as in every GQA checkpoint. The recorder rebuilds scores
    with this same function, so recorded and computed values are identical.
    """
    n_rep = rot_q.shape[2] // rot_k.shape[2]
    k = rot_k.repeat_interleave(n_rep, dim=2).transpose(1, 2)  # [batch, head, k_pos, d_head]
    return _masked_scores(rot_q.transpose(1, 2), k, q_offset)


def _masked_scores(q: torch.Tensor, k: torch.Tensor, q_offset: int) -> torch.Tensor:
    """q [batch, head, q_pos, d_head], k [batch, head, k_pos, d_head] -> scaled scores, -inf in the future."""
    # Scores in float32 even for 16-bit weights (no-op for float32), so the softmax sees full-precision logits.
    q, k = q.float(), k.float()
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    return scores.masked_fill(future_mask(scores.shape[-2], scores.shape[-1], q_offset, scores.device), float("-inf"))


def future_mask(n_q: int, n_k: int, q_offset: int, device=None) -> torch.Tensor:
    """The causal mask, True where a key lies after its query: [n_q, n_k], queries at positions q_offset.."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).triu(1 + q_offset)


def attention_pattern(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys in float32; masked cells become exact zeros."""
    return torch.softmax(scores.float(), dim=-1)


def fused_attention(rot_q: torch.Tensor, rot_k: torch.Tensor, v: torch.Tensor, q_offset: int = 0) -> torch.Tensor:
    """z = softmax(QK^T / sqrt(d_head) + mask) V through torch's fused kernel, which never holds the weights.

    rot_q [batch, q_pos, head, d_head] holds positions q_offset..; rot_k, v [batch, k_pos, kv_head, d_head] from 0.
    Returns z [batch, q_pos, head, d_head]. The same mask as causal_scores: a query after a KV cache sees every
    cached key and the new ones up to itself.
    """
    n_q, n_k = rot_q.shape[1], rot_k.shape[1]
    mask = None if n_q == 1 or q_offset == 0 else ~future_mask(n_q, n_k, q_offset)
    return F.scaled_dot_product_attention(
        rot_q.transpose(1, 2), rot_k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        is_causal=q_offset == 0 and n_q > 1, enable_gqa=True,
    ).transpose(1, 2)


class KVCache:
    """Rotated keys and values of the positions seen so far, per layer: [batch, pos, kv_head, d_head].

    Buffers grow by doubling and a step writes into them, instead of copying the whole cache every step.
    """

    def __init__(self, n_layers: int):
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.lengths = [0] * n_layers

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n0 = self.lengths[layer]
        n1 = n0 + k.shape[1]
        self.reserve(layer, n1, k, v)
        self.k[layer][:, n0:n1], self.v[layer][:, n0:n1] = k, v
        self.lengths[layer] = n1
        return self.k[layer][:, :n1], self.v[layer][:, :n1]

    def reserve(self, layer: int, n1: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Make room for n1 positions in the layer's buffers, shaped and typed like k and v (positions aside)."""
        if self.k[layer] is None or self.k[layer].shape[1] < n1:
            n0 = self.lengths[layer]
            cap = max(n1, 2 * n0, 64)
            grown = [t.new_empty(t.shape[0], cap, *t.shape[2:]) for t in (k, v)]
            if n0:
                grown[0][:, :n0], grown[1][:, :n0] = self.k[layer][:, :n0], self.v[layer][:, :n0]
            self.k[layer], self.v[layer] = grown

    def share(self, rows: int) -> None:
        """The positions cached so far (one sequence) become the common start of `rows` sequences, each of which
        the next forward continues: a batch of variants of one prompt that differ only from here on."""
        for layer, n0 in enumerate(self.lengths):
            if n0:
                self.k[layer], self.v[layer] = (t[:, :n0].repeat(rows, 1, 1, 1) for t in (self.k[layer], self.v[layer]))

    def layer_length(self, layer: int) -> int:
        return self.lengths[layer]

    @property
    def length(self) -> int:
        """Positions cached so far (layer 0 is extended first, so read it only between forwards)."""
        return self.layer_length(0)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv_heads, self.d_head = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=bias)
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_rot_k = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, q_pos, k_pos] scaled and masked (-inf)
        self.hook_pattern = HookPoint()  # [batch, head, q_pos, k_pos] softmax, zeros above the diagonal
        self.hook_z = HookPoint()  # [batch, pos, head, d_head] pattern @ V

    def forward(self, x, cos, sin, cache: KVCache | None = None) -> torch.Tensor:
        batch, n_pos, _ = x.shape
        q = self.hook_q(linear(self.q_proj, x).view(batch, n_pos, self.n_heads, self.d_head))
        k = self.hook_k(linear(self.k_proj, x).view(batch, n_pos, self.n_kv_heads, self.d_head))
        v = self.hook_v(linear(self.v_proj, x).view(batch, n_pos, self.n_kv_heads, self.d_head))
        rot_q = self.hook_rot_q(apply_rope(q, cos, sin))
        rot_k = self.hook_rot_k(apply_rope(k, cos, sin))
        q_offset = 0
        if cache is not None:
            q_offset = cache.layer_length(self.layer)
            rot_k, v = cache.extend(self.layer, rot_k, v)

        if self.hook_attn_scores.active or self.hook_pattern.active:
            # The weights are observed (recorded or changed), so they exist: the equation written out.
            pattern = self.hook_pattern(attention_pattern(self.hook_attn_scores(causal_scores(rot_q, rot_k, q_offset))))
            v_rep = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=2).transpose(1, 2)
            z = torch.matmul(pattern.to(v.dtype), v_rep).transpose(1, 2)  # [batch, pos, head, d_head]
        else:
            # Nothing asks for the weights, so they need not exist in memory (a recording rebuilds them on
            # access from the rotated Q and K, with causal_scores: recording.py).
            z = fused_attention(rot_q, rot_k, v, q_offset)
        z = self.hook_z(z)
        return linear(self.o_proj, z.reshape(batch, n_pos, self.n_heads * self.d_head))


# --------------------------------------------------------------------------- feed-forward
class MLP(nn.Module):
    """SwiGLU: W_down(SiLU(W_gate x) * W_up x); or the classic ReLU FFN W_down(ReLU(W_up x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gated = cfg.ffn_type == "swiglu"
        bias = cfg.mlp_bias
        if self.gated:
            self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=bias)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=bias)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=bias)
        self.hook_pre = HookPoint()  # [batch, pos, d_ff] W_gate x (ReLU FFN: W_up x)
        self.hook_act = HookPoint()  # [batch, pos, d_ff] SiLU(W_gate x) (ReLU FFN: ReLU(W_up x))
        if self.gated:
            self.hook_pre_linear = HookPoint()  # [batch, pos, d_ff] W_up x
        self.hook_post = HookPoint()  # [batch, pos, d_ff] SiLU(gate) * up, the input of W_down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            act = self.hook_act(F.silu(self.hook_pre(linear(self.gate_proj, x))))
            post = self.hook_post(act * self.hook_pre_linear(linear(self.up_proj, x)))
        else:
            post = self.hook_post(self.hook_act(F.relu(self.hook_pre(linear(self.up_proj, x)))))
        return linear(self.down_proj, post)


# --------------------------------------------------------------------------- block and model
class Unembed(nn.Linear):
    """The output matrix; logits come out in float32 whatever the weights' dtype.

    A 16-bit model multiplies in its own dtype (oneDNN accumulates in float32, the product is rounded to the
    weights' dtype, as in HF transformers) and the logits are widened afterwards: widening the vocab x d_model
    matrix on every pass would cost more than the whole product.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self, x.to(self.weight.dtype)).float()


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        # Registration order is forward order, so hook_names() reads like the computation.
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.ln1, self.attn = make_norm(cfg), Attention(cfg, layer)
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.ln2, self.mlp = make_norm(cfg), MLP(cfg)
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x, cos, sin, cache: KVCache | None = None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        if self.pre_norm:
            attn_out = self.hook_attn_out(self.attn(self.ln1(x), cos, sin, cache))
            h = self.hook_resid_mid(x + attn_out)
            mlp_out = self.hook_mlp_out(self.mlp(self.ln2(h)))
            return self.hook_resid_post(h + mlp_out)
        attn_out = self.hook_attn_out(self.attn(x, cos, sin, cache))
        h = self.hook_resid_mid(self.ln1(x + attn_out))
        mlp_out = self.hook_mlp_out(self.mlp(h))
        return self.hook_resid_post(self.ln2(h + mlp_out))


class LlamaModel(HookedModule):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, _weight=torch.empty(cfg.vocab_size, cfg.d_model))
        if not self.embed.weight.is_meta:  # on meta, normal_ imports torch._dynamo (~1 s) for an init load_weights replaces
            nn.init.normal_(self.embed.weight)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.ln_final = make_norm(cfg) if cfg.norm_placement == "pre" else None
        self.unembed = Unembed(cfg.d_model, cfg.vocab_size, bias=False)
        self.logits = HookPoint()  # [batch, pos, vocab]
        self.tie_weights()
        self._inv_freq: torch.Tensor | None = None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.setup_hooks()

    def tie_weights(self) -> None:
        if self.cfg.tie_embeddings:
            self.unembed.weight = self.embed.weight

    @property
    def inv_freq(self) -> torch.Tensor:
        if self._inv_freq is None:
            self._inv_freq = model_inverse_frequencies(self.cfg)  # [d_head / 2]
        return self._inv_freq

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """tokens [batch, pos] -> logits [batch, pos, vocab]. With a cache, positions continue after it."""
        start = 0 if cache is None else cache.length
        cos, sin = self.rope_table(start, start + tokens.shape[1])  # [pos, d_head/2]
        x = self.hook_embed(self.embed(tokens))
        for block in self.blocks:
            x = block(x, cos, sin, cache)
        if self.ln_final is not None:
            x = self.ln_final(x)
        return self.logits(self.unembed(x))

    def rope_table(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of positions start..end, each [end - start, d_head / 2].

        Kept per model and computed in whole blocks of 1024 positions, so a position's values never depend on how
        many positions one pass asked for (and a decode step does not recompute them).
        """
        table = self._rope
        if table is None or table[0].shape[0] < end:
            n = -(-end // 1024) * 1024
            blocks = [cos_sin(self.inv_freq, torch.arange(b, b + 1024)) for b in range(0, n, 1024)]
            table = self._rope = (torch.cat([c for c, _ in blocks]), torch.cat([s for _, s in blocks]))
        return table[0][start:end], table[1][start:end]

    # ------------------------------------------------------------------ weights
    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical checkpoint keys and shapes; a tied model has no separate unembed.weight."""
        shapes = {k: tuple(v.shape) for k, v in self.state_dict(keep_vars=True).items()}
        if self.cfg.tie_embeddings:
            shapes.pop("unembed.weight")
        return shapes

    def load_weights(self, state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> "LlamaModel":
        """Load a canonical state dict, checking every key and shape, keeping the given tensors when they are
        already in `dtype` (memory-mapped weights stay mapped: no copy)."""
        expected = self.expected_shapes()
        missing = sorted(set(expected) - set(state))
        extra = sorted(set(state) - set(expected))
        if missing or extra:
            raise ValueError(f"checkpoint keys do not match the config: missing {missing[:3]}, unexpected {extra[:3]}")
        for k, shape in expected.items():
            if tuple(state[k].shape) != shape:
                raise ValueError(f"shape mismatch for {k}: checkpoint {list(state[k].shape)}, config {list(shape)}")
        state = {k: v.to(dtype) for k, v in state.items()}
        if self.cfg.tie_embeddings:
            state["unembed.weight"] = state["embed.weight"]
        self.load_state_dict(state, strict=True, assign=True)
        self.tie_weights()
        return self

    @classmethod
    def from_weights(cls, cfg: ModelConfig, state: dict[str, torch.Tensor],
                     dtype: torch.dtype = torch.float32) -> "LlamaModel":
        with torch.device("meta"):
            model = cls(cfg)
        return model.load_weights(state, dtype).eval().requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype (activations follow it; norms, softmax and logits compute in float32)."""
        return self.embed.weight.dtype

    def param_counts(self) -> dict[str, int]:
        """Parameters per component; a tied output matrix is counted once, under embedding."""
        groups = {"embedding": 0, "attention": 0, "ffn": 0, "norms": 0, "output": 0}
        for name, p in self.named_parameters():  # shared tensors are listed once
            if name.startswith("embed."):
                groups["embedding"] += p.numel()
            elif ".attn." in name:
                groups["attention"] += p.numel()
            elif ".mlp." in name:
                groups["ffn"] += p.numel()
            elif name.startswith("unembed."):
                groups["output"] += p.numel()
            else:
                groups["norms"] += p.numel()
        groups["total"] = sum(groups.values())
        return groups
