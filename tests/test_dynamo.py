"""End to end through torch.compile(backend="coil")."""

from __future__ import annotations

import re

import pytest
import torch

import coil
from coil.errors import CoilError
from conftest import seed_fn
from tests_helpers import target_available

TARGETS = ["reference", "cpp", "triton"]


_available = target_available


@pytest.mark.parametrize("target", TARGETS)
def test_seed_through_torch_compile(target):
    if not _available(target):
        pytest.skip(f"{target} backend not built")
    torch._dynamo.reset()
    inputs = [torch.randn(64, 128) for _ in range(3)]
    f = torch.compile(seed_fn, backend="coil", options={"target": target})
    torch.testing.assert_close(f(*inputs), seed_fn(*inputs))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(32, 64)
        self.ln = torch.nn.LayerNorm(64)
        self.l2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.ln(self.l1(x)))
        return torch.nn.functional.cross_entropy(self.l2(h), t)


@pytest.mark.parametrize("target", TARGETS)
def test_mlp_forward_backward(target, monkeypatch):
    if not _available(target):
        pytest.skip(f"{target} backend not built")
    torch._dynamo.reset()
    compiled_graphs = []
    import coil.backends.dynamo as dyn

    real = dyn._graph_compiler

    def spy(options, kind, *rest, **kw):
        inner = real(options, kind, *rest, **kw)

        def compile_one(gm, example_inputs):
            compiled_graphs.append(kind)
            return inner(gm, example_inputs)

        return compile_one

    monkeypatch.setattr(dyn, "_graph_compiler", spy)
    torch.manual_seed(0)
    eager, model = MLP(), MLP()
    model.load_state_dict(eager.state_dict())
    x, t = torch.randn(16, 32), torch.randint(0, 10, (16,))
    cm = torch.compile(model, backend="coil", options={"target": target})
    want = eager(x, t)
    want.backward()
    got = cm(x, t)
    got.backward()
    torch.testing.assert_close(got, want)
    for p_eager, p in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, p_eager.grad, rtol=1e-4, atol=1e-5)
    assert compiled_graphs == ["forward", "backward"]


def test_inference_under_no_grad():
    torch._dynamo.reset()
    model = MLP()
    x, t = torch.randn(4, 32), torch.randint(0, 10, (4,))
    cm = torch.compile(model, backend="coil", options={"target": "reference"})
    with torch.no_grad():
        torch.testing.assert_close(cm(x, t), model(x, t))


def test_unknown_option_is_a_clear_error():
    torch._dynamo.reset()
    f = torch.compile(seed_fn, backend="coil", options={"no_such_option": 1})
    with pytest.raises(Exception, match="unknown coil options"):
        f(*[torch.randn(4, 4) for _ in range(3)])


def test_inductors_names_for_coils_options_are_taken():
    from coil.backends.dynamo import coil_options

    assert coil_options({"triton.cudagraphs": True, "max_autotune": True, "combo_kernels": False,
                         "cpp.threads": -1, "target": "cpp"}) == {
        "cuda_graphs": True, "autotune": True, "combo_launches": False, "num_threads": 0, "target": "cpp"}
    assert coil_options({"cpp.threads": 3, "num_threads": 3}) == {"num_threads": 3}
    # two of Inductor's names for one of coil's: on if either is
    assert coil_options({"max_autotune": True, "max_autotune_pointwise": False}) == {"autotune": True}
    assert coil_options({"max_autotune": False, "max_autotune_pointwise": False}) == {"autotune": False}
    with pytest.raises(CoilError, match="triton.cudagraphs=True .* cuda_graphs=False"):
        coil_options({"triton.cudagraphs": True, "cuda_graphs": False})


def test_inductors_fallback_random_is_what_coil_does_anyway():
    """coil's random ops are aten's: with the same seed, the same numbers as eager
    (what Inductor's fallback_random asks for), so the option is left out quietly."""
    import warnings

    from coil.backends.dynamo import coil_options

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, 0.5, True) * 2 + torch.rand_like(x)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert coil_options({"fallback_random": True, "target": "cpp"}) == {"target": "cpp"}
    torch._dynamo.reset()
    x = torch.randn(16, 16)
    torch.manual_seed(3)
    want = f(x)
    g = torch.compile(f, backend="coil", options={"fallback_random": True, "target": "cpp"})
    g(x)
    torch.manual_seed(3)
    assert torch.equal(g(x), want)


def test_inductors_own_options_are_left_out_with_a_warning():
    torch._dynamo.reset()
    args = [torch.randn(4, 4) for _ in range(3)]
    f = torch.compile(seed_fn, backend="coil", options={"epilogue_fusion": False, "shape_padding": True,
                                                         "target": "cpp"})
    with pytest.warns(UserWarning, match=r"coil ignores Inductor's options \['epilogue_fusion', 'shape_padding'\]"):
        got = f(*args)
    torch.testing.assert_close(got, seed_fn(*args))


