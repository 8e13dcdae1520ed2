"""Value ranges of integer bodies, and the run-time checks they make unnecessary.

`value_range(expr, ranges)` gives an interval [lo, hi] that holds every value an
integer (or bool) expression takes while each loop symbol s runs over
[0, ranges[s]); None for floating values.  It is interval arithmetic, sound and
simple: a load from memory can hold anything its dtype can (an index loaded from
a tensor is unknown), an arange is its loop symbol's range, a clamp is its
bounds, a `where` the hull of its branches, and any result that might overflow
its dtype is the whole dtype.

`prove_checks(body, ranges)` sets each Check's `status` from that analysis:
"proven" when the argument's range cannot fail the test (an index within
[0, size), or [-size, size) when negatives wrap; a divisor range without 0),
else "checked"; and records the range found as the reason.  realize runs it on
every buffer's body once producers are inlined, so an index computed from an
arange or clamped in the same kernel loses its test.

`load_in_bounds(load, size, ranges)` proves a load's index inside its tensor;
a masked load only where its mask holds (`mask_ranges` narrows the loop
symbols by the mask's comparisons of a symbol with a constant, and by nothing
else it cannot read soundly).

Symbolic sizes: a loop's size may be an expression over size symbols (`s1`), and
`shapes` (a ShapeInfo) says what is known of them.  A range's ends are then sizes
too: `r0` over a loop of `s1` is [0, s1 - 1], and a check of it against a dim of
`s1` is proven (s1 - 1 < s1 for every s1).  Sums, products of nonnegative ranges,
max / min and where stay symbolic; the other operations take the ends' numeric
bounds over the ranges of the size symbols (a size is an int64: never above
2**63 - 1), and where one is unbounded the result is unknown (the whole dtype).
Every decision about a symbolic range is a `shapes.known_*` proof, true for every
size; a static graph's ranges are ints and take exactly the int code.
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence, cast

import sympy
import torch

from coil.ir.expr import (Cast, Check, Constant, Expr, IndexExpr, IndirectLoad, Load, Op, evaluate, indsym, rewrite,
                          substitute_symbols, walk)
from coil.ir.indexing import FloorDiv, ModularIndexing
from coil.ir.shapes import EMPTY, ShapeInfo, Size, _to_torch, is_size_symbol, is_unbacked_symbol, norm, quiet_bound_sympy

IntRange = tuple[int, int]
Range = tuple[Size, Size]  # ints on a static graph; ends may be size expressions
INT64_MAX = 2**63 - 1


def dtype_range(dt: torch.dtype) -> IntRange | None:
    """Every value of an integer or bool dtype; None for the others."""
    if dt == torch.bool:
        return (0, 1)
    if dt.is_floating_point or dt.is_complex:
        return None
    info = torch.iinfo(dt)
    return (int(info.min), int(info.max))


# ---- symbolic ends: what is known of them for every size

def _static(r: Range) -> bool:
    return isinstance(r[0], int) and isinstance(r[1], int)


@functools.lru_cache(maxsize=8192)
def _int64_bounds(shapes: ShapeInfo, e: sympy.Expr) -> tuple[int | None, int | None]:
    """The least and greatest value of a size expression for every size in the
    ranges, each size symbol at most 2**63 - 1 (a size is an int64, whatever its
    range says); None where not bounded or not known (an unknown symbol)."""
    from torch.utils._sympy.value_ranges import ValueRanges

    facts = {f.symbol: f for f in shapes.facts}
    vr: dict[sympy.Symbol, ValueRanges] = {}
    for s in e.free_symbols:
        f = facts.get(s)
        if f is not None:
            vr[s] = ValueRanges(f.lower, min(f.upper, INT64_MAX) if f.upper is not None else INT64_MAX)
        elif is_size_symbol(s):  # a data-dependent u* may be 0
            vr[s] = ValueRanges(0 if is_unbacked_symbol(s) else 1, INT64_MAX)
        else:
            return None, None
    try:
        r = quiet_bound_sympy(_to_torch(e), vr)
    except Exception:  # an expression torch's analysis does not know: nothing is known
        return None, None
    lo, hi = r.lower, r.upper
    return (int(lo) if isinstance(lo, (int, sympy.Integer)) else None,
            int(hi) if isinstance(hi, (int, sympy.Integer)) else None)


def _lower(v: Size, shapes: ShapeInfo) -> int | None:
    return v if isinstance(v, int) else _int64_bounds(shapes, v)[0]


def _upper(v: Size, shapes: ShapeInfo) -> int | None:
    return v if isinstance(v, int) else _int64_bounds(shapes, v)[1]


def _numeric(r: Range, shapes: ShapeInfo) -> IntRange | None:
    """An int range holding `r` for every size (None: an end is unbounded)."""
    if _static(r):
        return cast(IntRange, r)
    lo, hi = _lower(r[0], shapes), _upper(r[1], shapes)
    return None if lo is None or hi is None else (lo, hi)


def _le(a: Size, b: Size, shapes: ShapeInfo) -> bool:
    """a <= b for every size (the int comparison when static)."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return _known(a, b, shapes, strict=False)


