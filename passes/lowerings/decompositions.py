"""coil's decomposition table, built from torch._decomp: ops without a lowering of
their own arrive as pointwise ops and reductions instead of Extern calls.

`lower` consults it only for ops with no lowering (LOWERINGS wins), traces the
decomposition on meta tensors and lowers the result node by node, recursively.
Some decompositions are written with torch._refs and so emit `prims.*` ops; those
have lowerings in prims.py.  Matrix products and convolutions are deliberately
absent: they stay Extern calls to the vendor kernels (but for a long grouped
conv1d on a GPU, which the joint graph's table writes as matrix products where
that measures faster: conv_taps.py).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from coil.passes.lowerings import conv_taps
from coil.passes.lowerings.foreach import FOREACH_DECOMPOSITIONS, ONE_DEVICE

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
    aten.index_add,  # atomics in one kernel on CUDA (embedding_dense_backward below)
    aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_attention_math,
)


def copy(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Functional `copy` (what functionalization makes of `self.copy_(src)`): src,
    converted to self's dtype and broadcast to self's shape, in self's layout, as
    eager's copy returns it.  The layout matters while AOTAutograd traces: a later
    `view` of the result (Longformer's backward views the gradient of a transposed
    score tensor) holds only for the strides eager gives.  A dense self's strides
    are kept exactly (src laid out in self's stride order); a self with gaps (a
    slice) gets the dense strides of its order, which every view of eager's result
    also fits; an overlapping one (expanded) gets contiguous strides, as eager's.
    torch has no decomposition for it."""
    out = aten._to_copy.default(src, dtype=self.dtype) if src.dtype != self.dtype else src
    out = aten.expand.default(out, list(self.shape))
    strides = self.stride()
    if not all(isinstance(st, int) for st in strides) or any(st == 0 and n != 1 for st, n in zip(strides, self.shape)):
        perm = list(range(self.dim()))  # symbolic strides, or an overlapping self: contiguous
    else:  # outermost first; a size-1 dim's stride says nothing: it goes just before the dim after it
        n = self.dim()

        def key(d: int) -> tuple[int, int, int]:
            if self.shape[d] != 1:
                return -strides[d], 0, d
            after = next((e for e in range(d + 1, n) if self.shape[e] != 1), None)
            return (1 if after is None else -strides[after]), -1, d

        perm = sorted(range(n), key=key)
    if perm == list(range(self.dim())):
        return aten.clone.default(out, memory_format=torch.contiguous_format)
    inverse = [perm.index(d) for d in range(len(perm))]
    laid = aten.clone.default(aten.permute.default(out, perm), memory_format=torch.contiguous_format)
    return aten.permute.default(laid, inverse)


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


# an embedding gradient with more element-rows than this (numel of the weight times
# the tokens) is accumulated by index_add (scatters.SCATTER_WORK: below it, the
# index_put that torch's decomposition makes is lowered into a kernel)
EMBEDDING_SCATTER_WORK = 1 << 13


