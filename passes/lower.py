"""lower : FxGraph -> LoweredGraph

Walks the FX graph once.  Each call_function node goes, in this order, to:
1. its lowering in LOWERINGS (pointwise, reduction, view, creation ops, ...);
2. coil's decomposition table: the decomposition is traced into a small FX graph
   and lowered node by node, so softmax or layer_norm arrive as pointwise ops and
   reductions;
3. an `Extern` fallback that calls the aten op as it is.
No model fails to compile for want of a lowering.  A node that reads or makes a
tensor of a dtype no target's kernels handle (complex, float8, ...) goes straight
to 3, node by node, so the rest of the graph still fuses around it.  Tensor
constants (get_attr) become inputs that the compiled module holds; an effectful
call (`with_effects`, e.g. the error check after linalg.inv) runs as an Extern in
graph order and hands its token on.  Last, `prefer_channels_last`
(passes/layout.py) lays the tensors around 2-d convolutions out channels-last where
the target's trait asks for it.

Data-dependent sizes (nonzero, masked_select, x[mask] traced with
capture_dynamic_output_shape_ops): the Extern's fake result is sized by the
ShapeEnv's unbacked symbols, which become coil's `u0, u1, ...` (SizeMap.admit_unbacked);
`sym_size` of it is `u0`, and the runtime asserts Dynamo adds about it are dropped
where the ranges prove them, else kept as Externs (`_range_fact`).
"""

from __future__ import annotations

import collections
import logging
import operator
from typing import Any, Sequence

import attrs
import sympy
import torch
import torch.fx

from coil.errors import CoilError
from coil.ir.indexing import numel
from coil.ir.layout import Layout
from coil.ir.shapes import NO_SIZES, GraphSizes, Size, is_unbacked_symbol, norm
from coil.ir.lowered import Extern, Input, LoweredGraph, MultiOutput, TensorRef
from coil.options import Options
from coil.passes.higher_order import SubgraphAttr, hop_name, lower_higher_order
from coil.passes.layout import attention_input_strides, prefer_channels_last
from coil.passes.lowerings import DECOMPOSITIONS, ONE_DEVICE_DECOMPOSITIONS
from coil.passes.lowerings.registry import LowerCtx, NeedsStaticSizes, TensorValue, find_lowering, xsyms
from coil.passes.lowerings.indirect import origin_errors, retag_checks
from coil.passes.lowerings.scatters import index_add_into_addend
from coil.passes.symbolic import STATIC, SizeMap, is_float_size, is_nested_int, size_arith

log = logging.getLogger("coil.trace")


@attrs.frozen(eq=False)
class FxGraph:
    """The pipeline's input: an FX graph of aten ops and its example inputs."""

    gm: torch.fx.GraphModule
    example_inputs: tuple[Any, ...]

    def device(self) -> str:
        return compute_device(self.gm, self.example_inputs)


