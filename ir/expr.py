"""Loop-body expressions: the data that replaces Inductor's `inner_fn` closures.

Grammar::

    Expr ::= Load(name, index, dtype, mask)  read element `index` (logical, one sympy
                                              expression per dim) of node `name`
           | IndirectLoad(name, index, dtype, values, mask)
                                              read `name` at an index that also uses
                                              ind0, ind1, ...: ind_k is values[k], an
                                              index Check (a child): a position in
                                              [0, size) of the dim it indexes
           | Check(arg, error, size, dim, wrap, status, range)
                                              a run-time check eager makes: arg as an
                                              index into a dim of `size` (negatives
                                              wrapped when `wrap`), or (size 0) arg as
                                              a divisor that must not be 0
           | Constant(value, dtype)
           | IndexExpr(expr, dtype)           an integer computed from loop symbols
           | Op(name, args, dtype)            name in OP_NAMES
           | Cast(arg, dtype)

Loop symbols are `x0, x1, ...` (a node's output index) and `r0, r1, ...` (its
reduction index).  `ind0, ind1, ...` appear only in an IndirectLoad's index and
are bound by that node's own values (so equal subtrees still mean equal values).
Every indirect index goes through a Check, so an index eager would reject raises
eager's error (IndexError, RuntimeError) instead of being read, and no read
leaves its buffer; integer division checks its divisor the same way.  A Check's
`status` is the decision whether the test is made at run time ("checked") or
value-range analysis (ir/bounds.py) proved it can never fail ("proven"); its
`range` is what the analysis found for the argument, the reason.

A load's `mask` (None, or a bool Expr: a child) says where it reads: where the
mask is false the load touches no memory and yields 0 of its dtype, so its
index need be inside the buffer only where the mask holds (Inductor's masked
`tl.load(ptr + idx, cond, other=0)`).  Inlining a masked load (realize) carries
the mask into every load of the inlined body and keeps its checks from failing
where it is false (`under_mask`).

Every node is a frozen, hash-cached value: equal subtrees are equal, so a dict
keyed on subtrees is common-subexpression elimination.

`evaluate(expr, handler)` visits each distinct subtree once, children first, and
calls one handler method per node kind.  The handler is an argument, never global
state: the same body yields deps, Triton lines, C++ lines or torch tensors.
"""

from __future__ import annotations

import functools
from typing import Callable, Container, Iterable, Iterator, Protocol, TypeVar, Union
from typing import cast as typed

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

# ops that divide: on integers, a zero divisor traps (coil checks it: a divisor Check)
DIVIDING_OPS = frozenset({"floordiv", "truncdiv", "fmod", "remainder", "truediv"})
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
    """Element `index` of `name`; with a `mask`, only where the mask is true (0
    elsewhere, and no memory touched there)."""

    name: str
    index: tuple[sympy.Expr, ...] = attrs.field(converter=_index_tuple)
    dtype: torch.dtype
    mask: "Expr | None" = None


