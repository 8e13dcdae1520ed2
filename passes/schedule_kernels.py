"""schedule_kernels : MemoryPlan -> KernelProgram

Every decision a fused kernel needs before a backend can spell it, made once, by
one policy, from the target's frozen traits (coil/options.py: TargetTraits):

- each node's role and its body in kernel coordinates (kernel_model.var_map; a
  tiled kernel's yindex, xindex), and where it is stored, if at all;
- the iteration space: flat, tiled (tiling.py: a transposed read), rows held
  whole or looped, down the columns of what it reads (kernel_model
  .down_columns, the rule the C++ target's lanes follow too), or split over
  many programs (split.py);
- the stages: one scope, or outer stages and reduction loops with their
  accumulators, online softmax included (loops.py);
- where the traits ask for a run-time choice (multi_kernel), a looped kernel over
  a symbolic row whose hint fits one tile but whose range does not also gets its
  persistent variant, which a call launches where the row fits (KernelSpec.choice),
  and a symbolic kernel whose offsets fit int32 only at the hints gets int32 index
  math and an int64 twin for the calls where they do not (KernelSpec.wide);
- the launches, their configs and tails, and the rule that chose each (launch.py);
  the kinds of run-time check a kernel asserts on the device, which its launch
  compiles in (launch.py: device_asserts, where the traits have device asserts);
- where the traits issue loads first, the loads from memory each scope issues
  before its arithmetic, in order (loads.py; a tiled kernel's: tiling.py's
  load_order), and every load's offset in kernel coordinates and its tails;
- on a target that runs loop nests, each kernel's nest (nest.py) and how its
  threads and vector lanes share the work: lanes down columns, rows split among
  threads, tiles or blocks, parallel loops (threads.py);
- on such a nest, which outputs are written by streaming stores (streams.py),
  and what a reduction's r-loops keep per row: row scratch arrays, values
  computed once per row and divisions by their reciprocals (rows.py).

A decision whose trait is None (or False) is not made: the C++ target gets no
launches or tails, the Triton target no loop nests, streams or row scratch.
"""

from __future__ import annotations

from typing import Mapping

import attrs
import sympy
import torch

from coil.ir.buffers import ComputedBuffer
from coil.ir.bounds import COMPARISONS, value_among
from coil.ir.expr import Cast, Expr, Op, read_names, rewrite, rsyms, substitute_symbols, walk, xsyms
from coil.ir.fused import FusedKernel, KernelKind
from coil.ir.kernel import (
    RINDEX,
    Choice,
    Flat,
    KernelLaunch,
    KernelNode,
    KernelProgram,
    KernelSpec,
    Param,
    ParamRole,
    Role,
    Split,
    Rows,
    Space,
    Stage,
    Tails,
    Tiled,
    WideIndex,
)
from coil.ir.layout import Layout
from coil.ir.memory import MemoryPlan
from coil.ir.shapes import EMPTY, ShapeInfo, Size, is_size_symbol, is_static, is_unbacked_symbol, symbol_key
from coil.options import Options, TargetTraits
from coil.passes.kernel_model import (
    kernel_buffers,
    kernel_layouts,
    kernel_params,
    node_role,
    reads_down_columns,
    splits_rows,
    store_position,
    var_map,
)
from coil.passes.schedule import lanes, launch, loads, loops, rows, split, streams, threads, tiling, pieces

# index math in int64 from this offset or iteration space on
INT32_LIMIT = 2**31


