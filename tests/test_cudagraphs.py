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


def test_symbolic_graphs_are_not_recorded() -> None:
    """A graph of symbolic sizes (dynamic shapes) runs without a CUDA graph: one
    recording holds one size."""
    from tests_helpers import capture_aot

    _, example = capture_aot(lambda t: t * 2, (torch.randn(8, 4),))
    assert cudagraphs.capture_verdict(example, frozenset(), frozenset(), []) == (
        "its sizes are symbolic (dynamic shapes): a recording holds one size")


def test_a_static_graph_taking_a_specialized_symint_may_be_recorded() -> None:
    """A SymInt Dynamo specialized (an int input branched on: gemma2's decoding
    step takes `Sym(8)`) is a number: its graph is static, and it was refused as
    symbolic."""
    verdicts = []

    def backend(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        verdicts.append((any(isinstance(v, torch.SymInt) for v in example),
                         cudagraphs.capture_verdict(example, frozenset(), frozenset(), [])))
        return gm.forward

    def f(x: torch.Tensor, n: int) -> Any:
        return (x + n, n + 1) if n == 8 else (x - n, n)

    torch._dynamo.reset()
    g = torch.compile(f, backend=backend)
    for n in (7, 8):  # the second n makes n a SymInt (automatic dynamic); `n == 8` specializes it
        g(torch.randn(4), n)
    # the second graph takes the SymInt; not "symbolic": on CUDA it is recorded
    assert verdicts[-1] == (True, "input 1 is a CPU tensor")


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


def test_a_dynamo_graph_keeps_its_modules_parameters_and_buffers_in_place() -> None:
    """A Dynamo graph loaded through the graph cache's link (AOTAutograd skipped)
    reads a module's parameters and buffers in place as AOTAutograd's inference
    graph does: only the caller's inputs are copied in (a rotary embedding's
    inv_freq buffer had been copied at every replay)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._guards import TracingContext

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale + mask

    m, x, mask = M(), torch.randn(2, 4), torch.randn(2, 4)
    dynamo: list[torch.fx.GraphModule] = []
    aot: list[frozenset[int]] = []

    def keep(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        dynamo.append(gm)
        return gm.forward

    def facts(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        aot.append(cudagraphs.graph_facts(gm, "inference")[0])
        return make_boxed_func(gm)

    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(m, backend=keep)(x, mask)
        torch._dynamo.reset()
        torch.compile(m, backend=aot_autograd(fw_compiler=facts, inference_compiler=facts))(x, mask)
    torch._dynamo.reset()
    (gm,) = dynamo
    assert TracingContext.try_get() is None
    static, _, _ = cudagraphs.graph_facts(gm, "inference")
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert sorted(names[i] for i in static) == sorted(n for n in names if "weight" in n or "bias" in n
                                                      or "scale" in n), names
    assert {names[i] for i in set(range(len(names))) - static} == {"l_x_", "l_mask_"}
    (aot_static,) = aot
    assert len(aot_static) == len(static) == 3


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


def test_replay_bookkeeping_sees_every_holder_of_an_output() -> None:
    """The liveness checks behind a replay, on CPU tensors and a stand-in graph:
    a recording is replayable only while nobody holds its outputs (the tensor
    handed out, or a view of it), nor those of a later recording in its pool."""

    class Graph:
        replays = 0

        def replay(self) -> None:
            Graph.replays += 1

    pool = object.__new__(cudagraphs._Pool)
    pool.recordings = []

    def record(n_out: int) -> Any:
        outs = tuple(torch.full((4,), float(k)) for k in range(n_out)) + (None,)
        rec = cudagraphs._Recording(Graph(), pool, [None], {0: torch.zeros(2)}, outs, tuple(range(n_out)), {}, {})
        pool.recordings.append(rec)
        return rec

    first, second = record(3), record(2)
    assert first.replayable() and second.replayable()
    x = torch.tensor([5.0, 6.0])
    out = first.run([x])
    assert Graph.replays == 1 and out[-1] is None
    assert torch.equal(first.placeholders[0], x)  # the input was copied into its placeholder
    assert out[0].untyped_storage().data_ptr() == first.outputs[0].untyped_storage().data_ptr()
    assert not first.replayable() and second.replayable()
    view = out[1][1:]
    del out
    assert not first.replayable()  # a view still reads output 1's memory
    del view
    assert first.replayable()
    held = second.run([x])
    assert not first.replayable(), "a replay of the first would overwrite the second's memory in the pool"
    del held
    assert first.replayable() and second.replayable()


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


# ---- the bookkeeping, simulated on the CPU ---------------------------------------------------------
# A stand-in for torch.cuda.graph: "capture" runs the call once and remembers it with
# the very tensors it read and wrote; "replay" runs it again on those tensors and writes
# the results into the same outputs, as a CUDA graph replays into the same memory.


class _FakeGraph:
    def __init__(self) -> None:
        self.runs: list[tuple[Any, list[Any], tuple[Any, ...]]] = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        with torch.no_grad():  # a replay writes memory, as kernels do; autograd sees none of it
            for fn, inputs, outputs in self.runs:
                for o, n in zip(outputs, fn(list(inputs), capturing=False)):
                    if isinstance(o, torch.Tensor):
                        _write(o, n)


def _write(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src), each memory location once where dst is expanded."""
    for d in range(dst.dim()):
        if dst.stride(d) == 0 and dst.size(d) > 1:
            dst, src = dst.narrow(d, 0, 1), src.narrow(d, 0, 1)
    dst.copy_(src)


_RECORDED: dict[Any, torch.Tensor] = {}


class _Capturing:
    current: _FakeGraph | None = None

    def __init__(self, graph: _FakeGraph, pool: Any = None) -> None:
        self.graph = graph

    def __enter__(self) -> None:
        _Capturing.current = self.graph

    def __exit__(self, *exc: Any) -> None:
        _Capturing.current = None


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", _Capturing)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(cudagraphs, "DEVICE_TYPE", "cpu")
    _RECORDED.clear()


def _traced(fn: Any) -> Any:
    """A boxed call that, while captured, registers itself with the graph."""
    calls = {"eager": 0}

    def call(args: list[Any], capturing: bool = True) -> tuple[Any, ...]:
        inputs = list(args)
        args.clear()
        recording = capturing and _Capturing.current is not None
        # a capture runs nothing: what the call writes into its inputs (a backward into
        # the saved buffers it reuses) is undone, so the first replay reads them intact
        before = [(x, x.clone()) for x in inputs if isinstance(x, torch.Tensor)] if recording else []
        out = tuple(fn(*inputs))
        with torch.no_grad():
            for x, old in before:
                _write(x, old)
        if recording:
            # a CUDA graph holds addresses, not tensors: an input that is another
            # recording's output is kept as that output itself (no new reference)
            kept = [_RECORDED.get((x.data_ptr(), x.shape, x.stride()), x) if isinstance(x, torch.Tensor) else x
                    for x in inputs]
            # an output in an input's memory is rewritten there by the replay's own run: not kept
            # (a CUDA graph holds no reference to it either)
            read = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
            own = tuple(None if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in read else o
                        for o in out)
            _Capturing.current.runs.append((call, kept, own))
            _RECORDED.update({(o.data_ptr(), o.shape, o.stride()): o for o in own if isinstance(o, torch.Tensor)})
        elif capturing:
            calls["eager"] += 1
        return out

    call.calls = calls  # type: ignore[attr-defined]
    return call


def _traced_boxed(call: Any) -> Any:
    """_traced for a compiled graph's boxed call (it takes a list and clears it)."""
    return _traced(lambda *inputs: tuple(call(list(inputs))))


def test_record_once_then_replay_with_new_inputs(fake_cuda: None) -> None:
    w = torch.nn.Parameter(torch.randn(8))
    call = _traced(lambda x, p: (x * p + 1,))
    g = cudagraphs.CudaGraphed(call, "inference", frozenset({1}), cudagraphs.PoolSet(), None)
    for i in range(5):
        x = torch.randn(8)
        (out,) = g([x, w])
        torch.testing.assert_close(out, x * w + 1)
        del out
    assert len(g.recordings) == 1 and call.calls["eager"] == 1  # the warm-up only
    assert g.recordings[0].graph.replays == 4  # the recording call replays too
    assert g.decisions == ["recording 1: 1 inputs read in place, 1 copied in; pool 0 (recording 1 in it)"]


def test_every_copied_input_is_refreshed_and_outputs_keep_their_places(fake_cuda: None) -> None:
    """Several copied-in inputs (filled by one _foreach_copy_), outputs that are not
    tensors (None, a number) between tensor ones, and an output that is the
    caller's own input: each replay gives this call's values in the traced order."""
    w = torch.nn.Parameter(torch.randn(3), requires_grad=False)
    call = _traced(lambda a, b, p, c: (a * p, None, b + c, 7, c))
    g = cudagraphs.CudaGraphed(call, "forward", frozenset({2}), cudagraphs.PoolSet(), None)
    for _ in range(4):
        a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
        out = g([a, b, w, c])
        assert out[1] is None and out[3] == 7 and out[4] is c
        torch.testing.assert_close(out[0], a * w)
        torch.testing.assert_close(out[2], b + c)
        del out
    assert len(g.recordings) == 1 and len(g.recordings[0].placeholders) == 3


def test_held_outputs_make_another_recording(fake_cuda: None) -> None:
    call = _traced(lambda x: (x.sin(),))
    g = cudagraphs.CudaGraphed(call, "inference", frozenset(), cudagraphs.PoolSet(), None)
    g([torch.randn(4)])  # warm-up
    xs = [torch.randn(4) for _ in range(3)]
    kept = [g([x])[0] for x in xs]  # each held: none can be overwritten
    assert len(g.recordings) == 3
    for x, k in zip(xs, kept):
        torch.testing.assert_close(k, x.sin())
    view = kept[0][1:]  # a view holds the storage too
    del kept, k
    assert [r.outputs_free() for r in g.recordings] == [False, True, True]  # 1 is held through the view
    x = torch.randn(4)
    (out,) = g([x])  # replays recording 2
    assert len(g.recordings) == 3 and g.recordings[1].graph.replays == 2
    torch.testing.assert_close(out, x.sin())
    assert [r.outputs_free() for r in g.recordings] == [False, False, True]
    torch.testing.assert_close(view, xs[0].sin()[1:])  # never overwritten
    del view, out
    assert all(r.outputs_free() for r in g.recordings)


def test_new_parameter_addresses_record_again_and_the_limit_turns_graphs_off(
        fake_cuda: None, caplog: pytest.LogCaptureFixture) -> None:
    """One graph called for each of a model's layers reads each layer's
    parameters: a recording a set, each replayed when its layer comes again; past
    MAX_POINTER_SETS sets the graph runs as compiled."""
    call = _traced(lambda x, p: (x + p,))
    g = cudagraphs.CudaGraphed(call, "forward", frozenset({1}), cudagraphs.PoolSet(), None)
    x = torch.randn(4)
    g([x, torch.nn.Parameter(torch.randn(4))])  # warm-up
    layers = [torch.nn.Parameter(torch.randn(4)) for _ in range(6)]
    for _ in range(3):  # three steps through six layers
        for p in layers:
            (out,) = g([x, p])
            torch.testing.assert_close(out, x + p)
            del out
    assert len(g.recordings) == 6 and g.off is None
    assert [r.graph.replays for r in g.recordings] == [3] * 6
    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(cudagraphs.MAX_POINTER_SETS - 6 + 1)]
    with caplog.at_level(logging.INFO, logger="coil"):
        for p in params:
            (out,) = g([x, p])
            torch.testing.assert_close(out, x + p)
            del out
    assert len(g.recordings) == cudagraphs.MAX_POINTER_SETS
    assert g.off is not None and f"{cudagraphs.MAX_POINTER_SETS} sets of parameter addresses" in g.off
    assert "forward graph runs without CUDA graphs" in caplog.text
    (out,) = g([x, params[0]])  # off: runs as compiled, still right
    torch.testing.assert_close(out, x + params[0])


