"""Verifiers for the back half (listed in coil.ir.registry): they run
coil.ir.invariants, the same checks users run on their own passes
(coil.properties.invariants re-exports them).

FusedSchedule   F1 each scheduler node in exactly one step; order topological;
                F2 collectives are issued in buffer (program) order
MemoryPlan      M1 removed buffers are never allocated or freed; M2 no name freed twice;
                M3 a collective's buffers (what it reads, writes and mutates) are not
                freed from its issue until its last wait, nor reused or taken in place
                from its issue through that wait; M4 each step's in_flight is what the
                collectives' spans say; M5 an elided step is a copy_ into an input whose
                source an earlier kernel wrote there in place, its result unnamed
WrapperProgram  all invariants (lifetimes, reuse, peak replay, kernel parameters)
CompiledModule  C1 the source is valid Python
"""

from __future__ import annotations

from coil.ir.buffers import collectives, copy_operands
from coil.ir.fused import FusedSchedule
from coil.ir.memory import MemoryPlan, PlannedStep, collective_spans, in_flight_at
from coil.ir.module import CompiledModule
from coil.ir.verify import fail
from coil.ir.wrapper import WrapperProgram
from coil.ir.invariants import InvariantError, check_all, check_schedule_topological


def verify_fused(s: FusedSchedule, stage: str) -> None:
    try:
        check_schedule_topological(s)
    except InvariantError as e:
        fail(s, stage, s.steps[0].nodes[0] if s.steps else "?", f"F1 {e}")
    at = {n: i for i, st in enumerate(s.steps) for n in st.nodes}
    issued = [c.name for c in collectives(s.buffer_graph)]
    for a, b in zip(issued, issued[1:]):
        if at[a] > at[b]:
            fail(s, stage, b, f"F2 collective {b} is issued at step {at[b]}, before {a} (step {at[a]}), "
                 "which comes first in the program")


def verify_plan(p: MemoryPlan, stage: str) -> None:
    freed: set[str] = set()
    written: set[tuple[str, str]] = set()  # (new, old) taken in place so far
    for ps in p.steps:
        if ps.elided:
            _verify_elided(p, ps, written, stage)
        written |= set(ps.inplace_pairs)
        for n in (*ps.allocs, *ps.frees):
            if n in p.removed:
                fail(p, stage, n, "M1 a buffer kept in registers is allocated or freed")
        for n in ps.frees:
            if n in freed:
                fail(p, stage, n, "M2 freed twice")
            freed.add(n)
    _verify_in_flight(p, stage)


def _verify_elided(p: MemoryPlan, ps: PlannedStep, written: set[tuple[str, str]], stage: str) -> None:
    """M5 an elided step is an extern copy_(input, src) whose src an earlier kernel
    wrote into that input in place, and nothing names its own result."""
    name = ps.step.nodes[0] if len(ps.step.nodes) == 1 else "?"
    pair = copy_operands(p.buffer_graph.get(name)) if name != "?" else None
    if pair is None:
        fail(p, stage, name, "M5 an elided step that is not an extern copy_")
    elif (pair[1], pair[0]) not in written:
        fail(p, stage, name, f"M5 {name} elided, but no earlier kernel wrote {pair[1]} into {pair[0]} in place")
    elif name in p.buffer_graph.outputs or any(name in q.frees for q in p.steps):
        fail(p, stage, name, "M5 the result of an elided copy_ is named (an output, or freed)")


def _verify_in_flight(p: MemoryPlan, stage: str) -> None:
    bg = p.buffer_graph
    real = p.schedule_graph.mutation_names()
    spans = collective_spans(bg, [ps.step.nodes for ps in p.steps])
    for sp in spans:
        names = set(sp.buffers) | {real.get(n, n) for n in sp.buffers}
        for i in range(sp.issue, min(sp.wait + 1, len(p.steps))):
            ps = p.steps[i]
            for n in ps.frees:
                if n in names and i < sp.wait:
                    fail(p, stage, sp.collective, f"M3 {n} is freed after step {i}, while collective "
                         f"{sp.collective} (step {sp.issue}) is in flight until its wait at step {sp.wait}")
            for new, old in ps.reuses:
                if old in names:
                    how = "in place" if new in ps.inplace else "as a reuse"
                    fail(p, stage, sp.collective, f"M3 {new} takes the storage of {old} {how} at step {i}, while "
                         f"collective {sp.collective} (step {sp.issue}) is in flight until its wait at step {sp.wait}")
    for i, ps in enumerate(p.steps):
        want = in_flight_at(spans, i)
        if ps.in_flight != want:
            fail(p, stage, ps.step.nodes[0] if ps.step.nodes else "?",
                 f"M4 step {i} says in_flight {list(ps.in_flight)}, the collectives' spans say {list(want)}")


def verify_wrapper(w: WrapperProgram, stage: str) -> None:
    try:
        check_all(w)
    except InvariantError as e:
        fail(w, stage, "WrapperProgram", str(e))


def verify_module(m: CompiledModule, stage: str) -> None:
    try:
        compile(m.source, "<output_code.py>", "exec")
    except SyntaxError as e:
        fail(m, stage, "output_code.py", f"C1 generated source does not parse: {e}")