def compute_device(gm: torch.fx.GraphModule | None, example_inputs: Sequence[Any]) -> str:
    """The device a graph computes on: the first one other than the CPU among its
    tensor inputs, else among the values its nodes make (Dynamo's `val`s), else the
    CPU.  A graph may take no tensor at all and build CUDA tensors from sizes
    (transformers' attention masks), or take a CPU scalar first."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if gm is not None:
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and n.op != "placeholder":
                tensors.append(v)
    for t in tensors:
        if t.device.type not in ("cpu", "meta"):
            return str(t.device)
    return "cpu"


def _short(target: Any) -> str:
    name = getattr(target, "__name__", str(target))
    if isinstance(target, torch._ops.OpOverload):
        name = target._opname
    return name


def ensure_meta(fx: FxGraph) -> dict[str, Any]:
    """Fake values of every node: from node.meta['val'] when the tracer left them,
    else from a FakeTensorProp run (graphs from symbolic_trace)."""
    nodes = list(fx.gm.graph.nodes)
    if all("val" in n.meta or _returns_nothing(n) for n in nodes if n.op in ("placeholder", "call_function")):
        # a runtime assert (_assert_scalar) or a range declaration has no value to record; a
        # FakeTensorProp run could not replace the tracer's values anyway where an op's size
        # depends on data (nonzero: DynamicOutputShapeException without the tracer's ShapeEnv)
        return {n.name: n.meta["val"] for n in nodes if "val" in n.meta}
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    vals: dict[str, Any] = {}
    env: dict[torch.fx.Node, Any] = {}
    ph = iter(fx.example_inputs)
    with mode:
        for n in nodes:
            if n.op == "placeholder":
                x = next(ph)
                env[n] = mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
            elif n.op == "call_function":
                a, k = torch.fx.node.map_arg((n.args, n.kwargs), lambda m: env[m])
                env[n] = n.target(*a, **k)
            elif n.op == "get_attr":
                env[n] = mode.from_tensor(getattr(fx.gm, str(n.target)))
            else:
                continue
            vals[n.name] = env[n]
    return vals


def _returns_nothing(n: torch.fx.Node) -> bool:
    """A call made for its effect only, which a tracer leaves without a value."""
    return (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and not n.target._schema.returns)


def _layout_of_val(v: Any, device: str, sm: SizeMap = STATIC) -> Layout:
    dev = str(v.device) if str(v.device) != "meta" else device
    size, stride, offset = sm.layout_parts(v)
    return Layout(size, stride, v.dtype, dev, offset)


def _to_ref(x: Any) -> Any:
    if isinstance(x, TensorValue):
        return TensorRef(x.name)
    if isinstance(x, (list, tuple)):
        return tuple(_to_ref(a) for a in x)
    return x


def _eager_strides(kernel: str, args: Sequence[Any], arg_vals: Sequence[Any]) -> tuple[tuple[int, ...] | None, ...]:
    """An attention kernel's argument strides as eager handed them (its fake
    inputs'), which passes/layout.py gives it back; () for other kernels, and for
    symbolic strides."""
    if "scaled_dot_product" not in kernel or len(arg_vals) != len(args):
        return ()
    out = tuple(tuple(v.stride()) if isinstance(a, TensorValue) and isinstance(v, torch.Tensor) else None
                for a, v in zip(args, arg_vals))
    if any(st is not None and not all(isinstance(x, int) for x in st) for st in out):
        return ()
    return out


def lower_extern(ctx: LowerCtx, target: Any, args: Sequence[Any], kwargs: dict[str, Any], val: Any,
                 arg_vals: Sequence[Any] = ()) -> Any:
    """The fallback: keep the aten call whole; its result layout comes from the fake
    value.  Tuple results become MultiOutput nodes.  `arg_vals`: the fake values of
    the node's arguments (an attention kernel keeps their strides)."""
    kernel = str(target) if isinstance(target, torch._ops.OpOverload) else _short(target)
    if not isinstance(target, torch._ops.OpOverload):
        raise CoilError(f"cannot call {target!r} as an extern (not an aten op)", stage="lower", node=ctx.origin)
    mutated = tuple(
        a.name
        for arg, a in zip(target._schema.arguments, args)
        if arg.alias_info is not None and arg.alias_info.is_write and isinstance(a, TensorValue)
    )
    refs = tuple(_to_ref(a) for a in args)
    kw = tuple(sorted((k, _to_ref(v)) for k, v in kwargs.items()))
    if val is None and not target._schema.returns:  # called for its effect (a check that raises)
        make_extern(ctx, kernel, refs, kw, None, mutated)
        return None
    return make_extern(ctx, kernel, refs, kw, val, mutated, _sized_by_data(target, args, kwargs),
                       _eager_strides(kernel, args, arg_vals))


def make_extern(ctx: LowerCtx, kernel: str, refs: tuple[Any, ...], kw: tuple[tuple[str, Any], ...], val: Any,
                mutated: tuple[str, ...], sized: bool = False,
                arg_strides: tuple[tuple[int, ...] | None, ...] = ()) -> Any:
    """The Extern of `kernel` called with `refs` and `kw` (arguments as the IR holds
    them), its result(s) laid out as the fake value `val` says: a tensor; None for
    a call made for its effect; a tuple, list or dict of MultiOutputs (a result that
    is not a tensor is None there)."""
    if any(is_float_size(a) for a in torch.utils._pytree.tree_leaves((refs, kw))):
        raise CoilError(f"{kernel}: an argument is a float computed from sizes, which only kernels take",
                        stage="lower", node=ctx.origin)
    if ctx.sizes is not STATIC:  # the sizes only its run knows become u0, u1, ... (SizeMap.admit_unbacked)
        ctx.sizes.admit_unbacked(val)
    if isinstance(val, torch.Tensor):
        return ctx.add(Extern(ctx.fresh(), kernel, refs, kw, _layout_of_val(val, ctx.device, ctx.sizes), ctx.origin,
                              ctx.op, mutated, sized, arg_strides))
    if isinstance(val, torch.SymInt) and ctx.sizes is not STATIC:  # `.item()` of an int: a size its run gives
        size = ctx.sizes.size(val)
        if not (isinstance(size, sympy.Symbol) and is_unbacked_symbol(size)):
            raise CoilError(f"extern {kernel} returns the size {size}, not a data-dependent symbol of its own",
                            stage="lower", node=ctx.origin)
        ctx.append(Extern(ctx.fresh(), kernel, refs, kw, None, ctx.origin, ctx.op, mutated, scalar=size))
        return size
    if val is None:
        ctx.append(Extern(ctx.fresh(), kernel, refs, kw, None, ctx.origin, ctx.op, mutated))
        return None
    if isinstance(val, (tuple, list, dict)):
        ext = Extern(ctx.fresh(), kernel, refs, kw, None, ctx.origin, ctx.op, mutated, sized, arg_strides)
        ctx.append(ext)
        return _multi_outputs(ctx, ext.name, val, ())
    raise CoilError(f"extern {kernel} returns {type(val).__name__}, not a tensor", stage="lower", node=ctx.origin)


def _multi_outputs(ctx: LowerCtx, extern: str, val: Any, path: tuple[int | str, ...]) -> Any:
    """The results of a tuple Extern as `val` nests them: a MultiOutput for each
    tensor, indexed by its path (`buf3[1][0]`: a higher-order op such as
    run_and_save_rng_state returns its op's tuple inside its own), None for what
    is not a tensor."""
    if isinstance(val, torch.Tensor):
        return ctx.add(MultiOutput(ctx.fresh(), extern, path, _layout_of_val(val, ctx.device, ctx.sizes),
                                   ctx.origin, ctx.op))
    if isinstance(val, dict):
        return {k: _multi_outputs(ctx, extern, v, (*path, k)) for k, v in val.items()}
    if isinstance(val, (tuple, list)):
        return tuple(_multi_outputs(ctx, extern, v, (*path, i)) for i, v in enumerate(val))
    return None


