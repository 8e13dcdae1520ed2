"""BufferGraph: the realized nodes, named buf0, buf1, ... in registration order.

vs LoweredGraph: + names bufN, + layouts for every buffer, + the rule that realized
each buffer; - View nodes (folded into indices), - unrealized Pointwise nodes (their
bodies are substituted into their readers: the seed's closure inlining).

Grammar::

    BufferGraph ::= (inputs: InputBuffer*, buffers: Buffer*, outputs: name*,
                     realize_table: RealizeRow*)
    InputBuffer ::= (name, layout, value | None, token, donated)
                                     donated: a kernel may write over it once dead
    Buffer ::= ComputedBuffer(name, layout, ranges, reduction_ranges,
                              reduction_type | None, body, rule, origins,
                              inner_order, walk_order)
             | ExternBuffer(name, kernel, args, kwargs, layout, rule, origins, mutated,
                              collective: Collective | None)
             | MultiOutputBuffer(name, extern, index, layout, rule, origins)
             | AliasBuffer(name, base, layout, rule, origins)
                                     a view of another buffer or input, no copy
    rule ::= Rule                    output | reduction | extern | reuse | ... (Rule)
    Collective ::= (role: issue | wait, pairs: name*)
                                     an asynchronous _c10d_functional collective (issue; pairs:
                                     the waits that complete it) or a wait_tensor (wait; pairs:
                                     the collective it completes, none when it waits on a tensor
                                     issued outside the graph)

A collective's result, and every storage it reads, is in flight from the issue to its
last wait (`in_flight_buffers`): memory planning neither frees nor reuses them then.

Bodies load only InputBuffers and Buffers, by logical index; the loaded buffer's
layout turns a logical index into a storage offset.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Union

import attrs

from coil.ir.expr import Expr
from coil.ir.layout import Layout
from coil.ir.lowered import TensorRef, extern_tensor_names
from coil.ir.shapes import NO_SIZES, GraphSizes, Size, sizes


def _ints(value: Any) -> tuple[Size, ...]:
    return sizes(value)  # ints, or expressions over size symbols (ir/shapes.py)


class Rule(enum.StrEnum):
    """Why realize gave a node a buffer (the seed's realize reasons), or, for the
    last four, why a node of the realize table has none."""

    OUTPUT = "output"  # a graph output
    REDUCTION = "reduction"  # a reduction is always realized
    EXTERN = "extern"  # an aten kernel's result
    DATA_DEPENDENT = "data_dependent"  # an extern whose size depends on data (nonzero, ...)
    MULTI_OUTPUT = "multi_output"  # one result of a tuple-valued extern
    EXTERN_INPUT = "extern_input"  # read by an extern, which needs a real tensor
    FREE_OUTPUT_BASE = "free_output_base"  # the channels-last node under a saved view
    OPCOUNT_THRESHOLD = "opcount_threshold"  # too many ops to inline into several readers
    READS_THRESHOLD = "reads_threshold"  # too many distinct reads to inline into several readers
    REUSE = "reuse"  # read whole by several readers while itself reading several tensors
    ACC_READS_THRESHOLD = "acc_reads_threshold"  # reads too many buffers to be inlined
    INDEX_OPS_THRESHOLD = "index_ops_threshold"  # a view would read it inlined at an index of too many ops
    BROADCAST = "broadcast"  # costly ops over few elements that a reader repeats over many (a rotary table's sin)
    MUTATION = "mutation"  # reads a buffer that is mutated before its last reader runs
    LIFETIME = "lifetime"  # its readers run far later; realized, the larger inputs dying at it are freed
    OUTPUT_STRIDE = "output_stride"  # a copy that holds an output to the strides FX promised
    OUTPUT_VIEW = "output_view"  # an output that is a view of a buffer: an alias, no copy
    EXTERN_INPUT_VIEW = "extern_input_view"  # an extern's input that is a view: an alias
    # realize-table rows only
    GRAPH_INPUT = "graph_input"
    DEAD = "dead"  # read by nothing
    INLINED = "inlined"  # its body is substituted into its readers'
    INDEX_REMAP = "index_remap"  # a view folded into its readers' indices


@attrs.frozen(cache_hash=True)
class InputBuffer:
    name: str
    layout: Layout
    value: Any = attrs.field(default=None, eq=False, repr=False)  # a tensor constant (see Input)
    token: bool = False  # an effect token (see Input)
    donated: bool = False  # its storage may be taken in place once it is dead (see Input)


@attrs.frozen(cache_hash=True)
class ComputedBuffer:
    name: str
    layout: Layout
    ranges: tuple[Size, ...] = attrs.field(converter=_ints)
    reduction_ranges: tuple[Size, ...] = attrs.field(converter=_ints)
    reduction_type: str | None
    body: Expr
    rule: Rule
    origins: tuple[str, ...]  # FX nodes whose compute lives in this buffer
    ops: tuple[str, ...]  # their aten ops' short names, for kernel names
    # a pointwise buffer's dims in the order it walks them where it runs inside a
    # reduction kernel (the inner role, passes/kernel_model.py); () is their own
    # order.  realize sets it where a reduction reads the buffer with its dims
    # permuted (BatchNorm's backward reads a channels-last gradient down its channels)
    inner_order: tuple[int, ...] = ()
    # a pointwise buffer's dims in the order a pointwise kernel walks them (the outer
    # role in a group of one-element rows): its layout's memory order, where that
    # is not its logical order (a channels-last output), so that its store and the
    # loads of inputs laid out as it is step along memory; () is their own order.
    # realize sets it (walk_orders); nodes of a reduction kernel keep their rows' order
    walk_order: tuple[int, ...] = ()

    @property
    def is_reduction(self) -> bool:
        return self.reduction_type is not None


# the asynchronous collectives of torch.distributed._functional_collectives: each returns
# a tensor that is valid only after `_c10d_functional.wait_tensor` on it (Inductor's
# _CollectiveKernel / _WaitKernel)
COLLECTIVE_KERNELS = frozenset(f"_c10d_functional.{op}.default" for op in (
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_gather_into_tensor",
    "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast", "broadcast_"))
WAIT_KERNEL = "_c10d_functional.wait_tensor.default"


class CollectiveRole(enum.StrEnum):
    ISSUE = "issue"  # starts the collective; its result is unfinished until its waits
    WAIT = "wait"  # wait_tensor: completes the collective it names


@attrs.frozen(cache_hash=True)
class Collective:
    """The pairing of an asynchronous collective with its waits, kept on both ends.
    It lives on the ExternBuffer (not in a table on the BufferGraph) because both
    ends are already nodes and the pairing is a fact about each of them: passes that
    copy or reorder buffers carry it along, and the printer shows it on the line it
    concerns.  `pairs`: an issue's waits (several for a coalesced collective, one per
    result), a wait's collective (empty when it waits on a tensor from outside)."""

    role: CollectiveRole = attrs.field(converter=CollectiveRole)
    pairs: tuple[str, ...] = ()

    def show(self) -> str:
        if self.role is CollectiveRole.ISSUE:
            return f"collective waited_by=[{', '.join(self.pairs)}]"
        return f"wait completes=[{', '.join(self.pairs) or 'outside'}]"


