"""MemoryPlan: execution order with last_usage, allocations, reuses and frees per
step, the buffers kept inside one kernel, and the peak-memory estimate.

vs FusedSchedule: + per-step last_usage / allocs / reuses / frees, + removed
(kernel-internal buffers: never allocated), + peak_bytes and the order strategy
chosen; - nothing.

Grammar::

    MemoryPlan ::= (steps: PlannedStep*, schedule: FusedSchedule, removed: name set,
                    peak_bytes, strategy: Order, candidates: (Order, peak_bytes)*)
    PlannedStep ::= (step, last_usage: name set, allocs: name*, reuses: (new, old)*,
                     frees: name*, live_bytes: int, inplace: name*, in_flight: name*,
                     elided: bool)
                     inplace: the new buffers of `reuses` that take a storage dying
                     at this very step (the kernel reads it while writing over it)
                     in_flight: the buffers of collectives issued at or before this
                     step and waited after it (`collective_spans`): none is freed
                     after this step, nor reused or taken in place by it
                     elided: an extern copy_ whose source a kernel already wrote
                     into the input it copies to (plan_memory's write-back)
"""

from __future__ import annotations

import enum
from typing import Iterable, Sequence

import attrs

from coil.ir._delegate import GraphInputs, PlanKernels
from coil.ir.buffers import BufferGraph, collectives, copy_operands, in_flight_buffers
from coil.ir.fused import FusedSchedule, Step


class Order(enum.StrEnum):
    """The execution orders plan_memory tries (reorder_for_peak_memory), as
    Inductor's memory.py names them; it keeps the one of lowest peak."""

    ORIGINAL = "original"  # fuse's order
    LPMF = "lpmf"  # least peak memory first
    BFS = "bfs"
    DFS = "dfs"


def _candidates(value: Iterable[tuple[str, int]]) -> tuple[tuple[Order, int], ...]:
    return tuple((Order(name), int(peak)) for name, peak in value)


@attrs.frozen
class PlannedStep:
    step: Step
    last_usage: frozenset[str]  # names whose last reader is this step
    allocs: tuple[str, ...]  # buffers given fresh storage before the step
    reuses: tuple[tuple[str, str], ...]  # (new, old): new takes old's storage
    frees: tuple[str, ...]  # names deleted after the step (inputs included)
    live_bytes: int  # bytes allocated while the step runs
    # the new buffers of `reuses` that take their old storage in place: the old one
    # dies at this step, which reads it through the new one (plan_memory.inplace_source)
    inplace: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()  # collectives' buffers still in flight after this step
    # an extern copy_ into a graph input whose source an earlier kernel wrote into
    # that input in place (plan_memory's write-back): the wrapper makes no call
    elided: bool = False

    @property
    def inplace_pairs(self) -> tuple[tuple[str, str], ...]:
        """(new, old) of the reuses made in place."""
        return tuple((new, old) for new, old in self.reuses if new in self.inplace)


@attrs.frozen
class CollectiveSpan:
    """A collective in an order of steps: issued at step `issue`, completed by its
    last wait at step `wait` (len(steps) when the graph does not wait on it); its
    `buffers` (ir.buffers.in_flight_buffers) are in flight at the steps issue..wait-1."""

    collective: str
    issue: int
    wait: int
    buffers: tuple[str, ...]


def collective_spans(g: BufferGraph, steps: Sequence[Sequence[str]]) -> tuple[CollectiveSpan, ...]:
    """Each collective's span in an order of steps, given as the node names of each."""
    at = {n: i for i, nodes in enumerate(steps) for n in nodes}
    out = []
    for c in collectives(g):
        assert c.collective is not None
        waits = [at[w] for w in c.collective.pairs]
        out.append(CollectiveSpan(c.name, at[c.name], max(waits, default=len(steps)), in_flight_buffers(g, c.name)))
    return tuple(out)


def in_flight_at(spans: Sequence[CollectiveSpan], step: int) -> tuple[str, ...]:
    """The buffers in flight after `step`: of the collectives issued then or before and not yet waited."""
    names = {n for sp in spans if sp.issue <= step < sp.wait for n in sp.buffers}
    return tuple(sorted(names, key=lambda n: (len(n), n)))


@attrs.frozen
class MemoryPlan(PlanKernels, GraphInputs):  # PlanKernels extends FusedSchedule
    steps: tuple[PlannedStep, ...]
    schedule: FusedSchedule  # the link to the earlier accessors (ir/_delegate.py)
    removed: frozenset[str]  # written and read inside one kernel only
    peak_bytes: int
    strategy: Order = attrs.field(default=Order.ORIGINAL, converter=Order)
    candidates: tuple[tuple[Order, int], ...] = attrs.field(default=(), converter=_candidates)

    @property
    def write_backs(self) -> tuple[tuple[str, str], ...]:
        """(source, input) of each elided copy_(input, source): the source's kernel
        wrote it into the input's storage in place."""
        pairs = (copy_operands(self.buffer_graph.get(ps.step.nodes[0])) for ps in self.steps if ps.elided)
        return tuple((src, dst) for dst, src in filter(None, pairs))
