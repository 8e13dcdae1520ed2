"""AOTAutograd's joint graph, rewritten before the min-cut partitioner splits it.

A copy whose result is indistinguishable from its source (same sizes, strides,
storage offset, dtype and device) costs nothing in eager, but in the joint graph
it is a second tensor: where the backward reads both, the partitioner saves both.
T5's attention shows it: dropout at p=0 traces as `clone(probs)`; the backward
reads `probs` (the softmax's gradient) and the clone (the matmul's), so the
forward saved the attention probabilities twice, 24 x 16 MiB at the models
suite's large size on the GPU and the CPU alike (Inductor, which drops such copies
in its joint-graph passes, saves them once).

`drop_noop_copies` replaces each such copy by its source, where that cannot be
seen: never where the graph mutates anything (a copy then may be what keeps a
value from a later write), and never where it would make a graph output share
storage with an input or with another output (AOTAutograd has already recorded
which outputs alias what)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq
from torch.multiprocessing.reductions import StorageWeakRef

log = logging.getLogger("coil")

aten = torch.ops.aten

# ops whose first argument is their source; each is a no-op where the metadata matches
_COPIES = frozenset({aten.clone.default, aten.alias.default, aten._to_copy.default,
                     torch.ops.prims.convert_element_type.default})
# _to_copy's keywords that leave a same-metadata result a copy and nothing more
_TO_COPY_PLAIN = frozenset({"dtype", "device", "layout", "memory_format"})


def _val(node: Any) -> torch.Tensor | None:
    """A node's strided tensor value; None for anything else (a sparse gradient of
    `nn.Embedding(sparse=True)` has no storage to compare)."""
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) and val.layout == torch.strided else None


def _storage(node: Any) -> Any:
    val = _val(node)
    return None if val is None else StorageWeakRef(val.untyped_storage())


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal metadata, symbolic sizes only where equal for every value (no guard added)."""
    return (a.dtype == b.dtype and a.device == b.device and a.layout == b.layout
            and a.dim() == b.dim()
            and statically_known_true(sym_eq(tuple(a.shape), tuple(b.shape)))
            and statically_known_true(sym_eq(tuple(a.stride()), tuple(b.stride())))
            and statically_known_true(sym_eq(a.storage_offset(), b.storage_offset())))


def _mutates(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def drop_noop_copies(graph: torch.fx.Graph) -> int:
    """Replace the no-op copies of `graph` by their sources (above); the number
    replaced.  The graph is changed in place, as the partitioner's own passes do."""
    if any(_mutates(n) for n in graph.nodes):
        return 0
    inputs = {_storage(n) for n in graph.find_nodes(op="placeholder")} - {None}
    (out,) = graph.find_nodes(op="output")
    outputs = {_storage(a) for a in torch.utils._pytree.tree_leaves(out.args)} - {None}
    dropped = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _COPIES:
            continue
        src = node.args[0]
        got, want = _val(node), _val(src)
        if got is None or want is None or not _same_tensor(got, want):
            continue
        if node.target is aten._to_copy.default and not set(node.kwargs) <= _TO_COPY_PLAIN:
            continue  # non_blocking, pin_memory: leave those to eager's meaning
        if _storage(node) in outputs and _storage(src) in inputs | outputs:
            continue  # an output would share storage it does not share now
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        dropped += 1
    return dropped


def partition_fn(partition: Callable[..., Any], noop_copies: bool = True) -> Callable[..., Any]:
    """`partition` (AOTAutograd's partition_fn) run on the joint graph after
    drop_noop_copies (with `noop_copies`; Options.joint_noop_copies)."""

    def run(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        if noop_copies and (n := drop_noop_copies(joint.graph)):
            joint.graph.lint()
            joint.recompile()
            log.debug("coil: dropped %d no-op copies from the joint graph", n)
        return partition(joint, joint_inputs, **kwargs)

    return run
