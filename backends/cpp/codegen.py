"""The `cpp` target: C++ kernels with OpenMP for CPU tensors.

Every fused kernel becomes one `extern "C"` function (backends/cpp/kernel.py);
all kernels of a graph form ONE translation unit, which includes the prelude
header (include/coil_prelude.h, not inlined), embedded in output_code.py as a
string, compiled (once, cached by hash) and loaded with ctypes when the module is
imported (backends/cpp/build.py).  A launch passes the tensors and the sizes
to a launcher that reads their pointers in C (backends/cpp/fastcall.py).
A kernel that makes run-time checks is followed by a look at the translation
unit's error word (`_cpp_err`, the header's coil_error): when a check failed,
eager's error is raised there.  Kernels without checks pay nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from coil.backends.common import repeated_kernels
from coil.backends.cpp.kernel import kernel_source, kernels_of, pointer_count, size_count, translation_unit
from coil.errors import CoilError
from coil.ir.bounds import runtime_checks
from coil.ir.module import KernelSource
from coil.ir.wrapper import KernelCall, WrapperProgram
from coil.ir.shapes import py_size
from coil.options import Options
from coil.passes.kernel_model import kernel_buffers


class CppBackend:
    language = "cpp"

    def header(self, options: Options) -> list[str]:
        return ["from coil.backends.cpp import build as _cpp_build"]

    def kernels(self, program: WrapperProgram, options: Options) -> tuple[KernelSource, ...]:
        return tuple(kernel_source(k, program, options) for k in program.kernels)

    def definitions(self, kernels: Sequence[KernelSource], options: Options,
                    program: WrapperProgram) -> list[str]:
        if not kernels:
            return []
        shared = repeated_kernels(kernels, r'^extern "C" \w+ (\w+)\(', "//")  # compiled once, called by each name
        source = translation_unit([k for k in kernels if k.name not in shared])
        if "'''" in source or "\\" in source:
            raise CoilError("C++ source cannot be embedded as a raw string", stage="kernel_gen")
        lines = [
            f"_cpp_source = r'''{source}'''",
            "",
            f"_cpp_lib = _cpp_build.load_library(_cpp_source, {options.cache_dir!r})",
        ]
        lines += [f"{k.name} = _cpp_build.launcher(_cpp_lib, {k.name!r}, {pointer_count(k.source)}, "
                  f"{size_count(k.source)}, {options.cache_dir!r})" for k in kernels if k.name not in shared]
        lines += [f"{name} = {earlier}  # the same kernel's source" for name, earlier in shared.items()]
        lines.append("_cpp_err = _cpp_build.error_word(_cpp_lib)")
        return lines

    def call(self, line: KernelCall, program: WrapperProgram, options: Options) -> list[str]:
        """`kernel(buf, ..., xnumel, rnumel)`, the tensors themselves (the
        launcher reads their pointers in C); every named tensor stays bound in
        `call` while the kernel runs."""
        k = kernels_of(program)[line.kernel]
        out = [f"{line.kernel}({', '.join([*line.args, py_size(k.group[0]), py_size(k.group[1]), *line.sizes])})"]
        g = program.schedule_graph
        if any(runtime_checks(b.body) for b in kernel_buffers(k, g)):
            out.append("if _cpp_err[0]: _cpp_build.raise_check(_cpp_err)")
        return out
