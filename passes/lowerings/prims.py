"""Lowerings of `torch.ops.prims.*`: what torch's reference decompositions emit.

Decompositions written with torch._refs (var_mean, layer_norm, std_mean, squeeze,
...) and graphs traced with a decomposition table (make_fx(decomposition_table=...),
AOTAutograd) contain prims instead of aten ops.  Each prim maps onto a lowering coil
already has:

    elementwise prims     -> one Op per element (prims never promote: inputs agree)
    prims.div             -> truediv for floats, truncdiv for integers (C division)
    prims.fma             -> a * b + c (Inductor's prim, present once it is imported)
    broadcast_in_dim, squeeze, transpose, collapse(_view), split_dim, reshape,
    view_of               -> View nodes (index remaps)
    rev                   -> a pointwise load at n-1-x (a View would need negative
                             strides if it were ever materialized as an alias)
    sum, prod, amax, amin, var -> Reduction nodes (+ the var epilogue)
    full, full_like, scalar_tensor -> constants

Unlike aten, a prim reduction's empty dim list reduces nothing, and its result keeps
the input dtype unless `output_dtype` says otherwise (that is what the prims' meta
functions, and so the traced graph, say).
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as K

from coil.errors import CoilError
from coil.ir.expr import Constant, Expr, xsyms
from coil.ir.shapes import sizes
from coil.passes.lowerings import reductions, views
from coil.passes.lowerings.pointwise import where
from coil.passes.lowerings.registry import (
    LowerCtx,
    TensorValue,
    make_pointwise_body,
    normalize_dim,
    op,
    register_lowering,
    register_pointwise,
    upcast,
)

prims = torch.ops.prims

# ---- elementwise ----------------------------------------------------------------------------

_SAME_DTYPE = """neg abs reciprocal sqrt rsqrt exp exp2 expm1 log log1p log2 sin cos tan tanh
    erf sign floor ceil round trunc bitwise_not add sub mul pow maximum minimum fmod remainder
    bitwise_and bitwise_or bitwise_xor""".split()
_TO_BOOL = "eq ne lt le gt ge".split()

for _name in _SAME_DTYPE:
    register_pointwise(getattr(prims, _name), _name)
for _name in _TO_BOOL:
    register_pointwise(getattr(prims, _name), _name, K.ALWAYS_BOOL)


@register_lowering(prims.div.default)
def div(ctx: LowerCtx, a: Any, b: Any) -> TensorValue:
    """prims.div rounds toward zero on integers (what C does), else true division."""
    def body(x: Expr, y: Expr, dtype: torch.dtype) -> Expr:
        name = "truediv" if dtype.is_floating_point or dtype.is_complex else "truncdiv"
        return op(name, x, y, dtype=dtype)

    size, b_, dt = make_pointwise_body(body, (a, b))
    return ctx.pointwise(size, b_, dt)


@register_lowering(prims.where.default)
def where_(ctx: LowerCtx, pred: Any, a: Any, b: Any) -> TensorValue:
    return where(ctx, pred, a, b)


@register_lowering(prims.isfinite.default)
def isfinite(ctx: LowerCtx, a: TensorValue) -> TensorValue:
    def body(x: Expr, dtype: torch.dtype) -> Expr:
        if not dtype.is_floating_point:  # integers are always finite
            return Constant(True, torch.bool)
        return op("logical_not", op("logical_or", op("isnan", x), op("isinf", x)))

    size, b, dt = make_pointwise_body(body, (a,), K.ALWAYS_BOOL)
    return ctx.pointwise(size, b, dt)


@register_lowering(prims.clone.default)
def clone(ctx: LowerCtx, a: TensorValue, *, memory_format: Any = None) -> TensorValue:
    return ctx.pointwise(a.size, a.load(xsyms(a.ndim)), a.dtype)


@register_lowering(prims.copy_strided.default)
def copy_strided(ctx: LowerCtx, a: TensorValue, stride: Sequence[int]) -> TensorValue:
    """A copy in the given strides: the values are a's; realize picks the layout."""
    return clone(ctx, a)


@register_lowering("prims.fma.default")
def fma(ctx: LowerCtx, a: Any, b: Any, c: Any) -> TensorValue:
    """prims.fma exists only once torch._inductor.inductor_prims is imported (Inductor's
    decomposition table emits it); registered by name so coil need not import it."""
    size, body, dt = make_pointwise_body(lambda x, y, z, dtype: op("add", op("mul", x, y), z), (a, b, c))
    return ctx.pointwise(size, body, dt)

# ---- views -----------------------------------------------------------------------------------


@register_lowering(prims.broadcast_in_dim.default)
def broadcast_in_dim(ctx: LowerCtx, a: TensorValue, shape: Sequence[int],
                     broadcast_dimensions: Sequence[int]) -> TensorValue:
    """Dim k of `a` becomes dim broadcast_dimensions[k] of the result; the other
    result dims are new.  A size-1 dim of `a` that grows is read at 0."""
    if len(broadcast_dimensions) != a.ndim:
        raise CoilError(f"broadcast_in_dim: {list(broadcast_dimensions)} does not name {a.ndim} dims")
    xs = xsyms(len(shape))
    index: list[sympy.Expr] = []
    for s, d in zip(a.size, broadcast_dimensions, strict=True):
        if s == shape[d]:
            index.append(xs[d])
        elif s == 1:
            index.append(sympy.Integer(0))
        else:
            raise CoilError(f"broadcast_in_dim: cannot broadcast {list(a.size)} to {list(shape)}")
    return views._view(ctx, a, sizes(shape), index)


