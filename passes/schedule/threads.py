"""How a kernel's loop nest shares out its work, on a target whose traits ask for
loop nests (TargetTraits.nests: the C++ target, OpenMP threads and `omp simd`
vector lanes).  Each decision reads the nest (passes/schedule/nest.py) and the
reads from memory in its loop variables, and becomes a value of the spec:

- the nest itself (LoopNest: its x and r loop sizes, and the nodes' bodies and
  stores in its loop variables, which the renderer spells);
- a reduction down the columns of what it reads (x.sum(0)) runs a block of
  `lanes` neighbouring columns together (Rows.lanes): the innermost x loop walks
  memory while the innermost r loop strides it.  The rule is Triton's too,
  kernel_model.down_columns, asked here of the steps of the reads and stores
  along the innermost x and r loops (Triton asks it of the flat xindex /
  rindex), with the C++ target's ColumnTraits: some read steps 1 along x and
  moves along r, and no read or store steps 1 along r while moving along x.  A
  vector the same for every column does not count (m in (a * m).sum(0) with m
  of shape (rows, 1), layer_norm's mean and rstd in its weight's gradient: each
  lane reads the same element of it); a store along the row does (the lanes
  would scatter it, one row a lane; Triton's traits count no stores); and the
  contiguous run, the innermost x loop, must be at least run_min (8) long (x.sum(1)
  of a (40, 50, 4) tensor: xindex steps 1, but in runs of 4, so it runs on rows
  here and on blocks of columns on Triton, whose traits ask a run of 1);
- a reduction of fewer than `split_below_rows` rows of at least
  `parallel_min_work` elements splits each row among threads (Split, even:
  the outer r loop dealt out in `split_parts` parts);
- a pointwise kernel that reads some input along an outer loop while its
  innermost loop strides it (x + y.t()) runs those two loops in `tile` x `tile`
  tiles, the transposed reads staged (NestTile; with symbolic sizes too, the
  strides proved for every size, the loops' lengths judged at the hints); else
  its innermost loop is cut into blocks of `block` when the loops outside it are
  too few to share (fewer than `block_below` iterations);
- the outer loops run in parallel (Parallel) when the kernel does at least
  `parallel_min_work` element-iterations, in about `parallel_chunks` dynamic
  chunks.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import attrs
import sympy

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import loads
from coil.ir.kernel import KernelSpec, LoopNest, NestNode, NestTile, Parallel, Rows, Split, StagedRead
from coil.ir.layout import Layout
from coil.ir.indexing import FloorDiv
from coil.ir.shapes import EMPTY, ShapeInfo, is_static, norm
from coil.options import ColumnTraits, NestTraits
from coil.passes.kernel_model import down_columns, moving_step, unit_step
from coil.passes.schedule.nest import Nest, NodeIndexing, affine_coeffs, kernel_nest, loop_index, size_coeffs


def nested(spec: KernelSpec, bufs: Sequence[ComputedBuffer], layouts: Mapping[str, Layout],
           removed: frozenset[str], traits: NestTraits, columns: ColumnTraits,
           shapes: ShapeInfo = EMPTY) -> KernelSpec:
    """The spec with its loop nest and the decisions made on it (the space's lanes
    or split, a tile or blocks, parallel loops); `columns`: the target's traits of
    kernel_model.down_columns."""
    stored = {b.name for b in bufs if b.name not in removed}
    nest, nodes = kernel_nest(bufs, spec.group, dict(layouts), stored, shapes)
    xsizes = tuple(d.size for d in nest.xdims)
    rsizes = tuple(d.size for d in nest.rdims)
    in_loops = tuple(NestNode(nd.buf.name, nd.body, nd.store if nd.buf.name in stored else None) for nd in nodes)
    par: Parallel | None
    if not is_static((*xsizes, *rsizes)):
        # symbolic sizes: loops to run-time bounds, no splits; a reduction down
        # columns in lanes where every read's and store's steps are numbers or
        # strides the ranges prove above 1 (a block's lanes end at the run's end);
        # a pointwise kernel's transposed read in tiles (their ragged edges run
        # plain loops, whatever the sizes), its innermost loop in blocks where the
        # loops outside are few at the hints; threads share the outer loops where
        # the work at the hints is enough
        tile = None
        if not nest.rdims:
            tile = transposed_tile(nest, outside_loads(nodes, layouts, nest.ranges), traits, shapes)
        if tile is not None:
            return attrs.evolve(spec, nest=LoopNest(xsizes, rsizes, 0, tile, tiled_parallel(nest, tile, traits, shapes),
                                                    in_loops))
        if nest.rdims:
            hinted = tuple(shapes.hint(s) for s in rsizes)
            lanes, space = 0, spec.space
            if isinstance(space, Rows) and nest.xdims:
                stores = [nd.store for nd in nodes if nd.buf.name in stored and nd.store is not None]
                lanes = column_lanes(nest, outside_loads(nodes, layouts, nest.ranges), stores, traits, columns,
                                     shapes)
                if lanes:
                    space = attrs.evolve(space, columns=True, lanes=lanes)
            parts = split_parts(nest, traits, shapes) if isinstance(space, Rows) and not lanes else 0
            if parts:  # a long row shared among threads, its parts judged at the hints
                n, r = spec.group
                chunk = norm(FloorDiv(rsizes[0] + parts - 1, parts) * math.prod(rsizes[1:]))
                space = Split(n, r, parts, chunk, 1, False, (), even=True)
                run = -(-hinted[0] // parts)
                rblock = sum_block(bufs, hinted, run, False, traits, split=True, symbolic=True)
                return attrs.evolve(spec, space=space, nest=LoopNest(
                    xsizes, rsizes, parallel=parallel(1, parts, traits), nodes=in_loops, rblock=rblock))
            rblock = sum_block(bufs, hinted, hinted[0], bool(lanes), traits, symbolic=True)
            return attrs.evolve(spec, space=space, nest=LoopNest(
                xsizes, rsizes, parallel=_symbolic_parallel(nest, shapes, traits, lanes), nodes=in_loops,
                rblock=rblock))
        block = pointwise_block(nest, traits, shapes)
        return attrs.evolve(spec, nest=LoopNest(xsizes, rsizes, block,
                                                parallel=pointwise_parallel(nest, block, traits, shapes),
                                                nodes=in_loops))
    reads = outside_loads(nodes, layouts, nest.ranges)
    if not nest.rdims:
        tile = transposed_tile(nest, reads, traits)
        block = 0 if tile is not None else pointwise_block(nest, traits)
        par = tiled_parallel(nest, tile, traits) if tile is not None else pointwise_parallel(nest, block, traits)
        return attrs.evolve(spec, nest=LoopNest(xsizes, rsizes, block, tile, par, in_loops))
    space = spec.space
    rows = isinstance(space, Rows)  # a flat kernel's reductions over at most one element run on rows
    stores = [nd.store for nd in nodes if nd.buf.name in stored and nd.store is not None]
    lanes = column_lanes(nest, reads, stores, traits, columns) if rows else 0
    parts = split_parts(nest, traits) if rows and not lanes else 0
    if isinstance(space, Rows) and lanes:
        space = attrs.evolve(space, columns=True, lanes=lanes)
    if parts:
        n, r = spec.group
        chunk = -(-rsizes[0] // parts) * math.prod(rsizes[1:])
        space = Split(n, r, parts, chunk, 1, False, (), even=True)
        par = parallel(1, parts, traits)
    else:
        par = row_parallel(nest, lanes, traits)
    run = -(-rsizes[0] // parts) if parts else rsizes[0]  # what one r loop walks
    rblock = sum_block(bufs, rsizes, run, bool(lanes), traits, split=bool(parts))
    return attrs.evolve(spec, space=space, nest=LoopNest(xsizes, rsizes, parallel=par, nodes=in_loops,
                                                         rblock=rblock))


def sum_block(bufs: Sequence[ComputedBuffer], rsizes: tuple[int, ...], run: int, lanes: bool,
              traits: NestTraits, split: bool = False, symbolic: bool = False) -> int:
    """LoopNest.rblock where a float sum (or a variance's sum of squares) runs along
    an r loop longer than the block, else 0; with `symbolic` (`rsizes` and `run`
    the hints of symbolic sizes) wherever there is such a sum, since a run may be
    longer than its hint (a block past a row's end is cut at it: a short row is
    one block; without blocks a dynamic x.sum() of 2^22 values of 0.1 was 2.5e-3
    off, relative, where eager is 1.5e-7).  On a row, whose loop `omp simd`
    spreads over vector lanes, NestTraits.sum_block; on a split's part (a few
    long rows shared among threads), NestTraits.split_sum_block; on a row over
    several r loops, steps of the outermost holding about chain ** (2/3) of the
    row's chain (rounded down to a power of two, at least 16).  That chain is the
    row accumulator's: each run of the innermost loop (`omp simd`) ends by adding
    its lanes' partial sums into it one after another, so it adds the innermost
    runs times the lanes they fill (`sum_lanes` at most) values, each lane's own
    chain being only a run's share.  A (15, 26, 2) sum, one add chain of 780
    values, was up to 5.5 float32 ulps off float64 where eager was 0.9 (found by
    `coil fuzz --target cpp`); in blocks of one step, 0.8.  BatchNorm's statistics
    over (N, H, W) of an (8, 16, 4, 4) input, 8 runs of 16 values: GCC filled 16
    lanes of one element each, so the row summed its 128 values one after another
    (the mean 4.0e-5 off where eager's is 9.7e-6, LeViT's training gradients 2.3x
    eager's error); in blocks of 2 steps (a block's sum is double), 1 ulp.  On a column nest,
    where each lane is one column's add chain down the rows, the power of two near
    rows ** (2/3) (at least 16); there the block counts steps of the outermost r
    loop, the rows of the loops inside it each step's.  Why 2/3: a block's chain
    adds values of a block's size and the chain of block sums values up to the
    whole sum's, so an add of the second rounds about rows / block times more; the
    two errors balance where block ** 3 = rows ** 2.  Measured on (65536, 64).sum(0)
    (bench/probes/cpu_sums.py), 0.167 from float64 at blocks of 256 (the square
    root), 0.067 at 1024, eager 0.043."""
    if not traits.sum_block:
        return 0
    inner = math.prod(rsizes[1:])  # the elements (a column nest's rows) a step of the outermost r loop
    if lanes:
        block = max(1, _two_thirds(run * inner, down=False) // inner)
    elif len(rsizes) == 1:
        block = traits.split_sum_block if split and traits.split_sum_block else traits.sum_block
    else:  # a row over several r loops: steps of the outermost, the row's chain of lane folds cut as a column's
        per_step = inner // rsizes[-1] * min(rsizes[-1], traits.sum_lanes)
        block = max(1, _two_thirds(run * per_step, down=True) // per_step)
    if run <= block and not symbolic:
        return 0
    sums = [b for b in bufs if b.reduction_type in ("sum", "welford_m2") and b.layout.dtype.is_floating_point]
    return block if sums else 0


def _two_thirds(n: int, down: bool) -> int:
    """The power of two near n ** (2/3) (rounded down with `down`), at least 16."""
    e = math.log2(max(n, 1)) * 2 / 3
    return 1 << max(4, int(e) if down else round(e))


def _symbolic_parallel(nest: Nest, shapes: ShapeInfo, traits: NestTraits, lanes: int = 0) -> Parallel | None:
    """A reduction's x loops shared among threads, chunked by the hints (the chunk
    is only how the iterations are dealt out; with lanes, the innermost x loop
    counts its blocks)."""
    numel = shapes.hint(math.prod(d.size for d in nest.xdims))
    rnumel = shapes.hint(math.prod(d.size for d in nest.rdims))
    if not nest.xdims or numel <= 1 or numel * max(rnumel, 1) < traits.parallel_min_work:
        return None
    if lanes:
        last = shapes.hint(nest.xdims[-1].size)
        numel = numel // last * -(-last // lanes)
    return parallel(len(nest.xdims), numel, traits)


def outside_loads(nodes: Sequence[NodeIndexing], layouts: Mapping[str, Layout],
                  ranges: dict[sympy.Symbol, int]) -> list[tuple[str, sympy.Expr]]:
    """(buffer, storage offset in loop variables) of every direct load from memory
    (indirect loads have no offset known at compile time); masked loads are left
    out: where their mask is false the offset may lie outside the buffer, so
    nothing may read them whole (a staged tile)."""
    inside = {nd.buf.name for nd in nodes}
    out: dict[tuple[str, sympy.Expr], None] = {}
    for nd in nodes:
        for ld in loads(nd.body):
            if ld.name not in inside and ld.mask is None:
                lay = layouts[ld.name]
                out[(ld.name, loop_index(lay.offset_of(ld.index) - lay.offset, ranges))] = None
    return list(out)


def parallel(loops: int, iterations: int, traits: NestTraits) -> Parallel:
    """The outer `loops` loops (`iterations` in all) in about parallel_chunks dynamic
    chunks: on a shared machine a thread that loses its core for a time slice then
    costs the others a few chunks, not half the work."""
    return Parallel(loops, iterations, max(1, iterations // traits.parallel_chunks))


# ---- reductions ---------------------------------------------------------------------------------


def column_lanes(nest: Nest, reads: Sequence[tuple[str, sympy.Expr]], stores: Sequence[sympy.Expr],
                 traits: NestTraits, columns: ColumnTraits, shapes: ShapeInfo | None = None) -> int:
    """The lanes of a reduction down columns: kernel_model.down_columns of the
    steps of its reads and stores (offsets in the loop variables) along the
    innermost x and r loops, the innermost x loop the contiguous run; 0 when it
    runs on rows.  With `shapes` (symbolic sizes) the run is judged at its hint,
    and a read or store whose steps are not numbers (a stride of a symbolic size)
    keeps the kernel on rows."""
    xs, rs = nest.xdims, nest.rdims
    if not rs:
        return 0
    vx, vr = xs[-1].sym, rs[-1].sym
    offsets = [e for _, e in reads] + list(stores)
    if shapes is not None:
        found = [_symbolic_steps(e, vx, vr, shapes) for e in offsets]
        if any(st is None for st in found):
            return 0
        run = shapes.hint(xs[-1].size)
    else:
        found = [None if c is None else (c[vx], c[vr]) for c in (affine_coeffs(e, (vx, vr)) for e in offsets)]
        run = xs[-1].size
    read_steps = [st for st in found[:len(reads)] if st is not None]
    store_steps = [st for st in found[len(reads):] if st is not None]
    down = down_columns(read_steps, store_steps, run, columns)
    if not down:
        return 0
    return min(traits.lanes, xs[-1].size) if isinstance(xs[-1].size, int) else traits.lanes


def _symbolic_steps(e: sympy.Expr, vx: sympy.Symbol, vr: sympy.Symbol, shapes: ShapeInfo) -> tuple[int, int] | None:
    """An offset's steps along vx and vr where a step may be a symbolic stride: a
    number as it is, a stride the ranges prove above 1 as 2 (down_columns asks only
    whether a step is 0, 1 or neither); None where neither holds."""
    c = size_coeffs(e, (vx, vr))
    if c is None:
        return None
    out = []
    for v in (c[vx], c[vr]):
        if isinstance(v, int):
            out.append(v)
        elif shapes.known_gt(v, 1):
            out.append(2)
        else:
            return None
    return out[0], out[1]


def split_parts(nest: Nest, traits: NestTraits, shapes: ShapeInfo = EMPTY) -> int:
    """Too few rows to share among threads but long rows: the parts each row's
    outer r loop is dealt out in (0: the rows are shared instead).  Symbolic rows
    are judged at their hints where their count is a number (a symbolic count few
    at the hint may be many at a call, each row then a parallel region of parts
    too short to pay for it) and the ranges prove the outer r loop at least 2 (a
    run with fewer steps than parts leaves the extra parts empty)."""
    numel = math.prod(d.size for d in nest.xdims)
    rnumel = shapes.hint(math.prod(d.size for d in nest.rdims))
    outer = nest.rdims[0].size
    if (isinstance(numel, int) and numel < traits.split_below_rows and rnumel >= traits.parallel_min_work
            and shapes.known_ge(outer, 2)):
        return min(traits.split_parts, shapes.hint(outer))
    return 0


def row_parallel(nest: Nest, lanes: int, traits: NestTraits) -> Parallel | None:
    """Every x loop shared among threads (a column reduction's innermost one in
    blocks of its lanes) when there are rows to share and work enough."""
    numel = math.prod(d.size for d in nest.xdims)
    rnumel = math.prod(d.size for d in nest.rdims)
    if numel <= 1 or numel * max(rnumel, 1) < traits.parallel_min_work:
        return None
    last = nest.xdims[-1].size
    iterations = numel if not lanes else numel // last * -(-last // lanes)
    return parallel(len(nest.xdims), iterations, traits)


# ---- pointwise kernels --------------------------------------------------------------------------


def transposed_tile(nest: Nest, reads: Sequence[tuple[str, sympy.Expr]], traits: NestTraits,
                    shapes: ShapeInfo = EMPTY) -> NestTile | None:
    """Tiles when a read's innermost index is strided while one of the outer
    loops walks it contiguously (x + y.t()): the outer loop that most such reads
    walk, by the innermost one.  Symbolic sizes: the strides proved for every
    size (a stride s1 moves), the loops' lengths judged at the hints."""
    dims = nest.xdims
    side = traits.tile
    if len(dims) < 2 or shapes.hint(dims[-1].size) < side:
        return None
    syms = [d.sym for d in dims]
    v = len(dims) - 1
    found: dict[int, list[StagedRead]] = {}
    for name, e in reads:
        c = size_coeffs(e, syms) if shapes else affine_coeffs(e, syms)
        if c is None or not moving_step(c[syms[v]], shapes):
            continue
        for u in reversed(range(v)):
            if unit_step(c[syms[u]], shapes) and shapes.hint(dims[u].size) >= side:
                found.setdefault(u, []).append(StagedRead(name, e, c[syms[v]]))
                break
    if not found:
        return None
    u = max(found, key=lambda k: len(found[k]))
    return NestTile(u, v, side, tuple(found[u]))


