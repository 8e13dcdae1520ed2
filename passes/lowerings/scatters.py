"""index_put: writes at data-dependent positions, turned into reads.

coil's kernels store each output element once, at its own position; they have
no store at a computed position (and so no atomics).  A scatter is therefore
written from the side of the output: element p of `x.index_put(indices,
values, accumulate)` looks at every one of the K written rows k and asks
whether row k lands on p (each index Check'ed as x[idx] does, so negatives
wrap and an index out of range raises eager's IndexError):

    accumulate   out[p] = x[p] + sum over k of where(hit(k, p), values[k, p'], 0)
                 one masked sum Reduction (duplicates add up, as eager's
                 accumulate does), then the add of x
    otherwise    last[p] = max over k of where(hit(k, p), k, -1)
                 out[p]  = where(last[p] >= 0, values[last[p], p'], x[p])
                 a max Reduction and a Pointwise whose IndirectLoad reads the
                 last row written to p: of duplicate indices the last one wins,
                 as in eager's serial loop (the docs leave it undefined)

(p' is p's position in the dims no index tensor covers.)  Every element
reduces all K rows, so the work is numel(x) * K where eager's scatter does
K * (row size) plus a copy.  Measured on the cpp target (one thread), the
kernel costs about 2.5 ns an element-row: level with the Extern call (about
30 us) near 8k element-rows, 6x slower at 65k, 150x at 2M (a 1000 x 64
embedding gradient of 32 tokens).  Past SCATTER_WORK element-rows the lowering
declines and index_put stays an Extern: in the models that is every embedding
gradient (embedding_dense_backward decomposes into an accumulating index_put
into zeros), and only small tables such as T5's relative-position bias at the
tests' size become kernels.  A fused scatter of linear cost needs a store at an
indirect index, with atomics or sorted segments for duplicates, which no
backend's kernel language has (backends/ would have to grow one).

Sums accumulate in float32 for half types (eager adds in the half type, row
by row) and in int64 for integers and bool, in the reduction's order rather
than eager's: floats differ from eager by rounding only.  Boolean masks as
indices (their positions depend on the data) decline.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import sympy
import torch

from coil.ir.expr import Cast, Check, Expr, IndexExpr, IndirectLoad, Load, indsym, rsyms, xsyms
from coil.ir.indexing import simplify_index, unflatten
from coil.passes.lowerings.indirect import _integer, _result_layout
from coil.passes.lowerings.registry import (
    LowerCtx,
    TensorValue,
    broadcast_load,
    broadcast_shapes,
    constant,
    is_tensor,
    op,
    register_lowering,
    upcast,
)

aten = torch.ops.aten

# the most output elements times rows: past it the Extern's scatter is cheaper
SCATTER_WORK = 1 << 13


def _valid(x: TensorValue, indices: Sequence[Any], values: TensorValue, accumulate: bool) -> bool:
    """Whether eager takes the call (sizes, broadcasting), on meta tensors."""
    metas = [None if t is None else t.meta() for t in indices]
    try:
        aten.index_put.default(x.meta(), metas, values.meta(), accumulate)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return False
    return True


def _as(e: Expr, dtype: torch.dtype) -> Expr:
    return e if e.dtype == dtype else Cast(e, dtype)


@register_lowering(aten.index_put.default, "aten._unsafe_index_put.default")
def index_put(ctx: LowerCtx, x: TensorValue, indices: Sequence[Any], values: TensorValue,
              accumulate: bool = False) -> Any:
    tensors = [(d, t) for d, t in enumerate(indices) if t is not None]
    if (not tensors or len(indices) > x.ndim or x.numel() == 0 or not is_tensor(values)
            or values.dtype != x.dtype or x.dtype.is_complex
            or any(not is_tensor(t) or not _integer(t) for _, t in tensors)
            or not _valid(x, indices, values, accumulate)):
        return NotImplemented
    xs = xsyms(x.ndim)
    bshape = broadcast_shapes(*(t.size for _, t in tensors))
    rows = math.prod(bshape)
    if rows == 0:
        return ctx.pointwise(x.size, x.load(xs), x.dtype)
    if rows * x.numel() > SCATTER_WORK:
        return NotImplemented
    dims = [d for d, _ in tensors]
    sub, start = _result_layout(x, dims, bshape)
    r = rsyms(1)[0]
    bsyms = tuple(simplify_index(e, {r: rows}) for e in unflatten(r, bshape))
    hit: Expr | None = None
    for k, (d, t) in enumerate(tensors):
        # eager's message names the k-th index tensor's dimension as k, as x[idx] does
        pos = Check(broadcast_load(t, bshape, bsyms), "index", x.size[d], k, True)
        test = op("eq", pos, IndexExpr(xs[d], torch.int64))
        hit = test if hit is None else op("logical_and", hit, test)
    assert hit is not None
    others = [xs[d] for d in range(x.ndim) if d not in dims]

    def at_row(row: Sequence[sympy.Expr]) -> list[sympy.Expr]:
        """The index into the indexed view `sub` of row `row` at p."""
        return [*others[:start], *row, *others[start:]]

    if accumulate:
        acc = upcast(x.dtype) if x.dtype.is_floating_point else torch.int64
        value = _as(broadcast_load(values, sub, at_row(bsyms)), acc)
        total = ctx.reduction(x.size, (rows,), "sum", op("where", hit, value, constant(0, acc), dtype=acc), acc)
        return ctx.pointwise(x.size, op("add", _as(x.load(xs), acc), total.load(xs), dtype=acc), x.dtype)
    flat = IndexExpr(r, torch.int64)
    last = ctx.reduction(x.size, (rows,), "max", op("where", hit, flat, constant(-1, torch.int64)), torch.int64)
    written = last.load(xs)
    # a row in [0, rows) even where none was written (that arm is not taken, but both are computed)
    row = Check(op("maximum", written, constant(0, torch.int64)), "index", rows, 0)
    lead = len(sub) - values.ndim
    full = at_row(unflatten(indsym(0), bshape))
    vidx = [sympy.Integer(0) if s == 1 else full[lead + i] for i, s in enumerate(values.size)]
    value = IndirectLoad(values.name, tuple(vidx), values.dtype, (row,)) if any(
        e.has(indsym(0)) for e in vidx) else Load(values.name, tuple(vidx), values.dtype)
    some = op("ge", written, constant(0, torch.int64))
    return ctx.pointwise(x.size, op("where", some, value, x.load(xs), dtype=x.dtype), x.dtype)


@register_lowering(aten.index_add.default)
def index_add(ctx: LowerCtx, x: Any, dim: int, index: Any, source: Any, *, alpha: Any = 1) -> Any:
    """index_add as a fresh copy of x, made by a kernel (fused with whatever makes
    x: the zeros of an embedding gradient), and aten's in-place index_add_ on that
    buffer.  The functional aten op clones x itself first: for an embedding
    gradient, a copy of the whole table every training step (its cost:
    bench/probes/README.md).  The Extern records the buffer it mutates, so its
    result is that buffer.  Anything but three tensors declines to the aten op."""
    from coil.passes.lower import lower_extern

    if not (is_tensor(x) and is_tensor(index) and is_tensor(source)):
        return NotImplemented
    try:
        val = aten.index_add.default(x.meta(), dim, index.meta(), source.meta(), alpha=alpha)
    except (RuntimeError, IndexError, ValueError, TypeError):
        return NotImplemented  # the aten op raises eager's error
    fresh = ctx.pointwise(x.size, x.load(xsyms(len(x.size))), x.dtype)
    kwargs = {} if alpha == 1 else {"alpha": alpha}
    return lower_extern(ctx, aten.index_add_.default, [fresh, dim, index, source], kwargs, val)


_RESHAPES = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def index_add_into_addend(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of gm where `x + index_add(zeros, dim, index, source)` (through views
    that keep its shape) is `index_add(x, dim, index, source)`, or None where gm has
    no such sum.  A tied embedding's gradient is one: the output projection's
    gradient plus the embedding's, an index_add into fresh zeros.  As it was, the
    zeros were written (the whole table), the rows added by aten, then the table
    read again for the sum; now index_add's lowering copies x (fused with what
    makes it) and aten adds the rows into that copy.  Only where every tensor of it
    has one dtype, the zeros and the index_add have no other reader, and the sum has
    x's strides (as index_add's result has).
    The sum's rounding may differ where an index repeats: its rows are added to x
    one by one, where eager sums them first (Inductor's fused embedding backward
    does the same)."""
    found = [m for m in (_zero_index_add_sum(n) for n in gm.graph.nodes) if m is not None]
    if not found:
        return None
    return torch.fx.GraphModule(gm, _rewritten(gm.graph, found))


