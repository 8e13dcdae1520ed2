"""CompiledModule: the wrapper source and one kernel source per kernel, for one
target.  `.load()` executes the source and returns the `call` function wrapped as
`compiled(*inputs) -> tuple`.

vs WrapperProgram: + Python / Triton / C++ text; - the line objects (kept as
`program` for inspection)."""

from __future__ import annotations

import attrs

from coil.ir.wrapper import WrapperProgram


@attrs.frozen
class KernelSource:
    name: str
    source: str
    language: str  # python | triton | cpp


@attrs.frozen
class CompiledModule:
    target: str
    source: str  # the whole output_code.py
    kernels: tuple[KernelSource, ...]
    program: WrapperProgram
