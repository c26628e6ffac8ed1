"""How close two recordings of the same prompt must be when they were computed by different kernels.

A product's bits depend on how the BLAS splits it (row count, thread count, CPU capability), so an extended
recording, or one made with another thread count, is compared within float32 rounding of each hook's activation
scale (its largest magnitude): ULPS units in the last place of that scale. Measured on SmolLM2 (30 layers), an
extension differs by at most ~26 such units, in the FFN's d_ff-wide tensors; the residual stream by ~2.
Masked cells (-inf scores, zero weights) must be masked in both, and the top tokens the same.
"""
from __future__ import annotations

import torch

ULPS = 128
EPS = torch.finfo(torch.float32).eps


def differences(a, b, ulps: float = ULPS) -> list[str]:
    """Names of hooks of recording `b` on which `a` is not within `ulps` units of b's scale; masks must agree.
    (Compared with `where`, not boolean indexing: indexing copies the selected cells of every hook, 4× the time.)"""
    bad = []
    for name in b.names:
        x, y = a[name].float(), b[name].float()
        if x.shape != y.shape:
            bad.append(name)
            continue
        finite = torch.isfinite(y)
        masked_alike = torch.equal(finite, torch.isfinite(x)) and torch.equal(x.where(~finite, 0), y.where(~finite, 0))
        if not masked_alike:
            bad.append(name)
            continue
        if finite.any():
            scale = y.abs().where(finite, 0).max().item()
            if (x - y).abs().where(finite, 0).max().item() > ulps * EPS * max(scale, 1e-30):
                bad.append(name)
    return bad


def assert_close_recording(a, b, ulps: float = ULPS, top: int = 5) -> None:
    assert a.names == b.names and torch.equal(a.token_ids, b.token_ids)
    differ = differences(a, b, ulps)
    assert not differ, f"{len(differ)} hooks differ by more than {ulps} ulps of their scale, first {differ[:4]}"
    assert torch.equal(a.logits.topk(top, dim=-1).indices, b.logits.topk(top, dim=-1).indices), "top tokens differ"
