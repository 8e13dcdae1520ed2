"""The `_foreach_*` ops (what torch.optim's multi-tensor steps, clip_grad_norm_ and
friends call) as decompositions: one per-tensor op for each element of the lists,
a list of results.  Each element's op then lowers like any other, so the chain an
optimizer applies to one parameter (Adam's lerp, mul, addcmul, sqrt, div, addcdiv)
fuses into one kernel per parameter, and the write-back into the parameter and its
state happens in that kernel (plan_memory's write-back), where an Extern per
foreach op ran torch's own loop and left one more copy per tensor.

Which overloads: the functional ones (AOTAutograd functionalizes the in-place
`_foreach_add_`); `List` zips two lists, `ScalarList` zips a list with Python
numbers, `Scalar` and `Tensor` broadcast one value to every element.  Left as
Extern calls: `_foreach_addcmul.Tensor` / `_foreach_addcdiv.Tensor` (their values
are elements of a CPU tensor), `_foreach_powsum` and `_foreach_mm`.

lower decomposes them only where every tensor of the call is on the graph's device
(ONE_DEVICE): a CUDA optimizer keeps its step counters on the CPU, and the foreach
ops over those stay Extern calls on the CPU, as eager runs them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

aten = torch.ops.aten

Decomposition = Callable[..., list[torch.Tensor]]

_UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
          "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin",
          "sinh", "sqrt", "tan", "tanh", "trunc")

# foreach name -> the per-tensor op for a tensor second operand, and for a number
_BINARY: dict[str, tuple[Any, Any]] = {
    "add": (aten.add.Tensor, aten.add.Tensor),
    "sub": (aten.sub.Tensor, aten.sub.Tensor),
    "mul": (aten.mul.Tensor, aten.mul.Tensor),
    "div": (aten.div.Tensor, aten.div.Tensor),
    "pow": (aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar),
    "clamp_min": (aten.clamp_min.Tensor, aten.clamp_min.default),
    "clamp_max": (aten.clamp_max.Tensor, aten.clamp_max.default),
    "maximum": (aten.maximum.default, aten.clamp_min.default),
    "minimum": (aten.minimum.default, aten.clamp_max.default),
}


def _unary(op: Any) -> Decomposition:
    def decomposition(self: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [op(x) for x in self]

    return decomposition


def _zip_list(op: Any) -> Decomposition:
    """`List` (and `Tensor`, one tensor for all): op(x_i, other_i, **kw)."""
    def decomposition(self: Sequence[torch.Tensor], other: Any, **kw: Any) -> list[torch.Tensor]:
        others = other if isinstance(other, (list, tuple)) else [other] * len(self)
        _same_length(self, others)
        return [op(x, o, **kw) for x, o in zip(self, others)]

    return decomposition


def _zip_scalars(op: Any) -> Decomposition:
    """`Scalar` and `ScalarList`: op(x_i, s_i)."""
    def decomposition(self: Sequence[torch.Tensor], scalar: Any) -> list[torch.Tensor]:
        scalars = scalar if isinstance(scalar, (list, tuple)) else [scalar] * len(self)
        _same_length(self, scalars)
        return [op(x, s) for x, s in zip(self, scalars)]

    return decomposition


def _pow_scalar_and_tensor(self: Any, exponent: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [aten.pow.Scalar(self, e) for e in exponent]


def _pointwise3(op: Any) -> Decomposition:
    """addcmul / addcdiv, `Scalar` and `ScalarList`: op(x_i, a_i, b_i, value=v_i)."""
    def decomposition(self: Sequence[torch.Tensor], tensor1: Sequence[torch.Tensor], tensor2: Sequence[torch.Tensor],
                      value: Any = 1) -> list[torch.Tensor]:
        values = value if isinstance(value, (list, tuple)) else [value] * len(self)
        _same_length(self, tensor1, tensor2, values)
        return [op(x, a, b, value=v) for x, a, b, v in zip(self, tensor1, tensor2, values)]

    return decomposition


def _lerp(self: Sequence[torch.Tensor], tensors1: Sequence[torch.Tensor], weight: Any) -> list[torch.Tensor]:
    weights = weight if isinstance(weight, (list, tuple)) else [weight] * len(self)
    _same_length(self, tensors1, weights)
    return [aten.lerp.Tensor(x, e, w) if isinstance(w, torch.Tensor) else aten.lerp.Scalar(x, e, w)
            for x, e, w in zip(self, tensors1, weights)]


def _copy(self: Sequence[torch.Tensor], src: Sequence[torch.Tensor], non_blocking: bool = False) -> list[torch.Tensor]:
    _same_length(self, src)
    return [aten.copy.default(x, s) for x, s in zip(self, src)]


def _norm(self: Sequence[torch.Tensor], ord: Any = 2, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    return [aten.linalg_vector_norm.default(x, ord, dtype=dtype) for x in self]


def _same_length(*lists: Sequence[Any]) -> None:
    if len({len(x) for x in lists}) > 1:
        raise RuntimeError(f"foreach op: lists of lengths {[len(x) for x in lists]}")


def _overload(name: str, overload: str = "default") -> Any:
    """`aten.<name>.<overload>`, or None where this torch has no such op: the foreach family grows between
    releases (`_foreach_clone` is newer than torch 2.11), and an op this torch lacks can never reach lower."""
    packet = getattr(aten, name, None)
    if packet is None or overload not in packet.overloads():
        return None
    return getattr(packet, overload)


def _table() -> dict[Any, Decomposition]:
    entries: list[tuple[Any, Decomposition]] = []
    for name in _UNARY:
        entries.append((_overload(f"_foreach_{name}"), _unary(getattr(aten, name).default)))
    entries.append((_overload("_foreach_zero"), _unary(aten.zeros_like.default)))
    entries.append((_overload("_foreach_clone"), _unary(aten.clone.default)))
    entries.append((_overload("_foreach_max"), _unary(aten.max.default)))
    for name, (with_tensor, with_number) in _BINARY.items():
        # List: op(x_i, y_i); Tensor: one tensor (a 0-d one, as a rule) for every element
        for overload in ("List", "Tensor"):
            entries.append((_overload(f"_foreach_{name}", overload), _zip_list(with_tensor)))
        for overload in ("Scalar", "ScalarList"):
            entries.append((_overload(f"_foreach_{name}", overload), _zip_scalars(with_number)))
    entries.append((_overload("_foreach_pow", "ScalarAndTensor"), _pow_scalar_and_tensor))
    for name in ("addcmul", "addcdiv"):
        for overload in ("Scalar", "ScalarList"):
            entries.append((_overload(f"_foreach_{name}", overload), _pointwise3(getattr(aten, name).default)))
    for overload in ("Scalar", "ScalarList", "List"):
        entries.append((_overload("_foreach_lerp", overload), _lerp))
    entries.append((_overload("_foreach_copy"), _copy))
    entries.append((_overload("_foreach_norm", "Scalar"), _norm))
    return {op: decomposition for op, decomposition in entries if op is not None}


FOREACH_DECOMPOSITIONS: dict[Any, Decomposition] = _table()

# decomposed only where every tensor of the call is on the graph's device
ONE_DEVICE: frozenset[Any] = frozenset(FOREACH_DECOMPOSITIONS)
