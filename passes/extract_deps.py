"""extract_deps : BufferGraph -> ScheduleGraph

The seed's fork in `_compute_attrs`:
- Path A, ComputedBuffer: a DepsHandler walks the body; every load becomes a
  MemoryDep (name, normalized storage index, ranges) and the store one write.  An
  indirect load (its index depends on values) may touch any element: a StarDep.
- Path B, ExternBuffer: reads come from the declared inputs, as StarDeps.
Aliases and tuple results are no-op nodes.  A mutation adds WeakDeps so the mutating
node runs after every earlier reader of what it mutates, and a data-dependent size
(u0) adds WeakDeps so every node that uses it runs after the extern whose result
it is the size of (wrap binds it there).
"""

from __future__ import annotations

import functools
import logging
from typing import Sequence

import attrs
import sympy

from coil.ir.buffers import AliasBuffer, BufferGraph, ComputedBuffer, ExternBuffer, MultiOutputBuffer
from coil.ir.expr import IndirectLoad, Load, NoValues, evaluate, rsyms, xsyms
from coil.ir.indexing import numel
from coil.ir.layout import Layout
from coil.ir.lowered import extern_tensor_names
from coil.ir.schedule import Dep, MemoryDep, NodeKind, ReadWrites, ScheduleGraph, SchedulerNode, StarDep, WeakDep
from coil.ir.shapes import Size, is_unbacked_symbol, norm
from coil.options import Options

log = logging.getLogger("coil.trace")


def canonical(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"c{i}", integer=True, nonnegative=True)


def normalize_dep(index: sympy.Expr, var_names: Sequence[sympy.Symbol], size: Sequence[Size]) -> tuple[sympy.Expr, tuple[sympy.Symbol, ...], tuple[Size, ...]]:
    """Drop size-1 vars, merge neighbours that walk memory contiguously (or are both
    unused), rename to c0, c1, ...: equal accesses over equal ranges compare equal."""
    return _normalized(index, tuple(var_names), tuple(size))


# a pure function of sympy values: a graph asks it the same many times (MobileNetV2's
# training graphs at the CPU size: 2299 calls, 4 of their 32 s of passes, most in sympy.diff)
@functools.lru_cache(maxsize=16384)
def _normalized(index: sympy.Expr, var_names: tuple[sympy.Symbol, ...], size: tuple[Size, ...]
                ) -> tuple[sympy.Expr, tuple[sympy.Symbol, ...], tuple[Size, ...]]:
    index = sympy.expand(index.subs({v: 0 for v, s in zip(var_names, size) if s == 1}))
    vs = [v for v, s in zip(var_names, size) if s != 1]
    ss = [norm(s) for s in size if s != 1]
    loop_vars = set(var_names)

    def coeff(v: sympy.Symbol) -> sympy.Expr | None:
        # a constant stride: an integer, or an expression of size symbols only
        d = sympy.diff(index, v)
        return d if d.is_Integer or (d.free_symbols and not d.free_symbols & loop_vars and d.is_polynomial()) else None

    def same(a: sympy.Expr, b: sympy.Expr) -> bool:
        return bool(a == b) if a.is_Integer and b.is_Integer else sympy.expand(a - b) == 0

    i = len(vs) - 2
    while i >= 0:
        a, b = vs[i], vs[i + 1]
        ca, cb = coeff(a), coeff(b)
        if ca is not None and cb is not None and same(ca, cb * ss[i + 1]):
            m = sympy.Symbol(f"m{len(vs)}_{i}", integer=True, nonnegative=True)
            index = sympy.expand(index - ca * a - cb * b + cb * m)
            vs[i : i + 2] = [m]
            ss[i : i + 2] = [norm(ss[i] * ss[i + 1])]
        i -= 1
    rename = {v: canonical(k) for k, v in enumerate(vs)}
    return index.xreplace(rename), tuple(rename[v] for v in vs), tuple(ss)


class DepsHandler(NoValues):
    """Records each load as a MemoryDep over the node's iteration vars."""

    def __init__(self, layouts: dict[str, Layout], var_names: Sequence[sympy.Symbol], size: Sequence[int]) -> None:
        self.layouts = layouts
        self.var_names = tuple(var_names)
        self.size = tuple(size)
        self.reads: list[Dep] = []

    def load(self, node: Load, mask: None) -> None:
        # a masked load reads a subset of these positions: the dep over-approximates
        offset = self.layouts[node.name].offset_of(node.index)
        idx, vs, ss = normalize_dep(offset, self.var_names, self.size)
        self.reads.append(MemoryDep(node.name, idx, vs, ss))

    def indirect_load(self, node: IndirectLoad, values: tuple[None, ...], mask: None) -> None:
        # the whole buffer: never served from registers, never kernel-internal
        self.reads.append(StarDep(node.name))