def schedule_kernels(plan: MemoryPlan, options: Options) -> KernelProgram:
    """One KernelSpec per fused kernel of the plan, in plan order."""
    g = plan.schedule_graph
    layouts = kernel_layouts(g)
    traits = options.traits()
    drop = traits.keeps_float32_between_ops and not options.emulate_precision_casts
    specs = []
    for k in plan.schedule.kernels:
        bufs = kernel_buffers(k, g)
        params = kernel_params(k, g, plan.removed)
        spec = _scheduled(k, bufs, params, layouts, traits, drop, plan)
        if traits.multi_kernel and _may_hold_rows(k, spec, options.persistent_limit(), plan.shapes):
            variant = _scheduled(attrs.evolve(k, name=persistent_name(k.name, traits), kind=KernelKind.PERSISTENT),
                                 bufs, params, layouts, traits, drop, plan)
            # the variant shares the looped kernel's index width (and int64 twin: KernelSpec.wide_twin)
            variant = attrs.evolve(variant, wide_index=spec.wide_index, wide=None)
            spec = attrs.evolve(spec, choice=_choice(spec, variant, traits, options.persistent_limit(), plan.shapes))
        specs.append(spec)
    return KernelProgram(plan, tuple(specs))


def _scheduled(k: FusedKernel, bufs: tuple[ComputedBuffer, ...], params: tuple[Param, ...],
               layouts: Mapping[str, Layout], traits: TargetTraits, drop: bool, plan: MemoryPlan) -> KernelSpec:
    """One kernel's spec with every decision its target's traits ask for."""
    spec = schedule_kernel(k, bufs, params, layouts, traits, drop, plan.shapes)
    if traits.loads_first:
        spec = attrs.evolve(spec, stages=loads.loads_first(spec, layouts), reads=loads.reads(spec, layouts))
    if traits.nests is not None:
        spec = threads.nested(spec, bufs, layouts, plan.removed, traits.nests, traits.columns, plan.shapes)
        if not is_static(k.group):  # symbolic sizes: plain stores, row invariants hoisted, no scratch
            spec = rows.row_work(spec, traits, plan.shapes)
        else:
            if traits.streams is not None:
                spec = attrs.evolve(spec, streams=streams.streams(spec, bufs, traits.streams))
            spec = rows.row_work(spec, traits)
            if traits.lane_tables is not None:
                spec = lanes.invariants(lanes.lane_tables(spec, traits.lane_tables), traits.lane_tables)
            spec = pieces.guards(pieces.pieces(spec, traits.nests.opaque_calls))
    if plan.shapes:
        spec = attrs.evolve(spec, symbols=_symbols_used(spec, layouts))
    return spec


def _may_hold_rows(k: FusedKernel, spec: KernelSpec, limit: int, shapes: ShapeInfo) -> bool:
    """Whether a looped kernel also gets a persistent variant, chosen at run time:
    a reduction along rows in memory (not down columns) over a symbolic row of
    the inputs' sizes (backed symbols: a data-dependent size's hint is a guess)
    whose hint fits one tile (`limit`) but whose range does not (where the range
    fits, fuse made the kernel persistent)."""
    r = k.group[1]
    if isinstance(r, int) or not spec.launches or not isinstance(spec.space, Rows):
        return False
    if not spec.space.looped or spec.space.columns or not _backed(r):
        return False
    return shapes.hint(r) <= limit and not shapes.known_le(r, limit)


def _choice(looped: KernelSpec, persistent: KernelSpec, traits: TargetTraits, limit: int,
            shapes: ShapeInfo) -> Choice:
    """The persistent variant, launched where the row fits one of its launches: its
    own at the hint's RBLOCK and its tiers, RBLOCK doubled up to the persistent
    limit (launch.persistent_tiers); its tails cover them all."""
    n, r = looped.group
    assert traits.launch is not None
    first = persistent.launches[0]
    tiers = launch.persistent_tiers(traits.launch, first, n, r, persistent.reductions, limit, shapes)
    configs = [ln.config for ln in (first, *tiers)]
    persistent = attrs.evolve(persistent, tails=launch.tails(traits.launch, "persistent", n, r, persistent.reductions,
                                                             shapes, configs))
    rblock = min(configs[-1].rblock, limit) if tiers else first.config.rblock
    lo, hi = shapes.bounds(r)
    span = f"[{lo if lo is not None else '?'}, {hi if hi is not None else 'oo'}]"
    held = ", ".join(str(c.rblock) for c in configs)
    why = (f"rows of {r} in {span}, hint {shapes.hint(r)}: the range exceeds the persistent limit {limit}, "
           f"the hint fits one tile; held whole where {r} <= {rblock} (RBLOCK {held}), looped above")
    return Choice(persistent, r, rblock, why, tiers)


