"""Higher-order ops in lower: each becomes one Extern that calls the op.

A graph that holds control flow (`torch.cond`, `while_loop`, `scan`, `map`), a
region compiled once and called many times (`torch.compiler.nested_compile_region`:
`invoke_subgraph`), flex_attention, a custom op that mutates its arguments
(AOTAutograd wraps it in `auto_functionalized_v2`), a user's Triton kernel
(`triton_kernel_wrapper_functional`) or an int8 matmul into int32 (`out_dtype`)
still compiles: the op is an Extern in graph order, and the rest of the graph
fuses around it.  Inductor lowers these
too (its `Conditional`, `WhileLoop`, `InvokeSubgraph`, the flex templates, the
auto_functionalized decomposition).

An op's subgraphs (FX graphs the tracer made, reached through get_attr) are
`Subgraph` arguments.  Where the op calls a subgraph with tensors (cond's
branches, a loop's body, scan's combine function, map's body, invoke_subgraph's
region), coil compiles it: the runtime compiles each once, with the options
and pipeline the outer graph was compiled with, and hands the op the compiled
function.  flex_attention's score_mod and mask_mod stay FX graphs (`compiled`
off): the op runs them under vmap over the scores, which a compiled kernel
cannot take.  Each choice prints with the Extern (`subgraph(true_graph_0,
compiled)`).

An op not named in HIGHER_ORDER is refused, as before: the Dynamo backend then
runs the graph eagerly, with a log line."""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import torch

from coil.errors import CoilError
from coil.ir.lowered import MapArg, Pointwise, PyTuple, Reduction, Subgraph, TensorRef
from coil.passes.lowerings.registry import LowerCtx, TensorValue


@attrs.frozen(eq=False)
class SubgraphAttr:
    """What lower holds for a get_attr node naming a GraphModule (a subgraph), until
    the higher-order op that reads it says how it is called."""

    name: str
    gm: torch.fx.GraphModule


# the higher-order ops lower takes, each with whether it calls its subgraphs with
# tensors (they are compiled) or under a transform (they stay FX graphs)
HIGHER_ORDER: dict[str, bool] = {
    "cond": True,
    "while_loop": True,
    "scan": True,
    "map_impl": True,
    "invoke_subgraph": True,
    "flex_attention": False,
    "flex_attention_backward": False,
    "auto_functionalized": False,  # no subgraph: a mutating op, its arguments cloned first
    "auto_functionalized_v2": False,
    "triton_kernel_wrapper_functional": False,  # a user's Triton kernel, its outputs cloned first
    "run_and_save_rng_state": False,  # activation checkpointing's recomputed random ops
    "run_with_rng_state": False,
    "out_dtype": False,  # an op computed into another dtype (int8 matmuls accumulating in int32)
}

# ops whose call waits for the GPU: the host reads a tensor to choose the branch
# or to end the loop (a CUDA graph cannot record them)
HOST_DECIDES = frozenset({"cond", "while_loop"})


def hop_name(target: Any) -> str | None:
    """The higher-order op's name, or None for any other target."""
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name()
    return None


def compiled_subgraph(a: SubgraphAttr) -> Subgraph:
    """The Subgraph coil compiles of a subgraph: its inputs that nothing in it reads
    dropped (make_fx leaves those without a fake value), the others' fake values
    its example inputs.  One that a read input lacks a value for stays FX."""
    places = list(a.gm.graph.find_nodes(op="placeholder"))
    used = tuple(k for k, n in enumerate(places) if n.users)
    if any("val" not in places[k].meta for k in used):
        return Subgraph(a.name, a.gm, (), False)
    gm = a.gm
    if len(used) < len(places):
        graph = a.gm.graph.__deepcopy__()
        for n in list(graph.find_nodes(op="placeholder")):
            if not n.users:
                graph.erase_node(n)
        gm = torch.fx.GraphModule(a.gm, graph)
    return Subgraph(a.name, gm, tuple(places[k].meta["val"] for k in used), True, used, len(places))