@register_lowering(prims.squeeze.default)
def squeeze(ctx: LowerCtx, a: TensorValue, dimensions: Sequence[int]) -> TensorValue:
    dims = {normalize_dim(d, a.ndim) for d in dimensions}
    if any(a.size[d] != 1 for d in dims):
        raise CoilError(f"prims.squeeze: dims {sorted(dims)} of {list(a.size)} are not all of size 1")
    return views.squeeze(ctx, a, sorted(dims))


@register_lowering(prims.transpose.default)
def transpose(ctx: LowerCtx, a: TensorValue, permutation: Sequence[int]) -> TensorValue:
    return views.permute(ctx, a, permutation)


@register_lowering(prims.collapse_view.default, prims.collapse.default)
def collapse(ctx: LowerCtx, a: TensorValue, start: int, end: int) -> TensorValue:
    """Merge dims start..end (both included) into one: a row-major reshape."""
    if a.ndim == 0:
        return views.view(ctx, a, [1])
    merged = 1
    for s in a.size[start : end + 1]:
        merged *= s
    return views.view(ctx, a, [*a.size[:start], merged, *a.size[end + 1 :]])


@register_lowering(prims.split_dim.default)
def split_dim(ctx: LowerCtx, a: TensorValue, dim: int, outer_length: int) -> TensorValue:
    d = normalize_dim(dim, a.ndim)
    if outer_length <= 0 or a.size[d] % outer_length:
        raise CoilError(f"split_dim: {outer_length} does not divide dim {d} of {list(a.size)}")
    return views.view(ctx, a, [*a.size[:d], outer_length, a.size[d] // outer_length, *a.size[d + 1 :]])


@register_lowering(prims.reshape.default)
def reshape(ctx: LowerCtx, a: TensorValue, shape: Sequence[int]) -> TensorValue:
    return views.view(ctx, a, shape)


@register_lowering(prims.view_of.default)
def view_of(ctx: LowerCtx, a: TensorValue) -> TensorValue:
    return views.alias(ctx, a)


@register_lowering(prims.rev.default)
def rev(ctx: LowerCtx, a: TensorValue, dims: Sequence[int]) -> TensorValue:
    flip = {normalize_dim(d, a.ndim) for d in dims}
    xs = xsyms(a.ndim)
    index = [a.size[d] - 1 - xs[d] if d in flip else xs[d] for d in range(a.ndim)]
    return ctx.pointwise(a.size, a.load(index), a.dtype)


# ---- reductions ------------------------------------------------------------------------------


def _prim_dims(a: TensorValue, dims: Sequence[int] | None) -> tuple[int, ...]:
    if a.ndim == 0:
        return ()
    if dims is None:
        return tuple(range(a.ndim))
    return tuple(sorted({normalize_dim(int(d), a.ndim) for d in dims}))


@register_lowering(prims.sum.default, prims.prod.default, prims.amax.default, prims.amin.default)
def reduce(ctx: LowerCtx, a: TensorValue, dims: Sequence[int] | None, *,
           output_dtype: torch.dtype | None = None) -> TensorValue:
    kind = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}[ctx.op]
    out = a.dtype if output_dtype is None else output_dtype
    acc = upcast(out) if kind in ("sum", "prod") else None
    return reductions.reduce_over(ctx, a, _prim_dims(a, dims), False, kind, out, acc)


@register_lowering(prims.var.default)
def var(ctx: LowerCtx, a: TensorValue, dims: Sequence[int] | None, correction: float | None = 1, *,
        output_dtype: torch.dtype | None = None) -> TensorValue:
    out = a.dtype if output_dtype is None else output_dtype
    corr = 1.0 if correction is None else float(correction)
    return reductions.var_over(ctx, a, _prim_dims(a, dims), corr, False, out)


# ---- constants --------------------------------------------------------------------------------


def _fill(ctx: LowerCtx, size: Sequence[int], value: Any, dtype: torch.dtype) -> TensorValue:
    v: bool | int | float = bool(value) if dtype == torch.bool else (
        float(value) if dtype.is_floating_point else int(value))
    return ctx.pointwise(sizes(size), Constant(v, dtype), dtype)


@register_lowering(prims.full.default)
def full(ctx: LowerCtx, shape: Sequence[int], fill_value: Any, *, dtype: torch.dtype, device: Any = None,
         requires_grad: bool = False) -> TensorValue:
    return _fill(ctx, shape, fill_value, dtype)


@register_lowering(prims.full_like.default)
def full_like(ctx: LowerCtx, a: TensorValue, fill_value: Any, *, dtype: torch.dtype, device: Any = None,
              requires_grad: bool = False) -> TensorValue:
    return _fill(ctx, a.size, fill_value, dtype)


@register_lowering(prims.scalar_tensor.default)
def scalar_tensor(ctx: LowerCtx, s: Any, *, dtype: torch.dtype | None = None, device: Any = None) -> TensorValue:
    return _fill(ctx, (), s, dtype if dtype is not None else torch.get_default_dtype())
