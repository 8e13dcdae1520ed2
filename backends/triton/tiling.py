"""2-D tiles for pointwise kernels that read some input along the other axis
(x + y.t()): which split of the flat range into rows x columns makes every
access coalesced along its own contiguous axis.  kernel.py emits the tiled kernel
(yindex [YBLOCK, 1] by xindex [1, XBLOCK] on a 2-D grid); Triton then picks a
layout per access and converts between them."""

from __future__ import annotations

from typing import Mapping

import sympy

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import indirect_loads, loads, xsyms
from coil.ir.fused import FusedKernel
from coil.ir.indexing import simplify_index, unflatten
from coil.ir.wrapper import WrapperProgram
from coil.passes.kernel_model import XINDEX, YINDEX, kernel_buffers, kernel_params

MIN_TILE_SIDE = 16  # narrower rows or columns are not worth a 2-D tile
MAX_GRID_Y = 65535  # CUDA's limit on grid dimension 1 (row blocks, at least one row each)


def tiled_map(b: ComputedBuffer, cols: int, rng: Mapping[sympy.Symbol, int]) -> dict[sympy.Symbol, sympy.Expr]:
    """b's loop symbols as expressions of (yindex, xindex) for `cols` columns."""
    flat = YINDEX * cols + XINDEX
    return {s: simplify_index(e, rng) for s, e in zip(xsyms(len(b.ranges)), unflatten(flat, b.ranges))}


def _step(off: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    """How far one step of `sym` moves an access (from the origin)."""
    zero = {YINDEX: 0, XINDEX: 0}
    return sympy.expand(off.xreplace({**zero, sym: 1}) - off.xreplace(zero))


def _down_columns(dy: sympy.Expr, dx: sympy.Expr) -> bool:
    return bool(dy == 1 and dx != 1 and dx != 0)


def contiguous_axis(off: sympy.Expr) -> str | None:
    """Along which axis of the tile an access, as an offset over (yindex, xindex),
    is contiguous: "x" (along the rows), "y" (down the columns: the transposed
    read of x + y.t()), or None (neither: a broadcast or a strided access)."""
    dy, dx = _step(off, YINDEX), _step(off, XINDEX)
    if dx == 1:
        return "x"
    return "y" if _down_columns(dy, dx) else None


def tiling(k: FusedKernel, program: WrapperProgram) -> int | None:
    """The column count of a 2-D tiling of pointwise kernel k, or None.

    A split of the flat range into rows x cols is taken when, under it, some
    access steps 1 along the rows but not along the columns (it reads
    transposed) while another steps 1 along the columns: a 1-D block would read
    one of them with a stride.  Candidate splits are the suffix products of the
    first node's ranges (its dimension boundaries)."""
    if k.kind != "pointwise" or k.group[0] == 0:
        return None
    g = program.plan.schedule.graph
    nodes = kernel_buffers(k, g)
    if any(b.is_reduction or indirect_loads(b.body) for b in nodes):
        return None
    inside = {b.name for b in nodes}
    layouts = {b.name: b.layout for b in (*g.graph.inputs, *g.graph.buffers) if b.layout is not None}
    stored = {p.name for p in kernel_params(k, g, program.plan.removed) if p.role != "in"}
    n = k.group[0]
    cands: list[int] = []
    acc = 1
    for size in reversed(nodes[0].ranges[1:]):
        acc *= int(size)
        cands.append(acc)
    for cols in cands:
        rows = n // cols
        if cols < MIN_TILE_SIDE or rows < MIN_TILE_SIDE or n % cols or rows > MAX_GRID_Y * MIN_TILE_SIDE:
            continue
        rng = {YINDEX: rows, XINDEX: cols}
        steps: list[tuple[sympy.Expr, sympy.Expr]] = []
        for b in nodes:
            m = tiled_map(b, cols, rng)
            offs = [layouts[ld.name].offset_of(ld.index).xreplace(m) for ld in loads(b.body)
                    if ld.name not in inside and ld.name in layouts]
            if b.name in stored:
                offs.append(b.layout.offset_of(xsyms(len(b.ranges))).xreplace(m))
            for off in offs:
                off = simplify_index(off, rng)
                steps.append((_step(off, YINDEX), _step(off, XINDEX)))
        transposed = any(_down_columns(dy, dx) for dy, dx in steps)
        along = any(dx == 1 for _, dx in steps)
        if transposed and along:
            return cols
    return None
