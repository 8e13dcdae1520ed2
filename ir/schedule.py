"""ScheduleGraph: one SchedulerNode per buffer, with its read_writes.

vs BufferGraph: + read_writes (MemoryDep | StarDep | WeakDep) per node, + the
iteration group (numel, reduction numel) of each node, + mutation_real_name;
- nothing.

Grammar::

    ScheduleGraph ::= (nodes: SchedulerNode*, graph: BufferGraph,
                       mutation_real_name: (name -> name)*)
    SchedulerNode ::= (name, kind, group, read_writes)
    kind ::= pointwise | reduction | extern | nop          (NodeKind)
    ReadWrites ::= (reads: Dep set, writes: Dep set)
    Dep ::= MemoryDep(name, index, var_names, size)   flat storage offset over
                                                      canonical vars c0..ck
          | StarDep(name)                             the whole buffer (externs)
          | WeakDep(name, mutating_buf)               ordering only; keeps nothing alive
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Iterable, Union

import attrs
import sympy

from coil.ir._delegate import GraphInputs
from coil.ir.buffers import Buffer, BufferGraph
from coil.ir.shapes import Size, sizes


def _exprs(value: Any) -> tuple[sympy.Symbol, ...]:
    return tuple(value)


def _ints(value: Any) -> tuple[Size, ...]:
    return sizes(value)  # ints, or expressions over size symbols (ir/shapes.py)


def _expr(value: object) -> sympy.Expr:
    return sympy.sympify(value)


@attrs.frozen(cache_hash=True)
class MemoryDep:
    name: str
    index: sympy.Expr = attrs.field(converter=_expr)
    var_names: tuple[sympy.Symbol, ...] = attrs.field(converter=_exprs)
    size: tuple[Size, ...] = attrs.field(converter=_ints)

    def numel(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n

    def show(self) -> str:
        ranges = ", ".join(f"{v}:{s}" for v, s in zip(self.var_names, self.size))
        return f"MemoryDep({self.name}, {self.index}, {{{ranges}}})"


@attrs.frozen(cache_hash=True)
class StarDep:
    name: str

    def show(self) -> str:
        return f"StarDep({self.name})"


@attrs.frozen(cache_hash=True)
class WeakDep:
    name: str
    mutating_buf: str

    def show(self) -> str:
        return f"WeakDep({self.name}, by {self.mutating_buf})"


Dep = Union[MemoryDep, StarDep, WeakDep]


def _sorted_deps(deps: Iterable[Dep]) -> tuple[Dep, ...]:
    return tuple(sorted(deps, key=lambda d: (d.name, _shown(d))))


@functools.lru_cache(maxsize=16384)
def _shown(d: Dep) -> str:
    """A dep's printed form, kept: printing sympy is slow, and the passes sort the same
    deps many times (MobileNetV2's training graphs: 3871 prints, 1.2 s)."""
    return d.show()


def _deps(value: Iterable[Dep]) -> frozenset[Dep]:
    return frozenset(value)


@attrs.frozen(cache_hash=True)
class ReadWrites:
    reads: frozenset[Dep] = attrs.field(converter=_deps)
    writes: frozenset[Dep] = attrs.field(converter=_deps)

    def sorted_reads(self) -> tuple[Dep, ...]:
        return _sorted_deps(self.reads)

    def sorted_writes(self) -> tuple[Dep, ...]:
        return _sorted_deps(self.writes)

    def merge(self, other: "ReadWrites") -> "ReadWrites":
        """The read_writes of a fused group: reads satisfied inside the group stay
        listed (the buffer may still be needed by others); plan_memory decides."""
        return ReadWrites(self.reads | other.reads, self.writes | other.writes)

    def remove_reads(self, names: Iterable[str]) -> "ReadWrites":
        drop = set(names)
        return ReadWrites(frozenset(d for d in self.reads if d.name not in drop), self.writes)


class NodeKind(enum.StrEnum):
    """What a scheduler node runs as: fusable loops (pointwise, reduction), an aten
    call (extern), or nothing (nop: an alias or one result of a tuple)."""

    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    EXTERN = "extern"
    NOP = "nop"


@attrs.frozen(cache_hash=True)
class SchedulerNode:
    name: str
    kind: NodeKind = attrs.field(converter=NodeKind)
    group: tuple[int, int]  # (numel, reduction numel); (0, 0) for extern / nop
    read_writes: ReadWrites
    origins: tuple[str, ...]
    ops: tuple[str, ...]


@attrs.frozen
class ScheduleGraph(GraphInputs):
    nodes: tuple[SchedulerNode, ...]
    graph: BufferGraph
    mutation_real_name: tuple[tuple[str, str], ...] = ()
    _by_name: dict[str, SchedulerNode] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {n.name: n for n in self.nodes})

    def node(self, name: str) -> SchedulerNode:
        return self._by_name[name]

    def buffer(self, name: str) -> Buffer:
        b = self.graph.get(name)
        return b  # type: ignore[return-value]

    @property
    def buffer_graph(self) -> BufferGraph:  # the link to the BufferGraph's accessors (ir/_delegate.py)
        return self.graph

    def mutation_names(self) -> dict[str, str]:
        return dict(self.mutation_real_name)


def used_buffer_names(node: SchedulerNode) -> frozenset[str]:
    """Every name in reads or writes (the seed's used_buffer_names)."""
    return frozenset(d.name for d in (*node.read_writes.reads, *node.read_writes.writes))


def used_or_aliased_buffer_names(node: SchedulerNode, graph: BufferGraph) -> frozenset[str]:
    """used_buffer_names plus the storages they may be views of: reading a view
    keeps its base alive, and reading the result of an extern that returns views
    of its arguments (aten.split, unbind: `returns_alias`), or one of its items,
    keeps those arguments alive.  WeakDeps only order; they keep nothing alive."""
    names = {
        d.name
        for d in (*node.read_writes.reads, *node.read_writes.writes)
        if not isinstance(d, WeakDep)
    }
    for n in list(names):
        names.update(viewed_storages(graph, n))
    return frozenset(names)


def viewed_storages(graph: BufferGraph, name: str) -> frozenset[str]:
    """The buffers whose storage `name`'s value may lie in, itself aside: an
    alias's bases, and, through an extern that returns views of its arguments
    (and the items of its tuple), those arguments and what they view in turn."""
    from coil.ir.buffers import AliasBuffer, ExternBuffer, MultiOutputBuffer
    from coil.ir.lowered import extern_tensor_names, returns_alias

    out: set[str] = set()
    todo = [name]
    while todo:
        b = graph.get(todo.pop())
        if isinstance(b, AliasBuffer):
            if b.base not in out and b.base != name:
                out.add(b.base)
                todo.append(b.base)
            continue
        if isinstance(b, MultiOutputBuffer):
            b = graph.get(b.extern)
            if b.name not in out and b.name != name:
                out.add(b.name)
        if isinstance(b, ExternBuffer) and returns_alias(b.kernel):
            for a in extern_tensor_names((b.args, tuple(v for _, v in b.kwargs))):
                if a not in out and a != name:
                    out.add(a)
                    todo.append(a)
    return frozenset(out)
