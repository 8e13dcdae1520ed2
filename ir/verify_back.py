"""Verifiers for the back half (listed in coil.ir.registry): they run
coil.ir.invariants, the same checks users run on their own passes
(coil.properties.invariants re-exports them).

FusedSchedule   F1 each scheduler node in exactly one step; order topological
MemoryPlan      M1 removed buffers are never allocated or freed; M2 no name freed twice
WrapperProgram  all invariants (lifetimes, reuse, peak replay, kernel parameters)
CompiledModule  C1 the source is valid Python
"""

from __future__ import annotations

from coil.ir.fused import FusedSchedule
from coil.ir.memory import MemoryPlan
from coil.ir.module import CompiledModule
from coil.ir.verify import fail
from coil.ir.wrapper import WrapperProgram
from coil.ir.invariants import InvariantError, check_all, check_schedule_topological


def verify_fused(s: FusedSchedule, stage: str) -> None:
    try:
        check_schedule_topological(s)
    except InvariantError as e:
        fail(s, stage, s.steps[0].nodes[0] if s.steps else "?", f"F1 {e}")


def verify_plan(p: MemoryPlan, stage: str) -> None:
    freed: set[str] = set()
    for ps in p.steps:
        for n in (*ps.allocs, *ps.frees):
            if n in p.removed:
                fail(p, stage, n, "M1 a buffer kept in registers is allocated or freed")
        for n in ps.frees:
            if n in freed:
                fail(p, stage, n, "M2 freed twice")
            freed.add(n)


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