def _lt(a: Size, b: Size, shapes: ShapeInfo) -> bool:
    """a < b for every size (the int comparison when static)."""
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return _known(a, b, shapes, strict=True)


def _known(a: Size, b: Size, shapes: ShapeInfo, strict: bool) -> bool:
    """a < b (a <= b) for every size, a Max or Min of ends taken apart first:
    value-range analysis of `b - Max(...)` forgets that the Max's arguments move
    with b."""
    if isinstance(a, sympy.Max):
        return all(_known(v, b, shapes, strict) for v in a.args)
    if isinstance(b, sympy.Min):
        return all(_known(a, v, shapes, strict) for v in b.args)
    if isinstance(a, sympy.Min) and any(_known(v, b, shapes, strict) for v in a.args):
        return True
    if isinstance(b, sympy.Max) and any(_known(a, v, shapes, strict) for v in b.args):
        return True
    return shapes.known_lt(a, b) if strict else shapes.known_le(a, b)


def _extreme(vals: Sequence[Size], shapes: ShapeInfo, largest: bool) -> Size:
    """max (or min) of sizes: a value provably above (below) the others, else a
    sympy Max (Min) of those not provably dominated."""
    if all(isinstance(v, int) for v in vals):
        return max(vals) if largest else min(vals)  # type: ignore[type-var]

    def beaten(v: Size, by: Size) -> bool:
        return _le(v, by, shapes) if largest else _le(by, v, shapes)

    keep: list[Size] = []
    for v in vals:
        if any(beaten(v, k) for k in keep):
            continue
        keep = [k for k in keep if not beaten(k, v)] + [v]
    if len(keep) == 1:
        return keep[0]
    return norm((sympy.Max if largest else sympy.Min)(*keep))


def _smax(shapes: ShapeInfo, *vals: Size) -> Size:
    return _extreme(vals, shapes, True)


def _smin(shapes: ShapeInfo, *vals: Size) -> Size:
    return _extreme(vals, shapes, False)


def _fit(r: Range | None, dt: torch.dtype, shapes: ShapeInfo = EMPTY) -> Range | None:
    """`r` as the range of a value of dtype `dt`: the whole dtype when r is
    unknown or exceeds it (the value may have wrapped)."""
    full = dtype_range(dt)
    if full is None:
        return None
    if r is None:
        return full
    if _static(r):
        if r[0] < full[0] or r[1] > full[1]:  # type: ignore[operator]
            return full
        return r
    n = _numeric(r, shapes)  # symbolic ends: kept when they fit for every size
    if n is None or n[0] < full[0] or n[1] > full[1]:
        return full
    return r


def _hull(*rs: IntRange) -> IntRange:
    return (min(r[0] for r in rs), max(r[1] for r in rs))


def _mul(a: IntRange, b: IntRange) -> IntRange:
    corners = [x * y for x in a for y in b]
    return (min(corners), max(corners))


