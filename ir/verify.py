"""`verify(ir, stage)`: each language's invariants.  An error names the stage, the
node and the broken rule, and prints the IR around the fault.

LoweredGraph
  L1 node names are unique
  L2 a body loads only nodes defined before it, with one index per dim
  L3 a body uses only its own loop symbols (x* for ranges, r* for reduction ranges);
     an IndirectLoad's index also ind0..ind{k-1}, one per value it binds
  L4 outputs name defined nodes
  L5 a load's mask, if any, is a bool expression (where false the load yields 0)
BufferGraph
  B1 buffers are named buf0, buf1, ... in order; inputs keep their names
  B2 bodies load only inputs and earlier buffers, one index per dim
  B3 every buffer has a rule; a ComputedBuffer's layout size equals its ranges, and
     its inner and walk orders, if any, are permutations of a pointwise buffer's dims
  B4 bodies use only their own loop symbols (and an IndirectLoad its own ind*)
  B5 a reduction's type is one of REDUCTION_TYPES
  B6 a load's mask, if any, is a bool expression
  B7 collectives pair with their waits: an issue is a collective kernel whose waits
     are later wait_tensor externs naming it back; a wait is a wait_tensor whose
     collective is an earlier issue naming it back; every collective kernel is marked
ScheduleGraph
  S1 one node per buffer, in buffer order
  S2 every dep names an input or a buffer defined before the node (WeakDeps: any)
  S3 a node's writes include itself
The later languages' checks are in `coil.ir.verify_back`; which function checks
which language is the table in `coil.ir.registry`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import sympy
import torch

from coil.errors import CoilError
from coil.ir.buffers import COLLECTIVE_KERNELS, WAIT_KERNEL, BufferGraph, CollectiveRole, ComputedBuffer, ExternBuffer
from coil.ir.expr import REDUCTION_TYPES, Expr, IndexExpr, IndirectLoad, Load, walk
from coil.ir.lowered import LoweredGraph, Pointwise, Reduction, View, extern_tensor_names, Extern, MultiOutput
from coil.ir.schedule import ScheduleGraph, WeakDep


class VerifyError(CoilError):
    """A broken IR invariant."""


class UnknownLanguage(TypeError):
    """`verify` was given a value of no language coil knows (a user's stage may
    return one); kept apart from the TypeErrors a verifier itself may raise."""


def verifier_of(ir: Any) -> Callable[[Any, str], None] | None:
    """The verifier of ir's language, or None when coil knows no such language:
    a lookup in one table, so a TypeError from here is never the verifier's own."""
    from coil.ir.registry import VERIFIERS  # imported here: the table imports this module's verifiers

    return VERIFIERS.get(type(ir))


def verify(ir: Any, stage: str = "?") -> None:
    fn = verifier_of(ir)
    if fn is None:
        raise UnknownLanguage(f"no verifier for {type(ir).__name__}")
    fn(ir, stage)


def fail(ir: Any, stage: str, node: str, rule: str) -> None:
    from coil.ir.printer import show

    text = show(ir).splitlines()
    at = next((i for i, ln in enumerate(text) if ln.lstrip().startswith(node + " ") or ln.lstrip().startswith(node + ":")), None)
    context = text[max(0, at - 2) : at + 6] if at is not None else text[:8]
    raise VerifyError(
        f"{type(ir).__name__} invalid after {stage}: {node}: {rule}\n" + "\n".join("  | " + ln for ln in context),
        stage=stage,
        node=node,
    )


def _symbols_ok(body: Expr, nx: int, nr: int, sizes: frozenset[str] = frozenset()) -> sympy.Symbol | None:
    allowed = {f"x{i}" for i in range(nx)} | {f"r{i}" for i in range(nr)} | sizes  # and the graph's size symbols
    for e in walk(body):
        exprs: Iterable[sympy.Expr] = (
            e.index if isinstance(e, (Load, IndirectLoad)) else (e.expr,) if isinstance(e, IndexExpr) else ())
        ok = allowed | {f"ind{k}" for k in range(len(e.values))} if isinstance(e, IndirectLoad) else allowed
        for ix in exprs:
            for s in ix.free_symbols:
                if s.name not in ok:
                    return s  # type: ignore[return-value]
    return None


def _reads(body: Expr) -> list[Load | IndirectLoad]:
    return [e for e in walk(body) if isinstance(e, (Load, IndirectLoad))]


def _bad_mask(body: Expr) -> str | None:
    """What is wrong with the first load mask that is not a bool value."""
    for ld in _reads(body):
        if ld.mask is not None and ld.mask.dtype != torch.bool:
            return f"masks its load of {ld.name} with a {str(ld.mask.dtype).removeprefix('torch.')} value, not bool"
    return None


