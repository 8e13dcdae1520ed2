"""Pointwise kernels: every node runs once per xindex, all in the innermost loop.

The innermost loop is `omp simd` over the contiguous dim; the loops outside it are
`omp parallel for` where the spec's nest says so (its innermost loop is cut into
blocks when they are too few to share: LoopNest.block).  A nest with a tile
(`x + y.t()`: a read walks memory along an outer loop while the innermost strides
it; passes/schedule/threads.py) runs those two loops in tiles and first transposes
each tile of the staged reads into a local buffer (`coil_transpose_tile`), so the
compute loop reads contiguous memory; ragged edge tiles use plain loads.  The
outputs the spec streams (KernelSpec.streams) are computed a chunk (a full tile)
at a time into local buffers and written out by streaming stores.  The nest's lane
tables (LoopNest.tables: values that vary along the innermost loop alone) are
computed before the loops, one array each, and read there; its invariants
(LoopNest.invariants: values that vary along no loop) once, as constants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import sympy

from coil.backends.cpp import prelude
from coil.backends.cpp.handler import CppHandler, KernelContext, cpp_index
from coil.backends.cpp.plan import (
    KernelPlan,
    Loop,
    LoopCheck,
    Stream,
    checked_loop,
    cpp_size,
    dim_bound,
    emit_node,
    parallel_pragma,
    render_loops,
    streams,
)
from coil.ir.expr import Expr
from coil.ir.kernel import NestTile
from coil.options import Options
from coil.passes.schedule.pieces import fold_guards, fold_piece, inner_symbol, outer_spans


def pointwise_scope(plan: KernelPlan, ctx: KernelContext, streams: Mapping[str, str] | None = None,
                    checks: list[LoopCheck] | None = None, tables: Mapping[Expr, str] | None = None) -> list[str]:
    scope: list[str] = []
    h = CppHandler(ctx, {}, {}, scope, checks)
    h.memo.update(tables or {})  # a lane table's value is read from it
    for nd in plan.nodes:
        emit_node(plan, ctx, h, nd, streams)
    return scope


def pointwise_body(plan: KernelPlan, ctx: KernelContext, options: Options) -> list[str]:
    if plan.loops.tile is not None:
        return tiled_body(plan, ctx, options, plan.loops.tile)
    loops = pointwise_loops(plan, options)
    once, fixed = invariant_values(plan, ctx)
    first, tables = lane_tables(plan, ctx)
    first, tables = once + first, {**fixed, **tables}
    out = streams(plan)
    if out:
        return first + render_loops(loops[:-1], streamed_loop(plan, ctx, loops[-1], out, tables))
    if plan.loops.guards:
        return first + render_loops(loops[:-1], guarded_loops(plan, ctx, loops[-1], tables))
    return first + render_loops(loops[:-1], inner_loop(plan, ctx, loops[-1], tables))


def inner_loop(plan: KernelPlan, ctx: KernelContext, inner: Loop, tables: Mapping[Expr, str],
               values: tuple[bool, ...] = ()) -> list[str]:
    """The innermost loop over the plan's nodes, in pieces where the nest is cut
    (in the version of its guards where they have `values`)."""
    if plan.loops.cuts:
        return piece_loops(plan, ctx, inner, tables, values)
    checks: list[LoopCheck] = []
    scope = pointwise_scope(plan, ctx, checks=checks, tables=tables)
    return checked_loop(inner, scope, checks)


def guarded_loops(plan: KernelPlan, ctx: KernelContext, inner: Loop, tables: Mapping[Expr, str]) -> list[str]:
    """The nest's guards (LoopNest.guards) computed before the innermost loop, then
    one version of that loop for each of their values the loops reach
    (LoopNest.versions), with them folded (passes/schedule/pieces.py); the last
    version is the `else`.  One version reached: that loop alone."""
    guards, versions = plan.loops.guards, plan.loops.versions

    def version(values: tuple[bool, ...]) -> list[str]:
        nodes = tuple(attrs.evolve(nd, body=fold_guards(nd.body, guards, values)) for nd in plan.nodes)
        return inner_loop(attrs.evolve(plan, nodes=nodes), ctx, inner, tables, values)

    if len(versions) == 1:
        return version(versions[0])
    lines: list[str] = []
    h = CppHandler(ctx, {}, {}, lines)
    names = []
    for g in guards:
        name = ctx.fresh("guard")
        lines.append(f"const bool {name} = {h.value(g)};")
        names.append(name)
    for k, values in enumerate(versions):
        test = " && ".join(n if v else f"!{n}" for n, v in zip(names, values))
        head = "if" if k == 0 else "} else if"
        lines.append(f"{head} ({test}) {{" if k < len(versions) - 1 else "} else {")
        lines += ["  " + ln for ln in version(values)]
    return [*lines, "}"]


def piece_loops(plan: KernelPlan, ctx: KernelContext, inner: Loop, tables: Mapping[Expr, str],
                values: tuple[bool, ...] = ()) -> list[str]:
    """The innermost loop as one loop a piece (LoopNest.cuts), each over the nodes'
    bodies with that piece's comparisons folded, the outer loops over their spans
    in the guards' version `values` (passes/schedule/pieces.py)."""
    sym, outer = inner_symbol(plan.loops), outer_spans(plan.loops, values)
    bounds = (0, *plan.loops.cuts, plan.loops.xsizes[-1])
    out: list[str] = []
    for lo, hi in zip(bounds, bounds[1:]):
        nodes = tuple(attrs.evolve(nd, body=fold_piece(nd.body, sym, lo, hi, outer)) for nd in plan.nodes)
        checks: list[LoopCheck] = []
        scope = pointwise_scope(attrs.evolve(plan, nodes=nodes), ctx, checks=checks, tables=tables)
        out += checked_loop(attrs.evolve(inner, lo=str(lo), hi=str(hi)), scope, checks)
    return out


