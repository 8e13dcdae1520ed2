"""Sizes that may be symbolic, and what is known about their symbols.

A size is a Python int where it is static (nearly always: static graphs never see
anything else) or a sympy expression over *size symbols* `s0, s1, ...` where the
graph came from `torch.compile(dynamic=True)` or automatic dynamic.  lower renames
the ShapeEnv's symbols (`s77`, `s27`, numbered by Dynamo's source hash) to
`s0, s1, ...` in order of first appearance over the graph's inputs, so the same
graph always prints the same, whatever Dynamo called its symbols.

`ShapeInfo` is what the ShapeEnv knew when coil got the graph, copied once in lower
and carried on every IR from LoweredGraph on: for each symbol its hint (the size of
the call being compiled) and its range (`[2, oo)` for a dim Dynamo made dynamic,
narrower with `mark_dynamic(min=, max=)`).  Passes ask it questions, never the
ShapeEnv, and so coil adds no guards:

- `known_eq/known_le/known_lt/...` are true only when the fact holds for every
  value in the ranges.  A decision that changes what the code computes (fuse or
  not, reuse a buffer or not, drop a tail mask) needs such a proof.
- `hint(e)` evaluates an expression at the hints.  A decision that only changes
  speed (block sizes, warps, fusion scores, the order of a memory plan) uses it.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Iterable, Mapping, Sequence, Union

import attrs
import sympy
from sympy.printing.str import StrPrinter

Size = Union[int, sympy.Expr]

SIZE_PREFIX = "s"
UNBACKED_PREFIX = "u"
UNBACKED_HINT = 8192
"""The hint of an unbacked symbol (clamped to its range): a size known only at run
time still needs a value for speed decisions (block sizes, scores).  Inductor's
`unbacked_symint_fallback` is the same 8192: large enough that kernels are tuned for
real work rather than for a handful of elements."""


def size_symbol(i: int) -> sympy.Symbol:
    """The i-th size symbol of a graph, as every IR spells it."""
    return sympy.Symbol(f"{SIZE_PREFIX}{i}", integer=True, positive=True)


def unbacked_symbol(i: int) -> sympy.Symbol:
    """The i-th data-dependent size of a graph (`u0, u1, ...`): the size of an
    Extern's result (nonzero, masked_select, x[mask]), known once that Extern ran.
    It may be 0 or 1, so it is only nonnegative."""
    return sympy.Symbol(f"{UNBACKED_PREFIX}{i}", integer=True, nonnegative=True)


def is_unbacked_symbol(s: sympy.Basic) -> bool:
    return (isinstance(s, sympy.Symbol) and s.name.startswith(UNBACKED_PREFIX) and s.name[1:].isdigit()
            and bool(s.is_nonnegative))


def is_size_symbol(s: sympy.Basic) -> bool:
    """A size symbol of either kind: `s0, s1, ...` (at least 2) or `u0, u1, ...`
    (data-dependent, at least 0).  Both are kernel arguments and may appear in
    bodies; only `s*` may be taken to be at least 2 (`symbol_floor`)."""
    if not isinstance(s, sympy.Symbol) or not s.name[1:].isdigit():
        return False
    if s.name.startswith(SIZE_PREFIX):
        return bool(s.is_positive)
    return s.name.startswith(UNBACKED_PREFIX) and bool(s.is_nonnegative)


def symbol_floor(s: sympy.Symbol) -> int:
    """The least value a size symbol takes without its ShapeInfo: 2 for `s*`
    (Dynamo specializes the sizes 0 and 1, and lower admits no backed symbol whose
    range starts below 2), 0 for a data-dependent `u*`."""
    return 0 if is_unbacked_symbol(s) else 2


def symbol_key(s: sympy.Symbol) -> tuple[int, int]:
    """The order of size symbols: `s*` by number, then `u*` by number."""
    return (1 if is_unbacked_symbol(s) else 0, int(s.name[1:]))


def norm(v: object) -> Size:
    """A size as coil keeps it: an int when it is a number, else the expression."""
    if isinstance(v, bool):
        raise TypeError(f"a size cannot be a bool ({v!r})")
    if isinstance(v, int):
        return v
    if isinstance(v, sympy.Expr):
        if v.is_Integer:
            return int(v)
        if v.is_number:
            raise ValueError(f"size {v} is not an integer")
        if v.has(sympy.floor, sympy.ceiling):
            return _integer_divisions(v)
        return v
    return int(v)  # type: ignore[call-overload]  # numpy ints, torch ints


def _integer_divisions(v: sympy.Expr) -> Size:
    """floor(a / b) and ceiling(a / b) of sizes (Python's `//` on sympy sizes, in a
    lowering: stft's frame count) as FloorDiv, which every printer spells (the
    wrapper printed `floor(s0/2)`, a name its Python does not define)."""
    from coil.ir.indexing import FloorDiv

    def parts(x: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr] | None:
        num, den = sympy.fraction(sympy.together(x))
        return (sympy.expand(num), den) if den.is_positive and den != 1 else None

    def floor(x: sympy.Expr) -> sympy.Expr:
        p = parts(x)
        return FloorDiv(*p) if p is not None else sympy.floor(x)

    def ceiling(x: sympy.Expr) -> sympy.Expr:
        p = parts(x)
        return FloorDiv(p[0] + p[1] - 1, p[1]) if p is not None else sympy.ceiling(x)

    out = v.replace(sympy.floor, floor).replace(sympy.ceiling, ceiling)
    return int(out) if out.is_Integer else out


def sizes(values: Iterable[object]) -> tuple[Size, ...]:
    return tuple(norm(v) for v in values)


def is_static(values: Iterable[Size]) -> bool:
    return all(isinstance(v, int) for v in values)


def free_size_symbols(values: Iterable[Size]) -> frozenset[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for v in values:
        if isinstance(v, sympy.Expr):
            out |= {s for s in v.free_symbols if is_size_symbol(s)}
    return frozenset(out)


def product(values: Sequence[Size]) -> Size:
    """The product of sizes: an int while every factor is one."""
    if is_static(values):
        return math.prod(values)  # type: ignore[arg-type]
    return norm(sympy.Mul(*values))


def lower_bound(e: Size) -> int | None:
    """A least value of `e` without its ShapeInfo: an int is itself; a polynomial
    of size symbols with nonnegative coefficients is least where every symbol is
    least: 2 for a backed `s*` (Dynamo specializes the sizes 0 and 1, and lower
    admits no such symbol whose range starts below 2), 0 for a data-dependent
    `u*` (symbol_floor); None for anything else."""
    if isinstance(e, int):
        return e
    return _lower_bound(e)


@functools.lru_cache(maxsize=4096)
def _lower_bound(e: sympy.Expr) -> int | None:
    syms = e.free_symbols
    if not all(is_size_symbol(s) for s in syms):
        return None
    if type(e).__name__ == "FloorDiv" and e.args[1].is_Integer and int(e.args[1]) > 0:
        inner = _lower_bound(e.args[0])  # nondecreasing in its numerator
        return None if inner is None else inner // int(e.args[1])
    poly = sympy.expand(e)
    if not poly.is_polynomial(*syms):
        return None
    p = sympy.Poly(poly, *sorted(syms, key=str))
    if any(not c.is_Integer or c < 0 for c in p.coeffs()):
        return None
    return int(poly.xreplace({s: sympy.Integer(symbol_floor(s)) for s in syms}))


def same_size(a: Size, b: Size) -> bool:
    """Equal for every size: ints compared, expressions equal once expanded."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def equal_at_samples(a: Size, b: Size, shapes: "ShapeInfo", count: int = 64) -> bool:
    """`a == b` at the hints and at `count` more points of the symbols' ranges
    (spread from each symbol's least value up to its greatest, at most 4096), with
    FloorDiv and ModularIndexing evaluated on ints.  Not a proof: for checks of
    what torch already checked on the graph's fake tensors (a view's element
    count, `s0 + (-s0 mod 128)` split into blocks of 128), where sympy cannot
    show the identity."""
    diff = sympy.sympify(a) - sympy.sympify(b)
    symbols = sorted(diff.free_symbols, key=str)
    facts = {f.symbol: f for f in shapes.facts}
    if any(s not in facts for s in symbols):
        return False
    points = [{s: facts[s].hint for s in symbols}]
    for k in range(count):
        point, multiple = {}, {}
        for j, s in enumerate(symbols):
            f = facts[s]
            hi = min(f.upper if f.upper is not None else 4096, max(f.lower, 4096))
            span = max(hi - f.lower, 0)
            point[s] = f.lower + (k * (2 * j + 1) * 7919) % (span + 1)
            # multiples of the hint, which keep the divisibility guards the hint passes
            multiple[s] = f.hint * (1 + (k * (2 * j + 1)) % 16)
        points.append(point)
        if all(f.upper is None or multiple[s] <= f.upper for s, f in ((s, facts[s]) for s in symbols)):
            points.append(multiple)
    # the rules among these symbols (Dynamo's guards): a point that breaks one never runs
    chosen = set(symbols)
    guards = [sympy.sympify(r.atom) - sympy.sympify(r.value) for r in shapes.rules
              if (r.atom.free_symbols | sympy.sympify(r.value).free_symbols) <= chosen]
    held = 0
    for i, point in enumerate(points):
        at = {s: sympy.Integer(x) for s, x in point.items()}
        try:
            if i and any(g.xreplace(at) != 0 for g in guards):
                continue
            v = diff.xreplace(at)
        except ZeroDivisionError:  # a size divided by a size that is 0 here: no graph runs here
            if i == 0:  # but one did at the hints
                return False
            continue
        if not (v.is_Integer and int(v) == 0):
            return False
        held += 1
    return held > min(count, 8)  # the hint and at least 8 more points the guards admit


