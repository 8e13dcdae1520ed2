"""LoweredGraph: one IR node per FX node; nothing inlined, nothing named bufN yet.

Grammar::

    LoweredGraph ::= (nodes: LNode*, outputs: (name | None)*)
    LNode ::= Input(name, layout, value, token)        an FX placeholder; or a tensor
                                                       constant (get_attr): value set;
                                                       token: an effect token (None
                                                       at run time)
            | Pointwise(name, ranges, body)            body over x0..x{n-1}
            | Reduction(name, ranges, reduction_ranges, reduction_type, body)
                                                       body over x* and r*
            | View(name, base, ranges, index)          element x of the view is
                                                       element `index` of base
            | Extern(name, kernel, args, kwargs, layout, mutated, sized_by_data)
                                                       an aten call kept whole, or a
                                                       higher-order op's (args may hold
                                                       MapArg and Subgraph); layout
                                                       None: a tuple, or no result
            | MultiOutput(name, extern, index, layout) one result of a tuple Extern

A body reads other nodes only through `Load(name, logical index)`.  Each node keeps
`origin` (its FX node) and `op` (the aten op's short name) so every later buffer
and kernel can be traced back to the source graph.
"""

from __future__ import annotations

import functools

from typing import Any, Union

import attrs
import sympy
import torch

from coil.ir.expr import Expr
from coil.ir.layout import Layout
from coil.ir.shapes import GraphSizes, NO_SIZES, Size, sizes


def _ints(value: Any) -> tuple[Size, ...]:
    return sizes(value)  # ints, or expressions over size symbols (ir/shapes.py)


def _exprs(value: Any) -> tuple[sympy.Expr, ...]:
    return tuple(sympy.sympify(v) for v in value)


@attrs.frozen(cache_hash=True)
class Input:
    name: str
    layout: Layout
    # a tensor constant of the graph (FX get_attr), which the compiled module holds
    # and passes after the caller's inputs; None for a placeholder
    value: Any = attrs.field(default=None, eq=False, repr=False)
    # AOTAutograd's effect token, threaded through `with_effects` calls: the caller
    # passes None in its place
    token: bool = False
    # donated by the caller (Options.donated_inputs): dead after its last reader, so
    # a kernel may write over it in place
    donated: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype

    @property
    def size(self) -> tuple[int, ...]:
        return self.layout.size

    @property
    def device(self) -> str:
        return self.layout.device


@attrs.frozen(cache_hash=True)
class Pointwise:
    name: str
    dtype: torch.dtype
    device: str
    ranges: tuple[Size, ...] = attrs.field(converter=_ints)
    body: Expr
    origin: str
    op: str

    @property
    def size(self) -> tuple[int, ...]:
        return self.ranges


@attrs.frozen(cache_hash=True)
class Reduction:
    name: str
    dtype: torch.dtype
    device: str
    ranges: tuple[Size, ...] = attrs.field(converter=_ints)
    reduction_ranges: tuple[Size, ...] = attrs.field(converter=_ints)
    reduction_type: str
    body: Expr
    origin: str
    op: str

    @property
    def size(self) -> tuple[int, ...]:
        return self.ranges


@attrs.frozen(cache_hash=True)
class View:
    name: str
    base: str
    dtype: torch.dtype
    device: str
    ranges: tuple[Size, ...] = attrs.field(converter=_ints)
    index: tuple[sympy.Expr, ...] = attrs.field(converter=_exprs)
    origin: str
    op: str

    @property
    def size(self) -> tuple[int, ...]:
        return self.ranges


@attrs.frozen(cache_hash=True)
class TensorRef:
    """An Extern argument that is a tensor produced by node `name`."""

    name: str


class PyTuple(tuple):  # type: ignore[type-arg]
    """An Extern argument that is a Python tuple where the op wants one (a
    higher-order op's operands, flex_attention's block mask); any other tuple in an
    Extern's args stands for a list, as aten's int[] and Tensor[] take them."""

    __slots__ = ()


@attrs.frozen(cache_hash=True)
class MapArg:
    """An Extern argument that is a dict (flex_attention's kernel options, the
    tensors a user's Triton kernel takes by name): its items in order, values
    nested as any argument's."""

    items: tuple[tuple[str, Any], ...]


