"""Symbolic sizes at coil's entry: from the ShapeEnv's SymInts to coil's sizes.

Dynamo names its size symbols by the hash of their source (`s77`, `s27`), so the
same graph can come with other names in another process.  `SizeMap.of` renames
them `s0, s1, ...` in order of first appearance over the graph's inputs (a SymInt
input, then each tensor's sizes, strides and offset), and copies what the ShapeEnv
knows of each (hint and range) into a frozen `ShapeInfo` (ir/shapes.py).  From
there on coil reads only its own symbols and facts, never the ShapeEnv, so it adds
no guards: nothing here calls `int()`, `guard_*` or `evaluate_expr` on a SymInt.

A static graph's SizeMap is empty, and its `size` is the identity on ints.
"""

from __future__ import annotations

import functools
import math
import operator
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import sympy
import torch

from coil.errors import CoilError
from coil.ir.expr import Cast, Constant, IndexExpr, Op
from coil.ir.indexing import FloorDiv, ModularIndexing
from coil.ir.shapes import (
    EMPTY,
    UNBACKED_HINT,
    ShapeInfo,
    Size,
    SymbolFacts,
    guard_rules,
    is_unbacked_symbol,
    norm,
    size_symbol,
    symbol_key,
    unbacked_symbol,
)


def shape_env(values: Iterable[Any]) -> Any:
    """The ShapeEnv of the first symbolic value among `values` (a SymInt, or a
    tensor of a symbolic size, stride or offset); None when all are static."""
    for v in values:
        for leaf in size_leaves(v):
            if isinstance(leaf, torch.SymInt):
                return leaf.node.shape_env
    return None


def has_symbols(values: Iterable[Any]) -> bool:
    """Whether a size among `values` is symbolic: a SymInt (alone, or a tensor's
    size, stride or offset) with a symbol left once the ShapeEnv's replacements
    are made.  A SymInt Dynamo specialized (`Sym(8)`, an int input branched on) is
    a number."""
    for v in values:
        for leaf in size_leaves(v):
            if isinstance(leaf, torch.SymInt):
                env = leaf.node.shape_env
                if env is None or env.replace(leaf.node.expr).free_symbols:
                    return True
    return False


def _hint_value(env: Any, s: sympy.Symbol) -> Any:
    """The ShapeEnv's value of symbol s at the first call (None: data-dependent)."""
    table = getattr(env, "backed_var_to_val", None)
    if table is None:  # torch before 2.13
        table = env.var_to_val
    return table.get(s)


def _hint_of(env: Any, s: sympy.Symbol) -> int | None:
    v = _hint_value(env, s)
    return None if v is None or is_nested_int_hint(v) else int(v)


def is_nested_int_hint(v: Any) -> bool:
    """A nested int's value (a jagged tensor's ragged dim, `j1`): not a number."""
    return type(v).__name__ == "SingletonInt"


def is_nested_int(x: Any) -> bool:
    """A SymInt that is a nested int: AOTAutograd hands a jagged tensor's ragged
    dim to the graph as an input, which no size of the graph's dense tensors uses."""
    if not isinstance(x, torch.SymInt):
        return False
    env = x.node.shape_env
    if env is None:
        return False
    expr = env.replace(x.node.expr)
    return isinstance(expr, sympy.Symbol) and is_nested_int_hint(_hint_value(env, expr))


def size_leaves(v: Any) -> list[Any]:
    """A value's sizes: a SymInt itself, a tensor's sizes, strides and offset."""
    if isinstance(v, torch.SymInt):
        return [v]
    if isinstance(v, torch.Tensor):
        return [*v.shape, *v.stride(), v.storage_offset()]
    return []


def _relations(e: sympy.Basic) -> list[sympy.Basic]:
    """The relations a guard holds, each an `Eq`, an `Ne` or written `small <= big`
    / `small < big`: the parts of an `And`, and a bound on a min or a max as a bound on
    each argument (`Min(s0//2, s1//2) > 4`: `4 < s0//2` and `4 < s1//2`)."""
    from torch.utils._sympy import functions as tf

    if isinstance(e, sympy.And):
        return [r for a in e.args for r in _relations(a)]
    if isinstance(e, (sympy.Eq, sympy.Ne)):
        return [e]
    if not isinstance(e, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)):
        return []
    make = sympy.Lt if isinstance(e, (sympy.Lt, sympy.Gt)) else sympy.Le
    small, big = (e.lhs, e.rhs) if isinstance(e, (sympy.Le, sympy.Lt)) else (e.rhs, e.lhs)
    if isinstance(big, (sympy.Min, tf.Min)):
        return [r for a in big.args for r in _relations(make(small, a))]
    if isinstance(small, (sympy.Max, tf.Max)):
        return [r for a in small.args for r in _relations(make(a, big))]
    return [make(small, big, evaluate=False)]


