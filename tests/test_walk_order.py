"""realize.walk_orders: a pointwise buffer laid out in an order other than its
logical one (channels-last, a transpose a pointwise op keeps from its input) is
walked by its pointwise kernel in memory order (kernel_model.walk_dims), so its
store, and the loads of inputs laid out as it is, step by one element.

The decision is pinned where it is made, in the printed BufferGraph (golden
text); its effect in the kernel programs (Triton's store offset, the C++ nest's
innermost loop, no streamed stores in runs too short to fence); and numerics and
output strides against eager on every target, with the option on and off."""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest
import sympy
import torch
import torch.nn.functional as F
from golden_util import assert_golden
from tests_helpers import run_until, target_available, trace

import coil
from coil.ir.buffers import BufferGraph, ComputedBuffer
from coil.ir.kernel import XINDEX, KernelProgram
from coil.ir.printer import show
from coil.passes.kernel_model import walk_dims
from coil.passes.schedule.nest import loop_symbol


def _bias_relu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2 + b.view(1, -1, 1, 1))


def _taps(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A depthwise 3x3 convolution written as shifted slices of a padded input:
    masked loads in both spatial dims."""
    xp = F.pad(x, (1, 1, 1, 1))
    h, v = x.shape[-2:]
    out = torch.zeros_like(x)
    for i in range(3):
        for j in range(3):
            out = out + xp[:, :, i:i + h, j:j + v] * w[:, 0, i, j].view(1, -1, 1, 1)
    return out


def _scaled_and_pooled(x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A channels-last pointwise output that a reduction also reads (inside the
    reduction's kernel it walks the rows' order, not its memory order)."""
    y = torch.sigmoid(x) * b.view(1, -1, 1, 1)
    return y, y.mean(dim=(2, 3))


def _transposed(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return a.t() * 3 + c  # eager keeps a.t()'s strides: (1, rows)


def _cl(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(memory_format=torch.channels_last)


CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]]]] = {
    "bias_relu": (_bias_relu, lambda: [_cl(2, 16, 5, 6), torch.randn(16)]),
    "taps": (_taps, lambda: [_cl(2, 8, 6, 5), torch.randn(8, 1, 3, 3)]),
    "scaled_and_pooled": (_scaled_and_pooled, lambda: [_cl(2, 8, 4, 4), torch.randn(8)]),
    "transposed": (_transposed, lambda: [torch.randn(12, 7), torch.randn(7, 1)]),
}


def _buffers(name: str, **options: Any) -> BufferGraph:
    fn, inputs = CASES[name]
    g = run_until(fn, inputs(), "realize", target="triton", **options)
    assert isinstance(g, BufferGraph)
    return g


def _program(fn: Callable[..., Any], inputs: list[torch.Tensor], target: str, **options: Any) -> KernelProgram:
    kp = run_until(fn, inputs, "schedule_kernels", target=target, **options)
    assert isinstance(kp, KernelProgram)
    return kp


def test_channels_last_pointwise_walks_its_memory_order_golden() -> None:
    """The buffer's walk order is (N, H, W, C): its layout's, outermost first."""
    assert_golden("realize_walk_order.txt", show(_buffers("bias_relu")))


def test_walk_orders_follow_the_layout_and_the_option() -> None:
    (b,) = [b for b in _buffers("bias_relu").buffers if isinstance(b, ComputedBuffer)]
    assert b.walk_order == (0, 2, 3, 1)
    assert walk_dims(b, (2 * 16 * 5 * 6, 1)) == (0, 2, 3, 1)
    # a reduction kernel's rows keep their own order: the walk order is for pointwise kernels
    assert walk_dims(b, (2 * 16, 5 * 6)) == (0, 1, 2, 3)
    (t,) = [b for b in _buffers("transposed").buffers if isinstance(b, ComputedBuffer)]
    assert t.layout.stride == (1, 7) and t.walk_order == (1, 0)
    # logical order where it is the memory order; none with the option off
    same = run_until(lambda a: a * 2, [torch.randn(3, 4)], "realize", target="triton")
    assert all(not b.walk_order for b in same.buffers if isinstance(b, ComputedBuffer))
    off = _buffers("bias_relu", walk_orders="off")
    assert all(not b.walk_order for b in off.buffers if isinstance(b, ComputedBuffer))
    assert not coil.Options(target="reference").walks_memory_order()
    assert coil.Options(target="cpp").walks_memory_order() and coil.Options(target="triton").walks_memory_order()


