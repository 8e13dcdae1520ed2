"""The lowering registry and the helpers every lowering family uses.

A lowering is `fn(ctx, *args, **kwargs) -> TensorValue | tuple | scalar`; `args` are
the FX node's arguments with each tensor replaced by a `TensorValue`.  It adds IR
nodes through `ctx` (a `LowerCtx`, made fresh for each `lower` call: no global
graph) and returns the value of the FX node, or NotImplemented (before adding any node) to
decline a call it cannot take: `lower` then calls the aten op as an Extern.

    LOWERINGS[aten.add.Tensor] = fn        via @register_lowering(aten.add)
    register_pointwise(aten.exp, "exp")   one line per elementwise op
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence, TypeVar

import attrs
import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from coil.errors import CoilError
from coil.ir.expr import COMPARISONS, LOGICAL, Cast, Constant, Expr, IndexExpr, Load, Op, xsyms
from coil.ir.layout import Layout
from coil.ir.lowered import LNode, Pointwise, Reduction, View
from coil.ir.shapes import Size
from coil.passes.symbolic import is_float_size

aten = torch.ops.aten

Lowering = Callable[..., Any]
L = TypeVar("L", bound=Lowering)  # a lowering keeps its own signature through register_lowering
LOWERINGS: dict[Any, Lowering] = {}

HALF = (torch.float16, torch.bfloat16)


class NeedsStaticSizes(CoilError):
    """A lowering met symbolic sizes it cannot take: lower runs that op as an
    Extern instead (the rest of the graph still compiles)."""


@attrs.frozen
class TensorValue:
    """A tensor during lowering: the IR node that produces it."""

    name: str
    size: tuple[int, ...]
    dtype: torch.dtype
    device: str

    @property
    def ndim(self) -> int:
        return len(self.size)

    def numel(self) -> int:
        return math.prod(self.size)

    def load(self, index: Sequence[sympy.Expr], mask: Expr | None = None) -> Expr:
        """Element `index`; with a `mask`, read only where it holds (0 elsewhere)."""
        return Load(self.name, tuple(index), self.dtype, mask)

    def meta(self, rank_only: bool = False) -> torch.Tensor:
        """An empty meta tensor of this shape and dtype.  Symbolic sizes have no
        meta tensor: a lowering that asks for one declines (the op runs as an
        Extern), unless only the rank matters (type promotion): then a symbolic
        size stands in as 2."""
        if not rank_only and not all(isinstance(s, int) for s in self.size):
            raise NeedsStaticSizes(f"{self.name} has symbolic sizes {list(self.size)}")
        return torch.empty(tuple(s if isinstance(s, int) else 2 for s in self.size), dtype=self.dtype, device="meta")


class LowerCtx:
    """Per-call builder: the nodes made so far and a fresh-name counter.  Lives only
    inside one `lower` call."""

    def __init__(self, origin: str, op: str, device: str) -> None:
        self.nodes: list[LNode] = []
        self.origin = origin
        self.op = op
        self.device = device
        self._used: set[str] = set()
        self._reserved: set[str] = set()
        # eager's values (fake tensors) of the FX node's positional arguments, for the
        # few lowerings whose meaning depends on a layout (as_strided); None where unknown
        self.arg_vals: tuple[Any, ...] = ()
        # eager's value of the FX node's result (its fake tensor), for a lowering whose size
        # only the ShapeEnv can work out (arange over a float of sizes); None where unknown
        self.out_val: Any = None
        # converts the ShapeEnv's SymInts to coil's sizes (passes/symbolic.py); the identity when static
        from coil.passes.symbolic import STATIC

        self.sizes = STATIC
        # a convolution's bias is added by a pointwise node, not by the Extern
        # (TargetTraits.conv_bias_in_kernels)
        self.conv_bias_in_kernels = False
        # what a lowering knows of a value it made, for a later lowering that reads the
        # value: offsets to indices records its offsets and window, and
        # max_pool2d_with_indices_backward then compares the offsets themselves
        self.facts: dict[str, Any] = {}

    def at(self, origin: str, op: str, device: str) -> "LowerCtx":
        self.origin, self.op, self.device = origin, op, device
        return self

    def fresh(self) -> str:
        """The FX node's own name for its first IR node, then name__1, name__2, ..."""
        if self.origin not in self._used:
            return self.origin
        k = 1
        while f"{self.origin}__{k}" in self._used or f"{self.origin}__{k}" in self._reserved:
            k += 1
        return f"{self.origin}__{k}"

    def reserve(self, name: str) -> None:
        self._reserved.add(name)

    def append(self, node: LNode) -> None:
        self.nodes.append(node)
        self._used.add(node.name)

    def add(self, node: LNode) -> TensorValue:
        self.append(node)
        return TensorValue(node.name, tuple(node.size), node.dtype, getattr(node, "device", self.device))

    def pointwise(self, ranges: Sequence[int], body: Expr, dtype: torch.dtype | None = None,
                  device: str | None = None) -> TensorValue:
        """A Pointwise node; `device` overrides the graph's (a creation op's `device=`)."""
        dtype = body.dtype if dtype is None else dtype
        if body.dtype != dtype:
            body = Cast(body, dtype)
        dev = self.device if device is None else device
        return self.add(Pointwise(self.fresh(), dtype, dev, tuple(ranges), body, self.origin, self.op))

    def reduction(
        self,
        ranges: Sequence[int],
        reduction_ranges: Sequence[int],
        reduction_type: str,
        body: Expr,
        dtype: torch.dtype,
    ) -> TensorValue:
        return self.add(
            Reduction(
                self.fresh(), dtype, self.device, tuple(ranges), tuple(reduction_ranges),
                reduction_type, body, self.origin, self.op,
            )
        )

    def view(self, base: TensorValue, ranges: Sequence[int], index: Sequence[sympy.Expr]) -> TensorValue:
        return self.add(View(self.fresh(), base.name, base.dtype, base.device, tuple(ranges), tuple(index), self.origin, self.op))