def gt(e: Size, k: int) -> bool:
    """`e > k` proved for every size (an int compared as it is)."""
    if isinstance(e, int):
        return e > k
    lb = lower_bound(e)
    return lb is not None and lb > k


def le(e: Size, k: int) -> bool:
    """`e <= k` proved for every size: an expression of unbounded size symbols
    never is (ShapeInfo.known_le uses the ranges where they are at hand)."""
    if isinstance(e, int):
        return e <= k
    return False


@attrs.frozen(cache_hash=True)
class SymbolFacts:
    symbol: sympy.Symbol
    hint: int
    lower: int
    upper: int | None  # None: unbounded
    backed: bool = True  # False: a data-dependent (unbacked) size, known only at run time
    # True: `lower` is coil's, not the ShapeEnv's (a SymInt input it may pass negative):
    # compiled for lower..upper, a call outside runs the graph eagerly (GraphSizes.assumed_inputs)
    assumed: bool = False
    # True: a data-dependent size the graph gets as an input's size (the gradient of
    # `x[mask]` in a backward), read from that input on entry (GraphSizes.entry_symbols)
    entry: bool = False

    def show(self) -> str:
        hi = "oo" if self.upper is None else str(self.upper)
        kind = ("" if self.backed else " unbacked") + (" assumed" if self.assumed else "") + (
            " from an input" if self.entry else "")
        return f"{self.symbol} in [{self.lower}, {hi}] hint {self.hint}{kind}"


@attrs.frozen(cache_hash=True)
class SizeRule:
    """`atom = value` wherever the graph runs: an equality that Dynamo's guards
    hold (`Eq((s0//8 - 1)//2, s0//16)`, `Eq(Mod(s1, 32), 0)`), solved for its most
    complex term.  `integral`: `value` has integer coefficients, and so it may
    stand for `atom` in a size; otherwise (`s1//32 = s1/32`) it serves proofs
    only."""

    atom: sympy.Expr
    value: sympy.Expr
    integral: bool

    def show(self) -> str:
        return f"guard {self.atom} = {self.value}{'' if self.integral else ' (proofs only)'}"