@attrs.frozen(cache_hash=True)
class IndirectLoad:
    """A load at a data-dependent index (Inductor's `ops.indirect_indexing` + load):
    `index` may use `indsym(k)` for k < len(values), standing for values[k], an
    index Check whose value is a position in [0, values[k].size)."""

    name: str
    index: tuple[sympy.Expr, ...] = attrs.field(converter=_index_tuple)
    dtype: torch.dtype
    values: tuple["Check", ...] = attrs.field()
    mask: "Expr | None" = None

    @values.validator
    def _checked(self, _attr: object, value: tuple["Expr", ...]) -> None:
        for v in value:
            if not isinstance(v, Check) or v.kind != "index":
                raise ValueError(f"indirect index {type(v).__name__}: must be an index Check")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The extent of the dim each value indexes."""
        return tuple(v.size for v in self.values)


# eager's error for each kind of failed check: (exception, message); the message
# may name the bad value, the dim and its size
CHECK_ERRORS: dict[str, tuple[type[Exception], str]] = {
    "index": (IndexError, "index {value} is out of bounds for dimension {dim} with size {size}"),
    "gather": (RuntimeError, "index {value} is out of bounds for dimension {dim} with size {size}"),
    "index_select": (IndexError, "index out of range in self"),
    "index_select_dim1": (RuntimeError, "INDICES element is out of DATA bounds, id={value} axis_dim={size}"),
    "embedding": (IndexError, "index out of range in self"),
    "nll_loss": (IndexError, "Target {value} is out of bounds."),
    "division": (RuntimeError, "ZeroDivisionError"),
}
# the order fixes each error's number in generated code (0 means no error)
CHECK_ERROR_CODES: dict[str, int] = {name: i + 1 for i, name in enumerate(CHECK_ERRORS)}
CHECK_STATUS = ("checked", "proven")


def check_error(error: str, value: int | None, size: int | str, dim: int) -> Exception:
    """The exception eager raises for a failed check (`value` None: not known,
    e.g. from a device assert, and left out of the message; `size` a symbolic
    size's expression where a device assert cannot know its value)."""
    exc, template = CHECK_ERRORS[error]
    if value is None:
        template = template.replace(" {value}", "").replace("{value}", "?")
    return exc(template.format(value=value, dim=dim, size=size))


def _range(value: tuple[int, int] | None) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


@attrs.frozen(cache_hash=True)
class Check:
    """A test eager makes before it reads or divides, passing its argument on
    (Inductor's `ops.indirect_indexing(..., check=True)`; the zero test of integer
    division).

    An index check (size >= 1): `arg` indexes a dim of `size` elements; with
    `wrap`, negatives in [-size, 0) count from the end (x[idx]), else they fail
    too (gather, index_select, embedding).  Its value is the position, int64 in
    [0, size).  A divisor check (error "division", size 0): `arg`, an integer
    divisor, must not be 0; its value is `arg`.  When the test fails, the kernel
    raises `error` (a key of CHECK_ERRORS) for eager's op and dim `dim`, and goes
    on with a harmless value (position 0, divisor 1): no access leaves its buffer.

    `status` "checked": the test runs; "proven": value-range analysis showed it
    cannot fail, so no test is emitted.  `range` is the range the analysis found
    for `arg` (None before it ran, or when nothing is known): the reason."""

    arg: "Expr"
    error: str = attrs.field()
    size: int = 0
    dim: int = 0
    wrap: bool = False
    status: str = attrs.field(default="checked")
    range: tuple[int, int] | None = attrs.field(default=None, converter=_range)

    @error.validator
    def _known_error(self, _attr: object, value: str) -> None:
        if value not in CHECK_ERRORS:
            raise ValueError(f"unknown check error {value!r}")
        if (value == "division") != (self.size == 0):
            raise ValueError(f"check {value!r} of size {self.size}: a divisor check has size 0, an index check >= 1")
        dt = self.arg.dtype
        if dt.is_floating_point or dt.is_complex or dt == torch.bool:
            raise ValueError(f"check of a {dt} value: must be an integer")

    @status.validator
    def _known_status(self, _attr: object, value: str) -> None:
        if value not in CHECK_STATUS:
            raise ValueError(f"unknown check status {value!r}")

    @property
    def kind(self) -> str:
        return "divisor" if self.size == 0 else "index"

    @property
    def dtype(self) -> torch.dtype:
        return torch.int64 if self.size else self.arg.dtype

    @property
    def checked(self) -> bool:
        return self.status == "checked"

    @property
    def may_be_negative(self) -> bool:
        """Whether the argument of a wrapping index check may be below 0 (then
        the backends emit the wrap)."""
        return self.wrap and (self.range is None or self.range[0] < 0)


def _value_key(value: Union[bool, int, float]) -> object:
    """What a Constant's value compares and hashes by: a float by its repr, so -0.0
    is not 0.0 (Python's == says it is, and every memo keyed by expressions, such as
    the CSE across a kernel's nodes, would hand one the other's value) and NaN is
    itself."""
    return ("float", repr(value)) if isinstance(value, float) else value


@attrs.frozen(cache_hash=True)
class Constant:
    value: Union[bool, int, float] = attrs.field(eq=_value_key)
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


Expr = Union[Load, IndirectLoad, Check, Constant, IndexExpr, Op, Cast]


class OpsHandler(Protocol[T]):
    """What `evaluate` calls; one method per node kind.  `op`, `cast`, `check`
    and the loads receive their already evaluated children (a load's `mask`:
    None when it has none)."""

    def load(self, node: Load, mask: T | None) -> T: ...

    def indirect_load(self, node: IndirectLoad, values: tuple[T, ...], mask: T | None) -> T: ...

    def constant(self, node: Constant) -> T: ...

    def index_expr(self, node: IndexExpr) -> T: ...

    def op(self, node: Op, args: tuple[T, ...]) -> T: ...

    def cast(self, node: Cast, arg: T) -> T: ...

    def check(self, node: Check, arg: T) -> T: ...


class NoValues:
    """An OpsHandler[None] that computes nothing: the base of handlers that only
    record what a body reads or evaluates, overriding the methods they need."""

    def load(self, node: Load, mask: None) -> None:
        return None

    def indirect_load(self, node: IndirectLoad, values: tuple[None, ...], mask: None) -> None:
        return None

    def constant(self, node: Constant) -> None:
        return None

    def index_expr(self, node: IndexExpr) -> None:
        return None

    def op(self, node: Op, args: tuple[None, ...]) -> None:
        return None

    def cast(self, node: Cast, arg: None) -> None:
        return None

    def check(self, node: Check, arg: None) -> None:
        return None


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, (Cast, Check)):
        return (e.arg,)
    if isinstance(e, IndirectLoad):
        return e.values if e.mask is None else (*e.values, e.mask)
    if isinstance(e, Load) and e.mask is not None:
        return (e.mask,)
    return ()


