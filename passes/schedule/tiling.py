"""2-D tiles for pointwise kernels that read some input along the other axis
(x + y.t()): which split of the flat range into rows x columns makes every access
coalesced along its own contiguous axis.  The kernel then runs yindex [YBLOCK, 1]
by xindex [1, XBLOCK] on a 2-D grid (ir/kernel.py: Tiled), and Triton picks a
layout per access and converts between them.

Symbolic sizes (a graph compiled for every size) tile too.  What a tile means is
decided by proof: a split is taken only where rows x cols is the kernel's range
for every size, an access is along an axis only where its step is 1 for every
size (a stride s1 along the other axis: transposed), and the row blocks stay on
grid axis 1 only where they fit its limit for every size (else the tile's
programs all go on axis 0, Tiled.one_axis).  Whether a tile is worth it and
which way its programs start are speed, decided at the hints, as the static
rule decides them at the sizes."""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

import sympy

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import Load, indirect_loads, loads, xsyms
from coil.ir.indexing import simplify_index
from coil.ir.kernel import XINDEX, YINDEX, KernelNode, Tiled
from coil.ir.layout import Layout
from coil.ir.shapes import EMPTY, ShapeInfo, Size, norm
from coil.options import TileTraits
from coil.passes.kernel_model import moving_step, offset_step, unflatten_walked, unit_step, walk_dims, walked_ranges


def tiled_map(b: ComputedBuffer, tile: Tiled, shapes: ShapeInfo = EMPTY) -> dict[sympy.Symbol, sympy.Expr]:
    """b's loop symbols as expressions of (yindex, xindex)."""
    rng = tile.ranges
    walked = unflatten_walked(tile.flat(), b.ranges, walk_dims(b, (tile.rows * tile.cols, 1)))
    return {s: simplify_index(e, rng, shapes) for s, e in zip(xsyms(len(b.ranges)), walked)}


def store_offset(b: ComputedBuffer, tile: Tiled, m: Mapping[sympy.Symbol, sympy.Expr] | None = None,
                 shapes: ShapeInfo = EMPTY) -> sympy.Expr:
    """Where b's element (yindex, xindex) lies in its buffer (`m`: b's tiled_map,
    where the caller has it already)."""
    m = tiled_map(b, tile, shapes) if m is None else m
    return simplify_index(b.layout.offset_of(xsyms(len(b.ranges))).xreplace(m), tile.ranges, shapes)


def steps(off: sympy.Expr, shapes: ShapeInfo = EMPTY) -> tuple[sympy.Expr, sympy.Expr]:
    """How far one step of yindex and one of xindex move an access (offset_step);
    with symbolic sizes simplified over them (FloorDiv(1, s2) is 0 where s2 is
    at least 2)."""
    out = []
    for sym in (YINDEX, XINDEX):
        step = offset_step(off, sym)
        out.append(step if step.is_number else simplify_index(step, {}, shapes))
    return out[0], out[1]


def _down_columns(dy: sympy.Expr, dx: sympy.Expr, shapes: ShapeInfo = EMPTY) -> bool:
    return unit_step(dy, shapes) and moving_step(dx, shapes)


def contiguous_axis(off: sympy.Expr, shapes: ShapeInfo = EMPTY) -> str | None:
    """Along which axis of the tile an access, as an offset over (yindex, xindex),
    is contiguous: "x" (along the rows), "y" (down the columns: the transposed
    read of x + y.t()), or None (neither: a broadcast or a strided access).  With
    symbolic strides, for every size (without `shapes`: where the size symbols'
    least values prove it)."""
    dy, dx = steps(off, shapes)
    if unit_step(dx, shapes):
        return "x"
    return "y" if _down_columns(dy, dx, shapes) else None


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


def _quotient(numel: Size, cols: Size) -> Size | None:
    """numel / cols where it divides for every size (a product of the sizes
    cols is a product of some of), else None."""
    if isinstance(numel, int) and isinstance(cols, int):
        return None if numel % cols else numel // cols
    num, den = sympy.fraction(sympy.cancel(sympy.sympify(numel) / cols))
    return norm(num) if den == 1 else None


def tiling(nodes: Sequence[ComputedBuffer], layouts: Mapping[str, Layout], stored: Collection[str],
           numel: Size, traits: TileTraits, shapes: ShapeInfo = EMPTY) -> Tiled | None:
    """The 2-D tiling of a pointwise kernel of `numel` elements, or None.

    A split of the flat range into rows x cols is taken when, under it, some
    access steps 1 along the rows but not along the columns (it reads
    transposed) while another steps 1 along the columns: a 1-D block would read
    one of them with a stride.  Candidate splits are the suffix products of the
    first node's ranges in the order the kernel walks them (its dimension
    boundaries; kernel_model.walk_dims).  The tile is transposed
    (xindex along the rows) when the kernel's first store is contiguous down the
    columns and the columns' blocks fit on grid axis 1, and when the rows' blocks
    do not fit there (axis 0 has no such limit); a split whose rows and columns
    both overflow axis 1 is not taken.

    Symbolic sizes: the candidates are the same suffix products, taken where
    they divide the range for every size; the steps are proved for every size;
    the sides' least widths and the overflows above are judged at the hints
    (speed); and the tile's programs all go on grid axis 0 (one_axis) unless its
    row blocks (its ynumel, at least min_side a block) fit axis 1 for every size."""
    if numel == 0 or any(b.is_reduction or indirect_loads(b.body) for b in nodes):
        return None
    inside = {b.name for b in nodes}
    most = traits.max_grid_y * traits.min_side
    cands: list[Size] = []
    acc: Size = 1
    for size in reversed(walked_ranges(nodes[0], (numel, 1))[1:]):
        acc = acc * int(size) if isinstance(acc, int) and isinstance(size, int) else norm(acc * size)
        cands.append(acc)
    for cols in cands:
        rows = _quotient(numel, cols)
        if rows is None or not (shapes.known_ge(rows, 1) and shapes.known_ge(cols, 1)):  # u0 rows may be none
            continue
        tall, wide = shapes.hint(rows) > most, shapes.hint(cols) > most
        if shapes.hint(cols) < traits.min_side or shapes.hint(rows) < traits.min_side or (tall and wide):
            continue
        tile = Tiled(rows, cols)
        rng = tile.ranges
        read_steps: list[tuple[sympy.Expr, sympy.Expr]] = []
        store_steps: list[tuple[sympy.Expr, sympy.Expr]] = []
        for b in nodes:
            m = tiled_map(b, tile, shapes)
            offs = [layouts[ld.name].offset_of(ld.index).xreplace(m) for ld in loads(b.body)
                    if ld.name not in inside and ld.name in layouts]
            for off in offs:
                read_steps.append(steps(simplify_index(off, rng, shapes), shapes))
            if b.name in stored:
                store_steps.append(steps(store_offset(b, tile, m, shapes), shapes))
        every = read_steps + store_steps
        transposed = any(_down_columns(dy, dx, shapes) for dy, dx in every)
        along = any(unit_step(dx, shapes) for _, dx in every)
        if transposed and along:
            down = bool(store_steps) and _down_columns(*store_steps[0], shapes)
            turned = tall or (down and not wide)
            return Tiled(rows, cols, turned, not shapes.known_le(cols if turned else rows, most))
    return None