# every dtype the kernels of every target load, compute and store (the cpp and
# triton type tables cover it; a test holds them to it)
KERNEL_DTYPES = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool,
})

# ops whose result's size depends on the values they read
SIZED_BY_DATA = frozenset({
    "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
    "bincount", "repeat_interleave", "argwhere",
})


def _tensor_dtypes(x: Any) -> list[torch.dtype]:
    return [t.dtype for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, (TensorValue, torch.Tensor))]


def kernels_take(args: Any, val: Any) -> bool:
    """Whether every tensor the node reads and makes has a dtype kernels handle."""
    return all(d in KERNEL_DTYPES for d in _tensor_dtypes(args) + _tensor_dtypes(val))


def _sized_by_data(target: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    name = _short(target)
    if name in SIZED_BY_DATA:
        # repeat_interleave given its output_size has that size, whatever the repeats
        return not (name == "repeat_interleave" and kwargs.get("output_size") is not None)
    # x[mask]: a boolean index selects as many elements as the mask holds
    return name == "index" and any(
        isinstance(t, TensorValue) and t.dtype in (torch.bool, torch.uint8)
        for t in torch.utils._pytree.tree_leaves(args[1:] if len(args) > 1 else ()))


def _meta_arg(x: Any, vals: dict[str, Any]) -> Any:
    if isinstance(x, torch.fx.Node):
        v = vals[x.name]
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        return v
    return x


def _mutable(x: Any) -> Any:
    """FX's immutable lists and dicts (of a node's arguments) as plain ones."""
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        items = [_mutable(a) for a in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        return {k: _mutable(v) for k, v in x.items()}
    return x


def loose_sizes(flat: Sequence[Any]) -> list[bool]:
    """For each of a call's flattened arguments, whether it is a SymInt that no tensor
    among them has in its sizes (`.item()`'s u0 given to new_full): make_fx cannot
    trace it from them, so a decomposition takes it as an input of its own, in
    argument order with the tensors."""
    known = {s for t in flat if isinstance(t, torch.Tensor)
             for v in (*t.shape, *t.stride()) if isinstance(v, torch.SymInt) for s in v.node.expr.free_symbols}
    return [isinstance(a, torch.SymInt) and a.node.shape_env is not None and bool(a.node.expr.free_symbols - known)
            for a in flat]


def decompose_inputs(node: torch.fx.Node, vals: dict[str, Any], args: Any, kwargs: Any) -> list[Any]:
    """What lower hands a decomposition's graph (decompose) for its placeholders: the
    node's tensors and its loose sizes (loose_sizes), in argument order."""
    fake = torch.utils._pytree.tree_leaves(torch.fx.node.map_arg((node.args, node.kwargs), lambda m: vals.get(m.name)))
    ours = torch.utils._pytree.tree_leaves((args, kwargs))
    if len(fake) != len(ours):
        return [a for a in ours if isinstance(a, TensorValue)]
    return [o for o, loose in zip(ours, loose_sizes(fake)) if isinstance(o, TensorValue) or loose]


def decompose(node: torch.fx.Node, vals: dict[str, Any], device: str | None = None) -> torch.fx.Graph:
    """Trace the decomposition of one node on meta tensors into a small FX graph.
    The node's lists reach it as plain lists: some decompositions write into
    theirs (`_unsafe_masked_index_put_accumulate` clamps its indices in place)."""
    fakes = [vals[a.name] for a in node.all_input_nodes if isinstance(vals.get(a.name), torch.Tensor)]
    sized = any(isinstance(vals.get(a.name), torch.SymInt) for a in node.all_input_nodes)  # new_full((u0,), ...)
    if sized or any(isinstance(s, torch.SymInt) for t in fakes for s in (*t.shape, *t.stride())):
        # symbolic sizes: trace on the graph's own fake tensors, under its fake mode, so the
        # sizes stay the ShapeEnv's symbols (a guard the decomposition takes is Dynamo's to keep)
        from torch._guards import detect_fake_mode

        mode = detect_fake_mode(fakes)
        if mode is not None:
            args, kwargs = torch.fx.node.map_arg((_mutable(node.args), _mutable(node.kwargs)), lambda m: vals[m.name])
            with mode:
                return trace_decomposition(node.target, args, kwargs, device)
    args, kwargs = torch.utils._pytree.tree_map(lambda a: _meta_arg(a, vals), (_mutable(node.args), _mutable(node.kwargs)))
    key = _trace_key(node.target, args, kwargs, device)
    if key is not None and (graph := _TRACED.get(key)) is not None:
        _TRACED.move_to_end(key)
        return graph
    graph = trace_decomposition(node.target, args, kwargs, device)
    if key is not None:
        _TRACED[key] = graph
        while len(_TRACED) > _TRACED_MOST:
            _TRACED.popitem(last=False)
    return graph


# Decompositions traced on meta tensors, by what the trace depends on (_trace_key):
# the op, the device, torch's deterministic and default-dtype modes, and its
# arguments with each tensor given by its shape, strides, offset and dtype.  A
# traced graph is only read afterwards (_lower_graph_into), so one trace serves
# every node that asks the same: MobileNetV2's training graphs at the CPU size spent
# 20 of their 47 s of passes in 178 traces (make_fx), 52 of them BatchNorm's
# backward at a handful of shapes.
_TRACED: "collections.OrderedDict[Any, torch.fx.Graph]" = collections.OrderedDict()
_TRACED_MOST = 4096


def _trace_key(target: Any, args: Any, kwargs: Any, device: str | None) -> Any:
    """What a static-size decomposition's trace depends on, hashable; None where an
    argument is of a kind the key does not know (that node is traced afresh)."""
    def part(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return ("tensor", tuple(a.shape), tuple(a.stride()), a.storage_offset(), a.dtype, str(a.device))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(part(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, part(v)) for k, v in sorted(a.items())))
        if isinstance(a, float):  # repr keeps -0.0 apart from 0.0, and nan equal to itself
            return ("float", repr(a))
        if a is None or isinstance(a, (bool, int, str, torch.dtype, torch.device, torch.memory_format,
                                       torch.layout)):
            return (type(a).__name__, a)
        raise TypeError(type(a).__name__)

    try:
        # and the global modes a decomposition reads (embedding's backward keeps
        # index_put under deterministic algorithms; factories take the default dtype)
        modes = (torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype())
        return (target, device, modes, part(args), part(kwargs))
    except TypeError:
        return None


def trace_decomposition(target: Any, args: Any, kwargs: Any, device: str | None = None) -> torch.fx.Graph:
    """Trace `target`'s decomposition into a small FX graph, its tensor arguments
    (meta tensors in `args` and `kwargs`) as placeholders in the order they come.
    Tensors the decomposition creates (`scalar_tensor(..., device=x.device)`) would
    land on the meta device: they are moved to `device`, the graph's.  On meta
    tensors with static sizes a plain recorder does it (`_record`); anything it does
    not know (a tensor from outside the trace, a symbolic size) goes to make_fx."""
    flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    tensor_pos = [i for i, (a, loose) in enumerate(zip(flat, loose_sizes(flat))) if isinstance(a, torch.Tensor) or loose]
    decomp = DECOMPOSITIONS[target]

    def run(*tensors: torch.Tensor) -> Any:
        full = list(flat)
        for i, t in zip(tensor_pos, tensors):
            full[i] = t
        a, k = torch.utils._pytree.tree_unflatten(full, spec)
        return decomp(*a, **k)

    tensors = [flat[i] for i in tensor_pos]
    graph = None
    if all(t.device.type == "meta" for t in tensors) and not any(
            isinstance(s, torch.SymInt) for t in tensors for s in (*t.shape, *t.stride())):
        graph = _record(run, tensors)
    if graph is None:
        from torch.fx.experimental.proxy_tensor import make_fx

        # no table: nested ops come back at aten level and go through `_lower_node` again
        graph = make_fx(run)(*tensors).graph
    for n in graph.nodes:
        if device is not None and n.kwargs.get("device") == torch.device("meta"):
            n.kwargs = {**n.kwargs, "device": torch.device(device)}
    return graph


class _Unrecorded(Exception):
    """The recorder met what only make_fx knows how to trace."""


class _Recorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Runs every aten op a decomposition calls on its meta tensors and writes it into
    `graph`, each tensor argument as the node that made it.  What make_fx's proxy mode
    does, without its fake copies of every value: MobileNetV2's BatchNorm backward
    traces in about a tenth of make_fx's 0.1 s.  An op that returns one of its
    arguments (an in-place op) makes that tensor this op's node from then on, as in
    make_fx; each tensor of a tuple result is a getitem node of it."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        super().__init__()
        self.graph = graph
        self.node_of: dict[int, torch.fx.Node] = {}
        self.kept: list[Any] = []  # every value seen stays alive: ids are not reused

    def bind(self, t: torch.Tensor, node: torch.fx.Node) -> None:
        self.kept.append(t)
        self.node_of[id(t)] = node

    def node(self, t: torch.Tensor) -> torch.fx.Node:
        if (n := self.node_of.get(id(t))) is None:
            raise _Unrecorded("a tensor from outside the trace")
        return n

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.OpOverload) or torch.Tag.dynamic_output_shape in func.tags:
            raise _Unrecorded(str(func))
        if func not in _SHAPE_QUERIES and not _has_meta_kernel(func):
            # a CompositeImplicitAutograd op autograd did not decompose (no autograd on
            # these tensors): decomposed here, as make_fx does (sigmoid_backward's conj_physical)
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        a, k = torch.utils._pytree.tree_map_only(torch.Tensor, self.node, (args, kwargs))
        out = func(*args, **kwargs)
        n = self.graph.create_node("call_function", func, tuple(a), k, name=func.overloadpacket.__name__)
        n.meta["val"] = out
        if isinstance(out, torch.Tensor):
            self.bind(out, n)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    item = self.graph.create_node("call_function", operator.getitem, (n, i), name="getitem")
                    item.meta["val"] = o
                    self.bind(o, item)
        elif out is not None and not isinstance(out, (bool, int, float)):
            raise _Unrecorded(f"{func} returned {type(out).__name__}")
        return out


def _has_meta_kernel(func: torch._ops.OpOverload) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "Meta"))
    except RuntimeError:  # an op only Python knows (prim::device): it runs as it is
        return True


