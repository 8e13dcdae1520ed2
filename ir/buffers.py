"""BufferGraph: the realized nodes, named buf0, buf1, ... in registration order.

vs LoweredGraph: + names bufN, + layouts for every buffer, + the rule that realized
each buffer; - View nodes (folded into indices), - unrealized Pointwise nodes (their
bodies are substituted into their readers: the seed's closure inlining).

Grammar::

    BufferGraph ::= (inputs: InputBuffer*, buffers: Buffer*, outputs: name*,
                     realize_table: RealizeRow*)
    Buffer ::= ComputedBuffer(name, layout, ranges, reduction_ranges,
                              reduction_type | None, body, rule, origins)
             | ExternBuffer(name, kernel, args, kwargs, layout, rule, origins, mutated)
             | MultiOutputBuffer(name, extern, index, layout, rule, origins)
             | AliasBuffer(name, base, layout, rule, origins)
                                     a view of another buffer or input, no copy

Bodies load only InputBuffers and Buffers, by logical index; the loaded buffer's
layout turns a logical index into a storage offset.
"""

from __future__ import annotations

from typing import Any, Union

import attrs

from coil.ir.expr import Expr
from coil.ir.layout import Layout


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen(cache_hash=True)
class InputBuffer:
    name: str
    layout: Layout
    value: Any = attrs.field(default=None, eq=False, repr=False)  # a tensor constant (see Input)
    token: bool = False  # an effect token (see Input)


@attrs.frozen(cache_hash=True)
class ComputedBuffer:
    name: str
    layout: Layout
    ranges: tuple[int, ...] = attrs.field(converter=_ints)
    reduction_ranges: tuple[int, ...] = attrs.field(converter=_ints)
    reduction_type: str | None
    body: Expr
    rule: str
    origins: tuple[str, ...]  # FX nodes whose compute lives in this buffer
    ops: tuple[str, ...]  # their aten ops' short names, for kernel names

    @property
    def is_reduction(self) -> bool:
        return self.reduction_type is not None


@attrs.frozen(cache_hash=True)
class ExternBuffer:
    name: str
    kernel: str
    args: tuple[Any, ...]  # nested tuples of TensorRef / constants; refs name buffers
    kwargs: tuple[tuple[str, Any], ...]
    layout: Layout | None  # None for a tuple result, read through MultiOutputBuffers
    rule: str
    origins: tuple[str, ...]
    ops: tuple[str, ...]
    mutated: tuple[str, ...] = ()


@attrs.frozen(cache_hash=True)
class MultiOutputBuffer:
    name: str
    extern: str
    index: tuple[int, ...]
    layout: Layout
    rule: str
    origins: tuple[str, ...]
    ops: tuple[str, ...]


@attrs.frozen(cache_hash=True)
class AliasBuffer:
    """A strided view of `base` (Inductor's ReinterpretView): no kernel, no copy."""

    name: str
    base: str
    layout: Layout
    rule: str
    origins: tuple[str, ...]
    ops: tuple[str, ...]


Buffer = Union[ComputedBuffer, ExternBuffer, MultiOutputBuffer, AliasBuffer]


@attrs.frozen
class RealizeRow:
    """One line of the seed's realize table."""

    fx_node: str
    ir_node: str  # Pointwise / Reduction / View / Extern / ...
    realized: bool
    buffer: str | None  # the bufN (or input name) it became
    rule: str  # why realized, or why inlined


@attrs.frozen
class BufferGraph:
    inputs: tuple[InputBuffer, ...]
    buffers: tuple[Buffer, ...]
    outputs: tuple[str | None, ...]
    realize_table: tuple[RealizeRow, ...] = ()
    _by_name: dict[str, Union[InputBuffer, Buffer]] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        table: dict[str, Union[InputBuffer, Buffer]] = {i.name: i for i in self.inputs}
        table.update((b.name, b) for b in self.buffers)
        object.__setattr__(self, "_by_name", table)

    def get(self, name: str) -> Union[InputBuffer, Buffer]:
        return self._by_name[name]

    def layout(self, name: str) -> Layout:
        b = self._by_name[name]
        if b.layout is None:
            raise KeyError(f"{name} has no single layout (tuple-valued extern)")
        return b.layout

    def names(self) -> list[str]:
        return list(self._by_name)

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(b.layout.device for b in (*self.inputs, *self.buffers) if b.layout is not None)

