"""The KernelProgram's invariants.  An error names the stage, the kernel or node,
and the broken rule (ir/verify.py: fail).

K1 one spec per fused kernel of the plan, in plan order, each of its kernel's
   nodes in the same order
K2 every node sits in exactly one stage, and a stage names only the kernel's nodes
K3 a node's dependencies sit in an earlier stage or come before it in its own (an
   online sum's are its max's: it reads the max's running value, not its body); a
   reduction is read only after the loop that reduces it (two loops for a two-pass
   welford_m2)
K4 a loop computes only nodes of its own or an earlier loop; an outer stage and a
   body only their own nodes
K5 a stored node is a parameter the kernel writes; parameters are named once,
   reads (in_ptrN) before writes (out_ptrN)
K6 every reduction node of a loop has one accumulator there, and only those; an
   online sum's partner is a max accumulator of the same loop that keeps the row max,
   in a floating dtype at least as wide as the max's values (no other accumulator
   names a dtype); only a welford_m2 takes a second pass
K7 the space fits the group and the kind: flat for pointwise (tiled: rows x cols
   = numel), rows (or a split) for reductions, looped ones for a looped reduction
   kernel, a split's parts of `chunk` covering the row (an even split's: K9); rows
   held whole in one body, looped rows and splits in loops (and a flat kernel's
   reductions over at most one element, on a target that loops every row); tiled
   nodes only in a tiled space
K8 a launch has a positive grid and sizes (for every size the ranges admit),
   power-of-two blocks and warps; a split launches twice, anything else once
   (none: nothing to compute, or left to the target's renderer); a persistent
   launch's RBLOCK holds every row (the longest the ranges admit)
K9 a loop nest covers its kernel's group (its x loops' sizes multiply to numel,
   its r loops', if any, to rnumel) and has the kernel's nodes in order; a tile pairs an outer x loop with the
   innermost, both at least the tile's side (at the hints), in a nest without r loops; a space's
   lanes need a nest and at most fill its innermost x loop (a symbolic one's
   blocks end at its end); an even split needs a
   nest, at most as many parts as the outer r loop's steps, and its chunk is the
   most any part reduces; parallel loops exist and their chunks are positive and
   at most their iterations
K10 streams, scratch arrays and hoisted values need a loop nest; a lane table is a
   subtree of a node's body in a nest of static innermost x loop, no r loops and no
   tiles, that reads the innermost loop's variable alone and nothing the kernel
   computes, no indirect load and no check; an invariant is one that reads no loop
   variable, in a static nest with iterations, no r loops and no tiles, and
   divides no integers.  Cuts of the innermost x loop are a static pointwise nest's
   (no r loops, tile, blocks or streams), strictly increasing inside that loop, and
   each comparison of that loop's variable alone is one value in every piece.  Guards
   are a static pointwise nest's of two x loops or more (no r loops, tile, blocks or
   streams), distinct comparisons of its bodies that read outer loop variables alone,
   with at least one version, each a value for every guard, none twice.  Streamed stores
   are a kernel's without r loops, of nodes it stores (parameters it writes), each
   named once, staged in positive chunks.  A scratch array is stored in a loop (a
   Loop stage's level) that computes a node whose body in the nest has its
   subtree, and read by later loops up to `last`, a loop the kernel runs (a Loop
   stage's, or a second pass's); an array's slot is taken again only from the
   last loop that reads it on.  What a loop hoists is, in a loop the kernel runs,
   a subtree of the bodies it computes that does not vary along the row (reads
   no r loop variable and no inner node); a division by a reciprocal is a truediv
   there by such a value, of one that varies
K11 the kinds of check a kernel asserts are "index" then "divisor", each named
   once, each a kind of run-time check its bodies have; a divisor is not asserted
   on a CUDA device (eager does not check it there)
K12 the loads a scope issues first (a Body's, a Loop's) are loads from memory (of
   parameters, not of nodes the kernel computes), each once, of the bodies the
   scope computes (a loop's: not an online sum's), none that an outer stage before
   it computed already; a Body that issues any issues all its bodies' loads; an
   Outer stage issues any only after a split's loop, and then all of them
K13 a kernel's reads, where it has any, are its bodies' loads from memory (of
   parameters, not of nodes it computes), each once; each is masked by the tails
   of the symbols its offset uses (an indirect load's: at least those)
K14 a split's prelude, in kernel order, holds nodes of its outer stage 0, every
   one its loop reads among them (directly or through another); an even split's
   is empty (its nest computes them)
K15 a kernel of several launches (a split) fixes each of them (autotuning and
   compiling ahead take a kernel's one launch)
K16 a choice belongs to a launched looped kernel along rows (not down columns) of a
   symbolic row, and tests that row; its persistent variant has another name than
   every kernel's, the persistent kind, rows held whole, one launch and tiers of
   it (launches of that kernel) whose bounds rise, each no longer than its RBLOCK,
   the last the choice's bound, no choice of its own, and the looped kernel's group,
   device, parameters, nodes (bodies and stores) and size arguments; it keeps
   every rule above
K17 an int64 twin (`wide`) belongs to a symbolic kernel with int32 index math and
   tests offsets that depend on sizes; the twin and its variants are int64 and
   named apart from every kernel; a choice's persistent variant has no twin of its own
"""

