"""constant_pad_nd, cat, slice_scatter and select_scatter lower to one Pointwise
node each (passes/lowerings/regions.py), and cumsum of a short row to one
Reduction (passes/lowerings/scans.py), instead of an Extern call that splits
fusion (issue 15).

Each family runs as one graph of many cases (shapes, dims, negative pads, steps,
promotions, empty inputs) against eager on the reference, cpp and triton targets
(the interpreter) in float32, bfloat16, int64 and bool, with no Extern left for
the op.  Then: the wrapped index that keeps every load inside its buffer, over
drawn offsets, steps and sizes; the printed IR of a pad and a cat (golden); a
rotary embedding's cat fusing into one kernel with its neighbours; and, through
torch.compile, a MobileNet-like block (conv -> pad -> depthwise conv) and a
rotary embedding forward and backward (where slice_scatter appears), grads
compared with eager."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import attrs
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.backends.reference import gather
from coil.errors import CoilError
from coil.ir.bounds import load_in_bounds
from coil.ir.expr import IndirectLoad, Load, loads, walk, xsyms
from coil.ir.lowered import Pointwise, Reduction
from coil.ir.printer import show
from coil.passes.lowerings.regions import MAX_CAT_INPUTS
from coil.passes.lowerings.scans import SCAN_LIMIT
from golden_util import assert_golden
from tests_helpers import lowered, lowered_externs as externs, make, target_available

aten = torch.ops.aten
TARGETS = ["reference", "cpp", "triton"]
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes


def other_dtype(dtype: torch.dtype) -> torch.dtype:
    """A partner dtype that promotes with `dtype` to something else (or the same)."""
    return {torch.float32: torch.bfloat16, torch.bfloat16: torch.float32, torch.int64: torch.bool,
            torch.bool: torch.int64}[dtype]


# ---- the families: each a function of its inputs returning every case ------------------------


def pads(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """a (5,), b (3, 5), c (2, 3, 4), e (0, 3)."""
    return (
        aten.constant_pad_nd(a, [2, 3], 1.5),            # last dim, a fill value (1 for ints, True for bool)
        aten.constant_pad_nd(c, [1, 2, 0, 1, 2, 0]),     # every dim
        aten.constant_pad_nd(b, [-1, -2, -1, 0]),        # negative pads only: a crop
        aten.constant_pad_nd(b, [2, -3, -1, 2], -2),     # crop one side, pad the other
        aten.constant_pad_nd(b, [-2, 4]),                # the shift takes the whole input past the end
        aten.constant_pad_nd(b, [-3, -2]),               # down to nothing
        aten.constant_pad_nd(e, [1, 1, 2, 0], 3),        # from nothing: all fill
        aten.constant_pad_nd(c, []),                     # no pad: a copy
    )


def cats(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """a (2, 3), b (4, 3), c (2, 5); o (2, 3) of other_dtype(a.dtype)."""
    return (
        torch.cat([a, b], 0),
        torch.cat([a, c], -1),
        torch.cat([a, b, a], 0),                                        # three along dim 0
        torch.cat([c, a, c], -1),                                       # three along the last dim
        torch.cat([a.unsqueeze(1), c[:, :3].unsqueeze(1)], 1),          # a middle dim
        torch.cat([a, o], 0),                                           # promoted as eager does
        torch.cat([a, torch.empty(0, dtype=torch.int64), b], 0),        # a (0,) input: skipped, still promotes
        torch.cat([a, a[:, :0], c], 1),                                 # an input empty along dim
        torch.cat([o], 0),                                              # one input: a copy
        torch.cat([a.t(), b.t()], 1),                                   # transposed inputs
    )


def scatters(x: torch.Tensor, s: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x (6, 7), s (6, 2), w (2, 7), y (2, 3, 5)."""
    return (
        aten.slice_scatter(x, w, 0, 1, 3),                  # step 1 along dim 0
        aten.slice_scatter(x, s, 1, 1, 5, 2),               # step 2: positions 1, 3
        aten.slice_scatter(x, s, -1, -6, None, 3),          # negative start, step 3: positions 1, 4
        aten.slice_scatter(x, w, 0, None, None, 3),        # from the start, step 3 down dim 0: 0, 3
        aten.slice_scatter(x, x * 0 if x.dtype != torch.bool else ~x, 1),  # the whole tensor
        aten.slice_scatter(x, s[:, :0], 1, 3, 3),           # an empty slice: x itself
        aten.select_scatter(x, w[0, :], 0, 2),
        aten.select_scatter(y, y[..., 0], -1, -1),          # last dim, a negative index
        aten.select_scatter(y[:, :1], y[:, 0], 1, 0),       # a dim of size 1
    )


