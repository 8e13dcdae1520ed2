"""Loop-body expressions: the data that replaces Inductor's `inner_fn` closures.

Grammar::

    Expr ::= Load(name, index, dtype)        read element `index` (logical, one sympy
                                              expression per dim) of node `name`
           | IndirectLoad(name, index, dtype, values, sizes)
                                              read `name` at an index that also uses
                                              ind0, ind1, ...: ind_k is values[k] (an
                                              integer Expr, a child), wrapped once if
                                              negative (v < 0 ? v + sizes[k] : v)
           | Constant(value, dtype)
           | IndexExpr(expr, dtype)           an integer computed from loop symbols
           | Op(name, args, dtype)            name in OP_NAMES
           | Cast(arg, dtype)

Loop symbols are `x0, x1, ...` (a node's output index) and `r0, r1, ...` (its
reduction index).  `ind0, ind1, ...` appear only in an IndirectLoad's index and
are bound by that node's own values (so equal subtrees still mean equal values).
Backends clamp a wrapped indirect index into [0, size) so no read leaves the
buffer; eager would raise on such an index instead.  Every node is a frozen,
hash-cached value: equal subtrees are equal, so a dict keyed on subtrees is
common-subexpression elimination.

`evaluate(expr, handler)` visits each distinct subtree once, children first, and
calls one handler method per node kind.  The handler is an argument, never global
state: the same body yields deps, Triton lines, C++ lines or torch tensors.
"""

from __future__ import annotations

from typing import Callable, Container, Iterable, Iterator, Protocol, TypeVar, Union

import attrs
import sympy
import torch

T = TypeVar("T")

# The closed set of pointwise operations a body may use.  Every backend handler
# implements each of them; `verify` rejects any other name.
UNARY_OPS = frozenset(
    """neg abs reciprocal sqrt rsqrt exp exp2 expm1 log log1p log2 sin cos tan tanh
    sigmoid erf relu sign floor ceil round trunc logical_not bitwise_not isnan isinf
    """.split()
)
BINARY_OPS = frozenset(
    """add sub mul truediv floordiv truncdiv fmod remainder pow maximum minimum
    eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or
    bitwise_xor""".split()
)
TERNARY_OPS = frozenset({"where"})
OP_NAMES = UNARY_OPS | BINARY_OPS | TERNARY_OPS
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf"})
LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor", "logical_not"})

REDUCTION_TYPES = frozenset(
    {"sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford_m2"}
)


def _index_tuple(value: Iterable[object]) -> tuple[sympy.Expr, ...]:
    return tuple(sympy.sympify(v) for v in value)


def _sympy(value: object) -> sympy.Expr:
    return sympy.sympify(value)


@attrs.frozen(cache_hash=True)
class Load:
    name: str
    index: tuple[sympy.Expr, ...] = attrs.field(converter=_index_tuple)
    dtype: torch.dtype


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen(cache_hash=True)
class IndirectLoad:
    """A load at a data-dependent index (Inductor's `ops.indirect_indexing` + load):
    `index` may use `indsym(k)` for k < len(values), standing for values[k]
    wrapped by sizes[k] (the extent of the dimension it indexes)."""

    name: str
    index: tuple[sympy.Expr, ...] = attrs.field(converter=_index_tuple)
    dtype: torch.dtype
    values: tuple["Expr", ...] = attrs.field()
    sizes: tuple[int, ...] = attrs.field(converter=_int_tuple)

    @values.validator
    def _ints(self, _attr: object, value: tuple["Expr", ...]) -> None:
        for v in value:
            if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
                raise ValueError(f"indirect index of dtype {v.dtype}: must be an integer")

    @sizes.validator
    def _paired(self, _attr: object, value: tuple[int, ...]) -> None:
        if len(value) != len(self.values):
            raise ValueError(f"{len(self.values)} indirect values but {len(value)} sizes")


