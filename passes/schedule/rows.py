"""What a reduction kernel's r-loops keep per row, on a target whose traits ask for
it (the C++ target; passes/schedule/nest.py gives the loop variables).

A reduction kernel on a loop nest runs, per xindex, its stages one after another:

    outer 0 | r-loop 0 | outer 1 | r-loop 1 | ... | outer K

each r-loop over the same row (ir/kernel.py: Outer and Loop stages; a two-pass
welford_m2 takes an r-loop more).  A renderer evaluates each scope's bodies with a
memo (one value per distinct subtree), and an r-loop recomputes the inner nodes it
reads from their bodies.  Two decisions are made here, on the subtrees each
scope evaluates, which `_Scope` finds by walking the bodies in the renderer's
order:

- row scratch arrays (`scratch`, the ScratchTraits): when a later r-loop
  evaluates a subtree an earlier one computed, that varies along the row and
  costs at least `min_cost` (OP_COST) to recompute (softmax's exp(x - max), not
  layer_norm's x - mean), the earlier loop stores it into a row-sized array and
  the later ones read it back (Inductor's `local_buffer_data` does the same).
  Arrays hold the value's compute dtype (half types: float32), so the values are
  bit for bit those a recompute gives; all of a kernel's together stay within
  `max_bytes`, an array is reused by a value stored after its last reader;
- row invariants (`hoisted`, TargetTraits.hoists_row_invariants): what an r-loop
  evaluates that does not vary along the row (a load at the xindex, an index
  check of a target, log of a row sum) is computed once per row, before the loop:
  a check inside the loop is a call `omp simd` cannot vectorise, and GCC does not
  hoist a libm call out of a vectorised loop.  Not when the row is empty, where
  the loop body never runs and a hoisted check could fail.  With
  TargetTraits.row_reciprocals a floating division by such a value multiplies by
  its reciprocal, computed once per row, as eager's softmax does.

Rows shared among vector lanes (a reduction down columns) keep nothing per row;
a split row (Split, even) hoists but keeps no scratch arrays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
import torch

from coil.ir.expr import (
    Cast,
    Check,
    Constant,
    Expr,
    IndexExpr,
    IndirectLoad,
    Load,
    NoValues,
    Op,
    children,
    evaluate,
    post_order,
)
from coil.ir.kernel import Hoisted, KernelSpec, Loop, Outer, Role, Rows, ScratchArray, Split
from coil.ir.shapes import EMPTY, ShapeInfo
from coil.options import ScratchTraits, TargetTraits
from coil.passes.schedule.nest import loop_symbol
from coil.passes.schedule.streams import OP_COST


def row_work(spec: KernelSpec, traits: TargetTraits, shapes: ShapeInfo = EMPTY) -> KernelSpec:
    """The spec with its row scratch arrays and what each r-loop hoists, where its
    traits ask for them (a reduction kernel on a nest, its rows not in lanes).
    With symbolic sizes the scratch arrays are chosen at the row's hint (the
    target sizes them at run time), and row invariants are hoisted only where the
    ranges prove a row is never empty."""
    nest, space = spec.nest, spec.space
    if nest is None or not nest.rsizes or (isinstance(space, Rows) and space.lanes):
        return spec
    bodies = {n.name: n.body for n in nest.nodes}
    roles = {n.name: n.role for n in spec.nodes}
    inner = {name: bodies[name] for name, role in roles.items() if role is Role.INNER}
    kept = frozenset(name for name, role in roles.items() if role is not Role.INNER)
    rnumel = math.prod(nest.rsizes)
    t = Subtrees(inner, frozenset(loop_symbol("ir", i) for i in range(len(nest.rsizes))), kept)
    least = shapes.bounds(rnumel)[0]
    nonempty = least is not None and least > 0
    run = _Run(spec, t, hoist=traits.hoists_row_invariants and nonempty, reciprocals=traits.row_reciprocals)
    scratch: tuple[ScratchArray, ...] = ()
    if (traits.scratch is not None and not isinstance(space, Split)
            and sum(1 for r in roles.values() if r in (Role.REDUCTION, Role.INNER)) >= 2):
        dry = run.walk(())
        if len(dry.evaluated) >= 2:  # a symbolic row's budget is taken at its hint
            scratch = row_scratch(dry.evaluated, t, shapes.hint(rnumel), traits.scratch)
    final = run.walk(scratch)
    hoisted = tuple(Hoisted(level, _largest(fixed, t), tuple(divisions))
                    for level, (fixed, divisions) in enumerate(zip(final.fixed, final.divisions)) if fixed or divisions)
    return attrs.evolve(spec, scratch=scratch, hoisted=hoisted)


# ---- subtrees -----------------------------------------------------------------------------------


class Subtrees:
    """Cost, rindex-dependence and descendants of subtrees, looking through loads
    of the kernel's inner nodes (a renderer evaluates their bodies in place)."""

    def __init__(self, inner: Mapping[str, Expr], rsyms: frozenset[object], kept: frozenset[str]) -> None:
        self.inner = inner  # inner node -> its body in the nest's loop variables
        self.rsyms = rsyms
        self.kept = kept  # nodes whose values are registers in every r-loop (reductions, outer nodes)
        self._below: dict[Expr, frozenset[Expr]] = {}
        self._varies: dict[Expr, bool] = {}

    def kids(self, e: Expr) -> tuple[Expr, ...]:
        if isinstance(e, Load) and e.name in self.inner:
            return (self.inner[e.name], *children(e))
        return children(e)

    def below(self, e: Expr) -> frozenset[Expr]:
        """Every distinct subtree of `e`, `e` included (memoised per subtree)."""
        for n in post_order(e, self._below, self.kids):
            self._below[n] = frozenset({n}).union(*(self._below[k] for k in self.kids(n)))
        return self._below[e]

    def cost(self, e: Expr) -> int:
        total = 0
        for s in self.below(e):
            if isinstance(s, Op):
                total += OP_COST.get(s.name, 1)
            elif isinstance(s, Load):
                total += 0 if s.name in self.inner or s.name in self.kept else 1
            elif not isinstance(s, Constant):
                total += 1
        return total

    def varies(self, e: Expr) -> bool:
        """Whether `e` changes along the row (reads rindex): memoised per subtree,
        children first, so asking about every node of a long chain stays linear."""
        for n in post_order(e, self._varies, self.kids):
            self._varies[n] = self._reads_rindex(n) or any(self._varies[k] for k in self.kids(n))
        return self._varies[e]

    def _reads_rindex(self, s: Expr) -> bool:
        """The node itself (not its children) changes along the row."""
        if isinstance(s, Load) and s.name in self.inner:
            return True
        if isinstance(s, (Load, IndirectLoad)) and s.name not in self.kept:
            return any(i.free_symbols & self.rsyms for i in s.index)
        return isinstance(s, IndexExpr) and bool(s.expr.free_symbols & self.rsyms)


