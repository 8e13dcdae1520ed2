"""The joint graph's no-op copies (backends/joint_graph.py): dropped before the
partitioner, so the forward does not save a tensor and its copy."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import coil.backends.dynamo as dyn
from coil.backends.joint_graph import drop_noop_copies

aten = torch.ops.aten


def _targets(gm: torch.fx.GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_a_copy_that_is_its_source_is_dropped_and_its_readers_read_the_source():
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = torch.softmax(x, -1)
        c = aten.clone.default(p)
        a = aten.alias.default(p)
        return p * 2, c.sum(-1) + a.mean(-1)

    x = torch.randn(4, 8)
    gm = make_fx(f, tracing_mode="fake")(x)
    assert _targets(gm).count(aten.clone.default) == 1
    assert drop_noop_copies(gm.graph) == 2
    gm.recompile()
    assert aten.clone.default not in _targets(gm) and aten.alias.default not in _targets(gm)
    for got, want in zip(gm(x), f(x)):
        torch.testing.assert_close(got, want)


def test_copies_that_change_something_or_would_alias_an_output_stay():
    def layout(x: torch.Tensor) -> torch.Tensor:  # strides change: a real copy
        return aten.clone.default(x.t(), memory_format=torch.contiguous_format) + 1

    def dtype(x: torch.Tensor) -> torch.Tensor:
        return aten._to_copy.default(x * 2, dtype=torch.float64)

    def output_of_input(x: torch.Tensor) -> torch.Tensor:  # the output would be the input
        return aten.clone.default(x)

    def two_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # two outputs, one storage
        y = x + 1
        return y, aten.clone.default(y)

    def mutates(x: torch.Tensor) -> torch.Tensor:  # the copy keeps y's value from the add_
        y = x * 2
        c = aten.clone.default(y)
        y.add_(1)
        return c + y

    x = torch.randn(4, 6)
    for f in (layout, dtype, output_of_input, two_outputs, mutates):
        gm = make_fx(f, tracing_mode="fake")(x)
        before = _targets(gm)
        assert drop_noop_copies(gm.graph) == 0, f.__name__
        assert _targets(gm) == before, f.__name__


class _Attention(torch.nn.Module):
    """T5's pattern: softmax in float32, back to the scores' dtype, dropout at p=0
    (a clone in the joint graph), then the matmul with the values."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2)
        probs = torch.softmax(scores.float(), -1).type_as(scores)
        probs = F.dropout(probs, p=0.0, training=True)
        return (probs @ v).sum()


def _saved(options: dict[str, Any]) -> tuple[list[tuple[int, ...]], tuple[torch.Tensor, ...]]:
    """The shapes the forward saves, and the step's gradients."""
    saved: list[tuple[int, ...]] = []
    real = dyn._partition_fn

    def spying(opts: Any = None) -> Any:
        part = real(opts)

        def spy(joint: Any, inputs: Any, **kwargs: Any) -> Any:
            fw, bw = part(joint, inputs, **kwargs)
            outs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
            saved.extend(tuple(o.meta["val"].shape) for o in outs[1:]
                         if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor))
            return fw, bw

        return spy

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=gen, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    dyn._partition_fn = spying  # type: ignore[assignment]
    try:
        torch.compile(_Attention(), backend="coil", options={"target": "reference", **options})(q, k, v).backward()
    finally:
        dyn._partition_fn = real  # type: ignore[assignment]
        torch._dynamo.reset()
    return saved, (q.grad, k.grad, v.grad)


def test_attention_probabilities_are_saved_once_and_the_gradients_are_eagers():
    probs = (2, 3, 16, 16)
    flat = (6, 16, 16)  # the matmul's view of them, a copy of its own when not dropped
    saved, grads = _saved({})
    assert saved.count(probs) + saved.count(flat) == 1, saved
    off, off_grads = _saved({"joint_noop_copies": False})
    assert off.count(probs) + off.count(flat) == 2, off  # what the option's default saves

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=gen, requires_grad=True) for _ in range(3))
    _Attention()(q, k, v).backward()
    for got, got_off, want in zip(grads, off_grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_off, want)