def lane_tables(plan: KernelPlan, ctx: KernelContext) -> tuple[list[str], dict[Expr, str]]:
    """The nest's lane tables (LoopNest.tables), each computed for every value of the
    innermost loop before the loops, and what reads each in the loop body."""
    nest = plan.spec.nest
    if nest is None or not nest.tables:
        return [], {}
    var = str(plan.nest.xdims[-1].sym)
    size = nest.xsizes[-1]
    lines: list[str] = []
    body: list[str] = []
    h = CppHandler(ctx, {}, {}, body)
    tables: dict[Expr, str] = {}
    for t in nest.tables:
        name = ctx.fresh("lane")
        lines.append(f"alignas(64) {prelude.compute_type(t.dtype)} {name}[{size}];")
        body.append(f"{name}[{var}] = {h.value(t)};")
        tables[t] = f"{name}[{var}]"
    return lines + render_loops([Loop(var, "0", str(size), "omp simd")], body), tables


def invariant_values(plan: KernelPlan, ctx: KernelContext) -> tuple[list[str], dict[Expr, str]]:
    """The nest's invariants (LoopNest.invariants), each computed once before the
    loops into a constant of its compute dtype, and what reads each in the loops."""
    nest = plan.spec.nest
    if nest is None or not nest.invariants:
        return [], {}
    lines: list[str] = []
    h = CppHandler(ctx, {}, {}, lines)
    fixed: dict[Expr, str] = {}
    for e in nest.invariants:
        name = ctx.fresh("inv")
        lines.append(f"const {prelude.compute_type(e.dtype)} {name} = {h.value(e)};")
        fixed[e] = name
    return lines, fixed


def streamed_loop(plan: KernelPlan, ctx: KernelContext, inner: Loop, out: Sequence[Stream],
                  tables: Mapping[Expr, str] | None = None) -> list[str]:
    """The innermost loop in chunks (the spec's): each chunk is computed into
    local buffers (its streamed outputs), then streamed out; a fence after the
    last chunk, before the thread may take other work or leave the parallel loop."""
    assert plan.spec.streams is not None
    var, chunk = inner.var, f"{inner.var}_c"
    n = plan.spec.streams.chunk
    end = f"{chunk}_end"
    at_chunk = {_index_symbol(var): _index_symbol(chunk)}
    scope = pointwise_scope(plan, ctx, {st.node.buf.name: f"{st.buffer}[{var} - {chunk}]" for st in out},
                            tables=tables)
    body = [*(st.declare(n) for st in out),
            f"const int64_t {end} = coil_min_index({inner.hi}, {chunk} + {n});",
            *render_loops([Loop(var, chunk, end, inner.pragma)], scope),
            *(st.copy_out(ctx, st.store.xreplace(at_chunk), f"{end} - {chunk}") for st in out)]
    return [*render_loops([Loop(chunk, inner.lo, inner.hi, step=n)], body), "coil_sfence();"]


