"""Launch configs from the static sizes: the heuristic config each kernel launches
with, the configs autotuning times on a GPU, the tails they may leave, and the
rule (and a sentence) that chose each launch.

Every block size is a power of two.  The limits come from the target's
LaunchTraits (coil/options.py, with the measurements behind Triton's values);
what stays here is the shape of each rule:

    tiled       YBLOCK x XBLOCK tiles up to tile_block a side, 4 warps (8 above
                2048 elements)
    pointwise   XBLOCK up to pointwise_block, a warp per 256 elements, at most 4
    persistent  whole rows, as many as fit persistent_elements (at most
                persistent_rows), a warp per 1024 elements; many rows of
                warp_row_lengths: a row a program on one warp; a chain of
                chain_reductions or more row reductions runs a row a program
                (`chain_config`), so each reduction stays within a few warps
    columns     a block of column_block neighbouring columns, column_elements a step
    reduction   few_rows rows or fewer: steps of few_rows_block, many warps;
                else loop_block-wide steps on about 2 warps, many programs in
                flight; rows of unaligned_rows_min or more whose length is not a
                multiple of 8 take max_warps (they load element by element)
"""

from __future__ import annotations

from typing import Sequence

import attrs

from coil.ir.bounds import runtime_checks
from coil.ir.indexing import FloorDiv
from coil.ir.kernel import KernelLaunch, KernelNode, LaunchConfig, LaunchRule, Split, Tails, Tiled
from coil.ir.shapes import EMPTY, ShapeInfo, Size, is_static, norm
from coil.options import LaunchTraits, SplitTraits


def device_asserts(nodes: Sequence[KernelNode], device: str) -> tuple[str, ...]:
    """The kinds of run-time check a kernel on `device` asserts, in the order
    ("index", "divisor"): an index wherever one is checked; a divisor only off
    the GPU, as eager checks integer division by zero on the CPU and not on CUDA
    (an interpreted kernel on CPU tensors asserts both).  A kernel with any
    launches with its device asserts compiled in (Triton: debug on)."""
    kinds = {c.kind for n in nodes for c in runtime_checks(n.body)}
    cuda = device.startswith("cuda")
    return tuple(kind for kind in ("index", "divisor") if kind in kinds and (kind == "index" or not cuda))


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def ceil_div(a: Size, b: int) -> Size:
    """cdiv of a size that may be symbolic by an int block."""
    if isinstance(a, int):
        return cdiv(a, b)
    return norm(FloorDiv(a + b - 1, b)) if b != 1 else a