def embedding_dense_backward(grad_output: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int,
                             scale_grad_by_freq: bool) -> torch.Tensor:
    """The embedding gradient as one index_add into zeros, in float32 for half
    types as eager accumulates, where torch's decomposition makes an accumulating
    index_put: on CUDA aten's index_put with accumulate sorts the indices first
    (several kernels a table), index_add adds with atomics in one (Inductor's
    scatter does the same; the order of the additions is not fixed, as there).
    torch's decomposition where the table is small (coil lowers its index_put),
    with scale_grad_by_freq, and under torch.use_deterministic_algorithms."""
    rows = indices.numel()
    width = grad_output.numel() // max(rows, 1)
    if (scale_grad_by_freq or torch.are_deterministic_algorithms_enabled()
            or num_weights * width * rows <= EMBEDDING_SCATTER_WORK):
        from torch._decomp.decompositions import embedding_dense_backward as torch_decomposition

        return torch_decomposition(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    acc = torch.float32 if grad_output.dtype in (torch.float16, torch.bfloat16) else grad_output.dtype
    flat_idx = aten.reshape.default(indices, [rows])
    flat_grad = aten.reshape.default(grad_output, [rows, width]).to(acc)
    if padding_idx >= 0:
        keep = aten.unsqueeze.default(aten.ne.Scalar(flat_idx, padding_idx), 1)
        flat_grad = aten.where.self(keep, flat_grad, aten.scalar_tensor.default(0, dtype=acc, device=flat_grad.device))
    zeros = aten.zeros.default([num_weights, width], dtype=acc, device=grad_output.device)
    out = aten.index_add.default(zeros, 0, flat_idx, flat_grad)
    shape = [num_weights, *grad_output.shape[indices.dim():]]
    return aten.reshape.default(out, shape).to(grad_output.dtype)


def like_as_full(fill: Any) -> Callable[..., Any]:
    """zeros_like / ones_like / full_like as a `full` of the same shape, permuted
    into the input's dense layout, so the result no longer takes the input as an
    argument.  For AOTAutograd's joint graph: a backward `zeros_like(log_probs)`
    (torch's nll_loss_backward) made the min-cut partitioner count the forward's
    float32 log-softmax as read by the backward, so it was saved (262 MB for a
    32000-word vocabulary at 2048 tokens) where the bfloat16 logits and two row
    statistics do.  A layout `full` cannot make (overlapping or gapped strides, an
    explicit memory format) keeps the op (NotImplemented)."""

    def decomposition(self: torch.Tensor, *args: Any, dtype: torch.dtype | None = None, layout: Any = None,
                      device: Any = None, pin_memory: bool | None = None, requires_grad: bool = False,
                      memory_format: Any = None) -> Any:
        value = args[0] if fill is None else fill
        if memory_format not in (None, torch.preserve_format) or layout not in (None, torch.strided):
            return NotImplemented
        shape, stride = list(self.shape), list(self.stride())
        # the dims from outermost to innermost in memory; dense when the strides are a
        # permutation's contiguous ones (size-1 dims may have any stride)
        order = sorted(range(len(shape)), key=lambda d: (-stride[d], -d))
        expected = 1
        for d in reversed(order):
            if shape[d] != 1 and stride[d] != expected:
                return NotImplemented
            expected *= shape[d]
        out = aten.full.default([shape[d] for d in order], value, dtype=dtype or self.dtype,
                                device=device or self.device, pin_memory=pin_memory)
        if order == sorted(order):
            return out
        return aten.permute.default(out, [order.index(d) for d in range(len(shape))])

    return decomposition


def detach_as_alias(self: torch.Tensor) -> torch.Tensor:
    """detach as alias (core ATen's decomposition): the min-cut partitioner counts
    an alias as a view it may recompute for free, a detach as an op whose input the
    backward must be given."""
    return aten.alias.default(self)


def convolution_backward_bias_apart(grad_output: torch.Tensor, *args: Any) -> Any:
    """A convolution's bias gradient on a GPU as a sum of grad_output over every
    dim but the channels, which coil fuses with whatever computes grad_output; the
    aten kernel then computes the input's and the weight's gradients only.  aten's
    convolution_backward sums it in a kernel of its own (ConvNeXt's large training
    step on an H100: 20 such launches, 309 µs).  Inductor does the same on a GPU.
    On the CPU (mkldnn computes it alongside) and without a bias gradient, the op
    stays whole (NotImplemented)."""
    if not args[-1][2] or grad_output.device.type == "cpu":  # args[-1]: output_mask
        return NotImplemented
    return bias_gradient_apart(grad_output, *args)


def convolution_backward_on_gpu(taps: conv_taps.TapsChoice, grad_output: torch.Tensor, *args: Any) -> Any:
    """convolution_backward as coil's GPU graphs take it: a long grouped conv1d's by
    taps where `taps` takes it (conv_taps.py, as its forward), any other's with the
    bias gradient apart."""
    got = taps.convolution_backward(grad_output, *args)
    return got if got is not NotImplemented else convolution_backward_bias_apart(grad_output, *args)


def bias_gradient_apart(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias_sizes: Any,
                        stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
                        output_mask: Any) -> Any:
    """convolution_backward's three results with the bias gradient summed apart
    (on any device: the tests check it against aten's on the CPU)."""
    grad_bias = aten.sum.dim_IntList(grad_output, [0, *range(2, grad_output.dim())])
    if not output_mask[0] and not output_mask[1]:
        return None, None, grad_bias
    grad_input, grad_weight, _ = aten.convolution_backward.default(
        grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
        [output_mask[0], output_mask[1], False])
    return grad_input, grad_weight, grad_bias


def low_memory_max_pool(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
                        ceil_mode: bool = False) -> Any:
    """max_pool2d_with_indices as Inductor's joint graph has it: values and int8 window
    offsets (`prims._low_memory_max_pool_with_offsets`), then the indices computed from
    the offsets (`prims._low_memory_max_pool_offsets_to_indices`, which the min-cut
    partitioner may recompute).  A training step then saves the offsets, an eighth of
    the int64 indices' bytes (ResNet's first max pool at batch 8: 12.2 -> 1.5 MiB), and
    the backward compares the offsets inside its own kernel.  Only where coil lowers
    both (pooling.py: a float input of static sizes, a window of at most MAX_WINDOW
    positions), and not on the CPU: GCC vectorises the C++ loops of int8 offsets with
    8-byte vectors where those of int64 indices get 32-byte ones (`-fopt-info-vec`;
    ResNet's stem at the CPU size, one thread: the forward
    142 -> 452 µs, the backward 380 -> 796 µs, the training step 5-8 % slower); elsewhere
    the op stays whole (NotImplemented)."""
    from coil.passes.lowerings.pooling import window_params

    params = window_params(x, kernel_size, stride, padding, dilation)
    prims = torch.ops.prims
    if (x.device.type == "cpu" or params is None or not all(isinstance(n, int) for n in x.shape)
            or not hasattr(prims, "_low_memory_max_pool_with_offsets")):
        return NotImplemented
    k, s, p, d = params
    values, offsets = prims._low_memory_max_pool_with_offsets.default(x, list(k), list(s), list(p), list(d), ceil_mode)
    indices = prims._low_memory_max_pool_offsets_to_indices.default(offsets, list(k), list(x.shape[-2:]), list(s),
                                                                      list(p), list(d))
    return values, indices


# AOTAutograd's joint graph only (coil lowers these ops itself when they reach lower)
AOT_ONLY_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.zeros_like.default: like_as_full(0),
    aten.ones_like.default: like_as_full(1),
    aten.full_like.default: like_as_full(None),
    aten.detach.default: detach_as_alias,
    # torch's decomposition, as Inductor's joint graph has it: a gather the
    # partitioner counts as fusible.  With nll_loss_forward whole it counts the
    # float32 log-softmax as materialized (read by an op it cannot recompute), so it
    # saves that, where Inductor saves the logits and two row statistics: the forward
    # then writes the whole log-softmax (the CPU Llama's training forward spent 1.5 ms
    # in that kernel, Inductor's 0.7).  lower retags the gather's checks to raise
    # nll_loss's error (indirect.py: ERRORS_BY_ORIGIN).
    aten.nll_loss_forward.default: get_decompositions([aten.nll_loss_forward.default])[aten.nll_loss_forward.default],
    aten.max_pool2d_with_indices.default: low_memory_max_pool,
}


def aot_only_decompositions(taps: conv_taps.TapsChoice) -> dict[Any, Callable[..., Any]]:
    """AOT_ONLY_DECOMPOSITIONS and the convolutions' two, bound to `taps`, the
    handler that decides which long grouped conv1d goes by taps (conv_taps.py)."""
    return AOT_ONLY_DECOMPOSITIONS | {
        aten.convolution.default: taps.convolution,
        aten.convolution_backward.default: functools.partial(convolution_backward_on_gpu, taps),
    }


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
    table[aten.embedding_dense_backward.default] = embedding_dense_backward
    table.update(FOREACH_DECOMPOSITIONS)
    for packet in _KEEP_EXTERN:
        for name in packet.overloads():
            table.pop(getattr(packet, name), None)
    return table


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = _table()

# decompositions lower takes only where every tensor of the call is on the graph's device
ONE_DEVICE_DECOMPOSITIONS: frozenset[Any] = ONE_DEVICE