def tiled_body(plan: KernelPlan, ctx: KernelContext, options: Options, t: NestTile) -> list[str]:
    side = t.side
    dims = plan.nest.xdims
    names = [str(d.sym) for d in dims]
    bounds = [dim_bound(plan.nest, i, False) for i in range(len(dims))]
    tu, tv = names[t.u] + "_t", names[t.v] + "_t"
    origin = {dims[t.u].sym: side * _index_symbol(tu), dims[t.v].sym: side * _index_symbol(tv)}
    staging: list[str] = []
    for k, read in enumerate(t.staged):
        name, e, stride = read.buffer, read.offset, read.stride
        tile = f"st{k}"
        staging += [f"alignas(64) {prelude.storage_type(plan.layouts[name].dtype)} {tile}[{side * side}];",
                    f"coil_transpose_tile<{side}>({ctx.ptrs[name]} + {cpp_index(e.xreplace(origin))}, "
                    f"{cpp_size(stride)}, {tile});"]
        element = f"{tile}[({names[t.u]} - {tu} * {side}) * {side} + ({names[t.v]} - {tv} * {side})]"
        ctx.staged[(name, cpp_index(e))] = element
    # full tiles of a streamed output go to a local tile too, then out by streaming stores, row by row
    out = streams(plan)
    in_tile = f"({names[t.u]} - {tu} * {side}) * {side} + ({names[t.v]} - {tv} * {side})"
    fast = pointwise_scope(plan, ctx, {st.node.buf.name: f"{st.buffer}[{in_tile}]" for st in out})
    ctx.staged.clear()
    edge = pointwise_scope(plan, ctx)
    row = names[t.u] + "_r"
    at_row = {dims[t.u].sym: side * _index_symbol(tu) + _index_symbol(row), dims[t.v].sym: side * _index_symbol(tv)}
    staging += [st.declare(side * side) for st in out]
    copy_out = [*render_loops([Loop(row, "0", str(side))],
                              [st.copy_out(ctx, st.store.xreplace(at_row), str(side), f"{row} * {side}")
                               for st in out]),
                "coil_sfence();"] if out else []

    def tile_loops(clip: bool) -> list[Loop]:
        out = []
        for i, blk in ((t.u, tu), (t.v, tv)):
            hi = f"{blk} * {side} + {side}"
            out.append(Loop(names[i], f"{blk} * {side}", f"coil_min_index({bounds[i]}, {hi})" if clip else hi,
                            "omp simd" if i == t.v else None))
        return out

    full = f"{tu} * {side} + {side} <= {bounds[t.u]} && {tv} * {side} + {side} <= {bounds[t.v]}"
    inner = [f"if ({full}) {{", *("  " + ln for ln in staging + render_loops(tile_loops(False), fast) + copy_out),
             "} else {", *("  " + ln for ln in render_loops(tile_loops(True), edge)), "}"]
    par = [Loop(names[i], "0", bounds[i]) for i in range(len(dims)) if i not in (t.u, t.v)]
    par += [Loop(tu, "0", f"({bounds[t.u]} + {side - 1}) / {side}"), Loop(tv, "0", f"({bounds[t.v]} + {side - 1}) / {side}")]
    if plan.loops.parallel is not None:
        par[0] = attrs.evolve(par[0], pragma=parallel_pragma(plan.loops.parallel, options))
    return render_loops(par, inner)


def _index_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def pointwise_loops(plan: KernelPlan, options: Options) -> list[Loop]:
    nest = plan.nest
    dims = nest.xdims
    names = [str(d.sym) for d in dims]
    bounds = [dim_bound(nest, i, False) for i in range(len(dims))]
    par = [Loop(names[i], "0", bounds[i]) for i in range(len(dims) - 1)]
    last = len(dims) - 1
    block = plan.loops.block
    if block:
        blk = names[last] + "_b"
        par.append(Loop(blk, "0", f"({bounds[last]} + {block - 1}) / {block}"))
        inner = Loop(names[last], f"{blk} * {block}",
                     f"coil_min_index({bounds[last]}, {blk} * {block} + {block})", "omp simd")
    else:
        inner = Loop(names[last], "0", bounds[last], "omp simd")
    if plan.loops.parallel is not None:
        par[0] = attrs.evolve(par[0], pragma=parallel_pragma(plan.loops.parallel, options))
    return par + [inner]