@attrs.frozen(cache_hash=True)
class Constant:
    value: Union[bool, int, float]
    dtype: torch.dtype


@attrs.frozen(cache_hash=True)
class IndexExpr:
    expr: sympy.Expr = attrs.field(converter=_sympy)
    dtype: torch.dtype = torch.int64


@attrs.frozen(cache_hash=True)
class Op:
    name: str = attrs.field()
    args: tuple["Expr", ...]
    dtype: torch.dtype

    @name.validator
    def _known(self, _attr: object, value: str) -> None:
        if value not in OP_NAMES:
            raise ValueError(f"unknown op {value!r}")


@attrs.frozen(cache_hash=True)
class Cast:
    arg: "Expr"
    dtype: torch.dtype


Expr = Union[Load, IndirectLoad, Constant, IndexExpr, Op, Cast]


class OpsHandler(Protocol[T]):
    """What `evaluate` calls; one method per node kind.  `op`, `cast` and
    `indirect_load` receive their already evaluated children."""

    def load(self, node: Load) -> T: ...

    def indirect_load(self, node: IndirectLoad, values: tuple[T, ...]) -> T: ...

    def constant(self, node: Constant) -> T: ...

    def index_expr(self, node: IndexExpr) -> T: ...

    def op(self, node: Op, args: tuple[T, ...]) -> T: ...

    def cast(self, node: Cast, arg: T) -> T: ...


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Cast):
        return (e.arg,)
    if isinstance(e, IndirectLoad):
        return e.values
    return ()


def _post_order(expr: Expr, done: Container[Expr]) -> Iterator[Expr]:
    """Distinct subtrees not in `done`, children before parents; the caller puts
    each one it is given into `done` before asking for the next."""
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, expanded = stack.pop()
        if e in done:
            continue
        kids = children(e)
        if not expanded and kids:
            stack.append((e, True))
            stack.extend((k, False) for k in reversed(kids) if k not in done)
            continue
        yield e


def evaluate(expr: Expr, handler: OpsHandler[T], memo: dict[Expr, T] | None = None) -> T:
    """Post-order walk calling `handler` once per distinct subtree.  Pass the same
    `memo` to several calls to share results across bodies (CSE across the nodes of
    one kernel)."""
    memo = {} if memo is None else memo
    for e in _post_order(expr, memo):
        match e:
            case Load():
                memo[e] = handler.load(e)
            case IndirectLoad():
                memo[e] = handler.indirect_load(e, tuple(memo[v] for v in e.values))
            case Constant():
                memo[e] = handler.constant(e)
            case IndexExpr():
                memo[e] = handler.index_expr(e)
            case Op():
                memo[e] = handler.op(e, tuple(memo[a] for a in e.args))
            case Cast():
                memo[e] = handler.cast(e, memo[e.arg])
    return memo[expr]


def walk(expr: Expr) -> list[Expr]:
    """Distinct subtrees, children before parents (the order `evaluate` visits them)."""
    order: list[Expr] = []
    seen: set[Expr] = set()
    for e in _post_order(expr, seen):
        seen.add(e)
        order.append(e)
    return order


def loads(expr: Expr) -> list[Load]:
    """The direct loads (an IndirectLoad is not one: see `indirect_loads`)."""
    return [e for e in walk(expr) if isinstance(e, Load)]


def indirect_loads(expr: Expr) -> list[IndirectLoad]:
    return [e for e in walk(expr) if isinstance(e, IndirectLoad)]


def read_names(expr: Expr) -> list[str]:
    """Every node the body reads, directly or indirectly, in first-read order."""
    return list(dict.fromkeys(e.name for e in walk(expr) if isinstance(e, (Load, IndirectLoad))))


def count_ops(expr: Expr) -> int:
    return sum(1 for e in walk(expr) if isinstance(e, (Op, Cast)))


