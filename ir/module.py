"""CompiledModule: the wrapper source and one kernel source per kernel, for one
target.  `.load()` executes the source and returns the `call` function wrapped as
`compiled(*inputs) -> tuple`.

vs WrapperProgram: + Python / Triton / C++ text; - the line objects (kept as
`program` for inspection)."""

from __future__ import annotations

import enum

import attrs

from coil.ir.buffers import Buffer, BufferGraph, InputBuffer
from coil.ir.fused import FusedSchedule
from coil.ir.layout import Layout
from coil.ir.memory import MemoryPlan
from coil.ir.schedule import ScheduleGraph
from coil.ir.wrapper import WrapperProgram


class SourceLanguage(enum.StrEnum):
    """What a kernel's source is written in: one per target (reference, triton, cpp)."""

    PYTHON = "python"
    TRITON = "triton"
    CPP = "cpp"


@attrs.frozen
class KernelSource:
    name: str
    source: str
    language: SourceLanguage = attrs.field(converter=SourceLanguage)


@attrs.frozen
class CompiledModule:
    target: str
    source: str  # the whole output_code.py
    kernels: tuple[KernelSource, ...]
    program: WrapperProgram

    # the earlier languages' accessors, at the top level (CompiledModule extends
    # WrapperProgram), so that no reader digs through nested fields
    @property
    def plan(self) -> MemoryPlan:
        return self.program.plan

    @property
    def schedule(self) -> FusedSchedule:
        return self.program.schedule

    @property
    def schedule_graph(self) -> ScheduleGraph:
        return self.program.schedule_graph

    @property
    def buffer_graph(self) -> BufferGraph:
        return self.program.buffer_graph

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.program.buffers

    def get(self, name: str) -> InputBuffer | Buffer:
        return self.program.get(name)

    def layout(self, name: str) -> Layout:
        return self.program.layout(name)