def computed_read_writes(b: ComputedBuffer, layouts: dict[str, Layout]) -> ReadWrites:
    xs, rs = xsyms(len(b.ranges)), rsyms(len(b.reduction_ranges))
    h = DepsHandler(layouts, (*xs, *rs), (*b.ranges, *b.reduction_ranges))
    evaluate(b.body, h)
    widx, wv, ws = normalize_dep(b.layout.offset_of(xs), xs, b.ranges)
    return ReadWrites(frozenset(h.reads), frozenset({MemoryDep(b.name, widx, wv, ws)}))


def extract_deps(g: BufferGraph, options: Options) -> ScheduleGraph:
    """One SchedulerNode per buffer, with read_writes."""
    layouts = {b.name: b.layout for b in (*g.inputs, *g.buffers) if b.layout is not None}
    nodes: list[SchedulerNode] = []
    readers_so_far: dict[str, list[str]] = {}
    mutation_real_name: list[tuple[str, str]] = []
    owner_of: dict[str, str] = {}  # the same pairs, for chains of such externs
    bound_by = _unbacked_sources(g)
    for b in g.buffers:
        match b:
            case ComputedBuffer():
                rw = computed_read_writes(b, layouts)
                kind = NodeKind.REDUCTION if b.is_reduction else NodeKind.POINTWISE
                group = (numel(b.ranges), numel(b.reduction_ranges) if b.is_reduction else 1)
            case ExternBuffer():
                names = extern_tensor_names((b.args, tuple(v for _, v in b.kwargs)))
                reads: set[Dep] = {StarDep(n) for n in names}
                writes: set[Dep] = {StarDep(b.name), *(StarDep(m) for m in b.mutated)}
                for m in b.mutated:
                    reads |= {WeakDep(r, b.name) for r in readers_so_far.get(m, []) if r != b.name}
                    if b.layout is not None:  # the result is the tensor it wrote: named by its storage's owner
                        owner_of[b.name] = owner_of.get(m, m)
                        mutation_real_name.append((b.name, owner_of[b.name]))
                rw = ReadWrites(frozenset(reads), frozenset(writes))
                kind, group = NodeKind.EXTERN, (0, 0)
            case MultiOutputBuffer():
                rw = ReadWrites(frozenset({StarDep(b.extern)}), frozenset({StarDep(b.name)}))
                kind, group = NodeKind.NOP, (0, 0)
            case AliasBuffer():
                rw = ReadWrites(frozenset({StarDep(b.base)}), frozenset({StarDep(b.name)}))
                kind, group = NodeKind.NOP, (0, 0)
        if bound_by:
            after = {bound_by[s] for s in _symbols_in(b) if s in bound_by} - {b.name}
            if after:
                rw = ReadWrites(rw.reads | {WeakDep(n, b.name) for n in after}, rw.writes)
        for d in rw.reads:
            readers_so_far.setdefault(d.name, []).append(b.name)
        log.debug("read_writes %s: reads=%s writes=%s", b.name,
                  sorted(d.name for d in rw.reads), sorted(d.name for d in rw.writes))
        nodes.append(SchedulerNode(b.name, kind, group, rw, b.origins, b.ops))
    return ScheduleGraph(tuple(nodes), g, tuple(mutation_real_name))


def _unbacked_sources(g: BufferGraph) -> dict[sympy.Symbol, str]:
    """Each data-dependent size symbol and the first extern result (or item of
    one) whose size it is, where wrap binds it."""
    # a SymInt input's `u` symbol is known on entry: no extern binds it
    unbacked = {s for s in g.sizes.shapes.symbols if is_unbacked_symbol(s)} - set(g.sizes.entry_symbols())
    out: dict[sympy.Symbol, str] = {}
    for b in g.buffers:
        if isinstance(b, (ExternBuffer, MultiOutputBuffer)) and b.layout is not None:
            for v in b.layout.size:
                if v in unbacked:
                    out.setdefault(v, b.name)
        if isinstance(b, ExternBuffer) and b.scalar in unbacked:  # `.item()`: the number it returns
            out.setdefault(b.scalar, b.name)
    return out


def _symbols_in(v: object) -> set[sympy.Symbol]:
    """The symbols anywhere in a buffer: its layout, ranges, body, arguments."""
    if isinstance(v, sympy.Basic):
        return {s for s in v.free_symbols if isinstance(s, sympy.Symbol)}
    if isinstance(v, (tuple, list, frozenset, set)):
        return set().union(*(_symbols_in(x) for x in v)) if v else set()
    if attrs.has(type(v)):
        return set().union(*(_symbols_in(getattr(v, f.name)) for f in attrs.fields(type(v))))  # type: ignore[arg-type]
    return set()