# each ShapeEnv's guard relations as equalities of coil's sizes, by the names and facts they
# were read under (SizeMap._guarded_equalities); dropped with the ShapeEnv
_EQUALITIES: "weakref.WeakKeyDictionary[Any, dict[Any, sympy.Expr | None]]" = weakref.WeakKeyDictionary()

# how far `_guarded_least` looks above a symbol's least value for one every guard on it admits
_LEAST_SCAN = 512


def _guarded_least(relations: Sequence[sympy.Basic], s: sympy.Symbol, lo: int, hint: int) -> int:
    """The least value of `s`, from `lo`, that every guard over `s` alone admits
    (`Ne(s//4, 0)`, `Eq(Mod(s, 2), 0)`, `s//2 > 4` from `Min(s//2, t//2) > 4`): a
    call with a smaller value fails one of Dynamo's guards and never reaches the
    graph.  The ShapeEnv narrows a range only for guards on the symbol itself;
    Swin's window padding takes `Max(1, s//8)` to be `s//8` only above 8.  A value
    is ruled out only where a guard is False at it; the hint passes every guard.
    `relations`: the guards' relations (`_relations`), read once by `SizeMap.of`."""
    if hint <= lo:
        return lo
    own = [r for r in relations if r.free_symbols == {s}]
    if not own:
        return lo

    def admits(r: sympy.Basic, v: int) -> bool:
        try:
            return r.xreplace({s: sympy.Integer(v)}) is not sympy.false
        except (ZeroDivisionError, TypeError):  # s0//(s0//9) below 9: not ruled out here
            return True

    for v in range(lo, min(hint, lo + _LEAST_SCAN) + 1):
        if all(admits(r, v) for r in own):
            return v
    # none up to the hint: a guard misread (the hint passes them all), so nothing is taken
    return lo if hint <= lo + _LEAST_SCAN else lo + _LEAST_SCAN + 1


@functools.lru_cache(maxsize=64)
def _rules_of(equalities: tuple[sympy.Expr, ...], shapes: ShapeInfo) -> tuple[tuple[Any, ...], dict[sympy.Symbol, Any]]:
    """guard_rules, remembered: the same guards are read again for the graph
    cache's keys and by lower.  The solutions are shared: read them only."""
    return guard_rules(equalities, shapes)


def _unbacked_hint(lo: int, hi: int | None) -> int:
    """A data-dependent symbol's hint: UNBACKED_HINT clamped to its range (a hint
    steers speed decisions only)."""
    return min(max(UNBACKED_HINT, lo), hi) if hi is not None else max(UNBACKED_HINT, lo)


def _range_of(env: Any, s: sympy.Symbol, sizes: bool = True) -> tuple[int, int | None]:
    """A symbol's range in the ShapeEnv: (least, greatest), None for unbounded (an
    upper end at int64's largest values says nothing a size does not).  The least
    is at least 0 for a size (`sizes`); otherwise an unbounded lower end is -2**63."""
    r = env.var_to_range.get(s)
    lo = int(r.lower) if r is not None and isinstance(r.lower, (int, sympy.Integer)) else (0 if sizes else -2**63)
    up = r.upper if r is not None else None
    hi = int(up) if isinstance(up, (int, sympy.Integer)) else None
    return max(lo, 0) if sizes else lo, (None if hi is not None and hi >= 2**63 - 2 else hi)


