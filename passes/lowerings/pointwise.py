"""Elementwise lowerings: arithmetic, math, comparisons, logic, casts, where.

Every lowering follows aten's type promotion (`registry.promote`), computes half
types in float32 and rounds once on store (as Inductor does), and leaves a body
whose Ops see arguments of their own dtype: comparisons take two operands of one
dtype, logical ops and `where`'s condition take bools.  On bools, `add`, `mul` and
the bitwise ops become the logical ops (`op` does that), so no backend has to
guess what `True + True` means in its integer types.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from coil.errors import CoilError
from coil.ir.expr import Cast, Check, Constant, Expr, xsyms
from coil.passes.lowerings.registry import (
    Lowering,
    LowerCtx,
    TensorValue,
    as_expr,
    constant,
    is_tensor,
    make_pointwise_body,
    op,
    out_size_of,
    promote,
    register_lowering,
    register_pointwise,
    upcast,
)

aten = torch.ops.aten

# ---- one op per element, aten's promotion ------------------------------------------------

for _aten, _name in [
    (aten.mul, "mul"),
    (aten.maximum, "maximum"),
    (aten.minimum, "minimum"),
    (aten.neg, "neg"),
    (aten.abs, "abs"),
    (aten.sign, "sign"),
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


# ---- rounding: the identity on integers ----------------------------------------------------


def _rounding(name: str) -> Lowering:
    """floor / ceil / trunc / round: integers are already whole, so they are a copy
    (no backend has to define `floor` on an int)."""

    def lowering(ctx: LowerCtx, a: TensorValue) -> TensorValue:
        def body(x: Expr, dtype: torch.dtype) -> Expr:
            return op(name, x) if dtype.is_floating_point else x

        size, b, dt = make_pointwise_body(body, (a,))
        return ctx.pointwise(size, b, dt)

    lowering.__name__ = name
    return lowering


for _aten, _name in [(aten.floor, "floor"), (aten.ceil, "ceil"), (aten.trunc, "trunc")]:
    register_lowering(_aten)(_rounding(_name))


@register_lowering(aten.round)
def round_(ctx: LowerCtx, a: TensorValue, *, decimals: int = 0) -> TensorValue:
    """aten's round_decimals: nearbyint(x * 10^d) / 10^d, or for d < 0
    nearbyint(x / 10^-d) * 10^-d, so that the scale is always an exact integer."""
    if decimals == 0:
        return _rounding("round")(ctx, a)

    def body(x: Expr, dtype: torch.dtype) -> Expr:
        scale = constant(10.0 ** abs(decimals), dtype)
        if decimals > 0:
            return op("truediv", op("round", op("mul", x, scale)), scale)
        return op("mul", op("round", op("truediv", x, scale)), scale)

    size, b, dt = make_pointwise_body(body, (a,))
    return ctx.pointwise(size, b, dt)


# ---- add / sub with alpha ------------------------------------------------------------------


def _scaled(y: Expr, alpha: Any, dtype: torch.dtype) -> Expr:
    return y if alpha == 1 else op("mul", y, constant(alpha, dtype), dtype=dtype)


def _add_like(name: str) -> Lowering:
    """add / sub: a (op) alpha * b."""

    def lowering(ctx: LowerCtx, a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
        def body(x: Expr, y: Expr, dtype: torch.dtype) -> Expr:
            return op(name, x, _scaled(y, alpha, dtype), dtype=dtype)

        size, b_, dt = make_pointwise_body(body, (a, b))
        return ctx.pointwise(size, b_, dt)

    lowering.__name__ = name
    return lowering


register_lowering(aten.add)(_add_like("add"))
register_lowering(aten.sub)(_add_like("sub"))


@register_lowering(aten.rsub)
def rsub(ctx: LowerCtx, a: Any, b: Any, *, alpha: Any = 1) -> TensorValue:
    """b - alpha * a."""
    def body(x: Expr, y: Expr, dtype: torch.dtype) -> Expr:
        return op("sub", y, _scaled(x, alpha, dtype), dtype=dtype)

    size, b_, dt = make_pointwise_body(body, (a, b))
    return ctx.pointwise(size, b_, dt)


# ---- division and powers -------------------------------------------------------------------


@register_lowering(aten.div)
def div(ctx: LowerCtx, a: Any, b: Any, *, rounding_mode: str | None = None) -> TensorValue:
    """True division promotes ints to float; floor and trunc division keep ints."""
    if rounding_mode is None:
        return _binary(ctx, "truediv", a, b, K.INT_TO_FLOAT)
    name = {"floor": "floordiv", "trunc": "truncdiv"}.get(rounding_mode)
    if name is None:
        raise CoilError(f"div: unknown rounding_mode {rounding_mode!r}")
    return _division(ctx, name, a, b)


@register_lowering(aten.floor_divide)
def floor_divide(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    return _division(ctx, "floordiv", a, b)


@register_lowering(aten.fmod)
def fmod(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    return _division(ctx, "fmod", a, b)


@register_lowering(aten.remainder)
def remainder(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    return _division(ctx, "remainder", a, b)


def _division(ctx: LowerCtx, name: str, a: Any, b: Any) -> TensorValue:
    """An integer division or remainder checks its divisor: eager raises
    RuntimeError("ZeroDivisionError") on the CPU for a zero one.  Floats divide by
    zero into inf and nan, without a check."""

    def body(x: Expr, y: Expr, dtype: torch.dtype) -> Expr:
        integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
        if integer and not (isinstance(y, Constant) and y.value != 0):
            y = Check(y, "division")
        return op(name, x, y, dtype=dtype)

    size, b_, dt = make_pointwise_body(body, (a, b))
    return ctx.pointwise(size, b_, dt)


@register_lowering(aten.true_divide)
def true_divide(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    return _binary(ctx, "truediv", a, b, K.INT_TO_FLOAT)


# x ** n for a constant integer 2 <= |n| <= POW_MAX_MULTIPLY is lowered as
# products.  Every target pays for a general pow: Triton's goes through exp2/log2
# plus the sign fix-ups of a negative base (GELU's x ** 3 made the tanh-GELU kernel
# slower than Inductor's products: bench/probes/README.md), libm's powf costs
# ~25 ns an element and libmvec's vector powf hands negative bases to the scalar
# one.  ATen's pow_tensor_scalar computes 2, 3 and -2 as products too (x * x * x,
# left to right, as here); 4 rounds twice, within an ulp.
POW_MAX_MULTIPLY = 4


def _pow_by_products(x: Expr, n: int) -> Expr:
    if n == 2:
        return op("mul", x, x)
    if n == 3:
        return op("mul", op("mul", x, x), x)
    square = op("mul", x, x)
    return op("mul", square, square)


def _pow_scalar_exponent(x: Expr, b: int | float, dtype: torch.dtype) -> Expr:
    """x ** b for a Python exponent: the common exponents as cheaper, exact ops (as
    Inductor does), the rest as `pow` with a constant."""
    if b == 1:
        return x
    if b == 2:
        return op("mul", x, x)
    if dtype.is_floating_point and b == 0.5:
        return op("sqrt", x)
    if dtype.is_floating_point and b == -1:
        return op("reciprocal", x)
    if dtype.is_floating_point and b == 0:
        return constant(1, dtype)  # pow(nan, 0) and pow(inf, 0) are 1 too
    if dtype.is_floating_point and float(b).is_integer() and 2 <= abs(b) <= POW_MAX_MULTIPLY:
        product = _pow_by_products(x, int(abs(b)))
        return product if b > 0 else op("reciprocal", product)
    return op("pow", x, constant(b, dtype))


@register_lowering(aten.pow)
def pow_(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    """Tensor ** tensor, tensor ** scalar and scalar ** tensor; bools count as int64."""
    if is_tensor(a) and isinstance(b, (int, float)) and not isinstance(b, bool):
        exponent = b
        size, body, dt = make_pointwise_body(
            lambda x, _y, dtype: _pow_scalar_exponent(x, exponent, dtype), (a, b), K.BOOL_TO_LONG
        )
        return ctx.pointwise(size, body, dt)
    return _binary(ctx, "pow", a, b, K.BOOL_TO_LONG)


# ---- selection and clamping -----------------------------------------------------------------


@register_lowering(aten.where)
def where(ctx: LowerCtx, cond: Any, a: Any, b: Any) -> TensorValue:
    """A select needs no arithmetic, so it runs in the promoted dtype itself (no
    float32 detour for half types)."""
    _, result = promote((a, b))
    size = out_size_of((cond, a, b))
    idx = xsyms(len(size))
    c = as_expr(cond, size, idx, torch.bool)
    x = as_expr(a, size, idx, result)
    y = as_expr(b, size, idx, result)
    return ctx.pointwise(size, op("where", c, x, y, dtype=result), result)


def _clamp(ctx: LowerCtx, a: TensorValue, lo: Any, hi: Any) -> TensorValue:
    """maximum then minimum, so NaN inputs stay NaN and lo > hi gives hi, as aten."""
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
    return ctx.pointwise(size, x, result)


@register_lowering(aten.clamp)
def clamp(ctx: LowerCtx, a: TensorValue, min: Any = None, max: Any = None) -> TensorValue:  # noqa: A002 - aten's names
    return _clamp(ctx, a, min, max)


@register_lowering(aten.clamp_min)
def clamp_min(ctx: LowerCtx, a: TensorValue, min: Any) -> TensorValue:  # noqa: A002
    return _clamp(ctx, a, min, None)


@register_lowering(aten.clamp_max)
def clamp_max(ctx: LowerCtx, a: TensorValue, max: Any) -> TensorValue:  # noqa: A002
    return _clamp(ctx, a, None, max)


# ---- activations ----------------------------------------------------------------------------


def _gelu_body(approximate: str) -> Callable[..., Expr]:
    def body(x: Expr, dtype: torch.dtype) -> Expr:
        if approximate == "tanh":
            # 0.5 * x * (1 + tanh(z)) = x * sigmoid(2z), z = sqrt(2/pi) * (x + 0.044715 x^3):
            # one exp and a division instead of tanh, which made the kernel compute-bound at
            # the copy rate (bench/probes/README.md: pointwise_math.py), and
            # no cancellation in 1 + tanh(z) for negative x (float32, x in [-30, 30]: 1.2e-6
            # relative error against 5e-5 for eager's form, 5e-7 absolute for both)
            k2 = constant(2 * 0.7978845608028654, dtype)  # 2 sqrt(2 / pi)
            c = constant(0.044715, dtype)
            inner = op("mul", k2, op("add", x, op("mul", c, op("mul", x, op("mul", x, x)))))
            return op("mul", x, op("sigmoid", inner))
        half, one = constant(0.5, dtype), constant(1.0, dtype)
        r = constant(0.7071067811865476, dtype)  # 1 / sqrt(2)
        return op("mul", op("mul", half, x), op("add", one, op("erf", op("mul", x, r))))

    return body


@register_lowering(aten.gelu)
def gelu(ctx: LowerCtx, a: TensorValue, *, approximate: str = "none") -> TensorValue:
    if approximate not in ("none", "tanh"):
        raise CoilError(f"gelu: unknown approximate {approximate!r}")
    size, b, dt = make_pointwise_body(_gelu_body(approximate), (a,))
    return ctx.pointwise(size, b, dt)


@register_lowering(aten.silu)
def silu(ctx: LowerCtx, a: TensorValue) -> TensorValue:
    size, b, dt = make_pointwise_body(lambda x, dtype: op("mul", x, op("sigmoid", x)), (a,))
    return ctx.pointwise(size, b, dt)


# ---- casts and copies -----------------------------------------------------------------------


def _cast(ctx: LowerCtx, a: TensorValue, dtype: torch.dtype) -> TensorValue:
    x = a.load(xsyms(a.ndim))
    return ctx.pointwise(a.size, x if x.dtype == dtype else Cast(x, dtype), dtype)


@register_lowering(aten._to_copy)
def to_copy(ctx: LowerCtx, a: TensorValue, *, dtype: torch.dtype | None = None, layout: Any = None,
            device: Any = None, pin_memory: Any = None, non_blocking: bool = False,
            memory_format: Any = None) -> TensorValue:
    if device is not None and torch.device(device).type != torch.device(a.device).type:
        return NotImplemented  # a copy across devices runs as the aten op
    return _cast(ctx, a, a.dtype if dtype is None else dtype)


@register_lowering(torch.ops.prims.convert_element_type)
def convert_element_type(ctx: LowerCtx, a: TensorValue, dtype: torch.dtype) -> TensorValue:
    return _cast(ctx, a, dtype)


@register_lowering(aten.clone, aten.contiguous, aten.lift_fresh_copy)
def clone(ctx: LowerCtx, a: TensorValue, *, memory_format: Any = None) -> TensorValue:
    return _cast(ctx, a, a.dtype)
