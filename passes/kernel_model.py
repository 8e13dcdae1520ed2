"""What a fused kernel means, shared by fuse (legality), plan_memory (which buffers
stay in registers), schedule_kernels (parameters, roles and kernel coordinates) and
the C++ backend's loop nests.

A kernel iterates `xindex` over `numel` and, for reduction kernels, `rindex` over
`rnumel`.  Each node in it takes one of three roles:

    reduction  group (numel, rnumel): x* = unflatten(xindex, ranges),
               r* = unflatten(rindex, reduction_ranges)
    outer      a pointwise node with numel elements: x* = unflatten(xindex, ranges);
               runs once per xindex (after the reductions it reads); in a pointwise
               kernel (rnumel 1) with a walk_order, its dims are unflattened in that
               order (its memory order: `walk_dims`)
    inner      a pointwise node with numel * rnumel elements:
               x* = unflatten(xindex * rnumel + rindex, ranges); runs per (xindex, rindex);
               with an inner_order, its dims are unflattened in that order

A load inside the kernel of a buffer that the kernel itself writes is served from
registers; fuse admits a pair only when that load's position, in kernel
coordinates, is exactly the producer's store position (`same_position`).  An
indirect load reads a position known only at run time: its buffer is never
written by the same kernel.
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping, Sequence

import sympy

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import Load, indirect_loads, loads, rsyms, xsyms
from coil.ir.fused import FusedKernel
from coil.ir.indexing import numel, simplify_index, unflatten
from coil.ir.kernel import RINDEX, XINDEX, Param, ParamRole, Role, group_ranges
from coil.ir.layout import Layout
from coil.ir.schedule import ScheduleGraph, WeakDep
from coil.ir.shapes import EMPTY, ShapeInfo, Size, gt, is_size_symbol, is_static, le, lower_bound, same_size
from coil.options import ColumnTraits, SplitTraits


def kernel_ranges(group: tuple[int, int]) -> dict[sympy.Symbol, int]:
    return group_ranges(group)


def splits_rows(group: tuple[int, int], splits: SplitTraits, row_min: int = 0) -> bool:
    """Whether a reduction kernel of this group is one of few rows long enough to
    split over many programs (at least `row_min` long too): it does when it reads
    each row once (passes/schedule/split.py); one that needs a second pass over its
    rows runs one program a row."""
    rows, rnumel = group
    if not isinstance(rows, int) or not isinstance(rnumel, int):
        return False  # symbolic: one program a row, right for every size
    return rnumel >= max(row_min, splits.row_min) and rows <= splits.max_rows


def node_role(b: ComputedBuffer, group: tuple[int, int]) -> Role | None:
    """reduction | outer | inner, or None when the buffer cannot run in this group."""
    n, r = group
    if b.is_reduction:
        return Role.REDUCTION if same_size(numel(b.ranges), n) and same_size(numel(b.reduction_ranges), r) else None
    size = numel(b.ranges)
    if same_size(size, n):
        return Role.OUTER
    if not le(r, 1) and same_size(size, n * r):  # (rows of u0 elements, u0 maybe 0 or 1: inner all the same)
        return Role.INNER
    return None


def walk_dims(b: ComputedBuffer, group: tuple[Size, Size]) -> tuple[int, ...]:
    """The order in which a pointwise kernel's flat xindex walks b's dims (outermost
    first): its walk_order where b is a pointwise node of a pointwise kernel (the
    outer role, rows of one element), else its own order."""
    return _outer_order(b, group) or tuple(range(len(b.ranges)))


def unflatten_walked(flat: sympy.Expr, ranges: Sequence[Size], order: Sequence[int]) -> tuple[sympy.Expr, ...]:
    """Each dim's index (in the dims' own order) where `flat` walks `ranges` with
    dim order[0] outermost and order[-1] innermost."""
    at = dict(zip(order, unflatten(flat, tuple(ranges[d] for d in order))))
    return tuple(at[d] for d in range(len(ranges)))


def walked_ranges(b: ComputedBuffer, group: tuple[Size, Size]) -> tuple[Size, ...]:
    """b's ranges in the order the kernel walks them (walk_dims)."""
    return tuple(b.ranges[d] for d in walk_dims(b, group))


def var_map(b: ComputedBuffer, group: tuple[int, int]) -> dict[sympy.Symbol, sympy.Expr]:
    """The node's loop symbols as expressions of xindex / rindex."""
    return dict(_var_map(node_role(b, group), b.ranges, b.reduction_ranges, group, b.inner_order,
                         _outer_order(b, group)))


def _outer_order(b: ComputedBuffer, group: tuple[Size, Size]) -> tuple[int, ...]:
    """b's walk_order where it applies in this group (a pointwise kernel: rows of one
    element), else ()."""
    return b.walk_order if b.walk_order and not b.is_reduction and group[1] == 1 else ()


