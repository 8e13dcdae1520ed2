"""wrap : KernelProgram -> WrapperProgram

One line per allocation, reuse, view, call and free, in plan order, then Return;
a kernel's call passes its spec's parameters.  Inputs are freed with FreeLine
(`del argN_1`), buffers with FreeIfNotReusedLine (nothing is emitted when a later
Reuse takes the storage)."""

from __future__ import annotations

from coil.ir.buffers import AliasBuffer, ComputedBuffer, ExternBuffer, MultiOutputBuffer
from coil.ir.fused import ExternStep, FusedKernel, NopStep
from coil.ir.kernel import KernelProgram
from coil.ir.wrapper import (
    Alloc,
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
                lines.append(KernelCall(step.name, tuple(p.name for p in program.spec(step.name).params)))
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
    return WrapperProgram(tuple(i.name for i in bg.inputs), tuple(lines), program)
