"""WrapperProgram: the lines of the `call(args)` function, before rendering.

vs KernelProgram: + one line per allocation, reuse, view, call, free and return;
- the per-step sets (now lines).  The kernel program stays whole, with its plan
(`plan`) and kernel specs (`specs`, `spec(name)`) at the top level.

Grammar::

    WrapperProgram ::= (inputs: name*, lines: Line*, kernel_program: KernelProgram)
    Line ::= Alloc(name, layout)                 bufN = empty_strided(...)
           | Reuse(new, old)                     bufB = bufA; del bufA  # reuse
           | ReinterpretView(name, base, layout, base_offset)
                                                 bufN = reinterpret_tensor(base, ...)
           | KernelCall(kernel, args)            kernel(args..., sizes)
           | ExternCall(name, kernel, args, kwargs)
           | MultiOutputLine(name, extern, index) bufN = bufM[i]
           | Free(name, kind)                    kind: input (FreeLine)
                                                 | buffer (FreeIfNotReusedLine)
           | Return(names)
"""

from __future__ import annotations

import enum
from typing import Any, Union

import attrs

from coil.ir.buffers import Buffer, BufferGraph, InputBuffer
from coil.ir.fused import FusedKernel, FusedSchedule
from coil.ir.kernel import KernelProgram, KernelSpec
from coil.ir.layout import Layout
from coil.ir.memory import MemoryPlan
from coil.ir.schedule import ScheduleGraph, SchedulerNode


@attrs.frozen
class Alloc:
    name: str
    layout: Layout


@attrs.frozen
class Reuse:
    new: str
    old: str
    layout: Layout


@attrs.frozen
class ReinterpretView:
    """A view of `base`'s storage.  `base_offset` is None where coil allocated the
    base (its storage offset is 0, known now); else (a graph input, an extern's
    result) it is the base's storage offset at compile time, and the view sits at
    `base.storage_offset() + layout.offset - base_offset`: the same graph may be
    called with an input at another offset in its storage (q, k, v of one tensor),
    or an extern may return a tensor its meta function placed elsewhere."""

    name: str
    base: str
    layout: Layout
    base_offset: int | None = None

    def delta(self) -> int:
        """The view's offset from its base's own (base_offset given)."""
        return self.layout.offset - (self.base_offset or 0)


@attrs.frozen
class KernelCall:
    kernel: str
    args: tuple[str, ...]  # buffer names, in the kernel's parameter order


@attrs.frozen
class ExternCall:
    name: str
    kernel: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    mutated: tuple[str, ...] = ()


@attrs.frozen
class MultiOutputLine:
    name: str
    extern: str
    index: tuple[int, ...]


class FreeKind(enum.StrEnum):
    """Inductor's two free lines: a graph input's (FreeLine: `del argN_1`) and a
    buffer's (FreeIfNotReusedLine: nothing when a later Reuse takes its storage)."""

    INPUT = "input"
    BUFFER = "buffer"


@attrs.frozen
class Free:
    name: str
    kind: FreeKind = attrs.field(converter=FreeKind)


@attrs.frozen
class Return:
    names: tuple[str | None, ...]


Line = Union[Alloc, Reuse, ReinterpretView, KernelCall, ExternCall, MultiOutputLine, Free, Return]


@attrs.frozen
class WrapperProgram:
    inputs: tuple[str, ...]  # the names `call` unpacks from its args (buffer_graph.inputs: their buffers)
    lines: tuple[Line, ...]
    kernel_program: KernelProgram

    # the earlier languages' accessors, at the top level (WrapperProgram extends
    # KernelProgram), so that no reader digs through nested fields
    @property
    def plan(self) -> MemoryPlan:
        return self.kernel_program.plan

    @property
    def specs(self) -> tuple[KernelSpec, ...]:
        return self.kernel_program.specs

    def spec(self, name: str) -> KernelSpec:
        return self.kernel_program.spec(name)

    @property
    def schedule(self) -> FusedSchedule:
        return self.plan.schedule

    @property
    def schedule_graph(self) -> ScheduleGraph:
        return self.plan.schedule_graph

    @property
    def buffer_graph(self) -> BufferGraph:
        return self.plan.buffer_graph

    @property
    def kernels(self) -> tuple[FusedKernel, ...]:
        return self.plan.kernels

    def node(self, name: str) -> SchedulerNode:
        return self.plan.node(name)

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.plan.buffers

    @property
    def outputs(self) -> tuple[str | None, ...]:
        return self.plan.outputs

    def get(self, name: str) -> InputBuffer | Buffer:
        return self.plan.get(name)

    def layout(self, name: str) -> Layout:
        return self.plan.layout(name)