@attrs.frozen(cache_hash=True)
class ShapeInfo:
    """The facts of a graph's size symbols, sorted by symbol number; empty for a
    static graph (and then it prints nothing).  `rules`: the equalities among
    sizes that Dynamo's guards hold (guard_rules), used by every proof below and
    by lower to write each size one way (`reduce`)."""

    facts: tuple[SymbolFacts, ...] = ()
    rules: tuple[SizeRule, ...] = ()

    @property
    def symbols(self) -> tuple[sympy.Symbol, ...]:
        return tuple(f.symbol for f in self.facts)

    def __bool__(self) -> bool:
        return bool(self.facts)

    def fact(self, s: sympy.Symbol) -> SymbolFacts:
        for f in self.facts:
            if f.symbol == s:
                return f
        raise KeyError(f"no facts for size symbol {s}")

    def show(self) -> list[str]:
        return [f.show() for f in self.facts] + [r.show() for r in self.rules]

    def reduce(self, e: Size, integral: bool = True) -> Size:
        """`e` with each term that a rule solves for replaced by its value (only
        the integral rules unless `integral` is False): equal to `e` wherever the
        graph runs; `e` itself (not re-expanded) where no rule applies."""
        if isinstance(e, int) or not self.rules:
            return e
        table = tuple((r.atom, r.value, r.integral) for r in self.rules if r.integral or not integral)
        out = norm(_reduce(e, table)) if table else e
        if not isinstance(out, int) and out.has(sympy.Max, sympy.Min):
            decided = norm(self.decide_extremes(out))
            if decided != out:  # the rules again, on the max's argument
                out = decided if isinstance(decided, int) else norm(_reduce(decided, table))
        loose = tuple((r.atom, r.value, r.integral) for r in self.rules if not r.integral)
        if integral and loose and not isinstance(out, int):
            # a rule for proofs only whose fraction cancels (2*((s0 + 1)//2) with the guard
            # `s0 = 2*((s0 + 1)//2)`: s0, a repeat(1, 2) of half the rows against the rows)
            whole = _reduce(out, loose)
            if whole != out and _whole_coefficients(whole):
                return norm(whole)
            # or whose fraction stays, written back as the rule's atom: s1 - s1//2 is s1/2, so
            # s1//2 (glu's halves, one sliced [:s1//2], the other [s1//2:], spelled one way)
            back = _undivided(whole, loose) if whole != out else None
            if back is not None:
                return norm(back)
        return out

    def decide_extremes(self, e: sympy.Expr, by_rules: bool = False) -> sympy.Expr:
        """`e` with each max or min one argument of which is the greatest (least)
        over the ranges replaced by that argument (not normalised): a rule may
        bring `Max(1, s1//8)` where s1 is at least 32.  `by_rules`: the arguments
        compared through the rules as well (`bounds`); `reduce`, which `bounds`
        calls, compares over the bare ranges.  torch's own Max and Min are taken
        as sympy's."""
        from torch.utils._sympy import functions as tf

        def at_least(a: sympy.Expr, b: sympy.Expr) -> bool:
            d = sympy.expand(a - b)
            lo = (self.bounds(d) if by_rules else _bounds(self, d))[0]
            return lo is not None and lo >= 0

        def pick(x: sympy.Expr) -> sympy.Expr:
            big = isinstance(x, (sympy.Max, tf.Max))
            for a in x.args:
                if all(at_least(a, b) if big else at_least(b, a) for b in x.args if b is not a):
                    return a
            return x

        return e.replace(lambda x: isinstance(x, (sympy.Max, sympy.Min, tf.Max, tf.Min)), pick)

    def at_least_one(self, symbols: Iterable[sympy.Symbol]) -> "ShapeInfo":
        """These facts, each of `symbols` at least 1: what code inside a loop over
        u0 elements knows (where u0 is 0, it never runs)."""
        facts = {f.symbol: f for f in self.facts}
        for s in symbols:
            f = facts.get(s) or SymbolFacts(s, UNBACKED_HINT, 0, None, backed=False)
            if f.lower < 1 and (f.upper is None or f.upper >= 1):
                facts[s] = attrs.evolve(f, lower=1, hint=max(f.hint, 1))
        return attrs.evolve(self, facts=tuple(sorted(facts.values(), key=lambda f: symbol_key(f.symbol))))

    # ---- evaluation at the hints (speed decisions only)
    def hint(self, e: Size) -> int:
        if isinstance(e, int):
            return e
        return _hint(self, e)

    def hints(self, values: Iterable[Size]) -> tuple[int, ...]:
        return tuple(self.hint(v) for v in values)

    # ---- facts for every size in the ranges (decisions about meaning)
    def bounds(self, e: Size) -> tuple[int | None, int | None]:
        """The least and greatest value of `e` over the ranges (None: not bounded
        or not known)."""
        if isinstance(e, int):
            return e, e
        if self.rules:
            e = self.reduce(e, integral=False)
            if isinstance(e, int):
                return e, e
        return _bounds(self, e)

    def upper(self, e: Size) -> int | None:
        return self.bounds(e)[1]

    def lower(self, e: Size) -> int | None:
        return self.bounds(e)[0]

    def known_eq(self, a: Size, b: Size) -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        d = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
        if d == 0 or (self.rules and self.reduce(d, integral=False) == 0):
            return True
        if self.rules:
            # a rule for proofs only inside integer functions too: s0//(s0//9) is 9 where
            # s0//9 = s0/9 (LongT5's blocks of a length that is a multiple of 9); a rule
            # whose atom has a coefficient on a term whose coefficient it divides
            table = tuple((r.atom, r.value, r.integral) for r in self.rules)
            if _reduce(_reduce(d, table, deep=True), table, deep=True) == 0:
                return True
        lo, hi = self.bounds(d)
        return lo == 0 and hi == 0

    def known_le(self, a: Size, b: Size) -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return a <= b
        lo, _ = self.bounds(sympy.expand(sympy.sympify(b) - sympy.sympify(a)))
        return lo is not None and lo >= 0

    def known_lt(self, a: Size, b: Size) -> bool:
        if isinstance(a, int) and isinstance(b, int):
            return a < b
        lo, _ = self.bounds(sympy.expand(sympy.sympify(b) - sympy.sympify(a)))
        return lo is not None and lo > 0

    def known_ge(self, a: Size, b: Size) -> bool:
        return self.known_le(b, a)

    def known_gt(self, a: Size, b: Size) -> bool:
        return self.known_lt(b, a)

    def known_ne(self, a: Size, b: Size) -> bool:
        return self.known_lt(a, b) or self.known_gt(a, b)

    def known_multiple(self, e: Size, k: int) -> bool:
        """Whether `e` is a multiple of the int `k` for every value of its symbols."""
        if isinstance(e, int):
            return e % k == 0
        if k == 1:
            return True
        poly = sympy.expand(e)
        if poly.is_polynomial(*poly.free_symbols) and all(
                c.is_Integer and int(c) % k == 0
                for c in sympy.Poly(poly, *sorted(poly.free_symbols, key=str)).coeffs()):
            return True
        from coil.ir.indexing import ModularIndexing  # a divisibility Dynamo's guards hold

        return bool(self.rules) and self.known_eq(ModularIndexing(e, 1, k), 0)