def test_outputs_held_from_every_recording_turn_graphs_off(fake_cuda: None) -> None:
    """A caller that keeps every output (a list of results) leaves no recording to
    replay: MAX_RECORDINGS are made for the one set of parameters, then the graph
    runs as compiled, and nothing kept is overwritten."""
    call = _traced(lambda x, p: (x * p,))
    g = cudagraphs.CudaGraphed(call, "forward", frozenset({1}), cudagraphs.PoolSet(), None)
    w = torch.nn.Parameter(torch.randn(4))
    xs = [torch.randn(4) for _ in range(cudagraphs.MAX_RECORDINGS + 3)]
    kept = [g([x, w])[0] for x in xs]
    assert len(g.recordings) == cudagraphs.MAX_RECORDINGS
    assert g.off is not None and f"{cudagraphs.MAX_RECORDINGS} recordings with these parameters" in g.off
    for x, k in zip(xs, kept):
        torch.testing.assert_close(k, x * w)


def test_a_backward_records_into_its_forwards_pool_and_guards_its_outputs(fake_cuda: None) -> None:
    pools = cudagraphs.PoolSet()
    w = torch.nn.Parameter(torch.randn(6))
    fw = cudagraphs.CudaGraphed(_traced(lambda x, p: ((x * p).sum(), x * p)), "forward", frozenset({1}), pools, None)
    bw = cudagraphs.CudaGraphed(_traced(lambda saved, p, g: (saved * g, p * g)), "backward",
                                frozenset({0, 1}), pools, None)
    for step in range(4):
        x = torch.randn(6)
        loss, saved = fw([x, w])
        g_saved, g_w = bw([saved, w, torch.ones(())])
        torch.testing.assert_close(loss, (x * w).sum())
        torch.testing.assert_close(g_saved, x * w)
        torch.testing.assert_close(g_w, w.detach())
        del loss, saved, g_saved, g_w
    assert len(fw.recordings) == 1 and len(bw.recordings) == 1
    assert fw.recordings[0].pool is bw.recordings[0].pool  # the backward shares the forward's pool
    assert bw.recordings[0].static_idx == (0, 1)  # the saved tensor (a recorded output) and the parameter, in place
    # a gradient still held: the forward's replay could overwrite it, so it records again
    x = torch.randn(6)
    loss, saved = fw([x, w])
    _, held = bw([saved, w, torch.ones(())])
    del loss, saved
    fw([x, w])
    assert len(fw.recordings) == 2
    torch.testing.assert_close(held, w.detach())


