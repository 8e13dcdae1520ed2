"""Attention kernels get their arguments in the strides eager gave them
(passes/layout.py: attention_input_strides): the query and key a rotary embedding
computes are computed in that order, the attention's result is the layout its
meta function promised, and the output projection reads it as a view."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import coil
import coil.backends.runtime as rt
from coil.ir.lowered import Extern
from coil.ir.printer import show
from coil.options import Options
from coil.passes.layout import dense_order

HAS_CUDA = torch.cuda.is_available()
B, S, H, D = 2, 16, 4, 8


def _rot(t: torch.Tensor) -> torch.Tensor:
    return torch.cat((-t[..., D // 2:], t[..., : D // 2]), -1)


def attention_block(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama's attention: projections viewed (B, S, H, D) and transposed, a rotary
    embedding on the query and key, causal attention, the output projection."""
    q = (x @ wq).view(B, S, H, D).transpose(1, 2)
    k = (x @ wk).view(B, S, H, D).transpose(1, 2)
    v = (x @ wv).view(B, S, H, D).transpose(1, 2)
    q = q * cos + _rot(q) * sin
    k = k * cos + _rot(k) * sin
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(B, S, H * D) @ wo


def _inputs(device: str = "cpu", dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(B, S, H * D, generator=g)] + [torch.randn(H * D, H * D, generator=g) / 6 for _ in range(4)]
    ts += [torch.randn(S, D, generator=g), torch.randn(S, D, generator=g)]
    return [t.to(device, dtype) for t in ts]


def test_dense_order() -> None:
    assert dense_order((2, 4, 16, 8), (512, 8, 32, 1)) == (0, 2, 1, 3)
    assert dense_order((2, 4, 16, 8), (512, 128, 8, 1)) == (0, 1, 2, 3)
    assert dense_order((2, 1, 16, 8), (128, 7, 8, 1)) is not None  # a dim of size 1 has any stride
    assert dense_order((2, 4, 9, 9), (432, 108, 12, 1)) is None  # padded rows: not dense


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_rotary_query_and_key_are_computed_in_eagers_order(target: str) -> None:
    args = _inputs()
    gm = make_fx(attention_block)(*args)
    lowered = coil.default_pipeline().run(gm, args, until="lower", options=Options(target=target))
    text = show(lowered)
    attn = [n for n in lowered.nodes if isinstance(n, Extern) and "scaled_dot_product" in n.kernel]
    assert len(attn) == 1 and attn[0].arg_strides[:3] == ((512, 8, 32, 1),) * 3, text
    assert "eager strides [[512, 8, 32, 1], [512, 8, 32, 1], [512, 8, 32, 1]" in text
    # the query and key computed over (B, S, H, D), viewed (B, H, S, D): no copy for the attention
    assert text.count("__eager = Pointwise[float32[2, 16, 4, 8]]") == 2 and "__eager_in" not in text, text
    compiled = coil.compile_graph(gm, args, Options(target=target, graph_cache=False))
    call = compiled.source[compiled.source.index("def call("):]
    after = call[call.index("scaled_dot_product"):]
    # the output projection reads the attention's result as it comes: no kernel between them
    assert not any(ln.strip().startswith(("cpp_fused", "ref_")) for ln in after.splitlines()), call
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args)[0], attention_block(*args), atol=1e-4, rtol=1e-4)


def test_an_argument_that_is_also_an_output_is_copied_into_eagers_order() -> None:
    """The query returned too keeps the output's strides, and the attention reads
    a copy of it in eager's order."""
    def fn(*a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, wq, wk, wv, wo, cos, sin = a
        q = (x @ wq).view(B, S, H, D).transpose(1, 2).contiguous() * 2
        k = (x @ wk).view(B, S, H, D).transpose(1, 2)
        v = (x @ wv).view(B, S, H, D).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v), q

    args = _inputs()
    gm = make_fx(fn)(*args)
    lowered = coil.default_pipeline().run(gm, args, until="lower", options=Options(target="cpp"))
    attn = next(n for n in lowered.nodes if isinstance(n, Extern) and "scaled_dot_product" in n.kernel)
    # eager's q is contiguous: nothing to do for it; k and v are views in (B, S, H, D) order already
    assert attn.arg_strides[0] == (512, 128, 8, 1) and "__eager" not in show(lowered)
    compiled = coil.compile_graph(gm, args, Options(target="cpp", graph_cache=False))
    for got, want in zip(compiled(*args), fn(*args)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_permuted_graph_output_read_by_attention_gets_a_copy() -> None:
    """A computed query that is also a graph output stays as realize lays outputs
    out, and the attention reads a copy of it in eager's strides."""
    def fn(*a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, wq, wk, wv, wo, cos, sin = a
        q = (x @ wq).view(B, S, H, D).transpose(1, 2) * cos
        k = (x @ wk).view(B, S, H, D).transpose(1, 2)
        v = (x @ wv).view(B, S, H, D).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v), q

    args = _inputs()
    gm = make_fx(fn)(*args)
    text = show(coil.default_pipeline().run(gm, args, until="lower", options=Options(target="cpp")))
    assert "__eager_in0 = Pointwise[float32[2, 16, 4, 8]]" in text, text
    compiled = coil.compile_graph(gm, args, Options(target="cpp", graph_cache=False))
    for got, want in zip(compiled(*args), fn(*args)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert got.stride() == want.stride()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_attention_results_come_back_as_planned(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU (bf16, whichever attention kernel torch picks) no attention
    result needs the wrapper's copy into the planned layout."""
    copied: list[Any] = []
    plain = rt.ensure_layout

    def counting(t: Any, *a: Any) -> Any:
        out = plain(t, *a)
        if out is not t:
            copied.append(a)
        return out

    monkeypatch.setattr(rt, "ensure_layout", counting)
    args = _inputs("cuda", torch.bfloat16)
    gm = make_fx(attention_block)(*args)
    compiled = coil.compile_graph(gm, args, Options(target="triton", graph_cache=False))
    with torch.no_grad():
        got = compiled(*args)[0]
        torch.testing.assert_close(got, attention_block(*args), atol=2e-2, rtol=2e-2)
    assert copied == [], copied