def persistent_name(name: str, traits: TargetTraits) -> str:
    """A looped kernel's name with the persistent kernels' prefix (triton_red_fused_..._3:
    triton_per_fused_..._3): unique, as the kernel's number is."""
    looped, held = (traits.prefixes[tuple(KernelKind).index(kind)]
                    for kind in (KernelKind.REDUCTION, KernelKind.PERSISTENT))
    assert name.startswith(looped) and looped != held, f"{name}: no looped kernel's name of this target"
    return held + name[len(looped):]


def schedule_kernel(k: FusedKernel, bufs: tuple[ComputedBuffer, ...], params: tuple[Param, ...],
                    layouts: Mapping[str, Layout], traits: TargetTraits, drop_round_trips: bool,
                    shapes: ShapeInfo = EMPTY) -> KernelSpec:
    """One kernel's spec (drop_round_trips: its bodies keep float32 between ops).
    Symbolic sizes: configs from the hints, tiles where they hold for every size
    (tiling.py), and splits of a symbolic row judged at its hint, its parts a
    number and their chunks an expression (split.py)."""
    n, r = k.group
    static = is_static(k.group)
    stored = {p.name for p in params if p.role is not ParamRole.IN}
    tile = None
    if k.kind is KernelKind.POINTWISE and traits.tiles is not None:
        tile = tiling.tiling(bufs, layouts, stored, n, traits.tiles, shapes)
    nodes = tuple(_node(k, b, tile, b.name in stored, drop_round_trips, shapes) for b in bufs)
    space: Space
    flat: Space = tile if tile is not None else Flat(n, r)
    if k.kind is not KernelKind.REDUCTION and (traits.row_tiles or not any(b.is_reduction for b in bufs)):
        space = flat if k.kind is KernelKind.POINTWISE else Rows(n, r, False)
        return _launched(k, space, params, nodes, loops.single_scope(nodes), layouts, traits, shapes=shapes)
    online = loops.online_sums(nodes) if traits.online_softmax else {}
    stages = loops.looped_stages(nodes, online, traits.two_pass_welford)
    if k.kind is KernelKind.POINTWISE:  # reductions over at most one element, looped all the same
        return _launched(k, flat, params, nodes, stages, layouts, traits, shapes=shapes)
    columns = (traits.column_loop_min is not None
               and reads_down_columns(bufs, layouts, k.group, traits.columns, shapes))
    space = Rows(n, r, True, columns)
    splits = traits.splits
    # a symbolic row is judged at its hint (split.py); a symbolic count of rows never splits
    at_hint = (n, r if isinstance(r, int) else shapes.hint(r))
    if (splits is not None and isinstance(n, int) and n > 0 and (static or _backed(r))
            and (columns or splits_rows(at_hint, splits))):
        plan = split.plan_split(nodes, stages, k.group, columns, splits, shapes)
        if plan is not None:
            return _launched(k, plan.space, params, nodes, stages, layouts, traits, plan.rblock, shapes=shapes)
    return _launched(k, space, params, nodes, stages, layouts, traits, shapes=shapes)


def _backed(r: Size) -> bool:
    """A size whose hint is the inputs' (not a data-dependent size's guess)."""
    return isinstance(r, int) or not any(is_unbacked_symbol(s) for s in r.free_symbols)