def _zero_index_add_sum(n: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node] | None:
    """(the sum, its index_add, its other addend) where n is such a sum."""
    if n.op != "call_function" or n.target is not aten.add.Tensor or len(n.args) != 2 or n.kwargs:
        return None
    out = n.meta.get("val")
    if not isinstance(out, torch.Tensor):
        return None
    for k in (0, 1):
        chain, other = n.args[k], n.args[1 - k]
        if not isinstance(chain, torch.fx.Node) or not isinstance(other, torch.fx.Node):
            continue
        seen = {chain}
        while (chain.op == "call_function" and chain.target in _RESHAPES and len(chain.users) == 1
               and isinstance(chain.args[0], torch.fx.Node)):
            chain = chain.args[0]
            seen.add(chain)
        if (chain.op != "call_function" or chain.target is not aten.index_add.default or len(chain.users) != 1
                or other in seen):  # t + t: the other term is the sum's own index_add
            continue
        zeros = chain.args[0]
        ia = chain.meta.get("val")
        if not (isinstance(zeros, torch.fx.Node) and len(zeros.users) == 1 and _is_zeros(zeros)
                and isinstance(ia, torch.Tensor) and tuple(ia.shape) == tuple(out.shape)):
            continue
        x = other.meta.get("val")
        if (isinstance(x, torch.Tensor) and x.dtype == ia.dtype == out.dtype and tuple(x.shape) == tuple(out.shape)
                and x.device == out.device and x.stride() == out.stride()):
            return n, chain, other
    return None


