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


# ---- decompositions ------------------------------------------------------------------------
# Ops with no lowering of their own, which `lower` decomposes (torch._decomp) into
# pointwise ops and reductions, plus the prims that torch._refs decompositions emit.
# As for reductions, `s = x + y` is a (4, 5, 6) broadcast or a (4, 6) sum of
# non-contiguous inputs; parameters of the last dim's size come from rows of y.
# DECOMP_EXTERNS names the only Extern kernels a case may keep: gather and scatter
# read at data-dependent indices, which a loop body cannot express.

def _d(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...], *targets: Any,
       domain: str = "any", n: int = 2) -> OpCase:
    return OpCase(name, fn, tensors(*([domain] * n)), dtypes, targets, ("broadcast", "noncontig"))


def _target_of(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Class indices for nll_loss on `s` (dim 1 holds the classes), drawn from x."""
    return (x.select(1, 0).abs() * 100).to(torch.int64) % s.shape[1]


def _layer_norm_backward(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = x + y
    w, b = y[0] * 0.5 + 1, y[-1]
    out, mean, rstd = torch.ops.aten.native_layer_norm(s, [s.shape[-1]], w, b, 1e-5)
    return torch.ops.aten.native_layer_norm_backward(out * x, s, [s.shape[-1]], mean, rstd, w, b, [True, True, True])


def _nll_backward(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = (x + y).log_softmax(1)
    t = _target_of(x, s)
    total = torch.scalar_tensor(float(t.numel()))
    return torch.ops.aten.nll_loss_backward(torch.scalar_tensor(0.5), s, t, None, 1, -100, total)


def _group_norm(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = (x + y).reshape(2, 6, -1)  # (N, C, L): 2 groups of 3 channels
    return torch.nn.functional.group_norm(s, 2, torch.arange(6.0) * 0.1 + 1, torch.arange(6.0) - 2)


def _batch_norm_eval(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = (x + y).reshape(2, 6, -1)
    stats = torch.arange(6.0)
    return torch.nn.functional.batch_norm(s, stats * 0.1, stats * 0.2 + 0.5, stats - 1, stats * 0.3, training=False)


F = torch.nn.functional
prims = torch.ops.prims

DECOMP_CASES: list[OpCase] = [
    # softmax family, forward and backward
    _d("softmax", lambda x, y: torch.softmax(x + y, -1), (F32, F16), aten._softmax),
    _d("softmax_dim0", lambda x, y: torch.softmax(x + y, 0), (F32, BF16), aten._softmax),
    _d("softmax_half_to_float", lambda x, y: torch.softmax(x + y, -1, dtype=torch.float32), (F16, BF16),
       aten._softmax),
    _d("log_softmax", lambda x, y: torch.log_softmax(x + y, -1), (F32, F16), aten._log_softmax),
    _d("log_softmax_dim0", lambda x, y: torch.log_softmax(x + y, 0), (F32, F64), aten._log_softmax),
    _d("softmax_backward", lambda x, y: torch.ops.aten._softmax_backward_data(x + y, (x * y).softmax(-1), -1, x.dtype),
       (F32, F64), aten._softmax_backward_data),
    _d("log_softmax_backward",
       lambda x, y: torch.ops.aten._log_softmax_backward_data(x + y, (x * y).log_softmax(-1), -1, x.dtype),
       (F32, F64), aten._log_softmax_backward_data),
    _d("logsumexp", lambda x, y: torch.logsumexp(x + y, -1), (F32, F64), aten.logsumexp),
    # norms
    _d("layer_norm", lambda x, y: F.layer_norm(x + y, (y.shape[-1],), y[0], y[-1]), (F32, F16),
       aten.native_layer_norm),
    _d("layer_norm_no_affine_two_dims", lambda x, y: F.layer_norm(x + y, (x + y).shape[-2:]), (F32, BF16),
       aten.native_layer_norm),
    _d("native_layer_norm_outputs", lambda x, y: torch.ops.aten.native_layer_norm(x + y, [y.shape[-1]], y[0], None, 1e-3),
       (F32, F64), aten.native_layer_norm),
    _d("layer_norm_backward", _layer_norm_backward, (F32, F64), aten.native_layer_norm_backward),
    _d("group_norm", _group_norm, (F32, F64), aten.native_group_norm),
    _d("batch_norm_eval", _batch_norm_eval, (F32, F64), aten._native_batch_norm_legit_no_training),
    _d("vector_norm", lambda x, y: torch.linalg.vector_norm(x + y, 2, -1), (F32, F64), aten.linalg_vector_norm),
    _d("std_mean_decomposed", lambda x, y: torch.std_mean(x + y, (0, -1), correction=0), (F32, F64), aten.std_mean),
    # activations and their backward ops
    _d("gelu_backward", lambda x, y: torch.ops.aten.gelu_backward(x, y), (F32, F64), aten.gelu_backward),
    _d("gelu_tanh_backward", lambda x, y: torch.ops.aten.gelu_backward(x, y, approximate="tanh"), (F32, F64),
       aten.gelu_backward),
    _d("silu_backward", lambda x, y: torch.ops.aten.silu_backward(x, y), (F32, F16), aten.silu_backward),
    _d("sigmoid_backward", lambda x, y: torch.ops.aten.sigmoid_backward(x, y.sigmoid()), (F32, F64),
       aten.sigmoid_backward),
    _d("tanh_backward", lambda x, y: torch.ops.aten.tanh_backward(x, y.tanh()), (F32, F64), aten.tanh_backward),
    _d("threshold_backward", lambda x, y: torch.ops.aten.threshold_backward(x, y, 0.0), (F32, F64),
       aten.threshold_backward),
    _d("hardtanh", lambda x, y: F.hardtanh(x + y, -1.0, 1.5), (F32, BF16), aten.hardtanh),
    _d("leaky_relu", lambda x, y: F.leaky_relu(x + y, 0.1), (F32, F16), aten.leaky_relu),
    _d("elu", lambda x, y: F.elu(x + y), (F32, F64), aten.elu),
    _d("softplus", lambda x, y: F.softplus(x + y), (F32, F64), aten.softplus),
    _d("mish", lambda x, y: F.mish(x + y), (F32, F64), aten.mish),
    _d("logsigmoid", lambda x, y: F.logsigmoid(x + y), (F32, F64), aten.log_sigmoid_forward),
    _d("hardswish", lambda x, y: F.hardswish(x + y), (F32, F64), aten.hardswish),
    _d("hardsigmoid", lambda x, y: F.hardsigmoid(x + y), (F32, F64), aten.hardsigmoid),
    # losses
    _d("mse_loss", lambda x, y: F.mse_loss(x + y, x * y), (F32, F64), aten.mse_loss),
    _d("mse_loss_sum", lambda x, y: F.mse_loss(x + y, x * y, reduction="sum"), (F32, F64), aten.mse_loss),
    _d("mse_loss_none", lambda x, y: F.mse_loss(x + y, x * y, reduction="none"), (F32, BF16), aten.mse_loss),
    _d("nll_loss", lambda x, y: F.nll_loss((x + y).log_softmax(1), _target_of(x, x + y)), (F32, F64),
       aten.nll_loss_forward),
    _d("nll_loss_sum_ignore_index",
       lambda x, y: F.nll_loss((x + y).log_softmax(1), _target_of(x, x + y), ignore_index=1, reduction="sum"),
       (F32, F64), aten.nll_loss_forward),
    _d("nll_loss_none", lambda x, y: F.nll_loss((x + y).log_softmax(1), _target_of(x, x + y), reduction="none"),
       (F32, F64), aten.nll_loss_forward),
    _d("nll_loss_backward", _nll_backward, (F32, F64), aten.nll_loss_backward),
    # elementwise composites
    _d("addcmul", lambda x, y: torch.addcmul(x, y, x * y, value=0.5), (F32, F16), aten.addcmul),
    _d("addcdiv", lambda x, y: torch.addcdiv(x, y, x.abs() + 1, value=2), (F32, F64), aten.addcdiv),
    _d("lerp", lambda x, y: torch.lerp(x, y, 0.3), (F32, F64), aten.lerp),
    _d("masked_fill", lambda x, y: (x + y).masked_fill(x > y, -1.5), (F32, I32), aten.masked_fill),
    _d("square", lambda x, y: torch.square(x + y), (F32, I64), aten.square),
    _d("xlogy", lambda x, y: torch.xlogy(x, y), (F32, F64), aten.xlogy, domain="positive"),
    _d("flip", lambda x, y: (x + y).flip(0, -1), (F32, I32), aten.flip),
    _d("copy", lambda x, y: torch.ops.aten.copy(x * y, y.to(torch.float64)), (F32, I32), aten.copy),
    # _to_copy: dtype casts (with a reduction after, which must read the cast inline)
    _d("to_copy_float64_sum", lambda x, y: (x + y).to(torch.float64).sum(-1), (F32, F16), aten._to_copy),
    _d("to_copy_half", lambda x, y: (x + y).to(torch.float16), (F32, I32), aten._to_copy),
    _d("to_copy_int_to_bool", lambda x, y: (x * y).to(torch.bool), (F32, I64), aten._to_copy),
    _d("to_copy_same_dtype", lambda x, y: (x + y).to(x.dtype, copy=True), (F32, BF16), aten._to_copy),
    # prims, called directly (torch._refs decompositions emit them)
    _d("prims_broadcast_in_dim_new_dim", lambda x, y: prims.broadcast_in_dim(y, [3, *y.shape], [1, 2]) * 2,
       (F32, I32), prims.broadcast_in_dim),
    _d("prims_broadcast_in_dim_grow", lambda x, y: prims.broadcast_in_dim(x, (x + y).shape, range(x.dim())) + y,
       (F32, I32), prims.broadcast_in_dim),
    _d("prims_sum", lambda x, y: prims.sum(x + y, [0, (x + y).dim() - 1]), (F32, F64), prims.sum),
    _d("prims_sum_output_dtype", lambda x, y: prims.sum(x + y, None, output_dtype=torch.float64), (F32, F16),
       prims.sum),
    _d("prims_prod_amax_amin", lambda x, y: (prims.prod(x * y, [0]), prims.amax(x + y, [0]), prims.amin(x + y, None)),
       (F32, I64), prims.prod, prims.amax, prims.amin, domain="nonzero"),
    _d("prims_var", lambda x, y: prims.var(x + y, [0], 0.0), (F32, F64), prims.var),
    _d("prims_var_correction1_all", lambda x, y: prims.var(x + y, None, 1.0), (F32, F64), prims.var),
    _d("prims_div", lambda x: prims.div(x * 7 + 3, x), (F32, I32), prims.div, domain="nonzero", n=1),
    _d("prims_where", lambda x: prims.where(x > 0, x * 2, x - 1), (F32, I32), prims.where, n=1),
    _d("prims_squeeze", lambda x, y: prims.squeeze((x + y).unsqueeze(0).unsqueeze(-1), [0, -1]) * 2, (F32, I32),
       prims.squeeze),
    _d("prims_collapse_split_dim", lambda x, y: prims.split_dim(prims.collapse_view(x + y, 0, 1), 0, 2) * 2,
       (F32, I32), prims.collapse_view, prims.split_dim),
    _d("prims_transpose_rev", lambda x, y: prims.rev(prims.transpose(x + y, [1, 0, *range(2, (x + y).dim())]), [0]),
       (F32, I32), prims.transpose, prims.rev),
    _d("prims_elementwise", lambda x: prims.mul(prims.exp(prims.neg(x)), prims.sub(x, prims.abs(x))), (F32, F64),
       prims.mul, prims.exp, prims.neg, prims.sub, prims.abs, n=1),
    _d("prims_compare", lambda x: prims.lt(prims.maximum(x, x * 0.5), prims.minimum(x, x * 2.0)), (F32, F64),
       prims.lt, prims.maximum, prims.minimum, n=1),
]

DECOMP_EXTERNS: dict[str, frozenset[str]] = {
    "nll_loss": frozenset({"aten.gather.default"}),
    "nll_loss_sum_ignore_index": frozenset({"aten.gather.default"}),
    "nll_loss_none": frozenset({"aten.gather.default"}),
    "nll_loss_backward": frozenset({"aten.scatter.value"}),
}