def _launched(k: FusedKernel, space: Space, params: tuple[Param, ...], nodes: tuple[KernelNode, ...],
              stages: tuple[Stage, ...], layouts: Mapping[str, Layout], traits: TargetTraits,
              split_rblock: int = 0, shapes: ShapeInfo = EMPTY) -> KernelSpec:
    """The spec with its launches and tails, where the target plans them (none for
    a kernel with nothing to compute)."""
    device = layouts[k.nodes[0]].device
    wide_index, twin = _index_width(k, params, layouts, shapes, traits.multi_kernel)
    spec = KernelSpec(k.name, k.kind, k.group, device, space, params, nodes, stages, wide_index, None, (),
                      asserts=launch.device_asserts(nodes, device) if traits.device_asserts else (), wide=twin)
    lt = traits.launch
    n, r = k.group
    if lt is None or n == 0:
        return spec
    launches: tuple[KernelLaunch, ...]
    match space:
        case Split():
            assert traits.splits is not None
            launches = launch.split_launches(k.name, space, split_rblock, traits.splits)
            tails = Tails(n % space.xblock != 0, True)
        case Tiled():
            launches = (launch.tiled_launch(lt, k.name, space, shapes),)
            tails = launch.tails(lt, "tiled", space.ynumel, space.xnumel, 1, shapes, (launches[0].config,))
        case _:
            kind = spec.config_kind
            launches = (launch.launch(lt, k.name, kind, n, r, spec.reductions, None, shapes),)
            tails = launch.tails(lt, kind, n, r, spec.reductions, shapes, (launches[0].config,))
    return attrs.evolve(spec, tails=tails, launches=launches)


def _index_width(k: FusedKernel, params: tuple[Param, ...], layouts: Mapping[str, Layout], shapes: ShapeInfo,
                 by_call: bool) -> tuple[bool, WideIndex | None]:
    """Whether a kernel's index math is int64, and where it is chosen by call.
    The offsets it computes reach at most its parameters' storage sizes and its
    space; int64 where one may reach 2**31 (INT32_LIMIT): statically, or in the
    symbols' ranges.  Where only the ranges let them (an unbounded batch) and
    every one fits at the hints, a target that chooses kernels by call (`by_call`:
    multi_kernel) gets int32 math and an int64 twin for the calls whose offsets
    do not fit (WideIndex: the offsets to test), as Inductor's int32 indexing
    does behind a guard; other targets keep int64."""
    sizes = [layouts[p.name].storage_size() for p in params]
    space = k.group[0] * (k.group[1] if not isinstance(k.group[1], int) else max(k.group[1], 1))
    values = [*sizes, space]
    if is_static(values):
        return max(values) >= INT32_LIMIT, None  # type: ignore[type-var, operator]
    uppers = [v if isinstance(v, int) else shapes.upper(v) for v in values]
    if all(u is not None and u < INT32_LIMIT for u in uppers):
        return False, None
    if not by_call or any(isinstance(v, int) for v, u in zip(values, uppers) if u is not None and u >= INT32_LIMIT):
        return True, None
    if any(shapes.hint(v) >= INT32_LIMIT for v in values):
        return True, None
    open_ = list(dict.fromkeys(v for v, u in zip(values, uppers) if u is None or u >= INT32_LIMIT))
    # an offset no larger than another of them for every size needs no test of its own
    tested = [v for i, v in enumerate(open_)
              if not any(j != i and _at_most(v, w, shapes) and not (_at_most(w, v, shapes) and j > i)
                         for j, w in enumerate(open_))]
    return False, WideIndex(tuple(tested))


def _at_most(a: Size, b: Size, shapes: ShapeInfo) -> bool:
    """Whether the size a <= b for every size in the ranges: by their difference,
    or where b is a times a factor of at least 1 (s0 <= s0*s1)."""
    if shapes.known_le(a, b):
        return True
    q = sympy.cancel(sympy.sympify(b) / sympy.sympify(a))
    if not q.is_polynomial(*q.free_symbols):
        return False
    lo = shapes.lower(q)
    return lo is not None and lo >= 1


