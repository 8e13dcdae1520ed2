"""Views: each is an index remap (a `View` node), never a copy.

A View of size S over base B says: element x of the view is element `index(x)` of
B, where `index` is over the view's symbols x0..x{n-1} and addresses B's logical
(row-major) index, not its storage.  So a view of a transposed or sliced input is
right without knowing its strides: realize folds the chain of maps into the
reader's load, and the loaded buffer's layout turns the result into an offset.

The `*_copy` variants (from torch.export and functionalization) return fresh
tensors: they are the same remap followed by a pointwise copy, which realize
inlines into readers like any other pointwise node, so they cost nothing unless
they are graph outputs (where aliasing an input would be wrong).

aten.view.dtype (a bitcast) is not an index remap of the logical tensor: it stays
Extern.  as_strided remaps storage, not the logical index; over an input that
eager holds contiguous from offset 0 (the FX node's fake value says so) the two
are one, and as long as every element it reaches lies inside the input it is a
View at unflatten(offset + sum(stride * x), input size).  Otherwise it stays
Extern.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import sympy
import torch

from coil.errors import CoilError
from coil.ir.expr import xsyms
from coil.ir.indexing import FloorDiv, flatten, ranges_of, simplify_index, strided_offset, unflatten
from coil.ir.shapes import EMPTY, ShapeInfo, Size, equal_at_samples, is_static, norm, same_size
from coil.ir.shapes import sizes as to_sizes
from coil.passes.lowerings.registry import (
    LowerCtx,
    NeedsStaticSizes,
    TensorValue,
    constant,
    normalize_dim,
    register_lowering,
)


aten = torch.ops.aten


def _view(ctx: LowerCtx, x: TensorValue, size: Sequence[int], index: Sequence[sympy.Expr]) -> TensorValue:
    rng = ranges_of(xsyms(len(size)), size)
    return ctx.view(x, to_sizes(size), tuple(simplify_index(i, rng) for i in index))


def _quotient(numel: Size, known: Size) -> Size:
    """`numel / known`, which torch's checks made whole: a polynomial where it is
    one (`s0*s1*64 / 64`), else a floor division of the numerator over the common
    denominator (`(s0 + (256 - s0) mod 256) / 256`, a length padded to a multiple,
    as torch spells it), never a size with fractions."""
    q = sympy.cancel(sympy.sympify(numel) / known)
    if q.is_Integer:
        return int(q)
    if q.free_symbols and q.is_polynomial(*q.free_symbols) and all(c.is_Integer for c in sympy.Poly(q, *q.free_symbols).coeffs()):
        return norm(q)
    num, den = sympy.fraction(sympy.together(q))
    return norm(num) if den == 1 else norm(FloorDiv(sympy.expand(num), den))


def infer_size(size: Sequence[Size], numel: Size, shapes: ShapeInfo = EMPTY) -> tuple[Size, ...]:
    """`size` with its one -1 filled in; an error when the element counts differ
    (symbolic sizes: unless equal for every size, or, where sympy cannot show it,
    at the samples of `shapes`' ranges: torch checked the view on the graph's fake
    tensors, under Dynamo's guards)."""
    out = list(to_sizes(size))
    if out.count(-1) > 1:
        raise CoilError(f"view: only one dimension can be -1, got {out}")
    if -1 in out:
        known = 1
        for s in out:
            if s != -1:
                known *= s
        out[out.index(-1)] = (numel // known if known else 0) if is_static((numel, known)) \
            else _quotient(numel, known)
    prod: Size = 1
    for s in out:
        prod = norm(prod * s)
    if not same_size(prod, numel) and not (shapes and (shapes.known_eq(prod, numel)
                                                       or equal_at_samples(prod, numel, shapes))):
        raise CoilError(f"view: shape {out} is invalid for input of size {numel}")
    return tuple(out)


@register_lowering(aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten._reshape_alias.default)
def view(ctx: LowerCtx, x: TensorValue, size: Sequence[int], *_strides: Any) -> TensorValue:
    """Row-major reinterpretation: flatten the view's index, unflatten it in x's
    sizes.  Covers splits, merges and reshapes that are neither ((6,4)->(4,6))."""
    out = infer_size(size, x.numel(), ctx.sizes.shapes)
    if out == x.size:
        return _view(ctx, x, out, xsyms(len(out)))
    flat = flatten(xsyms(len(out)), out)
    return _view(ctx, x, out, unflatten(flat, x.size))


@register_lowering(aten.permute.default)
def permute(ctx: LowerCtx, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [normalize_dim(d, x.ndim) for d in dims]
    if sorted(dims) != list(range(x.ndim)):
        raise CoilError(f"permute: {list(dims)} is not a permutation of {x.ndim} dims")
    xs = xsyms(x.ndim)
    index: list[sympy.Expr] = [sympy.Integer(0)] * x.ndim
    for i, d in enumerate(dims):
        index[d] = xs[i]
    return _view(ctx, x, [x.size[d] for d in dims], index)


@register_lowering(aten.transpose.int)
def transpose(ctx: LowerCtx, x: TensorValue, d0: int, d1: int) -> TensorValue:
    dims = list(range(x.ndim))
    if x.ndim:
        a, b = normalize_dim(d0, x.ndim), normalize_dim(d1, x.ndim)
        dims[a], dims[b] = dims[b], dims[a]
    return permute(ctx, x, dims)


@register_lowering(aten.t.default)
def t(ctx: LowerCtx, x: TensorValue) -> TensorValue:
    if x.ndim > 2:
        raise CoilError(f"t: expects a tensor of at most 2 dims, got {x.ndim}")
    return transpose(ctx, x, 0, 1) if x.ndim == 2 else permute(ctx, x, list(range(x.ndim)))


@register_lowering(aten.expand.default)
def expand(ctx: LowerCtx, x: TensorValue, size: Sequence[int], *, implicit: bool = False) -> TensorValue:
    """Broadcast size-1 dims (read at 0) and prepend new dims (not read at all)."""
    size = list(size)
    lead = len(size) - x.ndim
    if lead < 0:
        raise CoilError(f"expand: {list(size)} has fewer dims than {list(x.size)}")
    out = [x.size[i - lead] if (isinstance(s, int) and s == -1 and i >= lead) else norm(s) for i, s in enumerate(size)]
    xs = xsyms(len(out))
    index: list[sympy.Expr] = []
    for i, s in enumerate(x.size):
        o = out[lead + i]
        # sizes sympy cannot show equal (`p // (p // 256)` and 256, for a p padded to a multiple
        # of 256): torch checked the expand on the graph's fake tensors, and samples confirm it
        shapes = ctx.sizes.shapes
        if same_size(s, o) or (shapes and (shapes.known_eq(s, o) or equal_at_samples(s, o, shapes))):
            index.append(xs[lead + i])
        elif s == 1:
            index.append(sympy.Integer(0))
        else:
            raise CoilError(f"expand: cannot expand {list(x.size)} to {out}")
    return _view(ctx, x, out, index)


@register_lowering(aten.unsqueeze.default)
def unsqueeze(ctx: LowerCtx, x: TensorValue, dim: int) -> TensorValue:
    dim = normalize_dim(dim, x.ndim + 1)
    out = list(x.size[:dim]) + [1] + list(x.size[dim:])
    xs = xsyms(len(out))
    return _view(ctx, x, out, [xs[i] for i in range(len(out)) if i != dim])


@register_lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(ctx: LowerCtx, x: TensorValue, dims: Any = None) -> TensorValue:
    """Drop the named dims that have size 1 (others are kept, as aten does); with no
    dims, every size-1 dim."""
    if dims is None:
        drop = {i for i, s in enumerate(x.size) if s == 1}
    else:
        ds = [dims] if isinstance(dims, int) else list(dims)
        named = {normalize_dim(d, x.ndim) for d in ds} if x.ndim else set()
        drop = {d for d in named if x.size[d] == 1}
    out = [s for i, s in enumerate(x.size) if i not in drop]
    xs = iter(xsyms(len(out)))
    index = [sympy.Integer(0) if i in drop else next(xs) for i in range(x.ndim)]
    return _view(ctx, x, out, index)


@register_lowering(aten.slice.Tensor)
def slice_(ctx: LowerCtx, x: TensorValue, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> TensorValue:
    """Python slice semantics: negative start/end count from the end, both clamp."""
    if step <= 0:
        raise CoilError(f"slice: step must be positive, got {step}")
    dim = normalize_dim(dim, x.ndim)
    if not is_static((x.size[dim], start or 0, end or 0)):
        return _symbolic_slice(ctx, x, dim, start, end, step)
    begin, stop, stride = slice(start, end, step).indices(x.size[dim])
    out = list(x.size)
    out[dim] = len(range(begin, stop, stride))
    index = list(xsyms(len(out)))
    index[dim] = begin + stride * index[dim]
    return _view(ctx, x, out, index)


def slice_bounds(shapes: ShapeInfo, n: Size, start: Any, end: Any) -> tuple[Size, Size]:
    """The begin and end of `[start:end]` along a dim of size n where a size or a
    bound is symbolic: Python's clamping, proved for every size instead of
    computed (0 <= begin <= end <= n); NeedsStaticSizes (the op runs as an
    Extern) where it cannot be."""
    def bound(v: Any, default: Size) -> Size:
        if v is None or (isinstance(v, int) and v >= 2**62):  # x[a:] arrives as end = sys.maxsize
            return default
        v = norm(v)
        return norm(n + v) if isinstance(v, int) and v < 0 else v

    begin, stop = bound(start, 0), bound(end, n)
    if not (shapes.known_le(0, begin) and shapes.known_le(begin, stop)):
        raise NeedsStaticSizes(f"slice [{start}:{end}] of size {n}: bounds not provably in order")
    if not shapes.known_le(stop, n):
        if shapes.known_le(n, stop):
            stop = n  # past the end: clamped
        else:
            raise NeedsStaticSizes(f"slice [{start}:{end}] of size {n}: its end may pass the size or not")
    return begin, stop


def _symbolic_slice(ctx: LowerCtx, x: TensorValue, dim: int, start: Any, end: Any, step: int) -> TensorValue:
    """A slice where the size or a bound is symbolic (slice_bounds)."""
    begin, stop = slice_bounds(ctx.sizes.shapes, x.size[dim], start, end)
    length = norm(stop - begin) if step == 1 else norm(FloorDiv(stop - begin + step - 1, step))
    out = list(x.size)
    out[dim] = length
    index = list(xsyms(len(out)))
    index[dim] = begin + step * index[dim]
    return _view(ctx, x, out, index)


@register_lowering(aten.select.int)
def select(ctx: LowerCtx, x: TensorValue, dim: int, index: int) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    n = x.size[dim]
    if not is_static((n, index)):
        shapes = ctx.sizes.shapes
        at = norm(index)
        if isinstance(at, int) and at < 0:
            at = norm(n + at)
        if not (shapes.known_le(0, at) and shapes.known_lt(at, n)):
            raise NeedsStaticSizes(f"select {index} of size {n}: not provably inside")
        out = [s for i, s in enumerate(x.size) if i != dim]
        xs = iter(xsyms(len(out)))
        return _view(ctx, x, out, [sympy.sympify(at) if i == dim else next(xs) for i in range(x.ndim)])
    if not -n <= index < n:
        raise CoilError(f"select: index {index} out of range for size {n}")
    out = [s for i, s in enumerate(x.size) if i != dim]
    xs = iter(xsyms(len(out)))
    idx = [sympy.Integer(index % n) if i == dim else next(xs) for i in range(x.ndim)]
    return _view(ctx, x, out, idx)


@register_lowering(aten.alias.default, aten.detach.default, aten.lift_fresh.default)
def alias(ctx: LowerCtx, x: TensorValue) -> TensorValue:
    return _view(ctx, x, x.size, xsyms(x.ndim))


def _split_sizes(sizes: Any, n: int) -> list[int]:
    """split(x, k) gives chunks of k and a shorter last one; torch returns one
    (empty) chunk for an empty dim."""
    if isinstance(sizes, sympy.Expr) or (isinstance(sizes, int) and not isinstance(n, int)):
        # chunks of a symbolic size, or of a symbolic dim: how many there are is Dynamo's
        # guard, not something coil can count (the aten op, as an extern, splits)
        raise NeedsStaticSizes(f"split of a dim of {n} into chunks of {sizes}")
    if isinstance(sizes, int):
        if sizes <= 0:
            raise CoilError(f"split: split_size must be positive, got {sizes}")
        return [min(sizes, n - s) for s in range(0, n, sizes)] or [0]
    out = list(to_sizes(sizes))
    if not same_size(norm(sum(out)), n):
        if not is_static((*out, n)):  # a relation Dynamo's guards hold (s0 == u0 + 2): aten's split checks it
            raise NeedsStaticSizes(f"split_with_sizes: {out} not shown to sum to {n}")
        raise CoilError(f"split_with_sizes: {out} does not sum to {n}")
    return out


@register_lowering(aten.split.Tensor, aten.split.sizes, aten.split_with_sizes.default,
                   aten.unsafe_split.Tensor, aten.unsafe_split_with_sizes.default)
def split(ctx: LowerCtx, x: TensorValue, sizes: Any, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = normalize_dim(dim, x.ndim)
    outs = []
    start = 0
    for s in _split_sizes(sizes, x.size[dim]):
        outs.append(slice_(ctx, x, dim, start, start + s, 1))
        start += s
    return tuple(outs)


@register_lowering(aten.unbind.int)
def unbind(ctx: LowerCtx, x: TensorValue, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = normalize_dim(dim, x.ndim)
    return tuple(select(ctx, x, dim, i) for i in range(x.size[dim]))


@register_lowering(aten.as_strided.default)
def as_strided(ctx: LowerCtx, x: TensorValue, size: Sequence[int], stride: Sequence[int],
               storage_offset: int | None = None) -> Any:
    base = ctx.arg_vals[0] if ctx.arg_vals else None
    if not is_static((*x.size, *size, *stride, storage_offset or 0)):
        return NotImplemented  # symbolic: the aten op, as an extern
    offset = int(storage_offset or 0)
    if (not isinstance(base, torch.Tensor) or tuple(base.shape) != x.size or not base.is_contiguous()
            or base.storage_offset() != 0 or len(size) != len(stride) or offset < 0
            or any(int(s) < 0 for s in size) or any(int(st) < 0 for st in stride)):
        return NotImplemented
    size = [int(s) for s in size]
    if math.prod(size) == 0:  # nothing to read (x may be empty too)
        return ctx.pointwise(size, constant(0, x.dtype), x.dtype)
    if offset + sum((s - 1) * int(st) for s, st in zip(size, stride)) >= x.numel():
        return NotImplemented  # it reaches past the input into the rest of its storage
    flat = strided_offset(xsyms(len(size)), [int(st) for st in stride], offset)
    return _view(ctx, x, size, unflatten(flat, x.size))


@register_lowering(aten.diagonal.default)
def diagonal(ctx: LowerCtx, x: TensorValue, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorValue:
    """The other dims in order, then the diagonal:
    out[..., k] = x[.., k + max(-offset, 0), .., k + max(offset, 0), ..] at dims dim1, dim2."""
    d1, d2 = normalize_dim(dim1, x.ndim), normalize_dim(dim2, x.ndim)
    if d1 == d2:
        raise CoilError("diagonal: dim1 and dim2 must differ")
    row, col = max(-offset, 0), max(offset, 0)
    length = max(min(x.size[d1] - row, x.size[d2] - col), 0)
    rest = [d for d in range(x.ndim) if d not in (d1, d2)]
    out = [x.size[d] for d in rest] + [length]
    xs = xsyms(len(out))
    index: list[sympy.Expr] = [sympy.Integer(0)] * x.ndim
    for i, d in enumerate(rest):
        index[d] = xs[i]
    index[d1] = xs[-1] + row
    index[d2] = xs[-1] + col
    return _view(ctx, x, out, index)


@register_lowering(aten.unfold.default)
def unfold(ctx: LowerCtx, x: TensorValue, dimension: int, size: int, step: int) -> TensorValue:
    """Windows of `size` every `step` along `dimension`, the window as a new last dim."""
    if x.ndim == 0:
        return _view(ctx, x, (size,), ())
    d = normalize_dim(dimension, x.ndim)
    if size > x.size[d] or step <= 0:
        raise CoilError(f"unfold: size {size} / step {step} do not fit dim of size {x.size[d]}")
    out = list(x.size)
    out[d] = (x.size[d] - size) // step + 1
    out.append(size)
    xs = xsyms(len(out))
    index: list[sympy.Expr] = list(xs[: x.ndim])
    index[d] = xs[d] * step + xs[-1]
    return _view(ctx, x, out, index)


# ---- the *_copy variants: the same remap, then a copy ------------------------------------


def _copy(ctx: LowerCtx, v: TensorValue) -> TensorValue:
    return ctx.pointwise(v.size, v.load(xsyms(v.ndim)), v.dtype)


def _copying(fn: Callable[..., Any]) -> Callable[..., Any]:
    def lowering(ctx: LowerCtx, *args: Any, **kwargs: Any) -> Any:
        out = fn(ctx, *args, **kwargs)
        return tuple(_copy(ctx, o) for o in out) if isinstance(out, tuple) else _copy(ctx, out)

    lowering.__name__ = fn.__name__ + "_copy"
    return lowering


for _copy_op, _view_fn in [
    (aten.view_copy.default, view),
    (aten.permute_copy.default, permute),
    (aten.transpose_copy.int, transpose),
    (aten.t_copy.default, t),
    (aten.expand_copy.default, expand),
    (aten.unsqueeze_copy.default, unsqueeze),
    (aten.squeeze_copy.default, squeeze),
    (aten.squeeze_copy.dim, squeeze),
    (aten.squeeze_copy.dims, squeeze),
    (aten.slice_copy.Tensor, slice_),
    (aten.select_copy.int, select),
    (aten.alias_copy.default, alias),
    (aten.split_copy.Tensor, split),
    (aten.split_with_sizes_copy.default, split),
    (aten.unbind_copy.int, unbind),
    (aten.diagonal_copy.default, diagonal),
    (aten.unfold_copy.default, unfold),
]:
    register_lowering(_copy_op)(_copying(_view_fn))