# var_map and store_position are pure functions of a node's ranges (and layout) and
# the group; fuse, plan_memory and schedule_kernels ask them the same many times
# (MobileNetV2's training graphs: 3977 var_maps, 1.5 s of sympy, before they were kept)
@functools.lru_cache(maxsize=8192)
def _var_map(role: Role | None, ranges: tuple[Size, ...], reduction_ranges: tuple[Size, ...],
             group: tuple[int, int], inner_order: tuple[int, ...] = (), walk_order: tuple[int, ...] = ()
             ) -> tuple[tuple[sympy.Symbol, sympy.Expr], ...]:
    rng = kernel_ranges(group)
    xs = xsyms(len(ranges))
    if role is Role.OUTER and walk_order:  # a pointwise kernel walks it in memory order
        return tuple((s, simplify_index(e, rng)) for s, e in zip(xs, unflatten_walked(XINDEX, ranges, walk_order)))
    if role is Role.INNER:
        flat: sympy.Expr = XINDEX * group[1] + RINDEX
    else:
        flat = XINDEX
    if role is Role.INNER and inner_order:  # its dims walked in that order
        return tuple((s, simplify_index(e, rng)) for s, e in zip(xs, unflatten_walked(flat, ranges, inner_order)))
    m = {s: simplify_index(e, rng) for s, e in zip(xs, unflatten(flat, ranges))}
    if role is Role.REDUCTION:
        rs = rsyms(len(reduction_ranges))
        m.update({s: simplify_index(e, rng) for s, e in zip(rs, unflatten(RINDEX, reduction_ranges))})
    return tuple(m.items())


def store_position(b: ComputedBuffer, group: tuple[int, int]) -> sympy.Expr:
    return _store_position(node_role(b, group), b.layout, b.ranges, b.reduction_ranges, group, b.inner_order,
                           _outer_order(b, group))


@functools.lru_cache(maxsize=8192)
def _store_position(role: Role | None, layout: Layout, ranges: tuple[Size, ...], reduction_ranges: tuple[Size, ...],
                    group: tuple[int, int], inner_order: tuple[int, ...] = (), walk_order: tuple[int, ...] = ()
                    ) -> sympy.Expr:
    m = dict(_var_map(role, ranges, reduction_ranges, group, inner_order, walk_order))
    return simplify_index(layout.offset_of(xsyms(len(ranges))).xreplace(m), kernel_ranges(group))


def load_position(ld: Load, layout: Layout, m: Mapping[sympy.Symbol, sympy.Expr], group: tuple[int, int]) -> sympy.Expr:
    return simplify_index(layout.offset_of(ld.index).xreplace(dict(m)), kernel_ranges(group))


def reads_in_registers(consumer: ComputedBuffer, producer: ComputedBuffer, group: tuple[int, int]) -> bool:
    """Every load of `producer` in `consumer` hits the element the producer computes
    at the same kernel position (so the value can come from registers)."""
    if node_role(consumer, group) is None or node_role(producer, group) is None:
        return False
    if any(ld.name == producer.name for ld in indirect_loads(consumer.body)):
        return False
    want = store_position(producer, group)
    m = var_map(consumer, group)
    for ld in loads(consumer.body):
        if ld.name == producer.name and load_position(ld, producer.layout, m, group) != want:
            return False
    # an outer node cannot feed an inner or reduction node of the same row unless the
    # reduction dimension is trivial: its value is per-xindex, fine; inner -> outer
    # would need a value per rindex, which an outer node cannot see.
    pr, cr = node_role(producer, group), node_role(consumer, group)
    if pr is Role.INNER and cr is Role.OUTER:
        return False
    return True


