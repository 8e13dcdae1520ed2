"""Layout: where a tensor's elements live in its storage (Inductor's FixedLayout)."""

from __future__ import annotations

from typing import Sequence

import attrs
import sympy
import torch

from coil.ir.indexing import contiguous_strides, numel, strided_offset


def _ints(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen(cache_hash=True)
class Layout:
    size: tuple[int, ...] = attrs.field(converter=_ints)
    stride: tuple[int, ...] = attrs.field(converter=_ints)
    dtype: torch.dtype
    device: str
    offset: int = 0

    @stride.validator
    def _rank(self, _a: object, value: tuple[int, ...]) -> None:
        if len(value) != len(self.size):
            raise ValueError(f"stride {value} does not match size {self.size}")

    @classmethod
    def contiguous(cls, size: Sequence[int], dtype: torch.dtype, device: str) -> "Layout":
        return cls(tuple(size), contiguous_strides(size), dtype, device)

    @classmethod
    def of(cls, t: torch.Tensor) -> "Layout":
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), int(t.storage_offset()))

    @property
    def numel(self) -> int:
        return numel(self.size)

    def storage_size(self) -> int:
        """Elements the storage must hold (as torch's empty_strided computes it)."""
        if any(s == 0 for s in self.size):
            return 0
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))

    @property
    def nbytes(self) -> int:
        return self.storage_size() * self.dtype.itemsize

    def is_contiguous(self) -> bool:
        return self.offset == 0 and all(
            st == c for s, st, c in zip(self.size, self.stride, contiguous_strides(self.size)) if s != 1
        )

    def offset_of(self, index: Sequence[sympy.Expr]) -> sympy.Expr:
        """Storage offset (elements) of a logical index."""
        return strided_offset(index, self.stride, self.offset)

    def show(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        off = f", offset={self.offset}" if self.offset else ""
        return f"{dt}{list(self.size)} stride={list(self.stride)}{off} {self.device}"