# ---- what each scope evaluates ------------------------------------------------------------------


class _Scope(NoValues):
    """An ops handler for `evaluate` that computes nothing (every value is None):
    its memo's keys are the subtrees a renderer's scope evaluates, in its order.
    A load of an inner node evaluates the node's body here, once."""

    def __init__(self, t: Subtrees, memo: dict[Expr, None]) -> None:
        self.t = t
        self.memo = memo
        self.computed: set[str] = set()  # inner nodes whose bodies this scope evaluated

    def value(self, e: Expr) -> None:
        evaluate(e, self, self.memo)

    def load(self, node: Load, mask: None) -> None:
        if node.name in self.t.inner and node.name not in self.computed:
            self.value(self.t.inner[node.name])
            self.computed.add(node.name)



class _LoopScope(_Scope):
    """An r-loop's scope: a subtree that does not vary along the row (a constant
    excepted) is evaluated by `row`, the scope run once per row before the loop
    (`fixed`, in order); a floating division by such a value, of one that varies,
    takes its divisor's reciprocal (`divisions`)."""

    def __init__(self, t: Subtrees, memo: dict[Expr, None], row: _Scope, hoist: bool, reciprocals: bool) -> None:
        super().__init__(t, memo)
        self.row = row
        self.hoist = hoist
        self.reciprocals = reciprocals
        self.fixed: list[Expr] = []
        self.divisions: list[Expr] = []

    def _fixed(self, node: Expr) -> bool:
        if not self.hoist or self.t.varies(node):
            return False
        self.row.value(node)
        self.fixed.append(node)
        return True

    def load(self, node: Load, mask: None) -> None:
        if not self._fixed(node):
            super().load(node, mask)

    def indirect_load(self, node: IndirectLoad, values: tuple[None, ...], mask: None) -> None:
        self._fixed(node)

    def check(self, node: Check, arg: None) -> None:
        self._fixed(node)

    def index_expr(self, node: IndexExpr) -> None:
        self._fixed(node)

    def cast(self, node: Cast, arg: None) -> None:
        self._fixed(node)

    def op(self, node: Op, args: tuple[None, ...]) -> None:
        if self._fixed(node) or not self.reciprocals:
            return
        num, den = node.args[0], node.args[-1]
        if node.name == "truediv" and node.dtype.is_floating_point and not self.t.varies(den) and self.t.varies(num):
            self.row.value(den)
            self.divisions.append(node)


@attrs.frozen
class _Walked:
    """Per r-loop: the subtrees it evaluates that the scopes before it have not
    (in order), the row invariants it hands to its row scope, its divisions by
    reciprocals."""

    evaluated: tuple[tuple[Expr, ...], ...]
    fixed: tuple[tuple[Expr, ...], ...]
    divisions: tuple[tuple[Expr, ...], ...]


