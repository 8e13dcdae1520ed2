"""Creation ops: full, zeros/ones(_like), scalar_tensor, arange / iota."""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from coil.errors import CoilError
from coil.ir.expr import Cast, Constant, IndexExpr, Op, xsyms
from coil.passes.lowerings.registry import LowerCtx, TensorValue, register_lowering

aten = torch.ops.aten


def _fill(ctx: LowerCtx, size: Sequence[int], value: Any, dtype: torch.dtype | None) -> TensorValue:
    if dtype is None:
        dtype = torch.get_default_dtype() if isinstance(value, float) else (
            torch.bool if isinstance(value, bool) else torch.int64)
    v = bool(value) if dtype == torch.bool else (float(value) if dtype.is_floating_point else int(value))
    return ctx.pointwise(tuple(int(s) for s in size), Constant(v, dtype), dtype)


@register_lowering(aten.full)
def full(ctx: LowerCtx, size: Sequence[int], fill_value: Any, *, dtype: torch.dtype | None = None,
         layout: Any = None, device: Any = None, pin_memory: Any = None) -> TensorValue:
    return _fill(ctx, size, fill_value, dtype)


@register_lowering(aten.scalar_tensor)
def scalar_tensor(ctx: LowerCtx, value: Any, *, dtype: torch.dtype | None = None, layout: Any = None,
                  device: Any = None, pin_memory: Any = None) -> TensorValue:
    return _fill(ctx, (), value, dtype if dtype is not None else torch.get_default_dtype())


@register_lowering(aten.zeros, aten.ones, aten.empty)
def zeros_ones(ctx: LowerCtx, size: Sequence[int], *, dtype: torch.dtype | None = None, layout: Any = None,
               device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> TensorValue:
    value = 1 if ctx.op == "ones" else 0
    return _fill(ctx, size, value, dtype if dtype is not None else torch.get_default_dtype())


@register_lowering(aten.zeros_like, aten.ones_like, aten.empty_like, aten.full_like)
def like(ctx: LowerCtx, a: TensorValue, *args: Any, dtype: torch.dtype | None = None, layout: Any = None,
         device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> TensorValue:
    value = args[0] if ctx.op == "full_like" else (1 if ctx.op == "ones_like" else 0)
    return _fill(ctx, a.size, value, dtype if dtype is not None else a.dtype)


@register_lowering(aten.arange)
def arange(ctx: LowerCtx, *args: Any, dtype: torch.dtype | None = None, layout: Any = None,
           device: Any = None, pin_memory: Any = None) -> TensorValue:
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    elif len(args) == 2:
        (start, end), step = args, 1
    elif len(args) == 3:
        start, end, step = args
    else:
        raise CoilError(f"arange: unexpected arguments {args}")
    is_float = any(isinstance(v, float) for v in (start, end, step))
    if dtype is None:
        dtype = torch.get_default_dtype() if is_float else torch.int64
    n = len(range(start, end, step)) if not is_float else max(0, math.ceil((end - start) / step))
    x0 = xsyms(1)[0]
    if is_float or dtype.is_floating_point:
        body = Op("add", (Constant(float(start), torch.float64),
                          Op("mul", (Cast(IndexExpr(x0, torch.int64), torch.float64), Constant(float(step), torch.float64)), torch.float64)),
                  torch.float64)
        return ctx.pointwise((n,), Cast(body, dtype), dtype)
    body_i = IndexExpr(sympy.Integer(int(start)) + int(step) * x0, torch.int64)
    return ctx.pointwise((n,), body_i if dtype == torch.int64 else Cast(body_i, dtype), dtype)


@register_lowering(torch.ops.prims.iota)
def iota(ctx: LowerCtx, length: int, *, start: int, step: int, dtype: torch.dtype, device: Any = None,
         requires_grad: bool = False) -> TensorValue:
    x0 = xsyms(1)[0]
    body = IndexExpr(sympy.Integer(int(start)) + int(step) * x0, torch.int64)
    return ctx.pointwise((int(length),), body if dtype == torch.int64 else Cast(body, dtype), dtype)