_SHAPE_QUERIES = (torch.ops.aten.size.default, torch.ops.aten.stride.default, torch.ops.aten.storage_offset.default)


def _record(run: Any, tensors: Sequence[torch.Tensor]) -> torch.fx.Graph | None:
    """`run(*tensors)` recorded by `_Recorder` into an FX graph, or None where the
    recorder cannot (make_fx traces it then).  No GraphModule: its code would be
    generated and compiled (10 ms) for a graph that is only read."""
    from torch._dispatch.python import enable_python_dispatcher

    graph = torch.fx.Graph()
    rec = _Recorder(graph)
    for i, t in enumerate(tensors):
        p = graph.placeholder(f"arg{i}_1")
        p.meta["val"] = t
        rec.bind(t, p)
    try:
        with enable_python_dispatcher(), rec:
            out = run(*tensors)
        result = torch.utils._pytree.tree_map_only(torch.Tensor, rec.node, out)
    except _Unrecorded as e:
        log.debug("decomposition recorder: %s; make_fx traces it", e)
        return None
    graph.output(result)
    return graph


def _guard_spelled(ctx: LowerCtx, out: Any) -> Any:
    """A lowering's result with each size as SizeMap spells it under Dynamo's
    guards (ShapeInfo.reduce): a slice computes `(s0//8 - 1)//2` where the guards
    make it `s0//16`, and broadcasting, concatenation and fusion then see one
    size, not two.  The identity view this takes folds into its readers."""
    shapes = ctx.sizes.shapes
    if not shapes.rules:
        return out
    if isinstance(out, (list, tuple)):
        return type(out)(_guard_spelled(ctx, v) for v in out)
    if not isinstance(out, TensorValue):
        return out
    size = tuple(shapes.reduce(v) for v in out.size)
    return out if size == out.size else ctx.view(out, size, xsyms(len(size)))


