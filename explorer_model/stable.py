"""The prefix-stable formulation, and the fast kernel for one-row products (used by model.py).

A causal model's activations at position i do not depend on later tokens, but the bits computed for them can:
MKL's sgemm picks a different kernel (a different summation order) for fewer than ~12 rows, and the fused
attention kernel's block sizes depend on the sequence length. Measured on this CPU (AVX-512, 1 and 2 threads):
a row of an sgemm with >= 12 rows has the same bits whatever the row count and the row's place; a 1-row
product does not. So when prefix stability is asked for (recordings, `extend`), every product sees the same
shapes whatever the prompt length: linear layers get at least STABLE_ROWS rows (zero-padded), and attention
runs in query blocks of Q_BLOCK rows against the keys up to the block's end, zero-padded (masked) past the
last token. A recording of n+1 tokens then equals a recording of n tokens plus one KV-cache step, bit for bit.
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

STABLE_ROWS = 16
Q_BLOCK = 64


def _one_row_kernel():
    """oneDNN's inner product, when this torch has it: for one row against a float32 weight read from memory it
    streams the (unchanged, row-major) weight about a fifth faster than MKL's gemv (bench/bench_decode.py)."""
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
    try:
        if op is not None and op(torch.ones(1, 2), torch.ones(3, 2), None, "none", [], "").shape == (1, 3):
            return op
    except RuntimeError:
        pass
    return None


_ONE_ROW = _one_row_kernel()


def stable_linear(lin: nn.Module, x: torch.Tensor, stable: bool) -> torch.Tensor:
    """lin(x), with fewer than STABLE_ROWS rows zero-padded up to it when `stable` (see above).

    Unstable single rows (decode steps) take the one-row kernel when it applies.
    """
    rows = x.numel() // x.shape[-1]
    if not stable and rows == 1 and _ONE_ROW is not None and x.dtype == lin.weight.dtype == torch.float32 \
            and not (torch.is_grad_enabled() and lin.weight.requires_grad):
        out = _ONE_ROW(x.reshape(1, -1), lin.weight, lin.bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])
    if not stable or rows >= STABLE_ROWS:
        return lin(x)
    padded = x.new_zeros(STABLE_ROWS, x.shape[-1])
    padded[:rows] = x.reshape(rows, -1)
    out = lin(padded)[:rows].clone()  # a recording keeps these rows, not the padded block
    return out.view(*x.shape[:-1], out.shape[-1])


def stable_silu(x: torch.Tensor, stable: bool) -> torch.Tensor:
    """SiLU whose value at an element does not depend on the tensor's length when `stable`.

    The vectorized exp and the scalar one used for a loop's tail can differ in the last bit, and which elements
    fall in a tail depends on the element count (and on where two threads split it). A count that is a multiple
    of 128 has no tail (always so for SmolLM2, d_ff = 1536); other counts are zero-padded to one.
    """
    n = x.numel()
    if not stable or n % 128 == 0:
        return F.silu(x)
    return F.silu(F.pad(x.reshape(-1), (0, -n % 128)))[:n].clone().view_as(x)  # a recording keeps n, not the pad


def query_blocks(n_q: int, q_offset: int) -> Iterator[tuple[int, int, int]]:
    """(block start, first row, end row) in absolute positions for the queries q_offset .. q_offset + n_q."""
    for block in range(q_offset // Q_BLOCK, (q_offset + n_q - 1) // Q_BLOCK + 1):
        a0 = block * Q_BLOCK
        yield a0, max(a0, q_offset), min(a0 + Q_BLOCK, q_offset + n_q)


def pad_to(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [batch, pos, ...] cut or zero-padded to `rows` positions."""
    if x.shape[1] >= rows:
        return x[:, :rows]
    return torch.cat([x, x.new_zeros(x.shape[0], rows - x.shape[1], *x.shape[2:])], 1)
