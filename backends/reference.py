"""The reference interpreter: runs a BufferGraph (or single buffers) with plain
torch ops.  Slow and simple; the oracle every other target is tested against.

`ReferenceHandler` evaluates a body over the whole iteration space at once: each
loop symbol is an integer tensor broadcast along its own dim, each load gathers
from the buffer's flat storage at the offset its layout gives.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import sympy
import torch

from coil.errors import CoilError
from coil.ir.buffers import AliasBuffer, BufferGraph, ComputedBuffer, ExternBuffer, MultiOutputBuffer
from coil.ir.expr import Cast, Check, Constant, IndexExpr, IndirectLoad, Load, Op, check_error, evaluate, indsym, rsyms, xsyms
from coil.ir.indexing import FloorDiv, ModularIndexing
from coil.ir.layout import Layout
from coil.ir.lowered import MapArg, PyTuple, Subgraph, TensorRef, resolve_kernel


def eval_index(e: sympy.Expr, env: Mapping[sympy.Symbol, torch.Tensor]) -> Any:
    """An index expression over integer tensors (int64)."""
    if e.is_Integer:
        return int(e)
    if isinstance(e, sympy.Symbol):
        return env[e]
    if isinstance(e, sympy.Add):
        out: Any = 0
        for a in e.args:
            out = out + eval_index(a, env)
        return out
    if isinstance(e, sympy.Mul):
        out = 1
        for a in e.args:
            out = out * eval_index(a, env)
        return out
    if isinstance(e, FloorDiv):
        a, b = (eval_index(x, env) for x in e.args)
        return a // b
    if isinstance(e, ModularIndexing):
        a, b, c = (eval_index(x, env) for x in e.args)
        return (a // b) % c
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return eval_index(e.base, env) ** int(e.exp)
    raise CoilError(f"cannot evaluate index {e}")


def run_check(v: torch.Tensor, error: str, size: int, dim: int, wrap: bool, checked: bool) -> torch.Tensor:
    """A Check's value: an index as the position it reads (int64, negatives
    wrapped when `wrap`), a divisor as itself.  When `checked`, a value that fails
    raises eager's error for it, naming the first one."""
    if size == 0:  # a divisor
        if checked and bool((v == 0).any()):
            raise check_error(error, 0, size, dim)
        return v
    v = v.to(torch.int64)
    w = torch.where(v < 0, v + size, v) if wrap else v
    if checked:
        bad = (w < 0) | (w >= size)
        if bool(bad.any()):
            raise check_error(error, int(torch.broadcast_to(v, bad.shape)[bad].flatten()[0]), size, dim)
    return w


def flat_storage(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    """A 1-d view of the storage the layout addresses, from t's own first element:
    index it by `layout.offset_of(index) - layout.offset` (t may sit at another
    storage offset than the layout was compiled for)."""
    return t.as_strided((layout.storage_size() - layout.offset,), (1,), t.storage_offset())


def gather(flat: torch.Tensor, offset: Any, mask: torch.Tensor | None, name: str) -> torch.Tensor:
    """flat[offset]; with a mask, only where it holds (0 elsewhere, nothing read
    there), and an offset outside `flat` where it holds is an error: the
    promise a masked load makes, checked as it runs."""
    if mask is None:
        return flat[offset]
    off, m = torch.broadcast_tensors(torch.as_tensor(offset, device=flat.device), mask.to(torch.bool))
    outside = (off < 0) | (off >= flat.numel())
    if bool((outside & m).any()):
        raise CoilError(f"masked load of {name} leaves its buffer where its mask holds")
    if flat.numel() == 0:
        return flat.new_zeros(off.shape)
    return torch.where(m, flat[torch.where(m, off, 0)], flat.new_zeros(()))


_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "reciprocal": torch.reciprocal, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log1p": torch.log1p, "log2": torch.log2, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
    "relu": torch.relu, "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "trunc": torch.trunc, "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not, "isnan": torch.isnan, "isinf": torch.isinf,
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "fmod": torch.fmod, "remainder": torch.remainder, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
}