def _lower_node(ctx: LowerCtx, node: torch.fx.Node, args: Any, kwargs: Any, vals: dict[str, Any], depth: int) -> Any:
    target = node.target
    if (size := _size_op(ctx, target, args)) is not None:
        return size
    if target is operator.getitem:
        seq, i = args
        return seq[i]
    if isinstance(target, type) and issubclass(target, tuple):  # a decomposition's named tuple
        return tuple(args)
    if target is torch.ops.higher_order.with_effects:
        return _lower_with_effects(ctx, node, args, kwargs, vals)
    if hop_name(target) is not None:
        return lower_higher_order(ctx, target, args, kwargs, vals.get(node.name), node)
    if isinstance(target, torch._ops.OpOverload) and not kernels_take((args, kwargs), vals.get(node.name)):
        log.debug("lower %s: %s -> extern fallback (a dtype kernels do not handle)", node.name, target)
        return lower_extern(ctx, target, args, kwargs, vals.get(node.name))
    if target is torch.ops.aten.convolution.default and ctx.conv_bias_in_kernels and len(args) == 9 \
            and isinstance(args[2], TensorValue) and isinstance(args[2].size[0], int):
        return _peeled_convolution(ctx, args, vals.get(node.name))
    fn = find_lowering(target)
    if fn is not None:
        mark = len(ctx.nodes)
        ctx.arg_vals = tuple(vals.get(a.name) if isinstance(a, torch.fx.Node) else None for a in node.args)
        ctx.out_val = vals.get(node.name)
        try:
            out = fn(ctx, *args, **kwargs)
        except NeedsStaticSizes as e:
            log.debug("lower %s: %s -> extern fallback (%s)", node.name, target, e)
            out = NotImplemented
        except TypeError as e:
            # a lowering written for static sizes that met a symbolic one (a comparison
            # sympy cannot decide, int() of a symbol): the aten op takes any size
            if not ctx.sizes.shapes or not _symbolic_size_error(e):
                raise
            log.debug("lower %s: %s -> extern fallback (symbolic sizes: %s)", node.name, target, e)
            out = NotImplemented
        if out is not NotImplemented:
            log.debug("lower %s: %s -> lowering %s", node.name, target, fn.__name__)
            if (errors := origin_errors(node)) is not None:
                retag_checks(ctx, mark, *errors)  # a decomposed nll_loss's gather raises nll_loss's error
            return _guard_spelled(ctx, out)
        del ctx.nodes[mark:]  # the lowering declined this call: run the aten op
        log.debug("lower %s: %s -> extern fallback (lowering declined)", node.name, target)
        return lower_extern(ctx, target, args, kwargs, vals.get(node.name))
    if target in DECOMPOSITIONS and depth < 8 and not (target in ONE_DEVICE_DECOMPOSITIONS
                                                      and _spans_devices(node, vals, ctx.device)):
        log.debug("lower %s: %s -> decomposition", node.name, target)
        sub = decompose(node, vals, ctx.device)
        return _lower_graph_into(ctx, sub, decompose_inputs(node, vals, args, kwargs), depth + 1)
    log.debug("lower %s: %s -> extern fallback", node.name, target)
    arg_vals = [vals.get(a.name) if isinstance(a, torch.fx.Node) else None for a in node.args]
    return lower_extern(ctx, target, args, kwargs, vals.get(node.name), arg_vals)


