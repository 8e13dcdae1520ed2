"""Creation ops: full, zeros/ones/empty(_like), full_like, fill, scalar_tensor,
arange / iota.  Each is a Pointwise node whose body reads nothing (a Constant, or
an IndexExpr of the loop symbol), so realize inlines it into its readers.

A `device=` argument places the new tensor there; without one it lands on the
graph's device.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch
from torch._prims_common import get_acc_type

from coil.errors import CoilError
from coil.ir.expr import Cast, Expr, IndexExpr, xsyms
from coil.ir.indexing import FloorDiv
from coil.ir.shapes import norm, sizes
from coil.passes.lowerings.registry import LowerCtx, TensorValue, op, register_lowering, scalar_expr
from coil.passes.symbolic import is_float_size

aten = torch.ops.aten

Scalar = bool | int | float


def _device(ctx: LowerCtx, device: Any) -> str:
    """`device=` as given; absent, or "meta" (a decomposition traced on meta tensors
    names it, and no coil graph runs there), the graph's device."""
    if device is None or torch.device(device).type == "meta":
        return ctx.device
    return str(torch.device(device))


def _scalar_dtype(value: Scalar) -> torch.dtype:
    """The dtype `torch.full(size, value)` infers when none is given."""
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, (int, sympy.Expr)):  # a size (a SymInt of the graph) is an int
        return torch.int64
    return torch.get_default_dtype()


def _fill(ctx: LowerCtx, size: Sequence[int], value: Scalar, dtype: torch.dtype | None,
          device: Any = None) -> TensorValue:
    dtype = _scalar_dtype(value) if dtype is None else dtype
    return ctx.pointwise(sizes(size), scalar_expr(value, dtype), dtype, _device(ctx, device))


@register_lowering(aten.full)
def full(ctx: LowerCtx, size: Sequence[int], fill_value: Scalar, *, dtype: torch.dtype | None = None,
         layout: Any = None, device: Any = None, pin_memory: Any = None) -> TensorValue:
    return _fill(ctx, size, fill_value, dtype, device)


@register_lowering(aten.scalar_tensor)
def scalar_tensor(ctx: LowerCtx, value: Scalar, *, dtype: torch.dtype | None = None, layout: Any = None,
                  device: Any = None, pin_memory: Any = None) -> TensorValue:
    # unlike full, scalar_tensor does not infer: it is the default dtype unless told
    return _fill(ctx, (), value, torch.get_default_dtype() if dtype is None else dtype, device)