@attrs.define(eq=False)
class SizeMap:
    """Renames the ShapeEnv's symbols to coil's and converts SymInts to sizes.
    It grows while lower walks the graph: each data-dependent (unbacked) symbol met
    in an Extern's result (`admit_unbacked`) becomes a `u*` symbol."""

    env: Any = None
    names: dict[sympy.Symbol, sympy.Expr] = attrs.Factory(dict)  # ShapeEnv symbol -> coil size
    shapes: ShapeInfo = EMPTY
    # ShapeEnv symbols of SymInt inputs negative at the first call, compiled for that value
    # (GraphSizes.fixed): coil's symbols are at least 0
    fixed: dict[sympy.Symbol, int] = attrs.Factory(dict)

    @classmethod
    def of(cls, inputs: Sequence[Any]) -> "SizeMap":
        """The map of a graph's inputs: their symbols renamed in order, with their
        facts and the rules of Dynamo's guarded equalities.  A symbol those
        equalities solve for (guard_rules' solutions) is its value: a constant
        where they pin it (`s0 = 2*((s0 - 1)//2) + 2` with `(s0 - 1)//2 = 11`), as a
        symbol whose range is one value is, or an expression of the other symbols
        (`s93 + s15 + s5 + 18 = 64`, split sizes a guard sums to the rows: the
        third is 46 - u0 - u1), so that sizes made of them meet.  Dynamo's guards
        admit no other value."""
        env = shape_env(inputs)
        if env is None:
            return cls()
        # the guards' relations, read once: each round's names and least values, and its equalities
        relations = [r for g in getattr(env, "guards", ()) for r in _relations(env.replace(g.expr))]
        solved: dict[sympy.Symbol, int | sympy.Expr] = {}  # ShapeEnv symbol -> value over ShapeEnv symbols
        while True:
            out = cls._of(inputs, env, relations, solved)
            rules, solutions = _rules_of(tuple(out._guarded_equalities(relations)), out.shapes)
            back = {v: k for k, v in out.names.items() if isinstance(v, sympy.Symbol)}
            new = {back[s]: (v if isinstance(v, int) else v.xreplace(back)) for s, v in solutions.items()
                   if s in back and back[s] not in solved}
            if not new:
                out.shapes = attrs.evolve(out.shapes, rules=rules)
                return out
            solved = {k: (v if isinstance(v, int) else v.xreplace(new)) for k, v in solved.items()} | new

    @classmethod
    def _of(cls, inputs: Sequence[Any], env: Any, relations: Sequence[sympy.Basic],
            solved: Mapping[sympy.Symbol, int | sympy.Expr]) -> "SizeMap":
        names: dict[sympy.Symbol, sympy.Expr] = {}
        facts: list[SymbolFacts] = []
        fixed: dict[sympy.Symbol, int] = {}
        # the symbols SymInt inputs are, whichever input shows them first (x of size k + 2, then k)
        given = {e for x in inputs if isinstance(x, torch.SymInt)
                 and isinstance(e := env.replace(x.node.expr), sympy.Symbol)}
        # the symbols of tensors' sizes (a backward's SymInt inputs are its images' sizes)
        sized = {f for x in inputs if isinstance(x, torch.Tensor) for v in x.shape
                 if isinstance(v, torch.SymInt) and not is_nested_int(v)
                 for f in env.replace(v.node.expr).free_symbols}
        for x in inputs:
            if is_nested_int(x):  # not a size of this graph (lower passes it on untouched)
                continue
            for leaf in size_leaves(x):
                if not isinstance(leaf, torch.SymInt):
                    continue
                expr = env.replace(leaf.node.expr)
                for s in sorted(expr.free_symbols, key=str):
                    if s in names or (s in solved and not isinstance(solved[s], int)):
                        continue
                    hint = _hint_of(env, s)
                    if hint is None:
                        # a size that depends on data, given by an input (a backward's gradient of
                        # `x[mask]`): a `u` symbol read from that input on entry (wrap.binds; an
                        # input whose sizes only contain it, `2*u0`, gives wrap nothing to read, and
                        # the graph is refused there), with the fallback hint as admit_unbacked's
                        lo, hi = _range_of(env, s)
                        coil = unbacked_symbol(sum(1 for f in facts if not f.backed))
                        names[s] = coil
                        facts.append(SymbolFacts(coil, _unbacked_hint(lo, hi), lo, hi, backed=False, entry=True))
                        continue
                    lo, hi = _range_of(env, s, sizes=False)
                    if s not in given or s in sized:  # an int's guards need not hold at a call (topk's k = 0)
                        lo = _guarded_least(relations, s, lo, hint)
                    if s in solved:
                        lo = hi = int(solved[s])
                    if hi is not None and hi == lo:  # specialized: a constant
                        names[s] = sympy.Integer(lo)
                        continue
                    if s in given and hint < 0:
                        # a SymInt input negative at the first call (arange's start, a negative
                        # pad): coil's symbols are at least 0, so the graph is compiled for this
                        # value, which `call`'s caller checks (another runs the graph eagerly)
                        names[s] = sympy.Integer(hint)
                        fixed[s] = hint
                        continue
                    if lo < 2 and s in given and hint >= 0:
                        # a SymInt input that may be 0 or 1 (an int a model keeps, a cache's length:
                        # Dynamo specializes a tensor's sizes 0 and 1, not an int's): a `u` symbol,
                        # which nothing takes to be at least 1, bound from the input on entry
                        # (GraphSizes.entry_symbols).  Where the ShapeEnv lets it be negative (it
                        # rarely knows a counter's sign), coil assumes it is not: a call passing a
                        # negative value runs the graph eagerly (SymbolFacts.assumed).
                        coil = unbacked_symbol(sum(1 for f in facts if not f.backed))
                        names[s] = coil
                        facts.append(SymbolFacts(coil, hint, max(lo, 0), hi, backed=False, assumed=lo < 0))
                        continue
                    if lo < 2:  # kernels and proofs take every `s` symbol to be at least 2
                        shown = "-oo" if lo <= -2**63 else str(lo)
                        raise CoilError(f"size symbol {s} (in {expr}) may be {'negative' if lo < 0 else lo} (range "
                                        f"{shown}..{'oo' if hi is None else hi}): coil takes symbolic sizes of at "
                                        "least 2, or a SymInt input of at least 0", stage="lower")
                    coil = size_symbol(sum(1 for f in facts if f.backed))
                    names[s] = coil
                    facts.append(SymbolFacts(coil, hint, max(lo, 0), hi))
        for s, v in solved.items():  # a symbol solved for another's value: that value, renamed
            if not isinstance(v, int) and all(f in names for f in v.free_symbols):
                names[s] = sympy.expand(v.xreplace(names))
        facts.sort(key=lambda f: symbol_key(f.symbol))  # ShapeInfo's order: `s*`, then `u*`
        return cls(env, names, ShapeInfo(tuple(facts)), fixed)

    def _guarded_equalities(self, relations: Sequence[sympy.Basic]) -> list[sympy.Expr]:
        """The equalities among sizes that Dynamo's guards hold so far, `l - r` for
        each `Eq(l, r)` over coil's symbols (a guard over a symbol no input binds,
        or a function coil's sizes do not take, is left out).  Every call of the
        compiled graph satisfies them: Dynamo checks its guards first, and a
        guard taken later (by a decomposition in lower) is only not used.  Each
        relation's equality is remembered for the ShapeEnv under these names and
        facts (`_EQUALITIES`): a graph's sizes are mapped three times (the graph
        cache's two keys and lower), over the same growing list of guards.
        `relations`: the guards' relations (`_relations`), read once by `of`."""
        memo = _EQUALITIES.setdefault(self.env, {})
        names = (tuple(sorted(self.names.items(), key=str)), tuple(sorted(self.fixed.items(), key=str)),
                 self.shapes.facts)
        out = []
        for rel in relations:
            key = (names, rel)
            if key not in memo:
                memo[key] = self._equality(rel)
            d = memo[key]
            if d is not None:
                out.append(d)
        return out

    def _equality(self, rel: sympy.Basic) -> sympy.Expr | None:
        """The size that one of the guards' relations makes 0 (`_guarded_equalities`),
        or None: an `Ne`, an inequality the ranges do not make an equality, a
        relation over a size coil's sizes do not take."""
        if isinstance(rel, sympy.Ne):
            return None
        try:
            if isinstance(rel, sympy.Eq):
                d = self.expr(rel.lhs - rel.rhs)
            elif any(isinstance(v := self.names.get(f), sympy.Symbol) and is_unbacked_symbol(v)
                     for f in rel.free_symbols):
                return None  # an int input's or a data-dependent size's: Dynamo may not check it
            else:
                # an inequality the ranges make an equality: `Mod(4 - Mod(s0//2, 4), 4) <= 0`
                # (Swin's "was the image padded" at a size that was not), where the left
                # side is never below 0; `x < 1` of an x never below 0 is `x = 0`
                gap = self.expr(rel.rhs - rel.lhs)  # at least 0 (1 if strict) wherever the graph runs
                least = 1 if isinstance(rel, sympy.Lt) else 0
                if isinstance(gap, int) or self._above_at_hints(gap, least) or self.shapes.upper(gap) != least:
                    return None
                d = norm(gap - least)
        except CoilError:
            return None
        return None if isinstance(d, int) else d

    def admit_unbacked(self, val: Any) -> None:
        """Name the data-dependent symbols in an Extern's fake result (`(u0, 2)` of
        nonzero) `u0, u1, ...` in order of appearance, with their ranges from the
        ShapeEnv (which may start at 0) and the fallback hint UNBACKED_HINT clamped to
        the range (a hint steers speed decisions only).  A range of one value stays a
        symbol all the same: `call` checks it where it binds it, which it would not
        check as a constant.  A symbol of the ShapeEnv with a hint that no input
        binds stays unknown (`expr` refuses it)."""
        for leaf in (x for v in torch.utils._pytree.tree_leaves(val) for x in size_leaves(v)):
            if not isinstance(leaf, torch.SymInt):
                continue
            env = self.env if self.env is not None else leaf.node.shape_env
            expr = env.replace(leaf.node.expr)
            for s in sorted(expr.free_symbols, key=str):
                if s in self.names or _hint_of(env, s) is not None:
                    continue
                lo, hi = _range_of(env, s)
                self.env = env
                coil = unbacked_symbol(sum(1 for f in self.shapes.facts if is_unbacked_symbol(f.symbol)))
                self.names[s] = coil
                self.shapes = ShapeInfo((*self.shapes.facts, SymbolFacts(coil, _unbacked_hint(lo, hi), lo, hi,
                                                                         backed=False)))

    def size(self, v: Any) -> Size:
        """A size as coil keeps it: an int, or an expression over coil's symbols."""
        if isinstance(v, torch.SymInt):
            node = v.node
            if node.is_constant() if hasattr(node, "is_constant") else False:
                return int(node.constant)  # type: ignore[no-any-return]
            if self.env is None:
                raise CoilError(f"a symbolic size {v} without its ShapeEnv", stage="lower")
            return self.expr(self.env.replace(node.expr))
        if isinstance(v, sympy.Expr):
            return norm(v)
        if isinstance(v, bool):
            raise TypeError("a bool is not a size")
        return int(v)

    def sizes(self, values: Iterable[Any]) -> tuple[Size, ...]:
        return tuple(self.size(v) for v in values)

    def expr(self, e: sympy.Expr) -> Size:
        """A ShapeEnv expression over coil's symbols, torch's integer functions as
        coil's."""
        from torch.utils._sympy import functions as tf

        missing = [s for s in e.free_symbols if s not in self.names]
        if missing:
            raise CoilError(f"size {e} has symbols no graph input binds ({sorted(map(str, missing))})", stage="lower")
        out = e.xreplace(self.names)
        out = out.replace(tf.FloorDiv, lambda a, b: FloorDiv(a, b))
        out = out.replace(tf.CleanDiv, lambda a, b: FloorDiv(a, b))
        out = out.replace(tf.ModularIndexing, lambda a, b, c: ModularIndexing(a, b, c))
        out = out.replace(tf.PythonMod, lambda a, b: ModularIndexing(a, 1, b))
        out = out.replace(tf.Mod, lambda a, b: ModularIndexing(a, 1, b))
        # ceil(a / b) of ints (32*ceil(s / 32): a size padded to a multiple)
        out = out.replace(lambda x: isinstance(x, tf.CeilToInt) and isinstance(x.args[0], tf.IntTrueDiv),
                          lambda x: FloorDiv(x.args[0].args[0] + x.args[0].args[1] - 1, x.args[0].args[1]))
        out = out.replace(tf.CeilDiv, lambda a, b: FloorDiv(a + b - 1, b))
        # an int of a float of sizes (TruncToInt(1.5*ToFloat(s0)): interpolate's size at a
        # scale factor), where the float is exactly a ratio of sizes (_rounded_size)
        for fn, name in ((tf.TruncToInt, "trunc"), (tf.FloorToInt, "floor"), (tf.CeilToInt, "ceil")):
            out = out.replace(fn, lambda a, name=name: _rounded_size(name, _sympy_rational(a, e)))
        # max/min of sizes where one side is provably the larger for every size (a
        # contiguous stride max(1, n) of an n never 0): that side
        out = self.shapes.decide_extremes(out, by_rules=True)
        out = out.replace(tf.Max, lambda *a: sympy.Max(*a)).replace(tf.Min, lambda *a: sympy.Min(*a))
        bad = [f for f in out.atoms(sympy.Function) if not isinstance(f, (FloorDiv, ModularIndexing))]
        if bad:
            raise CoilError(f"size {e} uses {type(bad[0]).__name__}, which coil's sizes do not take yet",
                            stage="lower")
        # one spelling for sizes that Dynamo's guards make equal ((s0//8 - 1)//2 and s0//16)
        out = self.shapes.reduce(norm(out))
        if not isinstance(out, int) and out.has(sympy.Max, sympy.Min):
            # a max the rules made decidable: Max(1, (h + pad)//(((h + pad)//4))) of Swin's
            # windows is Max(1, s1//8) once a guard made pad 0
            out = self.simplify(out)
        return out

    def _above_at_hints(self, gap: sympy.Expr, least: int) -> bool:
        """Whether `gap` exceeds `least` at the hints: then its greatest value over
        the ranges does too, and the guard is no equality (found without bounding
        it, which takes a tenth of a second for one of Swin's paddings)."""
        try:
            return self.shapes.hint(gap) > least
        except (KeyError, ValueError, TypeError):
            return False

    def simplify(self, e: Size) -> Size:
        """A size coil computed (Python arithmetic on sizes in the graph) as
        `expr` writes sizes: each max or min one side of which is provably the
        larger replaced by it, then reduced by the guard rules."""
        for _ in range(2):  # twice: a rule's value may bring a max that is then decidable
            if isinstance(e, int):
                return e
            if e.has(sympy.Max, sympy.Min):
                e = norm(self.shapes.decide_extremes(e, by_rules=True))
            e = self.shapes.reduce(e)
        return e

    def layout_parts(self, t: torch.Tensor) -> tuple[tuple[Size, ...], tuple[Size, ...], Size]:
        return self.sizes(t.shape), self.sizes(t.stride()), self.size(t.storage_offset())