@attrs.frozen(cache_hash=True)
class ExternBuffer:
    name: str
    kernel: str
    args: tuple[Any, ...]  # nested tuples of TensorRef / constants; refs name buffers
    kwargs: tuple[tuple[str, Any], ...]
    layout: Layout | None  # None for a tuple result, read through MultiOutputBuffers
    rule: Rule
    origins: tuple[str, ...]
    ops: tuple[str, ...]
    mutated: tuple[str, ...] = ()
    collective: Collective | None = None  # set when this is a collective or its wait
    scalar: Any = None  # its result is a number: the data-dependent size it gives (Extern.scalar)


@attrs.frozen(cache_hash=True)
class MultiOutputBuffer:
    name: str
    extern: str
    index: tuple[int | str, ...]  # a str: a key of a dict result
    layout: Layout
    rule: Rule
    origins: tuple[str, ...]
    ops: tuple[str, ...]


@attrs.frozen(cache_hash=True)
class AliasBuffer:
    """A strided view of `base` (Inductor's ReinterpretView): no kernel, no copy."""

    name: str
    base: str
    layout: Layout
    rule: Rule
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
    rule: str  # a Rule: why realized, or why not (`inlined into buf3, buf5`: where its body went)


@attrs.frozen
class BufferGraph:
    inputs: tuple[InputBuffer, ...]
    buffers: tuple[Buffer, ...]
    outputs: tuple[str | None, ...]
    realize_table: tuple[RealizeRow, ...] = ()
    sizes: GraphSizes = NO_SIZES  # symbolic sizes at the boundary (ir/shapes.py); empty when static
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



