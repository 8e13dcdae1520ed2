"""Run-time helpers for reference-target kernels (plain torch ops)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from coil.backends.reference import _BINARY, _UNARY, reduce as _reduce
from coil.backends.reference import gather, run_check  # noqa: F401  (kernels call _rt.run_check)
from coil.errors import CoilError


def iota(n: int, dim: int, ndim: int, device: torch.device) -> torch.Tensor:
    shape = [1] * ndim
    shape[dim] = n
    return torch.arange(n, dtype=torch.int64, device=device).reshape(shape)


def load(t: torch.Tensor, storage: int, base_offset: int, offset: Any, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Gather `t`'s storage (as its layout addresses it) at the element offsets
    (only where `mask` holds, when there is one: 0 elsewhere)."""
    flat = t.as_strided((storage - base_offset,), (1,), t.storage_offset())  # offsets count from t's own
    return gather(flat, offset - base_offset, mask, "a buffer")


def const(v: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(v, dtype=dtype, device=device)


def index(v: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return v.to(dtype) if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=dtype, device=device)


def op(name: str, dtype: torch.dtype, *args: torch.Tensor) -> torch.Tensor:
    if name in _UNARY:
        out = _UNARY[name](args[0])
    elif name in _BINARY:
        out = _BINARY[name](*args)
    elif name == "where":
        out = torch.where(*args)
    else:
        raise CoilError(f"reference kernel: no op {name}")
    return out if out.dtype == dtype else out.to(dtype)


def finish(value: torch.Tensor, shape: Sequence[int], reduction: str | None, nred: int, init: Any) -> torch.Tensor:
    """Broadcast a body's value to the iteration shape and reduce its last dims."""
    v = torch.broadcast_to(value, tuple(shape))
    if reduction is None:
        return v
    if v.numel() == 0:
        return torch.full(tuple(shape[: len(shape) - nred]), init, dtype=v.dtype, device=v.device)
    return _reduce(v, reduction, nred)


def store(out: torch.Tensor, value: torch.Tensor) -> None:
    out.copy_(value.reshape(out.shape))