def _smul(a: Range, b: Range, shapes: ShapeInfo) -> Range:
    """The product of two ranges with symbolic ends."""
    if _static(a) and _static(b):
        return _mul(cast(IntRange, a), cast(IntRange, b))
    if _le(0, a[0], shapes) and _le(0, b[0], shapes):  # both nonnegative: the index case
        return (norm(sympy.expand(a[0] * b[0])), norm(sympy.expand(a[1] * b[1])))
    corners = [norm(sympy.expand(x * y)) for x in a for y in b]
    return (_smin(shapes, *corners), _smax(shapes, *corners))


def _loop_range(n: Size | None) -> Range | None:
    """[0, n) of a loop of n; None for an empty (static) or unknown one.  A symbolic
    loop that is empty for some sizes reads nothing then: [0, n - 1] holds vacuously."""
    if n is None:
        return None
    if isinstance(n, int):
        return None if n < 1 else (0, n - 1)
    if n.is_Integer:
        return None if int(n) < 1 else (0, int(n) - 1)
    return (0, norm(n - 1))


def index_range(e: sympy.Expr, ranges: Mapping[sympy.Symbol, Size], shapes: ShapeInfo = EMPTY) -> Range | None:
    """The range of an index expression over loop symbols (None: unknown).  A size
    symbol is its own range ([s1, s1]), and a loop of a symbolic size n runs over
    [0, n - 1]: the ends are then expressions over size symbols."""
    if e.is_Integer:
        return (int(e), int(e))
    if isinstance(e, sympy.Symbol):
        n = ranges.get(e)
        if n is None and is_size_symbol(e):
            return (e, e)
        return _loop_range(n)
    if isinstance(e, (sympy.Add, sympy.Mul)):
        parts = [index_range(a, ranges, shapes) for a in e.args]
        if any(p is None for p in parts):
            return None
        out = parts[0]
        assert out is not None
        if all(_static(p) for p in parts):  # type: ignore[arg-type]
            o = cast(IntRange, out)
            for p in parts[1:]:
                q = cast(IntRange, p)
                o = (o[0] + q[0], o[1] + q[1]) if isinstance(e, sympy.Add) else _mul(o, q)
            return o
        for p in parts[1:]:
            assert p is not None
            out = (norm(out[0] + p[0]), norm(out[1] + p[1])) if isinstance(e, sympy.Add) else _smul(out, p, shapes)
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        base = index_range(e.base, ranges, shapes)
        if base is None:
            return None
        out = base
        for _ in range(int(e.exp) - 1):
            out = _smul(out, base, shapes)
        return out
    if isinstance(e, FloorDiv):
        a = index_range(e.args[0], ranges, shapes)
        b = e.args[1]
        if a is None:
            return None
        if b.is_Integer and _static(a):
            if int(b) <= 0:
                return None
            lo, hi = cast(IntRange, a)
            # floor division, or C's truncating one (cpp prints `/`) if a is ever
            # negative: both lie between floor(lo / b) and trunc(hi / b)
            return (lo // int(b), hi // int(b) if hi >= 0 else -(-hi // int(b)))
        # a symbolic end or divisor: a dividend never negative, a divisor positive
        bv = norm(b) if _size_expr(b) else None
        if bv is not None and _lt(0, bv, shapes) and _le(0, a[0], shapes):
            return (norm(FloorDiv(a[0], b)), norm(FloorDiv(a[1], b)))
        return None
    if isinstance(e, ModularIndexing):
        a = index_range(e.args[0], ranges, shapes)
        c = e.args[2]
        if c.is_Integer:
            if int(c) <= 0:
                return None
            nonneg = a is not None and _le(0, a[0], shapes)
            return (0, int(c) - 1) if nonneg else (1 - int(c), int(c) - 1)
        if not (_size_expr(c) and _lt(0, norm(c), shapes)):
            return None
        nonneg = a is not None and _le(0, a[0], shapes)
        return (0, norm(c - 1)) if nonneg else (norm(1 - c), norm(c - 1))
    return None


def _size_expr(e: sympy.Expr) -> bool:
    """An integer, or an expression over size symbols only (no loop symbol)."""
    return bool(e.is_Integer) or (bool(e.free_symbols) and all(is_size_symbol(s) for s in e.free_symbols))


def _divide(name: str, a: IntRange, b: IntRange) -> IntRange:
    """floordiv / truncdiv of a by a divisor in b."""
    if b[0] <= 0 <= b[1]:
        # the divisor may be anything nonzero (or 0, which the backends turn
        # into a 0 quotient or an error): |a / b| <= |a|
        m = max(abs(a[0]), abs(a[1]))
        return (-m, m)

    def div(x: int, y: int) -> int:
        if name == "floordiv":
            return x // y
        q = abs(x) // abs(y)
        return q if (x < 0) == (y < 0) else -q

    # monotone in each argument while the divisor keeps its sign: the corners bound it
    corners = [div(x, y) for x in a for y in b]
    return (min(corners), max(corners))


def _remainder(name: str, a: IntRange, b: IntRange) -> IntRange:
    """remainder (Python's %) / fmod (C's) of a by a divisor in b (a zero
    divisor gives 0 or an error)."""
    m = max(abs(b[0]), abs(b[1]), 1) - 1  # |a % b| < |b|
    if name == "fmod":  # C's %: the sign of a, and |a % b| <= |a|
        m = min(m, max(abs(a[0]), abs(a[1])))
        return (0 if a[0] >= 0 else -m, 0 if a[1] <= 0 else m)
    if b[0] > 0:  # Python's %: the sign of b
        return (a[0], a[1]) if a[0] >= 0 and a[1] < b[0] else (0, b[1] - 1)
    if b[1] < 0:
        return (b[0] + 1, 0)
    return (-m, m)


def _op_range(node: Op, args: tuple[Range | None, ...], shapes: ShapeInfo = EMPTY) -> Range | None:
    if any(a is None for a in args):
        return None
    rs = [a for a in args if a is not None]
    if all(_static(r) for r in rs):
        return _int_op_range(node.name, cast(list[IntRange], rs))
    name = node.name
    match name:  # symbolic ends: the operations that keep them
        case "add":
            return (norm(rs[0][0] + rs[1][0]), norm(rs[0][1] + rs[1][1]))
        case "sub":
            return (norm(rs[0][0] - rs[1][1]), norm(rs[0][1] - rs[1][0]))
        case "mul":
            return _smul(rs[0], rs[1], shapes)
        case "neg":
            return (norm(-rs[0][1]), norm(-rs[0][0]))
        case "maximum":
            return (_smax(shapes, rs[0][0], rs[1][0]), _smax(shapes, rs[0][1], rs[1][1]))
        case "minimum":
            return (_smin(shapes, rs[0][0], rs[1][0]), _smin(shapes, rs[0][1], rs[1][1]))
        case "relu":
            return (_smax(shapes, rs[0][0], 0), _smax(shapes, rs[0][1], 0))
        case "where":
            return (_smin(shapes, rs[-2][0], rs[-1][0]), _smax(shapes, rs[-2][1], rs[-1][1]))
    # the others on the ends' numeric bounds, where every size has them
    ns = [_numeric(r, shapes) for r in rs]
    if any(n is None for n in ns):
        return None
    return _int_op_range(name, cast(list[IntRange], ns))


def _int_op_range(name: str, rs: list[IntRange]) -> IntRange | None:
    match name:
        case "add":
            return (rs[0][0] + rs[1][0], rs[0][1] + rs[1][1])
        case "sub":
            return (rs[0][0] - rs[1][1], rs[0][1] - rs[1][0])
        case "mul":
            return _mul(rs[0], rs[1])
        case "neg":
            return (-rs[0][1], -rs[0][0])
        case "abs":
            lo, hi = rs[0]
            return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        case "maximum":
            return (max(rs[0][0], rs[1][0]), max(rs[0][1], rs[1][1]))
        case "minimum":
            return (min(rs[0][0], rs[1][0]), min(rs[0][1], rs[1][1]))
        case "relu":
            return (max(rs[0][0], 0), max(rs[0][1], 0))
        case "sign":
            lo, hi = rs[0]
            return ((lo > 0) - (lo < 0), (hi > 0) - (hi < 0))
        case "where":
            return _hull(rs[-2], rs[-1])
        case "floordiv" | "truncdiv":
            return _divide(name, rs[0], rs[1])
        case "remainder" | "fmod":
            return _remainder(name, rs[0], rs[1])
        case "bitwise_and":
            nonneg = [r for r in rs if r[0] >= 0]  # x & y <= x for x >= 0
            return (0, min(r[1] for r in nonneg)) if nonneg else None
        case "floor" | "ceil" | "trunc" | "round":
            return rs[0]
    return None


COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def _index_symbols(e: Expr) -> set[sympy.Basic] | None:
    """The symbols `e`'s index expressions read, or None where it reads memory."""
    syms: set[sympy.Basic] = set()
    for s in walk(e):
        if isinstance(s, (Load, IndirectLoad, Check)):
            return None
        if isinstance(s, IndexExpr):
            syms |= s.expr.free_symbols
    return syms


def reads_only(e: Expr, sym: sympy.Symbol) -> bool:
    """Whether `e` reads memory nowhere and no symbol but `sym` (and reads it)."""
    return _index_symbols(e) == {sym}


def reads_among(e: Expr, syms: set[sympy.Symbol]) -> bool:
    """Whether `e` reads memory nowhere, some symbol, and no symbol outside `syms`."""
    seen = _index_symbols(e)
    return bool(seen) and seen is not None and seen <= syms


def comparisons_of(bodies: Sequence[Expr], sym: sympy.Symbol) -> list[Op]:
    """The comparisons in `bodies` that read `sym` alone, each once, in order."""
    out: dict[Op, None] = {}
    for body in bodies:
        for s in walk(body):
            if isinstance(s, Op) and s.name in COMPARISONS and s not in out and reads_only(s, sym):
                out[s] = None
    return list(out)


def value_over(c: Expr, sym: sympy.Symbol, lo: int, hi: int) -> bool | None:
    """A comparison's value while sym runs over [lo, hi), where it is one value."""
    return value_among(c, {sym: (lo, hi)})


def value_among(c: Expr, spans: Mapping[sympy.Symbol, tuple[int, int]]) -> bool | None:
    """A comparison's value while each symbol of `spans` runs over its [lo, hi),
    where its index expressions read no other symbol (or none at all: `-1 < 0`)
    and it is one value over them all, whatever the memory it reads holds (a
    load's range is its dtype's: `where(x > y, i, j) < 0` is false for i, j >= 0)."""
    seen = {v for e in walk(c) if isinstance(e, IndexExpr) for v in e.expr.free_symbols}
    if not seen <= set(spans):
        return None
    starts = {s: sympy.Symbol(f"piece_{s}", integer=True, nonnegative=True) for s in seen}
    moved = substitute_symbols(c, {s: starts[s] + spans[s][0] for s in seen})  # type: ignore[index]
    r = value_range(moved, {starts[s]: spans[s][1] - spans[s][0] for s in seen})  # type: ignore[index]
    if r is None or r[0] != r[1]:
        return None
    return bool(r[0])


def _compare(name: str, a: IntRange, b: IntRange) -> IntRange:
    """A comparison's range: [1, 1] where it holds for every pair of values, [0, 0]
    where for none, else [0, 1]."""
    always = {"lt": a[1] < b[0], "le": a[1] <= b[0], "gt": a[0] > b[1], "ge": a[0] >= b[1],
              "eq": a[0] == a[1] == b[0] == b[1], "ne": a[1] < b[0] or b[1] < a[0]}[name]
    never = {"lt": a[0] >= b[1], "le": a[0] > b[1], "gt": a[1] <= b[0], "ge": a[1] < b[0],
             "eq": a[1] < b[0] or b[1] < a[0], "ne": a[0] == a[1] == b[0] == b[1]}[name]
    return (1, 1) if always else (0, 0) if never else (0, 1)


class RangeHandler:
    """evaluate's handler: each subtree's range (None: floating, or unknown)."""

    def __init__(self, ranges: Mapping[sympy.Symbol, Size], shapes: ShapeInfo = EMPTY) -> None:
        self.ranges = ranges
        self.shapes = shapes

    def load(self, node: Load, mask: Range | None) -> Range | None:
        return dtype_range(node.dtype)  # a masked load's 0 is in it too

    def indirect_load(self, node: IndirectLoad, values: tuple[Range | None, ...], mask: Range | None) -> Range | None:
        return dtype_range(node.dtype)

    def constant(self, node: Constant) -> Range | None:
        if node.dtype.is_floating_point or node.dtype.is_complex:
            return None
        return (int(node.value), int(node.value))

    def index_expr(self, node: IndexExpr) -> Range | None:
        return _fit(index_range(node.expr, self.ranges, self.shapes), node.dtype, self.shapes)

    def op(self, node: Op, args: tuple[Range | None, ...]) -> Range | None:
        if node.dtype == torch.bool:
            if node.name in COMPARISONS and all(a is not None and _static(a) for a in args):
                return _compare(node.name, *cast(list[IntRange], args))  # decided for every value: a constant
            return (0, 1)
        if node.dtype.is_floating_point or node.dtype.is_complex:
            return None
        return _fit(_op_range(node, args, self.shapes), node.dtype, self.shapes)

    def cast(self, node: Cast, arg: Range | None) -> Range | None:
        return (0, 1) if node.dtype == torch.bool else _fit(arg, node.dtype, self.shapes)

    def check(self, node: Check, arg: Range | None) -> Range | None:
        if node.kind == "index":
            return (0, norm(node.size - 1))
        if arg is not None and not _static(arg):
            arg = _numeric(arg, self.shapes)
        if arg is not None and arg[0] == 0:
            return (1, max(arg[1], 1))  # type: ignore[type-var]
        if arg is not None and arg[1] == 0:
            return (min(arg[0], -1), -1)  # type: ignore[type-var]
        return arg


def value_range(expr: Expr, ranges: Mapping[sympy.Symbol, Size],
                memo: dict[Expr, Range | None] | None = None, shapes: ShapeInfo = EMPTY) -> Range | None:
    """An interval holding every value of the integer or bool expression `expr`
    (None when it is floating); its ends are size expressions where a loop's
    size is one."""
    return evaluate(expr, RangeHandler(ranges, shapes), memo)  # type: ignore[arg-type]


def proven(c: Check, r: Range | None, shapes: ShapeInfo = EMPTY) -> bool:
    """Whether an argument range `r` can never fail check `c` (for every size)."""
    if r is None:
        return False
    lo, hi = r
    if isinstance(lo, int) and isinstance(hi, int) and isinstance(c.size, int):
        if c.kind == "divisor":
            return lo > 0 or hi < 0
        return hi < c.size and lo >= (-c.size if c.wrap else 0)
    if c.kind == "divisor":
        return _lt(0, lo, shapes) or _lt(hi, 0, shapes)
    return _lt(hi, c.size, shapes) and _le(-c.size if c.wrap else 0, lo, shapes)


def prove_checks(body: Expr, ranges: Mapping[sympy.Symbol, Size], shapes: ShapeInfo = EMPTY) -> Expr:
    """`body` with each Check's status decided by the range of its argument
    (recorded in the Check as the reason: for symbolic ends, their int bounds
    over every size, or None)."""
    memo: dict[Expr, Range | None] = {}

    def fn(e: Expr) -> Expr | None:
        if not isinstance(e, Check):
            return None
        r = value_range(e.arg, ranges, memo, shapes)
        status = "proven" if proven(e, r, shapes) else "checked"
        reason = r if r is None or _static(r) else _numeric(r, shapes)
        if (status, reason) == (e.status, e.range):
            return None
        return Check(e.arg, e.error, e.size, e.dim, e.wrap, status, cast("IntRange | None", reason))

    return rewrite(body, fn)


_NARROW = {"lt": (None, -1), "le": (None, 0), "gt": (1, None), "ge": (0, None), "eq": (0, 0)}


def mask_ranges(mask: Expr | None, ranges: Mapping[sympy.Symbol, Size],
                shapes: ShapeInfo = EMPTY) -> dict[sympy.Symbol, Range]:
    """Each loop symbol's range where `mask` holds: [0, n) narrowed by the
    conjuncts of the mask (a tree of logical_and) that compare a symbol with a
    constant, `x3 < 32`.  Any other conjunct is left out, which only widens the
    result: sound, never a range a true mask can leave.  A symbolic n gives
    [0, n - 1], narrowed by max / min with the constants."""
    out: dict[sympy.Symbol, Range] = {s: (0, n - 1) if isinstance(n, int) else (0, norm(n - 1))
                                      for s, n in ranges.items()}
    stack = [] if mask is None else [mask]
    while stack:
        e = stack.pop()
        if isinstance(e, Op) and e.name == "logical_and":
            stack.extend(e.args)
            continue
        if not (isinstance(e, Op) and e.name in _NARROW and isinstance(e.args[0], IndexExpr)
                and isinstance(e.args[1], Constant) and isinstance(e.args[0].expr, sympy.Symbol)):
            continue
        sym, c = e.args[0].expr, int(e.args[1].value)
        if sym not in out:
            continue
        lo, hi = out[sym]
        at_least, at_most = _NARROW[e.name]
        if at_least is not None:
            lo = max(lo, c + at_least) if isinstance(lo, int) else _smax(shapes, lo, c + at_least)
        if at_most is not None:
            hi = min(hi, c + at_most) if isinstance(hi, int) else _smin(shapes, hi, c + at_most)
        out[sym] = (lo, hi)
    return out


def load_in_bounds(ld: Load | IndirectLoad, size: tuple[Size, ...], ranges: Mapping[sympy.Symbol, Size],
                   shapes: ShapeInfo = EMPTY) -> bool:
    """Whether every index of `ld` is provably inside a tensor of `size`, for
    every point of the loops (`ranges`) where the load's mask holds (an
    indirect load's ind_k in [0, size of its dim)).  False when it cannot be
    shown, which is not proof of the contrary; True only when no point the mask
    admits reads outside (a mask that admits none proves it vacuously).  With
    symbolic sizes, for every size."""
    narrowed = mask_ranges(ld.mask, ranges, shapes)
    if any(_lt(hi, lo, shapes) for lo, hi in narrowed.values()):
        return True  # the mask is false everywhere: nothing is read
    if isinstance(ld, IndirectLoad):
        narrowed.update({indsym(k): (0, n - 1) if isinstance(n, int) else (0, norm(n - 1))
                         for k, n in enumerate(ld.sizes)})
    # index_range knows symbols as [0, n): shift each narrowed one to start at 0
    shift = {s: s + lo for s, (lo, _) in narrowed.items()}
    extent = {s: hi - lo + 1 if isinstance(hi, int) and isinstance(lo, int) else norm(hi - lo + 1)
              for s, (lo, hi) in narrowed.items()}
    if len(ld.index) != len(size):
        return False
    for i, n in zip(ld.index, size):
        r = index_range(i.xreplace(shift), extent, shapes)
        if r is None or not _le(0, r[0], shapes) or not _lt(r[1], n, shapes):
            return False
    return True


def runtime_checks(expr: Expr) -> list[Check]:
    """The Checks of a body that run: a kernel with any must be followed by a look
    at the error channel."""
    return [e for e in walk(expr) if isinstance(e, Check) and e.checked]
