"""The host path of output_code.py's calls.  Externs (backends/runtime.py,
`aten_op`): a default overload in DIRECT_BINDINGS through torch's own function
(unboxed, 3.5 µs less a convolution), every other overload through its C++ entry
point; the function must call that very overload with the arguments the wrapper
passes.  Views (passes/wrap.py, `views_as_base`): in a channels-last conv net the
in-place results and the convolutions' inputs are their base's tensors, no view
made on each call."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import coil
from coil.backends.runtime import DIRECT_BINDINGS, aten_op
from tests_helpers import target_available

aten = torch.ops.aten


def _samples() -> dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """For each bound operator: its default overload and arguments spelled as
    wrap spells an ExternCall's (schema order, keyword-only ones by name)."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    return {
        "aten::convolution": (aten.convolution.default,
                              (r(2, 4, 9, 9), r(6, 2, 3, 3), r(6), [2, 1], [1, 0], [1, 2], False, [0, 0], 2), {}),
        "aten::mm": (aten.mm.default, (r(3, 5), r(5, 4)), {}),
        "aten::addmm": (aten.addmm.default, (r(4), r(3, 5), r(5, 4)), {"beta": 0.5, "alpha": 2.0}),
        "aten::bmm": (aten.bmm.default, (r(2, 3, 5), r(2, 5, 4)), {}),
        "aten::baddbmm": (aten.baddbmm.default, (r(2, 3, 4), r(2, 3, 5), r(2, 5, 4)), {"beta": 0.25, "alpha": 3.0}),
    }


class _Seen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_every_direct_binding_has_a_sample() -> None:
    assert set(_samples()) == set(DIRECT_BINDINGS)


@pytest.mark.parametrize("name", sorted(DIRECT_BINDINGS))
def test_a_direct_binding_calls_its_overload_with_the_wrappers_arguments(name: str) -> None:
    overload, args, kwargs = _samples()[name]
    fn = aten_op(overload)
    assert fn is getattr(torch, DIRECT_BINDINGS[name]), fn
    with _Seen() as seen:
        got = fn(*args, **kwargs)
    assert seen.ops == [overload], seen.ops
    torch.testing.assert_close(got, overload(*args, **kwargs), rtol=0, atol=0)


def test_other_overloads_keep_their_entry_point() -> None:
    """An out= overload, an overload with another name, and an operator not in
    the table go through the operator's own C++ entry point."""
    for overload in (aten.mm.out, aten.add.Tensor, aten.convolution_backward.default):
        assert aten_op(overload) is overload._op


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_a_compiled_convolution_calls_torchs_function(target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(torch.nn.functional.conv2d(x, w, b, padding=1))
        return (y.flatten(1) @ m,)

    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(2, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g),
              torch.randn(4, generator=g), torch.randn(256, 5, generator=g)]
    gm = make_fx(f)(*inputs)
    compiled = coil.compile_graph(gm, inputs, coil.Options(target=target, graph_cache=False))
    assert "aten_convolution_default = aten_op(torch.ops.aten.convolution.default)" in compiled.source
    assert compiled.namespace["aten_convolution_default"] is torch.convolution
    assert compiled.namespace["aten_mm_default"] is torch.mm
    torch.testing.assert_close(compiled(*inputs)[0], f(*inputs)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_a_conv_net_binds_its_in_place_views_to_their_base(device: str) -> None:
    """A conv -> BatchNorm -> ReLU6 stack and a pooled head, in inference, computed
    channels-last (cpp on the CPU, triton on CUDA): each kernel writes NHWC over
    its convolution's result in place, and the next convolution takes that result
    as it is, so the wrapper binds both names to the convolution's tensor
    (wrap.views_as_base) and calls torch.convolution; the outputs match eager's."""
    from bench.variants import Capture, record_coil_graphs

    if device == "cpu" and not target_available("cpp"):
        pytest.skip("cpp backend not available")
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for c_in, c_out in ((3, 16), (16, 16), (16, 32)):
        layers += [torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c_out),
                   torch.nn.ReLU6()]
    net = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).to(device).eval()
    x = torch.randn(4, 3, 32, 32, device=device)
    torch._dynamo.reset()
    cap = Capture()
    with torch.no_grad(), record_coil_graphs(cap):
        want = net(x)
        got = torch.compile(net, backend="coil")(x)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    (compiled,) = [g for g in cap.coil_graphs if g is not None]
    source = compiled.source[compiled.source.index("def call("):]
    # the first two kernels' in-place results, and the two convolutions that read them
    assert source.count("# in place, as its base") == 2 and source.count("  # as its base\n") == 2, source
    assert compiled.namespace["aten_convolution_default"] is torch.convolution