def test_a_backward_reads_views_of_parameters_in_place(fake_cuda: None) -> None:
    """A forward that saves a view of a weight (its transpose, for the backward's
    matmul) hands it out as a plain tensor over the parameter's storage: the backward
    reads it where it is (it is an output of the forward's recording), and copies
    in only the incoming gradient."""
    pools = cudagraphs.PoolSet()
    w = torch.nn.Parameter(torch.randn(2, 3))
    fw = cudagraphs.CudaGraphed(_traced(lambda x, p: ((x @ p).sum(), p.t(), p.detach())), "forward",
                                frozenset({1}), pools, None)
    bw = cudagraphs.CudaGraphed(_traced(lambda wt, wd, g: (wt * g, wd * 2 * g)), "backward",
                                frozenset({0, 1}), pools, None)
    for _ in range(4):
        x = torch.randn(4, 2)
        loss, wt, wd = fw([x, w])
        assert not isinstance(wt, torch.nn.Parameter) and wt.untyped_storage().data_ptr() == w.data_ptr()
        g_wt, g_wd = bw([wt, wd, torch.full((), 3.0)])
        torch.testing.assert_close(loss, (x @ w).sum())
        torch.testing.assert_close(g_wt, w.detach().t() * 3)
        torch.testing.assert_close(g_wd, w.detach() * 6)
        del loss, wt, wd, g_wt, g_wd
    assert bw.recordings[0].static_idx == (0, 1) and len(bw.recordings) == 1
    assert bw.decisions == ["recording 1: 2 inputs read in place, 1 copied in; pool 0 (recording 2 in it)"]
    with torch.no_grad():  # the weight's values change in place (an optimizer step): read, not copied
        w.mul_(2)
    _, wt, wd = fw([torch.randn(4, 2), w])
    g_wt, _ = bw([wt, wd, torch.ones(())])
    torch.testing.assert_close(g_wt, w.detach().t())


