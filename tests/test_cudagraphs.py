"""CUDA graphs (backends/cudagraphs.py): torch.compile(mode="reduce-overhead") records
each compiled graph and replays it; what cannot be recorded runs as compiled, with a
log line.  The decision functions are tested here on the CPU; recording and replay
need CUDA (run on the H200)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil.backends import cudagraphs

HAS_CUDA = torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


# ---- what may be recorded (CPU) ----------------------------------------------------------------


def test_verdicts_name_what_stops_a_recording() -> None:
    x = torch.empty(2, device="meta")
    assert cudagraphs.capture_verdict([torch.empty(2)], frozenset(), frozenset(), []) == "input 0 is a CPU tensor"
    assert cudagraphs.capture_verdict([None, 3], frozenset(), frozenset(), []) == "no CUDA tensor among its inputs"
    assert cudagraphs.capture_verdict([x], frozenset(), frozenset(), []) == "input 0 is a META tensor"


def test_graph_facts_find_writes_into_inputs_and_syncs() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> Any:
        a.add_(1)
        return torch.nonzero(b), a * 2

    gm = make_fx(fn)(torch.randn(4), torch.randn(4))
    _, mutated, syncs = cudagraphs.graph_facts(gm, "inference")
    assert mutated == frozenset({0})
    assert syncs == ["aten.nonzero.default"]
    x = torch.empty(4)
    assert cudagraphs.capture_verdict([x, x], frozenset({0, 1}), mutated, syncs) == (
        "aten.nonzero.default waits for the GPU (its result's size depends on the data)")
    assert cudagraphs.capture_verdict([x, x], frozenset({0, 1}), mutated, []) == (
        "it writes into input 0, which is copied in (not a parameter or buffer)")
    assert cudagraphs.capture_verdict([x, x], frozenset({1}), mutated, []) == "input 0 is a CPU tensor"


def test_backward_graphs_read_saved_tensors_in_place() -> None:
    """A backward graph's inputs other than the incoming gradients are static."""
    x = torch.randn(4, 4, requires_grad=True)
    seen: list[torch.fx.GraphModule] = []

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def bw(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        seen.append(gm)
        return make_boxed_func(gm)

    torch._dynamo.reset()
    f = torch.compile(lambda a: (a.sin() * a).sum(),
                      backend=aot_autograd(fw_compiler=lambda g, i: make_boxed_func(g), bw_compiler=bw))
    f(x).backward()
    (gm,) = seen
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    static, _, _ = cudagraphs.graph_facts(gm, "backward")
    assert {names[i] for i in static} == {n for n in names if "tangents" not in n}
    assert any("tangents" in n for n in names)


# ---- recording and replay (CUDA) ------------------------------------------------------------------


@pytest.mark.cuda
@cuda
def test_inference_replays_and_follows_its_inputs() -> None:
    lin = torch.nn.Linear(64, 64, device="cuda")
    fn = lambda a: torch.nn.functional.gelu(lin(a)).softmax(-1)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 64, device="cuda")
            torch.testing.assert_close(compiled(x), fn(x))
        outs = [compiled(torch.full((8, 64), float(i), device="cuda")) for i in range(3)]  # all held at once
        for i, o in enumerate(outs):
            torch.testing.assert_close(o, fn(torch.full((8, 64), float(i), device="cuda")))


@pytest.mark.cuda
@cuda
def test_one_launch_per_call_once_recorded() -> None:
    """After recording, a call is one CUDA graph launch and no kernel launch."""
    x = torch.randn(256, 512, device="cuda")
    fn = lambda a: ((a * 2).softmax(-1) + 1).sum(-1)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", mode="reduce-overhead")
    for _ in range(3):
        compiled(x)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = compiled(x)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert any("cudaGraphLaunch" in n for n in names), sorted(set(names))[:40]
    assert not any(n.startswith("cuLaunchKernel") for n in names)
    torch.testing.assert_close(out, fn(x))


@pytest.mark.cuda
@cuda
def test_held_outputs_are_never_overwritten() -> None:
    x = torch.randn(128, 128, device="cuda")
    fn = lambda a: a.sin() * 3  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", mode="reduce-overhead")
    kept = [compiled(x + i) for i in range(8)]  # past MAX_RECORDINGS: the rest run without a graph
    for i, k in enumerate(kept):
        torch.testing.assert_close(k, fn(x + i))


@pytest.mark.cuda
@cuda
def test_new_parameter_addresses_record_again() -> None:
    lin = torch.nn.Linear(32, 32, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(lin, backend="coil", mode="reduce-overhead")
    x = torch.randn(4, 32, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        lin.weight.data = lin.weight.data.clone() * 2  # same layout, another address
        for _ in range(3):
            torch.testing.assert_close(compiled(x), lin(x))


@pytest.mark.cuda
@cuda
def test_training_records_forward_and_backward_in_one_pool(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 10)).cuda()
    ref = [p.detach().clone() for p in model.parameters()]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="coil", mode="reduce-overhead")
    with caplog.at_level(logging.INFO, logger="coil"):
        for step in range(5):  # a new batch each step: the input the forward saves is copied in
            x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
            for p in model.parameters():
                p.grad = None
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            got = [p.grad.clone() for p in model.parameters()]
            for p in model.parameters():
                p.grad = None
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for g, p in zip(got, model.parameters()):
                torch.testing.assert_close(g, p.grad, atol=1e-4, rtol=1e-4)
    assert "forward graph recorded into a CUDA graph" in caplog.text, caplog.text
    assert "backward graph recorded into a CUDA graph" in caplog.text, caplog.text
    assert "pool 0 (recording 2 in it)" in caplog.text, caplog.text  # the backward shares the forward's pool
    assert all(torch.equal(a, b) for a, b in zip(ref, model.parameters()))


@pytest.mark.cuda
@cuda
def test_a_graph_that_cannot_be_recorded_runs_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(64, device="cuda")
    fn = lambda a, s: a * s  # noqa: E731 - s: a CPU scalar tensor
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", mode="reduce-overhead")
    with caplog.at_level(logging.INFO, logger="coil"):
        for i in range(3):
            s = torch.tensor(float(i))
            torch.testing.assert_close(compiled(x, s), fn(x, s))
    assert "graph runs without CUDA graphs" in caplog.text, caplog.text


@pytest.mark.cuda
@cuda
def test_random_numbers_differ_between_replays() -> None:
    x = torch.ones(1 << 16, device="cuda")
    fn = lambda a: torch.nn.functional.dropout(a, 0.5, training=True)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil", mode="reduce-overhead")
    outs = [compiled(x).clone() for _ in range(5)]
    assert not torch.equal(outs[-1], outs[-2])
    assert all(abs(o.eq(0).float().mean().item() - 0.5) < 0.02 for o in outs)


@pytest.mark.cuda
@cuda
def test_a_cpu_scalar_tensor_read_by_a_cuda_kernel() -> None:
    """x * torch.tensor(2.0): the CPU scalar goes to the device before the kernel."""
    x = torch.randn(64, device="cuda")
    fn = lambda a, s: (a * s).relu()  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="coil")
    for v in (2.0, -1.0):
        s = torch.tensor(v)
        torch.testing.assert_close(compiled(x, s), fn(x, s))