def test_backend_is_importable_as_coil_backend():
    from coil.backends.dynamo import coil_backend

    assert coil.backend is coil_backend


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_transformer_block_forward_backward(target):
    """LayerNorm, attention as an Extern, a GELU MLP, residuals: loss and every
    gradient equal eager (the backward graph receives saved tensors in the strides
    the forward promised)."""
    if not _available(target):
        pytest.skip(f"{target} backend not built")
    from bench.workloads import Block  # the benchmark's own block, so both test one model

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager, model = Block(32, 4), Block(32, 4)
    model.load_state_dict(eager.state_dict())
    x = torch.randn(2, 8, 32)
    want = eager(x).pow(2).mean()
    want.backward()
    got = torch.compile(model, backend="coil", options={"target": target})(x).pow(2).mean()
    got.backward()
    torch.testing.assert_close(got, want)
    for (name, p_eager), p in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, p_eager.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mlp_forward_backward_cuda():
    """The MLP on CUDA tensors: target auto picks triton; loss and gradients equal eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager, model = MLP().cuda(), MLP().cuda()
    model.load_state_dict(eager.state_dict())
    x, t = torch.randn(16, 32, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    want = eager(x, t)
    want.backward()
    got = torch.compile(model, backend="coil")(x, t)
    got.backward()
    torch.testing.assert_close(got, want)
    for p_eager, p in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, p_eager.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_seed_through_torch_compile_cuda():
    torch._dynamo.reset()
    inputs = [torch.randn(64, 128, device="cuda") for _ in range(3)]
    f = torch.compile(seed_fn, backend="coil")
    torch.testing.assert_close(f(*inputs), seed_fn(*inputs))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_warm_compile_on_triton_skips_aot_autograd(device, tmp_path, monkeypatch):
    """A second compile of an inference graph in an empty Dynamo cache loads its
    Triton kernels through the graph cache's link, without AOTAutograd, and gives
    eager's values (interpreted on the CPU, compiled on CUDA)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not _available("triton"):
        pytest.skip("triton backend not built")
    import torch._dynamo.backends.common as common

    def fn(x, y):
        return torch.softmax(x * 2 + y.t(), -1), (x - y.t()).sum(0)

    x, y = torch.randn(48, 40, device=device), torch.randn(40, 48, device=device)
    options = {"target": "triton", "cache_dir": str(tmp_path)}
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="coil", options=options)(x, y), fn(x, y))
    assert len(list((tmp_path / "graphs").glob("*.link"))) == 1

    def no_aot(**_kwargs):
        raise AssertionError("AOTAutograd ran")

    monkeypatch.setattr(common, "aot_autograd", no_aot)
    torch._dynamo.reset()
    x2, y2 = torch.randn(48, 40, device=device), torch.randn(40, 48, device=device)
    torch.testing.assert_close(torch.compile(fn, backend="coil", options=options)(x2, y2), fn(x2, y2))


def test_training_saves_inputs_and_recomputes_pointwise(monkeypatch):
    """AOTAutograd splits training graphs with the min-cut partitioner, as for
    Inductor: a chain of pointwise ops is recomputed in the backward (fused there)
    instead of its intermediates being stored by the forward and kept alive."""
    graphs = {}
    real = coil.compile_graph

    def spy(gm, inputs, options=None, *a, kind="graph", **k):
        graphs[kind] = gm
        return real(gm, inputs, options, *a, kind=kind, **k)

    monkeypatch.setattr(coil, "compile_graph", spy)
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    fn = lambda a, b: ((a.sin().cos() * b).exp() + 1).sum()  # noqa: E731
    torch._dynamo.reset()
    torch.compile(fn, backend="coil", options={"target": "reference"})(x, w).backward()
    ex, ew = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    fn(x, w).backward()
    torch.testing.assert_close(ex, x.grad)
    torch.testing.assert_close(ew, w.grad)

    def saved(fw):
        (out,) = [n for n in fw.graph.nodes if n.op == "output"]
        return [a for a in out.args[0][1:] if hasattr(a, "op")]

    from functorch.compile import aot_function, default_partition, make_boxed_func

    default_fw = []
    aot_function(fn, fw_compiler=lambda g, i: default_fw.append(g) or make_boxed_func(g),
                 bw_compiler=lambda g, i: make_boxed_func(g), partition_fn=default_partition)(x, w).backward()
    ours = saved(graphs["forward"])
    assert len(ours) < len(saved(default_fw[0])), ([a.name for a in ours], [a.name for a in saved(default_fw[0])])
    assert not any(a.target in (torch.ops.aten.sin.default, torch.ops.aten.cos.default) for a in ours)


