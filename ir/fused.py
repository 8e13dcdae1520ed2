"""FusedSchedule: ordered steps (fused kernels, extern calls, no-ops) and the log of
every fusion decision.

vs ScheduleGraph: + steps in execution order, each a group of scheduler nodes;
+ fusion_log (every pair considered, with verdict, reason and score); - nothing.

Grammar::

    FusedSchedule ::= (steps: Step*, graph: ScheduleGraph, fusion_log: FusionDecision*,
                       overlap_log: OverlapDecision*)
    Step ::= FusedKernel(name, nodes, kind, group)   kind: pointwise | reduction
                                                     | persistent (KernelKind)
           | ExternStep(name)                        one extern scheduler node
           | NopStep(name)                           an alias: no kernel
    FusionDecision ::= (round, node1, node2, direction, verdict, reason, score)
    direction ::= vertical | horizontal              (Direction)
    verdict ::= fused | illegal | refused            (Verdict)
    OverlapDecision ::= (node, role: issue | wait, before, after, bound, in_flight_bytes)
                                     the overlap stage moved a collective's issue
                                     earlier or its wait later, from step `before`
                                     to `after`; `bound`: what stopped it there
"""

from __future__ import annotations

import enum
from typing import Union

import attrs

from coil.ir._delegate import ExtendsScheduleGraph, GraphInputs
from coil.ir.buffers import CollectiveRole
from coil.ir.schedule import ScheduleGraph


class KernelKind(enum.StrEnum):
    """How a fused kernel iterates: pointwise, a looped reduction, or a persistent
    one (the whole reduction held at once)."""

    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    PERSISTENT = "persistent"


class Direction(enum.StrEnum):
    """How two fusion candidates relate: a producer and its consumer, or siblings."""

    VERTICAL = "vertical"
    HORIZONTAL = "horizontal"


class Verdict(enum.StrEnum):
    """What fuse decided for a pair: fused; illegal (a legality rule failed); refused
    (legal alone, but it would make a cycle, or hold a large buffer across Extern
    steps)."""

    FUSED = "fused"
    ILLEGAL = "illegal"
    REFUSED = "refused"


@attrs.frozen(cache_hash=True)
class FusedKernel:
    name: str  # triton_poi_fused_<ops>_N, triton_red_..., triton_per_..., cpp_fused_...
    nodes: tuple[str, ...]  # scheduler node names, in the order they run inside
    kind: KernelKind = attrs.field(converter=KernelKind)
    group: tuple[int, int]  # (numel, reduction numel)


@attrs.frozen(cache_hash=True)
class ExternStep:
    name: str

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.name,)


@attrs.frozen(cache_hash=True)
class NopStep:
    name: str

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.name,)


Step = Union[FusedKernel, ExternStep, NopStep]


@attrs.frozen
class FusionDecision:
    round: int
    node1: str
    node2: str
    direction: Direction = attrs.field(converter=Direction)
    verdict: Verdict = attrs.field(converter=Verdict)
    reason: str  # which legality rule failed, "cycle", "saves N bytes" or "saves a launch ..."
    score: int


@attrs.frozen
class OverlapDecision:
    """One move of the overlap stage (passes/overlap.py)."""

    node: str  # the collective (role issue) or the wait (role wait) moved
    role: CollectiveRole = attrs.field(converter=CollectiveRole)
    before: int  # its step index before the move
    after: int  # ... and after (equal: it could not move)
    bound: str  # what stopped it: its input, its first reader, the previous collective, the bytes limit
    in_flight_bytes: int  # the most bytes in flight at any step of the order after the move

    def show(self) -> str:
        return (f"{self.role} {self.node}: step {self.before} -> {self.after} (bound: {self.bound}) "
                f"in_flight_bytes={self.in_flight_bytes}")


@attrs.frozen
class FusedSchedule(ExtendsScheduleGraph, GraphInputs):
    steps: tuple[Step, ...]
    graph: ScheduleGraph
    fusion_log: tuple[FusionDecision, ...] = ()
    overlap_log: tuple[OverlapDecision, ...] = ()

    @property
    def kernels(self) -> tuple[FusedKernel, ...]:
        return tuple(s for s in self.steps if isinstance(s, FusedKernel))

    def step_of(self, node: str) -> Step:
        for s in self.steps:
            if node in s.nodes:
                return s
        raise KeyError(node)

    @property
    def schedule_graph(self) -> ScheduleGraph:  # the link to the earlier accessors (ir/_delegate.py)
        return self.graph
