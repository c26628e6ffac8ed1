"""Which kernel explorer_model/kernels.py's linear() takes, and that its answer is F.linear's to within float32
rounding whichever it takes: oneDNN's inner product for one row and for 4 to 256 rows against a vocabulary's output
matrix, F.linear for everything else and for any product that trains."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from explorer_model import kernels

pytestmark = pytest.mark.kernels  # rerun under other threads and CPU capabilities: test_kernel_matrix.py

if kernels.ONE_ROW is None:
    pytest.skip("this torch has no oneDNN inner product", allow_module_level=True)


@pytest.fixture
def calls(monkeypatch):
    """The row counts oneDNN's inner product was given."""
    seen, op = [], kernels.ONE_ROW

    def counted(x, *args):
        seen.append(x.shape[0])
        return op(x, *args)
    monkeypatch.setattr(kernels, "ONE_ROW", counted)
    return seen


def product(out_features: int, in_features: int = 64, bias: bool = False) -> nn.Linear:
    torch.manual_seed(0)
    lin = nn.Linear(in_features, out_features, bias=bias)
    lin.weight.requires_grad_(False)
    if bias:
        lin.bias.requires_grad_(False)
    return lin


@pytest.mark.parametrize("rows, oneDNN", [(1, True), (2, False), (3, False), (4, True), (13, True), (256, True),
                                          (257, False)])
def test_an_output_matrix_takes_onednn_for_one_row_and_a_prompts_rows(calls, rows, oneDNN):
    lin = product(kernels.WIDE_OUTPUT)
    x = torch.randn(1, rows, 64)
    out = kernels.linear(lin, x)
    assert out.shape == (1, rows, kernels.WIDE_OUTPUT)
    assert calls == ([rows] if oneDNN else [])
    # within float32 rounding of the product: a few ulps of the largest |term| summed over 64 inputs
    scale = (x.abs() @ lin.weight.abs().T).max()
    assert (out - F.linear(x, lin.weight)).abs().max() <= 64 * torch.finfo(torch.float32).eps * scale


@pytest.mark.parametrize("rows, oneDNN", [(1, True), (13, False), (256, False)])
def test_a_layers_product_takes_onednn_for_one_row_only(calls, rows, oneDNN):
    lin = product(kernels.WIDE_OUTPUT - 1, bias=True)
    x = torch.randn(rows, 64)
    out = kernels.linear(lin, x)
    assert calls == ([rows] if oneDNN else [])
    scale = (x.abs() @ lin.weight.abs().T).max() + lin.bias.abs().max()
    assert (out - F.linear(x, lin.weight, lin.bias)).abs().max() <= 64 * torch.finfo(torch.float32).eps * scale


def test_a_product_that_trains_or_another_dtype_takes_f_linear(calls):
    lin = product(kernels.WIDE_OUTPUT)
    lin.weight.requires_grad_(True)
    x = torch.randn(13, 64)
    kernels.linear(lin, x).sum().backward()  # the inner product has no backward: F.linear's must run
    assert lin.weight.grad is not None
    with torch.no_grad():
        kernels.linear(lin, x)  # not training: oneDNN
    assert calls == [13]
    half = product(kernels.WIDE_OUTPUT).to(torch.bfloat16)
    kernels.linear(half, x.to(torch.bfloat16))
    assert calls == [13]
