"""cumsum as a Reduction, so a scan over a short dim fuses with what feeds it
instead of running as an Extern call.

A scan is not pointwise: out[.., i, ..] depends on x[.., 0..i, ..].  coil has no
scan loop, but the sum it asks for is a reduction with a mask:

    out[.., i, ..] = sum over r in [0, n) of where(r <= i, x[.., r, ..], 0)

Every output element reduces the whole row (each load stays inside it), so the
work is n^2 a row instead of n: worth a kernel only for short rows.  Past
SCAN_LIMIT elements a row the Extern's linear scan wins, and the lowering
declines.  Sums accumulate in float32 for half types and in int64 for integers
and bool, as eager's CPU kernel does; floats are summed in the reduction's order
rather than left to right, which differs from eager by rounding only.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from coil.ir.expr import Cast, Expr, IndexExpr, rsyms, xsyms
from coil.passes.lowerings.registry import LowerCtx, TensorValue, constant, normalize_dim, op, register_lowering, upcast
from coil.passes.lowerings.reductions import sum_dtype

aten = torch.ops.aten

# the longest row a cumsum reduces whole for each of its elements
SCAN_LIMIT = 512


@register_lowering(aten.cumsum.default)
def cumsum(ctx: LowerCtx, x: TensorValue, dim: int, *, dtype: torch.dtype | None = None) -> Any:
    d = normalize_dim(dim, x.ndim)
    out = sum_dtype(x, dtype)
    acc = upcast(out)
    xs = xsyms(x.ndim)
    if x.ndim == 0 or x.size[d] <= 1 or x.numel() == 0:  # nothing to add up: a converting copy
        return ctx.pointwise(x.size, x.load(xs), out)
    n = x.size[d]
    if n > SCAN_LIMIT or out.is_complex:
        return NotImplemented
    r = rsyms(1)[0]
    index: list[sympy.Expr] = list(xs)
    index[d] = r
    value: Expr = x.load(index)
    if value.dtype != acc:
        value = Cast(value, acc)
    upto = op("le", IndexExpr(r, torch.int64), IndexExpr(xs[d], torch.int64))
    body = op("where", upto, value, constant(0, acc), dtype=acc)
    return ctx.reduction(x.size, (n,), "sum", body, out)
