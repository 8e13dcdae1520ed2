"""Grouped 1-D convolutions of many taps, as matrix products over chunks of taps.

Wav2Vec2's positional convolution is a conv1d of 16 groups and 128 taps.  On a
GPU, aten's convolution (cuDNN) can run it very slowly.  At the models suite's
large size (2048 channels, 8 x 256 frames, bfloat16, H100) cuDNN picks
implicit-GEMM kernels without tensor cores: 34.8 ms forward, 132 ms forward and
backward.  The products below take 2.9 and 8.2 ms, run eagerly and unfused
(`bench/probes/grouped_conv.py`); Wav2Vec2's large inference took 40.7 ms with
Inductor and 9.9 with coil.  cuDNN's choice is erratic, though: at 512 channels
it takes 0.45 ms for 128 taps and 0.05 ms for 64, where the eager products take
0.57 and 0.63 ms.  So the choice is measured (TapsChoice.taken): once a shape,
on the device, each form timed on random tensors, and the faster one taken and
logged.  The choice is a handler: the backend binds its TapsChoice into the
joint graph's decompositions (decompositions.aot_only_decompositions), and a
caller passes its own (another timer, other devices) to the backend.

With xp the input padded by `pad` on both ends, og = o / g output and cg = c / g
input channels a group,

    out[b, g*og + p, s] = sum over q < cg, j < k of w[g*og + p, q, j] * xp[b, g*cg + q, s + j]

and for a chunk of taps j in [j0, j0 + kk) the sum is one bmm over the groups:
w's chunk (g, og, cg*kk) times the chunk's columns (g, cg*kk, b*tout), an
unfold of xp copied once.  The columns are the chunk's memory: chunks of at
most CHUNK_BYTES, and fuse keeps their copies apart (fuse.py, `hoists`), so one
chunk's columns are held at a time.  Each chunk's product is rounded to the
input's dtype once; the chunks are summed (in float32 for half types, in one
fused kernel) and the sum rounded once.

The backward is two more such sums.  The input's gradient is the same
convolution of grad_output, with the weight's groups transposed and its taps
flipped (padding k - 1 - pad).  The weight's gradient is, chunk by chunk,
grad_output's columns times the input's groups (weight_grad_by_taps).

Taken only on a device the TapsChoice times on (a CUDA device by default; the
CPU's mkldnn convolution has no such cliff), for a 1-D convolution that is not transposed, has stride and
dilation 1, at least two groups and LONG_TAPS taps, padding at most k - 1, and
static sizes.  Everything else stays aten's convolution (NotImplemented).
Inductor keeps this convolution whole.

Every other 1-d convolution, on the devices in TapsChoice.rows_2d, is traced as
the 2-d convolution of one row it is (conv1d_as_2d): passes/layout.py then runs it
channels-last like any 2-d one, with its neighbours' kernels writing the layout it
reads.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Sequence

import attrs
import torch

from coil.ir.shapes import is_static

aten = torch.ops.aten
log = logging.getLogger("coil")

# the fewest taps a grouped conv1d needs to be written as products
LONG_TAPS = 32
# the most bytes of one chunk's columns
CHUNK_BYTES = 64 << 20
# calls timed of each form by time_on_device (after a warm-up call)
TIMED_CALLS = 3


def long_grouped(x: torch.Tensor, w: torch.Tensor, stride: Sequence[Any], padding: Sequence[Any],
                 dilation: Sequence[Any], transposed: bool, output_padding: Sequence[Any], groups: int) -> bool:
    """Whether this convolution is one that conv_by_taps computes (the module's rule)."""
    if x.dim() != 3 or w.dim() != 3 or transposed or not isinstance(groups, int) or groups < 2:
        return False
    if not is_static((*x.shape, *w.shape, *stride, *padding, *dilation)):
        return False
    k = w.shape[-1]
    return (list(stride) == [1] and list(dilation) == [1] and len(padding) == 1 and 0 <= padding[0] <= k - 1
            and k >= LONG_TAPS and x.dtype.is_floating_point and x.dtype == w.dtype)


def taps_a_chunk(batch: int, channels: int, frames: int, taps: int, itemsize: int) -> int:
    """How many taps one chunk takes: its columns (batch x channels x frames a tap)
    within CHUNK_BYTES, at least one tap."""
    return max(1, min(taps, CHUNK_BYTES // max(1, batch * channels * frames * itemsize)))


def _columns(xp: torch.Tensor, groups: int, j0: int, kk: int, tout: int) -> torch.Tensor:
    """xp's columns for taps [j0, j0 + kk): (g, cg*kk, b*tout), element [g, q*kk + j,
    b*tout + s] = xp[b, g*cg + q, s + j0 + j]."""
    b, c, _ = xp.shape
    win = aten.slice.Tensor(xp, 2, j0, j0 + tout + kk - 1)
    cols = aten.unfold.default(win, 2, kk, 1)  # (b, c, tout, kk)
    cols = aten.view.default(cols, [b, groups, c // groups, tout, kk])
    cols = aten.permute.default(cols, [1, 2, 4, 0, 3])
    return aten.reshape.default(cols, [groups, (c // groups) * kk, b * tout])


def conv_by_taps(x: torch.Tensor, w: torch.Tensor, pad: int, groups: int) -> torch.Tensor:
    """conv1d(x, w, padding=pad, groups=groups), no bias, as bmm over tap chunks."""
    b, c, t = x.shape
    o, cg, k = w.shape
    g, og = groups, o // groups
    tout = t + 2 * pad - k + 1
    xp = aten.constant_pad_nd.default(x, [pad, pad], 0.0) if pad else x
    wg = aten.view.default(w, [g, og, cg, k])
    kk = taps_a_chunk(b, c, tout, k, x.element_size())
    total = None
    for j0 in range(0, k, kk):
        n = min(kk, k - j0)
        wk = aten.reshape.default(aten.slice.Tensor(wg, 3, j0, j0 + n), [g, og, cg * n])
        part = aten.bmm.default(wk, _columns(xp, g, j0, n, tout))  # (g, og, b*tout)
        if part.dtype in (torch.float16, torch.bfloat16):
            part = aten._to_copy.default(part, dtype=torch.float32)
        total = part if total is None else aten.add.Tensor(total, part)
    assert total is not None
    if total.dtype != x.dtype:
        total = aten._to_copy.default(total, dtype=x.dtype)
    out = aten.permute.default(aten.view.default(total, [g, og, b, tout]), [2, 0, 1, 3])
    return aten.clone.default(aten.reshape.default(out, [b, o, tout]), memory_format=torch.contiguous_format)


def weight_grad_by_taps(grad_out: torch.Tensor, x: torch.Tensor, w_shape: Sequence[int], pad: int,
                        groups: int) -> torch.Tensor:
    """The weight's gradient of conv1d(x, w, padding=pad, groups=groups) for grad_out,
    with the columns taken of grad_out, not of x:

        dw[g*og + p, q, j] = sum over b, u of gp[b, g*og + p, u + k - 1 - j] * xp[b, g*cg + q, u]

    (gp: grad_out padded by k - 1 on both ends, u over xp's length).  Chunk by chunk
    of the flipped taps i = k - 1 - j, grad_out's columns (g, og*n, b*L) times xp's
    groups (g, b*L, cg).  Columns of x would be the forward's columns again, and
    AOTAutograd's joint graph would merge the two and save them for the backward
    (its partitioner saves what a backward's matrix product reads: Wav2Vec2's small
    training step held 4 x 62 MiB more); grad_out's exist in the backward only."""
    b, c, t = x.shape
    o, cg, k = w_shape
    g, og = groups, o // groups
    xp = aten.constant_pad_nd.default(x, [pad, pad], 0.0) if pad else x
    length = t + 2 * pad
    xg = aten.reshape.default(aten.permute.default(aten.view.default(xp, [b, g, cg, length]), [1, 0, 3, 2]),
                              [g, b * length, cg])
    gp = aten.constant_pad_nd.default(grad_out, [k - 1, k - 1], 0.0)
    kk = taps_a_chunk(b, o, length, k, x.element_size())
    parts = []
    for i0 in range(0, k, kk):
        n = min(kk, k - i0)
        part = aten.bmm.default(_columns(gp, g, i0, n, length), xg)  # (g, og*n, cg): taps i0 .. i0+n-1
        parts.append(aten.view.default(part, [g, og, n, cg]))
    flipped = parts[0] if len(parts) == 1 else aten.cat.default(parts, 2)  # (g, og, k, cg), by i
    grad_w = aten.flip.default(aten.permute.default(flipped, [0, 1, 3, 2]), [3])
    return aten.reshape.default(grad_w, [o, cg, k])


def flipped_groups(w: torch.Tensor, groups: int) -> torch.Tensor:
    """The weight whose convolution is the input's gradient: (g*cg, og, k), element
    [g*cg + q, p, j] = w[g*og + p, q, k - 1 - j]."""
    o, cg, k = w.shape
    og = o // groups
    wt = aten.permute.default(aten.view.default(w, [groups, og, cg, k]), [0, 2, 1, 3])
    return aten.reshape.default(aten.flip.default(wt, [3]), [groups * cg, og, k])


def by_taps(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Any, padding: Any,
            dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Any:
    """aten.convolution by taps where long_grouped holds (on any device: the tests
    run it on the CPU), else whole (NotImplemented)."""
    if not long_grouped(x, w, stride, padding, dilation, transposed, output_padding, groups):
        return NotImplemented
    out = conv_by_taps(x, w, padding[0], groups)
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(bias, [1, -1, 1]))
    return out


def backward_by_taps(grad_out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias_sizes: Any, stride: Any,
                     padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
                     output_mask: Sequence[bool]) -> Any:
    """aten.convolution_backward of a convolution by_taps takes: each gradient asked
    for by taps (the bias's a sum over batch and frames); else NotImplemented."""
    if not long_grouped(x, w, stride, padding, dilation, transposed, output_padding, groups):
        return NotImplemented
    pad = padding[0]
    k = w.shape[-1]
    grad_x = (conv_by_taps(grad_out, flipped_groups(w, groups), k - 1 - pad, groups) if output_mask[0] else None)
    grad_w = weight_grad_by_taps(grad_out, x, list(w.shape), pad, groups) if output_mask[1] else None
    grad_b = aten.sum.dim_IntList(grad_out, [0, 2]) if output_mask[2] else None
    return grad_x, grad_w, grad_b


def conv1d_as_2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Sequence[Any],
                 padding: Sequence[Any], dilation: Sequence[Any], output_padding: Sequence[Any],
                 groups: int) -> torch.Tensor:
    """A 1-d convolution as the 2-d convolution of one row it is: x (N, C, L) as
    (N, C, 1, L), w (O, C/g, K) as (O, C/g, 1, K), the result's row dim dropped."""
    out = aten.convolution.default(aten.unsqueeze.default(x, 2), aten.unsqueeze.default(w, 2), bias,
                                   [1, stride[0]], [0, padding[0]], [1, dilation[0]], False,
                                   [0, output_padding[0]], groups)
    return aten.squeeze.dim(out, 2)


Timer = Callable[[Callable[[], Any], Callable[[], Any]], tuple[float, float]]


def time_on_device(whole: Callable[[], Any], taps: Callable[[], Any]) -> tuple[float, float]:
    """Milliseconds of each callable on the current CUDA device: the median of
    TIMED_CALLS after one warm-up call each, with CUDA events."""
    times = []
    for fn in (whole, taps):
        fn()
        runs = []
        for _ in range(TIMED_CALLS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end))
        times.append(sorted(runs)[len(runs) // 2])
    return times[0], times[1]


def _time_both(x: torch.Tensor, w: torch.Tensor, pad: int, groups: int, backward: bool,
               timer: Timer) -> tuple[float, float]:
    """(aten's ms, by taps' ms) from `timer`, on random tensors of x's and w's sizes
    made outside the trace, with x's device the current one."""
    from torch.utils._python_dispatch import _disable_current_modes

    on_device = torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()
    with _disable_current_modes(), on_device:  # real tensors on x's device (its events too), not fake ones
        xr = torch.randn(tuple(x.shape), dtype=x.dtype, device=x.device)
        wr = torch.randn(tuple(w.shape), dtype=w.dtype, device=w.device) * w.shape[1] ** -0.5
        args = ([1], [pad], [1], False, [0], groups)
        if backward:
            go = torch.randn_like(aten.convolution.default(xr, wr, None, *args))
            mask = [True, True, False]
            return timer(lambda: aten.convolution_backward.default(go, xr, wr, None, *args, mask),
                         lambda: backward_by_taps(go, xr, wr, None, *args, mask))
        return timer(lambda: aten.convolution.default(xr, wr, None, *args), lambda: conv_by_taps(xr, wr, pad, groups))


@attrs.define(eq=False)
class TapsChoice:
    """Which form a 1-d convolution takes: the handler the joint graph's
    convolution decompositions are bound to.  A long grouped conv1d goes aten's
    way or by taps: it times both forms with `timer` on a device whose type is in
    `devices` (elsewhere aten's is kept, untimed), once a shape, and keeps each
    answer in `answers`: (x's and w's sizes, padding, groups, dtype, device,
    backward) -> by taps.  Another one, on a device in `rows_2d`, goes as a 2-d
    convolution of one row (conv1d_as_2d)."""

    timer: Timer = time_on_device
    devices: tuple[str, ...] = ("cuda",)
    answers: dict[tuple[Any, ...], bool] = attrs.field(factory=dict)
    # on these devices every other 1-d convolution (not transposed) is traced as the
    # 2-d convolution of one row it is (conv1d_as_2d), so that passes/layout.py runs
    # it channels-last like any 2-d one.  The CPU: Wav2Vec2's inference at the CPU
    # size, one thread, 3.39 -> 2.99 ms (Inductor 3.35; the models suite's ratio 0.95
    # -> 0.89, bench/results/cpu-models-s57-conv1d.md), its training step and
    # Whisper's encoder unchanged.  CUDA: PyTorch's conv1d makes its input contiguous
    # and cuDNN converts it to NHWC and back around each call (Wav2Vec2's feature
    # encoder at the small size on an H100: 631 of 1610 µs); as 2-d channels-last
    # convolutions, Wav2Vec2's small inference took 2580 µs of GPU time a call
    # against 3148 (Inductor 3142), its training step 6436 against 6675, Whisper's
    # encoder's inference 288 against 324 (H100, bfloat16, session 58:
    # bench/probes/conv1d_layouts.py)
    rows_2d: tuple[str, ...] = ("cpu", "cuda")

    def cache_key(self) -> str:
        """What of this handler decides the graphs it traces, for the caches that keep
        them (graph_cache.dynamo_key, aot_cache.key_tag): its devices, rows_2d and
        timer, so that a handler bound otherwise never loads another's graphs.  Its
        timed answers are not in it: a cached graph keeps the choice measured when it
        was compiled, as an autotuner's cache keeps its configs."""
        timer = f"{getattr(self.timer, '__module__', '?')}.{getattr(self.timer, '__qualname__', repr(self.timer))}"
        return f"taps devices={self.devices} rows_2d={self.rows_2d} timer={timer}"

    def taken(self, x: torch.Tensor, w: torch.Tensor, pad: int, groups: int, backward: bool) -> bool:
        """Whether the convolution (or, with `backward`, its input's and weight's
        gradients) by taps is faster on x's device than aten's, timed on random
        tensors of x's and w's sizes, outside the trace (cuDNN's choice of kernel
        is erratic: the module's docstring).  The taps are timed run eagerly,
        unfused, which coil's kernels only improve on.  Logged with both times; a
        timing that fails (out of memory...) keeps aten's, with a warning."""
        if x.device.type not in self.devices:
            return False
        key = (tuple(x.shape), tuple(w.shape), pad, groups, x.dtype, str(x.device), backward)
        if key in self.answers:
            return self.answers[key]
        try:
            whole_ms, taps_ms = _time_both(x, w, pad, groups, backward, self.timer)
        except Exception as e:  # noqa: BLE001 - the convolution stays aten's
            log.warning("coil: grouped conv1d %s x %s: timing it by taps failed (%s: %s); aten's convolution kept",
                        tuple(x.shape), tuple(w.shape), type(e).__name__, e)
            self.answers[key] = False
            return False
        took = taps_ms < whole_ms
        self.answers[key] = took
        log.info("coil: grouped conv1d %s x %s (groups %d)%s: aten's %.3f ms, by taps %.3f ms: %s", tuple(x.shape),
                 tuple(w.shape), groups, " backward" if backward else "", whole_ms, taps_ms,
                 "by taps" if took else "aten's")
        return took

    def convolution(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: Any, padding: Any,
                    dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Any:
        """The joint graph's aten.convolution: by taps where it is a long grouped
        conv1d that measures faster; another 1-d one (not transposed) on a device
        in `rows_2d` as a 2-d convolution of one row; else whole (NotImplemented)."""
        if (long_grouped(x, w, stride, padding, dilation, transposed, output_padding, groups)
                and self.taken(x, w, padding[0], groups, backward=False)):
            return by_taps(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
        if x.dim() == 3 and w.dim() == 3 and not transposed and x.device.type in self.rows_2d:
            return conv1d_as_2d(x, w, bias, stride, padding, dilation, output_padding, groups)
        return NotImplemented

    def convolution_backward(self, grad_out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias_sizes: Any,
                             stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                             groups: int, output_mask: Sequence[bool]) -> Any:
        """The joint graph's aten.convolution_backward: by taps where it measures
        faster, else NotImplemented (the caller's other rules)."""
        if (not long_grouped(x, w, stride, padding, dilation, transposed, output_padding, groups)
                or not self.taken(x, w, padding[0], groups, backward=True)):
            return NotImplemented
        return backward_by_taps(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                                groups, output_mask)


