"""Ops that assemble a tensor from regions of others (cat, constant_pad_nd,
slice_scatter, select_scatter), a slice by a computed half, and arange, with symbolic sizes: each
is a kernel that fuses with its neighbours, as with static sizes, not an Extern
call of the aten op.  Before session 39 all of them ran as Externs under
dynamic=True; a rotary embedding's halves (`x[..., d // 2:]`) were Extern slices
because the ranges could not show `d - d // 2 >= 0`."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import coil
from coil.ir.printer import show
from coil.options import Options
from tests_helpers import capture_aot, compiled_counted

HAS_CUDA = torch.cuda.is_available()
CUDA = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
TARGETS = [("cpp", "cpu"), ("reference", "cpu"), ("triton", "cpu"), pytest.param(("triton", "cuda"), marks=CUDA)]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1) * 2


# name: (function, inputs at a (batch, length))
CASES: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[torch.Tensor, ...]]]] = {
    "cat": (lambda x, y: torch.cat([x * 2, y + 1], 1), lambda b, s: (torch.randn(b, s), torch.randn(b, s + 3))),
    "cat_rows": (lambda x, y: torch.cat([x.sin(), y, x], 0) + 1, lambda b, s: (torch.randn(b, 8), torch.randn(s, 8))),
    "rotate_half": (_rotate_half, lambda b, s: (torch.randn(b, 2 * s),)),
    "pad": (lambda x: F.pad(x * 2, (1, 2, 0, 3), value=0.5), lambda b, s: (torch.randn(b, s),)),
    "crop": (lambda x: F.pad(x + 1, (-1, 2)), lambda b, s: (torch.randn(b, s + 2),)),
    "slice_scatter": (lambda x, y: torch.slice_scatter(x, y * 2, 1, 1, 1 + y.shape[1]),
                      lambda b, s: (torch.randn(b, 2 * s + 1), torch.randn(b, s))),
    "select_scatter": (lambda x, y: torch.select_scatter(x, y.cos(), 1, -1) * 2,
                       lambda b, s: (torch.randn(b, s, 7), torch.randn(b, 7))),
    "select_scatter_first": (lambda x, y: torch.select_scatter(x + 1, y, 0, 0),
                             lambda b, s: (torch.randn(b, s), torch.randn(s))),
    "arange": (lambda x: x[::3] * torch.arange(2, x.shape[0] + 2, 3, device=x.device), lambda b, s: (torch.randn(3 * s + b),)),
    "positions": (lambda x: x + torch.arange(x.shape[1], 2 * x.shape[1], device=x.device), lambda b, s: (torch.randn(b, s),)),
}
SIZES = [(2, 3), (5, 17), (4, 64)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_extern_with_symbolic_sizes(case: str) -> None:
    fn, make = CASES[case]
    gm, example = capture_aot(fn, make(4, 5))
    text = show(coil.default_pipeline().run(gm, example, until="lower", options=Options(target="cpp")))
    assert "Extern" not in text and "s0" in text, text  # symbolic, and every op a kernel


@pytest.mark.parametrize("where", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_regions_match_eager(case: str, where: tuple[str, str]) -> None:
    target, device = where
    fn, make = CASES[case]
    f = compiled_counted(fn, target, dynamic=True)
    for b, s in SIZES:
        args = tuple(a.to(device) for a in make(b, s))
        torch.testing.assert_close(f(*args), fn(*args))
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["symbolic"] == 1, dict(counters["coil"])
