"""One fused kernel as one `extern "C"` C++ function over raw pointers and sizes.

Semantics come from passes/kernel_model.py: the kernel runs xindex over numel and,
for reduction kernels, rindex over rnumel; each node is a reduction, an outer node
(once per xindex) or an inner node (once per (xindex, rindex)).  plan.py puts the
nodes in the loop variables of the nest the kernel's spec chose, pointwise.py and
reduction.py spell the spec as code.  Every kernel takes its
pointers (inputs `const`, `__restrict__` all but the pairs an in-place buffer
shares: an output that plan_memory put in the storage of an input it reads, only
at the element it writes), then xnumel and rnumel.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from coil.backends.cpp import prelude
from coil.backends.cpp.handler import KernelContext
from coil.backends.cpp.plan import KernelPlan, plan_kernel
from coil.backends.cpp.pointwise import pointwise_body
from coil.backends.cpp.reduction import reduction_body
from coil.ir.fused import FusedKernel
from coil.ir.kernel import ParamRole
from coil.ir.module import KernelSource
from coil.ir.wrapper import WrapperProgram
from coil.options import Options


def shared_storage(k: FusedKernel, program: WrapperProgram) -> frozenset[str]:
    """The buffers of kernel k's in-place pairs (MemoryPlan: PlannedStep.inplace):
    an output and the input whose storage it writes over."""
    out: set[str] = set()
    for ps in program.plan.steps:
        if isinstance(ps.step, FusedKernel) and ps.step.name == k.name:
            out |= {n for pair in ps.inplace_pairs for n in pair}
    return frozenset(out)


def signature(plan: KernelPlan, shared: frozenset[str] = frozenset()) -> str:
    args = []
    for p in plan.params:
        ctype = prelude.storage_type(plan.layouts[p.name].dtype)
        const = "const " if p.role is ParamRole.IN else ""
        restrict = "" if p.name in shared else " __restrict__"
        args.append(f"{const}{ctype}*{restrict} {p.arg}")
    args += ["int64_t xnumel", "int64_t rnumel"]
    args += [f"int64_t {s}" for s in plan.spec.symbols]  # symbolic sizes, after the numels
    return f'extern "C" void {plan.kernel.name}({", ".join(args)})'


def size_count(source: str) -> int:
    """How many int64 size parameters (xnumel, rnumel and the size symbols) it takes."""
    m = re.search(r'extern "C" void \w+\(([^)]*)\)', source)
    assert m is not None, "not a coil C++ kernel"
    return m.group(1).count("int64_t ")


def pointer_count(source: str) -> int:
    """How many pointer parameters the kernel in `source` (from `kernel_source`) takes."""
    m = re.search(r'extern "C" void \w+\(([^)]*)\)', source)
    assert m is not None, "not a coil C++ kernel"
    return m.group(1).count("*")


def kernel_source(k: FusedKernel, program: WrapperProgram, options: Options) -> KernelSource:
    plan = plan_kernel(k, program)
    ctx = KernelContext({p.name: p.arg for p in plan.params}, plan.layouts, plan.nest.ranges)
    body = reduction_body(plan, ctx, options) if plan.is_reduction else pointwise_body(plan, ctx, options)
    origins = sorted({o for nd in plan.nodes for o in nd.buf.origins})
    lines = [
        f"// {k.name}: {k.kind} group={list(k.group)} nodes={list(k.nodes)}",
        f"// from {', '.join(origins)}",
        signature(plan, shared_storage(k, program)) + " {",
        *([] if plan.is_reduction else ["  (void)rnumel;"]),
        *("  " + ln for ln in body),
        "}",
    ]
    return KernelSource(k.name, "\n".join(lines), "cpp")


def translation_unit(kernels: Sequence[KernelSource]) -> str:
    """All kernels of a graph in one translation unit, after the #include of the
    prelude header (include/coil_prelude.h)."""
    return "\n\n".join([prelude.INCLUDE, *(k.source for k in kernels)]) + "\n"


def kernels_of(program: WrapperProgram) -> dict[str, FusedKernel]:
    return {k.name: k for k in program.kernels}