def test_views_of_parameters_are_made_once_and_views_in_a_pool_at_each_replay(fake_cuda: None) -> None:
    """A forward's outputs that are a parameter's detached self or a view of it are
    made when recorded and handed out as they are (a training step of MobileNetV2
    made 140 of them anew each replay, 0.7 ms of its host time); a backward's
    output that lies in a saved tensor's buffer, in its forward's pool, is made
    from the caller's tensor each time, so the backward's recording keeps no
    reference into the forward's memory."""
    pools = cudagraphs.PoolSet()
    w = torch.nn.Parameter(torch.randn(2, 3))
    fw = cudagraphs.CudaGraphed(_traced(lambda x, p: ((x @ p).sum(), p.t(), p.detach(), x @ p.detach())), "forward",
                                frozenset({1}), pools, None)

    def backward(act: torch.Tensor, g: torch.Tensor) -> tuple[Any, ...]:
        torch.mul(act, g, out=act)  # the gradient written into the saved activation's buffer
        return (act,)

    bw = cudagraphs.CudaGraphed(_traced(backward), "backward", frozenset({0}), pools, None)
    first = None
    for step in range(5):  # the first call warms up, the second records, then replays
        x = torch.randn(4, 2)
        loss, wt, wd, act = fw([x, w])
        assert wt.untyped_storage().data_ptr() == w.data_ptr()
        (grad,) = bw([act, torch.full((), 2.0)])
        torch.testing.assert_close(grad, (x @ w).detach() * 2)
        assert grad.untyped_storage().data_ptr() == act.untyped_storage().data_ptr()
        if step == 1:
            first = (wt, wd)
        elif step > 1:  # the same tensors each replay, over the parameter, out of its autograd graph
            assert first is not None and wt is first[0] and wd is first[1] and not wt.requires_grad
        del loss, wt, wd, act, grad
    assert len(fw.recordings) == 1 and len(bw.recordings) == 1
    (fw_rec,), (bw_rec,) = fw.recordings, bw.recordings
    assert sorted(k for k, o in enumerate(fw_rec.outputs) if o is not None and k in (1, 2)) == [1, 2]
    assert [k for k, _ in bw_rec._alias_items] == [0] and bw_rec.outputs == (None,)
    with torch.no_grad():  # an optimizer's step in place: the views made once see it
        w.mul_(3)
    _, wt, wd, _ = fw([torch.randn(4, 2), w])
    torch.testing.assert_close(wt, w.detach().t())
    torch.testing.assert_close(wd, w.detach())


def test_a_loop_holding_its_last_loss_alternates_two_recordings(fake_cuda: None) -> None:
    """A training loop keeps the last step's loss while the next forward runs
    (`loss = step(x)`): the forward's recording is held, so a second one is made
    in a pool of its own, and the two then replay in turn, each with its backward.
    A forward that hands out a view of its weight (BART's tied embedding, saved
    transposed for the backward) must not draw the second recording into the
    first's pool, where neither could replay while the other's loss is held
    (BART's training step on the H200 ran without CUDA graphs after 4 recordings)."""
    pools = cudagraphs.PoolSet()
    w = torch.nn.Parameter(torch.randn(2, 3))
    fw = cudagraphs.CudaGraphed(_traced(lambda x, p: ((x @ p).sum(), p.t(), x @ p)), "forward",
                                frozenset({1}), pools, None)
    bw = cudagraphs.CudaGraphed(_traced(lambda wt, act, g: (act * g, wt * g)), "backward",
                                frozenset({0, 1}), pools, None)
    loss = None
    for _ in range(8):
        x = torch.randn(4, 2)
        new_loss, wt, act = fw([x, w])
        g_act, g_wt = bw([wt, act, torch.full((), 2.0)])
        torch.testing.assert_close(new_loss, (x @ w).sum())
        torch.testing.assert_close(g_act, (x @ w) * 2)
        torch.testing.assert_close(g_wt, w.detach().t() * 2)
        if loss is not None:  # the last step's loss was never overwritten
            torch.testing.assert_close(loss, last)
        loss, last = new_loss, new_loss.clone()
        del new_loss, wt, act, g_act, g_wt
    assert fw.off is None and bw.off is None
    assert len(fw.recordings) == 2 and len(bw.recordings) == 2
    assert fw.recordings[0].pool is not fw.recordings[1].pool
    assert [r.pool for r in bw.recordings] == [r.pool for r in fw.recordings]  # each backward in its forward's pool
    assert [r.graph.replays for r in fw.recordings] == [4, 3]  # 7 calls after the warm-up, in turn


