"""What every C++ kernel shares: the plan (the spec's loop nest, nodes in its loop
variables, parameters, which buffers are stored), loop rendering and OpenMP
pragmas, how a node's value becomes a register and a store, and how the spec's
streamed stores are staged and streamed out."""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Mapping, Sequence

import attrs
import sympy

from coil.backends.cpp import prelude
from coil.backends.cpp.handler import CppHandler, KernelContext, LoopCheck, cpp_index, register_value
from coil.ir.fused import FusedKernel
from coil.ir.kernel import KernelSpec, LoopNest, Parallel
from coil.ir.layout import Layout
from coil.ir.wrapper import WrapperProgram
from coil.options import Options
from coil.passes.kernel_model import Param, kernel_buffers, kernel_layouts
from coil.passes.schedule.nest import Nest, NodeIndexing


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
    spec: KernelSpec  # schedule_kernels' decisions: the nest, the r-loops each node runs in, threads and lanes

    @property
    def loops(self) -> LoopNest:
        assert self.spec.nest is not None, f"{self.kernel.name}: no loop nest in its spec"
        return self.spec.nest

    @property
    def inside(self) -> set[str]:
        return set(self.kernel.nodes)

    @property
    def is_reduction(self) -> bool:
        return bool(self.nest.rdims)


def plan_kernel(k: FusedKernel, program: WrapperProgram) -> KernelPlan:
    g = program.schedule_graph
    bufs = kernel_buffers(k, g)
    spec = program.spec(k.name)
    layouts = kernel_layouts(g)
    stored = frozenset(b.name for b in bufs if b.name not in program.plan.removed)
    assert spec.nest is not None, f"{k.name}: the cpp target's specs have loop nests"
    nest = Nest.of_sizes(spec.nest.xsizes, spec.nest.rsizes)
    nodes = tuple(NodeIndexing(b, kn.role, n.body, n.store) for b, kn, n in zip(bufs, spec.nodes, spec.nest.nodes))
    return KernelPlan(k, nest, nodes, spec.params, stored, layouts, spec)


# ---- loops ---------------------------------------------------------------------------------


@attrs.frozen
class Loop:
    var: str
    lo: str
    hi: str
    pragma: str | None = None
    step: int = 1


def render_loops(loops: Sequence[Loop], body: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i, lp in enumerate(loops):
        pad = "  " * i
        if lp.pragma:
            out.append(f"{pad}#pragma {lp.pragma}")
        step = f"++{lp.var}" if lp.step == 1 else f"{lp.var} += {lp.step}"
        out.append(f"{pad}for (int64_t {lp.var} = {lp.lo}; {lp.var} < {lp.hi}; {step}) {{")
    pad = "  " * len(loops)
    out += [pad + ln for ln in body]
    out += ["  " * i + "}" for i in reversed(range(len(loops)))]
    return out


def checked_loop(loop: Loop, body: list[str], checks: list[LoopCheck]) -> list[str]:
    """`loop` around `body` with the checks its body made as reductions: declared
    before it, in its `omp simd` clause, reported after it."""
    if not checks:
        return render_loops([loop], body)
    if loop.pragma is not None and loop.pragma.startswith("omp simd"):
        loop = attrs.evolve(loop, pragma=" ".join([loop.pragma, *(c.clause() for c in checks)]))
    return [*(ln for c in checks for ln in c.declare()), *render_loops([loop], body),
            *(ln for c in checks for ln in c.report())]


def parallel_pragma(par: Parallel, options: Options) -> str:
    """`omp parallel for` over the spec's parallel loops, in its dynamic chunks."""
    threads = f" num_threads({options.num_threads})" if options.num_threads > 0 else ""
    collapsed = f" collapse({par.loops})" if par.loops > 1 else ""
    return f"omp parallel for{collapsed} schedule(dynamic, {par.chunk}){threads}"


def cpp_size(v: Any) -> str:
    """A size in C++: a literal, or an expression of the kernel's int64_t size
    arguments."""
    from coil.backends.cpp.handler import cpp_index

    return str(v) if isinstance(v, int) else cpp_index(v)


def dim_bound(nest: Nest, i: int, reduction: bool) -> str:
    """Trip count of dim i.  The outermost loop runs to `xnumel / (inner sizes)`
    (`rnumel / ...`): the kernel's trip counts come from its size arguments, its
    index arithmetic from constants."""
    dims = nest.rdims if reduction else nest.xdims
    if i > 0:
        return cpp_size(dims[i].size)
    inner = math.prod(d.size for d in dims[1:])
    size = "rnumel" if reduction else "xnumel"
    if isinstance(inner, int):
        return f"{size} / {inner}" if inner != 1 else size
    return f"{size} / ({cpp_size(inner)})"  # a symbolic product, whole


# ---- nodes -----------------------------------------------------------------------------------------


def store_line(plan: KernelPlan, ctx: KernelContext, nd: NodeIndexing, value: str,
               streams: Mapping[str, str] | None = None) -> str:
    """`out_ptrN[offset] = value`, converted to the buffer's storage type; a
    streamed buffer's element goes to its staging buffer (`streams`) instead."""
    dtype = nd.buf.layout.dtype
    assert nd.store is not None, f"{nd.buf.name} is not stored"
    target = (streams or {}).get(nd.buf.name, f"{ctx.ptrs[nd.buf.name]}[{cpp_index(nd.store)}]")
    return f"{target} = {prelude.store_value(dtype, value)};"


def emit_node(plan: KernelPlan, ctx: KernelContext, h: CppHandler, nd: NodeIndexing,
              streams: Mapping[str, str] | None = None) -> None:
    """Compute a pointwise node in the handler's scope, keep it as a register and
    store it unless plan_memory removed it."""
    raw = h.value(nd.body)
    reg = register_value(raw, nd.body, nd.buf.layout.dtype)
    if reg != raw:
        reg = h.emit(nd.buf.layout.dtype, reg)
    h.registers[nd.buf.name] = reg
    if nd.buf.name in plan.stored:
        h.lines.append(store_line(plan, ctx, nd, raw, streams))


# ---- streaming stores ----------------------------------------------------------------------------


@attrs.frozen
class Stream:
    node: NodeIndexing
    buffer: str  # the local staging buffer

    @property
    def store(self) -> sympy.Expr:
        """Where the streamed node's element goes (streamed nodes are stored)."""
        assert self.node.store is not None
        return self.node.store

    def declare(self, elements: int) -> str:
        return f"alignas(64) {prelude.storage_type(self.node.buf.layout.dtype)} {self.buffer}[{elements}];"

    def copy_out(self, ctx: KernelContext, offset: sympy.Expr, count: str, start: str = "") -> str:
        """Stream `count` elements from the staging buffer (from element `start`)
        to the output at element `offset`."""
        size = self.node.buf.layout.dtype.itemsize
        src = f"{self.buffer} + {start}" if start else self.buffer
        return f"coil_stream({ctx.ptrs[self.node.buf.name]} + {cpp_index(offset)}, {src}, ({count}) * {size});"


def streams(plan: KernelPlan) -> list[Stream]:
    """The stores the spec streams (KernelSpec.streams), each with its staging
    buffer obN."""
    if plan.spec.streams is None:
        return []
    nodes = {nd.buf.name: nd for nd in plan.nodes}
    return [Stream(nodes[name], f"ob{i}") for i, name in enumerate(plan.spec.streams.buffers)]