EMPTY = ShapeInfo()


def _terms(e: sympy.Expr) -> dict[sympy.Expr, sympy.Rational]:
    """An expanded expression as {monomial: coefficient} (the constant under 1)."""
    out: dict[sympy.Expr, sympy.Rational] = {}
    for t in sympy.Add.make_args(sympy.expand(e)):
        c, m = t.as_coeff_Mul()
        out[m] = out.get(m, sympy.Integer(0)) + c
    return {m: c for m, c in out.items() if c != 0}


def _from_terms(terms: Mapping[sympy.Expr, sympy.Expr]) -> sympy.Expr:
    return sympy.Add(*(c * m for m, c in terms.items()))


def _pivotable(m: sympy.Expr) -> bool:
    """A term a rule may solve for: one with an integer function in it (a floor
    division, a modulo, a max or min).  Never a symbol or a product of symbols:
    the wrapper binds those from the inputs."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    return m != 1 and m.has(FloorDiv, ModularIndexing, sympy.Max, sympy.Min)


@functools.total_ordering
class _PivotKey:
    """The order terms are solved for: the most complex first, a floor division
    before a modulo of the same weight (so a modulo's identity alone, `a mod k =
    a - k*(a//k)`, gives only a rule for proofs, `a//k = (a - a mod k)/k`, and
    sizes keep their modulos), then by the printed term.  The term is printed
    only where the rest ties (printing one of Swin's nested paddings takes a
    millisecond)."""

    __slots__ = ("head", "term", "_text")

    def __init__(self, term: sympy.Expr) -> None:
        from coil.ir.indexing import ModularIndexing

        self.head = (0 if _pivotable(term) else 1, -sympy.count_ops(term), 1 if term.has(ModularIndexing) else 0)
        self.term = term
        self._text: str | None = None

    def text(self) -> str:
        if self._text is None:
            self._text = str(self.term)
        return self._text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PivotKey) and self.head == other.head and self.text() == other.text()

    def __lt__(self, other: "_PivotKey") -> bool:
        return self.head < other.head or (self.head == other.head and self.text() < other.text())

    __hash__ = None  # type: ignore[assignment]


_pivot_key = functools.lru_cache(maxsize=4096)(_PivotKey)


def guard_rules(equalities: Iterable[sympy.Expr],
                shapes: ShapeInfo) -> tuple[tuple[SizeRule, ...], dict[sympy.Symbol, Size]]:
    """The rules of equalities `e == 0` among sizes (each true wherever the graph
    runs: Dynamo's guards), by Gauss-Jordan elimination over their terms, each
    term (`(s0//8 - 1)//2`, `s0*(s1//2)`) an unknown: each rule solves for the
    most complex term left, a term with an integer function in it, in terms of
    simpler ones.  An equality left among plain symbols solves for a symbol
    instead, returned apart as {symbol: value} (`symbol_solutions`): one that pins
    a symbol to a value (`s0 - 24 = 0`), or a linear one (`u0 + u1 + u2 + 18 =
    64`, which Dynamo left unreplaced) for its last symbol with a unit
    coefficient.  Each modulo `a mod k` met brings its identity `a mod k = a -
    k*(a//k)` along, so `a mod k = 0` also gives `a//k = a/k`.  Every rule and
    solution is checked at the hints; none is returned if one fails there."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    rows: list[dict[sympy.Expr, sympy.Rational]] = []
    seen: set[sympy.Expr] = set()
    given = [sympy.sympify(e) for e in equalities]
    for e in [*given, *filter(None, map(_zero_residue, given))]:
        for mod in e.atoms(ModularIndexing):
            a, b, k = mod.args
            if b == 1 and mod not in seen:
                seen.add(mod)
                rows.append(_terms(mod - a + k * FloorDiv(a, k)))
        rows.append(_terms(e))
    solved: dict[sympy.Expr, dict[sympy.Expr, sympy.Rational]] = {}  # pivot -> the rest of its row (pivot = -rest)
    leftovers: list[dict[sympy.Expr, sympy.Rational]] = []  # rows over plain symbols only
    for row in rows:
        row = _eliminate(row, solved)  # reduce by the rules so far
        if not row:
            continue
        pivot = min(row, key=_pivot_key)
        if not _pivotable(pivot):
            leftovers.append(row)
            continue
        c = row.pop(pivot)
        rest = {m: v / c for m, v in row.items()}
        for q, other in solved.items():  # keep the rules reduced: no rule's value holds a pivot
            solved[q] = _eliminate(other, {pivot: rest})
        solved[pivot] = rest
    rules = []
    for p in sorted(solved, key=_pivot_key):
        value = -_from_terms(solved[p])
        integral = all(c.is_Integer for c in solved[p].values())
        rules.append(SizeRule(p, norm(value) if integral else value, integral))
    leftovers = [_eliminate(row, solved) for row in leftovers]
    products = [_product_rule(row) for row in leftovers]
    rules = _canonical(rules + list(dict.fromkeys(r for r in products if r is not None)))  # a guard met twice: once
    for _ in range(3):  # a multiple found may show another rule's value a multiple too
        divisors = _divisor_rules(rules)
        if not divisors:
            break
        rules = _canonical(rules + divisors)
    solutions = symbol_solutions([row for row, r in zip(leftovers, products) if r is None])
    try:
        if any(shapes.hint(r.atom) != shapes.hint(r.value) for r in rules if r.integral) or \
                any(shapes.hint(s) != shapes.hint(v) for s, v in solutions.items()):
            return (), {}
    except (KeyError, ValueError, TypeError):
        return (), {}
    return tuple(rules), solutions


def _zero_residue(e: sympy.Expr) -> sympy.Expr | None:
    """An equality `c*(x mod k) = 0` with x reduced modulo k, or None where that
    changes nothing: multiples of k dropped, the sign turned, `y mod k2` of a k2
    that k divides taken as y.  `Mod(4 - Mod(s0//2, 4), 4) = 0` (Swin's "the
    height needs no padding to a multiple of the window") is `Mod(s0//2, 4) = 0`,
    which the rules then take apart as `s0//2 = 4*(s0//8)`."""
    from coil.ir.indexing import ModularIndexing

    c, m = sympy.expand(e).as_coeff_Mul()
    if c == 0 or not isinstance(m, ModularIndexing) or m.args[1] != 1 or not m.args[2].is_Integer:
        return None
    x, k = m.args[0], int(m.args[2])
    for _ in range(4):
        terms = [t for t in sympy.Add.make_args(sympy.expand(x))
                 if not (t.as_coeff_Mul()[0].is_Integer and int(t.as_coeff_Mul()[0]) % k == 0)]
        if not terms:
            return None
        x = sympy.Add(*terms)
        if all(t.as_coeff_Mul()[0] < 0 for t in terms):
            x = -x
        if isinstance(x, ModularIndexing) and x.args[1] == 1 and x.args[2].is_Integer and int(x.args[2]) % k == 0:
            x = x.args[0]
            continue
        break
    if not all(t.as_coeff_Mul()[0] > 0 for t in sympy.Add.make_args(x)):
        return None  # a residue of a value that may be negative: left as Dynamo wrote it
    out = ModularIndexing(x, 1, k)
    return None if out == m else out


def _divisor_rules(rules: Sequence[SizeRule]) -> list[SizeRule]:
    """For rules that a size x is a multiple of k (`s1//8 = s1/8`, from guards that
    s1 is even and s1//2 a multiple of 4), x is a multiple of their lcm L, and
    each floor division of x by a divisor d of L is (L/d)*(x//L): `s1//4 =
    2*(s1//8)`, `s1//2 = 4*(s1//8)`, so that sizes divided by any of them are
    written over one atom (Swin's merged patches count 64*(s0//4)*(s1//4)
    elements, its windows 256*(s0//8)*(s1//8)).  Rules the rules already give
    for sizes are left out."""
    from coil.ir.indexing import FloorDiv

    integral = {r.atom for r in rules if r.integral}
    atoms = {r.atom for r in rules}
    loose = tuple((r.atom, r.value, r.integral) for r in rules if not r.integral)
    multiples: dict[sympy.Expr, int] = {}
    for r in rules:
        c, atom = r.atom.as_coeff_Mul()
        if not (isinstance(atom, FloorDiv) and atom.args[1].is_Integer and c.is_Integer):
            continue
        x, k = atom.args[0], int(atom.args[1])
        # the value over the other rules' terms: s0//16 = (s0//8)/2 where s0//8 = s0/8
        if sympy.expand(r.value - c * x / k) == 0 or sympy.expand(_reduce(sympy.sympify(r.value), loose) - c * x / k) == 0:
            multiples[x] = math.lcm(multiples.get(x, 1), k)
    out: list[SizeRule] = []
    for x, lcm in multiples.items():
        top = FloorDiv(x, lcm)
        if not isinstance(top, FloorDiv):
            continue
        if top not in atoms:
            out.append(SizeRule(top, x / lcm, False))
        for d in range(2, lcm):
            atom = FloorDiv(x, d)
            if lcm % d == 0 and isinstance(atom, FloorDiv) and atom not in integral:
                out.append(SizeRule(atom, norm((lcm // d) * top), True))
    return out


def _product_rule(row: Mapping[sympy.Expr, sympy.Rational]) -> SizeRule | None:
    """The rule of an equality of a product of plain symbols and a whole multiple of
    another product or symbol (`s0*s1 = s2*s3`: logits flattened to (B*S, V)
    against labels of their own batch and length flattened to B'*S', which
    cross_entropy's check makes equal; `7*s0 = s1*s2` where the model fixed S at
    7; `4*s0 = 4*u0*u1`, rows of 4 reshaped by int arguments): the product is
    written as the other side, the later of two products where both are (each
    symbol stays bound from its input; a size that is the product takes the other
    spelling)."""
    if len(row) != 2:
        return None

    def product(m: sympy.Expr) -> bool:
        return isinstance(m, sympy.Mul) and all(f.is_Symbol for f in m.args)

    (a, ca), (b, cb) = row.items()
    if not all(product(m) or m.is_Symbol for m in (a, b)):
        return None
    options = []
    for (m, c), (other, co) in (((a, ca), (b, cb)), ((b, cb), (a, ca))):
        k = -co / c
        if product(m) and k.is_Integer and k > 0:  # `4*s0 = 4*u0*u1` too: a common factor
            options.append((sorted((symbol_key(f) for f in m.args), reverse=True), m, k * other))
    if not options:
        return None
    _, atom, value = max(options, key=lambda o: o[0])
    return SizeRule(atom, norm(value), True)


def symbol_solutions(rows: Iterable[Mapping[sympy.Expr, sympy.Rational]]) -> dict[sympy.Symbol, Size]:
    """Solutions of linear equalities among plain symbols (rows of {term:
    coefficient} that are 0): a row with one symbol left pins it (`2*s0 - 48`:
    s0 = 24, where the value is whole); a row with several solves for its last
    symbol (coil's order: `u*` after `s*`, the weaker facts) whose coefficient is
    1 or -1, so the value is a size with integer coefficients.  Each solution is
    substituted into the other rows and the solutions so far, and the rows are
    walked again until none solves more; a row with a product of symbols or no
    unit coefficient gives none."""
    out: dict[sympy.Symbol, Size] = {}
    pending = [dict(r) for r in rows]
    progress = True
    while progress:  # a row solved later may make an earlier one solvable (2*s0 + 2*s1 = 8, s1 = s0)
        progress, left = False, []
        for row in pending:
            row = _eliminate(row, {s: _terms(-v) for s, v in out.items()})
            solved = _solve_row(row)
            if solved is None:
                if row:
                    left.append(row)
                continue
            s, value = solved
            out = {k: norm(sympy.sympify(v).xreplace({s: value})) for k, v in out.items()}
            out[s] = value
            progress = True
        pending = left
    return out


def _solve_row(row: dict[sympy.Expr, sympy.Rational]) -> tuple[sympy.Symbol, Size] | None:
    """symbol_solutions' solution of one row (its terms, a linear form that is 0),
    or None."""
    syms = [m for m in row if m != 1]
    if not syms or not all(m.is_Symbol for m in syms):
        return None
    if len(syms) == 1:
        v = -row.get(sympy.Integer(1), 0) / row[syms[0]]
        return (syms[0], int(v)) if v.is_Integer else None
    units = [m for m in syms if abs(row[m]) == 1]
    if not units:
        return None
    s = max(units, key=symbol_key)
    rest = {m: c for m, c in row.items() if m != s}
    return s, norm(-_from_terms(rest) / row[s])


def _eliminate(row: Mapping[sympy.Expr, sympy.Rational],
               solved: Mapping[sympy.Expr, Mapping[sympy.Expr, sympy.Rational]]) -> dict[sympy.Expr, sympy.Rational]:
    """`row` (terms of an expression that is 0) with each solved term `p = -rest`
    substituted, in `solved`'s order; zero coefficients dropped."""
    out = dict(row)
    for p, rest in solved.items():
        if p in out:
            c = out.pop(p)
            for m, v in rest.items():
                out[m] = out.get(m, sympy.Integer(0)) - c * v
    return {m: v for m, v in out.items() if v != 0}


def _canonical(rules: list[SizeRule]) -> list[SizeRule]:
    """The rules with each atom and value written as `reduce` writes sizes: the
    integral rules applied inside every atom and value (`(s0 + (256 - s0 mod 256)
    mod 256) // 256` where another rule rewrites `s0 mod 256`), so that a size
    reduced from the inside out still meets its rule.  A rule whose atom and value
    the others make equal says nothing they do not, and is left out (one at a
    time, so that of two copies one stays): Swin's guards at a second image size
    repeat its padding test inside a hundred larger sizes, `(2*(s0//8) + (4 -
    2*(s0//8) mod 4) mod 4)//4`, each a rule that `(4 - 2*(s0//8) mod 4) mod 4 =
    0` already gives, and every size reduced walked them all."""
    for _ in range(4):
        changed = False
        i = 0
        while i < len(rules):
            r = rules[i]
            others = tuple((o.atom, o.value, True) for j, o in enumerate(rules) if j != i and o.integral)
            if not others:
                i += 1
                continue
            atom = _reduce(r.atom, others)
            value = _reduce(r.value, others) if isinstance(r.value, sympy.Expr) else r.value
            if (atom, value) != (r.atom, r.value):
                if sympy.expand(atom - value) == 0:
                    del rules[i]
                    changed = True
                    continue
                if _pivotable(atom):
                    rules[i] = SizeRule(atom, norm(value) if r.integral else value, r.integral)
                    changed = True
            i += 1
        if not changed:
            break
    return rules


@functools.lru_cache(maxsize=8192)
def _reduce(e: sympy.Expr, table: tuple[tuple[sympy.Expr, sympy.Expr, bool], ...], deep: bool = False
            ) -> sympy.Expr:
    """`e` with the terms of `table` (atom, value, integral) replaced: an integral
    rule's atom inside integer functions too (with `deep`, any rule's: for proofs,
    where a fraction the functions then divide out may stand inside), any rule's as
    a term of `e` (with `deep`, also where the rule's coefficient divides the
    term's); `e` itself where nothing changes."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    funcs = (FloorDiv, ModularIndexing, sympy.Max, sympy.Min)
    if not e.has(*funcs) and all(a.has(*funcs) for a, _, _ in table):  # no product rule (_product_rule)
        return e
    whole = {a: v for a, v, whole_ in table if (whole_ or deep) and isinstance(a, funcs)}  # anywhere

    def walk(x: sympy.Expr) -> sympy.Expr:
        if x.is_Atom or not x.has(*funcs):
            return x
        args = tuple(walk(a) for a in x.args)
        y = x.func(*args) if args != x.args else x
        if deep and isinstance(y, FloorDiv) and args != x.args:  # s0 // (s0/9): a whole quotient is itself
            q = sympy.cancel(y.args[0] / y.args[1])
            if _whole_polynomial(q):
                return q
        return whole.get(y, y)

    out = walk(e)
    # then as factors of `e`'s terms: a product's rule (s2*(s0//s2) = s0) and a rule for
    # proofs only (s0//2 = s0/2), not inside functions, where a fraction is no size
    factors = [(a, v, _bases(a)) for a, v, _ in table if a not in whole]
    for _ in range(8):
        terms, changed = _terms(out), False
        for m in list(terms):
            have = None
            for a, v, need in factors:
                # a factor of the atom that the term lacks stays in the quotient's denominator:
                # no division needed to see it fail (most pairs; each division costs ~0.1 ms)
                have = have if have is not None else _bases(m)
                if not need <= have:
                    continue
                q = m / a
                num, den = sympy.fraction(q)
                # with `deep`, a rule whose atom has a coefficient (9*(s0//9) = s0) takes a term
                # whose own coefficient it divides (72*(s0//9))
                whole_ = den == 1 or (deep and den.is_Integer and (terms[m] / den).is_Integer)
                if whole_ and num.is_polynomial() and not (q.free_symbols - m.free_symbols):
                    c = terms.pop(m)
                    out_terms = _terms(c * q * v)
                    for m2, c2 in out_terms.items():
                        terms[m2] = terms.get(m2, sympy.Integer(0)) + c2
                    changed = True
                    break
        if not changed:
            break
        out = _from_terms({m: c for m, c in terms.items() if c != 0})
    return e if out == e else sympy.expand(out)


def _bases(m: sympy.Expr) -> frozenset[sympy.Expr]:
    """The bases a monomial holds with a positive power (`s2*(s0//s2)**2`: s2 and
    s0//s2), numbers left out."""
    return frozenset(b for b, e in m.as_powers_dict().items() if not b.is_number and e.is_positive)


def _whole_polynomial(q: sympy.Expr) -> bool:
    """Whether `q` is a polynomial in its symbols with integer coefficients (an
    integer wherever its symbols are)."""
    if q.is_Integer:
        return True
    syms = tuple(q.free_symbols)
    return bool(syms) and q.is_polynomial(*syms) and all(c.is_Integer for c in sympy.Poly(q, *syms).coeffs())


def _undivided(e: sympy.Expr, loose: tuple[tuple[sympy.Expr, sympy.Expr, bool], ...]) -> sympy.Expr | None:
    """`e`, with each rule-for-proofs-only's value (s1/2) in it written as its atom
    (s1//2), where that leaves no fraction; else None."""
    x = sympy.expand(e)
    for atom, value, _ in loose:
        x = x.subs(value, atom)
    return x if _whole_coefficients(x) else None


def _whole_coefficients(e: sympy.Expr) -> bool:
    """No fraction and no float anywhere in `e` (a size may take it)."""
    x = sympy.expand(e)
    return not x.atoms(sympy.Float) and all(r.q == 1 for r in x.atoms(sympy.Rational))


def _to_torch(e: sympy.Expr) -> sympy.Expr:
    """coil's FloorDiv/ModularIndexing as torch's, which torch's value-range
    analysis knows."""
    from torch.utils._sympy import functions as tf

    from coil.ir.indexing import FloorDiv, ModularIndexing

    if not e.has(FloorDiv, ModularIndexing):
        return e
    return e.replace(FloorDiv, lambda a, b: tf.FloorDiv(a, b)).replace(
        ModularIndexing, lambda a, b, c: tf.ModularIndexing(a, b, c))


@functools.lru_cache(maxsize=8192)
def _hint(info: ShapeInfo, e: sympy.Expr) -> int:
    values = {f.symbol: f.hint for f in info.facts}
    missing = [s for s in e.free_symbols if s not in values]
    if missing:
        raise KeyError(f"no hint for {sorted(map(str, missing))} in {e}")
    v = _to_torch(e).xreplace({s: sympy.Integer(n) for s, n in values.items()})
    if not v.is_number:
        raise ValueError(f"{e} does not evaluate to a number at the hints")
    return int(v)


@functools.lru_cache(maxsize=8192)
def _bounds(info: ShapeInfo, e: sympy.Expr) -> tuple[int | None, int | None]:
    """Interval bounds of `e` over the symbols' ranges; where `e` holds floor
    divisions or modulos by numbers, the tighter of those and the bounds of `e`
    with each `a // k` written `(a - r) / k` and `a mod k` as r, r in [0, k - 1]:
    that keeps `s0 - s0 // 2` (the second half of a row) at least 1, which
    intervals alone lose (s0 and s0 // 2 vary together)."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    lo, hi = _interval(info, e, {})
    if e.has(FloorDiv, ModularIndexing):
        rewritten, remainders = _with_remainders(e)
        if remainders:
            lo2, hi2 = _interval(info, rewritten, remainders)
            lo = lo2 if lo is None else lo if lo2 is None else max(lo, lo2)
            hi = hi2 if hi is None else hi if hi2 is None else min(hi, hi2)
    return lo, hi


def _with_remainders(e: sympy.Expr) -> tuple[sympy.Expr, dict[sympy.Symbol, int]]:
    """`e` with each floor division by a positive number `a // k` written as
    `(a - r) / k` and each `a mod k` (ModularIndexing(a, 1, k)) as the same r, a
    fresh integer symbol of range [0, k - 1] (returned with its k - 1); any other
    modulo `(a // b) mod k` by a number k is a fresh r of that range alone."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    remainders: dict[tuple[sympy.Expr, int], sympy.Symbol] = {}
    top: dict[sympy.Symbol, int] = {}

    def fresh(k: int) -> sympy.Symbol:
        r = sympy.Symbol(f"_rem{len(top)}", integer=True, nonnegative=True)
        top[r] = k - 1
        return r

    def remainder(a: sympy.Expr, k: int) -> sympy.Symbol:
        if (a, k) not in remainders:
            remainders[a, k] = fresh(k)
        return remainders[a, k]

    def rewrite(x: sympy.Expr) -> sympy.Expr:
        if x.is_Atom:
            return x
        args = tuple(rewrite(a) for a in x.args)
        if isinstance(x, FloorDiv) and args[1].is_Integer and int(args[1]) > 0:
            k = int(args[1])
            return (args[0] - remainder(args[0], k)) / k
        if isinstance(x, ModularIndexing) and args[2].is_Integer and int(args[2]) > 0:
            k = int(args[2])
            return remainder(args[0], k) if args[1] == 1 else fresh(k)
        return x.func(*args) if args != x.args else x

    out = rewrite(e)
    return sympy.expand(out), top


def quiet_bound_sympy(e: sympy.Expr, ranges: Mapping[sympy.Symbol, Any]) -> Any:
    """torch's bound_sympy without its log line for each function it cannot bound
    (a floor division by a fraction, s0 // (s0/9)): the caller takes "not known"
    for an answer, and the warning would reach the user's console."""
    from torch.utils._sympy.value_ranges import bound_sympy

    log = logging.getLogger("torch.utils._sympy.interp")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return bound_sympy(e, dict(ranges))
    finally:
        log.setLevel(level)


def _interval(info: ShapeInfo, e: sympy.Expr, extra: Mapping[sympy.Symbol, int]) -> tuple[int | None, int | None]:
    """torch's interval analysis of `e` over the facts' ranges and `extra`'s
    symbols (each in [0, its value]); a rational bound rounded inward (the value
    is an integer)."""
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    ranges: dict[sympy.Symbol, ValueRanges] = {}
    for f in info.facts:
        ranges[f.symbol] = ValueRanges(f.lower, f.upper if f.upper is not None else int_oo)
    for r, top in extra.items():
        ranges[r] = ValueRanges(0, top)
    try:
        r = quiet_bound_sympy(_to_torch(e), ranges)
    except Exception:  # an expression torch's analysis does not know: nothing is known
        return None, None

    def finite(v: object, up: bool) -> int | None:
        if isinstance(v, sympy.Integer):  # torch's int_oo is no Integer
            return int(v)
        if isinstance(v, sympy.Rational):
            return math.floor(v) if up else math.ceil(v)
        if isinstance(v, int):
            return v
        return None

    return finite(r.lower, False), finite(r.upper, True)


class _PySizePrinter(StrPrinter):
    """Python source for a size expression: what the wrapper evaluates once a call."""

    def _operand(self, e: sympy.Expr) -> str:
        """Each side of // and % whole: they bind as tightly as * (s0 // (2*s1))."""
        text = self._print(e)
        return text if e.is_Integer or e.is_Symbol or type(e).__name__ in ("FloorDiv", "ModularIndexing") \
            else f"({text})"

    def _print_FloorDiv(self, e: sympy.Expr) -> str:
        a, b = e.args
        return f"({self._operand(a)} // {self._operand(b)})"

    def _print_ModularIndexing(self, e: sympy.Expr) -> str:
        a, b, c = e.args
        return f"(({self._operand(a)} // {self._operand(b)}) % {self._operand(c)})"

    def _print_CeilDiv(self, e: sympy.Expr) -> str:
        a, b = e.args
        return f"(-(-{self._operand(a)} // {self._operand(b)}))"

    def _print_Max(self, e: sympy.Expr) -> str:
        return f"max({', '.join(self._print(a) for a in e.args)})"

    def _print_Min(self, e: sympy.Expr) -> str:
        return f"min({', '.join(self._print(a) for a in e.args)})"

    def _print_Pow(self, e: sympy.Expr, rational: bool = False) -> str:
        base, exp = e.args
        if exp.is_Integer and int(exp) > 0:
            return f"({self._operand(base)} ** {int(exp)})"
        raise ValueError(f"size expression {e} has a non-integer power")


def py_size(e: Size) -> str:
    """A size as Python source: an int literal, or an expression over size symbols.
    A size with fractions (a view's -1 over symbolic sizes: `s0*s1*s4/3072`, whole
    for every size Dynamo's guards admit) is its numerator floor-divided by the
    common denominator, so Python computes an int, as C's `/` does."""
    if isinstance(e, int):
        return str(e)
    if any(isinstance(a, sympy.Rational) and not a.is_Integer for a in e.atoms(sympy.Rational)):
        num, den = sympy.fraction(sympy.together(e))
        if den.is_Integer and num.is_polynomial():
            return f"(({_PySizePrinter().doprint(sympy.expand(num))}) // {int(den)})"
    return _PySizePrinter().doprint(e)


def rename(e: Size, mapping: Mapping[sympy.Symbol, sympy.Expr]) -> Size:
    if isinstance(e, int):
        return e
    return norm(e.xreplace(dict(mapping)))


@attrs.frozen(cache_hash=True)
class GraphSizes:
    """A graph's symbolic sizes at its boundary, carried from LoweredGraph to the
    wrapper: the facts of its symbols, its SymInt inputs and outputs, and the order
    `call` takes its arguments in.  Empty for a static graph (and then nothing
    prints and nothing changes)."""

    shapes: ShapeInfo = EMPTY
    inputs: tuple[tuple[str, Size], ...] = ()  # SymInt placeholders: name, the size it holds
    order: tuple[str, ...] = ()  # every placeholder, in call order (set only where SymInts come in)
    outputs: tuple[tuple[int, Size], ...] = ()  # SymInt outputs: position among the outputs, value
    # SymInt inputs compiled for their one value at the first call, an assumption (a
    # negative int: coil's symbols are at least 0): name, value; another value runs eagerly
    fixed: tuple[tuple[str, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.shapes or self.inputs or self.outputs)

    def entry_symbols(self) -> tuple[sympy.Symbol, ...]:
        """The symbols `call` knows on entry, in the order of their facts: every
        backed symbol, each data-dependent one that a SymInt input is (a scalar
        Dynamo may pass as 0 or 1: a cache's length), and each that an input's size
        is (SymbolFacts.entry).  The others are bound after the Extern whose result
        they size."""
        given = {v for _, v in self.inputs if isinstance(v, sympy.Symbol)}
        return tuple(f.symbol for f in self.shapes.facts if f.backed or f.entry or f.symbol in given)

    def assumed_inputs(self) -> tuple[tuple[str, int, int | None], ...]:
        """The SymInt inputs whose range coil assumed (SymbolFacts.assumed, and
        `fixed`): name, least and greatest value compiled for.  A call passing another value runs
        the graph eagerly (backends/dynamo.py) rather than compiled."""
        out: list[tuple[str, int, int | None]] = [(name, v, v) for name, v in self.fixed]
        for name, v in self.inputs:
            if isinstance(v, sympy.Symbol) and v in self.shapes.symbols and (f := self.shapes.fact(v)).assumed:
                out.append((name, f.lower, f.upper))
        return tuple(out)

    def output(self, i: int) -> Size | None:
        for k, v in self.outputs:
            if k == i:
                return v
        return None

    def show(self) -> list[str]:
        lines = [f"size {f}" for f in self.shapes.show()]
        fixed = dict(self.fixed)
        lines += [f"size input {n} = {v}{' assumed' if n in fixed else ''}" for n, v in self.inputs]
        lines += [f"size output {k} = {v}" for k, v in self.outputs]
        return lines


NO_SIZES = GraphSizes()
