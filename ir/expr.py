"""Loop-body expressions: the data that replaces Inductor's `inner_fn` closures.

Grammar::

    Expr ::= Load(name, index, dtype)        read element `index` (logical, one sympy
                                              expression per dim) of node `name`
           | Constant(value, dtype)
           | IndexExpr(expr, dtype)           an integer computed from loop symbols
           | Op(name, args, dtype)            name in OP_NAMES
           | Cast(arg, dtype)

Loop symbols are `x0, x1, ...` (a node's output index) and `r0, r1, ...` (its
reduction index).  Every node is a frozen, hash-cached value: equal subtrees are
equal, so a dict keyed on subtrees is common-subexpression elimination.

`evaluate(expr, handler)` visits each distinct subtree once, children first, and
calls one handler method per node kind.  The handler is an argument, never global
state: the same body yields deps, Triton lines, C++ lines or torch tensors.
"""

from __future__ import annotations

from typing import Callable, Protocol, TypeVar, Union

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


def _index_tuple(value: object) -> tuple[sympy.Expr, ...]:
    return tuple(sympy.sympify(v) for v in value)  # type: ignore[union-attr]


@attrs.frozen(cache_hash=True)
class Load:
    name: str
    index: tuple[sympy.Expr, ...] = attrs.field(converter=_index_tuple)
    dtype: torch.dtype


@attrs.frozen(cache_hash=True)
class Constant:
    value: Union[bool, int, float]
    dtype: torch.dtype


@attrs.frozen(cache_hash=True)
class IndexExpr:
    expr: sympy.Expr = attrs.field(converter=sympy.sympify)
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


Expr = Union[Load, Constant, IndexExpr, Op, Cast]


class OpsHandler(Protocol[T]):
    """What `evaluate` calls; one method per node kind.  `op` receives the already
    evaluated arguments."""

    def load(self, node: Load) -> T: ...

    def constant(self, node: Constant) -> T: ...

    def index_expr(self, node: IndexExpr) -> T: ...

    def op(self, node: Op, args: tuple[T, ...]) -> T: ...

    def cast(self, node: Cast, arg: T) -> T: ...


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Cast):
        return (e.arg,)
    return ()


def evaluate(expr: Expr, handler: OpsHandler[T], memo: dict[Expr, T] | None = None) -> T:
    """Post-order walk calling `handler` once per distinct subtree.  Pass the same
    `memo` to several calls to share results across bodies (CSE across the nodes of
    one kernel)."""
    memo = {} if memo is None else memo
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, expanded = stack.pop()
        if e in memo:
            continue
        kids = children(e)
        if not expanded and kids:
            stack.append((e, True))
            stack.extend((k, False) for k in reversed(kids) if k not in memo)
            continue
        match e:
            case Load():
                memo[e] = handler.load(e)
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
    """Distinct subtrees, children before parents."""
    order: list[Expr] = []

    class _Collect:
        def load(self, node: Load) -> None:
            order.append(node)

        def constant(self, node: Constant) -> None:
            order.append(node)

        def index_expr(self, node: IndexExpr) -> None:
            order.append(node)

        def op(self, node: Op, args: tuple[None, ...]) -> None:
            order.append(node)

        def cast(self, node: Cast, arg: None) -> None:
            order.append(node)

    evaluate(expr, _Collect())
    return order


def loads(expr: Expr) -> list[Load]:
    return [e for e in walk(expr) if isinstance(e, Load)]


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

        def op(self, node: Op, args: tuple[Expr, ...]) -> Expr:
            new = node if args == node.args else Op(node.name, args, node.dtype)
            out = fn(new)
            return new if out is None else out

        def cast(self, node: Cast, arg: Expr) -> Expr:
            new = node if arg is node.arg else Cast(arg, node.dtype)
            out = fn(new)
            return new if out is None else out

    return evaluate(expr, _Rebuild(), memo)  # type: ignore[arg-type]


def substitute_symbols(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr]) -> Expr:
    """Rename loop symbols inside every index of the body."""
    if not mapping:
        return expr

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Load):
            return Load(node.name, tuple(i.xreplace(mapping) for i in node.index), node.dtype)
        if isinstance(node, IndexExpr):
            return IndexExpr(node.expr.xreplace(mapping), node.dtype)
        return None

    return rewrite(expr, fn)


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