def _constant_factory(value: int) -> Any:
    """zeros / ones / empty (empty is zeros: any value is correct, zeros are reproducible)."""

    def lowering(ctx: LowerCtx, size: Sequence[int], *, dtype: torch.dtype | None = None, layout: Any = None,
                 device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> TensorValue:
        return _fill(ctx, size, value, torch.get_default_dtype() if dtype is None else dtype, device)

    return lowering


def _like_factory(value: int | None) -> Any:
    """zeros_like / ones_like / empty_like (value given) and full_like (value None:
    it comes as the second argument).  The dtype defaults to the input's."""

    def lowering(ctx: LowerCtx, a: TensorValue, *fill: Scalar, dtype: torch.dtype | None = None,
                 layout: Any = None, device: Any = None, pin_memory: Any = None,
                 memory_format: Any = None) -> TensorValue:
        v = fill[0] if value is None else value
        return _fill(ctx, a.size, v, a.dtype if dtype is None else dtype, a.device if device is None else device)

    return lowering


for _ops, _value in [((aten.zeros, aten.empty), 0), ((aten.ones,), 1)]:
    register_lowering(*_ops)(_constant_factory(_value))
for _ops, _like_value in [((aten.zeros_like, aten.empty_like), 0), ((aten.ones_like,), 1), ((aten.full_like,), None)]:
    register_lowering(*_ops)(_like_factory(_like_value))


@register_lowering(aten.fill)
def fill(ctx: LowerCtx, a: TensorValue, value: Any) -> TensorValue:
    """The functional fill (what a functionalized `x.fill_(v)` becomes): x's shape
    and dtype, v's value; a 0-d tensor value is read and cast."""
    if isinstance(value, TensorValue):
        if value.ndim != 0:
            raise CoilError(f"fill: value must be 0-d, got {value.ndim}-d")
        v = value.load(())
        return ctx.pointwise(a.size, v if v.dtype == a.dtype else Cast(v, a.dtype), a.dtype)
    return _fill(ctx, a.size, value, a.dtype)


# ---- arange / iota ---------------------------------------------------------------------------


def _arange_length(start: Scalar, end: Scalar, step: Scalar, dtype: torch.dtype, integer_args: bool) -> int:
    """torch._refs.arange's length, which matches ATen's shapes: int64 results (and
    integer arguments) truncate the arguments first and count with integer floor
    division; other dtypes take ceil((end - start) / step) in doubles."""
    if step == 0:
        raise CoilError("arange: step must be nonzero")
    if dtype == torch.int64 or integer_args:
        xs, xe, xt = int(start), int(end), int(step)
        sgn = (xt > 0) - (xt < 0)
        return max(0, (xe - xs + xt - sgn) // xt)
    return max(0, math.ceil((end - start) / step))


def _arange_body(start: Any, step: Any, dtype: torch.dtype, integer_args: bool, device: str) -> Expr:
    """start + step * x0 the way torch._refs.arange computes it: in int64 for integer
    dtypes (arguments truncated) and integer arguments, else in the accumulation
    dtype of `dtype` on `device` (float64 for float32 on the CPU), where start and
    step may be floats of sizes too."""
    x0 = xsyms(1)[0]
    if dtype.is_floating_point and not integer_args:
        acc = get_acc_type(dtype, torch.device(device))
        index = Cast(IndexExpr(x0, torch.int64), acc)
        return op("add", scalar_expr(start, acc), op("mul", scalar_expr(step, acc), index))
    return IndexExpr(sympy.Integer(int(start)) + int(step) * x0, torch.int64)


@register_lowering(aten.arange)
def arange(ctx: LowerCtx, *args: Scalar, dtype: torch.dtype | None = None, layout: Any = None,
           device: Any = None, pin_memory: Any = None) -> TensorValue:
    """arange(end), arange(start, end), arange(start, end, step)."""
    if not 1 <= len(args) <= 3:
        raise CoilError(f"arange: unexpected arguments {args}")
    if any(isinstance(a, sympy.Expr) for a in args):
        return _symbolic_arange(ctx, args, dtype, _device(ctx, device))
    if any(is_float_size(a) for a in args):
        return _float_size_arange(ctx, args, dtype, _device(ctx, device))
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    integer_args = all(isinstance(v, int) for v in (start, end, step))
    if dtype is None:
        dtype = torch.int64 if integer_args else torch.get_default_dtype()
    dev = _device(ctx, device)
    n = _arange_length(start, end, step, dtype, integer_args)
    body = _arange_body(start, step, dtype, integer_args, dev)
    return ctx.pointwise((n,), body if body.dtype == dtype else Cast(body, dtype), dtype, dev)


def _symbolic_arange(ctx: LowerCtx, args: Sequence[Any], dtype: torch.dtype | None, device: str) -> Any:
    """arange of int64 where a bound is a size (arange(n), a position range
    arange(past, past + s0), a strided arange(2, s0 + 2, 3)): length
    (end - start + step - 1) // step by a positive whole step, where the ranges
    prove end >= start (else the Extern); start + step * x0 as an index."""
    if dtype not in (None, torch.int64) or not all(isinstance(a, (int, sympy.Expr)) for a in args):
        return NotImplemented
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    if not isinstance(step, int) or step <= 0 or not ctx.sizes.shapes.known_le(norm(start), norm(end)):
        return NotImplemented
    n = norm(end - start) if step == 1 else norm(FloorDiv(end - start + step - 1, step))
    return ctx.pointwise((n,), IndexExpr(start + step * xsyms(1)[0], torch.int64), torch.int64, device)


def _float_size_arange(ctx: LowerCtx, args: Sequence[Any], dtype: torch.dtype | None, device: str) -> Any:
    """arange with a float of sizes among its bounds (`arange(0, s0 * 0.5, 0.5)`):
    its length is the one the ShapeEnv gave the result where that is a size (the
    ceiling of an exact ratio of sizes, here s0; else the Extern, which takes no
    float of sizes, and the graph runs eagerly); its values start + step * x0 in
    the accumulation dtype, as with number bounds."""
    out = ctx.out_val
    dtype = dtype or torch.get_default_dtype()
    if not isinstance(out, torch.Tensor) or out.ndim != 1 or not dtype.is_floating_point:
        return NotImplemented
    try:
        n = ctx.sizes.size(out.shape[0])
    except CoilError:
        return NotImplemented
    start, _, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    body = _arange_body(start, step, dtype, False, device)
    return ctx.pointwise((norm(n),), body if body.dtype == dtype else Cast(body, dtype), dtype, device)


@register_lowering(torch.ops.prims.iota)
def iota(ctx: LowerCtx, length: int, *, start: int, step: int, dtype: torch.dtype, device: Any = None,
         requires_grad: bool = False) -> TensorValue:
    body = IndexExpr(sympy.Integer(int(start)) + int(step) * xsyms(1)[0], torch.int64)
    dev = _device(ctx, device)
    return ctx.pointwise((norm(length),), body if dtype == torch.int64 else Cast(body, dtype), dtype, dev)