def post_order(expr: Expr, done: Container[Expr],
               kids_of: Callable[[Expr], tuple[Expr, ...]] = children) -> Iterator[Expr]:
    """Distinct subtrees not in `done`, children (`kids_of`) before parents, without
    recursion (bodies can be chains thousands of ops deep); the caller puts each
    one it is given into `done` before asking for the next."""
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, expanded = stack.pop()
        if e in done:
            continue
        kids = kids_of(e)
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
    for e in post_order(expr, memo):
        match e:
            case Load():
                memo[e] = handler.load(e, None if e.mask is None else memo[e.mask])
            case IndirectLoad():
                memo[e] = handler.indirect_load(e, tuple(memo[v] for v in e.values),
                                                None if e.mask is None else memo[e.mask])
            case Constant():
                memo[e] = handler.constant(e)
            case IndexExpr():
                memo[e] = handler.index_expr(e)
            case Op():
                memo[e] = handler.op(e, tuple(memo[a] for a in e.args))
            case Cast():
                memo[e] = handler.cast(e, memo[e.arg])
            case Check():
                memo[e] = handler.check(e, memo[e.arg])
    return memo[expr]


def walk(expr: Expr) -> list[Expr]:
    """Distinct subtrees, children before parents (the order `evaluate` visits them)."""
    return list(_walked(expr))


# bodies are immutable and the passes walk the same ones many times (loads, reads,
# verification): MobileNetV2's training graphs walked 35561 bodies, 2 s, before this
@functools.lru_cache(maxsize=16384)
def _walked(expr: Expr) -> tuple[Expr, ...]:
    order: list[Expr] = []
    seen: set[Expr] = set()
    for e in post_order(expr, seen):
        seen.add(e)
        order.append(e)
    return tuple(order)


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
    return evaluate(expr, _Rebuild(fn), {})  # type: ignore[arg-type]


class _Rebuild:
    """rewrite's handler: each node with its rebuilt children, then `fn`'s say."""

    def __init__(self, fn: Callable[[Expr], Expr | None]) -> None:
        self.fn = fn

    def _leaf(self, node: Expr) -> Expr:
        out = self.fn(node)
        return node if out is None else out

    constant = index_expr = _leaf

    def load(self, node: Load, mask: Expr | None) -> Expr:
        new = node if mask is node.mask else attrs.evolve(node, mask=mask)
        out = self.fn(new)
        return new if out is None else out

    def indirect_load(self, node: IndirectLoad, values: tuple[Expr, ...], mask: Expr | None) -> Expr:
        # the validator rejects values that are not index Checks
        new = node
        if values != node.values or mask is not node.mask:
            new = attrs.evolve(node, values=typed(tuple[Check, ...], values), mask=mask)
        out = self.fn(new)
        return new if out is None else out

    def op(self, node: Op, args: tuple[Expr, ...]) -> Expr:
        new = node if args == node.args else Op(node.name, args, node.dtype)
        out = self.fn(new)
        return new if out is None else out

    def cast(self, node: Cast, arg: Expr) -> Expr:
        new = node if arg is node.arg else Cast(arg, node.dtype)
        out = self.fn(new)
        return new if out is None else out

    def check(self, node: Check, arg: Expr) -> Expr:
        new = node if arg is node.arg else attrs.evolve(node, arg=arg)
        out = self.fn(new)
        return new if out is None else out


