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
"""

from __future__ import annotations

from typing import Mapping

import sympy
import torch

from coil.ir.expr import Cast, Check, Constant, Expr, IndexExpr, IndirectLoad, Load, Op, evaluate, indsym, rewrite, walk
from coil.ir.indexing import FloorDiv, ModularIndexing

Range = tuple[int, int]


def dtype_range(dt: torch.dtype) -> Range | None:
    """Every value of an integer or bool dtype; None for the others."""
    if dt == torch.bool:
        return (0, 1)
    if dt.is_floating_point or dt.is_complex:
        return None
    info = torch.iinfo(dt)
    return (int(info.min), int(info.max))


def _fit(r: Range | None, dt: torch.dtype) -> Range | None:
    """`r` as the range of a value of dtype `dt`: the whole dtype when r is
    unknown or exceeds it (the value may have wrapped)."""
    full = dtype_range(dt)
    if full is None:
        return None
    if r is None or r[0] < full[0] or r[1] > full[1]:
        return full
    return r


def _hull(*rs: Range) -> Range:
    return (min(r[0] for r in rs), max(r[1] for r in rs))


def _mul(a: Range, b: Range) -> Range:
    corners = [x * y for x in a for y in b]
    return (min(corners), max(corners))


def index_range(e: sympy.Expr, ranges: Mapping[sympy.Symbol, int]) -> Range | None:
    """The range of an index expression over loop symbols (None: unknown)."""
    if e.is_Integer:
        return (int(e), int(e))
    if isinstance(e, sympy.Symbol):
        n = ranges.get(e)
        return None if n is None or n < 1 else (0, int(n) - 1)
    if isinstance(e, (sympy.Add, sympy.Mul)):
        parts = [index_range(a, ranges) for a in e.args]
        if any(p is None for p in parts):
            return None
        out = parts[0]
        assert out is not None
        for p in parts[1:]:
            assert p is not None
            out = (out[0] + p[0], out[1] + p[1]) if isinstance(e, sympy.Add) else _mul(out, p)
        return out
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        base = index_range(e.base, ranges)
        if base is None:
            return None
        out = base
        for _ in range(int(e.exp) - 1):
            out = _mul(out, base)
        return out
    if isinstance(e, FloorDiv):
        a = index_range(e.args[0], ranges)
        b = e.args[1]
        if a is None or not b.is_Integer or int(b) <= 0:
            return None
        # floor division, or C's truncating one (cpp prints `/`) if a is ever
        # negative: both lie between floor(lo / b) and trunc(hi / b)
        hi = a[1] // int(b) if a[1] >= 0 else -(-a[1] // int(b))
        return (a[0] // int(b), hi)
    if isinstance(e, ModularIndexing):
        a = index_range(e.args[0], ranges)
        c = e.args[2]
        if not c.is_Integer or int(c) <= 0:
            return None
        return (0, int(c) - 1) if a is not None and a[0] >= 0 else (1 - int(c), int(c) - 1)
    return None


def _divide(name: str, a: Range, b: Range) -> Range:
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


def _remainder(name: str, a: Range, b: Range) -> Range:
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


def _op_range(node: Op, args: tuple[Range | None, ...]) -> Range | None:
    name = node.name
    if any(a is None for a in args):
        return None
    rs = [a for a in args if a is not None]
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


class RangeHandler:
    """evaluate's handler: each subtree's range (None: floating, or unknown)."""

    def __init__(self, ranges: Mapping[sympy.Symbol, int]) -> None:
        self.ranges = ranges

    def load(self, node: Load, mask: Range | None) -> Range | None:
        return dtype_range(node.dtype)  # a masked load's 0 is in it too

    def indirect_load(self, node: IndirectLoad, values: tuple[Range | None, ...], mask: Range | None) -> Range | None:
        return dtype_range(node.dtype)

    def constant(self, node: Constant) -> Range | None:
        if node.dtype.is_floating_point or node.dtype.is_complex:
            return None
        return (int(node.value), int(node.value))

    def index_expr(self, node: IndexExpr) -> Range | None:
        return _fit(index_range(node.expr, self.ranges), node.dtype)

    def op(self, node: Op, args: tuple[Range | None, ...]) -> Range | None:
        if node.dtype == torch.bool:
            return (0, 1)
        if node.dtype.is_floating_point or node.dtype.is_complex:
            return None
        return _fit(_op_range(node, args), node.dtype)

    def cast(self, node: Cast, arg: Range | None) -> Range | None:
        return (0, 1) if node.dtype == torch.bool else _fit(arg, node.dtype)

    def check(self, node: Check, arg: Range | None) -> Range | None:
        if node.kind == "index":
            return (0, node.size - 1)
        if arg is not None and arg[0] == 0:
            return (1, max(arg[1], 1))
        if arg is not None and arg[1] == 0:
            return (min(arg[0], -1), -1)
        return arg


def value_range(expr: Expr, ranges: Mapping[sympy.Symbol, int],
                memo: dict[Expr, Range | None] | None = None) -> Range | None:
    """An interval holding every value of the integer or bool expression `expr`
    (None when it is floating)."""
    return evaluate(expr, RangeHandler(ranges), memo)  # type: ignore[arg-type]


def proven(c: Check, r: Range | None) -> bool:
    """Whether an argument range `r` can never fail check `c`."""
    if r is None:
        return False
    lo, hi = r
    if c.kind == "divisor":
        return lo > 0 or hi < 0
    return hi < c.size and lo >= (-c.size if c.wrap else 0)


def prove_checks(body: Expr, ranges: Mapping[sympy.Symbol, int]) -> Expr:
    """`body` with each Check's status decided by the range of its argument
    (recorded in the Check as the reason)."""
    memo: dict[Expr, Range | None] = {}

    def fn(e: Expr) -> Expr | None:
        if not isinstance(e, Check):
            return None
        r = value_range(e.arg, ranges, memo)
        status = "proven" if proven(e, r) else "checked"
        if (status, r) == (e.status, e.range):
            return None
        return Check(e.arg, e.error, e.size, e.dim, e.wrap, status, r)

    return rewrite(body, fn)


_NARROW = {"lt": (None, -1), "le": (None, 0), "gt": (1, None), "ge": (0, None), "eq": (0, 0)}


def mask_ranges(mask: Expr | None, ranges: Mapping[sympy.Symbol, int]) -> dict[sympy.Symbol, Range]:
    """Each loop symbol's range where `mask` holds: [0, n) narrowed by the
    conjuncts of the mask (a tree of logical_and) that compare a symbol with a
    constant, `x3 < 32`.  Any other conjunct is left out, which only widens the
    result: sound, never a range a true mask can leave."""
    out: dict[sympy.Symbol, Range] = {s: (0, n - 1) for s, n in ranges.items()}
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
            lo = max(lo, c + at_least)
        if at_most is not None:
            hi = min(hi, c + at_most)
        out[sym] = (lo, hi)
    return out


def load_in_bounds(ld: Load | IndirectLoad, size: tuple[int, ...], ranges: Mapping[sympy.Symbol, int]) -> bool:
    """Whether every index of `ld` is provably inside a tensor of `size`, for
    every point of the loops (`ranges`) where the load's mask holds (an
    indirect load's ind_k in [0, size of its dim)).  False when it cannot be
    shown, which is not proof of the contrary; True only when no point the mask
    admits reads outside (a mask that admits none proves it vacuously)."""
    narrowed = mask_ranges(ld.mask, ranges)
    if any(lo > hi for lo, hi in narrowed.values()):
        return True  # the mask is false everywhere: nothing is read
    if isinstance(ld, IndirectLoad):
        narrowed.update({indsym(k): (0, n - 1) for k, n in enumerate(ld.sizes)})
    # index_range knows symbols as [0, n): shift each narrowed one to start at 0
    shift = {s: s + lo for s, (lo, _) in narrowed.items()}
    extent = {s: hi - lo + 1 for s, (lo, hi) in narrowed.items()}
    if len(ld.index) != len(size):
        return False
    for i, n in zip(ld.index, size):
        r = index_range(i.xreplace(shift), extent)
        if r is None or r[0] < 0 or r[1] >= n:
            return False
    return True


def runtime_checks(expr: Expr) -> list[Check]:
    """The Checks of a body that run: a kernel with any must be followed by a look
    at the error channel."""
    return [e for e in walk(expr) if isinstance(e, Check) and e.checked]
