"""The earlier languages' accessors, at the top level of each later language.

Each language from ScheduleGraph on extends the one before it by holding it whole
in a field (FusedSchedule.graph, MemoryPlan.schedule, KernelProgram.plan, ...).  So
that no reader digs through nested fields, a language also offers the earlier
languages' accessors itself.  The mixins below write each accessor once: a mixin
names one earlier language by an abstract link, which the class that mixes it in
provides (a field, or a property over its field), and reaches the rest through it.

    mixin                  link            offers
    ExtendsBufferGraph     buffer_graph    buffers, outputs, get, layout
    ExtendsScheduleGraph   schedule_graph  + buffer_graph, node
    ExtendsFusedSchedule   schedule        + schedule_graph
    ExtendsMemoryPlan      plan            + schedule
    ExtendsKernelProgram   kernel_program  + plan, specs, spec
    GraphInputs            buffer_graph    inputs (the graph's input buffers)
    PlanKernels            schedule        kernels (the fused kernels)

`inputs` and `kernels` are mixed in apart, where a language does not define them
otherwise: a WrapperProgram's `inputs` are the names `call` unpacks, and a
CompiledModule's `kernels` are its kernel sources.

The mixins have no fields (empty __slots__), so the frozen attrs classes that
mix them in stay slotted, and mypy sees every accessor and its type.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coil.ir.buffers import Buffer, BufferGraph, InputBuffer
    from coil.ir.fused import FusedKernel, FusedSchedule
    from coil.ir.kernel import KernelProgram, KernelSpec
    from coil.ir.layout import Layout
    from coil.ir.memory import MemoryPlan
    from coil.ir.schedule import ScheduleGraph, SchedulerNode
    from coil.ir.shapes import GraphSizes, ShapeInfo


class ExtendsBufferGraph:
    __slots__ = ()

    @property
    @abc.abstractmethod
    def buffer_graph(self) -> BufferGraph: ...

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.buffer_graph.buffers

    @property
    def outputs(self) -> tuple[str | None, ...]:
        return self.buffer_graph.outputs

    def get(self, name: str) -> InputBuffer | Buffer:
        return self.buffer_graph.get(name)

    def layout(self, name: str) -> Layout:
        return self.buffer_graph.layout(name)

    @property
    def sizes(self) -> GraphSizes:
        return self.buffer_graph.sizes

    @property
    def shapes(self) -> ShapeInfo:
        return self.buffer_graph.sizes.shapes


class ExtendsScheduleGraph(ExtendsBufferGraph):
    __slots__ = ()

    @property
    @abc.abstractmethod
    def schedule_graph(self) -> ScheduleGraph: ...

    @property
    def buffer_graph(self) -> BufferGraph:
        return self.schedule_graph.graph

    def node(self, name: str) -> SchedulerNode:
        return self.schedule_graph.node(name)


class ExtendsFusedSchedule(ExtendsScheduleGraph):
    __slots__ = ()

    @property
    @abc.abstractmethod
    def schedule(self) -> FusedSchedule: ...

    @property
    def schedule_graph(self) -> ScheduleGraph:
        return self.schedule.graph


class ExtendsMemoryPlan(ExtendsFusedSchedule):
    __slots__ = ()

    @property
    @abc.abstractmethod
    def plan(self) -> MemoryPlan: ...

    @property
    def schedule(self) -> FusedSchedule:
        return self.plan.schedule


class ExtendsKernelProgram(ExtendsMemoryPlan):
    __slots__ = ()

    @property
    @abc.abstractmethod
    def kernel_program(self) -> KernelProgram: ...

    @property
    def plan(self) -> MemoryPlan:
        return self.kernel_program.plan

    @property
    def specs(self) -> tuple[KernelSpec, ...]:
        return self.kernel_program.specs

    def spec(self, name: str) -> KernelSpec:
        return self.kernel_program.spec(name)


class GraphInputs(ExtendsBufferGraph):
    __slots__ = ()

    @property
    def inputs(self) -> tuple[InputBuffer, ...]:
        return self.buffer_graph.inputs


class PlanKernels(ExtendsFusedSchedule):
    __slots__ = ()

    @property
    def kernels(self) -> tuple[FusedKernel, ...]:
        return self.schedule.kernels
