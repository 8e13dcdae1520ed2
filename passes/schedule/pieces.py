"""Pieces: a pointwise nest's innermost loop cut where its comparisons change
(NestTraits.opaque_calls: the C++ target).

`torch.cat` of halves along the innermost dim (a rotary embedding's
`cat(-x2, x1)`, its backward's `slice_scatter`s) reads each half through a
mask, `ix < 16` or `ix >= 16`, and selects between them.  GCC vectorises such a
loop with masked loads once it has if-converted it, but GCC 12 if-converts no loop
that calls a function other than a builtin, and coil calls sin and cos by names
GCC does not take for builtins (so that a rotary embedding's sin and cos of one
value stay two vector calls, not one scalar sincosf; backends/cpp/include/
coil_prelude.h): Llama's rotary kernel then ran scalar, 7 ns an element on one
thread, and ModernBERT's rotary backward 277 us a call against Inductor's 38.

Here, in a static pointwise nest (no r loops, tile or blocks, nothing streamed)
whose bodies apply an op of `opaque_calls`, the comparisons that read the
innermost loop variable alone (an index expression of it, linear, against a
constant) give the cut points (`LoopNest.cuts`): the innermost loop runs as one
loop a piece, and in each piece every such comparison is a constant
(`fold_piece`, proved by interval arithmetic over the piece: ir/bounds.py), so its
masks, selects and the bool ops of them fold away and each piece is a plain
vector loop.  At most
`MAX_PIECES` pieces; a cut that leaves some comparison varying inside a piece is
no cut (the nest stays whole).

Guards: comparisons that read outer loop variables alone are constant along the
innermost loop, but a load they mask (a stencil's window reaching into padding:
max_pool2d's `2*ix1 - 1 >= 0`) is control flow to GCC 12, which then vectorizes
no version of the loop: a 3x3 max_pool2d over 64 channels-last channels took
1344 us a call where the same loop with the masks decided took 37.  In a static
pointwise nest of at least two x loops (no r loops, tile, blocks or streams)
whose loads' masks compare outer loop variables alone, those comparisons (at
most MAX_GUARDS of them) are the nest's `guards`: the renderer computes them
once before the innermost loop and runs one version of it for each of their
values, each with them folded (`fold_guards`).  Where other masks compare the
innermost loop's variable alone (an NCHW pool's or pad's window, at the ends of
its rows as well as at the first and last rows), cuts of that loop decide those,
as above, in every version: max_pool2d_with_indices over NCHW ran scalar (GCC:
control flow in the loop).  Masks of the innermost loop alone (a cat along it)
get neither: GCC if-converts those and vectorizes the loop with masked loads.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Mapping

import attrs
import sympy
import torch

from coil.ir.bounds import COMPARISONS, comparisons_of, reads_among, reads_only, value_among, value_over
from coil.ir.expr import Cast, Constant, Expr, IndexExpr, IndirectLoad, Load, Op, rewrite, walk
from coil.ir.kernel import KernelSpec, LoopNest
from coil.passes.schedule.nest import loop_symbol

MAX_PIECES = 4
# the most guards a nest takes: its innermost loop then runs in up to 8 versions
MAX_GUARDS = 3
# bool ops of folded comparisons (a pad's `ix >= 2 and ix < 9`), folded in turn
_LOGIC: dict[str, Callable[..., bool]] = {"logical_and": lambda a, b: a and b, "logical_or": lambda a, b: a or b, "logical_not": lambda a: not a,
          "logical_xor": lambda a, b: a != b, "bitwise_and": lambda a, b: a and b, "bitwise_or": lambda a, b: a or b,
          "bitwise_xor": lambda a, b: a != b, "bitwise_not": lambda a: not a}


def inner_symbol(nest: LoopNest) -> sympy.Symbol:
    return loop_symbol("ix", len(nest.xsizes) - 1)


def comparisons(nest: LoopNest, sym: sympy.Symbol) -> list[Op]:
    """The comparisons of the nest's bodies that read `sym` alone."""
    return comparisons_of([n.body for n in nest.nodes], sym)


def fold_piece(body: Expr, sym: sympy.Symbol, lo: int, hi: int,
               outer: Mapping[sympy.Symbol, tuple[int, int]] | None = None) -> Expr:
    """`body` over sym in [lo, hi), each `outer` loop over its span: each
    comparison of those loop variables alone (or of none) that is one value there
    is that constant, and the masks and selects it decides are folded (a load whose
    mask is true reads unmasked; one whose mask is false is 0).  So
    max_pool2d_with_indices' `index < 0` (no element of the window taken yet) is
    false inside a row once its first element is taken: GCC 12 turned that test
    into control flow and vectorized no piece of the loop."""
    spans = {**(outer or {}), sym: (lo, hi)}
    return fold_decided(body, lambda c: value_among(c, spans))


