"""Which kernel a product takes: oneDNN's inner product for a decode step's one row and for a prompt's rows against a
vocabulary's output matrix, F.linear otherwise (used by model.py and decode.py).

Nothing here promises bits. How a BLAS splits a product between threads, and which kernel it picks for a given
row count and CPU, are the library's own choices; they change between CPUs, library versions and thread counts.
So the project states its equalities as tolerances (an extended recording is within float32 rounding of a
fresh one, tests/test_kernel_matrix.py runs them under several thread counts and CPU capabilities), except where
one computation is rerun on the same tensors in the same process (a recording's rebuilt hooks: recording.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


ONE_ROW = _one_row_kernel()
# A vocabulary's output matrix (tens of thousands of rows) against a prompt's few rows: MKL's sgemm, given fewer
# than 16 rows, worked through them almost one row at a time on an AVX-512 Xeon (SmolLM2's 49152 x 576 matrix: 54 ms
# for 13 rows, 26 ms for 16), while oneDNN's inner product streams the matrix once for all of them (18 ms), and was
# as fast or faster at 4 to 256 rows on 1 and 2 threads, AVX-512, AVX2 and MKL's compatible branch alike
# (bench/bench_output_product.py). At 2 and 3 rows MKL was the faster on AVX-512 (oneDNN 1.3x its time), and beyond
# 256 rows about as fast (1.1x at 1024): there MKL stays.
WIDE_OUTPUT, WIDE_ROWS = 16384, range(4, 257)


def linear(lin: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """lin's product with x (its forward need not be nn.Linear's). float32 takes oneDNN's inner product for a
    single row (a decode step) and for a prompt's rows against a vocabulary's output matrix, when this torch has
    it; everything else, and any product that trains, goes through F.linear."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if ONE_ROW is not None and x.dtype == lin.weight.dtype == torch.float32 \
            and (rows == 1 or (rows in WIDE_ROWS and lin.weight.shape[0] >= WIDE_OUTPUT)) \
            and not (torch.is_grad_enabled() and lin.weight.requires_grad):
        out = ONE_ROW(x.reshape(rows, -1), lin.weight, lin.bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])
    return F.linear(x, lin.weight, lin.bias)
