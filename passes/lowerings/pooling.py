"""max_pool2d_with_indices and its backward as Pointwise nodes with the window
unrolled (as Inductor lowers them), so pooling fuses with the convolution's
epilogue before it and with what reads it.

Forward: each output element visits the kernel's kh * kw positions in eager's
order (rows, then columns) and keeps eager's running rule

    take = inside and (val > max or isnan(val) or nothing taken yet)

so ties keep the first maximum, a NaN wins and the last NaN is the one whose
index is kept, and a window of -inf points at its first position inside the
input, exactly as eager's CPU and CUDA kernels do.  Padding is skipped, never
compared.  The index output is h * W + w in the input plane.

Backward: grad_in[h, w] sums grad_out over the outputs whose window may hold
(h, w) and whose saved index is h * W + w: ceil(((k - 1) * d + 1) / s) rows
and as many columns of candidates, each compared with its saved index, visited
in eager's order (so float32 sums are eager's sums).  An index can only equal
(h, w) when its window holds (h, w), so the candidates may be a superset.
Indices that no forward produced (out of any window) add nothing, where eager
would write wherever they point.

Every load stays inside its buffer: the forward reads a window position in
padding through a masked load (nothing read there), the backward reads candidates
outside the output at an index wrapped into range (ModularIndexing) and masks them
off.  The forward's value output keeps its own running maximum, without the index
chain, so an inference graph that reads only the values computes no indices.
Windows of more than MAX_WINDOW positions decline, and stay Externs; so do
non-float dtypes.

In a training step's joint graph on a GPU the op arrives as Inductor's two
low-memory prims (decompositions.low_memory_max_pool): the forward writes int8
window offsets (i * kw + j) where it wrote indices, the backward compares each
candidate's offset with the position's place in its window (index arithmetic, no
index is rebuilt), and the step saves an eighth of the bytes.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import sympy
import torch

from coil.ir.expr import Cast, Expr, IndexExpr, xsyms
from coil.ir.indexing import FloorDiv, ModularIndexing, simplify_index
from coil.passes.lowerings.registry import LowerCtx, TensorValue, constant, op, register_lowering, upcast

aten = torch.ops.aten

# the most kernel positions unrolled into one element's body (Inductor's limit too)
MAX_WINDOW = 25


def _pair(v: Sequence[int] | int, default: Sequence[int] | None = None) -> tuple[int, int] | None:
    v = default if (v is None or (isinstance(v, (list, tuple)) and len(v) == 0)) and default is not None else v
    if isinstance(v, int):
        return (v, v)
    if v is None or len(v) not in (1, 2):
        return None
    return (int(v[0]), int(v[-1]))


def window_params(x: TensorValue | torch.Tensor, kernel: Any, stride: Any, padding: Any, dilation: Any
                  ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]] | None:
    """(kernel, stride, padding, dilation) as pairs, for a float input of 3 or 4 dims
    and a window of at most MAX_WINDOW positions; None where coil does not lower the
    pool (the op stays whole)."""
    k = _pair(kernel)
    if k is None:
        return None
    s, p, d = _pair(stride, k), _pair(padding), _pair(dilation)
    if s is None or p is None or d is None or x.ndim not in (3, 4) or not x.dtype.is_floating_point:
        return None
    if k[0] * k[1] > MAX_WINDOW:
        return None
    return k, s, p, d


def _test(name: str, e: sympy.Expr, bound: int) -> Expr:
    return op(name, IndexExpr(e, torch.int64), constant(bound, torch.int64))


def _tests(e: sympy.Expr, n: int, ranges: dict[sympy.Symbol, int]) -> tuple[int, list[Expr]]:
    """The least value of `e` over the ranges, and the tests of 0 <= e < n that the
    ranges do not prove."""
    lo = e.subs({s: 0 for s in ranges})
    hi = e.subs({s: r - 1 for s, r in ranges.items()}) if all(e.coeff(s) >= 0 for s in ranges) else None
    tests = []
    if lo < 0:
        tests.append(_test("ge", e, 0))
    if hi is None or hi >= n:
        tests.append(_test("lt", e, n))
    return int(lo), tests


def _inside(e: sympy.Expr, n: int, ranges: dict[sympy.Symbol, int]) -> tuple[sympy.Expr, list[Expr]]:
    """An index that equals `e` where 0 <= e < n and stays in [0, n) everywhere,
    and the tests of 0 <= e < n that the ranges do not prove."""
    lo, tests = _tests(e, n, ranges)
    shift = n * (-(-max(0, -lo) // n))
    return simplify_index(ModularIndexing(e + shift, 1, n), ranges), tests


def _all(tests: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for t in tests:
        out = t if out is None else op("logical_and", out, t)
    return out


def _meta(target: Any, *args: Any) -> Any:
    metas = [a.meta() if isinstance(a, TensorValue) else a for a in args]
    try:
        return target(*metas)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return None


def _max_pool(ctx: LowerCtx, x: TensorValue, params: tuple[tuple[int, int], ...], size: tuple[int, ...],
              offsets: bool) -> tuple[TensorValue, TensorValue]:
    """The values and, for each output, the position its value came from: the index
    h * W + w in the input plane, or (`offsets`) the window position i * kw + j as an
    int8 (Inductor's low-memory form, which a training step saves for the backward:
    an eighth of the bytes)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = params
    H, W = x.size[-2:]
    xs = xsyms(len(size))
    lead, oh, ow = list(xs[:-2]), xs[-2], xs[-1]
    acc = upcast(x.dtype)
    best: Expr = constant(float("-inf"), acc)  # the index output's running maximum
    value: Expr = best  # the value output's: the same values, without the index chain
    # the offsets' chain runs in int32, as wide as the float32 values it follows, and is
    # stored as int8
    pos_t = torch.int32 if offsets else torch.int64
    where: Expr = constant(-1, pos_t)
    for i in range(kh):
        h = oh * sh - ph + i * dh
        _, h_tests = _tests(h, H, {oh: size[-2]})
        for j in range(kw):
            w = ow * sw - pw + j * dw
            _, w_tests = _tests(w, W, {ow: size[-1]})
            inside = _all([*h_tests, *w_tests])
            val: Expr = x.load([*lead, h, w], mask=inside)  # padding is never read
            if val.dtype != acc:
                val = Cast(val, acc)
            pos = constant(i * kw + j, pos_t) if offsets else IndexExpr(h * W + w, pos_t)
            larger = op("logical_or", op("gt", val, best), op("isnan", val))
            better = op("logical_or", larger, op("lt", where, constant(0, pos_t)))
            take = better if inside is None else op("logical_and", inside, better)
            best = op("where", take, val, best, dtype=acc)
            where = op("where", take, pos, where, dtype=pos_t)
            # taking the first position of an all -inf window changes no value: the value
            # output needs neither `where` nor the "nothing taken yet" test
            grows = op("logical_or", op("gt", val, value), op("isnan", val))
            value = op("where", grows if inside is None else op("logical_and", inside, grows), val, value, dtype=acc)
    values = ctx.pointwise(size, value, x.dtype)
    if offsets:
        return values, ctx.pointwise(size, Cast(where, torch.int8), torch.int8)
    return values, ctx.pointwise(size, where, torch.int64)


