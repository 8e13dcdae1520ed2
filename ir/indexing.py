"""Index arithmetic over loop symbols: integer floor division and modular indexing
as sympy functions, plus the range-aware simplification that turns
`ModularIndexing(x0*128 + r0, 1, 128)` back into `r0`.

Every index expression in coil is a polynomial of loop symbols with integer
coefficients, wrapped at most in FloorDiv / ModularIndexing.  Ranges (the size of
each symbol's loop) are passed explicitly; nothing is global.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping, Sequence

import sympy

from coil.ir.shapes import Size, norm, product, sizes


class FloorDiv(sympy.Function):
    """floor(a / b) for a >= 0, b > 0 integers."""

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
            # pull out terms whose coefficient divides b exactly when the rest is 0
            terms = sympy.Add.make_args(a)
            whole = [t for t in terms if _coeff(t) % int(b) == 0]
            if whole and len(whole) == len(terms):
                return sympy.Add(*[t / b for t in whole])
        return None


class ModularIndexing(sympy.Function):
    """(a // b) % c for a >= 0 and b, c > 0 integers."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr, c: sympy.Expr) -> sympy.Expr | None:  # type: ignore[override]
        if c == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer and c.is_Integer:
            return sympy.Integer((int(a) // int(b)) % int(c))
        return None


def _coeff(term: sympy.Expr) -> int:
    c, _ = term.as_coeff_Mul()
    return int(c) if c.is_Integer else 1


def _max_value(e: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> int | None:
    """Largest value of a nonnegative index expression, or None if unknown."""
    if e.is_Integer:
        return int(e)
    if isinstance(e, sympy.Symbol):
        n = ranges.get(e)
        return None if n is None else n - 1
    if isinstance(e, sympy.Add):
        parts = [_max_value(a, ranges) for a in e.args]
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]
    if isinstance(e, sympy.Mul):
        c, rest = e.as_coeff_Mul()
        if c.is_Integer and int(c) >= 0:
            m = _max_value(rest, ranges)
            return None if m is None else int(c) * m
        return None
    if isinstance(e, FloorDiv):
        m = _max_value(e.args[0], ranges)
        return None if m is None or not e.args[1].is_Integer else m // int(e.args[1])
    if isinstance(e, ModularIndexing):
        if e.args[2].is_Integer:
            return int(e.args[2]) - 1
    return None


def _split_floordiv(a: sympy.Expr, b: int, ranges: Mapping[sympy.Symbol, int]) -> sympy.Expr | None:
    """a // b when a's terms split into multiples of b and a remainder < b."""
    terms = sympy.Add.make_args(sympy.expand(a))
    whole = [t for t in terms if _coeff(t) % b == 0]
    rest = [t for t in terms if _coeff(t) % b != 0]
    rest_max = _max_value(sympy.Add(*rest), ranges) if rest else 0
    if rest_max is not None and rest_max < b:
        return sympy.expand(sympy.Add(*[t / b for t in whole]))
    return None


def _split_terms(a: sympy.Expr, k: int) -> tuple[sympy.Expr, sympy.Expr]:
    """(terms whose integer coefficient k divides, the other terms)."""
    if k == 0:  # a zero-size loop: nothing divides by it
        return sympy.Integer(0), a
    terms = sympy.Add.make_args(sympy.expand(a))
    whole = [t for t in terms if _coeff(t) % k == 0 and not t.is_Integer or (t.is_Integer and int(t) % k == 0)]
    rest = [t for t in terms if t not in whole]
    return sympy.Add(*whole), sympy.Add(*rest)


def _scale_down(a: sympy.Expr, b: int, ranges: Mapping[sympy.Symbol, int]) -> tuple[sympy.Expr, int] | None:
    """(q, b // k) when a = k*q + r with k > 1 dividing b and 0 <= r < k: then
    a // b == q // (b // k), the remainder never carrying into the quotient
    ((64*i + j) // 512 with j < 64 is i // 8)."""
    terms = sympy.Add.make_args(sympy.expand(a))
    for k in sorted({math.gcd(b, _coeff(t)) for t in terms if not t.is_Integer}, reverse=True):
        if k <= 1:
            continue
        whole = [t for t in terms if not t.is_Integer and _coeff(t) % k == 0]
        rest = [t for t in terms if t not in whole]
        m = _max_value(sympy.Add(*rest), ranges) if rest else 0
        if whole and m is not None and m < k:
            return sympy.expand(sympy.Add(*whole) / k), b // k
    return None


def simplify_index(e: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """Range-aware simplification of FloorDiv / ModularIndexing, innermost first.
    A pure function of the expression and the ranges of its symbols, so its results
    are kept (the passes ask for the same index many times: extract_deps, fuse's
    register model and schedule_kernels each simplify every load of a kernel, and a
    channels-last graph's permuted indices cost sympy several times a plain one's)."""
    e = sympy.sympify(e)
    free = e.free_symbols
    return _simplify_index(e, frozenset((k, v) for k, v in ranges.items() if k in free))


@functools.lru_cache(maxsize=1 << 16)
def _simplify_index(e: sympy.Expr, ranges_items: frozenset[tuple[sympy.Symbol, int]]) -> sympy.Expr:
    ranges = dict(ranges_items)
    if not e.has(FloorDiv, ModularIndexing):
        return sympy.expand(e)

    def visit(node: sympy.Expr) -> sympy.Expr:
        if not node.args or not node.has(FloorDiv, ModularIndexing):
            return node
        args = [visit(a) for a in node.args]
        if isinstance(node, FloorDiv):
            a, b = args
            if b.is_Integer and int(b) > 0:
                s = _split_floordiv(a, int(b), ranges)
                if s is not None:
                    return s
                whole, rest = _split_terms(a, int(b))
                if whole != 0:  # (k*b*i + rest) // b == k*i + rest // b
                    return sympy.expand(whole / b) + visit(FloorDiv(rest, b))
                m = _max_value(a, ranges)
                if m is not None and m < int(b):
                    return sympy.Integer(0)
                scaled = _scale_down(a, int(b), ranges)
                if scaled is not None:
                    return visit(FloorDiv(scaled[0], scaled[1]))
            return FloorDiv(sympy.expand(a), b)
        if isinstance(node, ModularIndexing):
            a, b, c = args
            if b.is_Integer and c.is_Integer and int(b) > 0 and int(c) > 0:
                whole, rest = _split_terms(a, int(b) * int(c))
                if whole != 0:  # multiples of b*c do not change (a // b) % c
                    return visit(ModularIndexing(rest, b, c))
                m = _max_value(a, ranges)
                if m is not None and m < int(b) * int(c):
                    return visit(FloorDiv(a, b))
                q = _split_floordiv(a, int(b), ranges) if int(b) != 1 else sympy.expand(a)
                if q is not None:
                    terms = [t for t in sympy.Add.make_args(q) if _coeff(t) % int(c) != 0]
                    q2 = sympy.Add(*terms)
                    m = _max_value(q2, ranges)
                    if m is not None and m < int(c):
                        return q2
                    return ModularIndexing(q2, 1, c)
                scaled = _scale_down(a, int(b), ranges)
                if scaled is not None:
                    return visit(ModularIndexing(scaled[0], scaled[1], c))
            return ModularIndexing(sympy.expand(a), b, c)
        if isinstance(node, sympy.Add):
            return _merge_digits(sympy.Add(*args))
        return node.func(*args)

    return _merge_digits(sympy.expand(visit(e)))


def _digit(term: sympy.Expr) -> tuple[int, sympy.Expr, int, int | None] | None:
    """`c * ModularIndexing(a, b, n)` as (c, a, b, n); FloorDiv(a, b) has n None."""
    c, rest = term.as_coeff_Mul()
    if not c.is_Integer:
        return None
    if isinstance(rest, ModularIndexing) and rest.args[1].is_Integer and rest.args[2].is_Integer:
        return int(c), rest.args[0], int(rest.args[1]), int(rest.args[2])
    if isinstance(rest, FloorDiv) and rest.args[1].is_Integer:
        return int(c), rest.args[0], int(rest.args[1]), None
    return None


def _merge_digits(e: sympy.Expr) -> sympy.Expr:
    """Undo an unflatten: c*n*((a // (b*n)) % m) + c*((a // b) % n) is
    c*((a // b) % (n*m)); with no outer modulus it is c*(a // b); a // 1 is a."""
    if not isinstance(e, sympy.Add):
        return e
    terms = list(e.args)
    changed = True
    while changed:
        changed = False
        for i, t1 in enumerate(terms):
            d1 = _digit(t1)
            if d1 is None:
                continue
            for j, t2 in enumerate(terms):
                d2 = _digit(t2)
                if i == j or d2 is None or d2[3] is None:
                    continue
                c1, a1, b1, n1 = d1
                c2, a2, b2, n2 = d2
                assert n2 is not None
                if a1 == a2 and b1 == b2 * n2 and c1 == c2 * n2:
                    merged = FloorDiv(a1, b2) if n1 is None else ModularIndexing(a1, b2, n1 * n2)
                    terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [c2 * merged]
                    changed = True
                    break
            if changed:
                break
    return sympy.Add(*terms)


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
        if s == 1:
            out.append(sympy.Integer(0))
        else:
            out.append(ModularIndexing(flat, st, s))
    return tuple(out)


def strided_offset(index: Sequence[sympy.Expr], stride: Sequence[Size], offset: Size = 0) -> sympy.Expr:
    return sympy.expand(sympy.Integer(offset) + sum((i * s for i, s in zip(index, stride)), sympy.Integer(0)))


def numel(size: Sequence[Size]) -> Size:
    """The product of the sizes: an int while they are ints (the static path), else
    an expression over size symbols."""
    return product(sizes(size))


def ranges_of(symbols: Sequence[sympy.Symbol], size: Sequence[Size]) -> dict[sympy.Symbol, Size]:
    return {s: norm(n) for s, n in zip(symbols, size)}
