"""wrap : KernelProgram -> WrapperProgram

One line per allocation, reuse, view, call and free, in plan order, then Return;
a kernel's call passes its spec's parameters.  Inputs are freed with FreeLine
(`del argN_1`), buffers with FreeIfNotReusedLine (nothing is emitted when a later
Reuse takes the storage)."""

from __future__ import annotations

import sympy

from coil.errors import CoilError
from coil.ir.buffers import AliasBuffer, BufferGraph, ComputedBuffer, ExternBuffer, MultiOutputBuffer
from coil.ir.fused import ExternStep, FusedKernel, NopStep
from coil.ir.kernel import KernelProgram
from coil.ir.wrapper import (
    Alloc,
    Bind,
    ExternCall,
    Free,
    FreeKind,
    KernelCall,
    Line,
    MultiOutputLine,
    ReinterpretView,
    Return,
    Reuse,
    WrapperProgram,
)
from coil.options import Options


def wrap(program: KernelProgram, options: Options) -> WrapperProgram:
    """Render the kernel program's plan as wrapper lines."""
    plan = program.plan
    bg = program.buffer_graph
    inputs = {i.name for i in bg.inputs}
    reused = {old for ps in plan.steps for _, old in ps.reuses}
    lines: list[Line] = []
    for ps in plan.steps:
        step = ps.step
        for new, old in ps.reuses:
            lines.append(Reuse(new, old, bg.layout(new), new in ps.inplace))
        for name in ps.allocs:
            lines.append(Alloc(name, bg.layout(name)))
        match step:
            case FusedKernel():
                spec = program.spec(step.name)
                lines.append(KernelCall(step.name, tuple(p.name for p in spec.params), spec.symbols))
            case ExternStep():
                b = bg.get(step.name)
                assert isinstance(b, ExternBuffer)
                lines.append(ExternCall(b.name, b.kernel, b.args, b.kwargs, b.mutated))
            case NopStep():
                b = bg.get(step.name)
                if isinstance(b, AliasBuffer):
                    base = bg.get(b.base)
                    # a buffer coil allocates starts its storage; any other base is placed by its maker
                    placed = None if isinstance(base, ComputedBuffer) else bg.layout(b.base).offset
                    lines.append(ReinterpretView(b.name, b.base, b.layout, placed))
                elif isinstance(b, MultiOutputBuffer):
                    lines.append(MultiOutputLine(b.name, b.extern, b.index))
        taken = {old for _, old in ps.inplace_pairs}
        for f in ps.frees:
            if f in taken:
                lines.append(Free(f, FreeKind.NAME))
            elif f in inputs:
                lines.append(Free(f, FreeKind.INPUT))
            elif f not in reused:
                lines.append(Free(f, FreeKind.BUFFER))
    lines.append(Return(bg.outputs))
    sizes = bg.sizes
    if not sizes:
        return WrapperProgram(tuple(i.name for i in bg.inputs), tuple(lines), program)
    names = sizes.order + tuple(i.name for i in bg.inputs if i.name not in sizes.order)  # constants last
    return WrapperProgram(names, (*binds(bg), *lines), program)


def binds(bg: BufferGraph) -> tuple[Bind, ...]:
    """Where `call` reads each size symbol: a SymInt input that is the symbol, else
    the first tensor input with a size (then a stride) that is the symbol."""
    out: dict[str, Bind] = {}
    for name, v in bg.sizes.inputs:
        if isinstance(v, sympy.Symbol):
            out.setdefault(v.name, Bind(v.name, name))
    for what in ("size", "stride"):
        for i in bg.inputs:
            if i.value is not None:
                continue
            for d, v in enumerate(i.layout.size if what == "size" else i.layout.stride):
                if isinstance(v, sympy.Symbol):
                    out.setdefault(v.name, Bind(v.name, i.name, what, d))
    missing = [str(s) for s in bg.sizes.shapes.symbols if s.name not in out]
    if missing:
        raise CoilError(f"size symbols {missing} are no input's size, stride or value: the wrapper cannot read them",
                        stage="wrap")
    return tuple(out[s.name] for s in bg.sizes.shapes.symbols)