def _symbols_used(spec: KernelSpec, layouts: Mapping[str, Layout]) -> tuple[str, ...]:
    """The size symbols a kernel's code reads (its sizes, indices, the layouts of
    its parameters), `s*` then data-dependent `u*`, each by number: its arguments
    after the pointers.  Launch
    grids are not among them: the wrapper computes those."""
    found: set[sympy.Symbol] = set()

    def visit(v: object) -> None:
        if isinstance(v, sympy.Basic):
            found.update(s for s in v.free_symbols if is_size_symbol(s))
        elif isinstance(v, (tuple, list, frozenset, set)):
            for x in v:
                visit(x)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)
        elif attrs.has(type(v)) and not isinstance(v, KernelLaunch):
            for f in attrs.fields(type(v)):  # type: ignore[arg-type]
                visit(getattr(v, f.name))

    visit(attrs.evolve(spec, launches=()))
    for p in spec.params:
        lay = layouts[p.name]
        visit((lay.size, lay.stride, lay.offset))
    return tuple(s.name for s in sorted(found, key=symbol_key))


def _node(k: FusedKernel, b: ComputedBuffer, tile: Tiled | None, stored: bool, drop: bool,
          shapes: ShapeInfo = EMPTY) -> KernelNode:
    """b in kernel coordinates: its role, body and store position (from the start of
    its buffer's view)."""
    if tile is not None:
        m = tiling.tiled_map(b, tile, shapes)
        role = Role.TILED
        store = tiling.store_offset(b, tile, m, shapes) if stored else None
    else:
        found = node_role(b, k.group)
        assert found is not None, f"{b.name} does not fit {k.name}'s group {k.group}"
        role = found
        m = var_map(b, k.group)
        if k.kind is KernelKind.POINTWISE:  # reductions over <= 1 element: r* = 0
            m = {s: e.xreplace({RINDEX: sympy.Integer(0)}) for s, e in m.items()}
        store = store_position(b, k.group) if stored else None
    body = substitute_symbols(decided_comparisons_folded(b), m)
    if drop:
        body = drop_round_trips(body)
    inside = set(k.nodes)
    deps = tuple(dict.fromkeys(d for d in read_names(b.body) if d in inside and d != b.name))
    return KernelNode(b.name, role, body, b.layout.dtype, b.reduction_type,
                      None if store is None else sympy.expand(store - b.layout.offset), b.origins, deps)


def decided_comparisons_folded(b: ComputedBuffer) -> Expr:
    """b's body with each comparison that is one value over all of b's static
    ranges that constant, and the masks and selects it decides folded: a pad's or a
    stencil's window test `ix1 + 2 >= 1`, `ix1 < 57` for ix1 in [0, 56), which a
    kernel would otherwise compute for every element (Inductor's value ranges drop
    them too).  Proved by interval arithmetic (ir/bounds.py: value_among)."""
    ranges = (*b.ranges, *b.reduction_ranges)
    if not is_static(ranges) or not any(isinstance(e, Op) and e.name in COMPARISONS for e in walk(b.body)):
        return b.body
    spans = {s: (0, int(n)) for s, n in zip((*xsyms(len(b.ranges)), *rsyms(len(b.reduction_ranges))), ranges)}
    return pieces.fold_decided(b.body, lambda c: value_among(c, spans))


def drop_round_trips(body: Expr) -> Expr:
    """float32 -> float16/bfloat16 -> float32 inside a body is the float32 value
    itself (no rounding between fused ops, as Inductor computes them)."""

    def fn(e: Expr) -> Expr | None:
        if (isinstance(e, Cast) and e.dtype == torch.float32 and isinstance(e.arg, Cast)
                and e.arg.dtype in (torch.float16, torch.bfloat16) and e.arg.arg.dtype == torch.float32):
            return e.arg.arg
        return None

    return rewrite(body, fn)