class ReferenceHandler:
    """Evaluates a body to a tensor broadcastable to the iteration shape."""

    def __init__(self, env: Mapping[sympy.Symbol, torch.Tensor], values: Mapping[str, torch.Tensor],
                 layouts: Mapping[str, Layout], device: torch.device) -> None:
        self.env = env
        self.values = values
        self.layouts = layouts
        self.device = device

    def load(self, node: Load, mask: torch.Tensor | None) -> torch.Tensor:
        layout = self.layouts[node.name]
        offset = eval_index(layout.offset_of(node.index) - layout.offset, self.env)
        return gather(flat_storage(self.values[node.name], layout), offset, mask, node.name)

    def indirect_load(self, node: IndirectLoad, values: tuple[torch.Tensor, ...],
                      mask: torch.Tensor | None) -> torch.Tensor:
        env = dict(self.env)
        for k, v in enumerate(values):  # positions already: each value is an index Check
            env[indsym(k)] = v
        layout = self.layouts[node.name]
        offset = eval_index(layout.offset_of(node.index) - layout.offset, env)
        return gather(flat_storage(self.values[node.name], layout), offset, mask, node.name)

    def constant(self, node: Constant) -> torch.Tensor:
        return torch.tensor(node.value, dtype=node.dtype, device=self.device)

    def index_expr(self, node: IndexExpr) -> torch.Tensor:
        v = eval_index(node.expr, self.env)
        if isinstance(v, int):
            return torch.tensor(v, dtype=node.dtype, device=self.device)
        return v.to(node.dtype)

    def op(self, node: Op, args: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if node.name in _UNARY:
            out = _UNARY[node.name](args[0])
        elif node.name in _BINARY:
            out = _BINARY[node.name](*args)
        elif node.name == "where":
            out = torch.where(*args)
        else:
            raise CoilError(f"reference: no op {node.name}")
        return out if out.dtype == node.dtype else out.to(node.dtype)

    def cast(self, node: Cast, arg: torch.Tensor) -> torch.Tensor:
        return arg.to(node.dtype)

    def check(self, node: Check, arg: torch.Tensor) -> torch.Tensor:
        return run_check(arg, node.error, node.size, node.dim, node.wrap, node.checked)


def loop_env(ranges: Sequence[int], reduction_ranges: Sequence[int], device: torch.device) -> dict[sympy.Symbol, torch.Tensor]:
    """x* and r* as int64 tensors, each along its own dim of (*ranges, *reduction_ranges)."""
    dims = (*ranges, *reduction_ranges)
    syms = (*xsyms(len(ranges)), *rsyms(len(reduction_ranges)))
    env = {}
    for i, (s, n) in enumerate(zip(syms, dims)):
        shape = [1] * len(dims)
        shape[i] = n
        env[s] = torch.arange(n, device=device, dtype=torch.int64).reshape(shape)
    return env


def reduce(values: torch.Tensor, reduction_type: str, nred: int) -> torch.Tensor:
    """Reduce the last `nred` dims of `values`."""
    lead = values.shape[: values.ndim - nred]
    flat = values.reshape(*lead, -1)
    match reduction_type:
        case "sum":
            return flat.sum(-1, dtype=values.dtype)
        case "prod":
            return flat.prod(-1, dtype=values.dtype)
        case "max":
            return flat.amax(-1)
        case "min":
            return flat.amin(-1)
        case "argmax":
            return flat.argmax(-1)
        case "argmin":
            return flat.argmin(-1)
        case "any":
            return flat.bool().any(-1)
        case "all":
            return flat.bool().all(-1)
        case "welford_m2":
            mean = flat.mean(-1, keepdim=True)
            return ((flat - mean) ** 2).sum(-1)
    raise CoilError(f"reference: no reduction {reduction_type}")


def compute_buffer(b: ComputedBuffer, values: Mapping[str, torch.Tensor], layouts: Mapping[str, Layout],
                   device: torch.device) -> torch.Tensor:
    """A ComputedBuffer's whole value, in its layout."""
    env = loop_env(b.ranges, b.reduction_ranges, device)
    v = evaluate(b.body, ReferenceHandler(env, values, layouts, device))
    shape = (*b.ranges, *b.reduction_ranges)
    v = torch.broadcast_to(v, shape)
    if b.reduction_type is not None:
        if math.prod(b.reduction_ranges) == 0:
            v = _empty_reduction(b, device)
        else:
            v = reduce(v, b.reduction_type, len(b.reduction_ranges))
    out = torch.empty_strided(b.layout.size, b.layout.stride, dtype=b.layout.dtype, device=device)
    out.copy_(v.reshape(b.layout.size))
    return out


def _empty_reduction(b: ComputedBuffer, device: torch.device) -> torch.Tensor:
    init = {"sum": 0, "prod": 1, "any": False, "all": True, "welford_m2": float("nan")}[b.reduction_type or "sum"]
    return torch.full(b.ranges, init, dtype=b.layout.dtype, device=device)


def call_extern(kernel: str, args: Any, kwargs: Any, values: Mapping[str, torch.Tensor]) -> Any:
    def sub(a: Any) -> Any:
        if isinstance(a, TensorRef):
            return values[a.name]
        if isinstance(a, PyTuple):
            return tuple(sub(x) for x in a)
        if isinstance(a, tuple):
            return [sub(x) for x in a]
        if isinstance(a, MapArg):
            return {k: sub(v) for k, v in a.items}
        if isinstance(a, Subgraph):  # the interpreter runs a subgraph as FX, in eager
            return a.gm
        return a

    return resolve_kernel(kernel)(*[sub(a) for a in args], **{k: sub(v) for k, v in kwargs})


def run_buffer_graph(g: BufferGraph, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
    """Execute every buffer in order; return the graph outputs."""
    values: dict[str, torch.Tensor] = {}
    layouts: dict[str, Layout] = {}
    device = torch.device("cpu")
    for ib, t in zip(g.inputs, inputs):
        values[ib.name] = t
        layouts[ib.name] = ib.layout
        device = t.device
    for b in g.buffers:
        match b:
            case ComputedBuffer():
                values[b.name] = compute_buffer(b, values, layouts, device)
            case ExternBuffer():
                values[b.name] = call_extern(b.kernel, b.args, b.kwargs, values)
            case MultiOutputBuffer():
                v: Any = values[b.extern]
                for i in b.index:
                    v = v[i]
                values[b.name] = v
            case AliasBuffer():
                base = values[b.base]
                values[b.name] = base.as_strided(b.layout.size, b.layout.stride, b.layout.offset)
        if b.layout is not None:
            layouts[b.name] = Layout.of(values[b.name]) if isinstance(b, (ExternBuffer, MultiOutputBuffer)) else b.layout
    return tuple(None if o is None else values[o] for o in g.outputs)
