"""kernel_gen : WrapperProgram -> CompiledModule

The last stage, the backends' own: asks the target's KernelBackend for one source
per kernel and renders the wrapper around them.  It lives here, not in passes/,
because the passes know no backend; coil.default_pipeline hands it to the chain.
Backends come from a table, imported on first use."""

from __future__ import annotations

import importlib
import logging

from coil.backends.common import KernelBackend
from coil.backends.wrapper import render_module
from coil.errors import CoilError
from coil.ir.module import CompiledModule
from coil.ir.wrapper import WrapperProgram
from coil.options import Options

log = logging.getLogger("coil.trace")

BACKENDS: dict[str, tuple[str, str]] = {
    "reference": ("coil.backends.reference_kernels", "ReferenceBackend"),
    "triton": ("coil.backends.triton.codegen", "TritonBackend"),
    "cpp": ("coil.backends.cpp.codegen", "CppBackend"),
}


def backend_for(target: str) -> KernelBackend:
    if target not in BACKENDS:
        raise CoilError(f"no kernel backend for target {target!r}", stage="kernel_gen")
    module, cls = BACKENDS[target]
    return getattr(importlib.import_module(module), cls)()  # type: ignore[no-any-return]


def kernel_gen(program: WrapperProgram, options: Options) -> CompiledModule:
    """Kernel sources plus the wrapper: the whole output_code.py."""
    backend = backend_for(options.target)
    kernels = backend.kernels(program, options)
    for k in kernels:
        log.debug("kernel codegen %s (%d lines)", k.name, k.source.count("\n") + 1)
    source = render_module(program, backend, kernels, options)
    return CompiledModule(options.target, source, kernels, program)
