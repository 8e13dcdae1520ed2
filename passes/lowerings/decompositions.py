"""coil's decomposition table, built from torch._decomp: ops without a lowering of
their own arrive as pointwise ops and reductions instead of Extern calls."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten

# Ops that decompose into what coil fuses well (softmax, norms, activations, ...).
_FUSION_FRIENDLY = [
    aten._softmax,
    aten._log_softmax,
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.native_layer_norm,
    aten.native_layer_norm_backward,
    aten.gelu,
    aten.gelu_backward,
    aten.silu,
    aten.silu_backward,
    aten.sigmoid_backward,
    aten.tanh_backward,
    aten.threshold_backward,
    aten.hardtanh,
    aten.leaky_relu,
    aten.elu,
    aten.mish,
    aten.softplus,
    aten.log_sigmoid_forward,
    aten.nll_loss_forward,
    aten.nll_loss_backward,
    aten.mse_loss,
    aten.addcmul,
    aten.addcdiv,
    aten.lerp,
    aten.rsub,
    aten._to_copy,
    aten.clone,
    aten.linear,
    aten.std,
    aten.std_mean,
    aten.var_mean,
    aten.norm,
    aten.linalg_vector_norm,
    aten.logsumexp,
    aten.square,
    aten.xlogy,
    aten.hardsigmoid,
    aten.hardswish,
    aten.logit,
    aten.native_dropout_backward,
    aten.masked_fill,
    aten.t,
    aten.transpose,
    aten.squeeze,
    aten.unsqueeze_copy,
    aten.expand_as,
    aten.sum_to_size,
    aten.new_zeros,
    aten.new_ones,
    aten.new_full,
    aten.zeros_like,
    aten.ones_like,
    aten.full_like,
    aten.empty_like,
    aten.split_with_sizes,
    aten.split,
    aten.unbind,
]


def _table() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = dict(core_aten_decompositions())
    table.update(get_decompositions(_FUSION_FRIENDLY))
    return table


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = _table()
