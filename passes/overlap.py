"""overlap : FusedSchedule -> FusedSchedule

Overlaps communication with compute (Inductor's reorder_compute_and_communication):
1. each collective's issue moves as early as its inputs allow: right after the last
   step it reads from or that writes what it reads, and never before the previous
   collective (every rank must issue the collectives in one order);
2. then each wait, last first, moves as late as its readers allow: right before the
   first step that reads its result (the tensor it returns), or that writes any
   buffer of its collective (ir.buffers.in_flight_buffers); to the graph's end when
   nothing reads it.
A move is kept only while the most bytes in flight at any step (the buffers of the
collectives issued and not yet waited) stay within Options.overlap_bytes_limit, or
within what fuse's order already had where that is more; otherwise the node moves
less far, and the log says the limit bound it.  Every move, and every node that
could not move, is an OverlapDecision in FusedSchedule.overlap_log.
"""

from __future__ import annotations

from typing import Sequence

import attrs

from coil.ir.buffers import BufferGraph, CollectiveRole, ExternBuffer, collectives, in_flight_buffers, storage_nbytes
from coil.ir.fused import FusedSchedule, OverlapDecision, Step
from coil.ir.memory import collective_spans, in_flight_at
from coil.options import Options


def _nbytes(g: BufferGraph, name: str) -> int:
    return g.sizes.shapes.hint(storage_nbytes(g, name))


def most_in_flight(g: BufferGraph, steps: Sequence[Step]) -> int:
    """The most bytes in flight after any step of this order."""
    spans = collective_spans(g, [st.nodes for st in steps])
    return max((sum(_nbytes(g, n) for n in in_flight_at(spans, i)) for i in range(len(steps))), default=0)


def _moved(steps: list[Step], src: int, dst: int) -> list[Step]:
    out = steps[:src] + steps[src + 1:]
    out.insert(dst, steps[src])
    return out


def overlap(s: FusedSchedule, options: Options) -> FusedSchedule:
    """Issues early, waits late, under the bytes-in-flight limit; pure."""
    g = s.graph
    bg = g.graph
    issues = collectives(bg)
    if not issues or options.overlap_bytes_limit <= 0:
        return s
    reads = {n.name: {d.name for d in n.read_writes.reads} for n in g.nodes}
    writes = {n.name: {d.name for d in n.read_writes.writes} - {n.name} for n in g.nodes}  # what it mutates
    steps = list(s.steps)
    limit = max(options.overlap_bytes_limit, most_in_flight(bg, steps))
    log: list[OverlapDecision] = []

    def index(node: str) -> int:
        return next(i for i, st in enumerate(steps) if node in st.nodes)

    def settle(node: str, role: CollectiveRole, at: int, goal: int, bound: str) -> None:
        """Move `node`'s step from `at` toward `goal`, as far as the limit allows."""
        nonlocal steps
        step = -1 if goal < at else 1
        target = goal
        while target != at and most_in_flight(bg, _moved(steps, at, target)) > limit:
            target -= step
            bound = f"bytes in flight over {limit}"
        steps = _moved(steps, at, target)
        log.append(OverlapDecision(node, role, at, target, bound, most_in_flight(bg, steps)))

    previous: str | None = None
    for c in issues:
        at = index(c.name)
        need = reads[c.name]
        floor, bound = 0, "the graph's start"
        for i in range(at - 1, -1, -1):
            st_nodes = steps[i].nodes
            if any(n in need or writes[n] & need for n in st_nodes):
                floor, bound = i + 1, f"its input {next(n for n in st_nodes if n in need or writes[n] & need)}"
                break
            if previous is not None and previous in st_nodes:
                floor, bound = i + 1, f"the previous collective {previous}"
                break
        settle(c.name, CollectiveRole.ISSUE, at, floor, bound)
        previous = c.name

    for c in reversed(issues):
        assert c.collective is not None
        held = set(in_flight_buffers(bg, c.name))
        for w in reversed(c.collective.pairs):
            at = index(w)
            wb = bg.get(w)
            assert isinstance(wb, ExternBuffer)
            ceiling, bound = len(steps) - 1, "the graph's end"
            for i in range(at + 1, len(steps)):
                st_nodes = steps[i].nodes
                hit = next((n for n in st_nodes if w in reads[n] or writes[n] & (held | {w})), None)
                if hit is not None:
                    ceiling, bound = i - 1, f"its first reader {hit}"
                    break
            settle(w, CollectiveRole.WAIT, at, ceiling, bound)

    return attrs.evolve(s, steps=tuple(steps), overlap_log=tuple(log))