@attrs.frozen(eq=False)
class Subgraph:
    """An Extern argument that is a higher-order op's subgraph (cond's branches, a
    loop's body, a scan's combine function, flex_attention's score_mod): its FX
    graph, the fake values of its inputs, and how the call gets it.  `compiled`:
    coil compiles it (once per name in a module) and the op calls that; else the
    op calls the FX graph as it is, in eager (flex_attention vmaps its score_mod,
    which a compiled kernel cannot be).  Compared by identity: two graphs are
    never taken for one."""

    name: str
    gm: torch.fx.GraphModule = attrs.field(repr=False)
    inputs: tuple[Any, ...] = attrs.field(repr=False)
    compiled: bool
    # a compiled one: the positions of the op's inputs it takes (those it reads), of `arity`
    takes: tuple[int, ...] = ()
    arity: int = 0

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (the graph cache keeps compiled modules): the graph node by node
        (graph_state; GraphModule's own pickle traces its code again, which runs a
        factory op such as `rand` once and keeps its result as a constant), the
        fake inputs as their layouts, made fake again on load.  A symbolic size
        does not pickle."""
        return (_subgraph, (self.name, graph_state(self.gm), tuple(map(_fake_spec, self.inputs)), self.compiled,
                            self.takes, self.arity))

    def __repr__(self) -> str:
        if not self.compiled:
            return f"subgraph({self.name}, eager)"
        some = "" if len(self.takes) == self.arity else f", takes inputs {list(self.takes)} of {self.arity}"
        return f"subgraph({self.name}, compiled{some})"


def _fake_spec(x: Any) -> Any:
    """A subgraph's input as pickle keeps it: a tensor as its layout, else itself."""
    if not isinstance(x, torch.Tensor):
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise TypeError("a subgraph of symbolic sizes is not pickled")
        return x
    if any(isinstance(v, torch.SymInt) for v in (*x.shape, *x.stride(), x.storage_offset())):
        raise TypeError("a subgraph of symbolic sizes is not pickled")
    return ("fake tensor", tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype, str(x.device),
            x.requires_grad)


def _target_state(target: Any) -> Any:
    """An FX node's target as pickle can keep it: an aten (or other namespace's) op
    and a higher-order op by name, anything else (operator.getitem) as itself."""
    if isinstance(target, torch._ops.OpOverload):
        return ("op", target.namespace, target._schema.name.split("::")[1], target._overloadname)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return ("hop", target.name())
    return ("py", target)


def _target(state: Any) -> Any:
    kind, *rest = state
    if kind == "op":
        namespace, name, overload = rest
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    if kind == "hop":
        return getattr(torch.ops.higher_order, rest[0])
    return rest[0]


def graph_state(gm: torch.fx.GraphModule) -> tuple[Any, ...]:
    """A GraphModule as pickle keeps it, node by node with their names: (nodes,
    attributes), each node (op, name, target, args, kwargs) with the nodes it
    reads as their names; the attributes its get_attr nodes read, a subgraph in
    turn as its own state.  graph_module makes it again."""
    nodes, attributes = [], {}
    for n in gm.graph.nodes:
        if n.op == "call_module":  # a submodule's state is more than a graph: not pickled
            raise TypeError(f"a subgraph that calls a module ({n.target}) is not pickled")
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda m: _NodeName(m.name))
        target = n.target if n.op in ("placeholder", "output", "get_attr", "call_method") else _target_state(n.target)
        nodes.append((n.op, n.name, target, args, kwargs))
        if n.op == "get_attr":
            value: Any = gm
            for part in str(n.target).split("."):
                value = getattr(value, part)
            attributes[str(n.target)] = ("graph", graph_state(value)) if isinstance(value, torch.fx.GraphModule) \
                else ("value", value)
    return tuple(nodes), attributes


@attrs.frozen
class _NodeName:
    """A node an argument names, in graph_state."""

    name: str


def graph_module(state: tuple[Any, ...]) -> torch.fx.GraphModule:
    """The GraphModule graph_state describes: its nodes, names and attributes."""
    nodes, attributes = state
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}
    for op, name, target, args, kwargs in nodes:
        a, k = _node_args((args, kwargs), made)
        if op == "output":
            graph.output(a[0])
            continue
        node = graph.create_node(op, target if op in ("placeholder", "get_attr", "call_method") else _target(target),
                                 a, k, name=name)
        made[name] = node
    root = {path: graph_module(v) if kind == "graph" else v for path, (kind, v) in attributes.items()}
    return torch.fx.GraphModule(root, graph)


