"""Loads from memory: which ones each scope issues before its arithmetic, and
where each lies in kernel coordinates.

On a target whose traits issue loads first (Triton's, as Inductor's kernels do),
a scope reads memory before it computes, so the loads' latency overlaps the
arithmetic that follows: a one-scope kernel's Body issues every load from memory
of its bodies (a tiled kernel's in tiling.py's load_order), each step of a
reduction loop those of the bodies it computes (not an online sum's, which takes
its max's values), without those an outer stage before it computed already
(their values stay valid inside the loop).  Loads of nodes the kernel computes
come from registers and stay where they are read.

Every load from memory is then a pointer plus its offset (`reads`): its element's
storage offset from the start of its buffer's view (the pointer the kernel is
given), simplified over the kernel's ranges, masked by the tails of the symbols
it uses (an indirect load's: also those its values use).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import attrs
import sympy

from coil.ir.expr import Expr, IndexExpr, IndirectLoad, Load, walk
from coil.ir.indexing import simplify_index
from coil.ir.kernel import RINDEX, XINDEX, Body, KernelSpec, Loop, Outer, Read, Split, Stage, Tiled, Update, tails_of
from coil.ir.layout import Layout
from coil.passes.schedule.tiling import load_order


def memory_loads(bodies: Iterable[Expr], inside: set[str]) -> tuple[Load, ...]:
    """The loads from memory of `bodies` (not of a node in `inside`), each once, in
    the order they are first evaluated."""
    return tuple(dict.fromkeys(e for b in bodies for e in walk(b) if isinstance(e, Load) and e.name not in inside))


def loads_first(spec: KernelSpec, layouts: Mapping[str, Layout]) -> tuple[Stage, ...]:
    """The spec's stages, each Body and Loop (and a split's Outer stages after its
    loop) with the loads it issues first."""
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
            case Outer() if st.level > 0 and isinstance(spec.space, Split):
                # the combine has no loop: it loads these with the partial results
                found = memory_loads((body[n] for n in st.nodes), inside)
                st = attrs.evolve(st, loads=tuple(ld for ld in found if ld not in before))
                before.update(e for n in st.nodes for e in walk(body[n]))
            case Outer():
                before.update(e for n in st.nodes for e in walk(body[n]))
            case Loop():
                online = {a.node for a in st.accumulators if a.update is Update.ONLINE_SUM}
                found = memory_loads((body[n] for n in st.computes if n not in online), inside)
                st = attrs.evolve(st, loads=tuple(ld for ld in found if ld not in before))
        out.append(st)
    return tuple(out)


def value_symbols(values: Iterable[Expr]) -> set[sympy.Basic]:
    """The loop symbols `values` depend on (those of the loads and indices in them)."""
    out: set[sympy.Basic] = set()
    for v in values:
        for e in walk(v):
            if isinstance(e, (Load, IndirectLoad)):
                for i in e.index:
                    out |= i.free_symbols
            elif isinstance(e, IndexExpr):
                out |= e.expr.free_symbols
    return out


def reads(spec: KernelSpec, layouts: Mapping[str, Layout]) -> tuple[Read, ...]:
    """Every load from memory of the spec's bodies, each once, in first-read order,
    with its offset and tails."""
    inside = {n.name for n in spec.nodes}
    found = dict.fromkeys(e for n in spec.nodes for e in walk(n.body)
                          if isinstance(e, (Load, IndirectLoad)) and e.name not in inside)
    out = []
    for ld in found:
        lay = layouts[ld.name]
        offset = sympy.expand(simplify_index(lay.offset_of(ld.index), spec.ranges) - lay.offset)
        if isinstance(ld, Load):
            out.append(Read(ld, offset, tails_of(offset.free_symbols)))
        else:  # masked by what its values use too (a tiled kernel has no indirect load)
            used = (offset.free_symbols | value_symbols(ld.values)) & {XINDEX, RINDEX}
            out.append(Read(ld, offset, tails_of(used)))
    return tuple(out)