def _is_zeros(n: torch.fx.Node) -> bool:
    if n.op != "call_function":
        return False
    if n.target is aten.zeros.default:
        return True
    return n.target is aten.full.default and len(n.args) >= 2 and n.args[1] == 0 and not isinstance(n.args[1], bool)


def _rewritten(graph: torch.fx.Graph, found: list[tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node]]
               ) -> torch.fx.Graph:
    """A copy of graph with each found sum rewritten (index_add_into_addend), and
    the zeros, index_add and views it replaces left out (they have no other reader)."""
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    sums = {s: (ia, other) for s, ia, other in found}
    dropped: set[torch.fx.Node] = set()
    for s, ia, _ in found:
        dropped |= {ia, ia.args[0]}
        n = next(a for a in s.args if isinstance(a, torch.fx.Node) and a is not sums[s][1])
        while n is not ia:
            dropped.add(n)
            n = n.args[0]
    for n in graph.nodes:
        if n in dropped:
            continue
        if n in sums:
            ia, other = sums[n]
            args = (env[other], *(torch.fx.node.map_arg(a, lambda m: env[m]) for a in ia.args[1:]))
            kwargs = torch.fx.node.map_arg(dict(ia.kwargs), lambda m: env[m])
            out = new.call_function(aten.index_add.default, args, kwargs)
            out.meta = dict(n.meta)
            env[n] = out
            continue
        env[n] = new.node_copy(n, lambda m: env[m])
    return new