def outer_spans(nest: LoopNest, values: tuple[bool, ...] = ()) -> dict[sympy.Symbol, tuple[int, int]]:
    """The span [lo, hi) each outer loop variable runs over in the version of the
    nest's guards where they have `values` (none: all versions): the hull of the
    stretches between a variable's guards' change points where its guards have
    those values (a stretch where one may vary counts in)."""
    spans = {loop_symbol("ix", i): (0, int(n)) for i, n in enumerate(nest.xsizes[:-1])}
    for sym, (_, n) in list(spans.items()):
        mine = [(g, v) for g, v in zip(nest.guards, values) if isinstance(g, Op) and reads_only(g, sym)]
        if not mine:
            continue
        points = sorted(set().union(*(_candidates(g, sym, n) for g, _ in mine)))
        bounds = (0, *points, n)
        kept = [(lo, hi) for lo, hi in zip(bounds, bounds[1:])
                if all(value_over(g, sym, lo, hi) in (None, v) for g, v in mine)]
        if kept:
            spans[sym] = (kept[0][0], kept[-1][1])
    return spans


def fold_guards(body: Expr, guards: tuple[Expr, ...], values: tuple[bool, ...]) -> Expr:
    """`body` where each guard has its value in `values`, with the masks and selects
    they decide folded."""
    decided = dict(zip(guards, values, strict=True))
    return fold_decided(body, lambda c: decided.get(c))


def fold_decided(body: Expr, decide: Callable[[Op], bool | None]) -> Expr:
    """`body` with each comparison that `decide` gives a value that constant, and the
    bool ops, masks and selects those decide folded in turn."""
    def fold(e: Expr) -> Expr | None:
        if isinstance(e, Op) and e.name in COMPARISONS:
            v = decide(e)
            return None if v is None else Constant(v, torch.bool)
        if (isinstance(e, Op) and e.dtype == torch.bool and e.name in _LOGIC
                and all(isinstance(a, Constant) for a in e.args)):
            return Constant(_LOGIC[e.name](*(bool(a.value) for a in e.args if isinstance(a, Constant))), torch.bool)
        if isinstance(e, Op) and e.dtype == torch.bool and e.name in _ABSORB and len(e.args) == 2:
            return _absorb(e)
        if isinstance(e, Load) and isinstance(e.mask, Constant):
            return attrs.evolve(e, mask=None) if e.mask.value else Constant(0, e.dtype)
        if isinstance(e, Op) and e.name == "where" and isinstance(e.args[0], Constant):
            arm = e.args[1] if e.args[0].value else e.args[2]
            return arm if arm.dtype == e.dtype else Cast(arm, e.dtype)  # the where's dtype, as its value had
        return None

    return rewrite(body, fold)


# and / or with one constant side: the other side, or the constant that decides it
_ABSORB = {"logical_and": False, "bitwise_and": False, "logical_or": True, "bitwise_or": True}


def _absorb(e: Op) -> Expr | None:
    """`x and True` is x, `x and False` False; `x or False` x, `x or True` True
    (x a bool: the op is a bool op)."""
    decides = _ABSORB[e.name]
    for k, a in enumerate(e.args):
        other = e.args[1 - k]
        if isinstance(a, Constant) and other.dtype == torch.bool:
            return Constant(decides, torch.bool) if bool(a.value) == decides else other
    return None


def _candidates(c: Op, sym: sympy.Symbol, n: int) -> set[int]:
    """Where comparison c may change value along sym in (0, n): the integers around
    the solution of its index expression (linear in sym) against its constant."""
    out: set[int] = set()
    sides = c.args
    for a, b in ((sides[0], sides[1]), (sides[1], sides[0])):
        if isinstance(a, IndexExpr) and isinstance(b, Constant) and isinstance(b.value, int):
            e = sympy.expand(a.expr)
            k, d = e.coeff(sym), e.subs(sym, 0)
            if not (k.is_Integer and d.is_Integer) or k == 0 or sympy.expand(k * sym + d - e) != 0:
                continue
            x = sympy.Rational(b.value - int(d), int(k))
            out |= {int(sympy.floor(x)), int(sympy.floor(x)) + 1, int(sympy.ceiling(x))}
    return {v for v in out if 0 < v < n}


def static_pointwise(nest: LoopNest) -> bool:
    """Whether the nest is a static pointwise one with iterations, plain loops only
    (no r loops, tile or blocks): what cuts and guards take."""
    return not (nest.rsizes or nest.tile is not None or nest.block or not nest.xsizes
                or not all(isinstance(s, int) for s in nest.xsizes) or math.prod(nest.xsizes) == 0)


def cut_points(nest: LoopNest) -> tuple[int, ...]:
    """The cuts of the nest's innermost loop (module docstring), or () for none."""
    if not static_pointwise(nest):
        return ()
    sym, n = inner_symbol(nest), int(nest.xsizes[-1])
    comps = comparisons(nest, sym)
    if not comps:
        return ()
    points: set[int] = set()
    for c in comps:
        points |= _candidates(c, sym, n)
    cuts = tuple(sorted(points))
    bounds = (0, *cuts, n)
    # only the cuts where some comparison changes value; each piece decides every one
    values = [[value_over(c, sym, lo, hi) for c in comps] for lo, hi in zip(bounds, bounds[1:])]
    if any(v is None for row in values for v in row):
        return ()
    kept = tuple(cut for k, cut in enumerate(cuts) if values[k] != values[k + 1])
    if not kept or len(kept) + 1 > MAX_PIECES:
        return ()
    return kept