def offset_step(off: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    """How far one step of index `sym` moves an access, an offset over a kernel's
    index symbols (from the origin, every index at 0); with symbolic strides an
    expression of the size symbols, which stay as they are (a stride s1: s1)."""
    zero = {s: 0 for s in off.free_symbols if not is_size_symbol(s)}
    return sympy.expand(off.xreplace({**zero, sym: 1}) - off.xreplace(zero))


def unit_step(step: sympy.Expr | int, shapes: ShapeInfo = EMPTY) -> bool:
    """A step of 1 for every size: 1 itself, or an expression the ranges pin to 1."""
    return bool(step == 1) or (isinstance(step, sympy.Expr) and not step.is_number and shapes.known_eq(step, 1))


def moving_step(step: sympy.Expr | int, shapes: ShapeInfo = EMPTY) -> bool:
    """A step that is neither 0 nor 1 for every size (an access that strides): a
    number other than those, or an expression proved past 1 (a stride s1: at
    least 2 for every size, without the ranges too; a data-dependent u0 may be 0
    or 1, and is not)."""
    if isinstance(step, int) or step.is_number:
        return bool(step != 1 and step != 0)
    least = lower_bound(step)
    return (least is not None and least > 1) or shapes.known_gt(step, 1)


Steps = Iterable[tuple[sympy.Expr | int, sympy.Expr | int]]


def down_columns(reads: Steps, stores: Steps, run: int, traits: ColumnTraits) -> bool:
    """The one rule, on every target, of a reduction down the columns of what it
    reads (x.sum(0) of a row-major x, a bias's gradient: each kernel row is a
    column in memory).  `reads` and `stores` are the (x-step, r-step) of each read
    from outside the kernel and of each store, how far one step of the kernel's x
    and of its r moves it in memory; `run` is how many x steps in a row stay
    contiguous.  It does when the run is at least traits.run_min, some read steps
    1 along x and moves along r, and no read (nor store, where traits.stores_count)
    steps 1 along r while moving along x: a per-row vector (x-step 0, r-step 1:
    the same for every column, layer_norm's mean and rstd in its weight's
    gradient, m in (a * m).sum(0) with m of shape (rows, 1)) does not count.
    Triton asks it of the flat xindex / rindex (reads_down_columns), the C++
    target of its nest's innermost x and r loops (passes/schedule/threads.py)."""
    if run < traits.run_min:
        return False
    along_row = [*reads, *stores] if traits.stores_count else reads
    if any(dr == 1 and dx != 0 for dx, dr in along_row):
        return False
    return any(dx == 1 and dr != 0 for dx, dr in reads)


def reduces(group: tuple[Size, Size], shapes: ShapeInfo = EMPTY) -> bool:
    """Whether a group's rows hold more than one element (a symbolic row: at its hint)."""
    return gt(group[1], 1) if is_static(group) else shapes.hint(group[1]) > 1


def reads_down_columns(nodes: Sequence[ComputedBuffer], layouts: Mapping[str, Layout],
                       group: tuple[Size, Size], traits: ColumnTraits, shapes: ShapeInfo = EMPTY) -> bool:
    """down_columns of a reduction kernel's flat xindex / rindex, Triton's: the
    steps of every read from outside the kernel by its reduction and inner nodes,
    and xindex as one run of numel (a block of columns a program loads along it,
    whatever runs the layout cuts it in); no stores (Triton's traits count none).
    Such a kernel reads coalesced only with a block of neighbouring columns a
    program; one column a program reads one element of every 32-byte sector it
    fetches.  With symbolic sizes the steps are expressions of the size symbols (a
    stride s1), and the run and the row's length are judged at the hints: a block of
    columns a program is right for every size, as a row a program is."""
    if not reduces(group, shapes):
        return False
    inside = {b.name for b in nodes}
    steps: list[tuple[sympy.Expr, sympy.Expr]] = []
    for b in nodes:
        if node_role(b, group) not in (Role.REDUCTION, Role.INNER):
            continue
        m = var_map(b, group)
        for ld in loads(b.body):
            if ld.name in inside or ld.name not in layouts:
                continue
            off = load_position(ld, layouts[ld.name], m, group)
            steps.append((offset_step(off, XINDEX), offset_step(off, RINDEX)))
    assert not traits.stores_count, "reads_down_columns gathers no stores"
    return down_columns(steps, (), group[0] if isinstance(group[0], int) else shapes.hint(group[0]), traits)


def kernel_layouts(g: ScheduleGraph) -> dict[str, Layout]:
    """Every input's and buffer's layout, by name."""
    return {b.name: b.layout for b in (*g.graph.inputs, *g.graph.buffers) if b.layout is not None}


def kernel_params(kernel: FusedKernel, g: ScheduleGraph, removed: frozenset[str]) -> tuple[Param, ...]:
    """The kernel's parameters: its read_writes minus buffers kept in registers.
    Reads from outside come first (in_ptrN), then writes (out_ptrN)."""
    inside = set(kernel.nodes)
    reads: list[str] = []
    writes: list[str] = []
    for name in kernel.nodes:
        node = g.node(name)
        for d in node.read_writes.sorted_reads():
            if isinstance(d, WeakDep) or d.name in inside or d.name in removed:
                continue
            if d.name not in reads:
                reads.append(d.name)
        for d in node.read_writes.sorted_writes():
            if d.name not in removed and d.name not in writes:
                writes.append(d.name)
    params = [Param(n, ParamRole.IN, f"in_ptr{i}") for i, n in enumerate(reads)]
    params += [Param(n, ParamRole.OUT, f"out_ptr{i}") for i, n in enumerate(writes)]
    return tuple(params)


def kernel_buffers(kernel: FusedKernel, g: ScheduleGraph) -> tuple[ComputedBuffer, ...]:
    out = []
    for n in kernel.nodes:
        b = g.graph.get(n)
        assert isinstance(b, ComputedBuffer)
        out.append(b)
    return tuple(out)