def _node_args(x: Any, made: dict[str, torch.fx.Node]) -> Any:
    if isinstance(x, _NodeName):
        return made[x.name]
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        items = [_node_args(v, made) for v in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        return {key: _node_args(v, made) for key, v in x.items()}
    return x


def _subgraph(name: str, state: tuple[Any, ...], specs: tuple[Any, ...], compiled: bool, takes: tuple[int, ...],
              arity: int) -> "Subgraph":
    """A pickled Subgraph, its inputs fake tensors again (one fake mode for them all)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = graph_module(state)

    mode = FakeTensorMode()

    def fake(spec: Any) -> Any:
        if not (isinstance(spec, tuple) and spec and spec[0] == "fake tensor"):
            return spec
        _, size, stride, offset, dtype, device, grad = spec
        extent = offset + 1 + sum((n - 1) * st for n, st in zip(size, stride)) if all(size) else 0
        with mode:
            t = torch.empty(extent, dtype=dtype, device=device).as_strided(size, stride, offset)
            return t.requires_grad_(grad) if grad else t

    return Subgraph(name, gm, tuple(map(fake, specs)), compiled, takes, arity)


@attrs.frozen(cache_hash=True)
class Extern:
    name: str
    kernel: str  # e.g. "aten.mm.default": resolved with `resolve_kernel`
    args: tuple[Any, ...]  # nested tuples of TensorRef / python constants
    kwargs: tuple[tuple[str, Any], ...]
    layout: Layout | None  # None when the result is a tuple (see MultiOutput)
    origin: str
    op: str
    mutated: tuple[str, ...] = ()
    # its result's size depends on the values it reads (nonzero, a boolean mask):
    # the traced size holds for the example inputs only
    sized_by_data: bool = False
    # an attention kernel's: the strides eager handed each top-level argument (None: not a
    # tensor), which its meta function computed the result's layout for (passes/layout.py)
    arg_strides: tuple[tuple[int, ...] | None, ...] = ()
    # its result is a number, not a tensor: the data-dependent size `u0` it gives
    # (`.item()` under capture_scalar_outputs), which the wrapper binds from it
    scalar: Any = None

    @property
    def size(self) -> tuple[int, ...]:
        assert self.layout is not None
        return self.layout.size

    @property
    def dtype(self) -> torch.dtype:
        assert self.layout is not None
        return self.layout.dtype


@attrs.frozen(cache_hash=True)
class MultiOutput:
    name: str
    extern: str
    index: tuple[int | str, ...]  # a str: a key of a dict result
    layout: Layout
    origin: str
    op: str

    @property
    def size(self) -> tuple[int, ...]:
        return self.layout.size

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.dtype


LNode = Union[Input, Pointwise, Reduction, View, Extern, MultiOutput]


@attrs.frozen
class LoweredGraph:
    nodes: tuple[LNode, ...]
    outputs: tuple[str | None, ...]
    # the strides the FX graph promises for each output (its meta values); callers
    # such as AOTAutograd's backward and some aten kernels rely on them
    output_strides: tuple[tuple[Size, ...] | None, ...] = ()
    sizes: GraphSizes = NO_SIZES  # symbolic sizes at the boundary (ir/shapes.py); empty when static
    _by_name: dict[str, LNode] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {n.name: n for n in self.nodes})

    def node(self, name: str) -> LNode:
        return self._by_name[name]

    @property
    def inputs(self) -> tuple[Input, ...]:
        return tuple(n for n in self.nodes if isinstance(n, Input))


def extern_tensor_names(args: Any) -> list[str]:
    """TensorRef names inside nested Extern args, in order."""
    out: list[str] = []
    if isinstance(args, TensorRef):
        out.append(args.name)
    elif isinstance(args, (tuple, list)):
        for a in args:
            out.extend(extern_tensor_names(a))
    elif isinstance(args, MapArg):
        for _, a in args.items:
            out.extend(extern_tensor_names(a))
    return out


def extern_subgraphs(args: Any) -> list[Subgraph]:
    """The Subgraphs inside nested Extern args, in order."""
    if isinstance(args, Subgraph):
        return [args]
    if isinstance(args, (tuple, list)):
        return [s for a in args for s in extern_subgraphs(a)]
    if isinstance(args, MapArg):
        return [s for _, a in args.items for s in extern_subgraphs(a)]
    return []


def resolve_kernel(kernel: str) -> Any:
    """`"aten.mm.default"` -> torch.ops.aten.mm.default."""
    parts = kernel.split(".")
    obj: Any = torch.ops
    for p in parts:
        obj = getattr(obj, p)
    return obj


@functools.lru_cache(maxsize=None)
def returns_alias(kernel: str) -> bool:
    """Whether an extern's result may be (a view of) one of its arguments: its op's
    schema marks a result as an alias.  An op torch does not resolve (a Python
    callable kept whole) is taken to."""
    try:
        returns = resolve_kernel(kernel)._schema.returns
    except (AttributeError, RuntimeError):
        return True
    return any(r.alias_info is not None for r in returns)
