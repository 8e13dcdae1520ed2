"""Split reductions: a reduction of a few long rows (a full sum, a loss's mean,
per-sample norms of a small batch) spread over many programs, then combined.

One program per row is how every other reduction kernel runs; for a kernel with
one long row that leaves one SM doing the work (a latency-bound gather per
element, as cross_entropy's final mean has, is slowest so: bench/probes/README.md).  A kernel of at most `max_rows` rows of at least `row_min` elements
(SplitTraits) runs in two launches: (parts, rows) programs each reduce a chunk of
a row into workspaces, then one program a row combines the row's partial results
and computes the per-row nodes that follow.

A reduction down the columns of what it reads (x.sum(0) of a row-major x:
kernel_model.reads_down_columns) splits the same way, over blocks of
`column_xblock` neighbouring columns instead of single rows, when its columns are
long and its column blocks too few to fill the GPU: each step is then a coalesced
tile of a block of columns.

Only single-loop kernels split: no online softmax, no row-wide value after a
reduction (those need the reduced value back in every program), no max/min of
bools.  The order of the additions is fixed, so results do not vary from run to
run.

With a symbolic row length (a loss's mean over `s0` tokens, `x.sum()` of a
dynamic batch) the split is judged at the hint, as a static one: how many parts
(`parts`, a number, so the grid and the workspaces stay static).  Each part's
chunk is then the row's length over the parts, rounded up to whole steps of
RBLOCK: `RBLOCK * FloorDiv(r + parts*RBLOCK - 1, parts*RBLOCK)`, an expression of
the sizes the kernel computes.  The parts cover every length; a call with a row
shorter than the hint leaves the last parts empty, and their partial results are
the reduction's identity, which the combine merges as it merges masked lanes.
Not for argmax/argmin (an empty part's index would stand beside real ones) nor
rows whose count is symbolic.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import sympy
import torch

from coil.ir.indexing import FloorDiv
from coil.ir.kernel import Loop, Outer, Role, Split, Stage
from coil.ir.kernel import KernelNode
from coil.ir.shapes import EMPTY, ShapeInfo
from coil.options import SplitTraits
from coil.passes.schedule.launch import cdiv, next_power_of_2
from coil.passes.schedule.loops import has_bool_extreme


def result_dtype(reduction_type: str, value: torch.dtype) -> torch.dtype:
    if reduction_type in ("argmax", "argmin"):
        return torch.int64
    if reduction_type in ("any", "all"):
        return torch.bool
    return value


def work_dtype(dt: torch.dtype) -> torch.dtype:
    """bool compares and reduces as int8 (Triton's tl.max has no int1 form)."""
    return torch.int8 if dt == torch.bool else dt


def partial_dtypes(reduction_type: str, dt: torch.dtype) -> list[torch.dtype]:
    """The dtype of each partial result one program stores for the combine: one per
    reduction, three for Welford's mean / M2 / count, two for argmax's value and
    index."""
    match reduction_type:
        case "welford_m2":
            return [dt, dt, dt]
        case "argmax" | "argmin":
            return [work_dtype(dt), torch.int64]
    return [result_dtype(reduction_type, dt)]


@attrs.frozen
class SplitPlan:
    """A split and the RBLOCK of its first launch (its steps along a chunk)."""

    space: Split
    rblock: int


# the reductions a symbolic split may leave parts of empty: their identity merges as nothing
EMPTY_PARTS_MERGE = frozenset({"sum", "prod", "max", "min", "welford_m2"})


def symbolic_chunk(rnumel: sympy.Expr, parts: int, rblock: int) -> sympy.Expr:
    """Each of `parts` programs' share of a symbolic row: whole steps of rblock."""
    return rblock * FloorDiv(rnumel + parts * rblock - 1, parts * rblock)


def plan_split(nodes: Sequence[KernelNode], stages: Sequence[Stage], group: tuple[Any, Any], columns: bool,
               traits: SplitTraits, shapes: ShapeInfo = EMPTY) -> SplitPlan | None:
    """The split of a looped reduction kernel whose rows are few and long (or whose
    columns are long: `columns`), or None when it runs one program a row.  A
    symbolic row is judged at its hint (the module's docstring)."""
    loops = [s for s in stages if isinstance(s, Loop)]
    reds = [n for n in nodes if n.role is Role.REDUCTION]
    if not reds or len(loops) != 1 or loops[0].level != 0 or has_bool_extreme(reds):
        return None
    if any(a.partner is not None or a.second_pass for a in loops[0].accumulators):  # online, or two passes
        return None
    rows, r = group
    if not isinstance(rows, int):
        return None
    if not isinstance(r, int):
        if any(n.reduction_type not in EMPTY_PARTS_MERGE for n in reds):
            return None
        plan = plan_split(nodes, stages, (rows, shapes.hint(r)), columns, traits)
        if plan is None:
            return None
        parts, rblock = plan.space.parts, plan.rblock
        return SplitPlan(attrs.evolve(plan.space, rnumel=r, chunk=symbolic_chunk(r, parts, rblock)), rblock)
    rnumel = r
    # the first launch computes every node of outer stage 0 before its loop
    prelude = next((st.nodes for st in stages if isinstance(st, Outer) and st.level == 0), ())
    workspaces = tuple((n.name, dt) for n in reds for dt in partial_dtypes(n.reduction_type or "", n.body.dtype))
    if columns:
        xblock = min(traits.column_xblock, next_power_of_2(rows))
        rblock = traits.column_xblock * traits.column_rblock // xblock  # narrow blocks take more rows a step
        # at most max_column_parts partials a column: the combine holds XBLOCK x parts of them
        per_block = min(traits.max_column_parts, traits.programs // cdiv(rows, xblock))
        if per_block < 2 or rnumel < traits.column_min:
            return None  # enough column blocks to fill the GPU, or short columns: one loop a block
        chunk = max(rblock, traits.min_column_chunk, next_power_of_2(cdiv(rnumel, per_block)))
        return SplitPlan(Split(rows, rnumel, cdiv(rnumel, chunk), chunk, xblock, True, workspaces, prelude=prelude),
                         rblock)
    per_row = max(1, min(traits.max_parts, traits.programs // rows))
    chunk = max(traits.min_chunk, next_power_of_2(cdiv(rnumel, per_row)))
    return SplitPlan(Split(rows, rnumel, cdiv(rnumel, chunk), chunk, 1, False, workspaces, prelude=prelude),
                     min(chunk, traits.max_rblock))
