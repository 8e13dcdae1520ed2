"""What every C++ kernel shares: the plan (loop nest, nodes in loop variables,
parameters, which buffers are stored), loop rendering and OpenMP pragmas, and how
a node's value becomes a register and a store."""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import sympy

from coil.backends.cpp import prelude
from coil.backends.cpp.handler import CppHandler, KernelContext, cpp_index, register_value
from coil.backends.cpp.loops import Nest, NodeIndexing, index_expressions, initial_nest, merged_nest, node_indexing
from coil.ir.expr import loads
from coil.ir.fused import FusedKernel
from coil.ir.indexing import simplify_index
from coil.ir.layout import Layout
from coil.ir.wrapper import WrapperProgram
from coil.options import Options
from coil.passes.kernel_model import Param, kernel_buffers, kernel_params

# Below this many element-iterations a parallel region costs more than it saves.
PARALLEL_MIN_WORK = 32768
# Parallel loops hand out about this many chunks of iterations.
PARALLEL_CHUNKS = 64


@attrs.frozen
class KernelPlan:
    """One kernel in the loop variables of its nest: its nodes (in kernel order),
    parameters, the buffers it stores (the others stay in registers) and every
    buffer's layout."""

    kernel: FusedKernel
    nest: Nest
    nodes: tuple[NodeIndexing, ...]
    params: tuple[Param, ...]
    stored: frozenset[str]
    layouts: dict[str, Layout]

    @property
    def inside(self) -> set[str]:
        return set(self.kernel.nodes)

    @property
    def is_reduction(self) -> bool:
        return bool(self.nest.rdims)


def plan_kernel(k: FusedKernel, program: WrapperProgram) -> KernelPlan:
    g = program.plan.schedule.graph
    bufs = kernel_buffers(k, g)
    params = kernel_params(k, g, program.plan.removed)
    layouts = {b.name: b.layout for b in (*g.graph.inputs, *g.graph.buffers) if b.layout is not None}
    stored = frozenset(b.name for b in bufs if b.name not in program.plan.removed)
    nest = initial_nest(bufs, k.group)
    while True:
        nodes = tuple(node_indexing(b, k.group, nest) for b in bufs)
        merged = merged_nest(nest, index_expressions(nodes, layouts, set(k.nodes), nest.ranges, set(stored)))
        if merged is None:
            return KernelPlan(k, nest, nodes, params, stored, layouts)
        nest = merged


# ---- loops ---------------------------------------------------------------------------------


@attrs.frozen
class Loop:
    var: str
    lo: str
    hi: str
    pragma: str | None = None


def render_loops(loops: Sequence[Loop], body: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i, lp in enumerate(loops):
        pad = "  " * i
        if lp.pragma:
            out.append(f"{pad}#pragma {lp.pragma}")
        out.append(f"{pad}for (int64_t {lp.var} = {lp.lo}; {lp.var} < {lp.hi}; ++{lp.var}) {{")
    pad = "  " * len(loops)
    out += [pad + ln for ln in body]
    out += ["  " * i + "}" for i in reversed(range(len(loops)))]
    return out


def parallel_pragma(collapse: int, iterations: int, options: Options) -> str:
    """`omp parallel for` over `iterations` (of `collapse` nested loops), handed out
    in about PARALLEL_CHUNKS dynamic chunks: on a shared machine a thread that loses
    its core for a time slice then costs the others a few chunks, not half the work."""
    threads = f" num_threads({options.num_threads})" if options.num_threads > 0 else ""
    collapsed = f" collapse({collapse})" if collapse > 1 else ""
    chunk = max(1, iterations // PARALLEL_CHUNKS)
    return f"omp parallel for{collapsed} schedule(dynamic, {chunk}){threads}"


def dim_bound(nest: Nest, i: int, reduction: bool) -> str:
    """Trip count of dim i.  The outermost loop runs to `xnumel / (inner sizes)`
    (`rnumel / ...`): the kernel's trip counts come from its size arguments, its
    index arithmetic from constants."""
    dims = nest.rdims if reduction else nest.xdims
    if i > 0:
        return str(dims[i].size)
    inner = math.prod(d.size for d in dims[1:])
    size = "rnumel" if reduction else "xnumel"
    return f"{size} / {inner}" if inner != 1 else size


# ---- nodes -----------------------------------------------------------------------------------------


def store_line(plan: KernelPlan, ctx: KernelContext, nd: NodeIndexing, value: str) -> str:
    """`out_ptrN[offset] = value`, converted to the buffer's storage type."""
    dtype = nd.buf.layout.dtype
    return f"{ctx.ptrs[nd.buf.name]}[{cpp_index(nd.store)}] = {prelude.store_value(dtype, value)};"


def emit_node(plan: KernelPlan, ctx: KernelContext, h: CppHandler, nd: NodeIndexing) -> None:
    """Compute a pointwise node in the handler's scope, keep it as a register and
    store it unless plan_memory removed it."""
    raw = h.value(nd.body)
    reg = register_value(raw, nd.body, nd.buf.layout.dtype)
    if reg != raw:
        reg = h.emit(nd.buf.layout.dtype, reg)
    h.registers[nd.buf.name] = reg
    if nd.buf.name in plan.stored:
        h.lines.append(store_line(plan, ctx, nd, raw))


def outside_loads(plan: KernelPlan) -> list[tuple[str, sympy.Expr]]:
    """(buffer, storage offset in loop variables) of every direct load from memory
    (indirect loads have no offset known at compile time)."""
    out: dict[tuple[str, sympy.Expr], None] = {}
    for nd in plan.nodes:
        for ld in loads(nd.body):
            if ld.name not in plan.inside:
                lay = plan.layouts[ld.name]
                out[(ld.name, simplify_index(lay.offset_of(ld.index) - lay.offset, plan.nest.ranges))] = None
    return list(out)