def pieces(spec: KernelSpec, opaque_calls: tuple[str, ...]) -> KernelSpec:
    """The spec with its nest's cuts (module docstring)."""
    nest = spec.nest
    if nest is None or not opaque_calls or spec.streams is not None:
        return spec
    if not any(isinstance(s, Op) and s.name in opaque_calls for n in nest.nodes for s in walk(n.body)):
        return spec
    cuts = cut_points(nest)
    return spec if not cuts else attrs.evolve(spec, nest=attrs.evolve(nest, cuts=cuts))


def outer_symbols(nest: LoopNest) -> set[sympy.Symbol]:
    return {loop_symbol("ix", i) for i in range(len(nest.xsizes) - 1)}


def guard_comparisons(nest: LoopNest) -> tuple[list[Op], bool] | None:
    """The comparisons in the masks of the nest's loads that read outer loop
    variables alone, each once, in order, and whether other masks compare the
    innermost loop's variable alone (cuts must decide those); None where some mask
    compares anything else (both at once, or a loaded value: a version would keep
    masked loads, and GCC, which unswitches the loop itself on the invariant part
    of a mask and vectorizes the rest with masked loads, then vectorizes none; a
    MobileNetV2 pad's kernel took 720 us a call so, 38 without)."""
    outer, inner = outer_symbols(nest), inner_symbol(nest)
    out: dict[Op, None] = {}
    cut = False
    for n in nest.nodes:
        for s in walk(n.body):
            if isinstance(s, (Load, IndirectLoad)) and s.mask is not None:
                for c in walk(s.mask):
                    if isinstance(c, Op) and c.name in COMPARISONS:
                        if reads_among(c, outer):
                            out[c] = None
                        elif reads_only(c, inner):
                            cut = True
                        else:
                            return None
    return list(out), cut


def guards(spec: KernelSpec) -> KernelSpec:
    """The spec with its nest's guards, and cuts where other masks compare the
    innermost loop's variable (module docstring)."""
    nest = spec.nest
    if nest is None or spec.streams is not None or not static_pointwise(nest) or len(nest.xsizes) < 2:
        return spec
    found = guard_comparisons(nest)
    if found is None:
        return spec
    outer, cut = found
    if not outer or len(outer) > MAX_GUARDS:
        return spec  # (no guard: masks of the innermost loop alone, which GCC if-converts itself)
    cuts = nest.cuts or (cut_points(nest) if cut else ())
    if cut and not cuts:
        return spec
    versions = reached(nest, tuple(outer))
    sym, n = inner_symbol(nest), int(nest.xsizes[-1])
    bounds = (0, *cuts, n)
    masks = [s.mask for nd in nest.nodes for s in walk(nd.body) if isinstance(s, (Load, IndirectLoad)) and s.mask is not None]
    if not all(isinstance(fold_piece(fold_guards(m, tuple(outer), v), sym, lo, hi), Constant)
               for m in masks for v in versions for lo, hi in zip(bounds, bounds[1:])):
        return spec  # a mask neither decides (a loaded bool in it): its loops would keep masked loads
    return attrs.evolve(spec, nest=attrs.evolve(nest, guards=tuple(outer), versions=versions, cuts=cuts))


def reached(nest: LoopNest, guards: tuple[Op, ...]) -> tuple[tuple[bool, ...], ...]:
    """The guards' values the outer loops reach, every guard holding first: the
    guards of one loop variable alone are one value each between their candidate
    change points (`_candidates`, checked by interval arithmetic), so their values
    are those of each such span; guards of several variables, or spans that do not
    settle, may take either value.  Guards of different variables vary apart."""
    size = {loop_symbol("ix", i): int(n) for i, n in enumerate(nest.xsizes)}
    by_sym: dict[sympy.Symbol, list[int]] = {}
    free: list[int] = []
    for k, g in enumerate(guards):
        syms = {s for e in walk(g) if isinstance(e, IndexExpr) for s in e.expr.free_symbols}
        (by_sym.setdefault(next(iter(syms)), []) if len(syms) == 1 else free).append(k)
    parts: list[tuple[list[int], set[tuple[bool, ...]]]] = [([k], {(True,), (False,)}) for k in free]
    for sym, ks in by_sym.items():
        n = size[sym]
        points = sorted(set().union(*(_candidates(guards[k], sym, n) for k in ks)))
        bounds = (0, *points, n)
        seen: set[tuple[bool, ...]] = set()
        for lo, hi in zip(bounds, bounds[1:]):
            values = tuple(value_over(guards[k], sym, lo, hi) for k in ks)
            if any(v is None for v in values):
                seen = set(itertools.product((True, False), repeat=len(ks)))
                break
            seen.add(values)  # type: ignore[arg-type]
        parts.append((ks, seen))
    out = []
    for combo in itertools.product((True, False), repeat=len(guards)):
        if all(tuple(combo[k] for k in ks) in seen for ks, seen in parts):
            out.append(combo)
    return tuple(out)