def pointwise_block(nest: Nest, traits: NestTraits, shapes: ShapeInfo = EMPTY) -> int:
    """The block the innermost loop is cut into when the loops outside it are too
    few to share among threads (0: not cut).  Symbolic sizes count at their hints:
    the last block ends at the run-time bound, so the cut is right for every size."""
    sizes = [shapes.hint(d.size) for d in nest.xdims]
    return traits.block if sizes[-1] > traits.block and math.prod(sizes[:-1]) < traits.block_below else 0


def pointwise_parallel(nest: Nest, block: int, traits: NestTraits, shapes: ShapeInfo = EMPTY) -> Parallel | None:
    """The loops outside the innermost one, its `omp simd` loop (and its blocks),
    when there are any and work enough (symbolic sizes: at the hints)."""
    sizes = [shapes.hint(d.size) for d in nest.xdims]
    loops = len(sizes) - 1 + (1 if block else 0)
    if not loops or math.prod(sizes) < traits.parallel_min_work:
        return None
    iterations = math.prod(sizes[:-1])
    if block:
        iterations *= -(-sizes[-1] // block)
    return parallel(loops, iterations, traits)


def tiled_parallel(nest: Nest, tile: NestTile, traits: NestTraits, shapes: ShapeInfo = EMPTY) -> Parallel | None:
    """The loops outside the tiles and the two tile loops, collapsed (symbolic
    sizes: their work and chunks at the hints)."""
    sizes = [shapes.hint(d.size) for d in nest.xdims]
    if math.prod(sizes) < traits.parallel_min_work:
        return None
    tiles = math.prod(-(-n // tile.side) if i in (tile.u, tile.v) else n for i, n in enumerate(sizes))
    return parallel(len(sizes), tiles, traits)