def substitute_symbols(expr: Expr, mapping: dict[sympy.Symbol, sympy.Expr],
                       bound: tuple[tuple[Check, ...], tuple[int, ...]] = ((), ())) -> Expr:
    """Rename loop symbols inside every index of the body.  With `bound` =
    (values, sizes) of an IndirectLoad being inlined, the replacements may use
    ind0, ind1, ... standing for those values: every load whose index then uses
    them becomes an IndirectLoad carrying them, and an IndexExpr that does becomes
    integer Ops on the values.  A run-time check of the values that no longer
    appears (the inlined body ignores that position) is kept (`keep_checks`):
    eager indexed, so it must still raise."""
    if not mapping:
        return expr
    values = tuple(bound[0])

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Load):
            idx = tuple(i.xreplace(mapping) for i in node.index)
            if values and any(is_indirect(i) for i in idx):
                return _compact(node.name, idx, node.dtype, values, node.mask)
            return Load(node.name, idx, node.dtype, node.mask)
        if isinstance(node, IndirectLoad):
            k = len(node.values)
            m = mapping if not values else {
                s: e.xreplace({indsym(j): indsym(j + k) for j in range(len(values))}) for s, e in mapping.items()}
            idx = tuple(i.xreplace(m) for i in node.index)
            return _compact(node.name, idx, node.dtype, node.values + values, node.mask)
        if isinstance(node, IndexExpr):
            e = node.expr.xreplace(mapping)
            if values and is_indirect(e):
                return _index_ops(e, values, node.dtype)
            return IndexExpr(e, node.dtype)
        return None

    out = rewrite(expr, fn)
    return keep_checks(out, values) if values else out


def keep_checks(expr: Expr, checks: Iterable[Expr]) -> Expr:
    """`expr`, still making those of the run-time `checks` it does not contain:
    where(c == c and ..., expr, expr).  The condition is always true; what
    matters is that every backend evaluates it, and with it the checks."""
    inside = set(walk(expr))
    missing = [c for c in checks if isinstance(c, Check) and c.checked and c not in inside]
    if not missing:
        return expr
    cond: Expr | None = None
    for c in missing:
        test = Op("eq", (c, c), torch.bool)
        cond = test if cond is None else Op("logical_and", (cond, test), torch.bool)
    assert cond is not None
    return Op("where", (cond, expr, expr), expr.dtype)


def indsym(k: int) -> sympy.Symbol:
    """The k-th indirect index symbol (bound by an IndirectLoad's values[k])."""
    return sympy.Symbol(f"ind{k}", integer=True, nonnegative=True)


def ind_number(s: sympy.Symbol) -> int | None:
    """k for the symbol ind<k>, else None."""
    name = s.name
    return int(name[3:]) if name.startswith("ind") and name[3:].isdigit() else None


def is_indirect(e: sympy.Expr) -> bool:
    return any(ind_number(s) is not None for s in e.free_symbols)  # type: ignore[arg-type]


def _compact(name: str, index: tuple[sympy.Expr, ...], dtype: torch.dtype, values: tuple[Check, ...],
             mask: Expr | None = None) -> Expr:
    """An IndirectLoad keeping only the values its index uses, renumbered in
    order (a plain Load when it uses none)."""
    used = sorted({k for i in index for s in i.free_symbols if (k := ind_number(s)) is not None})  # type: ignore[arg-type]
    if not used:
        return Load(name, index, dtype, mask)
    ren = {indsym(k): indsym(j) for j, k in enumerate(used)}
    return IndirectLoad(name, tuple(i.xreplace(ren) for i in index), dtype, tuple(values[k] for k in used), mask)


