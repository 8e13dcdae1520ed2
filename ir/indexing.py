"""Index arithmetic over loop symbols: integer floor division and modular indexing
as sympy functions, plus the range-aware simplification that turns
`ModularIndexing(x0*128 + r0, 1, 128)` back into `r0`.

Every index expression in coil is a polynomial of loop symbols with integer
coefficients, wrapped at most in FloorDiv / ModularIndexing.  Ranges (the size of
each symbol's loop) are passed explicitly; nothing is global.

With dynamic shapes, coefficients, divisors and ranges may be expressions of size
symbols (ir/shapes.py): a softmax over (s0, s1) loads `s1*x0 + r0` over
{x0: s0, r0: s1}.  The rules are the same, a divisor `b` taking out the terms that
are syntactic multiples of it (`64*s1*x0` of `64*s1`), and each `rest < b` they
need a `ShapeInfo.known_lt` proof over the size symbols' ranges: where none holds
for every size, the expression stays as it is (correct, less simplified).  Static
graphs see only ints and take the int code, as before.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import sympy

from coil.ir.shapes import EMPTY, ShapeInfo, Size, is_size_symbol, is_unbacked_symbol, norm, product, sizes


class FloorDiv(sympy.Function):
    """floor(a / b) for a >= 0, b > 0 integers (b an int or a size expression)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if b == 1:
            return a
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if isinstance(a, FloorDiv) and b.is_Integer and a.args[1].is_Integer:
            return FloorDiv(a.args[0], a.args[1] * b)
        if b.is_Integer:
            # a factor common to every term's coefficient and b cancels: (128*s0) // 512 is
            # s0 // 4 (a reshape's size as Dynamo passes it, against a guard's s0 // 4); where
            # b divides every coefficient, the quotient is whole
            terms = sympy.Add.make_args(a)
            g = math.gcd(int(b), *(_coeff(t) for t in terms))
            if g == int(b):
                return sympy.Add(*[t / b for t in terms])
            if g > 1:
                return FloorDiv(sympy.Add(*[t / g for t in terms]), sympy.Integer(int(b) // g))
            # whole multiples of b plus a constant: (4*(s0//8) + 1) // 2 is 2*(s0//8) (Swin's
            # merged patches, (H + 1) // 2 of an H a guard made a multiple of 4)
            whole = [t for t in terms if not t.is_Integer]
            if whole and len(whole) + 1 == len(terms) and _of_sizes(a) and all(
                    _coeff(t) % int(b) == 0 for t in whole):
                return sympy.Add(*[t / b for t in whole]) + sympy.Integer(int(a - sympy.Add(*whole)) // int(b))
            if isinstance(a, FloorDiv):  # a symbolic inner divisor (static graphs never have one)
                return FloorDiv(a.args[0], a.args[1] * b)
            return None
        # a symbolic divisor (a size expression): the same two folds, by syntactic multiples
        if isinstance(a, FloorDiv):  # (a // b1) // b2 == a // (b1*b2) for b1, b2 > 0
            return FloorDiv(a.args[0], a.args[1] * b)
        qs = [_quotient(t, b) for t in sympy.Add.make_args(a)]
        if all(q is not None for q in qs):
            return sympy.Add(*qs)
        return None


class ModularIndexing(sympy.Function):
    """(a // b) % c for a >= 0 and b, c > 0 integers (ints or size expressions)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr, c: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if c == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer and c.is_Integer:
            return sympy.Integer((int(a) // int(b)) % int(c))
        if b.is_Integer and c.is_Integer:
            # a whole multiple of b*c: (4*(s0//8)) % 4, where a guard made s0//2 = 4*(s0//8)
            whole = [t for t in sympy.Add.make_args(a) if not t.is_Integer]
            if _of_sizes(a) and all(_coeff(t) % int(b * c) == 0 for t in whole):
                # and a constant: (4*(s0//8) + 1) % 4 is 1
                return sympy.Integer((int(a - sympy.Add(*whole)) // int(b)) % int(c))
            return None
        # a symbolic b or c: a multiple of b*c is 0, a multiple of b is divided out
        terms = sympy.Add.make_args(a)
        if all(_quotient(t, b * c) is not None for t in terms):
            return sympy.Integer(0)
        if b != 1:
            qs = [_quotient(t, b) for t in terms]
            if all(q is not None for q in qs):
                return ModularIndexing(sympy.Add(*qs), 1, c)
        return None


def _of_sizes(a: sympy.Expr) -> bool:
    """Whether `a` is a size (its symbols all size symbols): the folds of a whole
    multiple plus a constant are for sizes under guards; kernel indices keep their
    form for simplify_index (static kernels print as they did)."""
    return all(is_size_symbol(s) for s in a.free_symbols)


def _coeff(term: sympy.Expr) -> int:
    c, _ = term.as_coeff_Mul()
    return int(c) if c.is_Integer else 1


def _monomial(e: sympy.Expr) -> tuple[int, dict[sympy.Expr, int]] | None:
    """`e` as (integer coefficient, {base: positive int exponent}), or None when it
    is no monomial (an Add, a rational coefficient, a negative power)."""
    c, rest = e.as_coeff_Mul()
    if not c.is_Integer:
        return None
    powers: dict[sympy.Expr, int] = {}
    for f in sympy.Mul.make_args(rest):
        if f == 1:
            continue
        base, exp = f.as_base_exp()
        if isinstance(base, sympy.Add) or not exp.is_Integer or int(exp) <= 0:
            return None
        powers[base] = powers.get(base, 0) + int(exp)
    return int(c), powers


def _quotient(t: sympy.Expr, b: Size) -> sympy.Expr | None:
    """t / b when the term `t` is a syntactic multiple of `b` (an int: its integer
    coefficient divides; an expression: a monomial whose coefficient and powers
    divide t's), else None."""
    if isinstance(b, int) or b.is_Integer:
        return t / b if _coeff(t) % int(b) == 0 else None
    mb = _monomial(b)
    mt = _monomial(t)
    if mb is None or mt is None or mb[0] == 0 or mt[0] % mb[0] != 0:
        return None
    if any(mt[1].get(base, 0) < exp for base, exp in mb[1].items()):
        return None
    return t / b


def _eq(a: Size, b: Size) -> bool:
    """Structural equality of two sizes (after expand): a proof for every value."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)


def _lt(m: Size, b: Size, shapes: ShapeInfo) -> bool:
    """m < b for every value of the size symbols (the int comparison when static)."""
    if isinstance(m, int) and isinstance(b, int):
        return m < b
    return shapes.known_lt(m, b)


def _size_divisor(b: sympy.Expr, shapes: ShapeInfo, loops: frozenset[sympy.Expr] = frozenset()) -> Size | None:
    """`b` as a divisor the rewrites may use: a positive int, or an expression over
    size symbols only that is positive for every size, or a positive int times one
    of `loops` (the index's symbolic loop sizes: the index is read only inside those
    loops, where each runs at least once, as an unbacked loop's u0 is at least 1
    there; `FloorDiv(s0, 5) - 1`, a length a conv stack makes); None otherwise."""
    if b.is_Integer:
        return int(b) if int(b) > 0 else None
    if not b.free_symbols or not all(is_size_symbol(s) for s in b.free_symbols):
        return None
    if b.is_positive or shapes.known_gt(b, 0):
        return b
    if loops:
        k, m = sympy.factor_terms(b).as_coeff_Mul()
        if norm(b) in loops or (k.is_Integer and int(k) > 0 and norm(m) in loops):
            return b
    return None


def _nonneg_factor(f: sympy.Expr) -> bool:
    """A factor of an index term that is never negative: a loop or size symbol,
    a FloorDiv / ModularIndexing, a positive power of one."""
    if isinstance(f, (sympy.Symbol, FloorDiv, ModularIndexing)):
        return True
    if isinstance(f, sympy.Pow):
        return f.exp.is_Integer and int(f.exp) > 0 and _nonneg_factor(f.base)
    return bool(f.is_nonnegative)


def _max_value(e: sympy.Expr, ranges: Mapping[sympy.Symbol, Size]) -> Size | None:
    """Largest value of a nonnegative index expression, or None if unknown: an int
    while the ranges are ints, else an expression over size symbols that bounds it
    for every size (a size symbol is its own largest value)."""
    if e.is_Integer:
        return int(e)
    if isinstance(e, sympy.Symbol):
        n = ranges.get(e)
        if n is None:
            return e if is_size_symbol(e) else None
        return n - 1
    if isinstance(e, sympy.Add):
        parts = [_max_value(a, ranges) for a in e.args]
        if any(p is None for p in parts):
            return None
        if all(isinstance(p, int) for p in parts):
            return sum(parts)  # type: ignore[arg-type]
        return norm(sympy.Add(*parts))
    if isinstance(e, sympy.Mul):
        c, rest = e.as_coeff_Mul()
        if c.is_Integer and int(c) >= 0:
            if isinstance(rest, sympy.Mul):
                # a product of factors never negative: the product of their maxima
                if not all(_nonneg_factor(f) for f in rest.args):
                    return None
                ms = [_max_value(f, ranges) for f in rest.args]
                if any(m is None for m in ms):
                    return None
                return norm(int(c) * sympy.Mul(*ms))
            m = _max_value(rest, ranges)
            if m is None:
                return None
            return int(c) * m if isinstance(m, int) else norm(int(c) * m)
        return None
    if isinstance(e, sympy.Pow):
        if e.exp.is_Integer and int(e.exp) > 0 and _nonneg_factor(e.base):
            m = _max_value(e.base, ranges)
            return None if m is None else norm(sympy.sympify(m) ** int(e.exp))
        return None
    if isinstance(e, FloorDiv):
        m = _max_value(e.args[0], ranges)
        b = e.args[1]
        if m is None:
            return None
        if b.is_Integer and isinstance(m, int):
            return m // int(b)
        if b.is_Integer or all(is_size_symbol(s) for s in b.free_symbols):
            return norm(FloorDiv(m, b))
        return None
    if isinstance(e, ModularIndexing):
        c = e.args[2]
        if c.is_Integer:
            return int(c) - 1
        if all(is_size_symbol(s) for s in c.free_symbols):
            return norm(c - 1)
    return None


def _min_value(e: sympy.Expr, ranges: Mapping[sympy.Symbol, Size]) -> int | None:
    """A lower bound of an index expression over its loops' ranges (each symbol
    from 0), or None if unknown: an int.  A term with a negative coefficient
    counts at its largest value.  Index expressions are not always nonnegative:
    the index of a masked load (a slice_scatter's source, read where the mask
    holds) goes below 0 in the lanes the mask leaves out, and a part of it (the
    terms left over by a split) may be negative where the whole is not."""
    if e.is_Integer:
        return int(e)
    if isinstance(e, sympy.Add):
        total = 0
        for a in e.args:
            part = _min_value(a, ranges)
            if part is None:
                return None
            total += part
        return total
    c, rest = e.as_coeff_Mul()
    if not c.is_Integer or rest == 1:
        return None
    factors = sympy.Mul.make_args(rest)
    if not all(_nonneg_factor(f) and _nonneg_arg(f, ranges) for f in factors):
        return None
    if int(c) >= 0:
        return 0  # a product of factors that are never negative and may each be 0
    m = _max_value(rest, ranges)
    return int(c) * m if isinstance(m, int) else None


def _nonneg_arg(f: sympy.Expr, ranges: Mapping[sympy.Symbol, Size]) -> bool:
    """A factor that is never negative for every value in the ranges: a symbol,
    a power of one, a ModularIndexing (its modulus is positive), a FloorDiv of an
    argument that is never negative."""
    if isinstance(f, sympy.Pow):
        return _nonneg_arg(f.base, ranges)
    if isinstance(f, FloorDiv):
        m = _min_value(f.args[0], ranges)
        return m is not None and m >= 0
    return True


def _split_floordiv(a: sympy.Expr, b: Size, ranges: Mapping[sympy.Symbol, Size],
                    shapes: ShapeInfo) -> sympy.Expr | None:
    """a // b when a's terms split into multiples of b and a remainder in [0, b):
    a remainder that may be negative (32*i + j - 32 with j < 32) borrows from the
    quotient, and the split does not hold."""
    terms = sympy.Add.make_args(sympy.expand(a))
    if isinstance(b, int):
        whole = [t for t in terms if _coeff(t) % b == 0]
        rest = [t for t in terms if _coeff(t) % b != 0]
        rest_max = _max_value(sympy.Add(*rest), ranges) if rest else 0
        if rest_max is not None and _lt(rest_max, b, shapes) and _nonnegative(rest, ranges):
            return sympy.expand(sympy.Add(*[t / b for t in whole]))
        return None
    qs = [(t, _quotient(t, b)) for t in terms]
    rest = [t for t, q in qs if q is None]
    rest_max = _max_value(sympy.Add(*rest), ranges) if rest else 0
    if rest_max is not None and _lt(rest_max, b, shapes) and _nonnegative(rest, ranges):
        return sympy.expand(sympy.Add(*[q for _, q in qs if q is not None]))
    divided = _poly_divide(a, b)
    if divided is not None:
        q, r = divided
        r_max = _max_value(r, ranges) if r != 0 else 0
        if r_max is not None and _lt(r_max, b, shapes) and _nonnegative([r], ranges):
            return q
    return None


def _int_times_sum(b: Size) -> tuple[int, sympy.Expr] | None:
    """(k, m) where the divisor b is k*m for an integer k > 1 and a sum m of size
    terms (`512*FloorDiv(s0, 5) - 512`: 512 and `FloorDiv(s0, 5) - 1`), else None."""
    if isinstance(b, int):
        return None
    k, m = sympy.factor_terms(b).as_coeff_Mul()
    if not k.is_Integer or int(k) <= 1 or not isinstance(m, sympy.Add):
        return None
    return int(k), m


def _poly_divide(a: sympy.Expr, b: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr] | None:
    """(q, r) with a == q*b + r, for a divisor b that is a sum in one size atom (a
    length `FloorDiv(s0, 5) - 1` that a conv stack makes): a's terms polynomial in
    that atom divided as polynomials, q with integer coefficients, the terms that
    hold the atom otherwise (inside a ModularIndexing) left in r.  A row index
    `(64*i + j)*L + k` expanded over L = `FloorDiv(s0, 5) - 1` has no term that is a
    syntactic multiple of L; divided so, it is `64*i + j` and `k`.  None where b is no
    such sum or nothing divides."""
    if not isinstance(b, sympy.Add):
        return None
    try:
        gens = sympy.Poly(b).gens
    except sympy.PolynomialError:
        return None
    if len(gens) != 1:
        return None
    g = gens[0]
    poly, other = [], []
    for t in sympy.Add.make_args(sympy.expand(a)):
        rest = t.as_independent(g, as_Add=False)[1]
        if rest == 1 or rest == g or (isinstance(rest, sympy.Pow) and rest.base == g and rest.exp.is_Integer
                                      and int(rest.exp) > 0):
            poly.append(t)
        else:
            other.append(t)
    if not poly:
        return None
    try:
        q, r = sympy.div(sympy.Add(*poly), b, g)
    except sympy.PolynomialError:
        return None
    q = sympy.expand(q)
    if q == 0 or not all(c.is_Integer for c in q.as_coefficients_dict().values()):
        return None
    return q, sympy.expand(r + sympy.Add(*other))


def _nonnegative(terms: Sequence[sympy.Expr], ranges: Mapping[sympy.Symbol, Size]) -> bool:
    """Whether the sum of `terms` is at least 0 for every value in the ranges."""
    if not terms:
        return True
    m = _min_value(sympy.Add(*terms), ranges)
    return m is not None and m >= 0


def _split_terms(a: sympy.Expr, k: Size) -> tuple[sympy.Expr, sympy.Expr]:
    """(q, rest) with a == q*k + rest: the terms that are multiples of k, divided by
    it, and the others (k an int: its divisibility of their integer coefficients; a
    size expression: syntactic multiples, or, for a sum, polynomial division).
    q is 0 where nothing divides."""
    if isinstance(k, int):
        if k == 0:  # a zero-size loop: nothing divides by it
            return sympy.Integer(0), a
        terms = sympy.Add.make_args(sympy.expand(a))
        whole = [t for t in terms if _coeff(t) % k == 0 and not t.is_Integer or (t.is_Integer and int(t) % k == 0)]
        rest = [t for t in terms if t not in whole]
        return sympy.expand(sympy.Add(*whole) / k), sympy.Add(*rest)
    terms = sympy.Add.make_args(sympy.expand(a))
    qs = [(t, _quotient(t, k)) for t in terms]
    if all(q is None for _, q in qs) and (divided := _poly_divide(a, k)) is not None:
        return divided
    return (sympy.expand(sympy.Add(*[q for _, q in qs if q is not None])),
            sympy.Add(*[t for t, q in qs if q is None]))


def _gcd_monomial(b: sympy.Expr, t: sympy.Expr) -> sympy.Expr | None:
    """The greatest common monomial divisor of the monomials b and t (None when
    either is no monomial)."""
    mb, mt = _monomial(b), _monomial(t)
    if mb is None or mt is None:
        return None
    powers = [base ** min(exp, mt[1][base]) for base, exp in mb[1].items() if base in mt[1]]
    return sympy.Integer(math.gcd(mb[0], mt[0])) * sympy.Mul(*powers)


def _scale_down(a: sympy.Expr, b: Size, ranges: Mapping[sympy.Symbol, Size],
                shapes: ShapeInfo) -> tuple[sympy.Expr, Size] | None:
    """(q, b // k) when a = k*q + r with k > 1 dividing b and 0 <= r < k (r at
    least 0 for every value: _split_floordiv says why): then
    a // b == q // (b // k), the remainder never carrying into the quotient
    ((64*i + j) // 512 with j < 64 is i // 8; (64*s1*i + j) // (128*s1) with
    j < 64*s1 is i // 2)."""
    terms = sympy.Add.make_args(sympy.expand(a))
    if isinstance(b, int):
        for k in sorted({math.gcd(b, _coeff(t)) for t in terms if not t.is_Integer}, reverse=True):
            if k <= 1:
                continue
            whole = [t for t in terms if not t.is_Integer and _coeff(t) % k == 0]
            rest = [t for t in terms if t not in whole]
            m = _max_value(sympy.Add(*rest), ranges) if rest else 0
            if whole and m is not None and _lt(m, k, shapes) and _nonnegative(rest, ranges):
                return sympy.expand(sympy.Add(*whole) / k), b // k
        return None
    ks = {_gcd_monomial(b, t) for t in terms if not t.is_Integer}

    def size(k: sympy.Expr) -> tuple[int, int, str]:
        m = _monomial(k)
        assert m is not None
        return (sum(m[1].values()), m[0], str(k))

    for k in sorted((k for k in ks if k is not None and k != 1 and k != 0), key=size, reverse=True):
        whole = [t for t in terms if not t.is_Integer and _quotient(t, k) is not None]
        rest = [t for t in terms if t not in whole]
        m = _max_value(sympy.Add(*rest), ranges) if rest else 0
        if whole and m is not None and _lt(m, k, shapes) and _nonnegative(rest, ranges):
            return sympy.expand(sympy.Add(*whole) / k), norm(b / k)
    return None


def simplify_index(e: sympy.Expr, ranges: Mapping[sympy.Symbol, Size], shapes: ShapeInfo = EMPTY) -> sympy.Expr:
    """Range-aware simplification of FloorDiv / ModularIndexing, innermost first.
    A pure function of the expression, the ranges of its symbols and what is known
    of the size symbols (`shapes`: a range may be a size expression, a divisor too;
    a rewrite that needs `rest < b` fires only where that holds for every size), so
    its results are kept (the passes ask for the same index many times: extract_deps,
    fuse's register model and schedule_kernels each simplify every load of a kernel,
    and a channels-last graph's permuted indices cost sympy several times a plain one's)."""
    e = sympy.sympify(e)
    free = e.free_symbols
    items = frozenset((k, v if isinstance(v, int) else norm(v)) for k, v in ranges.items() if k in free)
    # a loop over u0 (data-dependent, maybe 0) elements runs only where u0 >= 1: an index inside it may take so
    loops = [v for _, v in items if is_unbacked_symbol(v)]
    return _simplify_index(e, items, shapes.at_least_one(loops) if loops else shapes)


@functools.lru_cache(maxsize=1 << 16)
def _simplify_index(e: sympy.Expr, ranges_items: frozenset[tuple[sympy.Symbol, Size]],
                    shapes: ShapeInfo) -> sympy.Expr:
    ranges = dict(ranges_items)
    if not e.has(FloorDiv, ModularIndexing):
        return sympy.expand(e)
    loop_sizes = frozenset(v for v in ranges.values() if not isinstance(v, int) and not v.is_Integer)
    depth = [0]  # merged sums being visited again (the Add case)

    def visit(node: sympy.Expr) -> sympy.Expr:
        if not node.args or not node.has(FloorDiv, ModularIndexing):
            return node
        args = [visit(a) for a in node.args]
        if isinstance(node, FloorDiv):
            a, b = args
            bv = _size_divisor(b, shapes, loop_sizes)
            if bv is not None:
                s = _split_floordiv(a, bv, ranges, shapes)
                if s is not None:
                    return s
                q, rest = _split_terms(a, bv)
                # (k*b*i + rest) // b == k*i + rest // b; rest at least 0, or C's and Triton's
                # division, which truncates, would read it differently from the floor
                if q != 0 and _nonnegative([rest], ranges):
                    return q + visit(FloorDiv(rest, b))
                m = _max_value(a, ranges)
                if m is not None and _lt(m, bv, shapes) and _nonnegative([a], ranges):
                    return sympy.Integer(0)
                scaled = _scale_down(a, bv, ranges, shapes)
                if scaled is not None:
                    return visit(FloorDiv(scaled[0], scaled[1]))
                split = _int_times_sum(bv)
                if split is not None:
                    # a // (k*m) == (a // m) // k for positive k and m: the sum divides first
                    inner = visit(FloorDiv(a, split[1]))
                    if not isinstance(inner, FloorDiv):
                        return visit(FloorDiv(inner, split[0]))
            return FloorDiv(sympy.expand(a), b)
        if isinstance(node, ModularIndexing):
            a, b, c = args
            bv, cv = _size_divisor(b, shapes, loop_sizes), _size_divisor(c, shapes, loop_sizes)
            if bv is not None and cv is not None:
                bc = bv * cv if isinstance(bv, int) and isinstance(cv, int) else norm(bv * cv)
                q, rest = _split_terms(a, bc)
                if q != 0 and _nonnegative([rest], ranges):  # multiples of b*c do not change (a // b) % c
                    return visit(ModularIndexing(rest, b, c))
                m = _max_value(a, ranges)
                if m is not None and _lt(m, bc, shapes) and _nonnegative([a], ranges):
                    return visit(FloorDiv(a, b))
                q = _split_floordiv(a, bv, ranges, shapes) if bv != 1 else sympy.expand(a)
                if q is not None:
                    terms = [t for t in sympy.Add.make_args(q) if _quotient(t, cv) is None]
                    q2 = sympy.Add(*terms)
                    m = _max_value(q2, ranges)
                    if _nonnegative([q2], ranges):
                        if m is not None and _lt(m, cv, shapes):
                            return q2
                        return ModularIndexing(q2, 1, c)
                scaled = _scale_down(a, bv, ranges, shapes)
                if scaled is not None:
                    return visit(ModularIndexing(scaled[0], scaled[1], c))
                split = _int_times_sum(bv)
                if split is not None:  # (a // (k*m)) % c == ((a // m) // k) % c
                    inner = visit(FloorDiv(a, split[1]))
                    if not isinstance(inner, FloorDiv):
                        return visit(ModularIndexing(inner, split[0], c))
            return ModularIndexing(sympy.expand(a), b, c)
        if isinstance(node, sympy.Add):
            summed = sympy.Add(*args)
            merged = _merge_digits(summed)
            # merged digits may fold by range (x % (its loop's range) is x): visited again,
            # at most twice down one path (a fold that splits into digits ends there)
            if merged == summed or not merged.has(FloorDiv, ModularIndexing) or depth[0] >= 2:
                return merged
            depth[0] += 1
            try:
                return visit(merged)
            finally:
                depth[0] -= 1
        return node.func(*args)

    visited = sympy.expand(visit(e))
    out = _merge_digits(visited)
    if out != visited and out.has(FloorDiv, ModularIndexing):
        # merged digits may fold by range now (the whole unflatten: x % (its range) is x)
        out = _merge_digits(sympy.expand(visit(out)))
    return out


def _digit(term: sympy.Expr) -> tuple[Size, sympy.Expr, Size, Size | None] | None:
    """`c * ModularIndexing(a, b, n)` as (c, a, b, n); FloorDiv(a, b) has n None.
    c, b and n are ints, or with size symbols, expressions over size symbols only."""
    c, rest = term.as_coeff_Mul()
    if not c.is_Integer:
        return None
    if isinstance(rest, ModularIndexing) and rest.args[1].is_Integer and rest.args[2].is_Integer:
        return int(c), rest.args[0], int(rest.args[1]), int(rest.args[2])
    if isinstance(rest, FloorDiv) and rest.args[1].is_Integer:
        return int(c), rest.args[0], int(rest.args[1]), None
    if not isinstance(rest, (sympy.Mul, FloorDiv, ModularIndexing)):
        return None
    # symbolic: one FloorDiv / ModularIndexing factor, the others sizes
    factors = sympy.Mul.make_args(rest)
    digits = [f for f in factors if isinstance(f, (FloorDiv, ModularIndexing)) and not _sizes_only(f)]
    if len(digits) != 1:
        return None
    d = digits[0]
    coeff = sympy.Mul(*[f for f in factors if f is not d])
    if not all(_sizes_only(v) for v in (coeff, *d.args[1:])):
        return None
    if isinstance(d, ModularIndexing):
        return norm(c * coeff), d.args[0], norm(d.args[1]), norm(d.args[2])
    return norm(c * coeff), d.args[0], norm(d.args[1]), None


def _sizes_only(e: sympy.Expr) -> bool:
    """An int or an expression over size symbols, nothing else (a floor division of
    sizes among them: `FloorDiv(s0, 10) - 1`, a length a conv stack makes)."""
    return e.is_Integer or (bool(e.free_symbols) and all(is_size_symbol(s) for s in e.free_symbols))


def _merge_digits(e: sympy.Expr) -> sympy.Expr:
    """Undo an unflatten: c*n*((a // (b*n)) % m) + c*((a // b) % n) is
    c*((a // b) % (n*m)); with no outer modulus it is c*(a // b); a // 1 is a.

    An expanded index can spread one digit over many terms whose coefficients sum
    to its stride (a symbolic stride that is a sum: 128 terms over four digits in a
    conv_transpose3d of an unbatched input under dynamic=True).  So the terms are
    read as digits once and each digit's coefficients summed; digits pair only with
    digits of the same `a`.  An index with nothing to merge comes back as it was."""
    if not isinstance(e, sympy.Add):
        return e
    coeffs: dict[tuple[sympy.Expr, Size, Size | None], Size] = {}
    others: list[sympy.Expr] = []
    for t in e.args:
        d = _digit(t)
        if d is None:
            others.append(t)
        else:
            key = (d[1], d[2], d[3])
            coeffs[key] = coeffs[key] + d[0] if key in coeffs else d[0]
    digits = [(c if isinstance(c, int) else norm(c), a, b, n) for (a, b, n), c in coeffs.items()]
    merged_any = False
    while True:
        found = _one_merge(digits)
        if found is None:
            break
        merged_any = True
        i, j, digit = found
        digits = [d for k, d in enumerate(digits) if k not in (i, j)] + [digit]
    if not merged_any:
        return e
    terms = [c * (FloorDiv(a, b) if n is None else ModularIndexing(a, b, n)) for c, a, b, n in digits]
    return sympy.expand(sympy.Add(*others, *terms))


def _one_merge(digits: Sequence[tuple[Size, sympy.Expr, Size, Size | None]]
               ) -> tuple[int, int, tuple[Size, sympy.Expr, Size, Size | None]] | None:
    """The first pair (i, j) of digits that merge (see _merge_digits), and the digit
    that replaces both; None when no pair does."""
    for i, (c1, a1, b1, n1) in enumerate(digits):
        for j, (c2, a2, b2, n2) in enumerate(digits):
            if i == j or n2 is None or a1 != a2:
                continue
            if _eq(b1, b2 * n2) and _eq(c1, c2 * n2):
                return i, j, (c2, a1, b2, None if n1 is None else n1 * n2)
    return None


def contiguous_strides(size: Sequence[Size]) -> tuple[Size, ...]:
    """Row-major strides; a size symbol is at least 1, so it needs no max(s, 1)."""
    strides: list[Size] = []
    acc: Size = 1
    for s in reversed(size):
        strides.append(acc)
        acc = acc * max(int(s), 1) if isinstance(s, int) or s.is_Integer else norm(acc * s)
    return tuple(norm(v) for v in reversed(strides))


def flatten(index: Sequence[sympy.Expr], size: Sequence[Size]) -> sympy.Expr:
    """Row-major flat position of a logical index."""
    return sympy.expand(sum((i * s for i, s in zip(index, contiguous_strides(size))), sympy.Integer(0)))


def unflatten(flat: sympy.Expr, size: Sequence[Size]) -> tuple[sympy.Expr, ...]:
    """Logical index for a row-major flat position (inverse of `flatten`)."""
    out: list[sympy.Expr] = []
    for s, st in zip(size, contiguous_strides(size)):
        if s == 1 or s == 0:  # size 0: no element, no position to find (and no modulo by 0)
            out.append(sympy.Integer(0))
        else:
            out.append(ModularIndexing(flat, st, s))
    return tuple(out)


def strided_offset(index: Sequence[sympy.Expr], stride: Sequence[Size], offset: Size = 0) -> sympy.Expr:
    return _strided_offset(tuple(index), tuple(stride), offset)


# every pass asks for the same few offsets (a layout's, at a node's loop symbols) again
# and again: 5474 expansions in MobileNetV2's training graphs, 1.6 s of sympy
@functools.lru_cache(maxsize=16384)
def _strided_offset(index: tuple[sympy.Expr, ...], stride: tuple[Size, ...], offset: Size) -> sympy.Expr:
    return sympy.expand(sympy.sympify(offset) + sum((i * s for i, s in zip(index, stride)), sympy.Integer(0)))


def numel(size: Sequence[Size]) -> Size:
    """The product of the sizes: an int while they are ints (the static path), else
    an expression over size symbols."""
    return product(sizes(size))


def ranges_of(symbols: Sequence[sympy.Symbol], size: Sequence[Size]) -> dict[sympy.Symbol, Size]:
    return {s: norm(n) for s, n in zip(symbols, size)}
