"""passes/layout.py: the channels-last decision around 2-d convolutions.

The decision is pinned where it is made, in the printed LoweredGraph (golden
text), and checked against eager by running the C++ target: results, and the
strides of the graph's outputs, equal eager's."""

from __future__ import annotations

import os
import re
import pytest
import torch
import torch.nn.functional as F
from golden_util import assert_golden
from tests_helpers import target_available
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.ir.expr import loads
from coil.ir.lowered import Extern, Input, LoweredGraph, Pointwise, View
from coil.ir.printer import show
from coil.passes.layout import channels_last_strides, prefer_channels_last


def _block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A MobileNet-like block: pad, conv, per-channel scale, relu6, depthwise conv,
    a residual add, then a global pool (the graph's output is rank 2)."""
    y = F.conv2d(F.pad(x, (0, 1, 0, 1)), w1, stride=1)
    y = (y * scale.view(1, -1, 1, 1)).clamp(0, 6)
    z = F.conv2d(y, w2, padding=1, groups=w2.shape[0]) + y
    return z.mean(dim=(2, 3))


def _block_inputs() -> list[torch.Tensor]:
    return [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 2, 2), torch.randn(4, 1, 3, 3), torch.rand(4) + 0.5]


def _lower(fn, inputs: list[torch.Tensor], **options: object) -> LoweredGraph:
    gm = make_fx(fn)(*inputs)
    out = coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target="cpp", **options))
    assert isinstance(out, LoweredGraph)
    return out


def test_block_lowers_channels_last_golden() -> None:
    """The cpp target's trait turns it on: the pad and the pointwise chain compute
    over (N, H, W, C) under `__cl` names, each with a View under its own name, and
    each convolution's layout is channels-last."""
    g = _lower(_block, _block_inputs())
    assert_golden("layout_channels_last_lower.txt", show(g))
    convs = [n for n in g.nodes if isinstance(n, Extern) and n.kernel == "aten.convolution.default"]
    assert len(convs) == 2
    for c in convs:
        assert c.layout is not None and c.layout.stride == channels_last_strides(c.layout.size)
    pad = g.node("constant_pad_nd__cl")
    assert isinstance(pad, Pointwise) and pad.ranges == (2, 7, 7, 3)
    assert isinstance(g.node("constant_pad_nd"), View)


def test_realize_hands_convolutions_channels_last_aliases() -> None:
    """After realize, every convolution reads an alias with channels-last strides of
    a buffer laid out (N, H, W, C); the output keeps eager's strides."""
    inputs = _block_inputs()
    gm = make_fx(_block)(*inputs)
    bg = coil.default_pipeline().run(gm, inputs, until="realize", options=coil.Options(target="cpp"))
    by_name = {b.name: b for b in bg.buffers}
    convs = [b for b in bg.buffers if getattr(b, "kernel", "") == "aten.convolution.default"]
    assert len(convs) == 2
    for c in convs:
        x = by_name[c.args[0].name]
        assert x.rule == "extern_input_view"
        assert x.layout.stride == channels_last_strides(x.layout.size)
        assert c.layout.stride == channels_last_strides(c.layout.size)
    (out,) = bg.outputs
    assert by_name[out].layout.stride == (4, 1)


def test_convolution_of_a_graph_input_reads_a_channels_last_copy() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w).relu().amax(dim=(2, 3))

    g = _lower(fn, [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)])
    copy, view = g.node("convolution__cl_in0"), g.node("convolution__cl_in0_view")
    assert isinstance(copy, Pointwise) and copy.ranges == (2, 6, 6, 3)
    assert isinstance(view, View) and view.base == copy.name
    conv = g.node("convolution")
    assert isinstance(conv, Extern) and conv.args[0].name == view.name


def test_a_permute_to_channels_innermost_ends_the_region() -> None:
    """ConvNeXt's block: its layer norm runs on a (N, H, W, C) permute of the
    convolution's result, a tensor already laid out channels innermost, so it is
    not permuted again; the residual add, which reads the convolution channel by
    channel, is."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, w, padding=1)
        z = F.layer_norm(y.permute(0, 2, 3, 1), (4,)).permute(0, 3, 1, 2)
        return (z + y).amax(dim=(2, 3))

    g = _lower(fn, [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)])
    rewritten = {n.op for n in g.nodes if n.name.endswith("__cl")}
    assert "add" in rewritten
    assert not any(n.name.endswith("__cl") and n.origin.startswith("native_layer_norm") for n in g.nodes
                   if isinstance(n, Pointwise))


def test_trait_off_leaves_the_graph() -> None:
    """Off (the option, or a target whose trait is off) the pass is the identity."""
    inputs = _block_inputs()
    off = _lower(_block, inputs, channels_last="off")
    assert not any(n.name.endswith("__cl") for n in off.nodes)
    assert prefer_channels_last(off, coil.Options(target="reference")) is off
    assert prefer_channels_last(off, coil.Options(target="triton", channels_last="off")) is off
    assert prefer_channels_last(off, coil.Options(target="triton")) != off
    assert prefer_channels_last(off, coil.Options(target="cpp")) != off


def test_graph_returning_rank4_activations_is_left_alone() -> None:
    """A graph that returns a rank-4 tensor of the convolutions' region (as a
    training forward returns its saved activations) stays contiguous: each such
    output would cost a copy into eager's strides."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.conv2d(x, w).relu()
        return y, y.sum()

    g = _lower(fn, [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)])
    assert not any(n.name.endswith("__cl") for n in g.nodes)


