"""Row scratch arrays: values an r-loop computes that a later r-loop of the same
row computes again.

A reduction kernel runs its r-loops one after another over the same row, and
each recomputes whatever it needs from memory (reduction.py: "recomputed from
its body in any later r-loop").  That is cheap for `x - mean`, not for
`exp(x - max)`, which softmax's sum and its output both need: the output loop
would run exp a second time.  When a later r-loop needs a subtree that an
earlier one computed, that depends on rindex and costs more than a load and a
store, the earlier loop stores it into a row-sized array on the stack and the
later loops read it back (Inductor's `local_buffer_data` does the same).  The
arrays hold the compute type, so the values are bit for bit those a recompute
would give.

Which subtrees each r-loop evaluates comes from a first run of the emitter
(`ReductionEmitter.loop_memos`): the handler's memo after each loop body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from coil.backends.cpp import prelude
from coil.backends.cpp.handler import InnerValue
from coil.backends.cpp.plan import OP_COST
from coil.ir.expr import Constant, Expr, IndexExpr, IndirectLoad, Load, Op, children

# All scratch arrays of one kernel together stay below this many bytes: they live
# on each thread's stack and should stay in L1/L2 next to the row they came from.
SCRATCH_MAX_BYTES = 64 * 1024
# A subtree is kept when recomputing it costs at least this much (plan.OP_COST
# units; a load or an add is 1): one transcendental function qualifies, `x - mean`
# does not.
SCRATCH_MIN_COST = 8
_SIZES = {"float": 4, "double": 8, "bool": 1, "int8_t": 1, "uint8_t": 1, "int16_t": 2, "int32_t": 4}


@attrs.frozen
class ScratchArray:
    """`name[rindex]` holds `expr`'s value: stored in r-loop `first`, read in the
    r-loops after it up to `last`; after that another value may reuse `name`."""

    expr: Expr
    name: str
    ctype: str
    first: int
    last: int


@attrs.frozen
class RowScratch:
    arrays: tuple[ScratchArray, ...]
    size: int  # elements per array: the row's length

    def declared_in(self, loop: int) -> list[str]:
        """The arrays first written in r-loop `loop`, as names (once each)."""
        seen: set[str] = set()
        out = []
        for a in self.arrays:
            if a.name not in seen and a.first == loop:
                out.append(a.name)
            seen.add(a.name)
        return out

    def stored_in(self, loop: int) -> list[ScratchArray]:
        return [a for a in self.arrays if a.first == loop]

    def read_in(self, loop: int) -> list[ScratchArray]:
        return [a for a in self.arrays if a.first < loop <= a.last]


class Subtrees:
    """Cost, rindex-dependence and descendants of subtrees, looking through loads
    of the kernel's inner nodes (the handler evaluates their bodies in place)."""

    def __init__(self, inner: Mapping[str, InnerValue], rsyms: frozenset[object], kept: frozenset[str]) -> None:
        self.inner = inner
        self.rsyms = rsyms
        self.kept = kept  # buffers that are registers in every r-loop (reductions, outer nodes)
        self._below: dict[Expr, frozenset[Expr]] = {}
        self._varies: dict[Expr, bool] = {}

    def kids(self, e: Expr) -> tuple[Expr, ...]:
        if isinstance(e, Load) and e.name in self.inner:
            return (self.inner[e.name].body, *children(e))
        return children(e)

    def below(self, e: Expr) -> frozenset[Expr]:
        """Every distinct subtree of `e`, `e` included (children first, without
        recursion: bodies can be chains thousands of ops deep)."""
        stack: list[tuple[Expr, bool]] = [(e, False)]
        while stack:
            n, expanded = stack.pop()
            if n in self._below:
                continue
            kids = self.kids(n)
            if not expanded:
                stack.append((n, True))
                stack.extend((k, False) for k in kids if k not in self._below)
                continue
            self._below[n] = frozenset({n}).union(*(self._below[k] for k in kids))
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
        stack: list[tuple[Expr, bool]] = [(e, False)]
        while stack:
            n, expanded = stack.pop()
            if n in self._varies:
                continue
            kids = self.kids(n)
            if not expanded:
                stack.append((n, True))
                stack.extend((k, False) for k in kids if k not in self._varies)
                continue
            self._varies[n] = self._reads_rindex(n) or any(self._varies[k] for k in kids)
        return self._varies[e]

    def _reads_rindex(self, s: Expr) -> bool:
        """The node itself (not its children) changes along the row."""
        if isinstance(s, Load) and s.name in self.inner:
            return True
        if isinstance(s, (Load, IndirectLoad)) and s.name not in self.kept:
            return any(i.free_symbols & self.rsyms for i in s.index)
        return isinstance(s, IndexExpr) and bool(s.expr.free_symbols & self.rsyms)


def row_scratch(loop_memos: Sequence[Mapping[Expr, str]], t: Subtrees, rnumel: int) -> RowScratch:
    """The subtrees worth keeping in scratch arrays, given what each r-loop
    evaluated.  Loop j keeps the largest subtrees it shares with an earlier loop;
    each is stored by the first loop that computes it."""
    first: dict[Expr, int] = {}
    for i, memo in enumerate(loop_memos):
        for e in memo:
            first.setdefault(e, i)
    chosen: dict[Expr, int] = {}  # expression -> last r-loop that reads it
    for j, memo in enumerate(loop_memos):
        shared = [e for e in memo if first[e] < j and not isinstance(e, Load) and t.varies(e)
                  and t.cost(e) >= SCRATCH_MIN_COST]
        inside = set().union(*(t.below(e) - {e} for e in shared)) if shared else set()
        for e in shared:
            if e not in inside:
                chosen[e] = j
    return RowScratch(_assign(sorted(chosen.items(), key=lambda item: first[item[0]]), first, rnumel), rnumel)


def _assign(chosen: Sequence[tuple[Expr, int]], first: Mapping[Expr, int], rnumel: int) -> tuple[ScratchArray, ...]:
    """Arrays for the chosen values in the order they are first stored: a value
    reuses an array whose last reader runs no later than its own store (a loop
    reads element r before it writes element r); a new array while the budget
    lasts; else the value is recomputed."""
    arrays: list[ScratchArray] = []
    free_after: dict[str, tuple[str, int]] = {}  # array name -> (ctype, last loop that reads it)
    used = 0
    for e, last in chosen:
        ctype = prelude.compute_type(e.dtype)
        name = next((n for n, (ct, end) in free_after.items() if ct == ctype and end <= first[e]), None)
        if name is None:
            nbytes = rnumel * _SIZES.get(ctype, 8)
            if used + nbytes > SCRATCH_MAX_BYTES:
                continue
            used += nbytes
            name = f"row{len(free_after)}"
        free_after[name] = (ctype, last)
        arrays.append(ScratchArray(e, name, ctype, first[e], last))
    return tuple(arrays)


def declare(name: str, rows: RowScratch) -> str:
    ctype = next(a.ctype for a in rows.arrays if a.name == name)
    return f"alignas(64) {ctype} {name}[{max(rows.size, 1)}];"


def element(a: ScratchArray, rindex: str) -> str:
    return f"{a.name}[{rindex}]"