def test_a_channels_last_kernel_stores_along_memory_on_triton() -> None:
    """Walked in memory order the store is at xindex; walked logically (the option
    off) neighbouring lanes stored a channel's stride apart."""
    fn, inputs = CASES["bias_relu"]
    (k,) = _program(fn, inputs(), "triton").specs
    (node,) = [n for n in k.nodes if n.store is not None]
    assert node.store == XINDEX
    (old,) = _program(fn, inputs(), "triton", walk_orders="off").specs
    (was,) = [n for n in old.nodes if n.store is not None]
    assert sympy.expand(was.store.xreplace({XINDEX: 1}) - was.store.xreplace({XINDEX: 0})) == 16


def test_the_cpp_nest_runs_the_channels_innermost_and_streams_no_short_runs() -> None:
    """On the C++ target the innermost loop is the 64 channels, whose store steps by
    one.  The output (8 x 64 x 56 x 56 float32, 6.4 MB) is large enough to stream,
    but a run of 64 channels is 256 bytes, each fenced: it is not streamed."""
    fn = _bias_relu
    (k,) = _program(fn, [_cl(8, 64, 56, 56), torch.randn(64)], "cpp").specs
    assert k.nest is not None and k.nest.xsizes[-1] == 64
    (node,) = [n for n in k.nest.nodes if n.store is not None]
    inner = loop_symbol("ix", len(k.nest.xsizes) - 1)
    assert sympy.expand(node.store.xreplace({inner: 1}) - node.store.xreplace({inner: 0})) == 1
    assert k.streams is None
    # logically walked, the innermost loop ran the image's 56 x 56 positions 64 elements apart
    (old,) = _program(fn, [_cl(8, 64, 56, 56), torch.randn(64)], "cpp", walk_orders="off").specs
    assert old.nest is not None and old.nest.xsizes[-1] == 56 * 56


TARGETS = [
    pytest.param("reference"),
    pytest.param("cpp", marks=pytest.mark.skipif(not target_available("cpp"), reason="no C++ compiler")),
    pytest.param("triton", marks=pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") != "1" or not target_available("triton"),
        reason="CPU tensors on triton need TRITON_INTERPRET=1")),
]


@pytest.mark.parametrize("walk", ["auto", "off"])
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_walked_kernels_match_eager(name: str, target: str, walk: str) -> None:
    fn, inputs = CASES[name]
    args = inputs()
    compiled = coil.compile_graph(trace(fn, *args), list(args),
                                  coil.Options(target=target, graph_cache=False, walk_orders=walk))
    got, want = compiled(*args), fn(*args)
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_walked_kernels_match_eager_on_cuda() -> None:
    """Compiled Triton kernels, bfloat16 and float32, channels-last and transposed,
    against the graph run in float64 on the same inputs (eager's bfloat16 rounds
    each of the taps' nine products and sums; coil's kernel sums in float32 and
    rounds once), with eager's strides."""
    for name in sorted(CASES):
        fn, inputs = CASES[name]
        for dtype in (torch.float32, torch.bfloat16):
            args = [a.to("cuda", dtype) for a in inputs()]
            compiled = coil.compile_graph(trace(fn, *args), list(args), coil.Options(target="triton",
                                                                                       graph_cache=False))
            got, want, exact = compiled(*args), fn(*args), fn(*[a.double() for a in args])
            got = got if isinstance(got, (tuple, list)) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            exact = exact if isinstance(exact, tuple) else (exact,)
            for g, w, e in zip(got, want, exact):
                torch.testing.assert_close(g.double(), e, atol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                                           rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)
                assert g.stride() == w.stride()