@pytest.mark.skipif(not target_available("cpp"), reason="no C++ compiler")
def test_block_matches_eager_on_cpp() -> None:
    inputs = _block_inputs()
    gm = make_fx(_block)(*inputs)
    compiled = coil.compile_graph(gm, inputs, options=coil.Options(target="cpp"))
    (got,) = compiled(*inputs)
    want = _block(*inputs)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


class _ConvNet(torch.nn.Module):
    """Conv, batch norm, relu, a strided depthwise conv, a 1x1 conv with a residual,
    max pooling, and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.pw = torch.nn.Conv2d(8, 8, 1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.stem(x)))
        y = F.relu6(self.dw(y))
        y = self.pw(y) + y
        y = F.max_pool2d(y, 2)
        return self.head(y.flatten(2).mean(-1))


@pytest.mark.skipif(not target_available("cpp"), reason="no C++ compiler")
def test_conv_net_through_torch_compile_matches_eager() -> None:
    """Inference (channels-last inside) and a training step (forward and backward
    through AOTAutograd) against eager."""
    torch.manual_seed(0)
    model = _ConvNet()
    x = torch.randn(2, 3, 16, 16)
    opts = {"target": "cpp", "eager_fallback": False, "graph_cache": False}
    model.eval()
    compiled = torch.compile(model, backend="coil", options=opts)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    model.train()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="coil", options=opts)
    ref = {}
    loss = model(x).square().sum()
    loss.backward()
    for n, p in model.named_parameters():
        ref[n] = p.grad.clone()
        p.grad = None
    got_loss = compiled(x).square().sum()
    got_loss.backward()
    torch.testing.assert_close(got_loss, loss)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], msg=n)


def test_free_output_strides_let_a_forward_save_channels_last() -> None:
    """A training forward whose saved activations are coil's to lay out
    (Options.free_output_strides, which the torch.compile backend sets for them)
    computes them channels-last and hands them out so: no copy back to eager's."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = F.conv2d(x, w).relu()
        return y.sum(), y

    inputs = [torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)]
    g = _lower(fn, inputs, free_output_strides=(1,))
    assert any(n.name.endswith("__cl") for n in g.nodes)
    assert g.output_strides[1] is None
    if target_available("cpp"):
        gm = make_fx(fn)(*inputs)
        compiled = coil.compile_graph(gm, inputs, options=coil.Options(target="cpp", free_output_strides=(1,)))
        total, y = compiled(*inputs)
        torch.testing.assert_close(y, fn(*inputs)[1])
        assert y.stride() == channels_last_strides(tuple(y.shape))


def _trained_graphs(target: str) -> dict[str, object]:
    """One training step of _ConvNet through torch.compile on `target`: the
    gradients checked against eager's, and coil's compiled graphs by kind."""
    torch.manual_seed(0)
    model = _ConvNet()
    x = torch.randn(2, 3, 16, 16)
    compiled_graphs: list[tuple[str, object]] = []
    real = coil.compile_graph

    def spy(*a: object, **k: object) -> object:
        out = real(*a, **k)  # type: ignore[arg-type]
        compiled_graphs.append((str(k.get("kind")), out))
        return out

    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coil, "compile_graph", spy)
        compiled = torch.compile(model, backend="coil",
                                 options={"target": target, "eager_fallback": False, "graph_cache": False})
        got = compiled(x).square().sum()
        got.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    want = model(x).square().sum()
    want.backward()
    torch.testing.assert_close(got, want)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, msg=n)
    return dict(compiled_graphs)


def _channels_last_inputs(compiled: object) -> list[object]:
    return [lay for lay in compiled.input_layouts  # type: ignore[attr-defined]
            if len(lay.size) == 4 and lay.size[1] > 1 and lay.stride == channels_last_strides(lay.size)]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors on triton need TRITON_INTERPRET=1")
def test_training_step_saves_channels_last_and_the_backward_reads_it() -> None:
    """Through torch.compile, on a target that trains channels-last (Triton's
    trait; run here by the interpreter): the forward reports its outputs' strides
    to AOTAutograd (channels-last saved activations), the backward graph is
    compiled for them, its convolution_backward reads a channels-last gradient,
    and the gradients equal eager's."""
    graphs = _trained_graphs("triton")
    backward = graphs["backward"]
    assert _channels_last_inputs(backward), "the backward got no channels-last saved activation"
    call = backward.source[backward.source.index("def call"):]  # type: ignore[attr-defined]
    conv = next(line for line in call.splitlines() if "= aten_convolution_backward_default(" in line)
    grad = conv.split("(")[1].split(",")[0].strip()
    view = next(line for line in call.splitlines() if line.strip().startswith(f"{grad} = reinterpret_view("))
    size, stride = (tuple(int(v) for v in t.split(",")) for t in re.findall(r"\(([\d, ]+)\)", view)[:2])
    assert stride == channels_last_strides(size), view  # the gradient comes in channels-last strides
    # the stem's weight, saved as the channels-last copy its forward convolution read, is
    # what the backward's convolution_backward reads (aten converted the parameter inside
    # it each step before); the 1x1 and depthwise weights are channels-last already
    assert (8, 3, 3, 3) in [tuple(lay.size) for lay in _channels_last_inputs(backward)]
    forward = graphs["forward"]
    assert "channels_last" in forward.source  # type: ignore[attr-defined]