from __future__ import annotations

import math

import attrs
import sympy

from coil.ir.bounds import COMPARISONS, comparisons_of, reads_among, value_over
from coil.ir.expr import DIVIDING_OPS, Check, Expr, IndexExpr, IndirectLoad, Load, Op, loads, walk
from coil.ir.fused import KernelKind
from coil.ir.kernel import (
    RINDEX,
    XINDEX,
    YINDEX,
    Body,
    Flat,
    KernelProgram,
    KernelSpec,
    Loop,
    Outer,
    ParamRole,
    Role,
    Rows,
    Split,
    Tiled,
    Update,
    tails_of,
)
from coil.ir.verify import fail
from coil.ir.indexing import FloorDiv
from coil.ir.shapes import ShapeInfo, Size, gt, lower_bound, same_size


_AXES = {"y": YINDEX, "x": XINDEX, "r": RINDEX}


def _even_chunk(s: Split, rsizes: tuple[Size, ...], shapes: ShapeInfo) -> bool:
    """An even split's parts fit its outer r loop and `chunk` is the most a part
    reduces: numbers, or (symbolic sizes) the same expression, parts judged at the
    hints (a run with fewer steps than parts leaves the extra parts empty)."""
    outer, inner = rsizes[0], math.prod(rsizes[1:])
    if isinstance(outer, int) and isinstance(inner, int):
        return s.parts <= outer and s.chunk == -(-outer // s.parts) * inner
    return s.parts <= shapes.hint(outer) and same_size(s.chunk, FloorDiv(outer + s.parts - 1, s.parts) * inner)


def _chunks_cover(s: Split, r: Size, shapes: ShapeInfo, k: KernelSpec) -> bool:
    """A split's parts cover its row, none of them empty; a symbolic row's chunk is
    whole steps of the first launch's RBLOCK, `c * FloorDiv(r + parts*c - 1, parts*c)`
    (the parts cover every length, the last ones empty below the hint: split.py)."""
    if isinstance(r, int):
        return isinstance(s.chunk, int) and s.parts * s.chunk >= r > (s.parts - 1) * s.chunk
    c, rest = sympy.sympify(s.chunk).as_coeff_Mul()
    if not (c.is_Integer and _power_of_2(int(c)) and s.parts <= max(shapes.hint(r), 1)):
        return False
    steps = not k.launches or int(c) % k.launches[0].config.rblock == 0
    return steps and same_size(rest, FloorDiv(r + s.parts * int(c) - 1, s.parts * int(c)))


def _power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def verify_kernel_program(p: KernelProgram, stage: str) -> None:
    kernels = p.kernels
    if tuple(k.name for k in kernels) != tuple(s.name for s in p.specs):
        fail(p, stage, p.specs[0].name if p.specs else "KernelProgram", "K1 specs do not match the plan's kernels")
    for k, spec in zip(kernels, p.specs):
        if tuple(n.name for n in spec.nodes) != k.nodes or spec.group != k.group or spec.kind != k.kind:
            fail(p, stage, spec.name, "K1 nodes, group or kind differ from the fused kernel's")
        _verify_spec(p, stage, spec)
        _verify_choice(p, stage, spec, {s.name for s in p.specs})
        _verify_wide(p, stage, spec, {s.name for s in p.specs})


def _verify_wide(p: KernelProgram, stage: str, k: KernelSpec, names: set[str]) -> None:
    """K17: an int64 twin belongs to a symbolic kernel with int32 index math, tests
    offsets that depend on sizes, and is named apart from every kernel; a
    persistent variant of a choice has no twin of its own (the kernel's covers it)."""
    if k.choice is not None and k.choice.persistent.wide is not None:
        fail(p, stage, k.choice.persistent.name, "K17 a persistent variant with an int64 twin of its own")
    w = k.wide
    if w is None:
        return
    if k.wide_index or not k.symbols or not w.offsets or any(isinstance(e, int) for e in w.offsets):
        fail(p, stage, k.name, f"K17 an int64 twin of a kernel that is not symbolic with int32 index math "
                               f"testing {w.show() or 'nothing'}")
    variants = k.wide_twin().variants
    twins = {v.name for v in variants}
    if twins & names or any(not v.wide_index for v in variants):
        fail(p, stage, k.name, f"K17 its int64 twin {sorted(twins)} shares a kernel's name or is not int64")


def _verify_choice(p: KernelProgram, stage: str, k: KernelSpec, names: set[str]) -> None:
    c = k.choice
    if c is None:
        return
    v = c.persistent
    rows = isinstance(k.space, Rows) and k.space.looped and not k.space.columns
    if not rows or not k.launches or isinstance(k.group[1], int) or not same_size(c.rnumel, k.group[1]):
        fail(p, stage, k.name, f"K16 a choice on a {k.kind} kernel of group {k.group} testing rows of {c.rnumel}")
    held = isinstance(v.space, Rows) and not v.space.looped
    bounds = c.bounds()
    if (v.name in names or v.kind is not KernelKind.PERSISTENT or not held or len(v.launches) != 1
            or v.choice is not None or any(ln.function != v.name for ln in c.tiers)
            or any(b > ln.config.rblock for b, ln in zip(bounds, c.launches))
            or list(bounds) != sorted(set(bounds))):
        fail(p, stage, v.name, f"K16 the persistent variant of {k.name} for rows up to {c.rblock}: not a kernel "
                               f"of its own name whose launches (RBLOCK {[ln.config.rblock for ln in c.launches]}) "
                               f"hold rows up to their rising bounds {list(bounds)} whole")
    for ln in c.tiers:  # each tier keeps the launch rules, for the rows it takes
        _verify_launches(p, stage, attrs.evolve(v, launches=(ln,)), rows_up_to=ln.config.rblock)
    if (v.group, v.device, v.params, v.nodes, v.symbols) != (k.group, k.device, k.params, k.nodes, k.symbols):
        fail(p, stage, v.name, f"K16 computes other nodes, parameters or sizes than {k.name}, its looped variant")
    _verify_spec(p, stage, v, rows_up_to=bounds[0])


def _verify_spec(p: KernelProgram, stage: str, k: KernelSpec, rows_up_to: int | None = None) -> None:
    """rows_up_to: a choice's persistent variant runs only on rows that short (K16)."""
    where: dict[str, int] = {}
    known = {n.name for n in k.nodes}
    for i, st in enumerate(k.stages):
        for name in st.nodes:
            if name not in known:
                fail(p, stage, k.name, f"K2 stage {i} names {name}, no node of it")
            if name in where:
                fail(p, stage, name, f"K2 sits in stages {where[name]} and {i} of {k.name}")
            where[name] = i
    _verify_accumulators(p, stage, k)
    order = {n.name: i for i, n in enumerate(k.nodes)}
    online = {a.node: a.partner for st in k.stages if isinstance(st, Loop) for a in st.accumulators
              if a.update is Update.ONLINE_SUM}
    # the level from which each looped reduction's value is known
    ready = {a.node: st.level + (2 if a.second_pass else 1) for st in k.stages if isinstance(st, Loop)
             for a in st.accumulators}
    for n in k.nodes:
        if n.name not in where:
            fail(p, stage, n.name, f"K2 sits in no stage of {k.name}")
        deps = k.node(online[n.name] or "").deps if n.name in online and online[n.name] in order else n.deps
        for d in deps:
            if d not in where or where[d] > where[n.name] or (where[d] == where[n.name] and order[d] > order[n.name]):
                fail(p, stage, n.name, f"K3 reads {d}, which does not run before it")
            reader = k.stages[where[n.name]]
            if d in ready and isinstance(reader, (Outer, Loop)) and reader.level < ready[d]:
                fail(p, stage, n.name, f"K3 reads {d} in the loop that reduces it")
    _verify_computes(p, stage, k, where)
    writes = [q.name for q in k.params if q.role is ParamRole.OUT]
    if len({q.name for q in k.params}) != len(k.params) or len({q.arg for q in k.params}) != len(k.params):
        fail(p, stage, k.name, "K5 a parameter is named twice")
    if [q.role for q in k.params] != sorted((q.role for q in k.params), key=list(ParamRole).index):
        fail(p, stage, k.name, "K5 a read parameter comes after a written one")
    for n in k.nodes:
        if n.store is not None and n.name not in writes:
            fail(p, stage, n.name, f"K5 stored, but not a parameter {k.name} writes")
    _verify_space(p, stage, k)
    _verify_launches(p, stage, k, rows_up_to)
    _verify_nest(p, stage, k)
    _verify_row_work(p, stage, k)
    _verify_asserts(p, stage, k)
    _verify_loads_first(p, stage, k)
    _verify_prelude(p, stage, k)
    _verify_reads(p, stage, k)


def _verify_computes(p: KernelProgram, stage: str, k: KernelSpec, where: dict[str, int]) -> None:
    for i, st in enumerate(k.stages):
        if not isinstance(st, Loop):
            continue
        for c in st.computes:
            if c not in where or where[c] > i or not isinstance(k.stages[where[c]], Loop):
                fail(p, stage, c, f"K4 computed in loop {st.level} of {k.name}, but not a node of it or an earlier loop")


def _verify_accumulators(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    for st in k.stages:
        if not isinstance(st, Loop):
            continue
        reds = [n for n in st.nodes if k.node(n).role is Role.REDUCTION]
        accs = {a.node: a for a in st.accumulators}
        if sorted(accs) != sorted(reds) or len(accs) != len(st.accumulators):
            fail(p, stage, k.name, f"K6 loop {st.level} accumulates {sorted(accs)}, its reductions are {sorted(reds)}")
        for a in st.accumulators:
            if a.reduction_type != k.node(a.node).reduction_type:
                fail(p, stage, a.node, f"K6 a {a.reduction_type} accumulator of a {k.node(a.node).reduction_type}")
            if a.second_pass and (a.reduction_type != "welford_m2" or a.update is not Update.LANES):
                fail(p, stage, a.node, f"K6 a second pass over the row for a {a.reduction_type} accumulator")
            values = k.node(a.node).body.dtype
            if (a.update is Update.ROW_MAX) != (a.dtype is not None) or (
                    a.dtype is not None and (not a.dtype.is_floating_point or a.dtype.itemsize < values.itemsize)):
                fail(p, stage, a.node, f"K6 a {a.update.value} accumulator kept in {a.dtype} for {values} values")
            if a.update is Update.ONLINE_SUM:
                partner = accs.get(a.partner or "")
                if a.reduction_type != "sum" or partner is None or partner.update is not Update.ROW_MAX:
                    fail(p, stage, a.node, f"K6 an online sum whose partner {a.partner} keeps no row max in its loop")


def _verify_space(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    n, r = k.group
    s = k.space
    looped = isinstance(s, Split) or (isinstance(s, Rows) and s.looped)
    match s:
        case Flat():
            ok = k.kind is KernelKind.POINTWISE and (s.numel, s.rnumel) == (n, r)
        case Tiled():
            ok = (k.kind is KernelKind.POINTWISE and same_size(s.rows * s.cols, n)
                  and all(gt(v, 0) or p.shapes.known_gt(v, 0) for v in (s.rows, s.cols)))
        case Rows():
            # a persistent kernel's rows loop on a target that holds no row in one tile
            ok = k.kind is not KernelKind.POINTWISE and (s.xnumel, s.rnumel) == (n, r) and (s.looped or k.kind is KernelKind.PERSISTENT)
        case Split():
            # an even split's rows are long, whatever the kind (a raised persistent threshold)
            ok = ((k.kind is KernelKind.REDUCTION or (s.even and k.kind is KernelKind.PERSISTENT)) and (s.xnumel, s.rnumel) == (n, r)
                  and s.parts > 0 and _power_of_2(s.xblock)
                  and (s.even or _chunks_cover(s, r, p.shapes, k)))  # an even one's chunk: K9
    if not ok:
        fail(p, stage, k.name, f"K7 a {k.kind} kernel of group {k.group} cannot run on that space")
    for st in k.stages:
        # a flat kernel's reductions over at most one element loop on a target that loops every row
        if (isinstance(st, Body) and looped) or (not isinstance(st, Body) and not looped and not isinstance(s, Flat)):
            fail(p, stage, k.name, f"K7 a {type(st).__name__.lower()} stage in a {'looped' if looped else 'one-scope'} space")
    tiled = isinstance(s, Tiled)
    for node in k.nodes:
        if (node.role is Role.TILED) != tiled:
            fail(p, stage, node.name, f"K7 a {node.role.value} node in a {'tiled' if tiled else 'untiled'} space")


def _launchable(v: Size, shapes: ShapeInfo, empty: bool) -> bool:
    """A grid or size a launch may take: positive for every size the graph's
    ranges admit (a tile's column blocks times its row blocks on one axis, a
    diagonal's length min(16, s0 - 1)), or, where `empty` allows, at least 0 (a
    data-dependent u0, a slice's s0 - 2); a static one positive."""
    if isinstance(v, int) or v.is_number:  # a static one: positive
        return bool(sympy.sympify(v).is_Integer and v > 0)
    if gt(v, 0):
        return True
    least = shapes.lower(v)
    if least is not None and least >= 1:
        return True
    lb = lower_bound(v)
    if lb is None or lb < 0:
        lb = least
    return empty and lb is not None and lb >= 0


def _verify_launches(p: KernelProgram, stage: str, k: KernelSpec, rows_up_to: int | None = None) -> None:
    if not k.launches:
        return
    if k.group[0] == 0:
        fail(p, stage, k.name, "K8 launched with nothing to compute")
    if len(k.launches) != (2 if isinstance(k.space, Split) else 1):
        fail(p, stage, k.name, f"K8 {len(k.launches)} launches for its space")
    if len(k.launches) > 1 and not all(ln.fixed for ln in k.launches):
        fail(p, stage, k.name, f"K15 {len(k.launches)} launches, not all of them fixed")
    persistent = isinstance(k.space, Rows) and not k.space.looped
    for ln in k.launches:
        held = rows_up_to is not None and rows_up_to <= ln.config.rblock
        if persistent and not held and not p.shapes.known_le(k.group[1], ln.config.rblock):
            fail(p, stage, k.name, f"K8 persistent launch of {ln.function}: RBLOCK={ln.config.rblock} does not hold "
                                   f"every row of {k.group[1]}")
        c = ln.config
        blocks = [c.xblock, c.num_warps] + [b for b in (c.rblock, c.yblock) if b]
        # a symbolic grid or size is positive when its least value is (ir/shapes.lower_bound, or over
        # the graph's ranges); a size may be 0 (u0 columns, a slice's s0 - 2: none loaded), and so may
        # the grid where the rows may be (u0 rows: `call` launches under `if u0 > 0`, as it does every
        # kernel whose rows are not provably some, backends/wrapper.py)
        rows_maybe_none = not gt(k.group[0], 0)
        if any(not _launchable(g, p.shapes, rows_maybe_none) for g in ln.grid) \
                or any(not _launchable(v, p.shapes, True) for v in ln.sizes) or not all(map(_power_of_2, blocks)):
            fail(p, stage, k.name, f"K8 launch of {ln.function}: grid {ln.grid}, sizes {ln.sizes}, {c.as_kwargs()}")


def _verify_nest(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    nest, s = k.nest, k.space
    lanes = s.lanes if isinstance(s, Rows) else 0
    even = isinstance(s, Split) and s.even
    if nest is None:
        if lanes or even:
            fail(p, stage, k.name, f"K9 {'lanes' if lanes else 'an even split'} without a loop nest")
        return
    n, r = k.group
    # sizes equal for every size (s0*s1 - s0 is s0*(s1 - 1)): ints compared, expressions expanded
    if (not same_size(math.prod(nest.xsizes), n) or (nest.rsizes and not same_size(math.prod(nest.rsizes), r))
            or not nest.xsizes):
        fail(p, stage, k.name, f"K9 loop nest {list(nest.xsizes)} x {list(nest.rsizes)} does not cover group {k.group}")
    if tuple(nn.name for nn in nest.nodes) != tuple(kn.name for kn in k.nodes):
        fail(p, stage, k.name, f"K9 loop nest's nodes {[nn.name for nn in nest.nodes]} are not the kernel's")
    t = nest.tile
    if t is not None and (nest.rsizes or not 0 <= t.u < t.v == len(nest.xsizes) - 1
                          or min(p.shapes.hint(nest.xsizes[t.u]), p.shapes.hint(nest.xsizes[t.v])) < t.side):
        fail(p, stage, k.name, f"K9 tiles of x loops {t.u} and {t.v}, {t.side} a side, do not fit the nest")
    if lanes and ((isinstance(nest.xsizes[-1], int) and lanes > nest.xsizes[-1]) or not nest.rsizes):
        fail(p, stage, k.name, f"K9 {lanes} lanes, more than the innermost x loop's {nest.xsizes[-1]} columns")
    if isinstance(s, Split) and even and (not nest.rsizes or not _even_chunk(s, nest.rsizes, p.shapes)):
        fail(p, stage, k.name, f"K9 an even split into {s.parts} parts of {s.chunk} does not fit the outer r loop")
    par = nest.parallel
    if par is not None and not (par.loops >= 1 and 1 <= par.chunk <= par.iterations):
        fail(p, stage, k.name, f"K9 {par.loops} parallel loop(s) of {par.iterations} iterations in chunks of {par.chunk}")


def _table_problem(k: KernelSpec) -> str | None:
    """Why the nest's lane tables break K10, or None."""
    nest = k.nest
    if nest is None or not nest.tables:
        return None
    if nest.rsizes or nest.tile is not None or len(nest.xsizes) < 2 or not isinstance(nest.xsizes[-1], int):
        return "lane tables in a nest with r loops, tiles, one loop or a symbolic innermost loop"
    inner = f"ix{len(nest.xsizes) - 1}"
    computed = {n.name for n in nest.nodes}
    subtrees = {s for n in nest.nodes for s in walk(n.body)}
    for t in nest.tables:
        if t not in subtrees:
            return "a lane table that is no subtree of the nest's bodies"
        syms: set[str] = set()
        for s in walk(t):
            if isinstance(s, (IndirectLoad, Check)) or (isinstance(s, Load) and s.name in computed):
                return "a lane table reading a computed value, an indirect load or a check"
            if isinstance(s, Load):
                syms |= {str(v) for i in s.index for v in i.free_symbols}
            elif isinstance(s, IndexExpr):
                syms |= {str(v) for v in s.expr.free_symbols}
        if syms != {inner}:
            return f"a lane table reading loop variables {sorted(syms)}, not the innermost ({inner}) alone"
    return None


def _invariant_problem(k: KernelSpec) -> str | None:
    """Why the nest's invariants break K10, or None."""
    nest = k.nest
    if nest is None or not nest.invariants:
        return None
    if (nest.rsizes or nest.tile is not None or not all(isinstance(s, int) for s in nest.xsizes)
            or math.prod(nest.xsizes) == 0):
        return "invariants in a nest with r loops, tiles, symbolic sizes or no iterations"
    computed = {n.name for n in nest.nodes}
    subtrees = {s for n in nest.nodes for s in walk(n.body)}
    for e in nest.invariants:
        if e not in subtrees:
            return "an invariant that is no subtree of the nest's bodies"
        for s in walk(e):
            if isinstance(s, (IndirectLoad, Check)) or (isinstance(s, Load) and s.name in computed):
                return "an invariant reading a computed value, an indirect load or a check"
            if isinstance(s, Op) and s.name in DIVIDING_OPS and not s.dtype.is_floating_point:
                return f"an invariant dividing integers ({s.name})"
            syms = ({v for i in s.index for v in i.free_symbols} if isinstance(s, Load)
                    else s.expr.free_symbols if isinstance(s, IndexExpr) else set())
            if any(str(v).startswith("ix") for v in syms):
                return f"an invariant reading loop variables {sorted(map(str, syms))}"
    return None


def _cuts_problem(k: KernelSpec) -> str | None:
    """Why the nest's cuts break K10, or None: a static pointwise nest without tiles
    or blocks, cuts strictly inside its innermost loop, in increasing order, and in
    each piece every comparison of that loop's variable alone one value."""
    nest = k.nest
    if nest is None or not nest.cuts:
        return None
    if (nest.rsizes or nest.tile is not None or nest.block or k.streams is not None
            or not all(isinstance(s, int) for s in nest.xsizes)):
        return "cuts in a nest with r loops, a tile, blocks, streams or symbolic sizes"
    n = nest.xsizes[-1]
    bounds = (0, *nest.cuts, n)
    if any(a >= b for a, b in zip(bounds, bounds[1:])):
        return f"cuts {list(nest.cuts)} not increasing inside the innermost loop of {n}"
    sym = sympy.Symbol(f"ix{len(nest.xsizes) - 1}", integer=True, nonnegative=True)
    for c in comparisons_of([nd.body for nd in nest.nodes], sym):
        for a, b in zip(bounds, bounds[1:]):
            if value_over(c, sym, a, b) is None:
                return f"a comparison ({c.name}) of {sym} that varies in piece [{a}, {b})"
    return None


def _guards_problem(k: KernelSpec) -> str | None:
    """Why the nest's guards break K10, or None: a static pointwise nest of two x
    loops or more, without tiles, blocks or streams, each guard a distinct
    comparison of its bodies that reads outer loop variables and nothing else."""
    nest = k.nest
    if nest is None or not nest.guards:
        return None
    if (nest.rsizes or nest.tile is not None or nest.block or k.streams is not None or len(nest.xsizes) < 2
            or not all(isinstance(s, int) for s in nest.xsizes)):
        return "guards in a nest with r loops, a tile, blocks, streams, one x loop or symbolic sizes"
    if len(set(nest.guards)) != len(nest.guards):
        return "a guard twice"
    outer = {sympy.Symbol(f"ix{i}", integer=True, nonnegative=True) for i in range(len(nest.xsizes) - 1)}
    found = {s for nd in nest.nodes for s in walk(nd.body)}
    for g in nest.guards:
        if not (isinstance(g, Op) and g.name in COMPARISONS and g in found and reads_among(g, outer)):
            return f"a guard that is no comparison of the bodies reading outer loop variables alone ({g})"
    if not nest.versions or len(set(nest.versions)) != len(nest.versions) or any(
            len(v) != len(nest.guards) for v in nest.versions):
        return f"versions {list(nest.versions)}: none, one twice, or not one value a guard"
    return None


def _verify_row_work(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    if (why := _table_problem(k) or _invariant_problem(k)) is not None:
        fail(p, stage, k.name, f"K10 {why}")
    if (why := _cuts_problem(k) or _guards_problem(k)) is not None:
        fail(p, stage, k.name, f"K10 {why}")
    nest = k.nest
    if nest is None:
        if k.streams is not None or k.scratch or k.hoisted:
            fail(p, stage, k.name, "K10 streams, scratch arrays or hoisted values without a loop nest")
        return
    if k.streams is not None:
        s = k.streams
        if nest.rsizes or s.chunk < 1 or not s.buffers or len(set(s.buffers)) != len(s.buffers):
            fail(p, stage, k.name, f"K10 streams {list(s.buffers)} in chunks of {s.chunk} in a nest with r loops "
                                   f"{list(nest.rsizes)}")
        writes = {q.name for q in k.params if q.role is ParamRole.OUT}
        for name in s.buffers:
            if name not in writes or name not in {n.name for n in k.nodes if n.store is not None}:
                fail(p, stage, name, f"K10 streamed, but not a buffer {k.name} stores")
    if not k.scratch and not k.hoisted:
        return
    # the nodes each loop the kernel runs computes: a Loop stage's, and a second pass's
    runs: dict[int, list[str]] = {}
    for st in k.stages:
        if isinstance(st, Loop):
            runs.setdefault(st.level, []).extend(st.computes)
            if any(a.second_pass for a in st.accumulators):
                runs.setdefault(st.level + 1, []).extend(st.computes)
    loops = {st.level for st in k.stages if isinstance(st, Loop)}
    bodies = {n.name: n.body for n in nest.nodes}
    below: dict[str, set[Expr]] = {}

    def computed_in(level: int, e: Expr) -> bool:
        for name in runs.get(level, ()):
            if name not in below:
                below[name] = set(walk(bodies[name]))
            if e in below[name]:
                return True
        return False

    taken: dict[int, int] = {}  # slot -> the last loop that reads its value so far
    for a in k.scratch:
        if not a.first < a.last or a.first not in loops or a.last not in runs:
            fail(p, stage, k.name, f"K10 scratch row{a.slot} stored in loop {a.first} and read up to loop {a.last}: "
                                   "not loops the kernel runs, in order")
        if not computed_in(a.first, a.expr):
            fail(p, stage, k.name, f"K10 scratch row{a.slot} holds a value loop {a.first} does not compute")
        if a.first < taken.get(a.slot, a.first):
            fail(p, stage, k.name, f"K10 scratch row{a.slot} stored in loop {a.first} while loop {taken[a.slot]} "
                                   "still reads it")
        taken[a.slot] = a.last
    inner = {n.name for n in k.nodes if n.role is Role.INNER}
    kept = {n.name for n in k.nodes} - inner
    rnames = {f"ir{i}" for i in range(len(nest.rsizes))}
    for h in k.hoisted:
        if h.level not in runs:
            fail(p, stage, k.name, f"K10 values hoisted out of loop {h.level}, a loop the kernel does not run")
        for e in h.hoisted:
            if not computed_in(h.level, e) or _varies(e, inner, kept, rnames):
                fail(p, stage, k.name, f"K10 loop {h.level} hoists a value that it does not compute or that varies "
                                       "along the row")
        for d in h.reciprocals:
            if (not isinstance(d, Op) or d.name != "truediv" or not computed_in(h.level, d)
                    or _varies(d.args[-1], inner, kept, rnames) or not _varies(d.args[0], inner, kept, rnames)):
                fail(p, stage, k.name, f"K10 loop {h.level} multiplies by a reciprocal where it does not divide "
                                       "a value that varies along the row by one that does not")


def _varies(e: Expr, inner: set[str], kept: set[str], rnames: set[str]) -> bool:
    """Whether `e` changes along the row: it reads an inner node, or memory or an
    index at an r loop variable (a reduction's or outer node's value, `kept`, is
    the row's)."""
    for x in walk(e):
        if isinstance(x, (Load, IndirectLoad)) and x.name in inner:
            return True
        if (isinstance(x, (Load, IndirectLoad)) and x.name not in kept
                and any({str(s) for s in i.free_symbols} & rnames for i in x.index)):
            return True
        if isinstance(x, IndexExpr) and {str(s) for s in x.expr.free_symbols} & rnames:
            return True
    return False


def _verify_loads_first(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    memory = {q.name for q in k.params} - {n.name for n in k.nodes}
    before: set[Expr] = set()  # what the outer stages so far computed
    for st in k.stages:
        if isinstance(st, Outer):
            found = {ld for n in st.nodes for ld in loads(k.node(n).body) if ld.name in memory}
            if st.loads and (not isinstance(k.space, Split) or st.level == 0 or len(set(st.loads)) != len(st.loads)
                             or set(st.loads) != found - before):
                fail(p, stage, k.name, f"K12 outer {st.level} issues first loads of {[ld.name for ld in st.loads]}: "
                                       "only a split's stages after its loop do, each load from memory once")
            before.update(e for n in st.nodes for e in walk(k.node(n).body))
            continue
        if not st.loads:
            continue
        if isinstance(st, Body):
            what, computed = "body", st.nodes
        else:
            online = {a.node for a in st.accumulators if a.update is Update.ONLINE_SUM}
            what, computed = f"loop {st.level}", tuple(n for n in st.computes if n not in online)
        found = {ld for n in computed for ld in loads(k.node(n).body) if ld.name in memory}
        if (len(set(st.loads)) != len(st.loads) or not found >= set(st.loads) or before & set(st.loads)
                or (isinstance(st, Body) and set(st.loads) != found)):
            fail(p, stage, k.name, f"K12 the {what} issues first loads of {[ld.name for ld in st.loads]}, not each "
                                   "once the loads from memory of what it computes")


def _verify_reads(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    if not k.reads:
        return
    memory = {q.name for q in k.params} - {n.name for n in k.nodes}
    inside = {n.name for n in k.nodes}
    found = {e for n in k.nodes for e in walk(n.body) if isinstance(e, (Load, IndirectLoad)) and e.name not in inside}
    got = [r.load for r in k.reads]
    if len(set(got)) != len(got) or set(got) != found or any(ld.name not in memory for ld in got):
        fail(p, stage, k.name, f"K13 reads of {[ld.name for ld in got]} are not its bodies' loads from memory "
                               "of its parameters, each once")
    for r in k.reads:
        used = tails_of(r.offset.free_symbols)
        fits = r.tails == used if isinstance(r.load, Load) else set(used) <= set(r.tails)
        if not fits or r.tails != tails_of({s for a, s in _AXES.items() if a in r.tails}):
            fail(p, stage, k.name, f"K13 a read of {r.load.name} at {r.offset} masked by tails {r.tails!r}")


def _verify_prelude(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    s = k.space
    if not isinstance(s, Split):
        return
    first = next((st.nodes for st in k.stages if isinstance(st, Outer) and st.level == 0), ())
    need = {d for st in k.stages if isinstance(st, Loop) for n in st.computes for d in k.node(n).deps if d in first}
    for name in reversed(first):  # what those read of outer stage 0 too
        if name in need:
            need.update(d for d in k.node(name).deps if d in first)
    if (list(s.prelude) != [n for n in first if n in s.prelude] or len(set(s.prelude)) != len(s.prelude)
            or not need <= set(s.prelude) or (s.even and s.prelude)):
        fail(p, stage, k.name, f"K14 prelude {list(s.prelude)}: not in order nodes of outer stage 0 {list(first)} "
                               f"with those its loop reads {sorted(need)}" + (" (an even split)" if s.even else ""))


def _verify_asserts(p: KernelProgram, stage: str, k: KernelSpec) -> None:
    kinds = {e.kind for n in k.nodes for e in walk(n.body) if isinstance(e, Check) and e.checked}
    if (k.asserts != tuple(kind for kind in ("index", "divisor") if kind in k.asserts) or not kinds >= set(k.asserts)
            or ("divisor" in k.asserts and k.device.startswith("cuda"))):
        fail(p, stage, k.name, f"K11 asserts {list(k.asserts)} on {k.device}, its bodies check {sorted(kinds)}")