def cumsums(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x (4, 37), y (3, 5, 6), z (2, SCAN_LIMIT)."""
    return (
        torch.cumsum(x, -1),
        torch.cumsum(x, 0),                               # down the columns
        torch.cumsum(y, 1),                               # a middle dim
        torch.cumsum(y, 2, dtype=torch.float64),          # dtype= converts first
        torch.cumsum(x[:, :1], 1),                        # a row of one
        torch.cumsum(z, 1),                               # the longest row that is still a kernel
    )


FAMILIES: dict[str, tuple[Callable[..., Any], Callable[[torch.dtype], list[torch.Tensor]], tuple[Any, ...]]] = {
    "pad": (pads, lambda dt: [make((5,), dt), make((3, 5), dt), make((2, 3, 4), dt), make((0, 3), dt)],
            (aten.constant_pad_nd.default,)),
    "cat": (cats, lambda dt: [make((2, 3), dt), make((4, 3), dt), make((2, 5), dt), make((2, 3), other_dtype(dt))],
            (aten.cat.default,)),
    "scatter": (scatters, lambda dt: [make((6, 7), dt), make((6, 2), dt), make((2, 7), dt), make((2, 3, 5), dt)],
                (aten.slice_scatter.default, aten.select_scatter.default)),
    "cumsum": (cumsums, lambda dt: [make((4, 37), dt), make((3, 5, 6), dt), make((2, SCAN_LIMIT), dt)],
               (aten.cumsum.default,)),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_eager_without_externs(family: str, dtype: torch.dtype, target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    fn, make_inputs, ops = FAMILIES[family]
    inputs = make_inputs(dtype)
    gm = make_fx(fn)(*inputs)
    assert {n.target for n in gm.graph.nodes if n.op == "call_function"} >= set(ops)
    g = lowered(gm, inputs, target)
    assert externs(g) == [], show(g)
    made = {n.op for n in g.nodes if isinstance(n, (Pointwise, Reduction))}
    assert {op._opname for op in ops} <= made, show(g)
    compiled = coil.compile_graph(gm, inputs, coil.Options(target=target))
    expected = fn(*inputs)
    got = compiled(*inputs)
    assert len(got) == len(expected)
    for k, (g_, e) in enumerate(zip(got, expected)):
        assert g_.dtype == e.dtype and g_.shape == e.shape, (k, g_.dtype, e.dtype, g_.shape, e.shape)
        # a cumsum adds floats in another order than eager's left-to-right scan
        exact = family != "cumsum" or not e.dtype.is_floating_point
        tol: dict[str, Any] = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(g_, e, **tol, msg=lambda m: f"case {k} of {family}: {m}")


# ---- masked loads: each region reads its source only where it lies ---------------------------------


def region_loads(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> list[tuple[Load, bool, bool]]:
    """(load, proven in bounds with its mask, proven without it) for every load
    of every Pointwise the regions lower to."""
    g = lowered(gm, inputs)
    size = {n.name: tuple(n.size) for n in g.nodes if hasattr(n, "size")}
    out = []
    for n in g.nodes:
        if isinstance(n, Pointwise) and n.op in ("constant_pad_nd", "cat", "slice_scatter"):
            ranges = dict(zip(xsyms(len(n.ranges)), n.ranges))
            for ld in loads(n.body):
                bare = attrs.evolve(ld, mask=None)
                out.append((ld, load_in_bounds(ld, size[ld.name], ranges),
                            load_in_bounds(bare, size[ld.name], ranges)))
    return out


@settings(max_examples=60, deadline=None)
@given(lo=st.integers(-3, 4), hi=st.integers(-3, 4), n=st.integers(4, 7), k=st.integers(1, 4),
       start=st.integers(0, 6), step=st.integers(1, 3))
def test_region_loads_are_in_bounds_where_their_masks_hold(lo: int, hi: int, n: int, k: int, start: int,
                                                           step: int) -> None:
    """Every load of a pad, a cat and a slice_scatter is proven inside its
    source where its mask holds; a load whose index is shifted is masked, and
    without its mask the proof fails (the mask is what keeps it inside)."""
    x, a, b = torch.randn(3, n), torch.randn(3, k), torch.randn(3, 2)
    start = min(start, n - 1)
    width = len(range(start, n, step))
    src = torch.randn(3, width)

    def fn(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (aten.constant_pad_nd(x, [lo, hi], 0.5), torch.cat([a, x, b], 1),
                aten.slice_scatter(x, src, 1, start, None, step))

    inputs = [x, a, b, src]
    if n + lo + hi <= 0:
        return
    found = region_loads(make_fx(fn)(*inputs), inputs)
    assert found
    for ld, masked, bare in found:
        assert masked if ld.mask is not None else bare, ld


def test_the_rotary_cat_reads_each_half_under_its_mask() -> None:
    """cat((-x[..., 32:], x[..., :32])): two masked loads of x, at x3 + 32 where
    x3 < 32 and at x3 - 32 where x3 >= 32; neither is inside x unmasked."""
    inputs = [torch.randn(2, 3, 64), torch.randn(64), torch.randn(64)]
    bg = coil.default_pipeline().run(make_fx(rotary64)(*inputs), inputs, until="realize",
                                     options=coil.Options(target="reference"))
    (buf,) = bg.buffers
    ranges = dict(zip(xsyms(3), buf.ranges))
    shifted = []
    size = {i.name: i.layout.size for i in bg.inputs}
    for ld in loads(buf.body):
        assert load_in_bounds(ld, size[ld.name], ranges), ld
        if not load_in_bounds(attrs.evolve(ld, mask=None), size[ld.name], ranges):
            shifted.append(str(ld.index[-1]))
    assert sorted(shifted) == ["x2 + 32", "x2 - 32"], show(bg)


def test_the_reference_refuses_a_masked_load_that_leaves_its_buffer() -> None:
    """The oracle reads nothing where a mask is false and raises where a mask
    holds but the index is outside: the promise a masked load makes."""
    flat = torch.arange(4.0)
    mask = torch.tensor([True, False, True])
    got = gather(flat, torch.tensor([0, 9, 3]), mask, "x")
    assert got.tolist() == [0.0, 0.0, 3.0]
    with pytest.raises(CoilError, match="masked load of x leaves its buffer"):
        gather(flat, torch.tensor([0, 9, 4]), mask, "x")


def test_cat_of_many_inputs_stays_extern() -> None:
    """Each element of a pointwise cat tests and issues a masked load for every
    input: past MAX_CAT_INPUTS the aten call is kept (empty inputs do not count)."""
    few = [torch.randn(2, k + 1) for k in range(MAX_CAT_INPUTS)] + [torch.randn(2, 0)]
    gm = make_fx(lambda *xs: torch.cat(xs, 1))(*few)
    assert externs(lowered(gm, few)) == []
    many = few + [torch.randn(2, 3)]
    gm = make_fx(lambda *xs: torch.cat(xs, 1))(*many)
    assert externs(lowered(gm, many)) == ["aten.cat.default"]


def test_cumsum_past_the_limit_stays_extern_and_fuses_its_producer_below() -> None:
    """A long row keeps eager's linear scan; a short one is one kernel with the
    pointwise op that feeds it."""
    long_row = [torch.randn(2, SCAN_LIMIT + 1)]
    gm = make_fx(lambda x: torch.cumsum(x, -1))(*long_row)
    assert externs(lowered(gm, long_row)) == ["aten.cumsum.default"]
    short = [torch.randn(3, 40)]
    gm = make_fx(lambda x: torch.cumsum(x.exp() * 2, -1) + 1)(*short)
    fused = coil.default_pipeline().run(gm, short, until="fuse", options=coil.Options(target="reference"))
    assert [k.name for k in fused.kernels] == ["ref_per_fused_add_cumsum_exp_mul_0"], show(fused)


# ---- golden IR -----------------------------------------------------------------------------------


def pad_and_cat(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = aten.constant_pad_nd(x.relu(), [1, 2, -1, 0], 0.5)
    return torch.cat([p, y], 0)


@pytest.mark.parametrize("stage", ["lower", "realize"])
def test_pad_cat_golden(stage: str) -> None:
    inputs = [torch.randn(3, 4), torch.randn(2, 7)]
    ir = coil.default_pipeline().run(make_fx(pad_and_cat)(*inputs), inputs, until=stage,
                                     options=coil.Options(target="reference"))
    assert_golden(f"fusable_pad_cat_{stage}.txt", show(ir))


# ---- fusion: a rotary embedding is one kernel -----------------------------------------------------


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., 16:], x[..., :16]), -1) * cos + x * sin


@pytest.mark.parametrize("target", TARGETS)
def test_rotary_cat_fuses_into_one_kernel(target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    inputs = [torch.randn(2, 4, 8, 32), torch.randn(8, 32), torch.randn(8, 32)]
    gm = make_fx(rotary)(*inputs)
    assert aten.cat.default in {n.target for n in gm.graph.nodes}
    fused = coil.default_pipeline().run(gm, inputs, until="fuse", options=coil.Options(target=target))
    assert len(fused.kernels) == 1 and not externs(lowered(gm, inputs, target)), show(fused)
    assert "cat" in fused.kernels[0].name
    (got,) = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    torch.testing.assert_close(got, rotary(*inputs))


def rotary64(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """Llama's rotate_half, as the issue measured it on the H200."""
    return torch.cat((-x[..., 32:], x[..., :32]), -1) * sin + x * cos


def x_loads(source: str) -> list[str]:
    """The tl.load lines of the kernel that read in_ptr2 (x, the first input
    by name)."""
    return [ln.strip() for ln in source.splitlines() if "tl.load(in_ptr2 +" in ln]


def load_index(line: str) -> str:
    """The offset of `tmpN = tl.load(in_ptr2 + OFFSET, mask..., other=0)`."""
    offset = line.split("tl.load(in_ptr2 + ", 1)[1].split(", xmask", 1)[0]
    return offset[1:-1] if offset.startswith("(") and offset.endswith(")") else offset


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_rotary_with_masked_loads_matches_eager(target: str, transposed: bool) -> None:
    """x as the attention reshape leaves it (batch, heads, seq, dim), transposed
    from (batch, seq, heads, dim) or not."""
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    x = torch.randn(2, 8, 4, 64).transpose(1, 2) if transposed else torch.randn(2, 4, 8, 64)
    inputs = [x, torch.randn(8, 64), torch.randn(8, 64)]
    gm = make_fx(rotary64)(*inputs)
    compiled = coil.compile_graph(gm, inputs, coil.Options(target=target))
    (got,) = compiled(*inputs)
    torch.testing.assert_close(got, rotary64(*inputs), rtol=0, atol=0)
    if target != "triton":
        return
    loads_of_x = x_loads(compiled.source)
    assert len(loads_of_x) == 3, loads_of_x  # each half under its mask, and x itself
    plain = next(ln for ln in loads_of_x if ", xmask, other=0)" in ln)
    masked = [ln for ln in loads_of_x if ln != plain]
    # no wrapping: each half reads at x's own index, shifted by 32, under a mask of its own
    assert all(", xmask & tmp" in ln for ln in masked), loads_of_x
    assert sorted(load_index(ln) for ln in masked) == [f"{load_index(plain)} + 32", f"{load_index(plain)} - 32"], \
        loads_of_x
    if not transposed:
        assert all("%" not in ln for ln in loads_of_x), loads_of_x


def checked_regions(w: torch.Tensor, idx: torch.Tensor, y: torch.Tensor, n: torch.Tensor,
                    d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Producers with run-time checks inlined under a region's mask: an
    embedding's index, an integer division's divisor."""
    return (torch.cat([F.embedding(idx, w), y], -1), F.pad(n // d, (1, 2), value=7), torch.cat([y, y * 0 + 1], 0))


@pytest.mark.parametrize("target", TARGETS)
def test_checks_inlined_under_a_mask_run_only_where_it_holds(target: str) -> None:
    """Where the mask is false, the checks see position 0 and divisor 1, so they
    neither raise nor read, while an index out of range where the mask holds
    raises eager's error.  The embedding's index tensor lies inside its buffer
    wherever the cat's loops run: it is read unmasked, and its check reads it
    through where(mask, ., 0)."""
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    inputs = [torch.randn(10, 6), torch.randint(0, 10, (4, 3)), torch.randn(4, 3, 5),
              torch.randint(-50, 50, (3, 8)), torch.randint(1, 5, (3, 8))]
    gm = make_fx(checked_regions)(*inputs)
    bg = coil.default_pipeline().run(gm, inputs, until="realize", options=coil.Options(target=target))
    assert ("t2: int64 = load idx_1[x0, x1]\n    t3: int64 = where(t1, t2, 0)\n"
            "    t4: int64 = check(t3 in [0, 10), embedding dim 0)") in show(bg), show(bg)
    size = {i.name: i.layout.size for i in bg.inputs}
    for b in bg.buffers:
        ranges = dict(zip(xsyms(len(b.ranges)), b.ranges))
        reads = [e for e in walk(b.body) if isinstance(e, (Load, IndirectLoad))]
        assert any(isinstance(e, IndirectLoad) and e.mask is not None for e in reads) or b.name != "buf0"
        for ld in reads:
            assert load_in_bounds(ld, size[ld.name], ranges), (b.name, ld)
    compiled = coil.compile_graph(gm, inputs, coil.Options(target=target))
    for got, want in zip(compiled(*inputs), checked_regions(*inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    bad = list(inputs)
    bad[1] = inputs[1].clone()
    bad[1][2, 1] = 12
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled(*bad)


# ---- through torch.compile, forward and backward --------------------------------------------------


class MobileBlock(nn.Module):
    """conv 1x1 -> batch norm -> relu6 -> pad (TF 'SAME' for stride 2) -> depthwise
    3x3 stride 2 -> relu -> conv 1x1, as MobileNetV2's HF port pads."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(4, 8, 1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, groups=8)
        self.project = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.bn(self.expand(x)))
        y = F.pad(y, (0, 1, 0, 1))
        return self.project(torch.relu(self.dw(y)))


def lowered_texts(debug: Path) -> dict[str, str]:
    return {p.name: (p / "00_lower.txt").read_text() for p in sorted(debug.iterdir()) if (p / "00_lower.txt").exists()}


def run_training(model: Callable[..., torch.Tensor], args: list[torch.Tensor], params: list[torch.Tensor],
                 target: str, tmp_path: Path) -> dict[str, str]:
    """One forward and backward compiled and eager; outputs and every grad compared.
    Returns each graph's printed LoweredGraph."""
    leaves = [a for a in args if a.requires_grad] + params
    expected = model(*args)
    expected.square().sum().backward()
    want = [t.grad.clone() for t in leaves]  # type: ignore[union-attr]
    for t in leaves:
        t.grad = None
    options = {"target": target, "debug_dir": str(tmp_path / "debug"), "cache_dir": str(tmp_path / "cache"),
               "graph_cache": False}
    torch._dynamo.reset()
    got = torch.compile(model, backend="coil", options=options)(*args)
    torch.testing.assert_close(got, expected)
    got.square().sum().backward()
    for t, w in zip(leaves, want):
        torch.testing.assert_close(t.grad, w, rtol=1e-4, atol=1e-4)
    return lowered_texts(tmp_path / "debug")


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_mobilenet_block_training(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MobileBlock()
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    texts = run_training(model, [x], list(model.parameters()), target, tmp_path)
    assert set(texts) == {"0_forward", "1_backward"}
    assert "(constant_pad_nd):" in texts["0_forward"]
    for text in texts.values():
        assert "Extern aten.constant_pad_nd" not in text and "Extern aten.slice_scatter" not in text


@pytest.mark.parametrize("target", TARGETS)
def test_rotary_training_slice_scatter(target: str, tmp_path: Path) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    x = torch.randn(2, 4, 8, 32, requires_grad=True)
    cos, sin = torch.randn(8, 32, requires_grad=True), torch.randn(8, 32)
    texts = run_training(rotary, [x, cos, sin], [], target, tmp_path)
    assert set(texts) == {"0_forward", "1_backward"}
    # the backward of x[..., 16:] and x[..., :16]: slice_scatter into zeros, now a Pointwise
    assert "(slice_scatter):" in texts["1_backward"]
    assert "(cat):" in texts["0_forward"]
    assert not any("= Extern" in text for text in texts.values()), texts
