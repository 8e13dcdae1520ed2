"""Elementwise lowerings: arithmetic, math, comparisons, logic, casts, where."""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from coil.errors import CoilError
from coil.ir.expr import Cast, Constant, Expr
from coil.passes.lowerings.registry import (
    LowerCtx,
    TensorValue,
    as_expr,
    is_tensor,
    make_pointwise_body,
    op,
    out_size_of,
    promote,
    register_lowering,
    register_pointwise,
    upcast,
)
from coil.ir.expr import xsyms

aten = torch.ops.aten

# ---- one op per element, aten's promotion ------------------------------------------------

for _aten, _name in [
    (aten.mul, "mul"),
    (aten.maximum, "maximum"),
    (aten.minimum, "minimum"),
    (aten.fmod, "fmod"),
    (aten.remainder, "remainder"),
    (aten.neg, "neg"),
    (aten.abs, "abs"),
    (aten.sign, "sign"),
    (aten.floor, "floor"),
    (aten.ceil, "ceil"),
    (aten.trunc, "trunc"),
    (aten.relu, "relu"),
    (aten.bitwise_and, "bitwise_and"),
    (aten.bitwise_or, "bitwise_or"),
    (aten.bitwise_xor, "bitwise_xor"),
    (aten.bitwise_not, "bitwise_not"),
]:
    register_pointwise(_aten, _name)

for _aten, _name in [
    (aten.sqrt, "sqrt"),
    (aten.rsqrt, "rsqrt"),
    (aten.exp, "exp"),
    (aten.exp2, "exp2"),
    (aten.expm1, "expm1"),
    (aten.log, "log"),
    (aten.log1p, "log1p"),
    (aten.log2, "log2"),
    (aten.sin, "sin"),
    (aten.cos, "cos"),
    (aten.tan, "tan"),
    (aten.tanh, "tanh"),
    (aten.sigmoid, "sigmoid"),
    (aten.erf, "erf"),
    (aten.reciprocal, "reciprocal"),
]:
    register_pointwise(_aten, _name, K.INT_TO_FLOAT)

for _aten, _name in [
    (aten.eq, "eq"),
    (aten.ne, "ne"),
    (aten.lt, "lt"),
    (aten.le, "le"),
    (aten.gt, "gt"),
    (aten.ge, "ge"),
    (aten.logical_and, "logical_and"),
    (aten.logical_or, "logical_or"),
    (aten.logical_xor, "logical_xor"),
    (aten.logical_not, "logical_not"),
    (aten.isnan, "isnan"),
    (aten.isinf, "isinf"),
]:
    register_pointwise(_aten, _name, K.ALWAYS_BOOL)


def _binary(ctx: LowerCtx, name: str, a: Any, b: Any, kind: K = K.DEFAULT) -> TensorValue:
    size, body, dt = make_pointwise_body(lambda x, y, dtype: op(name, x, y, dtype=dtype), (a, b), kind)
    return ctx.pointwise(size, body, dt)


