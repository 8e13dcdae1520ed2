"""GraphBuilder: the FX graph of aten ops that `graphs()` draws, built one call at a
time, with each call also run eagerly on the example inputs.

Running every call as it is added is what keeps drawn graphs meaningful: the
guards below look at the actual values (is this operand positive? bounded?) and
put the smallest fix in front of an op (`abs(x) + 1` before a log, a clamp before
an exp) only when the values need it, so the graph never computes NaN or Inf and
never overflows float16.

Each value also carries `exact`: whether every backend must compute it bit for bit
as eager does.  Inputs, views, sign flips, max/min, casts and integer arithmetic
are exact; sums, products, transcendental functions are not (summation order,
fused multiply-add, float16 kept in float32 registers all move the last bits).
Discontinuous ops (floor, sign, comparisons, remainder, argmax, float->int casts)
only ever read exact values: applied to a value that may differ in its last bit,
they turn a rounding difference into a wrong answer that is not a bug.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
import torch.fx

aten = torch.ops.aten

# Every intermediate value stays within this magnitude: far below float16's 65504,
# so no op overflows in eager's float16 while coil keeps the value in float32.
VALUE_LIMIT = 1.0e4


class Rejected(Exception):
    """The drawn program computed a value outside the safe range despite its guards;
    the strategy discards the example (hypothesis.reject)."""


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_int(dtype: torch.dtype) -> bool:
    return dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@attrs.frozen(eq=False)
class Value:
    """One tensor of the drawn program: its FX node and its eager value."""

    node: torch.fx.Node
    tensor: torch.Tensor
    exact: bool

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def ndim(self) -> int:
        return self.tensor.ndim

    def numel(self) -> int:
        return self.tensor.numel()

    def max_abs(self) -> float:
        if self.numel() == 0 or self.dtype == torch.bool:
            return 0.0
        return float(self.tensor.abs().max().double())

    def min_value(self) -> float:
        if self.numel() == 0:
            return math.inf
        return float(self.tensor.min().double())

    def min_abs(self) -> float:
        if self.numel() == 0:
            return math.inf
        return float(self.tensor.abs().min().double())


def broadcastable(*shapes: Sequence[int]) -> bool:
    try:
        torch.broadcast_shapes(*[torch.Size(s) for s in shapes])
    except RuntimeError:
        return False
    return True


def _check_value(t: torch.Tensor) -> None:
    """Every float value is finite and within VALUE_LIMIT."""
    if not t.is_floating_point() or t.numel() == 0:
        return
    if not bool(torch.isfinite(t).all()) or float(t.abs().max().double()) > VALUE_LIMIT:
        raise Rejected(f"value out of range: max |x| = {float(t.abs().max().double())}")


class GraphBuilder:
    """Adds aten calls to an fx.Graph and runs each eagerly.  Lives inside one draw."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.values: list[Value] = []
        self.inputs: list[torch.Tensor] = []
        self.instructions: list[str] = []

    # ---- adding nodes ---------------------------------------------------------------

    def placeholder(self, tensor: torch.Tensor) -> Value:
        node = self.graph.placeholder(f"arg{len(self.inputs)}_1")
        self.inputs.append(tensor)
        return self._keep(Value(node, tensor, exact=True))

    def call(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *,
             exact: bool | Callable[[torch.dtype], bool] = False) -> Value:
        """One aten call with a tensor result.  `exact` may depend on the result's
        dtype (integer results of exact operands are exact)."""
        kwargs = kwargs or {}
        out = self._run(op, args, kwargs)
        assert isinstance(out, torch.Tensor), f"{op} returned {type(out).__name__}"
        _check_value(out)
        node = self._node(op, args, kwargs)
        return self._keep(Value(node, out, exact(out.dtype) if callable(exact) else exact))

    def call_multi(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any] | None, exact: Sequence[bool]) -> tuple[Value, ...]:
        """One aten call with a tuple result; each element gets a getitem node."""
        kwargs = kwargs or {}
        outs = self._run(op, args, kwargs)
        for t in outs:
            _check_value(t)
        node = self._node(op, args, kwargs)
        return tuple(
            self._keep(Value(self.graph.call_function(operator.getitem, (node, i)), t, e))
            for i, (t, e) in enumerate(zip(outs, exact))
        )

    def output(self, values: Sequence[Value]) -> None:
        self.graph.output(tuple(v.node for v in values))

    def module(self) -> torch.fx.GraphModule:
        gm = torch.fx.GraphModule(torch.nn.Module(), self.graph)
        gm.graph.lint()
        return gm

    def _node(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> torch.fx.Node:
        """A call_function node named as make_fx names it (add, add_1, ...), so a
        drawn graph reads like a traced one."""
        name = getattr(op, "_opname", None)
        return self.graph.create_node("call_function", op, _nodes(tuple(args)), _nodes(kwargs), name=name)

    def _run(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # var's "degrees of freedom" and friends
            return op(*_tensors(args), **_tensors(kwargs))

    def _keep(self, v: Value) -> Value:
        self.values.append(v)
        return v

    def sinks(self) -> list[Value]:
        """The computed values nothing reads: the program's natural outputs."""
        return [v for v in self.values if v.node.op == "call_function" and not v.node.users]

    # ---- choosing operands -------------------------------------------------------------

    def candidates(self, pred: Callable[[Value], bool]) -> list[Value]:
        """The values that satisfy `pred`, most recent first (so the first choice,
        where hypothesis shrinks to, continues the chain)."""
        return [v for v in reversed(self.values) if pred(v)]

    # ---- guards: the smallest change that puts an operand in an op's domain -----------

    def bounded(self, v: Value, limit: float) -> Value:
        """|v| <= limit, by a clamp when the values need one."""
        if v.dtype == torch.bool or v.max_abs() <= limit:
            return v
        lim: float | int = max(1, int(limit)) if is_int(v.dtype) else limit
        return self.call(aten.clamp.default, (v, -lim, lim), exact=v.exact)

    def positive(self, v: Value, margin: float = 0.1, limit: float = 1.0e3) -> Value:
        """v >= margin (and bounded), as `abs(v) + 1` when it is not already."""
        v = self.bounded(v, limit)
        if v.min_value() >= margin:
            return v
        a = self.call(aten.abs.default, (v,), exact=v.exact)
        return self.call(aten.add.Tensor, (a, 1), exact=v.exact and not is_float(v.dtype))

    def nonzero(self, v: Value, margin: float = 0.1, limit: float = 1.0e3) -> Value:
        """|v| >= margin (and bounded): a divisor."""
        v = self.bounded(v, limit)
        if v.min_abs() >= margin:
            return v
        return self.positive(v, margin, limit)


def _nodes(x: Any) -> Any:
    if isinstance(x, Value):
        return x.node
    if isinstance(x, (list, tuple)):
        return type(x)(_nodes(a) for a in x)
    if isinstance(x, dict):
        return {k: _nodes(a) for k, a in x.items()}
    return x


def _tensors(x: Any) -> Any:
    if isinstance(x, Value):
        return x.tensor
    if isinstance(x, (list, tuple)):
        return type(x)(_tensors(a) for a in x)
    if isinstance(x, dict):
        return {k: _tensors(a) for k, a in x.items()}
    return x