def _spans_devices(node: torch.fx.Node, vals: dict[str, Any], device: str) -> bool:
    """Whether a tensor the node takes or makes is on a device other than the
    graph's (eager's values say where): a CUDA optimizer's step counters on the CPU."""
    dev = torch.device(device)
    seen = [vals.get(a.name) for a in node.all_input_nodes] + [vals.get(node.name)]
    return any(isinstance(t, torch.Tensor) and t.device.type != "meta"
               and (t.device.type, t.device.index or 0) != (dev.type, dev.index or 0)
               for v in seen for t in torch.utils._pytree.tree_leaves(v))


def _peeled_convolution(ctx: LowerCtx, args: Sequence[Any], val: Any) -> TensorValue:
    """aten.convolution with a bias, on a target whose kernels add it
    (TargetTraits.conv_bias_in_kernels): the Extern convolves without it, and a
    pointwise add of the bias viewed as (C, 1, ...) makes the result, which fuses
    into what reads the convolution."""
    x, weight, bias, *rest = args
    conv = lower_extern(ctx, torch.ops.aten.convolution.default, (x, weight, None, *rest), {}, val)
    shaped = find_lowering(torch.ops.aten.view.default)
    add = find_lowering(torch.ops.aten.add.Tensor)
    assert shaped is not None and add is not None
    column = shaped(ctx, bias, [bias.size[0]] + [1] * (conv.ndim - 2))
    log.debug("lower %s: convolution's bias peeled off into %s", ctx.origin, column.name)
    return add(ctx, conv, column)


def _symbolic_size_error(e: TypeError) -> bool:
    text = str(e)
    return "Relational" in text or "symbols to int" in text or "Symbol" in text


SIZE_QUERIES = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                torch.ops.aten.sym_storage_offset.default}


def _size_op(ctx: LowerCtx, target: Any, args: Any) -> Any:
    """The value of a node that computes a size: a Python operation on sizes
    (`operator.mul(s0, s1)`) or a size query of a tensor; None for any other node."""
    if target in SIZE_QUERIES:
        x = args[0]
        if not isinstance(x, TensorValue):
            return None
        if target is torch.ops.aten.sym_size.int:
            return x.size[args[1]]
        if target is torch.ops.aten.sym_numel.default:
            return numel(x.size)
        node = next((n for n in ctx.nodes if n.name == x.name), None)
        lay = getattr(node, "layout", None)
        if lay is None:
            raise CoilError(f"{target} of {x.name}, whose layout is not known in lower", stage="lower")
        return lay.stride[args[1]] if target is torch.ops.aten.sym_stride.int else lay.offset
    if target in RANGE_FACTS and ctx.sizes.shapes:
        return _range_fact(ctx, target, args)
    v = size_arith(target, args)  # in a static graph too: Python arithmetic on sizes Dynamo specialized
    # a max or min one side of which is the larger for every size (min(256, s0) with s0 at
    # most 256), and the spelling Dynamo's guards give a size (ShapeInfo.reduce)
    return ctx.sizes.simplify(v) if isinstance(v, sympy.Expr) and not isinstance(v, sympy.logic.boolalg.Boolean) \
        else v


# calls that state a fact about sizes: a runtime assert of a condition on sizes
# (Dynamo's `_assert_scalar(u0 >= 0, ...)`, or a torch._check), and the range
# declarations of `.item()`'s values
RANGE_FACTS = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default,
               torch.ops.aten.sym_constrain_range.default}


def _range_fact(ctx: LowerCtx, target: Any, args: Any) -> Any:
    """A condition on sizes is dropped where coil proves it from the symbols'
    ranges: the ranges hold at run time, as `call` checks every backed symbol's
    range on entry (runtime._check_symbolic) and every data-dependent one's right
    where it binds it (the Bind after its Extern).  The asserts Dynamo adds after a
    nonzero (`u0 >= 0`, `u0 <= numel`) are such range facts.  A condition not proved
    stays, as an Extern that runs `_assert_scalar` on its value (externs keep their
    place after the Extern that binds its symbols: extract_deps orders them)."""
    if target is not torch.ops.aten._assert_scalar.default:
        # sym_constrain_range*: the range is already in the ShapeEnv's var_to_range, and so
        # in coil's facts; a symbol coil does not know (an .item() value) fails in lower
        v = args[0]
        if isinstance(v, sympy.Expr) and not all(s in ctx.sizes.shapes.symbols for s in v.free_symbols):
            raise CoilError(f"{target} of {v}: not a size coil knows", stage="lower")
        return _NOTHING
    cond, msg = args[0], args[1] if len(args) > 1 else ""
    if cond is True or cond == sympy.true:
        return _NOTHING
    if cond is False or cond == sympy.false:
        raise CoilError(f"a runtime assert that always fails: {msg}", stage="lower")
    if not isinstance(cond, sympy.core.relational.Relational):
        raise CoilError(f"_assert_scalar of {cond!r}: not a condition on sizes", stage="lower")
    if _proved(ctx.sizes.shapes, cond):
        log.debug("lower: %s proved by the size ranges, dropped", cond)
        return _NOTHING
    log.debug("lower: %s not proved by the size ranges: checked at run time", cond)
    lower_extern(ctx, target, (cond, msg), {}, None)
    return _NOTHING