def _arg(a: Any, compiled: bool) -> Any:
    """An argument of the op as the Extern holds it."""
    if isinstance(a, TensorValue):
        return TensorRef(a.name)
    if isinstance(a, SubgraphAttr):
        return compiled_subgraph(a) if compiled else Subgraph(a.name, a.gm, (), False)
    if isinstance(a, tuple):
        return PyTuple(_arg(x, compiled) for x in a)
    if isinstance(a, list):
        return tuple(_arg(x, compiled) for x in a)
    if isinstance(a, dict):
        if not all(isinstance(k, str) for k in a):
            raise CoilError(f"a dict argument with keys {list(a)} (only str keys are taken)")
        return MapArg(tuple((k, _arg(v, compiled)) for k, v in a.items()))
    if isinstance(a, torch.fx.GraphModule):
        raise CoilError("a subgraph passed without a get_attr name")
    return a


def _writable(ctx: LowerCtx, fx_arg: Any, value: Any, node: torch.fx.Node) -> bool:
    """Whether the op may write into `value` in place of a clone of it: a tensor one
    of coil's kernels computes (not an input, a view or an extern's result, which
    may share storage with what others read) that nothing but this op reads."""
    if not isinstance(fx_arg, torch.fx.Node) or not isinstance(value, TensorValue) or set(fx_arg.users) != {node}:
        return False
    made = next((n for n in reversed(ctx.nodes) if n.name == value.name), None)
    return isinstance(made, (Pointwise, Reduction))


def reinplace(ctx: LowerCtx, name: str, node: torch.fx.Node, kwargs: dict[str, Any]
              ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A functional wrapper of a mutating op clones what the op writes into.  Where
    that tensor is a temporary nothing else reads, the op writes into it instead
    (Inductor's reinplacing of these wrappers): auto_functionalized_v2's
    `_only_clone_these_bases`; the op then returns such a base as it is, and its
    readers read that result (a MultiOutput, after the Extern).  Returns the kwargs
    and the tensors now written in place (the Extern's `mutated`).

    triton_kernel_wrapper_functional is not reinplaced: with fewer
    `tensors_to_clone` it returns only the clones, and coil's IR has no name for
    "this buffer, after that Extern wrote it" to give the readers of the others."""
    if name == "auto_functionalized_v2":
        bases, fx_bases = kwargs.get("_all_bases") or [], node.kwargs.get("_all_bases") or []
        cloned = kwargs.get("_only_clone_these_bases")
        cloned = tuple(range(len(bases))) if cloned is None else tuple(cloned)
        names = [b.name if isinstance(b, TensorValue) else None for b in bases]
        twice = {n for n in names if n is not None and names.count(n) > 1}
        keep = tuple(i for i in cloned if i >= len(fx_bases) or names[i] in twice
                     or not _writable(ctx, fx_bases[i], bases[i], node))
        if keep == cloned:
            return kwargs, ()
        inplace = tuple(bases[i].name for i in cloned if i not in keep)
        return {**kwargs, "_only_clone_these_bases": keep}, inplace
    return kwargs, ()


def lower_higher_order(ctx: LowerCtx, target: Any, args: Sequence[Any], kwargs: dict[str, Any], val: Any,
                       node: torch.fx.Node) -> Any:
    """A higher-order op as one Extern (`higher_order.<name>`) whose results are its
    MultiOutputs; its subgraph arguments are Subgraphs (see the module's doc)."""
    from coil.passes.lower import make_extern

    name = hop_name(target)
    if name not in HIGHER_ORDER:
        raise CoilError(f"the higher-order op {name} is not one coil takes (passes/higher_order.py: HIGHER_ORDER)",
                        stage="lower", node=ctx.origin)
    compiled = HIGHER_ORDER[name]
    kwargs, mutated = reinplace(ctx, name, node, kwargs)
    refs = tuple(_arg(a, compiled) for a in args)
    kw = tuple(sorted((k, _arg(v, compiled)) for k, v in kwargs.items()))
    return make_extern(ctx, f"higher_order.{name}", refs, kw, val, mutated)