def test_a_gradient_in_a_saved_tensors_buffer_does_not_hold_the_forward(fake_cuda: None) -> None:
    """coil's backward may write a gradient into the buffer of a saved tensor it
    read for the last time (MobileNetV2's BatchNorm gradients, (48,) over a saved
    (2, 24, 1, 1)): that output lies in the forward recording's memory.  While
    the caller holds the gradient, the forward records again; once it lets go,
    the forward replays: the backward's recording keeps no reference of its own
    (before, it kept one forever, and every step recorded anew until the limit)."""
    pools = cudagraphs.PoolSet()
    w = torch.nn.Parameter(torch.randn(2, 3))

    def backward(saved: torch.Tensor, p: torch.Tensor, g: torch.Tensor) -> tuple[Any, ...]:
        grad_p = saved.view(-1)[: p.numel()].view(p.shape)  # the saved buffer, reused
        torch.mul(p.detach(), g, out=grad_p)
        return (grad_p,)

    def forward(x: torch.Tensor, p: torch.Tensor) -> tuple[Any, ...]:
        xp = x * p.detach()
        return xp.sum(), torch.cat([xp, x])  # the second: saved for the backward

    fw = cudagraphs.CudaGraphed(_traced(forward), "forward", frozenset({1}), pools, None)
    bw = cudagraphs.CudaGraphed(_traced(backward), "backward", frozenset({0, 1}), pools, None)
    for step in range(6):
        x = torch.randn(2, 3)
        loss, saved = fw([x, w])
        (grad,) = bw([saved, w, torch.full((), 2.0)])
        assert grad.untyped_storage().data_ptr() == saved.untyped_storage().data_ptr()
        torch.testing.assert_close(loss, (x * w).sum())
        torch.testing.assert_close(grad, w.detach() * 2)
        if step == 3:  # held into the next step: the forward must not overwrite it
            kept, kept_value = grad, grad.clone()
        del loss, saved, grad
    torch.testing.assert_close(kept, kept_value)
    assert len(fw.recordings) == 2 and len(bw.recordings) == 2 and fw.off is None
    assert [r.graph.replays for r in fw.recordings] == [3, 2]  # steps 1-3, then 4-5 while step 3's is kept


def test_a_layer_graph_reads_in_place_what_stays_put_layer_by_layer(fake_cuda: None) -> None:
    """A graph Dynamo compiled once and called for each of a model's layers (a
    graph break inside the layer: Whisper's encoder on the H200) saves the
    layer's input for the backward.  For every layer but the first that input is
    the layer before's output, in a pool; for the first it is the output of code
    run without CUDA graphs, a new tensor at every step.  The backward decides
    call by call what it reads in place, so the first layer's recording copies
    that input in and replays; decided once, from whichever layer's call was
    recorded first, the first layer's backward recorded anew at every step until
    the graph went off CUDA graphs (the step at 1.46x Inductor's time).  The
    recordings made in the first step, while the forward's first call ran
    without a CUDA graph, copy in saved tensors that later lie in a pool: each
    gives way once to a recording that reads them in place."""
    pools = cudagraphs.PoolSet()
    weights = [torch.nn.Parameter(torch.randn(4)) for _ in range(3)]
    fw = cudagraphs.CudaGraphed(_traced(lambda x, p: (x * p + 1, x)), "forward", frozenset({1}), pools, None)
    bw = cudagraphs.CudaGraphed(_traced(lambda saved, p, g: (g * p, (g * saved).sum(0))), "backward",
                                frozenset({0, 1}), pools, None)
    for step in range(40):
        x = torch.randn(2, 4)  # the first layer's input: new at every step
        h, saved = x, []
        for w in weights:
            h, s = fw([h, w])
            saved.append(s)
        g, grads = torch.ones(2, 4), []
        for w, s in zip(reversed(weights), reversed(saved)):
            g, gw = bw([s, w, g])
            grads.append(gw)
        want_h, want_g, want_grads = x, torch.ones(2, 4), []
        ins = []
        for w in weights:
            ins.append(want_h)
            want_h = want_h * w.detach() + 1
        torch.testing.assert_close(h, want_h)
        for w, i in zip(reversed(weights), reversed(ins)):
            want_grads.append((want_g * i).sum(0))
            want_g = want_g * w.detach()
        torch.testing.assert_close(g, want_g)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want)
        del h, saved, g, grads, s, gw, got
    assert fw.off is None and bw.off is None, bw.decisions
    assert len(fw.recordings) == 3 and len(bw.recordings) == 3, bw.decisions
    # the first layer's backward copies in its saved input (and the incoming gradient) only
    first = [r for r in bw.recordings if r.static_ptrs[1] == weights[0].data_ptr()]
    assert len(first) == 1 and first[0].static_idx == (1,) and first[0].graph.replays >= 30
    assert all(r.static_idx == (0, 1) for r in bw.recordings if r is not first[0])
    assert sum("superseded" in d for d in bw.decisions) >= 1