_NOTHING = ()  # the value of a node that makes none (no node reads it)


def _proved(shapes: Any, cond: Any) -> bool:
    a, b = norm_size(cond.lhs), norm_size(cond.rhs)
    if a is None or b is None:
        return False
    proof = {sympy.Ge: shapes.known_ge, sympy.Gt: shapes.known_gt, sympy.Le: shapes.known_le,
             sympy.Lt: shapes.known_lt, sympy.Eq: shapes.known_eq, sympy.Ne: shapes.known_ne}.get(type(cond))
    return proof is not None and bool(proof(a, b))


def norm_size(v: Any) -> Size | None:
    try:
        return norm(v)
    except (TypeError, ValueError):
        return None


def _lower_with_effects(ctx: LowerCtx, node: torch.fx.Node, args: Any, kwargs: Any, vals: dict[str, Any]) -> Any:
    """`with_effects(token, op, *args)`: AOTAutograd threads a token through calls
    with side effects so they keep their order.  The op runs as an Extern (externs
    run in graph order); the token it returns is the one it was given (a token
    carries no data)."""
    token, op, *rest = args
    val = vals.get(node.name)
    inner = tuple(val[1:]) if isinstance(val, (tuple, list)) else ()
    if not isinstance(op, torch._ops.OpOverload):
        raise CoilError(f"with_effects of {op!r}: not an aten op", stage="lower", node=ctx.origin)
    ctx.at(ctx.origin, _short(op), ctx.device)
    if not inner:
        lower_extern(ctx, op, rest, kwargs, None)
        return (token,)
    if len(inner) == 1:
        return (token, lower_extern(ctx, op, rest, kwargs, inner[0]))
    return (token, *lower_extern(ctx, op, rest, kwargs, inner))


def _lower_graph_into(ctx: LowerCtx, graph: torch.fx.Graph, inputs: Sequence[Any], depth: int) -> Any:
    vals = {n.name: n.meta["val"] for n in graph.nodes if "val" in n.meta}
    env: dict[torch.fx.Node, Any] = {}
    it = iter(inputs)
    origin, device = ctx.origin, ctx.device
    result: Any = None
    for n in graph.nodes:
        if n.op == "placeholder":
            env[n] = next(it)
        elif n.op == "call_function":
            a, k = torch.fx.node.map_arg((n.args, n.kwargs), lambda m: env[m])
            ctx.at(origin, _short(n.target), device)
            env[n] = _lower_node(ctx, n, a, k, vals, depth)
        elif n.op == "output":
            result = torch.fx.node.map_arg(n.args[0], lambda m: env[m])
    return result