def test_a_cpu_graph_under_target_triton_compiles_for_cpp_without_the_interpreter(monkeypatch, caplog, tmp_path):
    """A GPU model's step may hold a graph whose tensors are all on the CPU: with
    target 'triton' and Triton's interpreter off its kernels could not run, so that
    graph is compiled for cpp, and a log line says so.  Where the graph is decided
    by the tensors it makes, not only those it takes: a graph that takes no tensor
    and builds one on CUDA (transformers' attention masks) stays on triton."""
    import logging

    from torch.fx.experimental.proxy_tensor import make_fx

    from coil.backends.dynamo import _target_for_device
    from coil.backends.triton import runtime as triton_runtime

    monkeypatch.setattr(triton_runtime, "interpreter_on", lambda: False)
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    x = torch.randn(8, 16)
    sin = torch.fx.symbolic_trace(lambda a: a.sin())
    opts = coil.Options(target="triton")
    assert _target_for_device(opts, sin, [x]).target == "cpp"
    assert _target_for_device(coil.Options(target="reference"), sin, [x]).target == "reference"
    on_cuda = make_fx(lambda: torch.arange(8, device="cuda") * 2, tracing_mode="fake")()
    on_cpu = make_fx(lambda: torch.arange(8) * 2, tracing_mode="fake")()
    assert _target_for_device(opts, on_cuda, []).target == "triton"
    assert _target_for_device(opts, on_cpu, []).target == "cpp"

    fn = lambda a: (a.sin() * 2 + 1).sum(-1)  # noqa: E731
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="coil"):
        out = torch.compile(fn, backend="coil", options={"target": "triton"})(x)
    torch.testing.assert_close(out, fn(x))
    assert "compiled for target 'cpp'" in caplog.text

    monkeypatch.setattr(triton_runtime, "interpreter_on", lambda: True)  # the interpreter on: triton it is
    assert _target_for_device(opts, sin, [x]).target == "triton"


def test_buffer_updates_are_written_by_the_graph(tmp_path):
    """AOTAutograd keeps a graph's writes into its buffers in the graph
    (keep_inference_input_mutations, as Inductor asks for): BatchNorm's running
    statistics and step count are updated by the compiled forward itself, not
    copied in after it by AOTAutograd's wrapper (under CUDA graphs those copies
    would run outside the recording, each a launch from the host), and they
    match eager's after every step.  The kernels computing them store them into
    the buffers (plan_memory's write-back): no copy_ is left."""
    import copy

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    ref = copy.deepcopy(m)
    torch._dynamo.reset()
    f = torch.compile(m, backend="coil", options={"target": "cpp", "debug_dir": str(tmp_path)})
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8)
        f(x).sum().backward()
        ref(x).sum().backward()
        for (name, b), (_, rb) in zip(m.named_buffers(), ref.named_buffers()):
            torch.testing.assert_close(b, rb, msg=name)
    forward = next(tmp_path.glob("*forward*/output_code.py")).read_text()
    assert "copy_" not in forward, forward
    # mean, var, num_batches_tracked: each written by its kernel in place
    assert len(re.findall(r"buf\d+ = primals_\d+  # in place", forward)) == 3, forward
    plan = next(tmp_path.glob("*forward*/05_plan_memory.txt")).read_text()
    assert plan.count("(elided: its source was written into the input in place)") == 3, plan


def test_a_backward_graph_run_eagerly_reshapes_where_it_viewed():
    """A backward graph coil cannot compile runs eagerly with its views as
    reshapes: a tensor the forward saved (when the forward ran eagerly too) need
    not have the strides the graph's views were traced with, and torch's own
    aot_eager failed LongT5's blocked attention so at a second length."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from coil.backends.dynamo import eager_backward

    gm = make_fx(lambda t: torch.ops.aten.view.default(t, [12]) * 2)(torch.randn(3, 4))
    x = torch.randn(4, 3).t()  # the same sizes, strides no view can flatten
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        gm(x)
    torch.testing.assert_close(eager_backward(gm)(x), x.reshape(12) * 2)
    plain = make_fx(lambda t: t * 2)(torch.randn(3))
    assert eager_backward(plain) == plain.forward  # nothing to change: the graph as it is


def test_a_training_graph_with_effect_tokens_reports_the_strides_aot_expects() -> None:
    """linalg.solve's forward checks its errors through `with_effects`, so the
    graph takes and returns an effect token first.  AOTAutograd's slice of the
    saved activations does not count tokens (Inductor unlifts them; coil keeps
    them): the strides coil reported were one place off, and AOTAutograd's
    backward compile raised IndexError."""
    torch._dynamo.reset()
    a, b = torch.randn(5, 5) + 5 * torch.eye(5), torch.randn(5)
    g = torch.compile(torch.linalg.solve, backend="coil", options={"target": "cpp"})
    got_a, got_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    want_a, want_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    got, want = g(got_a, got_b), torch.linalg.solve(want_a, want_b)
    torch.testing.assert_close(got, want)
    cot = torch.randn(5)
    torch.testing.assert_close(torch.autograd.grad(got, (got_a, got_b), cot),
                               torch.autograd.grad(want, (want_a, want_b), cot))