def under_mask(expr: Expr, mask: Expr, inside: Callable[[Load], bool] = lambda _: False) -> Expr:
    """`expr` (an inlined body) evaluated only where `mask` holds: every load in
    it reads only there (its own mask and `mask`), and every run-time Check sees
    a harmless argument elsewhere (position 0, divisor 1), so the positions
    the mask excludes neither touch memory nor raise.  Its value where the mask
    is false is unspecified: a reader that needs the masked load's 0 wraps it
    in where(mask, ., 0) (`masked_value`).  A load of no mask of its own that
    reads inside its buffer wherever it runs (`inside`: a per-channel value
    under a pad's mask) keeps no mask: reading there is harmless, and a mask
    of another shape than the load's keeps GCC from vectorising the loop."""

    def both(own: Expr | None) -> Expr:
        return mask if own is None or own == mask else Op("logical_and", (mask, own), torch.bool)

    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Load) and node.mask is None and inside(node):
            return node
        if isinstance(node, (Load, IndirectLoad)):
            return attrs.evolve(node, mask=both(node.mask))
        if isinstance(node, Check) and node.kind == "divisor":
            # even a proven one: its proof assumed the unshifted positions
            return attrs.evolve(node, arg=Op("where", (mask, node.arg, Constant(1, node.arg.dtype)), node.arg.dtype))
        if isinstance(node, Check):  # position 0: what a load under `mask` gives already
            return attrs.evolve(node, arg=masked_value(node.arg, mask))
        return None

    return rewrite(expr, fn)


def masked_value(expr: Expr, mask: Expr) -> Expr:
    """The value a masked load whose body is `expr` gives: `expr` where `mask`
    holds, else 0 (no where when `expr` is already a load under that mask)."""
    if isinstance(expr, (Load, IndirectLoad)) and expr.mask == mask:
        return expr
    return Op("where", (mask, expr, zero(expr.dtype)), expr.dtype)


def zero(dtype: torch.dtype) -> Constant:
    """0 of `dtype`: what a masked load yields where its mask is false."""
    value: bool | int | float = False if dtype == torch.bool else 0.0 if dtype.is_floating_point else 0
    return Constant(value, dtype)


def _index_ops(e: sympy.Expr, values: tuple[Expr, ...], dtype: torch.dtype) -> Expr:
    """An index expression over loop and indirect symbols as integer Ops: ind_k
    is values[k] (an int64 position), the parts without indirect symbols stay
    IndexExprs."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    def go(x: sympy.Expr) -> Expr:
        if not is_indirect(x):
            return IndexExpr(x, torch.int64)
        if isinstance(x, sympy.Symbol):
            k = ind_number(x)
            assert k is not None
            return values[k]
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
                binds = ", ".join(f"{indsym(k)}={ref(v)}" for k, v in enumerate(e.values))
                rhs = f"load {e.name}[{', '.join(str(i) for i in e.index)}] with {binds}"
            case Check():
                rhs = show_check(e, ref(e.arg))
            case IndexExpr():
                rhs = f"index {e.expr}"
            case Op():
                rhs = f"{e.name}({', '.join(ref(a) for a in e.args)})"
            case Cast():
                rhs = f"cast({ref(e.arg)})"
        if isinstance(e, (Load, IndirectLoad)) and e.mask is not None:
            rhs += f" if {ref(e.mask)}"
        lines.append(f"{tmp}: {dt} = {rhs}")
    if isinstance(expr, Constant):
        lines.append(f"{expr.value!r}: {dtype_name(expr.dtype)}")
    return lines


def show_check(c: Check, arg: str) -> str:
    """`check(t2 in [0, 5) wrap, index dim 0): checked, range any int64`."""
    test = f"{arg} != 0" if c.kind == "divisor" else f"{arg} in [0, {c.size}){' wrap' if c.wrap else ''}"
    where = c.error if c.kind == "divisor" else f"{c.error} dim {c.dim}"
    if c.range is None:
        why = "range unknown"
    elif c.range == (int(torch.iinfo(c.arg.dtype).min), int(torch.iinfo(c.arg.dtype).max)):
        why = f"range any {dtype_name(c.arg.dtype)}"  # all the dtype holds: nothing known
    else:
        why = f"range [{c.range[0]}, {c.range[1]}]"
    return f"check({test}, {where}): {c.status}, {why}"


def result_name(expr: Expr) -> str:
    return f"{expr.value!r}" if isinstance(expr, Constant) else f"t{len([e for e in walk(expr) if not isinstance(e, Constant)]) - 1}"
