"""Reads at data-dependent positions: gather, index.Tensor, index_select, embedding.

Each is one Pointwise node whose body is an `IndirectLoad`: the read of the source
at an index that uses ind0, ind1, ... bound to loads of the index tensors (as
Inductor lowers them with `ops.indirect_indexing`).  So the source need not be a
buffer: realize inlines a pointwise source into the read (cross_entropy's
log_softmax is never written), and the index tensors fuse like any other input.

Each index goes through a Check that raises what eager raises for that op when
it is out of range: x[idx] wraps negatives in [-size, 0) and raises IndexError
beyond; gather raises RuntimeError, index_select IndexError (RuntimeError along
dim 1), embedding IndexError, all for any negative index; nll_loss (and so
cross_entropy) raises IndexError("Target 5 is out of bounds.").  The checks
start as "checked"; realize proves the ones it can (ir/bounds.py).

Boolean masks (their result size depends on the data) and empty sources decline:
they stay Extern calls of the aten op.

scatter with one position per row along its dim (nll_loss's backward writes -1 at
each target) is a write turned into a read: each output element compares its own
position with the row's index (checked as gather's), so it needs no IndirectLoad
at all.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import sympy
import torch

from coil.ir.expr import Cast, Check, Expr, IndexExpr, IndirectLoad, indsym, rewrite, xsyms
from coil.ir.lowered import Pointwise, Reduction
from coil.passes.lowerings.registry import (
    LowerCtx,
    NeedsStaticSizes,
    TensorValue,
    broadcast_load,
    broadcast_shapes,
    constant,
    is_tensor,
    normalize_dim,
    op,
    register_lowering,
)

aten = torch.ops.aten


def _integer(t: TensorValue) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype in (torch.bool, torch.uint8))


@register_lowering(aten.gather.default)
def gather(ctx: LowerCtx, x: TensorValue, dim: int, index: TensorValue, sparse_grad: bool = False) -> Any:
    """out[..., i_d, ...] = x[..., index[..., i_d, ...], ...] along `dim`."""
    if x.ndim == 0 or index.ndim != x.ndim or x.numel() == 0 or not _integer(index):
        return NotImplemented
    dim = normalize_dim(dim, x.ndim)
    xs = xsyms(index.ndim)
    idx: list[sympy.Expr] = list(xs)
    idx[dim] = indsym(0)
    check = Check(index.load(xs), "gather", x.size[dim], dim)
    return ctx.pointwise(index.size, IndirectLoad(x.name, tuple(idx), x.dtype, (check,)))


@register_lowering(aten.index_select.default)
def index_select(ctx: LowerCtx, x: TensorValue, dim: int, index: TensorValue) -> Any:
    if x.ndim == 0 or index.ndim > 1 or x.numel() == 0 or not _integer(index):
        return NotImplemented
    dim = normalize_dim(dim, x.ndim)
    size = list(x.size)
    size[dim] = index.numel()
    xs = xsyms(x.ndim)
    idx: list[sympy.Expr] = list(xs)
    idx[dim] = indsym(0)
    value = index.load((xs[dim],) if index.ndim == 1 else ())
    # eager's CPU kernel along dim 1 has its own message and raises RuntimeError
    error = "index_select_dim1" if dim == 1 and x.ndim > 1 else "index_select"
    check = Check(value, error, x.size[dim], dim)
    return ctx.pointwise(size, IndirectLoad(x.name, tuple(idx), x.dtype, (check,)))


@register_lowering(aten.embedding.default)
def embedding(ctx: LowerCtx, weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    """A row of `weight` per index: index.Tensor of weight by `indices`, but any
    negative index is out of range."""
    if weight.ndim != 2:
        return NotImplemented
    return _index(ctx, weight, [indices], "embedding", wrap=False)


def _result_layout(x: TensorValue, dims: Sequence[int], bshape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """aten's advanced-indexing result size, and where the broadcast index dims go:
    in place of the indexed dims when they are adjacent, else first."""
    adjacent = list(dims) == list(range(dims[0], dims[-1] + 1))
    if adjacent:
        return (*x.size[: dims[0]], *bshape, *x.size[dims[-1] + 1 :]), dims[0]
    return (*bshape, *(s for d, s in enumerate(x.size) if d not in dims)), 0


@register_lowering(aten.index.Tensor, "aten._unsafe_index.Tensor")
def index(ctx: LowerCtx, x: TensorValue, indices: Sequence[Any]) -> Any:
    """x[i0, :, i2] and friends: integer index tensors (broadcast together) pick
    positions along their dims; None entries and missing trailing dims take
    whole dims.  Negative indices count from the end."""
    return _index(ctx, x, indices, "index", wrap=True)


def _index(ctx: LowerCtx, x: TensorValue, indices: Sequence[Any], error: str, wrap: bool) -> Any:
    tensors = [(d, t) for d, t in enumerate(indices) if t is not None]
    if (not tensors or len(indices) > x.ndim or x.numel() == 0
            or any(not is_tensor(t) or not _integer(t) for _, t in tensors)):
        return NotImplemented
    dims = [d for d, _ in tensors]
    bshape = broadcast_shapes(*(t.size for _, t in tensors))
    out, start = _result_layout(x, dims, bshape)
    xs = xsyms(len(out))
    bsyms = xs[start : start + len(bshape)]
    others = iter((*xs[:start], *xs[start + len(bshape) :]))
    idx: list[sympy.Expr] = [sympy.Integer(0)] * x.ndim
    for d in range(x.ndim):
        if d not in dims:
            idx[d] = next(others)
    values = []
    for k, (d, t) in enumerate(tensors):
        idx[d] = indsym(k)
        # eager's message names the k-th index tensor's dimension as k
        values.append(Check(broadcast_load(t, bshape, bsyms), error, x.size[d], k, wrap))
    return ctx.pointwise(out, IndirectLoad(x.name, tuple(idx), x.dtype, tuple(values)))


@register_lowering(aten.nll_loss_forward.default)
def nll_loss_forward(ctx: LowerCtx, x: TensorValue, target: TensorValue, weight: TensorValue | None,
                     reduction: int, ignore_index: int) -> Any:
    """torch's decomposition of nll_loss (a gather of each row's target class),
    lowered as it would be without this lowering; then its index checks raise
    nll_loss's error, as eager does, instead of gather's."""
    if x.ndim not in (1, 2) or target.ndim > 1 or x.numel() == 0:
        return NotImplemented
    mark = len(ctx.nodes)
    out = _lower_decomposition(ctx, aten.nll_loss_forward.default, (x, target, weight, reduction, ignore_index))
    retag_checks(ctx, mark, *ERRORS_BY_ORIGIN["aten.nll_loss_forward.default"])
    return out


# An op that AOTAutograd decomposes before coil sees it (backends/dynamo.py:
# AOT_ONLY_DECOMPOSITIONS) still raises its own error: the checks of the reads its
# decomposition makes are retagged by the op the FX node came from (its
# `original_aten`, by name: the meta's OpOverload need not be the object
# torch.ops holds), from the error on the left to the one on the right.
ERRORS_BY_ORIGIN: dict[str, tuple[str, str]] = {"aten.nll_loss_forward.default": ("gather", "nll_loss")}


def origin_errors(node: Any) -> tuple[str, str] | None:
    """ERRORS_BY_ORIGIN's entry for an FX node's `original_aten`, if any."""
    origin = node.meta.get("original_aten")
    return None if origin is None else ERRORS_BY_ORIGIN.get(str(origin))


def retag_checks(ctx: LowerCtx, mark: int, old: str, new: str) -> None:
    """The index checks of the nodes lowered since `mark` raise error `new` where they raised `old`."""
    def retag(e: Expr) -> Expr | None:
        return attrs.evolve(e, error=new) if isinstance(e, Check) and e.error == old else None

    for i in range(mark, len(ctx.nodes)):
        n = ctx.nodes[i]
        if isinstance(n, (Pointwise, Reduction)):
            ctx.nodes[i] = attrs.evolve(n, body=rewrite(n.body, retag))


def _lower_decomposition(ctx: LowerCtx, target: Any, args: tuple[Any, ...]) -> Any:
    """Lower `target`'s decomposition into ctx (what `lower` does for an op without
    a lowering).  Symbolic sizes: traced on the FX node's own fake tensors under
    the graph's fake mode, as lower.decompose does, so its sizes stay the graph's
    symbols (a meta tensor has none: the op would run as an Extern, and
    cross_entropy would write its whole log_softmax for aten's nll_loss)."""
    from coil.passes.lower import _lower_graph_into, trace_decomposition

    tensors = [a for a in args if is_tensor(a)]
    if all(isinstance(s, int) for t in tensors for s in t.size):
        graph = trace_decomposition(target, tuple(a.meta() if is_tensor(a) else a for a in args), {}, ctx.device)
        return _lower_graph_into(ctx, graph, tensors, 1)
    vals = ctx.arg_vals
    if len(vals) < len(args) or any(is_tensor(a) and not isinstance(v, torch.Tensor) for a, v in zip(args, vals)):
        raise NeedsStaticSizes(f"{target} of symbolic sizes without the fake tensors of its arguments")
    from torch._guards import detect_fake_mode

    fakes = tuple(v if is_tensor(a) else a for a, v in zip(args, vals))
    with detect_fake_mode([v for v in fakes if isinstance(v, torch.Tensor)]):  # type: ignore[union-attr]
        graph = trace_decomposition(target, fakes, {}, ctx.device)
    return _lower_graph_into(ctx, graph, tensors, 1)


@register_lowering(aten.scatter.value, aten.scatter.src)
def scatter(ctx: LowerCtx, x: TensorValue, dim: int, index: TensorValue, src: Any) -> Any:
    """out[..., j, ...] = src at the row's one index j, else x: a pointwise where.
    Only for an index of size 1 along `dim` that covers x's other dims (each row
    writes exactly one element, so write order cannot matter)."""
    if x.ndim == 0 or index.ndim != x.ndim or not _integer(index):
        return NotImplemented
    dim = normalize_dim(dim, x.ndim)
    if index.size[dim] != 1 or any(index.size[d] != x.size[d] for d in range(x.ndim) if d != dim):
        return NotImplemented
    xs = xsyms(x.ndim)
    row = tuple(sympy.Integer(0) if d == dim else s for d, s in enumerate(xs))
    # eager raises for an index out of range (any negative one too) as gather does
    target = Check(index.load(row), "gather", x.size[dim], dim)
    hit = op("eq", target, IndexExpr(xs[dim], torch.int64))
    value: Expr
    if is_tensor(src):
        if src.ndim != x.ndim:
            return NotImplemented
        value = src.load(row)
    else:
        value = constant(src, x.dtype)
    if value.dtype != x.dtype:
        value = Cast(value, x.dtype)
    return ctx.pointwise(x.size, op("where", hit, value, x.load(xs)))