def lower(fx: FxGraph, options: Options) -> LoweredGraph:
    """Lower every FX node to IR nodes; nothing is inlined or named bufN yet."""
    if (rewritten := index_add_into_addend(fx.gm)) is not None:  # a tied embedding's gradient
        fx = attrs.evolve(fx, gm=rewritten)
    vals = ensure_meta(fx)
    device = fx.device()
    ctx = LowerCtx("", "", device)
    ctx.conv_bias_in_kernels = options.traits().conv_bias_in_kernels
    sm = ctx.sizes = SizeMap.of(fx.example_inputs)
    size_inputs: list[tuple[str, Size]] = []
    fixed: list[tuple[str, int]] = []  # SymInt inputs compiled for their first value (SizeMap.fixed)
    order: list[str] = []
    env: dict[torch.fx.Node, Any] = {}
    inputs = iter(fx.example_inputs)
    outputs: tuple[str | None, ...] = ()
    output_strides: tuple[tuple[Size, ...] | None, ...] = ()
    size_outputs: tuple[tuple[int, Size], ...] = ()
    seen_constant = False
    tokens = {n.args[0] for n in fx.gm.graph.nodes if n.target is torch.ops.higher_order.with_effects}
    for n in fx.gm.graph.nodes:
        ctx.reserve(n.name)
    donated = {n.name for k, n in enumerate(fx.gm.graph.find_nodes(op="placeholder")) if k in options.donated_inputs}
    for n in fx.gm.graph.nodes:
        if n.op == "placeholder":
            if seen_constant:
                raise CoilError("a placeholder after a get_attr node: constants must follow the graph's inputs",
                                stage="lower", node=n.name)
            x = next(inputs)
            order.append(n.name)
            if isinstance(x, torch.Tensor):
                lay = Layout.of(x) if not sm.shapes else Layout(*sm.layout_parts(x)[:2], x.dtype, str(x.device),
                                                                 sm.size(x.storage_offset()))
                env[n] = ctx.add(Input(n.name, lay, token=n in tokens, donated=n.name in donated))
                log.debug("lower %s: placeholder -> Input", n.name)
            elif is_nested_int(x):  # a jagged tensor's ragged dim: no size here, passed on as it is
                env[n] = x
                log.debug("lower %s: placeholder -> a nested int, not a size", n.name)
            elif isinstance(x, torch.SymInt):
                env[n] = sm.size(x)
                size_inputs.append((n.name, env[n]))
                if sm.env is not None and sm.env.replace(x.node.expr) in sm.fixed:
                    fixed.append((n.name, env[n]))
                log.debug("lower %s: placeholder -> size %s", n.name, env[n])
            else:
                env[n] = x
        elif n.op == "get_attr":
            env[n] = _constant(ctx, fx, n, device)
            seen_constant = seen_constant or not isinstance(env[n], SubgraphAttr)
        elif n.op == "call_function":
            a, k = torch.fx.node.map_arg((n.args, n.kwargs), lambda m: env[m])
            ctx.at(n.name, _short(n.target), device)
            try:
                env[n] = _lower_node(ctx, n, a, k, vals, 0)
            except CoilError as e:
                if e.stage is None:
                    raise CoilError(str(e), stage="lower", node=n.name) from e
                raise
            except Exception as e:  # noqa: BLE001 - any failure names the stage and node
                raise CoilError(f"{type(e).__name__}: {e}", stage="lower", node=n.name) from e
        elif n.op == "output":
            outs = torch.fx.node.map_arg(n.args[0], lambda m: env[m])
            flat = torch.utils._pytree.tree_leaves(outs)
            outputs = tuple(o.name if isinstance(o, TensorValue) else None for o in flat)
            size_outputs = tuple((i, o) for i, o in enumerate(flat)
                                 if isinstance(o, (int, sympy.Expr)) and not isinstance(o, bool))
            fx_flat = torch.utils._pytree.tree_leaves(n.args[0])
            _check_output_devices(flat, fx_flat, vals)
            output_strides = tuple(_meta_stride(f, vals, sm) for f in fx_flat)
        else:
            raise CoilError(f"unsupported FX op {n.op}", stage="lower", node=n.name)
    if len(output_strides) != len(outputs):
        output_strides = (None,) * len(outputs)
    if options.free_output_strides:  # strides coil may choose (a training forward's saved activations)
        free = set(options.free_output_strides)
        output_strides = tuple(None if i in free else st for i, st in enumerate(output_strides))
    # a static graph may take and return sizes too (a SymInt Dynamo specialized: a cache's length)
    sizes = (NO_SIZES if not (sm.shapes or size_inputs or size_outputs)
             else GraphSizes(sm.shapes, tuple(size_inputs), tuple(order), size_outputs, tuple(fixed)))
    g = prefer_channels_last(LoweredGraph(tuple(ctx.nodes), outputs, output_strides, sizes), options)
    return attention_input_strides(g, options)


def _check_output_devices(flat: Sequence[Any], fx_flat: Sequence[Any], vals: dict[str, Any]) -> None:
    """Every output on the device eager gives it.  coil computes a graph's ops on its
    one device (`compute_device`), moving CPU inputs there, which is right for what
    flows into that device's ops; an output eager leaves on another device would
    come back on the wrong one, so such a graph is refused (the Dynamo backend runs
    it eagerly, with a log line)."""
    for i, (o, f) in enumerate(zip(flat, fx_flat)):
        v = vals.get(f.name) if isinstance(f, torch.fx.Node) else None
        if not isinstance(o, TensorValue) or not isinstance(v, torch.Tensor) or v.device.type == "meta":
            continue
        if torch.device(o.device).type != v.device.type:
            raise CoilError(f"output {i} ({f.name}) is on {v.device} in eager, computed on {o.device}: "
                            "a graph mixing devices whose output stays on another device", stage="lower",
                            node=f.name)


def _constant(ctx: LowerCtx, fx: FxGraph, n: torch.fx.Node, device: str) -> Any:
    """A get_attr node: a tensor constant of the graph becomes an Input holding its
    value.  A CPU scalar in a graph on another device moves there (eager mixes
    them; a kernel reads one device)."""
    value: Any = fx.gm
    for part in str(n.target).split("."):
        value = getattr(value, part, None)
    if isinstance(value, torch.fx.GraphModule):  # a higher-order op's subgraph (passes/higher_order.py)
        return SubgraphAttr(str(n.target), value)
    if not isinstance(value, torch.Tensor):
        raise CoilError(f"get_attr {n.target} is a {type(value).__name__}, not a tensor or a higher-order op's "
                        "subgraph: coil cannot take this graph", stage="lower", node=n.name)
    if value.dim() == 0 and value.device.type == "cpu" and device != "cpu":
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # AOTAutograd compiles under its fake mode
            value = value.to(device)
    log.debug("lower %s: get_attr -> Input (a constant %s)", n.name, list(value.shape))
    return ctx.add(Input(n.name, Layout.of(value), value))


def _meta_stride(f: Any, vals: dict[str, Any], sm: SizeMap = STATIC) -> tuple[Size, ...] | None:
    """The strides the FX graph promises for an output (None if unknown)."""
    if not isinstance(f, torch.fx.Node):
        return None
    v = vals.get(f.name)
    return sm.sizes(v.stride()) if isinstance(v, torch.Tensor) else None
