"""coil's decomposition table, built from torch._decomp: ops without a lowering of
their own arrive as pointwise ops and reductions instead of Extern calls.

`lower` consults it only for ops with no lowering (LOWERINGS wins), traces the
decomposition on meta tensors and lowers the result node by node, recursively.
Some decompositions are written with torch._refs and so emit `prims.*` ops; those
have lowerings in prims.py.  Matrix products and convolutions are deliberately
absent: they stay Extern calls to the vendor kernels.
"""

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
    aten.native_group_norm,
    aten.native_group_norm_backward,
    aten.native_batch_norm,  # make_fx graphs; in training it copy_s the running stats, as eager does
    aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit,
    aten.native_batch_norm_backward,
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
    aten.flip,
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


# Never decomposed: these are the kernels Extern exists for.
# Kept whole as Extern calls.  Attention too: with torch's decomposition of
# scaled_dot_product_attention into its CPU flash kernel, AOTAutograd's backward
# gives wrong gradients (seen with torch 2.13, eager compilers, no coil involved),
# and the fused aten kernels are what a user wants there anyway.
_KEEP_EXTERN = (
    aten.mm, aten.bmm, aten.addmm, aten.convolution, aten._convolution,
    aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_attention_math,
)


def copy(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Functional `copy` (what functionalization makes of `self.copy_(src)`): src,
    converted to self's dtype and broadcast to self's shape.  torch has no
    decomposition for it."""
    out = aten._to_copy.default(src, dtype=self.dtype) if src.dtype != self.dtype else src
    return aten.clone.default(aten.expand.default(out, list(self.shape)))


def weight_norm_interface_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
                                   saved_norms: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of w = g * v / ||v|| (the norm over every dim but `dim`), as
    eager's kernel computes it: grad_g = sum(grad_w * v) / norm and grad_v =
    (g / norm) * (grad_w - v * grad_g / norm), half types in float32.  torch has
    no decomposition for it."""
    acc = torch.float32 if saved_v.dtype in (torch.float16, torch.bfloat16) else saved_v.dtype
    gw, v, g, norm = (t.to(acc) for t in (grad_w, saved_v, saved_g, saved_norms))
    keep = dim % saved_v.dim()
    dot = aten.sum.dim_IntList(gw * v, [d for d in range(saved_v.dim()) if d != keep], True)
    grad_g = dot / norm
    grad_v = (g / norm) * (gw - v * (grad_g / norm))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)


def _core() -> dict[Any, Callable[..., Any]]:
    """Core ATen's decompositions.  CompositeImplicitAutograd ops decompose while
    AOTAutograd traces anyway, so only the post-autograd part is taken where torch
    offers it: `core_aten_decompositions()` also lists every such op, which costs
    a few tenths of a second of a cold compile to materialize."""
    post_autograd = getattr(torch._decomp, "_core_aten_decompositions_post_autograd", None)
    return dict(post_autograd() if post_autograd is not None else core_aten_decompositions())


def _table() -> dict[Any, Callable[..., Any]]:
    table: dict[Any, Callable[..., Any]] = _core()
    table.update(get_decompositions(_FUSION_FRIENDLY))
    table[aten.copy.default] = copy
    table[aten._weight_norm_interface_backward.default] = weight_norm_interface_backward
    for packet in _KEEP_EXTERN:
        for name in packet.overloads():
            table.pop(getattr(packet, name), None)
    return table


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = _table()