STATIC = SizeMap()


# comparisons of sizes: the conditions Dynamo's runtime asserts check (`u0 >= 0`)
_COMPARISONS: dict[Any, Callable[[Any, Any], Any]] = {
    operator.ge: sympy.Ge, operator.gt: sympy.Gt, operator.le: sympy.Le, operator.lt: sympy.Lt,
    operator.eq: sympy.Eq, operator.ne: sympy.Ne}


# arithmetic of sizes, as the graph's Python size operations spell it
_ARITHMETIC: dict[Any, Callable[..., Any]] = {
    operator.mul: lambda a, b: a * b, operator.add: lambda a, b: a + b, operator.sub: lambda a, b: a - b,
    operator.neg: lambda a: -a, operator.pos: lambda a: a,
    operator.floordiv: lambda a, b: a // b if isinstance(a, int) and isinstance(b, int) else FloorDiv(a, b),
    operator.mod: lambda a, b: a % b if isinstance(a, int) and isinstance(b, int) else ModularIndexing(a, 1, b),
    # torch's refs compute strides with them (lerp of a transposed operand)
    torch.sym_max: lambda a, b: max(a, b) if isinstance(a, int) and isinstance(b, int) else sympy.Max(a, b),
    torch.sym_min: lambda a, b: min(a, b) if isinstance(a, int) and isinstance(b, int) else sympy.Min(a, b),
    # a size to a power that is an int of at least 0 (a float power is _float_arith's)
    operator.pow: lambda a, b: a ** b if isinstance(b, int) and b >= 0 else None}