def test_a_gradient_written_over_a_copied_in_saved_tensor_is_the_graphs(fake_cuda: None) -> None:
    """A backward may write a gradient over a saved tensor AOTAutograd donated to
    it (the layer input's gradient over the saved layer input: same shape).  When
    that saved tensor is copied in (made outside CUDA graphs, new at every step),
    the write lands in the copy, and the output is that copy's memory: handed out
    as the caller's tensor, it read the saved input, not the gradient (Whisper's
    first-layer gradient on the H200, conv1's weight gradient off by an RMSE of
    2).  It is handed out over the copy, and a replay waits until nobody holds
    it."""
    pools = cudagraphs.PoolSet()
    w = torch.nn.Parameter(torch.randn(4))

    def backward(saved: torch.Tensor, p: torch.Tensor, g: torch.Tensor) -> tuple[Any, ...]:
        grad_p = (g * saved).sum(0)
        torch.mul(g, p.detach(), out=saved)  # the input's gradient, over the donated saved input
        return saved, grad_p

    bw = cudagraphs.CudaGraphed(_traced(backward), "backward", frozenset({0, 1}), pools, None,
                                written=frozenset({0}))
    held = []
    for step in range(6):
        x = torch.randn(2, 4)
        g = torch.randn(2, 4)
        gx, gw = bw([x.clone(), w, g])
        torch.testing.assert_close(gx, g * w.detach())
        torch.testing.assert_close(gw, (g * x).sum(0))
        if step == 3:  # held into the next step: the next replay must not write over it
            held = [gx, gx.clone()]
        del gx, gw
    torch.testing.assert_close(held[0], held[1])
    assert bw.off is None and len(bw.recordings) == 2, bw.decisions
    assert all(r.static_idx == (1,) for r in bw.recordings)


def test_an_output_that_is_a_copied_in_input_comes_from_the_callers_tensor(fake_cuda: None) -> None:
    call = _traced(lambda x: (x, x[1:], x * 2))  # a forward saving its input
    g = cudagraphs.CudaGraphed(call, "forward", frozenset(), cudagraphs.PoolSet(), None)
    for _ in range(3):
        x = torch.randn(5)
        same, view, doubled = g([x])
        assert same is x and view.data_ptr() == x.data_ptr() + x.element_size()
        torch.testing.assert_close(doubled, x * 2)


# ---- real training loops through torch.compile, the bookkeeping simulated on the CPU ------------


@pytest.fixture
def fake_cuda_models(fake_cuda: None, monkeypatch: pytest.MonkeyPatch) -> list[cudagraphs.CudaGraphed]:
    """fake_cuda, with CPU inputs allowed to be recorded, and every CudaGraphed made
    collected for the test to read."""
    made: list[cudagraphs.CudaGraphed] = []
    verdict = cudagraphs.capture_verdict

    def cpu_ok(*a: Any) -> str | None:
        why = verdict(*a)
        return None if why is not None and "CPU tensor" in why else why

    init = cudagraphs.CudaGraphed.__init__

    def collect(self: cudagraphs.CudaGraphed, call: Any, *a: Any, **k: Any) -> None:
        init(self, _traced_boxed(call), *a, **k)
        made.append(self)

    monkeypatch.setattr(cudagraphs, "capture_verdict", cpu_ok)
    monkeypatch.setattr(cudagraphs.CudaGraphed, "__init__", collect)
    return made


@pytest.mark.parametrize("name", ["bert", "mobilenet_v2"])
def test_a_real_training_loop_keeps_replaying(name: str, fake_cuda_models: list[cudagraphs.CudaGraphed]) -> None:
    """A training loop as users write it, under mode="reduce-overhead": AdamW,
    two micro-steps of gradient accumulation, the last loss kept while the next
    forward runs.  Every graph stays on CUDA graphs with at most two recordings
    (the held loss, the held gradients of the first micro-step), and the losses
    are those of coil without CUDA graphs, step for step (the same kernels: any
    stale input, overwritten output or replay of the wrong recording shows).
    BERT's tied embedding hands out a view of its weight, which drew every
    recording into one pool: this loop went off CUDA graphs after four recordings
    (on the H200 BART's step ran at 2.4x Inductor's time).  MobileNetV2's backward
    writes BatchNorm gradients into saved buffers, whose outputs its recording
    held (the suite's loop, which keeps nothing, recorded anew every step;
    test_a_gradient_in_a_saved_tensors_buffer_does_not_hold_the_forward).  The
    stand-in graphs run what was captured at each replay, so the values are
    checked too."""
    pytest.importorskip("transformers")
    import copy

    from bench.hf_models import TINY, make_case
    from bench.models import model_loss

    model, inputs = make_case(name, "train", "cpu", size=TINY)
    plain = copy.deepcopy(model)
    losses: dict[str, list[float]] = {}
    for mode, m in (("reduce-overhead", model), ("default", plain)):
        torch._dynamo.reset()
        f = torch.compile(m, backend="coil", mode=mode)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        losses[mode] = []
        for _ in range(4):
            for _ in range(2):
                loss = model_loss(f(**inputs)) / 2  # the last micro-step's loss is held meanwhile
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses[mode].append(loss.item())
    assert losses["reduce-overhead"] == losses["default"]
    assert len(set(losses["default"])) == 4  # the model trains: every step's loss is new
    used = [g for g in fake_cuda_models if g.recordings]
    assert used and all(g.off is None for g in fake_cuda_models), [g.off for g in fake_cuda_models]
    assert max(len(g.recordings) for g in used) <= 2, [g.decisions for g in used]
    assert all(r.graph.replays >= 2 for g in used for r in g.recordings)