def warps(elements: int, most: int = 8) -> int:
    """About 128-512 elements per warp; a power of two."""
    return max(1, min(most, next_power_of_2(elements) // 512))


def chain_config(traits: LaunchTraits, rnumel: int) -> LaunchConfig:
    """One row per program and a warp per 1024 of its elements: each of a long
    chain of dependent row reductions then stays inside a warp or a few, with no
    block-wide barrier."""
    rblock = next_power_of_2(rnumel)
    return LaunchConfig(1, rblock, max(1, min(traits.max_warps, rblock // 1024)))


def heuristic_config(traits: LaunchTraits, kind: str, xnumel: int, rnumel: int, reductions: int = 1) -> LaunchConfig:
    """Block sizes and warps from the sizes (and, for persistent kernels, how many
    row reductions they chain).  Tiled kernels: xnumel is the tile's ynumel (the
    YBLOCK axis), rnumel its xnumel (the XBLOCK axis).  "columns": a looped
    reduction down the columns of what it reads (kernel_model.reads_down_columns)."""
    return _heuristic(traits, kind, xnumel, rnumel, reductions)[0]


def _heuristic(t: LaunchTraits, kind: str, xnumel: int, rnumel: int, reductions: int) -> tuple[LaunchConfig, LaunchRule]:
    x = next_power_of_2(max(xnumel, 1))
    if kind == "tiled":
        yb, xb = min(t.tile_block, x), min(t.tile_block, next_power_of_2(rnumel))
        return LaunchConfig(xb, 0, 4 if yb * xb <= 2048 else 8, yb), LaunchRule.TILED
    if kind == "pointwise":
        xblock = min(t.pointwise_block, max(x, t.min_block))
        return LaunchConfig(xblock, 0, max(1, min(4, xblock // 256))), LaunchRule.POINTWISE
    if kind == "persistent":
        if reductions >= t.chain_reductions:
            return chain_config(t, rnumel), LaunchRule.CHAINED
        rblock = next_power_of_2(rnumel)
        if t.warp_row_lengths[0] <= rblock <= t.warp_row_lengths[1] and xnumel >= t.warp_rows_min:
            return LaunchConfig(1, rblock, 1), LaunchRule.WARP_ROWS
        xblock = max(1, min(x, t.persistent_rows, t.persistent_elements // rblock))
        return LaunchConfig(xblock, rblock, warps(xblock * rblock // 2, t.max_warps)), LaunchRule.PERSISTENT
    if kind == "columns":  # neighbouring columns side by side: coalesced
        xblock = min(x, t.column_block)
        rblock = min(next_power_of_2(rnumel), t.column_elements // xblock)
        return LaunchConfig(xblock, rblock, warps(xblock * rblock)), LaunchRule.COLUMNS
    if x <= t.few_rows:
        rblock = min(t.few_rows_block, next_power_of_2(rnumel))
        return LaunchConfig(1, rblock, warps(rblock, t.max_warps)), LaunchRule.FEW_ROWS
    rblock = min(t.loop_block, next_power_of_2(rnumel))
    xblock = max(1, min(x, t.loop_block // rblock))
    if rnumel >= t.unaligned_rows_min and rnumel % 8:
        return LaunchConfig(xblock, rblock, t.max_warps), LaunchRule.UNALIGNED
    return LaunchConfig(xblock, rblock, warps(xblock * rblock)), LaunchRule.LOOPED


# the configs autotuning times after the heuristic's: (YBLOCK, XBLOCK, warps) of a
# tile, (XBLOCK, warps) of a pointwise kernel, (XBLOCK, RBLOCK, warps) down columns,
# (XBLOCK, RBLOCK) of a looped reduction, each clipped to the sizes
TILED_CANDIDATES = ((32, 32, 4), (64, 64, 4), (64, 64, 8), (32, 128, 4), (128, 32, 4), (64, 128, 8))
POINTWISE_CANDIDATES = ((256, 4), (512, 4), (1024, 4), (1024, 8), (2048, 8))
COLUMN_CANDIDATES = ((32, 64, 4), (64, 32, 4), (32, 128, 8), (64, 64, 8), (16, 128, 4), (128, 16, 4))
PERSISTENT_ROWS = (1, 2, 4, 8, 16, 32, 64)
PERSISTENT_MAX_TILE = 16384
LOOPED_CANDIDATES = ((1, 2048), (1, 1024), (4, 512), (8, 256), (16, 128), (64, 64))


def candidate_configs(traits: LaunchTraits, kind: str, xnumel: int, rnumel: int,
                      reductions: int = 1) -> tuple[LaunchConfig, ...]:
    """A handful of configs to time, the heuristic one first."""
    x = next_power_of_2(max(xnumel, 1))
    out = [heuristic_config(traits, kind, xnumel, rnumel, reductions)]
    if kind == "tiled":
        c = next_power_of_2(rnumel)
        for yb, xb, w in TILED_CANDIDATES:
            out.append(LaunchConfig(min(xb, c), 0, w, max(traits.min_block, min(yb, x))))
    elif kind == "pointwise":
        for xb, w in POINTWISE_CANDIDATES:
            out.append(LaunchConfig(min(xb, max(x, traits.min_block)), 0, w))
    elif kind == "columns":
        r = next_power_of_2(rnumel)
        for xb, rb, w in COLUMN_CANDIDATES:
            out.append(LaunchConfig(min(xb, x), min(rb, r), w))
    elif kind == "persistent":
        rb = next_power_of_2(rnumel)
        for xb in PERSISTENT_ROWS:
            if xb <= x and xb * rb <= PERSISTENT_MAX_TILE:
                out.append(LaunchConfig(xb, rb, warps(xb * rb, traits.max_warps)))
        out.append(chain_config(traits, rnumel))
    else:
        r = next_power_of_2(rnumel)
        for xb, rb in LOOPED_CANDIDATES:
            out.append(LaunchConfig(min(xb, x), min(rb, r), warps(min(xb, x) * min(rb, r))))
    return tuple(dict.fromkeys(out))


def tails(traits: LaunchTraits, kind: str, xnumel: Size, rnumel: Size, reductions: int,
          shapes: ShapeInfo = EMPTY, launched: Sequence[LaunchConfig] = ()) -> Tails:
    """Whether any config a launch may use leaves a partial block of xnumel (outer)
    or rnumel (inner): where none does, that mask is a constant True and Triton
    drops the masking.  Static sizes: the heuristic's config or one autotuning
    tries.  Symbolic sizes: the configs it launches with (`launched`: its launch's,
    and a choice's tiers), as no symbolic kernel is autotuned (its sizes change by
    call); a symbolic size leaves no partial block only where it is a multiple of
    every block for every size (4*s0 of blocks up to 4; s0 rows of XBLOCK 1).
    Tiled kernels: xnumel is ynumel (YBLOCK), rnumel the tile's xnumel (XBLOCK)."""
    if not is_static((xnumel, rnumel)):
        assert launched, f"symbolic sizes {xnumel}, {rnumel}: tails of the configs launched"
        if kind == "tiled":
            return Tails(not all(shapes.known_multiple(xnumel, c.yblock) for c in launched),
                         not all(shapes.known_multiple(rnumel, c.xblock) for c in launched))
        inner = kind == "pointwise" or not all(shapes.known_multiple(rnumel, c.rblock) for c in launched)
        return Tails(not all(shapes.known_multiple(xnumel, c.xblock) for c in launched), inner)
    cfgs = candidate_configs(traits, kind, xnumel, rnumel, reductions)
    if kind == "tiled":
        return Tails(not all(xnumel % c.yblock == 0 for c in cfgs), not all(rnumel % c.xblock == 0 for c in cfgs))
    inner = kind == "pointwise" or not all(rnumel % c.rblock == 0 for c in cfgs)
    return Tails(not all(xnumel % c.xblock == 0 for c in cfgs), inner)


def config_hints(traits: LaunchTraits, kind: str, xnumel: Size, rnumel: Size, shapes: ShapeInfo) -> tuple[int, int]:
    """The sizes a symbolic kernel's config is chosen at: its hints, except that a
    persistent reduction is configured for the longest row its range admits (it
    holds a whole row in one block: a row past the hint's block was cut short), and a
    looped reduction of a fixed few rows (a full reduction: cross_entropy's mean
    over the batch) whose length may pass the hint is configured for rows of
    `few_rows_block` (or its range's bound): its one or few programs do all the
    work, and at a short hint it got one warp looping over a row that grows with
    the batch (64 steps of 256 at 64 times the hint).  Not where the rows are
    symbolic too: a few rows at the hint may be many at run time."""
    xh, rh = shapes.hint(xnumel), shapes.hint(rnumel)
    if kind == "persistent" and not isinstance(rnumel, int) and (up := shapes.upper(rnumel)) is not None:
        return xh, max(rh, up)  # its RBLOCK holds the longest row the range admits (kernel verifier K8)
    if kind == "reduction" and isinstance(xnumel, int) and not isinstance(rnumel, int) and xh <= traits.few_rows:
        up = shapes.upper(rnumel)
        rh = max(rh, traits.few_rows_block if up is None else min(up, traits.few_rows_block))
    return xh, rh


def launch(traits: LaunchTraits, name: str, kind: str, xnumel: Size, rnumel: Size, reductions: int,
           space_tile: Tiled | None, shapes: ShapeInfo = EMPTY) -> KernelLaunch:
    """The one launch of a kernel that is not split: its heuristic config, grid
    and why (kind: the kernel's config kind, KernelSpec.config_kind).  Symbolic
    sizes: the config from their hints, the grid an expression the wrapper
    evaluates once a call."""
    if space_tile is not None:
        return tiled_launch(traits, name, space_tile, shapes)
    if not is_static((xnumel, rnumel)):
        xh, rh = config_hints(traits, kind, xnumel, rnumel, shapes)
        at = launch(traits, name, kind, xh, rh, reductions, None)
        sizes = (xnumel,) if kind == "pointwise" else (xnumel, rnumel)
        longer = "" if rh == shapes.hint(rnumel) else f"; few rows of unbounded length: configured for {rh}"
        return attrs.evolve(at, grid=(ceil_div(xnumel, at.config.xblock), 1, 1), sizes=sizes,
                            why=f"{at.why} (at the hints {shapes.hint(xnumel)}, {shapes.hint(rnumel)}{longer})")
    cfg, rule = _heuristic(traits, kind, xnumel, rnumel, reductions)
    if rule is LaunchRule.POINTWISE:
        why = f"{cfg.xblock} elements a program, {cfg.xblock / (32 * cfg.num_warps):g} a thread"
    elif rule is LaunchRule.CHAINED:
        why = (f"{reductions} chained row reductions (>= {traits.chain_reductions}): one row a program, "
               f"{cfg.num_warps} warp(s), so each reduction stays within few warps")
    elif rule is LaunchRule.PERSISTENT:
        why = f"rows of {rnumel} held in registers, {cfg.xblock} row(s) a program"
    elif rule is LaunchRule.WARP_ROWS:
        lo, hi = traits.warp_row_lengths
        why = (f"{xnumel} rows of {rnumel} (>= {traits.warp_rows_min} rows, RBLOCK {lo}-{hi}): a row a program "
               "on one warp, its reductions warp shuffles alone")
    elif rule is LaunchRule.COLUMNS:
        why = (f"reduced down the columns of what it reads: {cfg.xblock} neighbouring columns a program, "
               f"{cfg.rblock} rows a step")
    else:
        why = f"rows of {rnumel} looped in steps of {cfg.rblock}, {cfg.xblock} row(s) a program"
    sizes = (xnumel,) if kind == "pointwise" else (xnumel, rnumel)
    return KernelLaunch(name, (cdiv(xnumel, cfg.xblock), 1, 1), sizes, cfg, rule, why)


def persistent_tiers(traits: LaunchTraits, first: KernelLaunch, xnumel: Size, rnumel: Size, reductions: int,
                     limit: int, shapes: ShapeInfo) -> tuple[KernelLaunch, ...]:
    """The launches of a choice's persistent variant past its first (`first`, at the
    hint's row): RBLOCK doubled from the first's up to the persistent limit's, each
    configured as the heuristic configures a static row that long (at the rows'
    hint), so a call whose row fits one of them runs the kernel a static graph of
    its sizes would, from the one source: Triton compiles each RBLOCK at its
    first call."""
    out = []
    xh = shapes.hint(xnumel)
    rblock = first.config.rblock * 2
    while rblock < 2 * limit:
        at = launch(traits, first.function, "persistent", xh, rblock, reductions, None)
        out.append(attrs.evolve(at, grid=(ceil_div(xnumel, at.config.xblock), 1, 1), sizes=(xnumel, rnumel),
                                why=f"rows of {rnumel} up to {min(rblock, limit)} held whole, "
                                    f"{at.config.xblock} row(s) a program"))
        rblock *= 2
    return tuple(out)


def tiled_launch(traits: LaunchTraits, name: str, tile: Tiled, shapes: ShapeInfo = EMPTY) -> KernelLaunch:
    """A tiled kernel's launch: column blocks on grid axis 0, row blocks on axis 1
    (sizes ynumel, xnumel).  Symbolic sizes: the config from their hints, the grid
    an expression the wrapper evaluates once a call; a tile whose row blocks may
    pass axis 1's limit (one_axis) has its column blocks times its row blocks on
    axis 0."""
    ny, nx = tile.ynumel, tile.xnumel
    cfg, rule = _heuristic(traits, "tiled", shapes.hint(ny), shapes.hint(nx), 1)
    why = (f"a transposed read: {cfg.yblock}x{cfg.xblock} tiles, each access along its contiguous axis; "
           + ("programs start down the columns, as the output is written" if tile.transposed
              else "programs start along the rows"))
    if is_static((ny, nx)):
        return KernelLaunch(name, (cdiv(nx, cfg.xblock), cdiv(ny, cfg.yblock), 1), (ny, nx), cfg, rule, why)
    xs, ys = ceil_div(nx, cfg.xblock), ceil_div(ny, cfg.yblock)
    grid = (norm(xs * ys), 1, 1) if tile.one_axis else (xs, ys, 1)
    why += f" (at the hints {shapes.hint(ny)}, {shapes.hint(nx)})"
    if tile.one_axis:
        why += "; every block on grid axis 0, as the row blocks may pass axis 1's limit"
    return KernelLaunch(name, grid, (ny, nx), cfg, rule, why)


def combine_name(kernel: str) -> str:
    return f"{kernel}_combine"


# why a split's launches are neither autotuned nor compiled ahead of the first call
SPLIT_FIXED = "its chunks and workspaces are planned for this config; compiled at its first call"

# the elements of partial results one program of a column split's combine holds: its
# block of columns is narrowed to this over its partials, so that the merge of a few
# hundred partials runs on many programs (ResNet's BatchNorm statistics: 64 columns of
# 196 partials each took two programs of 32 x 256, about 5 µs a combine on the H200,
# against 1.4 for Inductor's combines, whose partials are few)
COMBINE_TILE = 1024


def split_launches(name: str, split: Split, rblock: int, traits: SplitTraits) -> tuple[KernelLaunch, ...]:
    """A split reduction's two launches: the partial results of every chunk, then
    their combination, a row (a block of columns) a program; both `fixed`: another
    config would not fit the chunks and workspaces, and the workspaces, which the
    call allocates, are no buffer an ahead-of-time compile knows the dtype of."""
    rows, rnumel = split.xnumel, split.rnumel
    blocks = split.row_blocks()
    if split.xblock > 1:
        why = (f"{rows} columns reduced down {rnumel} rows: {split.parts} programs a block of "
               f"{split.xblock} columns each reduce {split.chunk} rows into workspaces")
        merge = f"one program a block of {split.xblock} columns merges its partials in a fixed order"
    else:
        why = (f"{rows} row(s) (<= {traits.max_rows}) of {rnumel} (>= {traits.row_min}): {split.parts} "
               f"programs a row each reduce {split.chunk} elements into workspaces")
        merge = "one program a row merges its partials in a fixed order"
    combine_rblock = next_power_of_2(split.parts)
    # a narrower block of columns for the merge (a power of two dividing the first
    # launch's, so its rows need a mask only where that launch's do)
    cx = max(1, min(split.xblock, COMBINE_TILE // combine_rblock))
    if cx < split.xblock:
        merge = (f"one program a block of {cx} columns (of the first launch's {split.xblock}) merges its "
                 f"{split.parts} partials a column in a fixed order")
    return (
        KernelLaunch(name, (split.parts, blocks, 1), (rows, rnumel),
                     LaunchConfig(split.xblock, rblock, warps(split.xblock * rblock)), LaunchRule.SPLIT, why,
                     SPLIT_FIXED),
        KernelLaunch(combine_name(name), (-(-rows // cx), 1, 1), (rows, rnumel),
                     LaunchConfig(cx, combine_rblock, warps(cx * combine_rblock)),
                     LaunchRule.COMBINE, merge, SPLIT_FIXED),
    )
