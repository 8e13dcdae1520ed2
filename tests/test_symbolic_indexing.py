"""Index simplification and value ranges with symbolic sizes (dynamic shapes, plan
commit 2): coefficients, divisors and loop ranges that are expressions of size
symbols s0, s1, ...

What must simplify does, for every size: a softmax row's `s1*x0 + r0` taken apart
by `s1`, the unflatten / flatten round trips of (s0, s1, 4) and (s0, 3, s1); what
cannot be proved (a remainder not known below the divisor) is left as it is.  The
hypothesis tests check soundness: at concrete sizes and loop positions the
simplified index has the value of the original one, and a range holds every value.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coil.ir.bounds import index_range, load_in_bounds, mask_ranges, prove_checks, value_range
from coil.backends.reference import ReferenceHandler, loop_env
from coil.ir.expr import Cast, Check, Constant, Expr, IndexExpr, Load, Op, evaluate, rewrite, rsyms, walk, xsyms
from coil.ir.indexing import FloorDiv, ModularIndexing, flatten, simplify_index, unflatten
from coil.ir.shapes import EMPTY, ShapeInfo, Size, SymbolFacts, size_symbol

s0, s1 = size_symbol(0), size_symbol(1)
x0, x1, x2 = xsyms(3)
(r0,) = rsyms(1)
XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)


def info(upper0: int | None = None, upper1: int | None = None) -> ShapeInfo:
    return ShapeInfo((SymbolFacts(s0, 8, 2, upper0), SymbolFacts(s1, 16, 2, upper1)))


INFO = info()
ROW = {x0: s0, r0: s1}  # a softmax over (s0, s1): rows x0, columns r0


# ---- FloorDiv / ModularIndexing: what their constructors fold by structure


def test_floordiv_folds_syntactic_multiples_of_a_symbolic_divisor() -> None:
    assert FloorDiv(s1 * x0, s1) == x0
    assert FloorDiv(2 * s1 * x0 + 4 * s1, 2 * s1) == x0 + 2
    assert FloorDiv(s0 * s1**2 * x0, s1) == s0 * s1 * x0
    assert FloorDiv(FloorDiv(x0, s1), s0) == FloorDiv(x0, s0 * s1)
    assert FloorDiv(FloorDiv(x0, s1), 4) == FloorDiv(x0, 4 * s1)


def test_floordiv_keeps_what_needs_ranges() -> None:
    # the remainder r0 may be >= s1 for all the constructor knows
    assert isinstance(FloorDiv(s1 * x0 + r0, s1), FloorDiv)
    assert isinstance(FloorDiv(2 * x0, s1), FloorDiv)  # 2 is no multiple of s1
    assert isinstance(FloorDiv(s1 * x0, 2 * s1), FloorDiv)  # nor s1 of 2*s1
    assert isinstance(FloorDiv(s1 * x0, s1 + 1), FloorDiv)  # a sum is no monomial divisor


def test_modular_indexing_folds_syntactic_multiples() -> None:
    assert ModularIndexing(s1 * x0, 1, s1) == 0
    assert ModularIndexing(2 * s0 * s1 * x0, s1, s0) == 0
    assert ModularIndexing(s1 * x0, s1, s0) == ModularIndexing(x0, 1, s0)
    assert isinstance(ModularIndexing(s1 * x0 + r0, 1, s1), ModularIndexing)


def test_static_folds_are_unchanged() -> None:
    assert FloorDiv(4 * x0 + 8, 2) == 2 * x0 + 4
    assert isinstance(FloorDiv(4 * x0 + 1, 2), FloorDiv)
    assert FloorDiv(FloorDiv(x0, 4), 2) == FloorDiv(x0, 8)
    assert ModularIndexing(sympy.Integer(13), 2, 4) == 2
    assert isinstance(ModularIndexing(4 * x0, 1, 4), ModularIndexing)  # simplify_index's work, not eval's


# ---- simplify_index with symbolic ranges


def test_a_row_index_comes_apart_by_its_symbolic_length() -> None:
    assert simplify_index(ModularIndexing(s1 * x0 + r0, 1, s1), ROW, INFO) == r0
    assert simplify_index(FloorDiv(s1 * x0 + r0, s1), ROW, INFO) == x0
    assert simplify_index(ModularIndexing(s1 * x0 + r0, s1, s0), ROW, INFO) == x0
    # without shapes the symbols' positivity alone proves it too
    assert simplify_index(FloorDiv(s1 * x0 + r0, s1), ROW) == x0


def test_a_remainder_not_known_below_the_divisor_is_kept() -> None:
    for rng in ({x0: s0}, {x0: s0, r0: s1 + 1}, {x0: s0, r0: 2 * s1}):
        e = simplify_index(FloorDiv(s1 * x0 + r0, s1), rng, INFO)
        assert e == x0 + FloorDiv(r0, s1), rng  # the multiple comes out, the rest stays
        m = simplify_index(ModularIndexing(s1 * x0 + r0, 1, s1), rng, INFO)
        assert m == ModularIndexing(r0, 1, s1), rng
    # a divisor that is no size expression is left alone
    assert simplify_index(FloorDiv(x1 * x0, x1), {x0: 4, x1: 4}, INFO) == FloorDiv(x0 * x1, x1)


def test_an_int_divisor_against_a_symbolic_range_needs_its_upper_bound() -> None:
    e = ModularIndexing(r0, 1, 16)
    assert simplify_index(e, {r0: s1}, INFO) == e  # s1 unbounded: r0 may pass 16
    assert simplify_index(e, {r0: s1}, info(upper1=16)) == r0  # s1 <= 16: r0 <= 15
    assert simplify_index(e, {r0: s1}, info(upper1=17)) == e
    # the same expression and ranges under two ShapeInfos: the cache keys on shapes
    assert simplify_index(FloorDiv(r0, 16), {r0: s1}, info(upper1=16)) == 0
    assert simplify_index(FloorDiv(r0, 16), {r0: s1}, INFO) == FloorDiv(r0, 16)


def test_scale_down_by_a_symbolic_common_factor() -> None:
    rng = {x0: s0, r0: 64 * s1}
    assert simplify_index(FloorDiv(64 * s1 * x0 + r0, 128 * s1), rng, INFO) == FloorDiv(x0, 2)
    assert simplify_index(ModularIndexing(64 * s1 * x0 + r0, 128 * s1, 3), rng, INFO) == ModularIndexing(x0, 2, 3)
    # below 128*s1*s0 for every size: no modulus at all
    assert simplify_index(ModularIndexing(64 * s1 * x0 + r0, 128 * s1, s0), rng, INFO) == FloorDiv(x0, 2)
    wide = {x0: s0, r0: 64 * s1 + 1}  # the remainder may carry: kept
    assert isinstance(simplify_index(FloorDiv(64 * s1 * x0 + r0, 128 * s1), wide, INFO), FloorDiv)


def test_a_row_index_over_a_length_that_is_a_sum_comes_apart() -> None:
    """A row of length L = FloorDiv(s0, 5) - 1 (a conv stack's output length) read
    through its flat index `(512*x0 + x1)*L + r0`, expanded: no term is a syntactic
    multiple of L, so before session 58 nothing split, and Wav2Vec2-Conformer's
    GroupNorm at a symbolic length divided by L four times an element (52 ms a call
    on one thread, 1.6 after).  Polynomial division in FloorDiv(s0, 5) splits it;
    512*L divides as (a // L) // 512.  With no facts about s0, L counts as positive
    because r0 loops over L elements (an index is read only inside its loops)."""
    length = FloorDiv(s0, 5) - 1
    flat = sympy.expand((512 * x0 + x1) * length + r0)
    rng = {x0: 2, x1: 512, r0: length}
    assert simplify_index(FloorDiv(flat, length), rng) == 512 * x0 + x1
    assert simplify_index(ModularIndexing(flat, 1, length), rng) == r0
    assert simplify_index(ModularIndexing(flat, length, 512), rng) == x1
    assert simplify_index(ModularIndexing(flat, 512 * length, 2), rng) == x0
    # the remainder may reach L (r0 over L + 1 elements): kept
    assert isinstance(simplify_index(FloorDiv(flat, length), {**rng, r0: length + 1}), FloorDiv)
    # nor is L known positive where no loop runs over it
    assert isinstance(simplify_index(FloorDiv(flat, length), {x0: 2, x1: 512, r0: 7}), FloorDiv)
    # and the split agrees with the division at concrete sizes
    for n, i, j, k in ((10, 1, 3, 0), (57, 0, 511, 9), (3200, 1, 100, 638)):
        at = {s0: n, x0: i, x1: j, r0: k}
        ln = n // 5 - 1
        assert (512 * i + j) * ln + k == flat.subs(at)
        assert simplify_index(FloorDiv(flat, length), rng).subs(at) == ((512 * i + j) * ln + k) // ln


def test_a_flat_walk_over_a_length_that_is_a_sum_merges_back() -> None:
    """A pointwise kernel's flat walk over (2, 512, L), L = FloorDiv(s0, 10) - 1,
    reading a contiguous buffer: the unflattened digits, expanded over L's terms
    (coefficients `FloorDiv(s0, 10)` and -1 apart), merge back into xindex itself (a
    GELU after a conv stack at a symbolic length divided by L an element before:
    15.5 ms a call on one thread, 4.0 after)."""
    length = FloorDiv(s0, 10) - 1
    digits = unflatten(x0, (2, 512, length))
    offset = sympy.expand(512 * length * digits[0] + length * digits[1] + digits[2])
    assert simplify_index(offset, {x0: 1024 * length}) == x0
    # a longer walk (x0 may pass 1024*L): the outer digit stays
    assert simplify_index(offset, {x0: 2048 * length}) != x0


def test_symbolic_coefficients_with_int_divisors() -> None:
    rng = {x0: s0, x1: s1, x2: 4}
    assert simplify_index(ModularIndexing(4 * s1 * x0 + 4 * x1 + x2, 1, 4), rng, INFO) == x2
    assert simplify_index(FloorDiv(4 * s1 * x0 + 4 * x1 + x2, 4), rng, INFO) == s1 * x0 + x1


def test_unflatten_then_simplify_gives_the_loop_symbols() -> None:
    for size in ((s0, s1, 4), (s0, 3, s1), (4, s0, s1)):
        flat = flatten((x0, x1, x2), size)
        rng = dict(zip((x0, x1, x2), size))
        assert [simplify_index(u, rng, INFO) for u in unflatten(flat, size)] == [x0, x1, x2], size


def test_flatten_of_unflatten_gives_the_flat_index() -> None:
    for size in ((s0, s1, 4), (s0, 3, s1), (s1, s0), (2, s1, 3, s0)):
        back = flatten(unflatten(XINDEX, size), size)
        assert back != XINDEX
        assert simplify_index(back, {XINDEX: math.prod(size)}, INFO) == XINDEX, size


def test_a_partial_round_trip_keeps_the_digits_it_cannot_merge() -> None:
    # only the two inner digits of (s0, s1, 4): they merge into one modulus of 4*s1
    size = (s0, s1, 4)
    _, mid, inner = unflatten(XINDEX, size)
    got = simplify_index(4 * mid + inner, {XINDEX: s0 * s1 * 4}, INFO)
    assert got == ModularIndexing(XINDEX, 1, 4 * s1)


def test_digits_spread_over_terms_by_a_sum_stride_merge() -> None:
    """A stride that is a sum (s0 + s1 - 1, as a transposed convolution's output
    size reads) spreads each digit of an unflatten over several terms once the index
    is expanded; the digits are still found, their coefficients summed, and merged."""
    size = (s0, s1, s0 + s1 - 1)
    flat = flatten(unflatten(XINDEX, size), size)
    assert len(sympy.Add.make_args(sympy.expand(flat))) > 3  # the spread the old pairwise merge missed
    # one digit: the whole range, so the merged modulus folds away (xindex loops over
    # exactly that many elements: since session 58 a merged sum is visited again)
    assert simplify_index(flat, {XINDEX: math.prod(size)}, INFO) == XINDEX
    # over a longer walk it stays a modulus
    assert simplify_index(flat, {XINDEX: 2 * math.prod(size)}, INFO) == ModularIndexing(XINDEX, 1, sympy.expand(
        math.prod(size)))
    # a spread digit next to one it cannot merge with keeps both, expanded as they came
    _, mid, inner = unflatten(XINDEX, size)
    kept = sympy.expand((s0 + s1) * mid + inner)
    assert simplify_index(kept, {XINDEX: math.prod(size)}, INFO) == kept


# ---- soundness: the simplified index has the original's value at every size


def _evaluate(e: sympy.Expr, values: dict[str, int]) -> int:
    """The value of an index at ints for its symbols (by name), in Python ints."""
    if e.is_Integer:
        return int(e)
    if isinstance(e, sympy.Symbol):
        return values[e.name]
    args = [_evaluate(a, values) for a in e.args]
    if isinstance(e, sympy.Add):
        return sum(args)
    if isinstance(e, sympy.Mul):
        return math.prod(args)
    if isinstance(e, sympy.Pow):
        return int(args[0] ** args[1])
    if isinstance(e, FloorDiv):
        return args[0] // args[1]
    if isinstance(e, ModularIndexing):
        return (args[0] // args[1]) % args[2]
    if isinstance(e, (sympy.Max, sympy.Min)):
        return max(args) if isinstance(e, sympy.Max) else min(args)
    raise TypeError(f"cannot evaluate {e}")


SIZES: list[Size] = [s0, s1, 2 * s1, s0 * s1, 3, 4, 1]
DIVISORS: list[Size] = [s0, s1, 2 * s1, s0 * s1, 4 * s1, 2, 3, 4]


@st.composite
def _symbolic_index(draw: st.DrawFn) -> tuple[sympy.Expr, dict[sympy.Symbol, Size]]:
    """A nonnegative index over x0, x1, r0 with symbolic ranges: a random
    polynomial (coefficients of ints and size symbols) wrapped in FloorDiv /
    ModularIndexing, or the unflatten of a flatten over other sizes (a view)."""
    syms = [x0, x1, r0]
    ranges = {s: draw(st.sampled_from(SIZES)) for s in syms}
    if draw(st.booleans()):
        dims = draw(st.lists(st.sampled_from(SIZES[:-1]), min_size=1, max_size=3))
        order = draw(st.permutations(range(len(dims))))
        idx = [syms[i] for i in range(len(dims))]
        rng = dict(zip(idx, dims))
        flat = flatten([idx[i] for i in order], [dims[i] for i in order])
        view = draw(st.lists(st.sampled_from(SIZES[:-1]), min_size=1, max_size=3))
        parts = unflatten(flat, view)
        coeffs = draw(st.lists(st.sampled_from([1, 2, s1, 4 * s0]), min_size=len(parts), max_size=len(parts)))
        return sympy.Add(*[c * p for c, p in zip(coeffs, parts)]), rng

    def poly(depth: int) -> sympy.Expr:
        terms = []
        for _ in range(draw(st.integers(1, 3))):
            c = draw(st.sampled_from([1, 2, 3, 4, s0, s1, 2 * s1, s0 * s1, 4 * s1]))
            if depth and draw(st.integers(0, 2)) == 0:
                inner = poly(depth - 1)
                if draw(st.booleans()):
                    terms.append(c * FloorDiv(inner, draw(st.sampled_from(DIVISORS))))
                else:
                    b = draw(st.sampled_from([1, 1, 2, s1] + DIVISORS))
                    terms.append(c * ModularIndexing(inner, b, draw(st.sampled_from(DIVISORS))))
            else:
                terms.append(c * draw(st.sampled_from(syms)))
        if draw(st.booleans()):
            terms.append(draw(st.integers(0, 5)))
        return sympy.Add(*terms)

    return poly(2), ranges


@settings(max_examples=400, deadline=None)
@given(_symbolic_index(), st.sampled_from([None, 3, 5]), st.integers(0, 2**32 - 1))
def test_simplify_index_is_sound_for_every_size(drawn: tuple[sympy.Expr, dict[sympy.Symbol, Size]],
                                                upper: int | None, seed: int) -> None:
    e, ranges = drawn
    shapes = info(upper, upper)
    out = simplify_index(e, ranges, shapes)
    rnd = random.Random(seed)
    hi = upper or 6
    for size_values in [(2, 2), (hi, hi), (2, hi), (hi, 2)] + [(rnd.randint(2, hi), rnd.randint(2, hi)) for _ in range(4)]:
        sv = {"s0": size_values[0], "s1": size_values[1]}
        extents = {s: _evaluate(sympy.sympify(n), sv) for s, n in ranges.items()}
        points = [{s: 0 for s in extents}, {s: n - 1 for s, n in extents.items()}]
        points += [{s: rnd.randrange(n) for s, n in extents.items()} for _ in range(12)]
        for p in points:
            at = {**sv, **{s.name: v for s, v in p.items()}}
            assert _evaluate(out, at) == _evaluate(e, at), (e, out, ranges, at)


@settings(max_examples=300, deadline=None)
@given(_symbolic_index(), st.sampled_from([None, 4]), st.integers(0, 2**32 - 1))
def test_index_range_holds_every_value_for_every_size(drawn: tuple[sympy.Expr, dict[sympy.Symbol, Size]],
                                                      upper: int | None, seed: int) -> None:
    e, ranges = drawn
    shapes = info(upper, upper)
    r = index_range(e, ranges, shapes)
    if r is None:
        return
    rnd = random.Random(seed)
    hi = upper or 6
    for size_values in [(2, 2), (hi, hi), (rnd.randint(2, hi), rnd.randint(2, hi))]:
        sv = {"s0": size_values[0], "s1": size_values[1]}
        extents = {s: _evaluate(sympy.sympify(n), sv) for s, n in ranges.items()}
        lo, up = (_evaluate(sympy.sympify(v), sv) for v in r)
        for _ in range(12):
            at = {**sv, **{s.name: rnd.randrange(n) for s, n in extents.items()}}
            assert lo <= _evaluate(e, at) <= up, (e, r, at)


# ---- value ranges and checks with symbolic loop sizes


def _index_check(arg: sympy.Expr, size: Size, wrap: bool = False, dtype: torch.dtype = torch.int64) -> Check:
    return Check(IndexExpr(arg, dtype), "index", size, 0, wrap)  # type: ignore[arg-type]


def _status(c: Check, ranges: dict[sympy.Symbol, Size], shapes: ShapeInfo = INFO) -> str:
    out = prove_checks(c, ranges, shapes)
    checks = [e for e in walk(out) if isinstance(e, Check)]
    return checks[0].status


def test_a_symbolic_loop_symbol_has_a_symbolic_range() -> None:
    assert value_range(IndexExpr(r0), ROW, shapes=INFO) == (0, s1 - 1)
    assert index_range(s1 * x0 + r0, ROW, INFO) == (0, s0 * s1 - 1)
    assert index_range(FloorDiv(r0, 4), ROW, INFO) == (0, FloorDiv(s1 - 1, 4))
    assert index_range(ModularIndexing(r0, 1, s0), ROW, INFO) == (0, s0 - 1)
    # an int32 value fits only where the sizes are bounded
    assert value_range(IndexExpr(r0, torch.int32), ROW, shapes=INFO) == (-(2**31), 2**31 - 1)
    assert value_range(IndexExpr(r0, torch.int32), ROW, shapes=info(upper1=1000)) == (0, s1 - 1)
    # int64 holds every size (a size is an int64), not every product of them
    assert value_range(IndexExpr(s1 * s1 * r0), ROW, shapes=INFO) == (-(2**63), 2**63 - 1)


def test_an_index_within_its_symbolic_dim_is_proven() -> None:
    assert _status(_index_check(r0, s1), ROW) == "proven"  # 0 <= r0 <= s1 - 1 < s1
    # s1*x0 + r0 <= s0*s1 - 1 < s0*s1, once the sizes are bounded: unbounded, the
    # int64 product might wrap for sizes in the ranges (each size is below 2**63,
    # their product need not be), and the check stays
    assert _status(_index_check(s1 * x0 + r0, s0 * s1), ROW, info(2**20, 2**20)) == "proven"
    assert _status(_index_check(s1 * x0 + r0, s0 * s1), ROW) == "checked"
    assert _status(_index_check(r0, 2 * s1), ROW) == "proven"
    # an int dim: only with a known upper bound of s1
    assert _status(_index_check(r0, 16), ROW) == "checked"
    assert _status(_index_check(r0, 16), ROW, info(upper1=16)) == "proven"
    assert _status(_index_check(r0, 16), ROW, info(upper1=17)) == "checked"


def test_an_index_that_may_leave_its_symbolic_dim_keeps_its_check() -> None:
    assert _status(_index_check(r0 + 1, s1), ROW) == "checked"
    assert _status(_index_check(r0, s1 - 1), ROW) == "checked"
    assert _status(_index_check(r0, s0), ROW) == "checked"  # s0 may be smaller than s1
    assert _status(_index_check(r0, s0), {x0: s0, r0: s1}, info()) == "checked"
    assert _status(_index_check(r0 - 1, s1), ROW) == "checked"  # -1 at r0 = 0
    assert _status(_index_check(r0 - 1, s1, wrap=True), ROW) == "proven"  # wraps to the end
    assert _status(_index_check(x0, s1), {x0: s1}) == "proven"
    assert _status(_index_check(x0, 4), {x0: s1}) == "checked"


def test_divisor_checks_and_recorded_ranges() -> None:
    plus_one = Op("add", (IndexExpr(r0), Constant(1, torch.int64)), torch.int64)
    c = prove_checks(Check(plus_one, "division"), ROW, INFO)
    assert isinstance(c, Check) and c.status == "proven"
    assert c.range == (1, 2**63 - 1)  # the ints over every size: s1 is at most 2**63 - 1
    bare = prove_checks(Check(IndexExpr(r0), "division"), ROW, INFO)
    assert isinstance(bare, Check) and bare.status == "checked"
    # an op without a symbolic rule uses the ends' bounds: r0 % 7 is in [0, 6]
    rem = Op("remainder", (IndexExpr(r0), Constant(7, torch.int64)), torch.int64)
    assert value_range(rem, ROW, shapes=INFO) == (0, 6)
    assert _status(Check(rem, "index", 7), ROW) == "proven"


def test_symbolic_arithmetic_of_ranges() -> None:
    sub = Op("sub", (IndexExpr(s1 - 1 - r0), Constant(0, torch.int64)), torch.int64)
    assert value_range(sub, ROW, shapes=INFO) == (0, s1 - 1)
    assert _status(Check(sub, "index", s1), ROW) == "proven"  # a flip  # type: ignore[arg-type]
    mx = Op("maximum", (IndexExpr(r0), Constant(3, torch.int64)), torch.int64)
    assert value_range(mx, ROW, shapes=INFO) == (3, sympy.Max(3, s1 - 1))
    assert _status(Check(mx, "index", s1 + 3), ROW) == "proven"  # type: ignore[arg-type]
    assert _status(Check(mx, "index", s1), ROW) == "checked"  # 3 at s1 = 2  # type: ignore[arg-type]
    mn = Op("minimum", (IndexExpr(r0), Constant(3, torch.int64)), torch.int64)
    assert _status(Check(mn, "index", 4), ROW) == "proven"


def _load(index: Sequence[sympy.Expr], mask: Expr | None = None) -> Load:
    return Load("a", tuple(index), torch.float32, mask)


def test_load_in_bounds_with_symbolic_sizes() -> None:
    assert load_in_bounds(_load((x0, r0)), (s0, s1), ROW, INFO)
    assert load_in_bounds(_load((s1 * x0 + r0,)), (s0 * s1,), ROW, INFO)
    assert not load_in_bounds(_load((x0, r0 + 1)), (s0, s1), ROW, INFO)
    assert not load_in_bounds(_load((s1 * x0 + r0,)), (s0 * s1 - 1,), ROW, INFO)
    assert not load_in_bounds(_load((x0, r0)), (s0, 4), ROW, INFO)
    assert not load_in_bounds(_load((r0, x0)), (s0, s1), ROW, INFO)  # transposed sizes differ


def test_a_mask_narrows_a_symbolic_range() -> None:
    lt4 = Op("lt", (IndexExpr(r0), Constant(4, torch.int64)), torch.bool)
    assert mask_ranges(lt4, ROW, INFO)[r0] == (0, sympy.Min(3, s1 - 1))
    assert load_in_bounds(_load((x0, r0), lt4), (s0, 4), ROW, INFO)
    ge1 = Op("ge", (IndexExpr(r0), Constant(1, torch.int64)), torch.bool)
    assert load_in_bounds(_load((x0, r0 - 1), ge1), (s0, s1), ROW, INFO)  # a shifted read of a padded row
    assert not load_in_bounds(_load((x0, r0 - 1)), (s0, s1), ROW, INFO)
    assert not load_in_bounds(_load((x0, r0), ge1), (s0, s1 - 1), ROW, INFO)


def test_static_ranges_are_ints_as_before() -> None:
    assert value_range(IndexExpr(2 * x0 - x1 + 1), {x0: 4, x1: 8}) == (-6, 7)
    assert index_range(x0, {x0: 0}) is None  # an empty static loop: unknown, as before
    assert mask_ranges(None, {x0: 4}, EMPTY) == {x0: (0, 3)}


@st.composite
def _symbolic_int_expr(draw: st.DrawFn, depth: int = 0) -> Expr:
    """A small integer body over x0 in [0, s0) and x1 in [0, s1): iotas with size
    symbols in them, constants, and the ops value_range knows (symbolic rules for
    some, the ends' int bounds for the others)."""
    dt = draw(st.sampled_from([torch.int64, torch.int64, torch.int32]))
    if depth >= 3 or draw(st.integers(0, 3)) == 0:
        if draw(st.booleans()):
            a = draw(st.sampled_from([0, 1, 2, -1, s1, -s1]))
            b = draw(st.sampled_from([0, 1, 3, -2]))
            c = draw(st.sampled_from([0, 2, -3, s0, s1 - 1, -s0]))
            return IndexExpr(a * x0 + b * x1 + c, dt)
        return Constant(draw(st.integers(-7, 7)), dt)
    name = draw(st.sampled_from(["add", "sub", "mul", "maximum", "minimum", "neg", "abs", "where", "floordiv",
                                 "remainder", "relu", "sign"]))
    a = draw(_symbolic_int_expr(depth + 1))
    if name in ("neg", "abs", "relu", "sign"):
        return Op(name, (a,), a.dtype)
    b = draw(_symbolic_int_expr(depth + 1))
    if b.dtype != a.dtype:
        b = Cast(b, a.dtype)
    if name == "where":
        return Op("where", (Op("lt", (a, b), torch.bool), a, b), a.dtype)
    if name in ("floordiv", "remainder"):
        b = Check(Op("add", (Op("abs", (b,), a.dtype), Constant(1, a.dtype)), a.dtype), "division")
    return Op(name, (a, b), a.dtype)


@settings(max_examples=300, deadline=None)
@given(_symbolic_int_expr(), st.sampled_from([None, 5]), st.integers(2, 5), st.integers(2, 5))
def test_value_range_holds_every_value_for_every_size(expr: Expr, upper: int | None, v0: int, v1: int) -> None:
    shapes = info(upper, upper)
    r = value_range(expr, {x0: s0, x1: s1}, shapes=shapes)
    assert r is not None
    at = {s0: sympy.Integer(v0), s1: sympy.Integer(v1)}
    concrete = rewrite(expr, lambda e: IndexExpr(e.expr.xreplace(at), e.dtype) if isinstance(e, IndexExpr) else None)
    cpu = torch.device("cpu")
    got = evaluate(concrete, ReferenceHandler(loop_env((v0, v1), (), cpu), {}, {}, cpu))
    lo, hi = (_evaluate(sympy.sympify(v), {"s0": v0, "s1": v1}) for v in r)
    assert lo <= int(got.min()) and int(got.max()) <= hi, (expr, r, got)


@st.composite
def _symbolic_masked_load(draw: st.DrawFn) -> tuple[Load, tuple[Size, Size]]:
    """A load over x0 in [0, s0), x1 in [0, s1) at a shifted index of a tensor with
    symbolic or int dims, masked by comparisons of a symbol with a constant (which
    the analysis reads) and of an expression (which it must not trust)."""
    tests: list[Expr] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["lt", "le", "gt", "ge", "eq", "expr"]))
        sym = draw(st.sampled_from([x0, x1]))
        c = draw(st.integers(-1, 6))
        if kind == "expr":
            tests.append(Op("lt", (IndexExpr(sym - 3), Constant(c, torch.int64)), torch.bool))
        else:
            tests.append(Op(kind, (IndexExpr(sym), Constant(c, torch.int64)), torch.bool))
    mask: Expr | None = None
    for t in tests:
        mask = t if mask is None else Op("logical_and", (mask, t), torch.bool)
    index = (x0 + draw(st.integers(-2, 2)), draw(st.sampled_from([1, 2, -1])) * x1 + draw(st.sampled_from([0, 1, -1, s1])))
    size = (draw(st.sampled_from([s0, s0 + 1, s0 - 1, 3, s1])), draw(st.sampled_from([s1, 2 * s1, s1 + 1, 4, s0 * s1])))
    return Load("a", index, torch.float32, mask), size


@settings(max_examples=300, deadline=None)
@given(_symbolic_masked_load(), st.sampled_from([None, 5]), st.integers(2, 5), st.integers(2, 5))
def test_load_in_bounds_is_sound_for_every_size(drawn: tuple[Load, tuple[Size, Size]], upper: int | None,
                                                v0: int, v1: int) -> None:
    ld, size = drawn
    if not load_in_bounds(ld, size, {x0: s0, x1: s1}, info(upper, upper)):
        return
    sv = {"s0": v0, "s1": v1}
    at = {s0: sympy.Integer(v0), s1: sympy.Integer(v1)}
    cpu = torch.device("cpu")
    holds = torch.ones(v0, v1, dtype=torch.bool) if ld.mask is None else torch.broadcast_to(
        evaluate(ld.mask, ReferenceHandler(loop_env((v0, v1), (), cpu), {}, {}, cpu)), (v0, v1))
    dims = [_evaluate(sympy.sympify(n), sv) for n in size]
    for p0, p1 in holds.nonzero().tolist():
        point = {**sv, "x0": p0, "x1": p1}
        for i, n in zip(ld.index, dims):
            assert 0 <= _evaluate(sympy.sympify(i).xreplace(at), point) < n, (ld, size, point)


# ---- printing: C's and Triton's / and % truncate ----------------------------------------------


def _c_eval(text: str, values: dict[str, int]) -> int:
    """A printed C / Triton index evaluated as they evaluate it: / and % truncate."""
    import ast

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return int(node.value)
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, (ast.Div, ast.FloorDiv)):
                return int(a / b) if a * b < 0 else a // b  # toward zero
            if isinstance(node.op, ast.Mod):
                return a - b * (int(a / b) if a * b < 0 else a // b)
        raise ValueError(ast.dump(node))

    return ev(ast.parse(text, mode="eval"))


def test_a_size_that_may_be_negative_divides_as_the_floor_in_c_and_triton() -> None:
    """`(-s0) mod 128` (a length padded to a multiple of 128: s0 + (-s0 mod 128))
    printed as C's `%` was -(s0 mod 128): the padded length came out s0 rounded
    down, 0 for s0 = 100, and the kernel divided by it (SIGFPE).  Such a
    numerator (sizes only, not shown to be at least 0) prints with the floor's
    meaning; an index of loop variables keeps the plain operators."""
    from coil.backends.cpp.handler import cpp_index
    from coil.backends.triton.handler import print_index

    s0 = size_symbol(0)
    padded = s0 + ModularIndexing(-s0, 1, 128)
    blocks = FloorDiv(padded, 128)
    neg_floor = FloorDiv(-s0, 3)
    for n in (1, 100, 128, 129, 300):
        for printer in (cpp_index, print_index):
            for e in (padded, blocks, neg_floor, ModularIndexing(-s0, 4, 5)):
                want = int(e.xreplace({s0: sympy.Integer(n)}))
                assert _c_eval(printer(e).replace("s0", "n"), {"n": n}) == want, (printer(e), n)
    x0 = xsyms(1)[0]
    assert cpp_index(FloorDiv(x0 + 2 * s0, 64)) == "((2*s0 + x0) / 64)"  # loop variables: as before


def test_a_length_padded_to_a_multiple_views_and_reduces_as_eager() -> None:
    """The model pattern behind it (LongT5's blocks of 128): pad to a multiple of
    128, view as blocks, reduce; dynamic sizes, on cpp and reference."""
    import torch.nn.functional as F

    def f(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        y = F.pad(x, (0, (-n) % 128))
        return y.view(2, y.shape[1] // 128, 128).sum(-1)

    for target in ("reference", "cpp"):
        torch._dynamo.reset()
        g = torch.compile(f, backend="coil", dynamic=True, options={"target": target, "graph_cache": False})
        for n in (100, 300, 256):
            x = torch.randn(2, n)
            torch.testing.assert_close(g(x), f(x))
