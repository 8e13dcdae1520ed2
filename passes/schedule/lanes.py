"""Lane tables and invariants: the costly values of a pointwise kernel on a loop
nest that vary along its innermost loop alone, or along no loop at all
(TargetTraits.lane_tables: the C++ target).

A channels-last BatchNorm in inference computes `(x - mean[c]) * (w[c] / sqrt(var[c]
+ eps)) + b[c]` with the channels innermost: every pixel divides and takes a square
root for every channel, though those depend on the channel alone, and the compiler
cannot move them out of the loops around the channel loop.  Here each maximal
subtree of the nest's bodies that

- reads no loop variable but the innermost one (its loads' indices, its index
  expressions), and reads it (a constant is folded anyway),
- reads nothing the kernel computes, no indirect load and no run-time check,
- costs at least `min_cost` to compute (OP_COST units: a division or a square
  root),

becomes a table: the renderer computes it for every value of the innermost loop
once per call, before the loops, and the nodes read it there.  Only in a static
nest without r loops or tiles, whose innermost loop is at most `max_length` long
and whose outer loops run at least `min_outer` iterations; a kernel's tables
together within `max_bytes`.  A table holds the value's compute dtype, so the
results are bit for bit those computed in place.

Invariants (`LoopNest.invariants`): each maximal subtree that reads no loop
variable at all, and otherwise qualifies as a table's value does, is computed once
per call before the loops, as one value.  A compiled Adam step reads its step
count, a 0-d tensor, and computes `sqrt(1 - 0.999 ** step)` from it for every
element of every parameter: two `powf` calls an element that GCC neither hoists
nor vectorises (the loop's stores may alias the count, as far as it knows), which
made coil's step 3x Inductor's on the CPU.  Integer divisions and remainders stay
in the loop (hoisted, a division by zero a `where` never takes would trap), and so
does everything of a nest with no iterations.
"""

from __future__ import annotations

import math

import attrs

from coil.ir.expr import DIVIDING_OPS, Check, Constant, Expr, IndirectLoad, Load, Op, children, loads, walk
from coil.ir.kernel import KernelSpec, LoopNest
from coil.options import LaneTableTraits
from coil.passes.schedule.loads import value_symbols
from coil.passes.schedule.nest import loop_symbol
from coil.passes.schedule.rows import compute_dtype
from coil.passes.schedule.streams import compute_cost


def cost(e: Expr) -> int:
    """What computing `e` costs, each distinct subtree once (OP_COST; a load 1)."""
    return compute_cost((e,)) + len(set(loads(e)))


def maximal_subtrees(nest: LoopNest, reads: set[object], min_cost: int, integer_division: bool = True) -> list[Expr]:
    """Each maximal subtree of the nest's bodies (in the order the bodies reach
    them) that reads exactly the loop variables `reads`, and nothing the kernel
    computes, no indirect load and no check, that is no bare load or constant and
    costs at least `min_cost`; without `integer_division`, none that divides
    integers."""
    computed = {n.name for n in nest.nodes}
    found: dict[Expr, None] = {}
    verdict: dict[Expr, bool] = {}

    def qualifies(e: Expr) -> bool:
        if e not in verdict:
            below = walk(e)
            verdict[e] = (not isinstance(e, (Load, Constant))
                          and not any(isinstance(s, (IndirectLoad, Check)) for s in below)
                          and (integer_division or not any(isinstance(s, Op) and s.name in DIVIDING_OPS
                                                           and not s.dtype.is_floating_point for s in below))
                          and value_symbols((e,)) == reads
                          and not any(isinstance(s, Load) and s.name in computed for s in below)
                          and cost(e) >= min_cost)
        return verdict[e]

    def visit(e: Expr) -> None:
        if qualifies(e):
            found.setdefault(e, None)
            return
        for c in children(e):
            visit(c)

    for n in nest.nodes:
        visit(n.body)
    return list(found)


def lane_tables(spec: KernelSpec, traits: LaneTableTraits) -> KernelSpec:
    """The spec with its nest's lane tables (module docstring)."""
    nest = spec.nest
    if (nest is None or nest.rsizes or nest.tile is not None or len(nest.xsizes) < 2
            or not all(isinstance(s, int) for s in nest.xsizes)):
        return spec
    inner_size = nest.xsizes[-1]
    if not 1 < inner_size <= traits.max_length or math.prod(nest.xsizes[:-1]) < traits.min_outer:
        return spec
    found = maximal_subtrees(nest, {loop_symbol("ix", len(nest.xsizes) - 1)}, traits.min_cost)
    kept, used = [], 0
    for e in found:  # in the order the bodies reach them, while they fit max_bytes
        size = inner_size * compute_dtype(e.dtype).itemsize
        if used + size <= traits.max_bytes:
            kept.append(e)
            used += size
    if not kept:
        return spec
    return attrs.evolve(spec, nest=attrs.evolve(nest, tables=tuple(kept)))


def invariants(spec: KernelSpec, traits: LaneTableTraits) -> KernelSpec:
    """The spec with its nest's invariants (module docstring): a static pointwise
    nest with iterations, no r loops and no tiles."""
    nest = spec.nest
    if (nest is None or nest.rsizes or nest.tile is not None or not nest.xsizes
            or not all(isinstance(s, int) for s in nest.xsizes) or math.prod(nest.xsizes) == 0):
        return spec
    found = maximal_subtrees(nest, set(), traits.min_cost, integer_division=False)
    if not found:
        return spec
    return attrs.evolve(spec, nest=attrs.evolve(nest, invariants=tuple(found)))
