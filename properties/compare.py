"""Comparing a compiled graph's outputs with eager PyTorch.

A result matches when it has eager's shape and dtype and either
1. is close to eager at the dtype's tolerance (integers and bools: equal), or
2. is a float result no further from the float64 run of the same graph than a
   small multiple of eager's own distance from it, or than 2 units in the last
   place of its dtype (a long sum that eager's cascade rounded unusually well).

The second rule is Inductor's (`torch._dynamo.utils.same(..., fp64_ref=...)`): a
float16 chain that coil keeps in float32 registers rounds once where eager rounds
after every op, and a sum in another order moves the last bits; both are closer to
the float64 truth than the tolerance says, not further.  A real bug (a wrong index,
a read after free) is far from both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from coil.properties.strategies import DrawnGraph

# (rtol, atol): assert_close's defaults for float32/float64, looser for the half types
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (3.2e-2, 2e-2),
}
# how much further from float64 than eager a result may be (Inductor uses 2-3 on RMSE;
# this compares maximum errors, which are noisier)
FP64_MULTIPLIER = 4.0
INPUTS_WRITTEN = "the compiled code wrote to its inputs"


def _close(got: torch.Tensor, want: torch.Tensor) -> str | None:
    rtol, atol = TOLERANCES.get(want.dtype, (0.0, 0.0))
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, check_stride=False,
                                   check_device=False)
    except AssertionError as e:
        return str(e)
    return None


def _max_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (x.double() - ref.double()).abs()
    same = (x.double() == ref.double()) | (x.double().isnan() & ref.double().isnan())
    diff = torch.where(same, torch.zeros_like(diff), diff)
    return float(diff.max()) if diff.numel() else 0.0


def _within_fp64(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor) -> bool:
    _, atol = TOLERANCES[want.dtype]
    return _max_error(got, ref) <= FP64_MULTIPLIER * _max_error(want, ref) + atol


def _within_ulps(got: torch.Tensor, ref: torch.Tensor, ulps: float = 2.0) -> bool:
    """Every element within `ulps` units in the last place (of got's dtype) of the
    float64 result: a correctly rounded sum of many terms lands there whatever
    their order, even where eager's cascade happened to land closer."""
    g, r = got.double(), ref.double()
    same = (g == r) | (g.isnan() & r.isnan())
    slack = ulps * torch.finfo(got.dtype).eps * r.abs()
    return bool((same | ((g - r).abs() <= slack)).all())


def changed_inputs(drawn: DrawnGraph) -> list[str]:
    """The inputs that compiled code wrote to (a compiled graph must leave its
    inputs as the caller gave them; the sanitizer's poison must not reach them)."""
    fresh = drawn.fresh_inputs()
    return [name for name, t, f in zip(drawn.input_names, drawn.inputs, fresh)
            if isinstance(t, torch.Tensor) and not torch.equal(t.cpu(), f.cpu())]


def mismatch(drawn: DrawnGraph, outputs: Sequence[Any], expected: Sequence[Any] | None = None) -> str | None:
    """Why `outputs` differ from eager's, or None when they match."""
    changed = changed_inputs(drawn)
    if changed:
        return f"{INPUTS_WRITTEN} {changed}"
    want_all = drawn.eager() if expected is None else tuple(expected)
    if len(outputs) != len(want_all):
        return f"{len(outputs)} outputs, eager gives {len(want_all)}"
    ref_all: tuple[torch.Tensor, ...] | None = None
    for i, (got, want) in enumerate(zip(outputs, want_all)):
        if not isinstance(want, torch.Tensor):  # a size a symbolic graph returns
            if got != want:
                return f"output {i}: got {got!r}, eager gives {want!r}"
            continue
        if not isinstance(got, torch.Tensor):
            return f"output {i}: got {type(got).__name__}, eager gives a tensor"
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"output {i}: got {got.dtype}{list(got.shape)}, eager gives {want.dtype}{list(want.shape)}"
        got, want = got.cpu(), want.cpu()
        why = _close(got, want)
        if why is None:
            continue
        if want.is_floating_point():
            ref_all = drawn.eager_float64() if ref_all is None else ref_all
            if ref_all is not None and (_within_fp64(got, want, ref_all[i].cpu())
                                        or _within_ulps(got, ref_all[i].cpu())):
                continue
        return f"output {i}: {why}"
    return None


def assert_matches_eager(drawn: DrawnGraph, outputs: Sequence[Any], expected: Sequence[Any] | None = None) -> None:
    """Raise AssertionError (with the graph and its inputs) unless `outputs` match
    eager PyTorch on `drawn`."""
    why = mismatch(drawn, outputs, expected)
    if why is not None:
        raise AssertionError(f"{why}\n--- inputs\n{drawn.describe()}\n--- graph\n{drawn.code.strip()}")
