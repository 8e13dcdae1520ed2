"""2-D tiles for pointwise kernels that read some input along the other axis
(x + y.t()): which split of the flat range into rows x columns makes every access
coalesced along its own contiguous axis.  The kernel then runs yindex [YBLOCK, 1]
by xindex [1, XBLOCK] on a 2-D grid (ir/kernel.py: Tiled), and Triton picks a
layout per access and converts between them."""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

import sympy

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import Load, indirect_loads, loads, xsyms
from coil.ir.indexing import simplify_index, unflatten
from coil.ir.kernel import XINDEX, YINDEX, KernelNode, Tiled
from coil.ir.layout import Layout
from coil.options import TileTraits
from coil.passes.kernel_model import offset_step


def tiled_map(b: ComputedBuffer, tile: Tiled) -> dict[sympy.Symbol, sympy.Expr]:
    """b's loop symbols as expressions of (yindex, xindex)."""
    rng = tile.ranges
    return {s: simplify_index(e, rng) for s, e in zip(xsyms(len(b.ranges)), unflatten(tile.flat(), b.ranges))}


def store_offset(b: ComputedBuffer, tile: Tiled, m: Mapping[sympy.Symbol, sympy.Expr] | None = None) -> sympy.Expr:
    """Where b's element (yindex, xindex) lies in its buffer (`m`: b's tiled_map,
    where the caller has it already)."""
    m = tiled_map(b, tile) if m is None else m
    return simplify_index(b.layout.offset_of(xsyms(len(b.ranges))).xreplace(m), tile.ranges)


def _down_columns(dy: sympy.Expr, dx: sympy.Expr) -> bool:
    return bool(dy == 1 and dx != 1 and dx != 0)


def contiguous_axis(off: sympy.Expr) -> str | None:
    """Along which axis of the tile an access, as an offset over (yindex, xindex),
    is contiguous: "x" (along the rows), "y" (down the columns: the transposed
    read of x + y.t()), or None (neither: a broadcast or a strided access)."""
    dy, dx = offset_step(off, YINDEX), offset_step(off, XINDEX)
    if dx == 1:
        return "x"
    return "y" if _down_columns(dy, dx) else None


def load_order(nodes: Sequence[KernelNode], layouts: Mapping[str, Layout]) -> tuple[Load, ...]:
    """A tiled kernel's loads from memory (each once, first-read order), those
    contiguous along its first store's axis (x when it has none) first, those
    along neither axis next and those along the other axis last.  Triton computes
    in the layout of the last load and converts the earlier ones to it, so
    x + y.t() in this order converts x to y's layout and the sum back for its
    store: two shared-memory round trips a tile against one the other way round;
    yet this order ran faster on the H200 (bench/probes/tile_load_order.py), so it
    is kept."""
    axis = next((contiguous_axis(n.store) or "x" for n in nodes if n.store is not None), "x")
    inside = {n.name for n in nodes}
    found = dict.fromkeys(ld for n in nodes for ld in loads(n.body) if ld.name not in inside)

    def key(ld: Load) -> int:
        along = contiguous_axis(layouts[ld.name].offset_of(ld.index))
        return 1 if along is None else (0 if along == axis else 2)

    return tuple(sorted(found, key=key))


def tiling(nodes: Sequence[ComputedBuffer], layouts: Mapping[str, Layout], stored: Collection[str],
           numel: int, traits: TileTraits) -> Tiled | None:
    """The 2-D tiling of a pointwise kernel of `numel` elements, or None.

    A split of the flat range into rows x cols is taken when, under it, some
    access steps 1 along the rows but not along the columns (it reads
    transposed) while another steps 1 along the columns: a 1-D block would read
    one of them with a stride.  Candidate splits are the suffix products of the
    first node's ranges (its dimension boundaries).  The tile is transposed
    (xindex along the rows) when the kernel's first store is contiguous down the
    columns and the columns' blocks fit on grid axis 1, and when the rows' blocks
    do not fit there (axis 0 has no such limit); a split whose rows and columns
    both overflow axis 1 is not taken."""
    if numel == 0 or any(b.is_reduction or indirect_loads(b.body) for b in nodes):
        return None
    inside = {b.name for b in nodes}
    most = traits.max_grid_y * traits.min_side
    cands: list[int] = []
    acc = 1
    for size in reversed(nodes[0].ranges[1:]):
        acc *= int(size)
        cands.append(acc)
    for cols in cands:
        rows = numel // cols
        tall, wide = rows > most, cols > most
        if cols < traits.min_side or rows < traits.min_side or numel % cols or (tall and wide):
            continue
        tile = Tiled(rows, cols)
        rng = tile.ranges
        steps: list[tuple[sympy.Expr, sympy.Expr]] = []
        store_steps: list[tuple[sympy.Expr, sympy.Expr]] = []
        for b in nodes:
            m = tiled_map(b, tile)
            offs = [layouts[ld.name].offset_of(ld.index).xreplace(m) for ld in loads(b.body)
                    if ld.name not in inside and ld.name in layouts]
            for off in offs:
                off = simplify_index(off, rng)
                steps.append((offset_step(off, YINDEX), offset_step(off, XINDEX)))
            if b.name in stored:
                off = store_offset(b, tile, m)
                store_steps.append((offset_step(off, YINDEX), offset_step(off, XINDEX)))
        steps += store_steps
        transposed = any(_down_columns(dy, dx) for dy, dx in steps)
        along = any(dx == 1 for _, dx in steps)
        if transposed and along:
            down = bool(store_steps) and _down_columns(*store_steps[0])
            return Tiled(rows, cols, tall or (down and not wide))
    return None