def rewrite(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rebuild: `fn` sees each node with rebuilt children and returns a
    replacement or None to keep it.  Shared subtrees are rebuilt once."""
    memo: dict[Expr, Expr] = {}

    class _Rebuild:
        def _leaf(self, node: Expr) -> Expr:
            out = fn(node)
            return node if out is None else out

        load = constant = index_expr = _leaf

        def indirect_load(self, node: IndirectLoad, values: tuple[Expr, ...]) -> Expr:
            new = node if values == node.values else attrs.evolve(node, values=values)
            out = fn(new)
            return new if out is None else out

        def op(self, node: Op, args: tuple[Expr, ...]) -> Expr:
            new = node if args == node.args else Op(node.name, args, node.dtype)
            out = fn(new)
            return new if out is None else out

        def cast(self, node: Cast, arg: Expr) -> Expr:
            new = node if arg is node.arg else Cast(arg, node.dtype)
            out = fn(new)
            return new if out is None else out

    return evaluate(expr, _Rebuild(), memo)  # type: ignore[arg-type]


def substitute_symbols(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr],
                       bound: tuple[tuple[Expr, ...], tuple[int, ...]] = ((), ())) -> Expr:
    """Rename loop symbols inside every index of the body.  With `bound` =
    (values, sizes), the replacements may use ind0, ind1, ... standing for those
    values (the index of an IndirectLoad being inlined): every load whose index
    then uses them becomes an IndirectLoad carrying them, and an IndexExpr that
    does becomes integer Ops on the values."""
    if not mapping:
        return expr
    values, sizes = bound

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Load):
            idx = tuple(i.xreplace(mapping) for i in node.index)
            if values and any(is_indirect(i) for i in idx):
                return _compact(node.name, idx, node.dtype, values, sizes)
            return Load(node.name, idx, node.dtype)
        if isinstance(node, IndirectLoad):
            k = len(node.values)
            m = mapping if not values else {
                s: e.xreplace({indsym(j): indsym(j + k) for j in range(len(values))}) for s, e in mapping.items()}
            idx = tuple(i.xreplace(m) for i in node.index)
            return _compact(node.name, idx, node.dtype, node.values + values, node.sizes + sizes)
        if isinstance(node, IndexExpr):
            e = node.expr.xreplace(mapping)
            if values and is_indirect(e):
                return _index_ops(e, values, sizes, node.dtype)
            return IndexExpr(e, node.dtype)
        return None

    return rewrite(expr, fn)


def indsym(k: int) -> sympy.Symbol:
    """The k-th indirect index symbol (bound by an IndirectLoad's values[k])."""
    return sympy.Symbol(f"ind{k}", integer=True, nonnegative=True)


def ind_number(s: sympy.Symbol) -> int | None:
    """k for the symbol ind<k>, else None."""
    name = s.name
    return int(name[3:]) if name.startswith("ind") and name[3:].isdigit() else None


def is_indirect(e: sympy.Expr) -> bool:
    return any(ind_number(s) is not None for s in e.free_symbols)  # type: ignore[arg-type]


def _compact(name: str, index: tuple[sympy.Expr, ...], dtype: torch.dtype, values: tuple[Expr, ...],
             sizes: tuple[int, ...]) -> Expr:
    """An IndirectLoad keeping only the values its index uses, renumbered in
    order (a plain Load when it uses none)."""
    used = sorted({k for i in index for s in i.free_symbols if (k := ind_number(s)) is not None})  # type: ignore[arg-type]
    if not used:
        return Load(name, index, dtype)
    ren = {indsym(k): indsym(j) for j, k in enumerate(used)}
    return IndirectLoad(name, tuple(i.xreplace(ren) for i in index), dtype,
                        tuple(values[k] for k in used), tuple(sizes[k] for k in used))


def wrapped_index(value: Expr, size: int) -> Expr:
    """values[k] as the index it stands for, as integer Ops: int64, negatives
    wrapped once (what ind_k means)."""
    v = value if value.dtype == torch.int64 else Cast(value, torch.int64)
    zero, n = Constant(0, torch.int64), Constant(int(size), torch.int64)
    return Op("where", (Op("lt", (v, zero), torch.bool), Op("add", (v, n), torch.int64), v), torch.int64)


def _index_ops(e: sympy.Expr, values: tuple[Expr, ...], sizes: tuple[int, ...], dtype: torch.dtype) -> Expr:
    """An index expression over loop and indirect symbols as integer Ops: the
    parts without indirect symbols stay IndexExprs."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    def go(x: sympy.Expr) -> Expr:
        if not is_indirect(x):
            return IndexExpr(x, torch.int64)
        if isinstance(x, sympy.Symbol):
            k = ind_number(x)
            assert k is not None
            return wrapped_index(values[k], sizes[k])
        if isinstance(x, (sympy.Add, sympy.Mul)):
            plain = [a for a in x.args if not is_indirect(a)]
            parts = [go(a) for a in x.args if is_indirect(a)]
            if plain:
                parts.append(go(x.func(*plain)))
            name = "add" if isinstance(x, sympy.Add) else "mul"
            out = parts[0]
            for p in parts[1:]:
                out = Op(name, (out, p), torch.int64)
            return out
        if isinstance(x, FloorDiv):
            return Op("floordiv", (go(x.args[0]), go(x.args[1])), torch.int64)
        if isinstance(x, ModularIndexing):
            q = Op("floordiv", (go(x.args[0]), go(x.args[1])), torch.int64)
            return Op("remainder", (q, go(x.args[2])), torch.int64)
        if isinstance(x, sympy.Pow) and x.exp.is_Integer and int(x.exp) > 0:
            base = go(x.base)
            out = base
            for _ in range(int(x.exp) - 1):
                out = Op("mul", (out, base), torch.int64)
            return out
        raise ValueError(f"cannot express index {x} as ops")

    out = go(e)
    return out if dtype == torch.int64 else Cast(out, dtype)


def xsym(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"x{i}", integer=True, nonnegative=True)


def rsym(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{i}", integer=True, nonnegative=True)


def xsyms(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(xsym(i) for i in range(n))


def rsyms(n: int) -> tuple[sympy.Symbol, ...]:
    return tuple(rsym(i) for i in range(n))


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def show_expr(expr: Expr) -> list[str]:
    """Print a body as numbered temporaries; each distinct subtree prints once."""
    names: dict[Expr, str] = {}
    lines: list[str] = []

    def ref(e: Expr) -> str:
        if isinstance(e, Constant):
            return f"{e.value!r}"
        return names[e]

    for e in walk(expr):
        if isinstance(e, Constant):
            continue
        tmp = f"t{len(names)}"
        names[e] = tmp
        dt = dtype_name(e.dtype)
        match e:
            case Load():
                rhs = f"load {e.name}[{', '.join(str(i) for i in e.index)}]"
            case IndirectLoad():
                binds = ", ".join(f"{indsym(k)}={ref(v)} wrap {n}" for k, (v, n) in enumerate(zip(e.values, e.sizes)))
                rhs = f"load {e.name}[{', '.join(str(i) for i in e.index)}] with {binds}"
            case IndexExpr():
                rhs = f"index {e.expr}"
            case Op():
                rhs = f"{e.name}({', '.join(ref(a) for a in e.args)})"
            case Cast():
                rhs = f"cast({ref(e.arg)})"
        lines.append(f"{tmp}: {dt} = {rhs}")
    if isinstance(expr, Constant):
        lines.append(f"{expr.value!r}: {dtype_name(expr.dtype)}")
    return lines


def result_name(expr: Expr) -> str:
    return f"{expr.value!r}" if isinstance(expr, Constant) else f"t{len([e for e in walk(expr) if not isinstance(e, Constant)]) - 1}"
