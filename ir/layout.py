"""Layout: where a tensor's elements live in its storage (Inductor's FixedLayout)."""

from __future__ import annotations

from typing import Sequence

import attrs
import sympy
import torch

from coil.ir.indexing import contiguous_strides, numel, strided_offset
from coil.ir.shapes import Size, norm, sizes


def _ints(value: Sequence[object]) -> tuple[Size, ...]:
    """Sizes as coil keeps them: ints, and sympy expressions over size symbols
    where the graph is dynamic (ir/shapes.py)."""
    return sizes(value)


@attrs.frozen(cache_hash=True)
class Layout:
    size: tuple[Size, ...] = attrs.field(converter=_ints)
    stride: tuple[Size, ...] = attrs.field(converter=_ints)
    dtype: torch.dtype
    device: str
    offset: Size = attrs.field(default=0, converter=norm)

    @stride.validator
    def _rank(self, _a: object, value: tuple[Size, ...]) -> None:
        if len(value) != len(self.size):
            raise ValueError(f"stride {value} does not match size {self.size}")

    @classmethod
    def contiguous(cls, size: Sequence[Size], dtype: torch.dtype, device: str) -> "Layout":
        return cls(tuple(size), contiguous_strides(size), dtype, device)

    @classmethod
    def of(cls, t: torch.Tensor) -> "Layout":
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), int(t.storage_offset()))

    @property
    def numel(self) -> Size:
        return numel(self.size)

    @property
    def static(self) -> bool:
        return all(isinstance(v, int) for v in (*self.size, *self.stride, self.offset))

    def storage_size(self) -> Size:
        """Elements the storage must hold (as torch's empty_strided computes it);
        a size symbol is never 0."""
        if any(s == 0 for s in self.size):
            return 0
        n = self.offset + 1 + sum((s - 1) * st for s, st in zip(self.size, self.stride))
        return n if isinstance(n, int) else norm(sympy.expand(n))

    @property
    def nbytes(self) -> Size:
        return norm(self.storage_size() * self.dtype.itemsize)

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