def verify_lowered(g: LoweredGraph, stage: str) -> None:
    seen: dict[str, int] = {}
    for n in g.nodes:
        if n.name in seen:
            fail(g, stage, n.name, "L1 duplicate node name")
        if isinstance(n, (Pointwise, Reduction)):
            for ld in _reads(n.body):
                if ld.name not in seen:
                    fail(g, stage, n.name, f"L2 loads {ld.name}, not defined before it")
                elif len(ld.index) != seen[ld.name]:
                    fail(g, stage, n.name, f"L2 loads {ld.name} with {len(ld.index)} indices, it has {seen[ld.name]} dims")
            nr = len(n.reduction_ranges) if isinstance(n, Reduction) else 0
            bad = _symbols_ok(n.body, len(n.ranges), nr, frozenset(x.name for x in g.sizes.shapes.symbols))
            if bad is not None:
                fail(g, stage, n.name, f"L3 uses symbol {bad} outside its loops")
            mask = _bad_mask(n.body)
            if mask is not None:
                fail(g, stage, n.name, f"L5 {mask}")
        if isinstance(n, View):
            if n.base not in seen:
                fail(g, stage, n.name, f"L2 views {n.base}, not defined before it")
            elif len(n.index) != seen[n.base]:
                fail(g, stage, n.name, f"L2 views {n.base} with {len(n.index)} indices, it has {seen[n.base]} dims")
        if isinstance(n, Extern):
            for r in extern_tensor_names((n.args, tuple(v for _, v in n.kwargs))):
                if r not in seen:
                    fail(g, stage, n.name, f"L2 extern reads {r}, not defined before it")
        seen[n.name] = -1 if (isinstance(n, Extern) and n.layout is None) else len(n.size)
        if isinstance(n, MultiOutput) and n.extern not in seen:
            fail(g, stage, n.name, f"L2 reads extern {n.extern}, not defined before it")
    for o in g.outputs:
        if o is not None and o not in seen:
            fail(g, stage, o, "L4 output names no node")


def verify_buffers(g: BufferGraph, stage: str) -> None:
    rank: dict[str, int] = {i.name: len(i.layout.size) for i in g.inputs}
    for k, b in enumerate(g.buffers):
        if b.name != f"buf{k}":
            fail(g, stage, b.name, f"B1 expected name buf{k}")
        if not b.rule:
            fail(g, stage, b.name, "B3 no realize rule")
        if isinstance(b, ComputedBuffer):
            if b.layout.size != b.ranges:
                fail(g, stage, b.name, f"B3 layout size {list(b.layout.size)} != ranges {list(b.ranges)}")
            for ld in _reads(b.body):
                if ld.name not in rank:
                    fail(g, stage, b.name, f"B2 loads {ld.name}, not an input or earlier buffer")
                elif rank[ld.name] >= 0 and len(ld.index) != rank[ld.name]:
                    fail(g, stage, b.name, f"B2 loads {ld.name} with {len(ld.index)} indices, it has {rank[ld.name]} dims")
            bad = _symbols_ok(b.body, len(b.ranges), len(b.reduction_ranges),
                              frozenset(x.name for x in g.sizes.shapes.symbols))
            if bad is not None:
                fail(g, stage, b.name, f"B4 uses symbol {bad} outside its loops")
            mask = _bad_mask(b.body)
            if mask is not None:
                fail(g, stage, b.name, f"B6 {mask}")
            if b.reduction_type is not None and b.reduction_type not in REDUCTION_TYPES:
                fail(g, stage, b.name, f"B5 unknown reduction type {b.reduction_type!r}")
            if b.inner_order and (b.is_reduction or sorted(b.inner_order) != list(range(len(b.ranges)))):
                fail(g, stage, b.name, f"B3 inner order {list(b.inner_order)} is no permutation of a pointwise "
                                       f"buffer's {len(b.ranges)} dims")
            if b.walk_order and (b.is_reduction or sorted(b.walk_order) != list(range(len(b.ranges)))):
                fail(g, stage, b.name, f"B3 walk order {list(b.walk_order)} is no permutation of a pointwise "
                                       f"buffer's {len(b.ranges)} dims")
        rank[b.name] = len(b.layout.size) if b.layout is not None else -1
    for o in g.outputs:
        if o is not None and o not in rank:
            fail(g, stage, o, "B2 output names no buffer")
    _verify_collectives(g, stage)


def _verify_collectives(g: BufferGraph, stage: str) -> None:
    pos = {b.name: k for k, b in enumerate(g.buffers)}
    for b in g.buffers:
        if not isinstance(b, ExternBuffer):
            continue
        c = b.collective
        if c is None:
            if b.kernel in COLLECTIVE_KERNELS or b.kernel == WAIT_KERNEL:
                fail(g, stage, b.name, f"B7 {b.kernel} is not marked as a collective or a wait")
            continue
        want, role = (COLLECTIVE_KERNELS, "a collective") if c.role is CollectiveRole.ISSUE else ({WAIT_KERNEL}, "a wait")
        if b.kernel not in want:
            fail(g, stage, b.name, f"B7 marked {c.role} but {b.kernel} is not {role}")
        if c.role is CollectiveRole.WAIT and len(c.pairs) > 1:
            fail(g, stage, b.name, f"B7 a wait completes one collective, not {list(c.pairs)}")
        for p in c.pairs:
            other = g.get(p) if p in pos else None
            back = other.collective if isinstance(other, ExternBuffer) else None
            after = c.role is CollectiveRole.ISSUE
            if back is None or back.role is c.role or b.name not in back.pairs or (pos[p] > pos[b.name]) != after:
                fail(g, stage, b.name, f"B7 paired with {p}, which is not {'a later wait' if after else 'an earlier collective'} "
                     "naming it back")


def verify_schedule(g: ScheduleGraph, stage: str) -> None:
    if tuple(n.name for n in g.nodes) != tuple(b.name for b in g.graph.buffers):
        fail(g, stage, g.nodes[0].name if g.nodes else "?", "S1 nodes do not match buffers one to one")
    defined = {i.name for i in g.graph.inputs}
    for n in g.nodes:
        for d in n.read_writes.reads:
            if isinstance(d, WeakDep):
                continue
            if d.name not in defined:
                fail(g, stage, n.name, f"S2 reads {d.name}, not defined before it")
        if n.name not in {d.name for d in n.read_writes.writes}:
            fail(g, stage, n.name, "S3 writes do not include the node itself")
        defined.add(n.name)