def owns_no_storage(b: Union[InputBuffer, Buffer]) -> bool:
    """A buffer whose bytes are another's: a view (AliasBuffer), a tuple result (read
    through its MultiOutputBuffers), or an extern's result that is the tensor it
    wrote into (index_add_, copy_ return their first argument; extract_deps names it
    by that tensor, mutation_real_name)."""
    return isinstance(b, AliasBuffer) or b.layout is None or (isinstance(b, ExternBuffer) and bool(b.mutated))


def storage_nbytes(g: BufferGraph, name: str) -> Size:
    """The bytes of the storage `name` allocates (0 where it owns none: owns_no_storage)."""
    b = g.get(name)
    return 0 if owns_no_storage(b) or b.layout is None else b.layout.nbytes


def freed_nbytes(g: BufferGraph, name: str) -> Size:
    """The bytes that dropping `name` gives back: its storage's (storage_nbytes), but
    none for a graph input its caller did not donate.  The caller still holds such
    an input: a parameter, the user's tensor, a backward's tangent (Inductor's
    memory estimate counts its primals_, arg and tangents inputs as never freed the
    same way); a backward's saved activations are donated (Options.donated_inputs)."""
    b = g.get(name)
    return 0 if isinstance(b, InputBuffer) and not b.donated else storage_nbytes(g, name)


def storage_bases(g: BufferGraph, name: str) -> tuple[str, ...]:
    """`name` and the buffers whose storage it is a view or a result of (alias chains,
    a MultiOutputBuffer's extern)."""
    out = [name]
    b = g.get(name)
    while isinstance(b, (AliasBuffer, MultiOutputBuffer)):
        up = b.base if isinstance(b, AliasBuffer) else b.extern
        out.append(up)
        b = g.get(up)
    return tuple(out)


def in_flight_buffers(g: BufferGraph, collective: str) -> tuple[str, ...]:
    """Everything a collective's communication may touch until its waits: the
    storages it reads (through views), its result and its results' MultiOutputBuffers,
    and what it mutates.  Sorted, for printing."""
    b = g.get(collective)
    assert isinstance(b, ExternBuffer)
    names: set[str] = {collective, *(m.name for m in g.buffers if isinstance(m, MultiOutputBuffer) and m.extern == collective)}
    for r in (*extern_tensor_names((b.args, tuple(v for _, v in b.kwargs))), *b.mutated):
        names.update(storage_bases(g, r))
    return tuple(sorted(names, key=lambda n: (len(n), n)))


def collectives(g: BufferGraph) -> tuple[ExternBuffer, ...]:
    """The graph's collective issues, in buffer order."""
    return tuple(b for b in g.buffers if isinstance(b, ExternBuffer) and b.collective is not None
                 and b.collective.role is CollectiveRole.ISSUE)


def ordered_externs(g: BufferGraph) -> tuple[tuple[str, ...], ...]:
    """Chains of externs that must run in the graph's order whatever they read:
    the collective issues (every rank must issue the same collectives in the same
    order) and the externs that draw random numbers (each draw moves the
    generator: a dropout moved before another takes the other's mask).  fuse and
    plan_memory add an edge between neighbours of a chain to the data edges: a
    kernel that needs one draw's result and feeds an earlier draw cannot exist."""
    return (tuple(c.name for c in collectives(g)), tuple(b.name for b in g.buffers if draws_random(b)))


def draws_random(b: Any) -> bool:
    """Whether `b` is an extern that draws from torch's random generator (an op
    tagged nondeterministic_seeded: native_dropout, rand_like, randperm, ...).
    Such externs must run in the graph's order: each draw moves the generator,
    so two swapped give each other's numbers (eager's, for the same seed)."""
    if not isinstance(b, ExternBuffer):
        return False
    return _seeded(b.kernel)


@functools.lru_cache(maxsize=None)
def _seeded(kernel: str) -> bool:
    import torch

    if kernel.startswith("higher_order.") and "rng_state" in kernel:
        return True  # checkpoint's run_and_save_rng_state / run_with_rng_state around a dropout
    op: Any = torch.ops
    try:
        for part in kernel.split("."):
            op = getattr(op, part)
    except (AttributeError, RuntimeError):
        return False
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


COPY_KERNEL = "aten.copy_.default"


def copy_operands(b: Any) -> tuple[str, str] | None:
    """(destination, source) of an extern `copy_(dst, src)` of two buffers, as
    AOTAutograd leaves a graph's writes into its inputs; None for anything else."""
    if not isinstance(b, ExternBuffer) or b.kernel != COPY_KERNEL or b.kwargs or len(b.args) != 2:
        return None
    dst, src = b.args
    return (dst.name, src.name) if isinstance(dst, TensorRef) and isinstance(src, TensorRef) else None