def test_buffer_updates_run_inside_the_recording(fake_cuda_models: list[cudagraphs.CudaGraphed]) -> None:
    """BatchNorm's running statistics are written by the compiled forward itself
    (AOTAutograd keeps the writes into buffers in the graph: test_dynamo's
    test_buffer_updates_are_written_by_the_graph), so the recording writes into
    the buffers, which it reads in place: after every step they match eager's,
    with one recording replayed."""
    import copy

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    ref = copy.deepcopy(m)
    torch._dynamo.reset()
    f = torch.compile(m, backend="coil", mode="reduce-overhead")
    for step in range(5):
        x = torch.randn(2, 3, 8, 8)
        f(x).sum().backward()
        ref(x).sum().backward()
        for (name, b), (_, rb) in zip(m.named_buffers(), ref.named_buffers()):
            torch.testing.assert_close(b, rb, msg=f"step {step}: {name}")
    forward = [g for g in fake_cuda_models if g.kind == "forward"]
    assert len(forward) == 1 and forward[0].off is None
    assert [r.graph.replays for r in forward[0].recordings] == [4]  # steps 2-5


def test_a_cached_graph_reads_parameters_and_buffers_in_place(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, fake_cuda_models: list[cudagraphs.CudaGraphed]) -> None:
    """An inference graph loaded through the graph cache's link (AOTAutograd
    skipped: a second run of a program) copies in only what a cold compile
    copies: the caller's input, not the module's buffer (a rotary embedding's
    inv_freq, Gemma's embed_scale had been copied at every replay)."""
    import torch._dynamo.backends.common as common

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale

    def no_aot(**_k: Any) -> Any:
        raise AssertionError("AOTAutograd ran")

    m = M()
    options = {"target": "cpp", "cache_dir": str(tmp_path), "cuda_graphs": True}
    decisions = []
    for run in ("cold", "linked"):
        if run == "linked":  # every compile from here comes through the link
            monkeypatch.setattr(common, "aot_autograd", no_aot)
        torch._dynamo.reset()
        start = len(fake_cuda_models)
        f = torch.compile(m, backend="coil", options=options)
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 4)
                torch.testing.assert_close(f(x), m(x))
        (g,) = [g for g in fake_cuda_models[start:] if g.recordings]
        decisions.append(g.decisions)
    torch._dynamo.reset()
    expected = ["recording 1: 3 inputs read in place, 1 copied in; pool 0 (recording 1 in it)"]
    assert decisions[0] == decisions[1] == expected


