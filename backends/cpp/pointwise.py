"""Pointwise kernels: every node runs once per xindex, all in the innermost loop.

The innermost loop is `omp simd` over the contiguous dim; the loops outside it are
`omp parallel for` (the innermost dim is cut into blocks when they are too few to
share).  When a load walks memory along an outer dim while the innermost dim
strides it (`x + y.t()`), the two dims run in TILE x TILE tiles and each tile of
that input is first transposed into a local buffer (`coil_transpose_tile`), so the
compute loop reads contiguous memory; ragged edge tiles use plain loads.  A large
output of a memory-bound kernel is written by streaming stores (plan.streamed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
import sympy

from coil.backends.cpp import prelude
from coil.backends.cpp.handler import CppHandler, KernelContext, cpp_index
from coil.backends.cpp.loops import affine_coeffs
from coil.backends.cpp.plan import (
    PARALLEL_MIN_WORK,
    STREAM_MAX_COST,
    KernelPlan,
    Loop,
    Stream,
    compute_cost,
    dim_bound,
    emit_node,
    outside_loads,
    parallel_pragma,
    render_loops,
    stream_chunk,
    streamed,
)
from coil.options import Options

# The innermost pointwise loop is cut into blocks of this many elements when the
# loops outside it are too few to share among threads.
POINTWISE_BLOCK = 4096
# Side of the square tile for pointwise kernels that read a transposed input (a
# multiple of 8: 4-byte tiles are transposed 8x8 in registers).  64: each tile
# row is 256 contiguous bytes of every stream, and a float32 tile (16 KiB) still
# sits in L1 (x + y.t(), 2048x2048 float32, one thread: 2.45 ms at 64, 2.56 at
# 32, 3.1 at 128)
TILE = 64


def pointwise_scope(plan: KernelPlan, ctx: KernelContext, streams: Mapping[str, str] | None = None) -> list[str]:
    scope: list[str] = []
    h = CppHandler(ctx, {}, {}, scope)
    for nd in plan.nodes:
        emit_node(plan, ctx, h, nd, streams)
    return scope


def pointwise_body(plan: KernelPlan, ctx: KernelContext, options: Options) -> list[str]:
    tiling = transposed_tiling(plan)
    if tiling is not None:
        return tiled_body(plan, ctx, options, tiling)
    loops = pointwise_loops(plan, options)
    inner = plan.nest.xdims[-1]
    streams = streamed(plan, inner.sym, inner.size) if memory_bound(plan) else []
    if streams:
        return render_loops(loops[:-1], streamed_loop(plan, ctx, loops[-1], streams))
    return render_loops(loops, pointwise_scope(plan, ctx))


def memory_bound(plan: KernelPlan) -> bool:
    return compute_cost(nd.body for nd in plan.nodes) <= STREAM_MAX_COST


def streamed_loop(plan: KernelPlan, ctx: KernelContext, inner: Loop, streams: Sequence[Stream]) -> list[str]:
    """The innermost loop in chunks (stream_chunk): each chunk is computed into
    local buffers (its streamed outputs), then streamed out; a fence after the
    last chunk, before the thread may take other work or leave the parallel loop."""
    var, chunk = inner.var, f"{inner.var}_c"
    n = stream_chunk(streams)
    end = f"{chunk}_end"
    at_chunk = {_index_symbol(var): _index_symbol(chunk)}
    scope = pointwise_scope(plan, ctx, {st.node.buf.name: f"{st.buffer}[{var} - {chunk}]" for st in streams})
    body = [*(st.declare(n) for st in streams),
            f"const int64_t {end} = coil_min_index({inner.hi}, {chunk} + {n});",
            *render_loops([Loop(var, chunk, end, inner.pragma)], scope),
            *(st.copy_out(ctx, st.node.store.xreplace(at_chunk), f"{end} - {chunk}") for st in streams)]
    return [*render_loops([Loop(chunk, inner.lo, inner.hi, step=n)], body), "coil_sfence();"]


@attrs.frozen
class Tiling:
    """Run dims u and v in TILE x TILE tiles; each staged load (buffer, offset,
    stride along v) walks memory along u, so each tile of it is transposed into a
    local buffer first."""

    u: int
    v: int
    staged: tuple[tuple[str, sympy.Expr, int], ...]


def transposed_tiling(plan: KernelPlan) -> Tiling | None:
    """A tiling when a load's innermost index is strided while one of the outer
    dims walks it contiguously (x + y.t())."""
    dims = plan.nest.xdims
    if len(dims) < 2 or dims[-1].size < TILE:
        return None
    syms = [d.sym for d in dims]
    v = len(dims) - 1
    found: dict[int, list[tuple[str, sympy.Expr, int]]] = {}
    for name, e in outside_loads(plan):
        c = affine_coeffs(e, syms)
        if c is None or c[syms[v]] in (0, 1):
            continue
        for u in reversed(range(v)):
            if c[syms[u]] == 1 and dims[u].size >= TILE:
                found.setdefault(u, []).append((name, e, c[syms[v]]))
                break
    if not found:
        return None
    u = max(found, key=lambda k: len(found[k]))
    return Tiling(u, v, tuple(found[u]))


def tiled_body(plan: KernelPlan, ctx: KernelContext, options: Options, t: Tiling) -> list[str]:
    dims = plan.nest.xdims
    names = [str(d.sym) for d in dims]
    bounds = [dim_bound(plan.nest, i, False) for i in range(len(dims))]
    tu, tv = names[t.u] + "_t", names[t.v] + "_t"
    origin = {dims[t.u].sym: TILE * _index_symbol(tu), dims[t.v].sym: TILE * _index_symbol(tv)}
    staging: list[str] = []
    for k, (name, e, stride) in enumerate(t.staged):
        tile = f"st{k}"
        staging += [f"alignas(64) {prelude.storage_type(plan.layouts[name].dtype)} {tile}[{TILE * TILE}];",
                    f"coil_transpose_tile<{TILE}>({ctx.ptrs[name]} + {cpp_index(e.xreplace(origin))}, {stride}, {tile});"]
        element = f"{tile}[({names[t.u]} - {tu} * {TILE}) * {TILE} + ({names[t.v]} - {tv} * {TILE})]"
        ctx.staged[(name, cpp_index(e))] = element
    # full tiles of a large output go to a local tile too, then out by streaming stores, row by row
    streams = streamed(plan, dims[t.v].sym, TILE) if memory_bound(plan) else []
    in_tile = f"({names[t.u]} - {tu} * {TILE}) * {TILE} + ({names[t.v]} - {tv} * {TILE})"
    fast = pointwise_scope(plan, ctx, {st.node.buf.name: f"{st.buffer}[{in_tile}]" for st in streams})
    ctx.staged.clear()
    edge = pointwise_scope(plan, ctx)
    row = names[t.u] + "_r"
    at_row = {dims[t.u].sym: TILE * _index_symbol(tu) + _index_symbol(row), dims[t.v].sym: TILE * _index_symbol(tv)}
    staging += [st.declare(TILE * TILE) for st in streams]
    copy_out = [*render_loops([Loop(row, "0", str(TILE))],
                              [st.copy_out(ctx, st.node.store.xreplace(at_row), str(TILE), f"{row} * {TILE}")
                               for st in streams]),
                "coil_sfence();"] if streams else []

    def tile_loops(clip: bool) -> list[Loop]:
        out = []
        for i, blk in ((t.u, tu), (t.v, tv)):
            hi = f"{blk} * {TILE} + {TILE}"
            out.append(Loop(names[i], f"{blk} * {TILE}", f"coil_min_index({bounds[i]}, {hi})" if clip else hi,
                            "omp simd" if i == t.v else None))
        return out

    full = f"{tu} * {TILE} + {TILE} <= {bounds[t.u]} && {tv} * {TILE} + {TILE} <= {bounds[t.v]}"
    inner = [f"if ({full}) {{", *("  " + ln for ln in staging + render_loops(tile_loops(False), fast) + copy_out),
             "} else {", *("  " + ln for ln in render_loops(tile_loops(True), edge)), "}"]
    par = [Loop(names[i], "0", bounds[i]) for i in range(len(dims)) if i not in (t.u, t.v)]
    par += [Loop(tu, "0", f"({bounds[t.u]} + {TILE - 1}) / {TILE}"), Loop(tv, "0", f"({bounds[t.v]} + {TILE - 1}) / {TILE}")]
    if math.prod(d.size for d in dims) >= PARALLEL_MIN_WORK:
        tiles = math.prod(-(-d.size // TILE) if i in (t.u, t.v) else d.size for i, d in enumerate(dims))
        par[0] = attrs.evolve(par[0], pragma=parallel_pragma(len(par), tiles, options))
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
    iterations = math.prod(d.size for d in dims[:-1])
    if dims[last].size > POINTWISE_BLOCK and iterations < 64:
        iterations *= -(-dims[last].size // POINTWISE_BLOCK)
        blk = names[last] + "_b"
        par.append(Loop(blk, "0", f"({bounds[last]} + {POINTWISE_BLOCK - 1}) / {POINTWISE_BLOCK}"))
        inner = Loop(names[last], f"{blk} * {POINTWISE_BLOCK}",
                     f"coil_min_index({bounds[last]}, {blk} * {POINTWISE_BLOCK} + {POINTWISE_BLOCK})", "omp simd")
    else:
        inner = Loop(names[last], "0", bounds[last], "omp simd")
    if par and math.prod(d.size for d in dims) >= PARALLEL_MIN_WORK:
        par[0] = attrs.evolve(par[0], pragma=parallel_pragma(len(par), iterations, options))
    return par + [inner]
