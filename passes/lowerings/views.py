"""Views: each is an index remap (a `View` node), never a copy.

A View of size S over base B says: element x of the view is element `index(x)` of
B.  realize folds these maps into the readers' loads."""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from coil.errors import CoilError
from coil.ir.expr import xsyms
from coil.ir.indexing import flatten, ranges_of, simplify_index, unflatten
from coil.passes.lowerings.registry import LowerCtx, TensorValue, normalize_dim, register_lowering

aten = torch.ops.aten


def _view(ctx: LowerCtx, x: TensorValue, size: Sequence[int], index: Sequence[sympy.Expr]) -> TensorValue:
    rng = ranges_of(xsyms(len(size)), size)
    return ctx.view(x, tuple(int(s) for s in size), tuple(simplify_index(i, rng) for i in index))


def infer_size(size: Sequence[int], numel: int) -> tuple[int, ...]:
    size = [int(s) for s in size]
    if size.count(-1) > 1:
        raise CoilError(f"view: only one dimension can be -1, got {size}")
    if -1 in size:
        known = 1
        for s in size:
            if s != -1:
                known *= s
        size[size.index(-1)] = numel // known if known else 0
    prod = 1
    for s in size:
        prod *= s
    if prod != numel:
        raise CoilError(f"view: shape {size} is invalid for input of size {numel}")
    return tuple(size)


@register_lowering(aten.view, aten.reshape, aten._unsafe_view, aten.view_copy, aten._reshape_alias)
def view(ctx: LowerCtx, x: TensorValue, size: Sequence[int], *rest: Any) -> TensorValue:
    out = infer_size(size, x.numel())
    if out == x.size:
        return _view(ctx, x, out, xsyms(len(out)))
    flat = flatten(xsyms(len(out)), out)
    return _view(ctx, x, out, unflatten(flat, x.size))


@register_lowering(aten.permute)
def permute(ctx: LowerCtx, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [normalize_dim(d, x.ndim) for d in dims]
    xs = xsyms(x.ndim)
    index: list[sympy.Expr] = [sympy.Integer(0)] * x.ndim
    for i, d in enumerate(dims):
        index[d] = xs[i]
    return _view(ctx, x, [x.size[d] for d in dims], index)


@register_lowering(aten.transpose)
def transpose(ctx: LowerCtx, x: TensorValue, d0: int, d1: int) -> TensorValue:
    dims = list(range(x.ndim))
    if x.ndim:
        a, b = normalize_dim(d0, x.ndim), normalize_dim(d1, x.ndim)
        dims[a], dims[b] = dims[b], dims[a]
    return permute(ctx, x, dims)


@register_lowering(aten.t)
def t(ctx: LowerCtx, x: TensorValue) -> TensorValue:
    return transpose(ctx, x, 0, 1) if x.ndim == 2 else permute(ctx, x, list(range(x.ndim)))


@register_lowering(aten.expand)
def expand(ctx: LowerCtx, x: TensorValue, size: Sequence[int], *, implicit: bool = False) -> TensorValue:
    size = list(size)
    lead = len(size) - x.ndim
    if lead < 0:
        raise CoilError(f"expand: {list(size)} has fewer dims than {list(x.size)}")
    out = [x.size[i - lead] if (s == -1 and i >= lead) else int(s) for i, s in enumerate(size)]
    xs = xsyms(len(out))
    index: list[sympy.Expr] = []
    for i, s in enumerate(x.size):
        o = out[lead + i]
        if s == 1 and o != 1:
            index.append(sympy.Integer(0))
        elif s == o:
            index.append(xs[lead + i])
        else:
            raise CoilError(f"expand: cannot expand {list(x.size)} to {out}")
    return _view(ctx, x, out, index)


@register_lowering(aten.unsqueeze)
def unsqueeze(ctx: LowerCtx, x: TensorValue, dim: int) -> TensorValue:
    dim = normalize_dim(dim, x.ndim + 1)
    out = list(x.size[:dim]) + [1] + list(x.size[dim:])
    xs = xsyms(len(out))
    return _view(ctx, x, out, [xs[i] for i in range(len(out)) if i != dim])


@register_lowering(aten.squeeze)
def squeeze(ctx: LowerCtx, x: TensorValue, dims: Any = None) -> TensorValue:
    if dims is None:
        drop = {i for i, s in enumerate(x.size) if s == 1}
    else:
        ds = [dims] if isinstance(dims, int) else list(dims)
        drop = {normalize_dim(d, x.ndim) for d in ds if x.ndim and x.size[normalize_dim(d, x.ndim)] == 1}
    out = [s for i, s in enumerate(x.size) if i not in drop]
    xs = iter(xsyms(len(out)))
    index = [sympy.Integer(0) if i in drop else next(xs) for i in range(x.ndim)]
    return _view(ctx, x, out, index)


@register_lowering(aten.slice)
def slice_(ctx: LowerCtx, x: TensorValue, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    n = x.size[dim]
    begin, stop, stride = slice(start, end, step).indices(n)
    length = len(range(begin, stop, stride))
    out = list(x.size)
    out[dim] = length
    xs = xsyms(len(out))
    index = list(xs)
    index[dim] = begin + stride * xs[dim]
    return _view(ctx, x, out, index)


@register_lowering(aten.select)
def select(ctx: LowerCtx, x: TensorValue, dim: int, index: int) -> TensorValue:
    dim = normalize_dim(dim, x.ndim)
    n = x.size[dim]
    if not -n <= index < n:
        raise CoilError(f"select: index {index} out of range for size {n}")
    out = [s for i, s in enumerate(x.size) if i != dim]
    xs = iter(xsyms(len(out)))
    idx = [sympy.Integer(index % n) if i == dim else next(xs) for i in range(x.ndim)]
    return _view(ctx, x, out, idx)


@register_lowering(aten.alias, aten.detach, aten.lift_fresh)
def alias(ctx: LowerCtx, x: TensorValue) -> TensorValue:
    return _view(ctx, x, x.size, xsyms(x.ndim))


@register_lowering(aten.split, aten.split_with_sizes)
def split(ctx: LowerCtx, x: TensorValue, sizes: Any, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = normalize_dim(dim, x.ndim)
    n = x.size[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)] or [0]
    outs = []
    start = 0
    for s in sizes:
        outs.append(slice_(ctx, x, dim, start, start + s, 1))
        start += s
    return tuple(outs)


@register_lowering(aten.unbind)
def unbind(ctx: LowerCtx, x: TensorValue, dim: int = 0) -> tuple[TensorValue, ...]:
    dim = normalize_dim(dim, x.ndim)
    return tuple(select(ctx, x, dim, i) for i in range(x.size[dim]))