_FLOAT_OPS = {operator.truediv: "truediv", operator.mul: "mul", operator.add: "add", operator.sub: "sub",
              operator.pow: "pow"}  # pow: sdpa's scale, sym_float(head_dim) ** 0.5


def _float_value(v: Any) -> Any:
    """A number, a size, or a float value of sizes, as a float64 expression."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Constant(float(v), torch.float64)
    if isinstance(v, sympy.Expr):
        return Cast(IndexExpr(v), torch.float64)
    return v if v.dtype == torch.float64 else Cast(v, torch.float64)


def is_float_size(v: Any) -> bool:
    """A float computed from sizes (`sym_float(s0)`, `s0 / 2`): a float64 kernel
    expression that reads no tensor, which pointwise lowerings take as a scalar."""
    return isinstance(v, (Op, Cast)) and v.dtype == torch.float64


def _float_arith(target: Any, args: Sequence[Any]) -> Any:
    """Python float arithmetic on sizes (`sym_float(s0)`, `s0 / 2`, `1.0 * s0`):
    a float64 expression of the sizes; plain numbers stay numbers; None for
    anything else."""

    def operand(a: Any) -> bool:
        return (isinstance(a, (int, float, sympy.Expr)) and not isinstance(a, bool)) or is_float_size(a)

    if target is torch.sym_float and len(args) == 1 and operand(args[0]):
        return float(args[0]) if isinstance(args[0], (int, float)) else _float_value(args[0])
    name = _FLOAT_OPS.get(target)
    if name is None or len(args) != 2 or not all(operand(a) for a in args):
        return None
    if name != "truediv" and not any(isinstance(a, float) or is_float_size(a) for a in args) \
            and not (name == "pow" and isinstance(args[1], int) and args[1] < 0):
        return None  # int arithmetic of sizes: size_arith's (s0 ** -1 is a float, as in Python)
    if all(isinstance(a, (int, float)) for a in args):
        return target(*args)
    return Op(name, (_float_value(args[0]), _float_value(args[1])), torch.float64)


# a float constant taken exactly in a size only with a denominator at most this (1.5 = 3/2,
# 0.25): its product with a size below 2^32 is then exact in float64, as Python computed it
_EXACT_DENOMINATOR = 1 << 20


def _exact_rational(v: Any, top: bool = True) -> sympy.Expr | None:
    """A float value of sizes as the exact rational expression of the sizes it
    equals (`sym_float(s0) * 1.5` -> 3*s0/2), where every step Python took in
    float64 was exact (sizes below 2^32 times constants of small denominators),
    but for a last division, whose rounding cannot carry a ratio of sizes below
    2^20 across an integer; else None (`s0 * 0.6666666666666666`, `s0 / 3 * 3`)."""
    if isinstance(v, Constant):
        r = sympy.Rational(v.value) if isinstance(v.value, (int, float)) and v.value == v.value else None
        return r if r is not None and r.q <= _EXACT_DENOMINATOR and abs(r.p) < 1 << 40 else None
    if isinstance(v, Cast) and isinstance(v.arg, IndexExpr):
        return v.arg.expr
    if isinstance(v, Cast):
        return _exact_rational(v.arg, top)
    if isinstance(v, Op) and v.name in ("add", "sub", "mul", "truediv") and len(v.args) == 2:
        a, b = (_exact_rational(x, False) for x in v.args)
        if a is None or b is None:
            return None
        exact = b.is_Integer and b > 0 and (int(b) & (int(b) - 1)) == 0  # by a power of two
        if v.name == "truediv" and (b == 0 or not (top or exact)):
            return None  # an inexact quotient that later steps would carry on with
        return {"add": a + b, "sub": a - b, "mul": a * b, "truediv": a / b}[v.name]
    return None


# Python's float -> int of a value of sizes (math.trunc(sym_float(h) * 1.5): interpolate's
# output size at a scale factor)
_ROUNDINGS: dict[Any, str] = {math.trunc: "trunc", math.floor: "floor", math.ceil: "ceil", torch.sym_int: "sym_int"}


def _sympy_rational(a: sympy.Expr, whole: sympy.Expr) -> sympy.Expr:
    """A ShapeEnv float expression of sizes (ToFloat(s0)*1.5, FloatTrueDiv) as the
    exact rational it equals (`_exact_rational`'s rule for its float constants); a
    CoilError where it is not exact."""
    from torch.utils._sympy import functions as tf

    divisions = [d for d in a.atoms(tf.FloatTrueDiv, tf.IntTrueDiv) if d is not a and not _by_power_of_two(d)]
    if divisions:  # an inexact quotient that later steps carry on with
        raise CoilError(f"size {whole}: a float division inside a float of sizes", stage="lower")
    out = a.replace(tf.ToFloat, lambda x: x).replace(tf.FloatTrueDiv, lambda x, y: x / y)
    out = out.replace(tf.IntTrueDiv, lambda x, y: x / y)
    for f in out.atoms(sympy.Float):
        r = sympy.Rational(f)
        if r.q > _EXACT_DENOMINATOR or abs(r.p) >= 1 << 40:
            raise CoilError(f"size {whole}: the float {f} is not exact in it", stage="lower")
        out = out.xreplace({f: r})
    bad = [g for g in out.atoms(sympy.Function) if not isinstance(g, (FloorDiv, ModularIndexing))]
    if bad:
        raise CoilError(f"size {whole} uses {type(bad[0]).__name__} under a float", stage="lower")
    return out


def _by_power_of_two(d: sympy.Expr) -> bool:
    """A division by a power of two (s0 / 4, x / 0.25): exact in binary floating
    point, so later steps may carry on with its quotient."""
    q = d.args[1]
    if not q.is_number or q == 0:
        return False
    r = sympy.Rational(q) if isinstance(q, sympy.Float) else q
    if not isinstance(r, sympy.Rational):
        return False
    p, den = abs(int(r.p)), int(r.q)
    return (p == 1 or den == 1) and p & (p - 1) == 0 and den & (den - 1) == 0


def _nonneg_size(e: sympy.Expr) -> bool:
    """Provably at least 0: a sum or product of sizes (symbols, numbers at least 0)
    and of whole parts of them."""
    if e.is_number:
        return bool(e >= 0)
    if isinstance(e, sympy.Symbol):
        return True  # a size symbol
    if isinstance(e, (sympy.Add, sympy.Mul)):
        return all(_nonneg_size(a) for a in e.args)
    if isinstance(e, FloorDiv):
        return _nonneg_size(e.args[0]) and _nonneg_size(e.args[1])
    return False


def _rounded_size(name: str, v: sympy.Expr) -> sympy.Expr:
    """floor / trunc / ceil of an exact rational expression of sizes, as a size."""
    p, q = sympy.fraction(sympy.together(sympy.expand(v)))
    p, q = sympy.expand(p), sympy.expand(q)
    if q.is_number and q < 0:
        p, q = -p, -q
    if not (q.is_positive or (q.free_symbols and _nonneg_size(q))):
        raise CoilError(f"{name} of {v}: a denominator that may be 0 or negative", stage="lower")
    if name in ("trunc", "sym_int") and not _nonneg_size(p):
        raise CoilError(f"{name} of {v}, which may be negative", stage="lower")
    if q == 1:
        return p
    return FloorDiv(p + q - 1, q) if name == "ceil" else FloorDiv(p, q)


def _rounded(target: Any, args: Sequence[Any]) -> Any:
    """`math.trunc` / `math.floor` / `math.ceil` / `torch.sym_int` of a float value
    of sizes as an integer size, where `_exact_rational` takes it exactly (a ratio
    p / q of sizes with a whole or size denominator): floor is FloorDiv(p, q),
    trunc too where p and q cannot be negative (sizes are at least 0), ceil
    FloorDiv(p + q - 1, q).  None for anything else; a CoilError where the value
    is not exact (lower then refuses the graph, which runs eagerly)."""
    name = _ROUNDINGS.get(target)
    if name is None or len(args) != 1 or not is_float_size(args[0]):
        return None
    v = _exact_rational(args[0])
    if v is None:
        raise CoilError(f"{name} of a float of sizes that float64 does not hold exactly ({args[0]}): "
                        "not a size coil computes", stage="lower")
    return norm(_rounded_size(name, v))


def size_arith(target: Any, args: Sequence[Any]) -> Any:
    """The value of a Python size operation (`operator.mul` of two sizes, ...) on
    coil sizes, or a comparison of sizes as a sympy condition; None when `target`
    is not one."""
    compare = _COMPARISONS.get(target)
    if compare is not None and len(args) == 2 and all(isinstance(a, (int, sympy.Expr)) and not isinstance(a, bool)
                                                      for a in args):
        v = compare(*(sympy.sympify(a) for a in args))  # a condition on sizes (what an assert checks)
        return v if isinstance(v, (sympy.logic.boolalg.BooleanAtom, sympy.core.relational.Relational)) else None
    if target is torch.sym_sum and len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = (sum(args[0][1:], args[0][0]) if args[0] else 0,)  # a sum of sizes (Dynamo folds `a + b + c` into one)
        target = operator.pos
    if (f := _float_arith(target, args)) is not None:
        return f
    if (r := _rounded(target, args)) is not None:
        return r
    fn = _ARITHMETIC.get(target)
    if fn is None or not all(isinstance(a, (int, sympy.Expr)) and not isinstance(a, bool) for a in args):
        return None
    v = fn(*args)
    if v is None:
        return None
    return v if isinstance(v, int) else norm(sympy.expand(v) if not v.has(FloorDiv, ModularIndexing) else v)
