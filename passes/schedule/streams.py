"""Streaming (non-temporal) stores, on a target whose traits ask for them
(TargetTraits.streams: the C++ target).

A pointwise kernel whose compute per element is small (at most `max_cost` in
OP_COST units: one exp is more) is bound by memory.  Each large output of such a
kernel (at least `min_bytes`) that the nest's innermost loop writes contiguously,
in runs of at least `min_run_bytes`, is written with streaming stores: it would
not stay in the cache for a reader anyway, and streaming skips reading each line
into the cache before it is written.  The renderer computes a chunk of the loop
(`chunk_bytes` of the widest streamed dtype; a tiled nest: a whole tile) into a
local buffer, then streams it out, and fences each run (a tile) once it is out:
a run (a tile) of fewer than `min_fenced_bytes` streams nothing, as the fence then
costs more than the cache's read of the lines (a channels-last row of 64 float32
channels: 2.9x slower streamed).  Reduction kernels stream nothing: measured,
their row loops ran slower with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sympy

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import Expr, Op, walk
from coil.ir.kernel import KernelSpec, Streams
from coil.options import StreamTraits
from coil.passes.schedule.nest import affine_coeffs, loop_symbol

# What computing an op costs against a load or an add (1), for choices between
# recomputing and keeping a value, and between compute- and memory-bound kernels.
OP_COST = {
    **dict.fromkeys(["exp", "exp2", "expm1", "log", "log1p", "log2", "sin", "cos", "tan", "tanh", "erf",
                     "sigmoid", "pow"], 8),
    **dict.fromkeys(["truediv", "sqrt", "rsqrt", "reciprocal", "floordiv", "truncdiv", "fmod", "remainder"], 4),
}


def compute_cost(bodies: Iterable[Expr]) -> int:
    """OP_COST of every distinct op of `bodies` (evaluated once each, as a
    renderer's common-subexpression memo does)."""
    seen: set[Expr] = set()
    for b in bodies:
        seen.update(walk(b))
    return sum(OP_COST.get(e.name, 1) for e in seen if isinstance(e, Op))


def streams(spec: KernelSpec, bufs: Sequence[ComputedBuffer], traits: StreamTraits) -> Streams | None:
    """The stored buffers of a memory-bound pointwise kernel that its nest's
    innermost loop (a tiled nest: the tile's inner loop, in runs of the tile's
    side) writes contiguously, and the chunk they are staged in; None when there
    are none."""
    nest = spec.nest
    if nest is None or nest.rsizes or compute_cost(n.body for n in nest.nodes) > traits.max_cost:
        return None
    inner = len(nest.xsizes) - 1 if nest.tile is None else nest.tile.v
    run = nest.xsizes[inner] if nest.tile is None else nest.tile.side
    fenced = run if nest.tile is None else nest.tile.side ** 2  # elements written between fences
    var = loop_symbol("ix", inner)
    out: list[ComputedBuffer] = []
    for b, n in zip(bufs, nest.nodes):
        lay = b.layout
        if n.store is None or lay.nbytes < traits.min_bytes or run * lay.dtype.itemsize < traits.min_run_bytes:
            continue
        if fenced * lay.dtype.itemsize < traits.min_fenced_bytes:  # a fence a short run: slower than caching
            continue
        if _steps_by_one(n.store, var):
            out.append(b)
    if not out:
        return None
    chunk = nest.tile.side ** 2 if nest.tile is not None else \
        max(1, traits.chunk_bytes // max(b.layout.dtype.itemsize for b in out))
    return Streams(tuple(b.name for b in out), chunk)


def _steps_by_one(store: sympy.Expr, var: sympy.Symbol) -> bool:
    c = affine_coeffs(store, (var,))
    return c is not None and c[var] == 1
