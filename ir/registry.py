"""The languages coil knows, each with its printer and its verifier, in one table.

`show` (coil.ir.printer) and `verify` (coil.ir.verify) look a value's language up
here, so a language is known because it has a row, not because some module that
registers it happened to be imported first.  A new language adds one row."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs

from coil.ir.buffers import BufferGraph
from coil.ir.fused import FusedSchedule
from coil.ir.kernel import KernelProgram
from coil.ir.lowered import LoweredGraph
from coil.ir.memory import MemoryPlan
from coil.ir.module import CompiledModule
from coil.ir.printer import show_buffers, show_lowered, show_schedule
from coil.ir.printer_back import show_fused, show_module, show_plan, show_wrapper
from coil.ir.printer_kernel import show_kernel_program
from coil.ir.schedule import ScheduleGraph
from coil.ir.verify import verify_buffers, verify_lowered, verify_schedule
from coil.ir.verify_back import verify_fused, verify_module, verify_plan, verify_wrapper
from coil.ir.verify_kernel import verify_kernel_program
from coil.ir.wrapper import WrapperProgram

Printer = Callable[[Any], str]
Verifier = Callable[[Any, str], None]  # (ir, the stage that produced it); raises VerifyError


@attrs.frozen
class Language:
    cls: type
    show: Printer
    verify: Verifier


# in the order of the chain
LANGUAGES: tuple[Language, ...] = (
    Language(LoweredGraph, show_lowered, verify_lowered),
    Language(BufferGraph, show_buffers, verify_buffers),
    Language(ScheduleGraph, show_schedule, verify_schedule),
    Language(FusedSchedule, show_fused, verify_fused),
    Language(MemoryPlan, show_plan, verify_plan),
    Language(KernelProgram, show_kernel_program, verify_kernel_program),
    Language(WrapperProgram, show_wrapper, verify_wrapper),
    Language(CompiledModule, show_module, verify_module),
)

PRINTERS: Mapping[type, Printer] = {lang.cls: lang.show for lang in LANGUAGES}
VERIFIERS: Mapping[type, Verifier] = {lang.cls: lang.verify for lang in LANGUAGES}