@register_lowering(aten.add, aten.sub)
def add_sub(ctx: LowerCtx, a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    name = "add" if ctx.op == "add" else "sub"

    def body(x: Expr, y: Expr, dtype: torch.dtype) -> Expr:
        if alpha != 1:
            y = op("mul", y, Constant(alpha if dtype.is_floating_point else int(alpha), dtype), dtype=dtype)
        return op(name, x, y, dtype=dtype)

    size, b_, dt = make_pointwise_body(body, (a, b))
    return ctx.pointwise(size, b_, dt)


@register_lowering(aten.rsub)
def rsub(ctx: LowerCtx, a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    def body(x: Expr, y: Expr, dtype: torch.dtype) -> Expr:
        if alpha != 1:
            x = op("mul", x, Constant(alpha, dtype), dtype=dtype)
        return op("sub", y, x, dtype=dtype)

    size, b_, dt = make_pointwise_body(body, (a, b))
    return ctx.pointwise(size, b_, dt)


@register_lowering(aten.div)
def div(ctx: LowerCtx, a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorValue:
    if rounding_mode is None:
        return _binary(ctx, "truediv", a, b, K.INT_TO_FLOAT)
    name = {"floor": "floordiv", "trunc": "truncdiv"}.get(rounding_mode)
    if name is None:
        raise CoilError(f"div: unknown rounding_mode {rounding_mode!r}")
    return _binary(ctx, name, a, b)


@register_lowering(aten.floor_divide)
def floor_divide(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    return _binary(ctx, "floordiv", a, b)


@register_lowering(aten.true_divide)
def true_divide(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    return _binary(ctx, "truediv", a, b, K.INT_TO_FLOAT)


@register_lowering(aten.pow)
def pow_(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    if is_tensor(a) and isinstance(b, (int, float)) and not isinstance(b, bool):
        compute, result = promote((a, b), K.BOOL_TO_LONG)
        compute = upcast(compute)
        size = a.size
        x = as_expr(a, size, xsyms(len(size)), compute)
        if b == 2:
            body: Expr = op("mul", x, x)
        elif b == 1:
            body = x
        elif b == 0.5 and compute.is_floating_point:
            body = op("sqrt", x)
        elif b == -1 and compute.is_floating_point:
            body = op("reciprocal", x)
        else:
            body = op("pow", x, Constant(float(b) if compute.is_floating_point else int(b), compute))
        return ctx.pointwise(size, body if body.dtype == result else Cast(body, result), result)
    return _binary(ctx, "pow", a, b, K.BOOL_TO_LONG)


@register_lowering(aten.round)
def round_(ctx: LowerCtx, a: TensorValue, *, decimals: int = 0) -> TensorValue:
    def body(x: Expr, dtype: torch.dtype) -> Expr:
        if decimals == 0:
            return op("round", x)
        scale = Constant(float(10**decimals), dtype)
        return op("truediv", op("round", op("mul", x, scale)), scale)

    size, b, dt = make_pointwise_body(body, (a,))
    return ctx.pointwise(size, b, dt)


@register_lowering(aten.where)
def where(ctx: LowerCtx, cond: Any, a: Any, b: Any) -> TensorValue:
    compute, result = promote((a, b))
    size = out_size_of((cond, a, b))
    idx = xsyms(len(size))
    c = as_expr(cond, size, idx, torch.bool)
    x = as_expr(a, size, idx, result)
    y = as_expr(b, size, idx, result)
    return ctx.pointwise(size, op("where", c, x, y, dtype=result), result)


@register_lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def clamp(ctx: LowerCtx, a: TensorValue, lo: Any = None, hi: Any = None) -> TensorValue:
    if ctx.op == "clamp_max":
        lo, hi = None, lo
    args = [a] + [v for v in (lo, hi) if v is not None]
    compute, result = promote(args)
    compute = upcast(compute)
    size = out_size_of(args)
    idx = xsyms(len(size))
    x = as_expr(a, size, idx, compute)
    if lo is not None:
        x = op("maximum", x, as_expr(lo, size, idx, compute))
    if hi is not None:
        x = op("minimum", x, as_expr(hi, size, idx, compute))
    return ctx.pointwise(size, x if x.dtype == result else Cast(x, result), result)


@register_lowering(aten.gelu)
def gelu(ctx: LowerCtx, a: TensorValue, *, approximate: str = "none") -> TensorValue:
    def body(x: Expr, dtype: torch.dtype) -> Expr:
        half = Constant(0.5, dtype)
        one = Constant(1.0, dtype)
        if approximate == "tanh":
            k = Constant(0.7978845608028654, dtype)  # sqrt(2 / pi)
            c = Constant(0.044715, dtype)
            inner = op("mul", k, op("add", x, op("mul", c, op("mul", x, op("mul", x, x)))))
            return op("mul", op("mul", half, x), op("add", one, op("tanh", inner)))
        r = Constant(0.7071067811865476, dtype)  # 1 / sqrt(2)
        return op("mul", op("mul", half, x), op("add", one, op("erf", op("mul", x, r))))

    size, b, dt = make_pointwise_body(body, (a,), K.DEFAULT)
    return ctx.pointwise(size, b, dt)


@register_lowering(aten.silu)
def silu(ctx: LowerCtx, a: TensorValue) -> TensorValue:
    size, b, dt = make_pointwise_body(lambda x, dtype: op("mul", x, op("sigmoid", x)), (a,))
    return ctx.pointwise(size, b, dt)


@register_lowering(aten._to_copy)
def to_copy(ctx: LowerCtx, a: TensorValue, *, dtype: torch.dtype | None = None, layout: Any = None,
            device: Any = None, pin_memory: Any = None, non_blocking: bool = False,
            memory_format: Any = None) -> TensorValue:
    if device is not None and torch.device(device).type not in ("meta", torch.device(a.device).type):  # meta: traced decomposition
        raise CoilError("_to_copy across devices is not lowered")
    dt = a.dtype if dtype is None else dtype
    size = a.size
    x = a.load(xsyms(len(size)))
    return ctx.pointwise(size, x if x.dtype == dt else Cast(x, dt), dt)


@register_lowering(torch.ops.prims.convert_element_type)
def convert_element_type(ctx: LowerCtx, a: TensorValue, dtype: torch.dtype) -> TensorValue:
    x = a.load(xsyms(a.ndim))
    return ctx.pointwise(a.size, x if x.dtype == dtype else Cast(x, dtype), dtype)



@register_lowering(aten.clone, aten.contiguous, aten.lift_fresh_copy)
def clone(ctx: LowerCtx, a: TensorValue, *, memory_format: Any = None) -> TensorValue:
    return ctx.pointwise(a.size, a.load(xsyms(a.ndim)), a.dtype)