@register_lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx: LowerCtx, x: TensorValue, kernel_size: Any, stride: Any = (),
                            padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> Any:
    params = window_params(x, kernel_size, stride, padding, dilation)
    meta = _meta(aten.max_pool2d_with_indices.default, x, kernel_size, stride, padding, dilation, ceil_mode)
    if params is None or meta is None or meta[0].numel() == 0:
        return NotImplemented
    return _max_pool(ctx, x, params, tuple(meta[0].shape), offsets=False)


# Inductor's prims (torch._inductor.inductor_prims, which AOTAutograd's partitioner
# imports): the joint graph's max_pool2d_with_indices as these two (decompositions.py,
# low_memory_max_pool), so that a training step saves int8 window offsets and the
# backward recomputes the indices from them, fused into its own kernel.
@register_lowering("prims._low_memory_max_pool_with_offsets.default")
def low_memory_max_pool_with_offsets(ctx: LowerCtx, x: TensorValue, kernel_size: Any, stride: Any,
                                     padding: Any, dilation: Any, ceil_mode: bool) -> Any:
    params = window_params(x, kernel_size, stride, padding, dilation)
    meta = _meta(aten.max_pool2d_with_indices.default, x, kernel_size, stride, padding, dilation, ceil_mode)
    if params is None or meta is None or meta[0].numel() == 0 or len(kernel_size) != 2:
        return NotImplemented
    return _max_pool(ctx, x, params, tuple(meta[0].shape), offsets=True)


