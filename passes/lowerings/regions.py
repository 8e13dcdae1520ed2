"""Ops that assemble a tensor from regions of others: constant_pad_nd, cat,
slice_scatter and select_scatter.  Each is one Pointwise node (so it fuses with
its producers and readers) instead of an Extern call of the aten op.

Every output element takes its value from exactly one source, chosen by where
its index falls: `where(in_region, load(src, shifted index, mask=in_region),
other)`.  No backend evaluates a `where` lazily (Triton's tl.where, the C++
temporaries and torch.where all compute both arms), so the load in the arm that
is not taken carries the arm's own condition as its *mask*: where the mask is
false it touches no memory (Triton masks the lane, C++ guards the read, the
reference interpreter reads nothing) and yields 0.  The shifted index is then the
plain one: along the dim where the region lies, source position
p = (x - offset) / step, affine when step is 1, and exact wherever the mask holds,
which is the only place it must be inside the source.  A region that covers the
whole loop (a crop, an input a cat has alone) needs no mask.

When realize inlines a masked load of a producer (a cat of `-x[..., 32:]`), the
mask goes into every load of the producer's body (ir/expr.py `under_mask`) and
the reader's where on the same condition absorbs the 0 the load would give.
Each element so reads one input of a cat, as Inductor's masked loads do; it
still computes every input's test and (masked) load, so past MAX_CAT_INPUTS
inputs cat stays an Extern.

Sizes and dtypes come from running the aten op on meta tensors, so the result
is eager's by construction (cat's promotion counts the (0,)-shaped inputs it
otherwise skips); an argument eager rejects declines to the Extern, which then
raises eager's error.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from coil.ir.expr import Cast, Constant, Expr, IndexExpr, xsyms
from coil.ir.indexing import FloorDiv, ModularIndexing
from coil.ir.shapes import ShapeInfo, Size, is_static, norm
from coil.passes.lowerings.registry import (
    LowerCtx,
    TensorValue,
    constant,
    is_tensor,
    normalize_dim,
    op,
    register_lowering,
)

aten = torch.ops.aten

# the most (non-empty) inputs a cat reads in one Pointwise: each element reads
# one, but tests and issues a masked load for every one (Inductor's
# max_pointwise_cat_inputs is 8 too)
MAX_CAT_INPUTS = 8


def _meta(target: Any, *args: Any) -> torch.Tensor | None:
    """The op on meta tensors (eager's size and dtype), or None where eager refuses."""
    metas = [[t.meta() for t in a] if isinstance(a, (list, tuple)) and a and is_tensor(a[0])
             else a.meta() if is_tensor(a) else a for a in args]
    try:
        out = target(*metas)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return None
    return out if isinstance(out, torch.Tensor) else None


def shifted(x: sympy.Symbol, offset: int, step: int) -> sympy.Expr:
    """The source position (x - offset) / step: exact (and inside the source)
    where x is in the region, which the load's mask makes the only place it
    is read."""
    return x - offset if step == 1 else FloorDiv(x - offset, step)


def _index_test(name: str, e: sympy.Expr, bound: Size) -> Expr:
    limit = Constant(bound, torch.int64) if isinstance(bound, int) else IndexExpr(bound, torch.int64)
    return op(name, IndexExpr(e, torch.int64), limit)


def _in_range(shapes: ShapeInfo, x: sympy.Symbol, start: Size, stop: Size, extent: Size) -> Expr | None:
    """x in [start, stop), for x in [0, extent), where the bounds are sizes: a test
    on each side the ranges do not prove needless; None when every x is in."""
    tests = []
    if not shapes.known_le(start, 0):
        tests.append(_index_test("ge", x, start))
    if not shapes.known_ge(stop, extent):
        tests.append(_index_test("lt", x, stop))
    return _all(tests)


def _promoted(target: Any, tensors: Sequence[TensorValue], *args: Any) -> torch.dtype | None:
    """The dtype the op gives tensors of these dtypes and ranks (their symbolic
    sizes stand in as 2), or None where eager refuses even that."""
    try:
        return target([t.meta(rank_only=True) for t in tensors], *args).dtype  # type: ignore[no-any-return]
    except (RuntimeError, IndexError, ValueError, TypeError):
        return None


def _all(tests: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for t in tests:
        out = t if out is None else op("logical_and", out, t)
    return out


def _in_slice(x: sympy.Symbol, start: int, length: int, step: int, extent: int) -> Expr | None:
    """x in {start, start + step, ..., start + step * (length - 1)}, for x in
    [0, extent); None when every x is."""
    stop = start + step * (length - 1) + 1
    tests = []
    if start > 0:
        tests.append(_index_test("ge", x, start))
    if stop < extent:
        tests.append(_index_test("lt", x, stop))
    if step > 1 and length > 1:
        tests.append(_index_test("eq", ModularIndexing(x + (step - start % step) % step, 1, step), 0))
    return _all(tests)


def _as(e: Expr, dtype: torch.dtype) -> Expr:
    return e if e.dtype == dtype else Cast(e, dtype)


def _select(cond: Expr | None, a: Expr, b: Expr) -> Expr:
    return a if cond is None else op("where", cond, a, b, dtype=a.dtype)


# ---- constant_pad_nd --------------------------------------------------------------------------


@register_lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx: LowerCtx, x: TensorValue, pad: Sequence[int], value: Any = 0) -> Any:
    """out[.., i_d, ..] = x[.., i_d - lo_d, ..] where that is inside x, else
    `value`.  pad = (lo, hi) of the last dim, then of the one before, ...; a
    negative lo or hi crops."""
    if not isinstance(value, (bool, int, float)):
        return NotImplemented
    if not is_static(x.size):
        return _symbolic_pad(ctx, x, pad, value)
    meta = _meta(aten.constant_pad_nd.default, x, list(pad), value)
    if meta is None:
        return NotImplemented
    size = tuple(meta.shape)
    xs = xsyms(len(size))
    fill = constant(value, x.dtype)
    if x.numel() == 0:
        return ctx.pointwise(size, fill, x.dtype)
    lows = [0] * x.ndim
    for k in range(len(pad) // 2):
        lows[x.ndim - 1 - k] = int(pad[2 * k])
    index = []
    tests: list[Expr] = []
    for d, (lo, n, extent) in enumerate(zip(lows, x.size, size)):
        index.append(shifted(xs[d], lo, 1))
        if lo > 0:
            tests.append(_index_test("ge", xs[d], lo))
        if lo + n < extent:
            tests.append(_index_test("lt", xs[d], lo + n))
    inside = _all(tests)
    return ctx.pointwise(size, _select(inside, x.load(index, inside), fill), x.dtype)


def _symbolic_pad(ctx: LowerCtx, x: TensorValue, pad: Sequence[Any], value: Any) -> Any:
    """constant_pad_nd of a tensor with symbolic sizes by whole-number pads (the
    pads of a model: a convolution's, a length padded by a constant): each dim
    grows by lo + hi; a side tested only where its pad is positive."""
    if len(pad) % 2 or len(pad) // 2 > x.ndim or not all(isinstance(p, int) for p in pad):
        return NotImplemented
    lows, highs = [0] * x.ndim, [0] * x.ndim
    for k in range(len(pad) // 2):
        lows[x.ndim - 1 - k], highs[x.ndim - 1 - k] = int(pad[2 * k]), int(pad[2 * k + 1])
    size = tuple(norm(n + lo + hi) for n, lo, hi in zip(x.size, lows, highs))
    if not all(ctx.sizes.shapes.known_ge(n, 0) for n in size):
        return NotImplemented  # a crop that may pass the size: eager's error, from the Extern
    xs = xsyms(x.ndim)
    tests: list[Expr] = []
    for d, (lo, hi, n) in enumerate(zip(lows, highs, x.size)):
        if lo > 0:
            tests.append(_index_test("ge", xs[d], lo))
        if hi > 0:
            tests.append(_index_test("lt", xs[d], norm(lo + n)))
    inside = _all(tests)
    index = [shifted(xs[d], lo, 1) for d, lo in enumerate(lows)]
    return ctx.pointwise(size, _select(inside, x.load(index, inside), constant(value, x.dtype)), x.dtype)


# ---- cat ---------------------------------------------------------------------------------------


@register_lowering(aten.cat.default)
def cat(ctx: LowerCtx, tensors: Sequence[Any], dim: int = 0) -> Any:
    """A nested where over the position along `dim`: input k serves positions
    [offset_k, offset_k + n_k), the test of its arm and the mask of its read,
    each read cast to the promoted dtype.  Inputs
    eager skips (1-d and empty) take part in the promotion only.  More than
    MAX_CAT_INPUTS inputs decline (module docstring)."""
    if not tensors or not all(is_tensor(t) for t in tensors):
        return NotImplemented
    if not all(is_static(t.size) for t in tensors):
        return _symbolic_cat(ctx, tensors, dim)
    meta = _meta(aten.cat.default, list(tensors), dim)
    if meta is None:
        return NotImplemented
    size, dtype = tuple(meta.shape), meta.dtype
    xs = xsyms(len(size))
    if meta.numel() == 0:
        return ctx.pointwise(size, constant(0, dtype), dtype)
    d = normalize_dim(dim, len(size))
    parts = [t for t in tensors if not (t.ndim == 1 and t.size[0] == 0) and t.size[d] > 0]
    if len(parts) > MAX_CAT_INPUTS:
        return NotImplemented
    body: Expr | None = None
    offset = size[d]
    for t in reversed(parts):  # innermost arm: the last input
        offset -= t.size[d]
        index = list(xs)
        index[d] = shifted(xs[d], offset, 1)
        inside = _in_slice(xs[d], offset, t.size[d], 1, size[d])
        value = _as(t.load(index, inside), dtype)
        body = value if body is None else _select(inside, value, body)
    assert body is not None
    return ctx.pointwise(size, body, dtype)


def _symbolic_cat(ctx: LowerCtx, tensors: Sequence[TensorValue], dim: int) -> Any:
    """cat where a size is symbolic (a sequence that grows, a rotary embedding's
    halves): as the static one, its offsets sizes, each arm's test on the sides
    the ranges do not prove.  Every input has the output's rank (eager's skipped
    1-d empty inputs are static); the other dims are the first input's, which
    Dynamo's trace of the op made the others' too."""
    ndim = tensors[0].ndim
    if ndim == 0 or any(t.ndim != ndim for t in tensors) or len(tensors) > MAX_CAT_INPUTS:
        return NotImplemented
    dtype = _promoted(aten.cat.default, tensors, dim)
    if dtype is None:
        return NotImplemented
    d = normalize_dim(dim, ndim)
    shapes = ctx.sizes.shapes
    parts = [t for t in tensors if not shapes.known_eq(t.size[d], 0)]
    size = list(tensors[0].size)
    size[d] = norm(sum((t.size[d] for t in parts), sympy.Integer(0)))
    xs = xsyms(ndim)
    body: Expr | None = None
    offset: Size = size[d]
    for t in reversed(parts):  # innermost arm: the last input
        offset = norm(offset - t.size[d])
        index = list(xs)
        index[d] = xs[d] - offset
        inside = _in_range(shapes, xs[d], offset, norm(offset + t.size[d]), size[d])
        value = _as(t.load(index, inside), dtype)
        body = value if body is None else _select(inside, value, body)
    if body is None:
        return ctx.pointwise(size, constant(0, dtype), dtype)
    return ctx.pointwise(size, body, dtype)


# ---- slice_scatter, select_scatter -------------------------------------------------------------


@register_lowering(aten.slice_scatter.default)
def slice_scatter(ctx: LowerCtx, x: TensorValue, src: TensorValue, dim: int = 0, start: Any = None,
                  end: Any = None, step: int = 1) -> Any:
    """x with x[.., start:end:step, ..] (along `dim`) replaced by src."""
    if x.ndim and not is_static((*x.size, *src.size, start or 0, end or 0)):
        return _symbolic_slice_scatter(ctx, x, src, dim, start, end, step)
    if _meta(aten.slice_scatter.default, x, src, dim, start, end, step) is None or x.ndim == 0:
        return NotImplemented
    d = normalize_dim(dim, x.ndim)
    xs = xsyms(x.ndim)
    begin, _, stride = slice(start, end, step).indices(x.size[d])
    length = src.size[d]
    if length == 0 or x.numel() == 0:
        return ctx.pointwise(x.size, x.load(xs), x.dtype)
    index = list(xs)
    index[d] = shifted(xs[d], begin, stride)
    cond = _in_slice(xs[d], begin, length, stride, x.size[d])
    return ctx.pointwise(x.size, _select(cond, _as(src.load(index, cond), x.dtype), x.load(xs)), x.dtype)


def _symbolic_slice_scatter(ctx: LowerCtx, x: TensorValue, src: TensorValue, dim: int, start: Any,
                            end: Any, step: int) -> Any:
    """slice_scatter where a size or bound is symbolic, by step 1: the region
    starts at `start` (from the end where negative; the Extern where the ranges
    cannot show it is at least 0) and is as long as src along `dim`, which eager's
    check (run on the trace's fake values, under Dynamo's guards) made the
    slice's clamped length."""
    if step != 1 or src.ndim != x.ndim or x.dtype != src.dtype:
        return NotImplemented
    d = normalize_dim(dim, x.ndim)
    shapes = ctx.sizes.shapes
    begin = norm(0 if start is None else start)
    if isinstance(begin, int) and begin < 0:
        begin = norm(x.size[d] + begin)
    if not shapes.known_le(0, begin):
        return NotImplemented
    stop = norm(begin + src.size[d])
    xs = xsyms(x.ndim)
    index = list(xs)
    index[d] = xs[d] - begin
    cond = _in_range(shapes, xs[d], begin, stop, x.size[d])
    return ctx.pointwise(x.size, _select(cond, _as(src.load(index, cond), x.dtype), x.load(xs)), x.dtype)


@register_lowering(aten.select_scatter.default)
def select_scatter(ctx: LowerCtx, x: TensorValue, src: TensorValue, dim: int, index: int) -> Any:
    """x with x.select(dim, index) replaced by src (which lacks that dim): src's
    index leaves out `dim`, so it is inside src everywhere and needs no mask.
    With symbolic sizes or index: the position from the end where the index is a
    negative number; the Extern where the ranges cannot place it inside."""
    if x.ndim and not is_static((*x.size, index)):
        d = normalize_dim(dim, x.ndim)
        pos = norm(index)
        if isinstance(pos, int) and pos < 0:
            pos = norm(x.size[d] + pos)
        if x.dtype != src.dtype or not (ctx.sizes.shapes.known_le(0, pos)
                                        and ctx.sizes.shapes.known_lt(pos, x.size[d])):
            return NotImplemented
    else:
        if _meta(aten.select_scatter.default, x, src, dim, index) is None or x.ndim == 0:
            return NotImplemented
        d = normalize_dim(dim, x.ndim)
        pos = index % x.size[d]
    xs = xsyms(x.ndim)
    if is_static(x.size) and x.numel() == 0:
        return ctx.pointwise(x.size, x.load(xs), x.dtype)
    value = _as(src.load([s for i, s in enumerate(xs) if i != d]), x.dtype)
    cond = None if x.size[d] == 1 else _index_test("eq", xs[d], pos)
    return ctx.pointwise(x.size, _select(cond, value, x.load(xs)), x.dtype)
