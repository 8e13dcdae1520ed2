"""max_pool2d_with_indices and its backward lower to Pointwise nodes with the
window unrolled (passes/lowerings/pooling.py, issue 15) instead of Externs.

The cases (kernel, stride, padding, dilation, ceil_mode) run as one graph
against eager on the reference, cpp and triton targets (the interpreter): in
float32 values, indices and gradients are eager's bit for bit, with ties, NaNs
and windows of -inf in the input; bfloat16 sums gradients in float32.  Then:
a window past MAX_WINDOW stays an Extern; a ResNet stem (conv -> batch norm ->
relu -> max pool) trains through torch.compile with neither pooling op left an
Extern (on a GPU saving int8 window offsets, Inductor's low-memory prims, rather than
int64 indices); values, indices and what reads them are one kernel."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

import torch._inductor.inductor_prims  # noqa: F401  (defines prims._low_memory_max_pool_*)

import coil
from coil.ir.fused import FusedSchedule
from coil.ir.printer import show
from coil.passes.lowerings.pooling import MAX_WINDOW
from tests_helpers import lowered, lowered_externs as externs, target_available

aten = torch.ops.aten
TARGETS = ["reference", "cpp", "triton"]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes

# (kernel, stride, padding, dilation, ceil_mode)
CASES: list[tuple[list[int], list[int], list[int], list[int], bool]] = [
    ([3, 3], [2, 2], [1, 1], [1, 1], False),   # ResNet's stem
    ([2, 2], [2, 2], [0, 0], [1, 1], False),   # no overlap
    ([3, 2], [2, 1], [1, 0], [1, 1], True),    # ceil_mode, unequal dims
    ([3, 3], [1, 1], [1, 1], [2, 2], False),   # dilation, stride 1: many windows per input
    ([2, 3], [3, 2], [1, 1], [1, 2], True),    # stride past the kernel: some inputs in no window
    ([1, 1], [1, 1], [0, 0], [1, 1], False),   # a copy
    ([3, 3], [], [0, 0], [1, 1], False),       # stride defaults to the kernel
]


def pools(x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    """x (2, 3, 7, 9); g (2, 3, 9, 9): each backward takes its output's corner."""
    outs = []
    for k, s, p, d, c in CASES:
        v, i = aten.max_pool2d_with_indices(x, k, s, p, d, c)
        grad = g[..., : v.shape[-2], : v.shape[-1]] * 1
        outs += [v, i, aten.max_pool2d_with_indices_backward(grad, x, k, s, p, d, c, i)]
    outs += list(aten.max_pool2d_with_indices(x[0], [2, 2], [1, 1]))  # unbatched
    return outs


