"""_weight_norm_interface_backward decomposes into sums and pointwise ops
(passes/lowerings/decompositions.py, issue 15) instead of running as an Extern:
against eager on every target, first and last dim, float32 and bfloat16; and a
weight-normed convolution (Wav2Vec2's positional convolution) trained through
torch.compile with no Extern but the convolutions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.ir.lowered import Extern, LoweredGraph
from coil.ir.printer import show
from tests_helpers import target_available

aten = torch.ops.aten
TARGETS = ["reference", "cpp", "triton"]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes


def backwards(gw: torch.Tensor, v: torch.Tensor, g: torch.Tensor, gw2: torch.Tensor, v2: torch.Tensor,
              g2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """v (8, 4, 5) normed over all but its last dim; v2 (6, 3) over all but its first."""
    norm = torch._weight_norm_interface(v, g, 2)[1]
    norm2 = torch._weight_norm_interface(v2, g2, 0)[1]
    return (*aten._weight_norm_interface_backward(gw * 2, v, g, norm, 2),
            *aten._weight_norm_interface_backward(gw2, v2, g2, norm2, 0))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weight_norm_backward_matches_eager_without_externs(dtype: torch.dtype, target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    shapes = [(8, 4, 5), (8, 4, 5), (1, 1, 5), (6, 3), (6, 3), (6, 1)]
    inputs = [torch.randn(s).to(dtype) for s in shapes]
    gm = make_fx(backwards)(*inputs)
    assert aten._weight_norm_interface_backward.default in {n.target for n in gm.graph.nodes}
    g = coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target=target))
    assert isinstance(g, LoweredGraph)
    assert not [n for n in g.nodes if isinstance(n, Extern)], show(g)
    got = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    expected = backwards(*inputs)
    for k, (g_, e) in enumerate(zip(got, expected)):
        assert g_.dtype == e.dtype and g_.shape == e.shape, (k, g_.dtype, e.dtype, g_.shape, e.shape)
        torch.testing.assert_close(g_, e, msg=lambda m: f"output {k}: {m}")


class PositionalConv(nn.Module):
    """Wav2Vec2's positional convolution: weight norm over the kernel dim (2)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 5, padding=2, groups=2), dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.conv(x)) + x


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_weight_normed_conv_training(target: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = PositionalConv()
    x = torch.randn(2, 8, 12, requires_grad=True)
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
    texts = [(p / "00_lower.txt").read_text() for p in sorted((tmp_path / "debug").iterdir())
             if (p / "00_lower.txt").exists()]
    # AOTAutograd decomposes the backward with coil's table before coil sees it
    assert len(texts) == 2
    for text in texts:
        externs = [line for line in text.splitlines() if "= Extern" in line]
        assert all("convolution" in line for line in externs), externs
