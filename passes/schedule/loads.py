"""Loads from memory: which ones each scope issues before its arithmetic.

On a target whose traits issue loads first (Triton's, as Inductor's kernels do),
a scope reads memory before it computes, so the loads' latency overlaps the
arithmetic that follows: a one-scope kernel's Body issues every load from memory
of its bodies (a tiled kernel's in tiling.py's load_order), each step of a
reduction loop those of the bodies it computes (not an online sum's, which takes
its max's values), without those an outer stage before it computed already
(their values stay valid inside the loop).  Loads of nodes the kernel computes
come from registers and stay where they are read.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import attrs

from coil.ir.expr import Expr, Load, walk
from coil.ir.kernel import Body, KernelSpec, Loop, Outer, Stage, Tiled, Update
from coil.ir.layout import Layout
from coil.passes.schedule.tiling import load_order


def memory_loads(bodies: Iterable[Expr], inside: set[str]) -> tuple[Load, ...]:
    """The loads from memory of `bodies` (not of a node in `inside`), each once, in
    the order they are first evaluated."""
    return tuple(dict.fromkeys(e for b in bodies for e in walk(b) if isinstance(e, Load) and e.name not in inside))


def loads_first(spec: KernelSpec, layouts: Mapping[str, Layout]) -> tuple[Stage, ...]:
    """The spec's stages, each Body and Loop with the loads it issues first."""
    inside = {n.name for n in spec.nodes}
    body = {n.name: n.body for n in spec.nodes}
    before: set[Expr] = set()  # what the outer stages so far computed
    out: list[Stage] = []
    for st in spec.stages:
        match st:
            case Body() if isinstance(spec.space, Tiled):
                st = attrs.evolve(st, loads=load_order(spec.nodes, layouts))
            case Body():
                st = attrs.evolve(st, loads=memory_loads((body[n] for n in st.nodes), inside))
            case Outer():
                before.update(e for n in st.nodes for e in walk(body[n]))
            case Loop():
                online = {a.node for a in st.accumulators if a.update is Update.ONLINE_SUM}
                found = memory_loads((body[n] for n in st.computes if n not in online), inside)
                st = attrs.evolve(st, loads=tuple(ld for ld in found if ld not in before))
        out.append(st)
    return tuple(out)
