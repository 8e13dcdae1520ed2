"""CompiledModule: the wrapper source and one kernel source per kernel, for one
target.  `.load()` executes the source and returns the `call` function wrapped as
`compiled(*inputs) -> tuple`.

vs WrapperProgram: + Python / Triton / C++ text; - the line objects (kept as
`program` for inspection)."""

from __future__ import annotations

import enum

import attrs

from coil.ir._delegate import ExtendsKernelProgram
from coil.ir.kernel import KernelProgram
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
class CompiledModule(ExtendsKernelProgram):
    target: str
    source: str  # the whole output_code.py
    kernels: tuple[KernelSource, ...]
    program: WrapperProgram

    @property
    def kernel_program(self) -> KernelProgram:  # the link to the earlier accessors (ir/_delegate.py)
        return self.program.kernel_program