@attrs.frozen
class _Run:
    """The scopes of one row in a renderer's order, from the spec's stages: each
    outer stage's nodes, each r-loop's accumulators (a welford_m2's second pass in
    the loop after its own) and then its stored inner nodes.  What an outer stage
    or a row scope evaluates is known to every later scope of the row."""

    spec: KernelSpec
    t: Subtrees
    hoist: bool
    reciprocals: bool

    def walk(self, scratch: Sequence[ScratchArray]) -> _Walked:
        """Each scope walked, the r-loops after a scratch array's first reading it
        from the array instead of evaluating it."""
        assert self.spec.nest is not None
        bodies = {n.name: n.body for n in self.spec.nest.nodes}
        at, loops = _phases(self.spec)
        known: dict[Expr, None] = {}  # what the scopes of the row so far evaluated, once per row
        evaluated, fixed, divisions = [], [], []
        for s in range(loops + 1):
            outer = [n.name for n in self.spec.nodes if n.role is Role.OUTER and at[n.name] == s]
            if outer:
                scope = _Scope(self.t, dict(known))
                for name in outer:
                    scope.value(bodies[name])
                known.update(scope.memo)
            if s == loops:
                break
            h = _LoopScope(self.t, dict(known), _Scope(self.t, dict(known)), self.hoist, self.reciprocals)
            h.memo.update((a.expr, None) for a in scratch if a.first < s <= a.last)
            before = set(h.memo)
            for n in self.spec.nodes:
                if n.role is Role.REDUCTION and (at[n.name] == s or (at[n.name] + 1 == s
                                                                     and n.reduction_type == "welford_m2")):
                    h.value(bodies[n.name])
            for n in self.spec.nodes:
                if n.role is Role.INNER and n.store is not None and at[n.name] == s:
                    h.value(bodies[n.name])
                    h.computed.add(n.name)
            evaluated.append(tuple(e for e in h.memo if e not in before))
            fixed.append(tuple(h.fixed))
            divisions.append(tuple(h.divisions))
            known.update(h.row.memo)
        return _Walked(tuple(evaluated), tuple(fixed), tuple(divisions))


def _phases(spec: KernelSpec) -> tuple[dict[str, int], int]:
    """Each node's stage or r-loop, and how many r-loops run: up to the last that
    reduces (a second pass included) or stores an inner node."""
    at: dict[str, int] = {}
    ends = [0]
    for st in spec.stages:
        assert isinstance(st, (Outer, Loop)), f"{spec.name}: a reduction kernel's rows loop on a nest"
        at.update(dict.fromkeys(st.nodes, st.level))
        if isinstance(st, Loop):
            ends += [st.level + (2 if a.second_pass else 1) for a in st.accumulators]
            stored = (spec.node(n) for n in st.nodes)
            ends += [st.level + 1 for n in stored if n.role is Role.INNER and n.store is not None]
    return at, max(ends)


def _largest(fixed: Sequence[Expr], t: Subtrees) -> tuple[Expr, ...]:
    """The subtrees of `fixed` no other one of them contains."""
    inside: set[Expr] = set().union(*(t.below(e) - {e} for e in fixed)) if fixed else set()
    return tuple(e for e in fixed if e not in inside)


# ---- row scratch arrays -------------------------------------------------------------------------


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value is computed (and kept in scratch) in: half types in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def row_scratch(evaluated: Sequence[Sequence[Expr]], t: Subtrees, rnumel: int,
                traits: ScratchTraits) -> tuple[ScratchArray, ...]:
    """The subtrees worth keeping in scratch arrays, given what each r-loop
    evaluates.  Loop j keeps the largest subtrees it shares with an earlier loop;
    each is stored by the first loop that computes it."""
    first: dict[Expr, int] = {}
    for i, exprs in enumerate(evaluated):
        for e in exprs:
            first.setdefault(e, i)
    chosen: dict[Expr, int] = {}  # expression -> last r-loop that reads it
    for j, exprs in enumerate(evaluated):
        shared = [e for e in exprs if first[e] < j and not isinstance(e, Load) and t.varies(e)
                  and t.cost(e) >= traits.min_cost]
        inside = set().union(*(t.below(e) - {e} for e in shared)) if shared else set()
        for e in shared:
            if e not in inside:
                chosen[e] = j
    return _assign(sorted(chosen.items(), key=lambda item: first[item[0]]), first, rnumel, traits.max_bytes)


def _assign(chosen: Sequence[tuple[Expr, int]], first: Mapping[Expr, int], rnumel: int,
            max_bytes: int) -> tuple[ScratchArray, ...]:
    """Arrays for the chosen values in the order they are first stored: a value
    reuses an array of its compute dtype whose last reader runs no later than its
    own store (a loop reads element r before it writes element r); a new array
    while the budget lasts; else the value is recomputed."""
    arrays: list[ScratchArray] = []
    free_after: dict[int, tuple[torch.dtype, int]] = {}  # slot -> (compute dtype, last loop that reads it)
    used = 0
    for e, last in chosen:
        dtype = compute_dtype(e.dtype)
        slot = next((s for s, (dt, end) in free_after.items() if dt == dtype and end <= first[e]), None)
        if slot is None:
            nbytes = rnumel * dtype.itemsize
            if used + nbytes > max_bytes:
                continue
            used += nbytes
            slot = len(free_after)
        free_after[slot] = (dtype, last)
        arrays.append(ScratchArray(e, slot, first[e], last))
    return tuple(arrays)