def _lowerable(overload: Any) -> bool:
    """An overload a packet's lowering may take: one that returns tensors and writes
    no `out=` argument.  A packet also holds `out` variants (their extra argument
    would reach the lowering) and Python-scalar overloads such as `aten.add.int` or
    the list concatenation `aten.add.t`; those stay Externs."""
    schema = overload._schema
    if any(a.is_out for a in schema.arguments):
        return False
    return any("Tensor" in str(r.type) for r in schema.returns)


def _overloads(op: Any) -> list[Any]:
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [o for o in (getattr(op, name) for name in op.overloads()) if _lowerable(o)]
    return [op]


def register_lowering(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register `fn` for every overload of each op (packets expand to overloads).  An
    op given as a string ("prims.fma.default") is matched by name, for ops that exist
    only once some other module defined them."""

    def deco(fn: Lowering) -> Lowering:
        for op in ops:
            if isinstance(op, str):
                LOWERINGS[op] = fn
                continue
            for o in _overloads(op):
                LOWERINGS[o] = fn
        return fn

    return deco


def find_lowering(target: Any) -> Lowering | None:
    fn = LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = LOWERINGS.get(str(target))
    return fn


# ---- broadcasting, promotion and loading -------------------------------------------------


def broadcast_shapes(*sizes: Sequence[Size]) -> tuple[Size, ...]:
    if all(isinstance(v, int) for s in sizes for v in s):
        return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in sizes]))
    # symbolic: a dim broadcasts only where a side is the literal 1 (a backed size symbol is
    # never 1, Dynamo specializes it; a data-dependent u0 may be, and then must equal the others)
    rank = max(len(s) for s in sizes)
    out: list[Size] = []
    for d in range(rank):
        dims = [s[len(s) - rank + d] for s in sizes if len(s) - rank + d >= 0]
        big = [v for v in dims if not (isinstance(v, int) and v == 1)]
        first = big[0] if big else 1
        if any(sympy.expand(sympy.sympify(v) - sympy.sympify(first)) != 0 for v in big):
            raise CoilError(f"cannot broadcast sizes {[tuple(s) for s in sizes]} (dim {d}: {big})", stage="lower")
        out.append(first)
    return tuple(out)


def broadcast_load(t: TensorValue, out_size: Sequence[int], index: Sequence[sympy.Expr]) -> Expr:
    """Load `t` at the output index, right-aligned, size-1 dims read at 0."""
    lead = len(out_size) - t.ndim
    idx = [sympy.Integer(0) if s == 1 else index[lead + i] for i, s in enumerate(t.size)]
    return t.load(idx)


def is_tensor(x: Any) -> bool:
    return isinstance(x, TensorValue)


def promote(
    args: Iterable[Any], kind: ELEMENTWISE_TYPE_PROMOTION_KIND = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
) -> tuple[torch.dtype, torch.dtype]:
    """aten's type promotion: (compute dtype, result dtype)."""
    metas = [a.meta(rank_only=True) if is_tensor(a) else _SIZE_SCALAR if _is_size(a) else 1.0 if is_float_size(a)
             else a for a in args if is_tensor(a) or _is_size(a) or is_float_size(a) or isinstance(a, (bool, int, float))]
    # 0-d tensors promote like scalars unless all are 0-d; torch handles that on meta tensors
    compute, result = elementwise_dtypes(*metas, type_promotion_kind=kind)
    return compute, result


_SIZE_SCALAR = 1  # what a size stands for in type promotion: an int scalar, as a SymInt is


def _is_size(x: Any) -> bool:
    """A size expression (a SymInt the graph computes with, as sympy) used as a scalar operand."""
    return isinstance(x, sympy.Expr) and bool(x.is_integer)  # a relation's is_integer is None


def as_expr(x: Any, out_size: Sequence[int], index: Sequence[sympy.Expr], dtype: torch.dtype) -> Expr:
    """An argument as an expression of `dtype` at the output index."""
    if not is_tensor(x):
        return scalar_expr(x, dtype)
    e = broadcast_load(x, out_size, index)
    return e if e.dtype == dtype else Cast(e, dtype)


def scalar_expr(x: Any, dtype: torch.dtype) -> Expr:
    """A scalar argument as an expression of `dtype`: a Python number, a size (a
    SymInt of the graph, as the index arithmetic has it: a cache's length), or a
    float of sizes (1 / s0 of a mean: its float64 expression)."""
    if isinstance(x, (bool, int, float)):
        return constant(x, dtype)
    if _is_size(x):
        e: Expr = IndexExpr(x)
    elif is_float_size(x):
        e = x
    else:
        raise CoilError(f"cannot use {type(x).__name__} as a tensor operand")
    return e if e.dtype == dtype else Cast(e, dtype)


def constant(x: bool | int | float, dtype: torch.dtype) -> Constant:
    """A Python scalar as a Constant whose value has the Python type of `dtype`
    (bool, int or float), so backends can print it without looking at the dtype."""
    return Constant(convert_scalar(x, dtype), dtype)


def convert_scalar(x: bool | int | float, dtype: torch.dtype) -> bool | int | float:
    if dtype == torch.bool:
        return bool(x)
    if dtype.is_floating_point:
        return float(x)
    return int(x)


def upcast(dtype: torch.dtype) -> torch.dtype:
    """Half types compute in float32, rounded on store (as Inductor does)."""
    return torch.float32 if dtype in HALF else dtype


def out_size_of(args: Iterable[Any]) -> tuple[int, ...]:
    sizes = [a.size for a in args if is_tensor(a)]
    return broadcast_shapes(*sizes) if sizes else ()


def make_pointwise_body(
    fn: Callable[..., Expr],
    args: Sequence[Any],
    kind: ELEMENTWISE_TYPE_PROMOTION_KIND = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
    compute_dtype: torch.dtype | None = None,
    result_dtype: torch.dtype | None = None,
) -> tuple[tuple[int, ...], Expr, torch.dtype]:
    """Broadcast, promote and call `fn(*exprs, dtype=compute)`; the result is cast to
    the promoted result dtype.  Returns (ranges, body, result dtype)."""
    compute, result = promote(args, kind)
    compute = upcast(compute if compute_dtype is None else compute_dtype)
    result = result if result_dtype is None else result_dtype
    size = out_size_of(args)
    index = xsyms(len(size))
    exprs = [as_expr(a, size, index, compute) for a in args]
    body = fn(*exprs, dtype=compute)
    if body.dtype != result:
        body = Cast(body, result)
    return size, body, result


# Ops whose result is bool whatever their inputs are.
BOOL_RESULT = COMPARISONS | LOGICAL

# On bools the arithmetic and bitwise ops are the logical ones (Inductor's
# override_fn_when_input_bool): no backend then does arithmetic on bools, where
# Triton's 1-bit integers would wrap True + True to False and C's ~true is -2.
ON_BOOLS = {
    "add": "logical_or", "mul": "logical_and", "maximum": "logical_or", "minimum": "logical_and",
    "bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor",
    "bitwise_not": "logical_not",
}


def op(name: str, *args: Expr, dtype: torch.dtype | None = None) -> Expr:
    """Build `Op(name, args)`; comparisons give bool, else the first arg's dtype.
    An op of ON_BOOLS whose arguments are all bool becomes its logical twin."""
    if name in ON_BOOLS and dtype in (None, torch.bool) and all(a.dtype == torch.bool for a in args):
        name = ON_BOOLS[name]
    if dtype is None:
        dtype = torch.bool if name in BOOL_RESULT else args[-1 if name == "where" else 0].dtype
    return Op(name, tuple(args), dtype)


def register_pointwise(
    aten_op: Any,
    op_name: str | None = None,
    kind: ELEMENTWISE_TYPE_PROMOTION_KIND = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
    *,
    result_dtype: torch.dtype | None = None,
) -> Lowering:
    """One elementwise aten op -> one `Op` node per element.  Logical ops read their
    inputs as bool (x != 0), as aten does, so their Op only ever sees bools."""
    name = op_name or aten_op._opname
    compute = torch.bool if name in LOGICAL else None

    def lowering(ctx: LowerCtx, *args: Any, **kwargs: Any) -> TensorValue:
        if kwargs:
            raise CoilError(f"{name}: unsupported keyword arguments {sorted(kwargs)}")

        def body(*exprs: Expr, dtype: torch.dtype) -> Expr:
            return op(name, *exprs, dtype=None if name in BOOL_RESULT else dtype)

        ranges, b, dt = make_pointwise_body(body, args, kind, compute_dtype=compute, result_dtype=result_dtype)
        return ctx.pointwise(ranges, b, dt)

    lowering.__name__ = f"pointwise_{name}"
    register_lowering(aten_op)(lowering)
    return lowering


def layout_of(v: TensorValue) -> Layout:
    return Layout.contiguous(v.size, v.dtype, v.device)


def normalize_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise CoilError(f"dimension {dim} out of range for a {ndim}-d tensor")
    return dim % n
