"""DEV HEADER (dropped when merged into op_cases.py)"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from op_cases import (ALL, BF16, BOOL, F16, F32, F64, FLOATS, I32, I64, INTS, NUMBERS, MakeInputs, OpCase, aten,
                      draw, layout_input, tensors)
# ==== MERGE BELOW ====
# ---- reductions --------------------------------------------------------------------------
# Each case reduces `x + y` (or `x * y`): under the "broadcast" shape kind the sum
# is a (4, 5, 6) broadcast of a (4, 1, 6) and a (5, 6) input, under "noncontig" two
# (4, 6) inputs that are a transpose and a strided slice.  Dims are negative or
# below 2 so one case is valid for both ranks.  "few" values (small integers) are
# exact in every dtype, so half-precision sums and ties in max / argmax give the
# same answer however the reduction is ordered.


def _r(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...], *targets: Any,
       domain: str = "few") -> OpCase:
    return OpCase(name, fn, tensors(domain, domain), dtypes, targets, ("broadcast", "noncontig"))


def _sum_of(fn: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """`(x, y) -> fn(x + y)`: a reduction whose input broadcasts."""
    return lambda x, y: fn(x + y)


REDUCTION_CASES: list[OpCase] = [
    # sum: every dim set; ints and bools accumulate (and return) int64
    _r("sum_all", _sum_of(torch.sum), (F32, I32, BOOL), aten.sum),
    _r("sum_dim", _sum_of(lambda s: s.sum(-1)), (F32, F16, I64, BOOL), aten.sum),
    _r("sum_dim0_keepdim", _sum_of(lambda s: s.sum(0, keepdim=True)), (F32, BF16, I32), aten.sum),
    _r("sum_dims", _sum_of(lambda s: s.sum((0, -1))), (F32, I32), aten.sum),
    _r("sum_dims_keepdim", _sum_of(lambda s: s.sum((-1, 0), keepdim=True)), (F32, I64), aten.sum),
    _r("sum_empty_dim_list", _sum_of(lambda s: torch.sum(s, [])), (F32, I32), aten.sum),
    _r("sum_dtype", _sum_of(lambda s: s.sum(-1, dtype=torch.float64)), (F32, I32), aten.sum),
    _r("sum_dtype_narrow", _sum_of(lambda s: s.sum(-1, dtype=torch.int32)), (F32, I64), aten.sum),
    # prod: |x * y| in [0.25, 2.25] keeps float products finite; int products wrap alike
    _r("prod_all", lambda x, y: torch.prod(x * y), (F32, I64), aten.prod, domain="nonzero"),
    _r("prod_dim", lambda x, y: torch.prod(x * y, -1), (F32, I32, BOOL), aten.prod, domain="nonzero"),
    _r("prod_dim_keepdim_dtype", lambda x, y: torch.prod(x * y, 0, keepdim=True, dtype=torch.float64), (F32, I32),
       aten.prod, domain="nonzero"),
    # max / min, values and indices (ties: the first index wins)
    _r("amax_dim", _sum_of(lambda s: s.amax(-1)), (F32, F16, I32, BOOL), aten.amax),
    _r("amax_dims", _sum_of(lambda s: s.amax((0, -1))), (F32, I64), aten.amax),
    _r("amax_all", _sum_of(lambda s: s.amax()), (F32, BF16), aten.amax),
    _r("amin_dim_keepdim", _sum_of(lambda s: s.amin(-2, keepdim=True)), (F32, I32, BOOL), aten.amin),
    _r("amin_dims", _sum_of(lambda s: s.amin((1, 0))), (F32, F16), aten.amin),
    _r("max_all", _sum_of(torch.max), (F32, I32), aten.max),
    _r("min_all", _sum_of(torch.min), (F32, I64), aten.min),
    _r("max_dim", _sum_of(lambda s: torch.max(s, -1)), (F32, F16, I32, BOOL), aten.max),
    _r("max_dim_keepdim", _sum_of(lambda s: torch.max(s, 0, keepdim=True)), (F32, I64), aten.max),
    _r("min_dim", _sum_of(lambda s: torch.min(s, -2)), (F32, I32), aten.min),
    _r("min_dim_keepdim", _sum_of(lambda s: torch.min(s, 1, keepdim=True)), (F32, BF16), aten.min),
    _r("argmax_dim", _sum_of(lambda s: s.argmax(-1)), (F32, F16, I32), aten.argmax),
    _r("argmax_dim_keepdim", _sum_of(lambda s: s.argmax(0, keepdim=True)), (F32, I64), aten.argmax),
    _r("argmax_none", _sum_of(lambda s: s.argmax()), (F32, I32), aten.argmax),
    _r("argmax_none_keepdim", _sum_of(lambda s: torch.argmax(s, keepdim=True)), (F32, I64), aten.argmax),
    _r("argmin_dim", _sum_of(lambda s: s.argmin(-2)), (F32, BF16, I32), aten.argmin),
    _r("argmin_none", _sum_of(lambda s: s.argmin()), (F32, I64), aten.argmin),
    _r("argmin_none_keepdim", _sum_of(lambda s: torch.argmin(s, keepdim=True)), (F32, I32), aten.argmin),
    # any / all: "few" values hold zeros, so both answers occur
    _r("any_all", _sum_of(torch.any), (BOOL, F32, I32), aten.any),
    _r("any_dim", _sum_of(lambda s: s.any(-1)), (BOOL, F32, I64), aten.any),
    _r("any_dims_keepdim", _sum_of(lambda s: torch.any(s, (0, -1), keepdim=True)), (BOOL, F32), aten.any),
    _r("all_all", lambda x, y: torch.all(x * y), (BOOL, F32, I32), aten.all),
    _r("all_dim_keepdim", lambda x, y: (x * y).all(0, keepdim=True), (BOOL, F32, I32), aten.all),
    _r("all_dims", lambda x, y: torch.all(x * y, (-2, -1)), (BOOL, I64), aten.all),
    # mean, var, var_mean, std (std decomposes into var and sqrt)
    _r("mean_all", _sum_of(torch.mean), (F32, F16), aten.mean),
    _r("mean_dim", _sum_of(lambda s: s.mean(-1)), (F32, BF16), aten.mean),
    _r("mean_dims_keepdim", _sum_of(lambda s: s.mean((0, -1), keepdim=True)), (F32, F64), aten.mean),
    _r("mean_dtype", _sum_of(lambda s: s.mean(0, dtype=torch.float64)), (F32, F16), aten.mean),
    _r("var_dim", _sum_of(lambda s: s.var(-1)), (F32, F16), aten.var),
    _r("var_all", _sum_of(torch.var), (F32, F64), aten.var),
    _r("var_correction0", _sum_of(lambda s: s.var(0, correction=0)), (F32, BF16), aten.var),
    _r("var_correction2_dims", _sum_of(lambda s: s.var((0, -1), correction=2)), (F32, F64), aten.var),
    _r("var_unbiased_false_keepdim", _sum_of(lambda s: s.var(-1, unbiased=False, keepdim=True)), (F32, F16),
       aten.var),
    _r("var_unbiased_true", _sum_of(lambda s: torch.var(s, -2, True)), (F32, F64), aten.var),
    _r("var_mean_dim", _sum_of(lambda s: torch.var_mean(s, -1)), (F32, F16), aten.var_mean),
    _r("var_mean_all_correction0", _sum_of(lambda s: torch.var_mean(s, correction=0)), (F32, BF16), aten.var_mean),
    _r("var_mean_unbiased_false_keepdim", _sum_of(lambda s: torch.var_mean(s, 0, unbiased=False, keepdim=True)),
       (F32, F64), aten.var_mean),
    _r("std_dim", _sum_of(lambda s: s.std(-1)), (F32, F16), aten.std),
    _r("std_all", _sum_of(torch.std), (F32, F64), aten.std),
    _r("std_correction0_keepdim", _sum_of(lambda s: s.std((0, -1), correction=0, keepdim=True)), (F32, BF16),
       aten.std),
    _r("std_mean", _sum_of(lambda s: torch.std_mean(s, -1)), (F32, F64), aten.std_mean),
]

# The reduction types each case's buffers must use (a case missing here is not checked).
REDUCTION_TYPES_OF: dict[str, frozenset[str]] = {
    "sum_dim": frozenset({"sum"}),
    "prod_dim": frozenset({"prod"}),
    "amax_dim": frozenset({"max"}),
    "amin_dims": frozenset({"min"}),
    "max_dim": frozenset({"max", "argmax"}),
    "min_dim": frozenset({"min", "argmin"}),
    "argmax_none": frozenset({"argmax"}),
    "argmin_dim": frozenset({"argmin"}),
    "any_dim": frozenset({"any"}),
    "all_dims": frozenset({"all"}),
    "mean_dim": frozenset({"sum"}),
    "var_dim": frozenset({"welford_m2"}),
    "var_mean_dim": frozenset({"welford_m2", "sum"}),
    "std_dim": frozenset({"welford_m2"}),
}


# ---- views ---------------------------------------------------------------------------------
# A view case's input has one logical shape under both of its layouts:
#     expanded   dim 0 (or, when it has size 1, the last dim) is a stride-0 broadcast
#     noncontig  the dims are stored in reverse order (a transpose for 2-d), or every
#                second element for 1-d
# The consumer is a pointwise op (`* 2`), so the view must fold into its index; a
# second input, where there is one, broadcasts against the view.


def _strided(shape: Sequence[int], domain: str, dtype: torch.dtype, shape_kind: str, g: torch.Generator) -> torch.Tensor:
    """One input of logical `shape`, laid out as the view kinds say."""
    shape = tuple(shape)
    match shape_kind:
        case "expanded":
            d = 0 if shape and shape[0] != 1 else len(shape) - 1
            small = tuple(1 if i == d else s for i, s in enumerate(shape))
            return draw(domain, dtype, small, g).expand(shape)
        case "noncontig":
            if len(shape) == 1:
                return draw(domain, dtype, (2 * shape[0],), g)[::2]
            rev = tuple(reversed(range(len(shape))))
            return draw(domain, dtype, tuple(reversed(shape)), g).permute(rev)
        case "contiguous":
            return draw(domain, dtype, shape, g)
    raise ValueError(f"unknown view shape kind {shape_kind!r}")


def shaped(*shapes: Sequence[int], domain: str = "any") -> MakeInputs:
    """Inputs of the given logical shapes, laid out by the view shape kinds."""

    def make(dtype: torch.dtype, shape_kind: str, g: torch.Generator) -> tuple[torch.Tensor, ...]:
        return tuple(_strided(s, domain, dtype, shape_kind, g) for s in shapes)

    return make


VIEW_KINDS = ("expanded", "noncontig")
VIEW_DTYPES = (F32, I32)


def _v(name: str, fn: Callable[..., Any], shapes: Sequence[Sequence[int]], *targets: Any,
       dtypes: tuple[torch.dtype, ...] = VIEW_DTYPES) -> OpCase:
    return OpCase(name, fn, shaped(*shapes), dtypes, targets, VIEW_KINDS)


def _twice(fn: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    """`x -> fn(x) * 2` (each output of a tuple-valued view)."""

    def run(x: torch.Tensor) -> Any:
        out = fn(x)
        return tuple(o * 2 for o in out) if isinstance(out, (tuple, list)) else out * 2

    return run


VIEW_CASES: list[OpCase] = [
    # view / reshape: the graph holds aten.view when the layout allows a view, else
    # clone + _unsafe_view; both are index remaps
    _v("view_split_dim0", _twice(lambda x: x.view(2, 2, 6)), [(4, 6)], aten.view, dtypes=(F32, I32, BOOL)),
    _v("view_split_dim1", _twice(lambda x: x.view(4, 2, 3)), [(4, 6)], aten.view),
    _v("view_infer_minus_one", _twice(lambda x: x.view(2, -1, 6)), [(4, 6)], aten.view),
    _v("reshape_merge", _twice(lambda x: x.reshape(6, 4)), [(2, 3, 4)]),
    _v("reshape_neither_split_nor_merge", _twice(lambda x: x.reshape(6, 4)), [(4, 6)]),
    _v("reshape_flatten", _twice(lambda x: x.reshape(-1)), [(4, 6)], dtypes=(F32, I64, F16)),
    _v("reshape_to_0d", _twice(lambda x: x.reshape(())), [(1, 1)]),
    _v("reshape_from_0d", _twice(lambda x: x.reshape(1, 1)), [()]),
    _v("reshape_merge_split", _twice(lambda x: x.reshape(3, 8)), [(2, 3, 4)]),
    _v("unsafe_view", _twice(lambda x: torch.ops.aten._unsafe_view(x.clone(), [3, 2, 4])), [(4, 6)],
       aten._unsafe_view),
    # permutations
    _v("permute", _twice(lambda x: x.permute(2, 0, 1)), [(2, 3, 4)], aten.permute),
    _v("permute_negative_dims", _twice(lambda x: x.permute(-1, -3, -2)), [(2, 3, 4)], aten.permute),
    _v("transpose", _twice(lambda x: x.transpose(0, -1)), [(2, 3, 4)], aten.transpose),
    _v("t", _twice(lambda x: x.t()), [(4, 6)], aten.t, dtypes=(F32, I32, BOOL)),
    _v("t_1d", _twice(lambda x: x.t()), [(5,)], aten.t),
    # broadcasting views
    _v("expand", _twice(lambda x: x.expand(3, 4, 6)), [(4, 1)], aten.expand),
    _v("expand_minus_one", _twice(lambda x: x.expand(2, -1, 6)), [(4, 1)], aten.expand),
    _v("expand_as", lambda x, y: x.expand_as(y) + y, [(4, 1), (4, 6)], aten.expand),
    _v("unsqueeze_last", _twice(lambda x: x.unsqueeze(-1)), [(4, 6)], aten.unsqueeze),
    _v("unsqueeze_broadcast", lambda x, y: x.unsqueeze(1) + y, [(4, 6), (5, 6)], aten.unsqueeze),
    _v("squeeze_all", _twice(lambda x: x.squeeze()), [(1, 4, 1, 3)], aten.squeeze),
    _v("squeeze_dim", _twice(lambda x: x.squeeze(-2)), [(1, 4, 1, 3)], aten.squeeze),
    _v("squeeze_dim_not_one", _twice(lambda x: x.squeeze(1)), [(1, 4, 1, 3)], aten.squeeze),
    _v("squeeze_dims", _twice(lambda x: x.squeeze((0, 2, 3))), [(1, 4, 1, 3)], aten.squeeze),
    # slices and selects
    _v("slice_step", _twice(lambda x: x[:, 1::2]), [(4, 6)], aten.slice, dtypes=(F32, I32, BOOL)),
    _v("slice_negative_start_end", _twice(lambda x: x[-3:-1]), [(4, 6)], aten.slice),
    _v("slice_end_beyond_size", _twice(lambda x: x[:, 2:100]), [(4, 6)], aten.slice),
    _v("slice_negative_start_step", _twice(lambda x: x[:, -5::3]), [(4, 6)], aten.slice),
    _v("slice_empty", _twice(lambda x: x[3:1]), [(4, 6)], aten.slice),
    _v("narrow", _twice(lambda x: x.narrow(1, 1, 3)), [(4, 6)], aten.slice),
    _v("select", _twice(lambda x: x.select(1, 2)), [(2, 3, 4)], aten.select),
    _v("select_negative_index", _twice(lambda x: x[:, -1]), [(4, 6)], aten.select),
    _v("alias", _twice(torch.ops.aten.alias), [(4, 6)], aten.alias),
    # several outputs
    _v("split", _twice(lambda x: x.split(4, 1)), [(4, 6)], aten.split),
    _v("split_with_sizes", _twice(lambda x: x.split([1, 3], 0)), [(4, 6)], aten.split_with_sizes),
    _v("unbind", _twice(lambda x: x.unbind(1)), [(2, 3, 4)], aten.unbind),
    _v("chunk", _twice(lambda x: x.chunk(3, -1)), [(4, 6)], aten.split),
    # views of views, and of strided windows
    _v("views_of_views", _twice(lambda x: x.t()[1:, ::2].unsqueeze(0).expand(2, 5, 2)), [(2, 6)]),
    _v("view_of_slice", _twice(lambda x: x[:, 2:].reshape(-1)), [(4, 6)]),
    _v("select_of_permute", _twice(lambda x: x.permute(1, 2, 0)[1]), [(2, 3, 4)], aten.permute, aten.select),
    _v("diagonal", _twice(lambda x: x.diagonal()), [(4, 6)], aten.diagonal),
    _v("diagonal_offset_dims", _twice(lambda x: x.diagonal(-1, 2, 0)), [(4, 3, 5)], aten.diagonal),
    _v("unfold", _twice(lambda x: x.unfold(1, 3, 2)), [(4, 7)], aten.unfold),
    # the functional *_copy variants (torch.export): a remap and a copy that inlines
    _v("permute_copy", _twice(lambda x: torch.ops.aten.permute_copy(x, [1, 0])), [(4, 6)], aten.permute_copy),
    _v("slice_copy", _twice(lambda x: torch.ops.aten.slice_copy(x, 1, 1, 5, 2)), [(4, 6)], aten.slice_copy),
    _v("select_copy", _twice(lambda x: torch.ops.aten.select_copy(x, 0, -2)), [(4, 6)], aten.select_copy),
    _v("expand_copy", _twice(lambda x: torch.ops.aten.expand_copy(x, [3, 4, 6])), [(4, 1)], aten.expand_copy),
    _v("unsqueeze_copy", _twice(lambda x: torch.ops.aten.unsqueeze_copy(x, 1)), [(4, 6)], aten.unsqueeze_copy),
    _v("split_copy", _twice(lambda x: torch.ops.aten.split_copy(x, 2, 1)), [(4, 6)], aten.split_copy),
]