def pool_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    x = torch.randn(2, 3, 7, 9)
    x[0, 0, 1:3, 1:4] = 1.0                   # ties: the first maximum wins
    x[0, 1, 2, 2:4] = float("nan")           # NaNs: the last one's index is kept
    x[1, 2, :3, :] = float("-inf")           # windows of -inf: their first position inside
    return [x.to(dtype), torch.randn(2, 3, 9, 9).to(dtype)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_max_pool_matches_eager_without_externs(dtype: torch.dtype, target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    inputs = pool_inputs(dtype)
    gm = make_fx(pools)(*inputs)
    g = lowered(gm, inputs, target)
    assert externs(g) == [], show(g)
    got = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    expected = pools(*inputs)
    assert len(got) == len(expected)
    for k, (g_, e) in enumerate(zip(got, expected)):
        assert g_.dtype == e.dtype and g_.shape == e.shape, (k, g_.dtype, e.dtype, g_.shape, e.shape)
        # bfloat16 gradients: summed in float32, where eager rounds each add (to a few
        # of bfloat16's roundings of addends near 2)
        exact = dtype == torch.float32 or k % 3 != 2 or k == len(expected) - 1
        tol: dict[str, Any] = {"rtol": 0, "atol": 0} if exact else {"rtol": 1.6e-2, "atol": 2e-2}
        torch.testing.assert_close(g_, e, **tol, equal_nan=True, msg=lambda m: f"output {k}: {m}")


def low_memory_pools(x: torch.Tensor) -> list[torch.Tensor]:
    """Inductor's low-memory prims over the same cases: values and int8 window offsets,
    and the indices computed back from the offsets."""
    prims = torch.ops.prims
    outs = []
    for k, s, p, d, c in CASES:
        s = s or k
        v, o = prims._low_memory_max_pool_with_offsets(x, k, s, p, d, c)
        outs += [v, o, prims._low_memory_max_pool_offsets_to_indices(o, k, x.shape[-2:], s, p, d)]
    return outs


@pytest.mark.parametrize("target", TARGETS)
def test_low_memory_prims_match_eager_without_externs(target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    x = pool_inputs(torch.float32)[0]
    gm = make_fx(low_memory_pools)(x)
    g = lowered(gm, [x], target)
    assert externs(g) == [], show(g)
    got = coil.compile_graph(gm, [x], coil.Options(target=target))(x)
    expected = low_memory_pools(x)
    # the prims' indices are max_pool2d_with_indices' (the decomposition's premise)
    for n, (k, s, p, d, c) in enumerate(CASES):
        torch.testing.assert_close(expected[3 * n + 2], aten.max_pool2d_with_indices(x, k, s, p, d, c)[1], rtol=0, atol=0)
    for k, (g_, e) in enumerate(zip(got, expected)):
        assert g_.dtype == e.dtype and g_.shape == e.shape, (k, g_.dtype, e.dtype, g_.shape, e.shape)
        torch.testing.assert_close(g_, e, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"output {k}: {m}")


def offset_backwards(x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    """Each case's backward reading indices computed from the low-memory offsets, as
    a training step's backward graph does."""
    prims = torch.ops.prims
    outs = []
    for k, s, p, d, c in CASES:
        s = s or k
        v, o = prims._low_memory_max_pool_with_offsets(x, k, s, p, d, c)
        i = prims._low_memory_max_pool_offsets_to_indices(o, k, x.shape[-2:], s, p, d)
        grad = g[..., : v.shape[-2], : v.shape[-1]] * 1
        outs.append(aten.max_pool2d_with_indices_backward(grad, x, k, s, p, d, c, i))
    return outs


@pytest.mark.parametrize("target", TARGETS)
def test_the_backward_compares_offsets(target: str) -> None:
    """max_pool2d_with_indices_backward over indices made from offsets reads the
    offsets, compared with each input position's place in the candidate's window
    (dilated windows: only where the dilation steps onto it); gradients are eager's
    bit for bit in float32."""
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    inputs = pool_inputs(torch.float32)
    gm = make_fx(offset_backwards)(*inputs)
    g = lowered(gm, inputs, target)
    assert externs(g) == [], show(g)
    text = show(g)
    backwards = [line for line in text.splitlines() if "max_pool2d_with_indices_backward" in line and "Pointwise[" in line]
    assert len(backwards) == len(CASES), text
    # no backward loads an index made from an offset: each loads the offsets
    assert "= load _low_memory_max_pool_offsets_to_indices" not in text, text
    assert text.count("= load _low_memory_max_pool_with_offsets") >= len(CASES), text
    realized = coil.default_pipeline().run(gm, inputs, until="realize", options=coil.Options(target=target))
    assert not any("offsets_to_indices" in b.name for b in realized.buffers), show(realized)
    got = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    for n, (g_, e) in enumerate(zip(got, offset_backwards(*inputs))):
        torch.testing.assert_close(g_, e, rtol=0, atol=0, msg=lambda m: f"case {CASES[n]}: {m}")


def test_a_window_past_the_limit_stays_extern() -> None:
    x = torch.randn(1, 2, 8, 8)
    side = int(MAX_WINDOW ** 0.5)
    for k, want in ((side, []), (side + 1, ["aten.max_pool2d_with_indices.default"])):
        gm = make_fx(lambda x: aten.max_pool2d_with_indices(x, [k, k], [1, 1]))(x)
        assert externs(lowered(gm, [x])) == want


class Stem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.bn(self.conv(x)))) * 2


@pytest.mark.parametrize("target", TARGETS)
def test_pool_values_indices_and_reader_are_one_kernel(target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    # a full-size shift (a bias of shape (3, 1, 1) is a trivial read on Triton, and
    # the relu is recomputed at each window position there: one kernel)
    inputs = [torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)]

    def fn(x: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        v, i = aten.max_pool2d_with_indices((x + b).relu(), [3, 3], [2, 2], [1, 1])
        return v * 2, i

    gm = make_fx(fn)(*inputs)
    fused = coil.default_pipeline().run(gm, inputs, until="fuse", options=coil.Options(target=target))
    assert isinstance(fused, FusedSchedule)
    # the relu is read at 9 window positions per output: realized (as Inductor would);
    # values, indices and the scale after them are one kernel
    assert len(fused.steps) == len(fused.kernels) == 2, show(fused)
    assert [len(k.nodes) for k in fused.kernels] == [1, 2], show(fused)
    assert "max_pool2d_with_indices_mul" in fused.kernels[1].name
    got = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    for g_, e in zip(got, fn(*inputs)):
        torch.testing.assert_close(g_, e, rtol=0, atol=0)
    # a per-channel bias: on Triton a trivial read, so the relu is no buffer and the
    # whole graph one kernel; the other targets count it and keep two
    inputs = [inputs[0], torch.randn(3, 1, 1)]
    gm = make_fx(fn)(*inputs)
    fused = coil.default_pipeline().run(gm, inputs, until="fuse", options=coil.Options(target=target))
    assert len(fused.kernels) == (1 if target == "triton" else 2), show(fused)
    got = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    for g_, e in zip(got, fn(*inputs)):
        torch.testing.assert_close(g_, e, rtol=0, atol=0)


def train_stem(target: str, device: str, tmp_path: Path) -> dict[str, str]:
    """One training step of Stem through torch.compile(backend="coil"), its output and
    gradients checked against eager; each graph's lowered text by its debug name."""
    torch.manual_seed(0)
    model = Stem().to(device)
    x = torch.randn(2, 3, 9, 9, device=device, requires_grad=True)
    leaves = [x, *model.parameters()]
    expected = model(x)
    expected.square().sum().backward()
    want = [t.grad.clone() for t in leaves]  # type: ignore[union-attr]
    for t in leaves:
        t.grad = None
    options = {"target": target, "debug_dir": str(tmp_path / "debug"), "cache_dir": str(tmp_path / "cache"),
               "graph_cache": False}
    torch._dynamo.reset()
    got = torch.compile(model, backend="coil", options=options)(x)
    torch.testing.assert_close(got, expected)
    got.square().sum().backward()
    for t, w in zip(leaves, want):
        torch.testing.assert_close(t.grad, w, rtol=1e-4, atol=1e-4)
    texts = {p.name: (p / "00_lower.txt").read_text() for p in sorted((tmp_path / "debug").iterdir())
             if (p / "00_lower.txt").exists()}
    assert set(texts) == {"0_forward", "1_backward"}
    return texts


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_resnet_stem_training(target: str, tmp_path: Path) -> None:
    texts = train_stem(target, "cpu", tmp_path)
    # on the CPU the step saves int64 indices (low_memory_max_pool declines there)
    assert "(max_pool2d_with_indices):" in texts["0_forward"]
    assert "(max_pool2d_with_indices_backward):" in texts["1_backward"]
    saved = [line for line in texts["1_backward"].splitlines() if "= Input(" in line]
    assert len([line for line in saved if "int64[2, 4, 5, 5]" in line]) == 1, saved
    for text in texts.values():
        assert "Extern aten.max_pool2d" not in text, text


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resnet_stem_training_on_a_gpu_saves_offsets(tmp_path: Path) -> None:
    """On a GPU the joint graph's max pool is Inductor's low-memory prims: the step
    saves int8 window offsets, and the backward compares them in its own kernel,
    rebuilding no index; the gradients are eager's."""
    texts = train_stem("triton", "cuda", tmp_path)
    forward, backward = texts["0_forward"], texts["1_backward"]
    assert "(_low_memory_max_pool_with_offsets):" in forward
    saved = [line for line in backward.splitlines() if "= Input(" in line]
    assert not [line for line in saved if "int64" in line], saved
    assert len([line for line in saved if "int8[2, 4, 5, 5]" in line]) == 1, saved
    realized = (tmp_path / "debug" / "1_backward" / "realize_table.txt").read_text()
    assert re.search(r"_low_memory_max_pool_offsets_to_indices +Pointwise +no +- +dead", realized), realized


def test_the_decomposition_declines_on_the_cpu() -> None:
    """low_memory_max_pool: the prims for a tensor off the CPU (a meta tensor stands
    in for a GPU's), NotImplemented on the CPU, past MAX_WINDOW or for integers."""
    from coil.passes.lowerings.decompositions import low_memory_max_pool

    values, indices = low_memory_max_pool(torch.empty(2, 3, 9, 9, device="meta"), [3, 3], [2, 2], [1, 1])
    assert values.shape == indices.shape == (2, 3, 5, 5) and indices.dtype == torch.int64
    assert low_memory_max_pool(torch.randn(2, 3, 9, 9), [3, 3], [2, 2], [1, 1]) is NotImplemented
    assert low_memory_max_pool(torch.empty(1, 2, 8, 8, device="meta"), [6, 6]) is NotImplemented
    assert low_memory_max_pool(torch.empty(1, 2, 8, 8, device="meta", dtype=torch.int32), [2, 2]) is NotImplemented
