"""Reductions over any set of dims, with keepdim: sum, prod, amax, amin, argmax,
argmin, any, all, mean, var / var_mean with correction (welford_m2 + a pointwise
epilogue)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from coil.errors import CoilError
from coil.ir.expr import Cast, Constant, Expr, Op, rsyms, xsyms
from coil.passes.lowerings.registry import LowerCtx, TensorValue, normalize_dim, register_lowering, upcast

aten = torch.ops.aten


def reduction_dims(x: TensorValue, dims: Any) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(x.ndim))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({normalize_dim(int(d), x.ndim) for d in dims}))


def split_index(x: TensorValue, dims: Sequence[int], keepdim: bool) -> tuple[tuple[int, ...], tuple[int, ...], list[sympy.Expr]]:
    """Output ranges, reduction ranges and the input index over x*/r* symbols."""
    kept = [d for d in range(x.ndim) if d not in dims]
    out_ranges = tuple(1 if (keepdim and d in dims) else x.size[d] for d in range(x.ndim) if keepdim or d not in dims)
    red_ranges = tuple(x.size[d] for d in dims)
    xs = xsyms(len(out_ranges))
    rs = rsyms(len(red_ranges))
    index: list[sympy.Expr] = []
    ki = 0
    for d in range(x.ndim):
        if d in dims:
            index.append(rs[dims.index(d)])
            if keepdim:
                ki += 1
        else:
            index.append(xs[ki] if keepdim else xs[kept.index(d)])
            ki += 1
    return out_ranges, red_ranges, index


def make_reduction(
    ctx: LowerCtx,
    x: TensorValue,
    dims: Any,
    keepdim: bool,
    reduction_type: str,
    out_dtype: torch.dtype,
    acc_dtype: torch.dtype | None = None,
) -> TensorValue:
    rdims = reduction_dims(x, dims)
    if x.ndim == 0:
        rdims = ()
    out_ranges, red_ranges, index = split_index(x, list(rdims), keepdim)
    body: Expr = x.load(index)
    acc = acc_dtype if acc_dtype is not None else upcast(x.dtype)
    if body.dtype != acc:
        body = Cast(body, acc)
    if math.prod(red_ranges) == 0 and reduction_type in ("max", "min", "argmax", "argmin"):
        raise CoilError(f"{reduction_type} of an empty dimension")
    return ctx.reduction(out_ranges, red_ranges, reduction_type, body, out_dtype)


def _sum_dtype(x: TensorValue, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    if x.dtype.is_floating_point or x.dtype.is_complex:
        return x.dtype
    return torch.int64


@register_lowering(aten.sum)
def sum_(ctx: LowerCtx, x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> TensorValue:
    if isinstance(dims, torch.dtype):  # sum.default(x, dtype)
        dims, dtype = None, dims
    out = _sum_dtype(x, dtype)
    return make_reduction(ctx, x, dims, keepdim, "sum", out, upcast(out))


@register_lowering(aten.prod)
def prod(ctx: LowerCtx, x: TensorValue, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> TensorValue:
    if isinstance(dim, torch.dtype):
        dim, dtype = None, dim
    out = _sum_dtype(x, dtype)
    return make_reduction(ctx, x, dim, keepdim, "prod", out, upcast(out))


@register_lowering(aten.amax, aten.amin, aten.max, aten.min)
def amax_amin(ctx: LowerCtx, x: TensorValue, dims: Any = None, keepdim: bool = False) -> Any:
    kind = "max" if ctx.op in ("amax", "max") else "min"
    if ctx.op in ("max", "min") and isinstance(dims, int):
        # max.dim returns (values, indices)
        values = make_reduction(ctx, x, dims, keepdim, kind, x.dtype)
        indices = make_reduction(ctx, x, dims, keepdim, "arg" + kind, torch.int64)
        return values, indices
    if ctx.op in ("max", "min") and isinstance(dims, TensorValue):
        raise CoilError("binary max/min: use maximum/minimum")
    return make_reduction(ctx, x, dims, keepdim, kind, x.dtype)


@register_lowering(aten.argmax, aten.argmin)
def argmax(ctx: LowerCtx, x: TensorValue, dim: int | None = None, keepdim: bool = False) -> TensorValue:
    kind = ctx.op
    if dim is None:
        flat = ctx.view(x, (x.numel(),), _unflatten_index(x)) if x.ndim != 1 else x
        out = make_reduction(ctx, flat, 0, False, kind, torch.int64)
        if keepdim:
            return ctx.view(out, (1,) * x.ndim, ())
        return out
    return make_reduction(ctx, x, dim, keepdim, kind, torch.int64)


def _unflatten_index(x: TensorValue) -> tuple[sympy.Expr, ...]:
    from coil.ir.indexing import unflatten

    return unflatten(xsyms(1)[0], x.size)


@register_lowering(aten.any, aten.all)
def any_all(ctx: LowerCtx, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return make_reduction(ctx, x, dims, keepdim, ctx.op, torch.bool, torch.bool)


def _count(x: TensorValue, dims: Any) -> int:
    return math.prod(x.size[d] for d in reduction_dims(x, dims)) if x.ndim else 1


def _scale(ctx: LowerCtx, t: TensorValue, divisor: float, dtype: torch.dtype) -> TensorValue:
    """t / divisor, computed in float32 (or wider) and stored as `dtype`."""
    compute = upcast(t.dtype) if t.dtype.is_floating_point else torch.float32
    if dtype == torch.float64:
        compute = torch.float64
    v: Expr = t.load(xsyms(t.ndim))
    if v.dtype != compute:
        v = Cast(v, compute)
    body: Expr = Op("truediv", (v, Constant(float(divisor), compute)), compute)
    return ctx.pointwise(t.size, body if compute == dtype else Cast(body, dtype), dtype)


@register_lowering(aten.mean)
def mean(ctx: LowerCtx, x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> TensorValue:
    if isinstance(dims, torch.dtype):
        dims, dtype = None, dims
    out = dtype if dtype is not None else x.dtype
    if not out.is_floating_point:
        raise CoilError(f"mean of {x.dtype} needs a floating dtype")
    s = make_reduction(ctx, x, dims, keepdim, "sum", upcast(out), upcast(out))
    return _scale(ctx, s, _count(x, dims), out)


def _var_parts(ctx: LowerCtx, x: TensorValue, dims: Any, correction: Any, keepdim: bool) -> tuple[TensorValue, TensorValue]:
    n = _count(x, dims)
    corr = 1.0 if correction is None else float(correction)
    acc = upcast(x.dtype) if x.dtype.is_floating_point else torch.float32
    m2 = make_reduction(ctx, x, dims, keepdim, "welford_m2", acc, acc)
    var = _scale(ctx, m2, max(n - corr, 0.0), x.dtype)
    s = make_reduction(ctx, x, dims, keepdim, "sum", acc, acc)
    mu = _scale(ctx, s, n, x.dtype)
    return var, mu


@register_lowering(aten.var)
def var(ctx: LowerCtx, x: TensorValue, dims: Any = None, unbiased: Any = None, keepdim: bool = False, *,
        correction: Any = None) -> TensorValue:
    if isinstance(unbiased, bool):  # var.dim(x, dims, unbiased, keepdim)
        correction = 1 if unbiased else 0
    elif unbiased is not None and isinstance(dims, bool):
        raise CoilError("var: unexpected arguments")
    if isinstance(dims, bool):  # var.default(x, unbiased)
        correction, dims = (1 if dims else 0), None
    return _var_parts(ctx, x, dims, correction, keepdim)[0]


@register_lowering(aten.var_mean)
def var_mean(ctx: LowerCtx, x: TensorValue, dims: Any = None, unbiased: Any = None, keepdim: bool = False, *,
             correction: Any = None) -> tuple[TensorValue, TensorValue]:
    if isinstance(unbiased, bool):
        correction = 1 if unbiased else 0
    if isinstance(dims, bool):
        correction, dims = (1 if dims else 0), None
    return _var_parts(ctx, x, dims, correction, keepdim)
