"""pair_collectives : BufferGraph -> BufferGraph (a step of realize)

Marks each asynchronous `_c10d_functional` collective and each `wait_tensor` with
its Collective (ir/buffers.py): an issue names the waits that complete it, a wait
names the collective it completes.  A wait reaches its collective through the
MultiOutputBuffers of a coalesced collective and through views.

wait_tensor returns the very tensor it waits on, so a wait is marked as mutating
its argument (Inductor's _WaitKernel does the same): extract_deps then records its
mutation_real_name, and the collective's result lives as long as the wait's readers.
Without it the result was freed at the wait while the wait's result, the same
storage, was still read (Options.sanitize poisoned it: wrong results).  The externs stay
whole (not decomposed): the wrapper calls them as Inductor calls its
_CollectiveKernel, and plan_memory holds what they touch until their waits.
"""

from __future__ import annotations

import attrs

from coil.ir.buffers import (COLLECTIVE_KERNELS, WAIT_KERNEL, Buffer, BufferGraph, Collective, CollectiveRole,
                             ExternBuffer, storage_bases)
from coil.ir.lowered import extern_tensor_names


def pair_collectives(g: BufferGraph) -> BufferGraph:
    waits: dict[str, list[str]] = {}  # collective -> its waits
    completes: dict[str, tuple[str, ...]] = {}  # wait -> its collective (or none)
    waited: dict[str, tuple[str, ...]] = {}  # wait -> the tensor it waits on (and returns)
    issues = {b.name for b in g.buffers if isinstance(b, ExternBuffer) and b.kernel in COLLECTIVE_KERNELS}
    for b in g.buffers:
        if isinstance(b, ExternBuffer) and b.kernel == WAIT_KERNEL:
            refs = extern_tensor_names((b.args, tuple(v for _, v in b.kwargs)))
            found = [n for r in refs for n in storage_bases(g, r) if n in issues][:1]
            completes[b.name] = tuple(found)
            waited[b.name] = tuple(refs[:1])
            for c in found:
                waits.setdefault(c, []).append(b.name)
    if not issues and not completes:
        return g

    def mark(b: Buffer) -> Buffer:
        if not isinstance(b, ExternBuffer):
            return b
        if b.name in issues:
            return attrs.evolve(b, collective=Collective(CollectiveRole.ISSUE, tuple(waits.get(b.name, ()))))
        if b.name in completes:
            return attrs.evolve(b, collective=Collective(CollectiveRole.WAIT, completes[b.name]),
                                mutated=tuple(dict.fromkeys((*b.mutated, *waited[b.name]))))
        return b

    return attrs.evolve(g, buffers=tuple(mark(b) for b in g.buffers))
