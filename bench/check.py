"""Every variant's outputs against eager's, with torch.testing.assert_close at loose
tolerances: a fast wrong kernel must never look good."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._pytree import tree_leaves


def tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def snapshot(value: Any) -> list[torch.Tensor]:
    """Detached copies of the output tensors (a later call may reuse their storage)."""
    return [t.detach().clone() for t in tensors(value)]


def compare(got: Any, want: list[torch.Tensor], rtol: float, atol: float) -> str | None:
    """None when every output matches; else why not.  `atol` is scaled by each
    reference tensor's largest magnitude."""
    outs = tensors(got)
    if len(outs) != len(want):
        return f"{len(outs)} outputs, eager gives {len(want)}"
    for i, (g, w) in enumerate(zip(outs, want)):
        scale = float(w.detach().abs().max()) if w.numel() and w.is_floating_point() else 1.0
        scale = scale if scale > 0 and math.isfinite(scale) else 1.0
        try:
            torch.testing.assert_close(g.detach(), w, rtol=rtol, atol=atol * scale)
        except AssertionError as e:
            return f"output {i}: " + " ".join(str(e).split())[:300]
    return None


def max_abs_error(got: Any, want: list[torch.Tensor]) -> float | None:
    outs = tensors(got)
    if len(outs) != len(want):
        return None
    errs = [float((g.detach().double() - w.double()).abs().max()) for g, w in zip(outs, want)
            if g.shape == w.shape and g.numel()]
    return max(errs) if errs else 0.0


def io_bytes(inputs: tuple[torch.Tensor, ...], extra: tuple[torch.Tensor, ...], outputs: list[torch.Tensor]) -> int:
    """The fewest bytes a call must move: every distinct input read once, every
    output written once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in (*inputs, *extra):
        key = (t.data_ptr(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total + sum(t.numel() * t.element_size() for t in outputs)