@register_lowering("prims._low_memory_max_pool_offsets_to_indices.default")
def low_memory_max_pool_offsets_to_indices(ctx: LowerCtx, offsets: TensorValue, kernel_size: Any,
                                           input_size: Any, stride: Any, padding: Any, dilation: Any) -> Any:
    """index = (oh * sh - ph + (o // kw) * dh) * W + ow * sw - pw + (o % kw) * dw for
    the window offset o of output (oh, ow)."""
    if len(kernel_size) != 2 or offsets.ndim not in (3, 4) or not all(isinstance(n, int) for n in offsets.size):
        return NotImplemented
    try:
        k, s, p, d, plane = (_pair(v) for v in (kernel_size, stride, padding, dilation, input_size))
    except TypeError:  # a symbolic size
        return NotImplemented
    if k is None or s is None or p is None or d is None or plane is None:
        return NotImplemented
    (_, kw), (sh, sw), (ph, pw), (dh, dw), (_, W) = k, s, p, d, plane
    xs = xsyms(offsets.ndim)
    oh, ow = xs[-2], xs[-1]

    def times(e: Expr, n: int) -> Expr:
        return e if n == 1 else op("mul", e, constant(n, torch.int64))

    # an offset is never negative (every window holds a position of the input), so
    # C's truncating division is the floor and needs no sign fix-up
    o: Expr = Cast(offsets.load(list(xs)), torch.int64)
    row = op("truncdiv", o, constant(kw, torch.int64)) if kw != 1 else o
    col = op("sub", o, times(row, kw)) if kw != 1 else constant(0, torch.int64)
    h = op("add", IndexExpr(oh * sh - ph, torch.int64), times(row, dh))
    w = op("add", IndexExpr(ow * sw - pw, torch.int64), times(col, dw))
    indices = ctx.pointwise(offsets.size, op("add", times(h, W), w), torch.int64)
    ctx.facts[indices.name] = OffsetIndices(offsets, (k, s, p, d), W)
    return indices


@attrs.frozen
class OffsetIndices:
    """Indices computed from window offsets (LowerCtx.facts): the offsets, the
    window (kernel, stride, padding, dilation) and the input plane's width."""

    offsets: TensorValue
    window: tuple[tuple[int, int], ...]
    width: int


@register_lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(ctx: LowerCtx, grad: TensorValue, x: TensorValue, kernel_size: Any,
                                     stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                                     indices: TensorValue) -> Any:
    params = window_params(x, kernel_size, stride, padding, dilation)
    if (params is None or grad.ndim != x.ndim or indices.size != grad.size or grad.dtype != x.dtype
            or indices.dtype != torch.int64 or x.numel() == 0):
        return NotImplemented
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = params
    H, W = x.size[-2:]
    OH, OW = grad.size[-2:]
    xs = xsyms(x.ndim)
    lead, h, w = list(xs[:-2]), xs[-2], xs[-1]
    acc = upcast(x.dtype)
    total: Expr = constant(0, acc)
    # indices computed from window offsets (the joint graph's low-memory prims): each
    # candidate compares its offset with e's position in its window, index arithmetic
    # alone, rather than turning every offset back into an index
    fact = ctx.facts.get(indices.name)
    offsets = fact.offsets if isinstance(fact, OffsetIndices) and fact.window == params and fact.width == W else None

    def candidates(e: sympy.Symbol, n_in: int, n_out: int, k: int, s: int, p: int, d: int
                   ) -> list[tuple[sympy.Expr, sympy.Expr, list[Expr]]]:
        """The outputs along one dim whose window may hold input position e: from
        the first with o * s >= e + p - (k - 1) * d, each wrapped into [0, n_out),
        with e's position in its window and the tests that it is an output whose
        window starts at or before e (and, dilated, steps onto e)."""
        reach = (k - 1) * d
        m = -(-reach // s) + 1  # keeps the division's numerator >= 0
        first = FloorDiv(e + p - reach + s - 1 + s * m, s) - m
        out = []
        for j in range(-(-(reach + 1) // s)):
            o = first + j
            idx, tests = _inside(o, n_out, {e: n_in})
            if j * s + s - 1 > reach:  # else o * s <= first * s + reach - (s - 1) <= e + p always
                tests.append(op("le", IndexExpr(o * s, torch.int64), IndexExpr(e + p, torch.int64)))
            # e's position in o's window (where the tests hold, 0 <= e + p - o * s <= reach):
            # a dilated window holds e only where d divides that distance (an index
            # compared with e's own needs no such test)
            rel = simplify_index(e + p - o * s, {e: n_in})
            if d != 1 and offsets is not None:
                tests.append(op("eq", IndexExpr(ModularIndexing(rel, 1, d), torch.int64), constant(0, torch.int64)))
                rel = FloorDiv(rel, d)
            out.append((idx, rel, tests))
        return out

    for oh, i, h_tests in candidates(h, H, OH, kh, sh, ph, dh):
        for ow, j, w_tests in candidates(w, W, OW, kw, sw, pw, dw):
            at = [*lead, oh, ow]
            if offsets is not None:
                hit = op("eq", Cast(offsets.load(at), torch.int32), IndexExpr(i * kw + j, torch.int32))
            else:
                hit = op("eq", indices.load(at), IndexExpr(h * W + w, torch.int64))
            cond = _all([*h_tests, *w_tests, hit])
            assert cond is not None
            g: Expr = grad.load(at)
            if g.dtype != acc:
                g = Cast(g, acc)
            total = op("add", total, op("where", cond, g, constant(0, acc), dtype=acc))
    return ctx.pointwise(x.size, total, x.dtype)