@pytest.mark.skipif(not target_available("cpp"), reason="no C++ compiler")
def test_cpp_training_stays_contiguous() -> None:
    """The C++ target computes convolutions channels-last in inference only (its
    channels_last_training trait is off: mkldnn's backward ran slower so): a
    training forward saves its activations in eager's strides."""
    graphs = _trained_graphs("cpp")
    assert not _channels_last_inputs(graphs["backward"])


def _conv_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A convolution with a bias, a GELU, then a global pool (rank-2 output)."""
    return F.gelu(F.conv2d(x, w, b, padding=1)).mean(dim=(2, 3))


def _conv_gelu_inputs() -> list[torch.Tensor]:
    return [torch.randn(2, 3, 8, 8), torch.randn(8, 3, 3, 3), torch.randn(8)]


def _lower_for(target: str, fn, inputs: list[torch.Tensor]) -> LoweredGraph:
    gm = make_fx(fn)(*inputs)
    out = coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target=target))
    assert isinstance(out, LoweredGraph)
    return out


def test_triton_peels_a_convolutions_bias_into_a_pointwise_add() -> None:
    """TargetTraits.conv_bias_in_kernels (triton): the convolution Extern runs with
    no bias and a pointwise node adds the bias viewed as (C, 1, 1); the C++ target
    (mkldnn adds it in the convolution) keeps the bias in the Extern."""
    g = _lower_for("triton", _conv_gelu, _conv_gelu_inputs())
    conv = next(n for n in g.nodes if isinstance(n, Extern) and n.kernel == "aten.convolution.default")
    assert conv.args[2] is None
    bias = [n for n in g.nodes if isinstance(n, Input)][2]
    column = next(n for n in g.nodes if isinstance(n, View) and n.base == bias.name)
    assert column.ranges == (8, 1, 1)
    adds = [n for n in g.nodes if isinstance(n, Pointwise) and {conv.name, column.name} <= {ld.name for ld in loads(n.body)}]
    assert len(adds) == 1 and getattr(adds[0].body, "name", None) == "add"
    g_cpp = _lower_for("cpp", _conv_gelu, _conv_gelu_inputs())
    conv_cpp = next(n for n in g_cpp.nodes if isinstance(n, Extern) and n.kernel == "aten.convolution.default")
    assert conv_cpp.args[2] is not None


@pytest.mark.skipif(not target_available("triton"), reason="needs triton (TRITON_INTERPRET=1 on the CPU)")
def test_peeled_bias_fuses_into_the_reader_and_matches_eager() -> None:
    """The bias add is no kernel of its own: one Triton kernel reads the
    convolution's result, adds the bias, takes the GELU and the mean; the result
    and the training step's gradients equal eager's."""
    torch.manual_seed(0)
    x, w, b = _conv_gelu_inputs()
    module = coil.compile_graph(make_fx(_conv_gelu)(x, w, b), [x, w, b], coil.Options(target="triton"))
    (out,) = module(x, w, b)
    torch.testing.assert_close(out, _conv_gelu(x, w, b))
    # a launch is `triton_...[grid](...)` in the interpreter, `launch_triton_...(stream, ...)` on CUDA
    wrapper = module.source[module.source.index("\ndef call("):]
    launches = re.findall(r"^\s*(?:launch_)?(triton_\w+)[\[(]", wrapper, re.M)
    # the input's and the weight's channels-last copies (launched at once, as one
    # combo), then one kernel for the rest
    combo = re.search(r"^def triton_combo_0\(.*?(?=^\S)", module.source, re.M | re.S)
    assert combo is not None and launches[0] == "triton_combo_0", launches
    assert re.findall(r"^\s+(triton_\w+)\(", combo.group(0), re.M) == [
        "triton_poi_fused_channels_last_0", "triton_poi_fused_channels_last_1"]
    assert len(launches) == 2, launches
    assert "convolution_gelu_mean" in launches[-1]
    assert "aten_convolution_default(buf2, buf3, None," in module.source
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    compiled = torch.compile(lambda t: F.gelu(conv(t)).sum(), backend="coil", options={"target": "triton"})
    xs = torch.randn(2, 3, 8, 8)
    compiled(xs).backward()
    got = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    F.gelu(conv(xs)).sum().backward()
    for a, e in zip(got, [p.grad for p in conv.parameters()]):
        torch.testing.assert_close(a, e)