def test_a_graph_called_for_every_layer_keeps_replaying(fake_cuda_models: list[cudagraphs.CudaGraphed],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Whisper's encoder with a graph break inside its layer, as on the H200
    (transformers 5.17 there): Dynamo compiles the layer once and calls it for
    each layer, the first layer's input made by code outside CUDA graphs.  With
    four layers the third layer's backward is recorded first, its saved input in
    a pool (with three, the second's, its input then fresh: no failure shows).  The
    suite's training step (gradients set to None, forward, backward) stops
    recording after its first steps, no graph goes off CUDA graphs, and the
    gradients are those of coil without CUDA graphs (the stand-in graphs run what
    was captured at each replay)."""
    pytest.importorskip("transformers")
    import copy
    import dataclasses

    import transformers.models.whisper.modeling_whisper as mw

    from bench.hf_models import TINY, make_case
    from bench.models import model_loss

    layer_forward = mw.WhisperEncoderLayer.forward

    def broken(self: Any, *a: Any, **k: Any) -> Any:
        torch._dynamo.graph_break()
        return layer_forward(self, *a, **k)

    monkeypatch.setattr(mw.WhisperEncoderLayer, "forward", broken)
    model, inputs = make_case("whisper_encoder", "train", "cpu", size=dataclasses.replace(TINY, layers=4))
    plain = copy.deepcopy(model)
    grads: dict[str, list[torch.Tensor]] = {}
    made_by_step: list[int] = []
    for mode, m in (("reduce-overhead", model), ("default", plain)):
        torch._dynamo.reset()
        f = torch.compile(m, backend="coil", mode=mode)
        params = list(m.parameters())
        for _ in range(8):
            for p in params:
                p.grad = None
            model_loss(f(**inputs)).backward()
            if mode == "reduce-overhead":
                made_by_step.append(sum(len(g.decisions) for g in fake_cuda_models))
        grads[mode] = [p.grad for p in params]
    layer = [g for g in fake_cuda_models if g.kind == "backward" and len(g.recordings) >= 3]
    assert layer, [g.decisions for g in fake_cuda_models]
    assert all(g.off is None for g in fake_cuda_models), [g.off for g in fake_cuda_models]
    assert made_by_step[-1] == made_by_step[3], made_by_step  # no decision (a recording) after the fourth step
    for a, b in zip(grads["reduce-overhead"], grads["default"]):
        torch.testing.assert_close(a, b)


def test_a_warm_start_loads_its_recorded_graphs_through_aotautograds_cache(
        fake_cuda_models: list[cudagraphs.CudaGraphed], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA graphs (Options.cuda_graphs, as reduce-overhead sets it) a training
    graph's AOTAutograd result is stored with each graph's GraphPlan, where it used
    to bypass the cache (a warm reduce-overhead start traced AOTAutograd again: 3.5 s
    against the default mode's 1.6 for the small Llama on an H100).  A second
    compile from a fresh Dynamo loads it (AOTAutograd traces nothing, coil compiles
    nothing); its forward and backward replay CUDA graphs by the same plans, the
    backward's recordings in the forward's pool (the PoolSet of the backend call),
    and its steps give the first compile's losses and gradients."""
    import copy

    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path / "coil"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4))
    start = copy.deepcopy(model.state_dict())
    steps: list[list[torch.Tensor]] = []
    plans = []
    for run in range(2):
        torch._dynamo.reset()
        counters.clear()
        model.load_state_dict(start)
        before = len(fake_cuda_models)
        f = torch.compile(model, backend="coil", options={"cuda_graphs": True, "aot_cache_nodes": 0})
        got: list[torch.Tensor] = []
        for k in range(3):  # a new batch each step: copied in, the recordings replayed
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(k))
            model.zero_grad(set_to_none=True)
            loss = f(x).square().mean()
            loss.backward()
            got += [loss.detach().clone()] + [p.grad.clone() for p in model.parameters()]
        steps.append(got)
        aot = dict(counters["aot_autograd"])
        assert not aot.get("autograd_cache_bypass"), aot
        if run == 0:
            assert aot.get("autograd_cache_saved") == 1 and counters["coil"]["compiled"] == 2, aot
        else:
            assert aot.get("autograd_cache_hit") == 1 and counters["coil"]["aot_cache_hits"] == 2, aot
        made = {g.kind: g for g in fake_cuda_models[before:]}
        assert sorted(made) == ["backward", "forward"]
        fw, bw = made["forward"], made["backward"]
        assert fw.off is None and bw.off is None and fw.pools is bw.pools
        assert fw.recordings and bw.recordings and bw.recordings[0].pool is fw.recordings[0].pool
        assert all(r.graph.replays >= 1 for g in (fw, bw) for r in g.recordings)
        plans.append({kind: (g.static, g.written) for kind, g in made.items()})
    assert plans[0] == plans[1]
    torch.testing.assert_close(steps[1], steps[0], rtol=0, atol=0)


@pytest.mark.cuda
@cuda
def test_a_warm_start_on_cuda_replays_graphs_loaded_through_aotautograds_cache(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The same on a GPU, with real CUDA graphs: the second compile loads both
    graphs through AOTAutograd's cache, records the forward and the backward (the
    backward in the forward's pool) and gives the first compile's results."""
    import copy

    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path / "coil"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                torch.nn.Linear(128, 10)).cuda()
    start = copy.deepcopy(model.state_dict())
    steps: list[list[torch.Tensor]] = []
    for run in range(2):
        torch._dynamo.reset()
        counters.clear()
        caplog.clear()
        model.load_state_dict(start)
        f = torch.compile(model, backend="coil", options={"cuda_graphs": True, "aot_cache_nodes": 0})
        got: list[torch.Tensor] = []
        with caplog.at_level(logging.INFO, logger="coil"):
            for k in range(4):
                x = torch.randn(32, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(k))
                model.zero_grad(set_to_none=True)
                loss = f(x).square().mean()
                loss.backward()
                got += [loss.detach().clone()] + [p.grad.clone() for p in model.parameters()]
        steps.append(got)
        key = "autograd_cache_saved" if run == 0 else "autograd_cache_hit"
        assert counters["aot_autograd"].get(key) == 1, dict(counters["aot_autograd"])
        assert "forward graph recorded into a CUDA graph" in caplog.text, caplog.text
        assert "backward graph recorded into a CUDA graph" in caplog.text, caplog.text
        assert "pool 0 (recording 2 in it)" in caplog.text, caplog.text
    assert counters["coil"]["aot_cache_hits"] == 2
    torch.testing.assert_close(steps[1], steps[0])
