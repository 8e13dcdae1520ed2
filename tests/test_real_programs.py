"""Real programs that broke coil (issue 14, items 1-6 and 8), each kept as a test:
every one ran eagerly and failed or gave a wrong answer through coil."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.ir.printer import show
from tests_helpers import target_available

TARGETS = ["reference", "cpp"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def compiled(fn, target, **options):
    torch._dynamo.reset()
    return torch.compile(fn, backend="coil", options={"target": target, "graph_cache": False, **options})


def _step(model, inputs, call=None):
    """The output of `call` (default: the model) and, after
    out.square().sum().backward(), every gradient of the model by name."""
    out = (model if call is None else call)(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.square().sum().backward()
    got = {"output": out.detach()}
    got.update({name: p.grad for name, p in model.named_parameters()})
    got.update({f"input {i}": x.grad for i, x in enumerate(inputs) if x.requires_grad})
    return got


def grads_match(module, make_inputs, target, fp64_multiplier=None, **tol):
    """One forward and backward of `module` through coil and eagerly, from the same
    weights and inputs: outputs and every gradient agree (within `tol`).  With
    `fp64_multiplier` (half types, where rounding differs by design: a fused
    kernel keeps float32 where eager rounds each op, and the backward recomputes
    what the forward stored), each agrees with a float64 run at least within that
    multiple of eager's own error (its RMSE), as Inductor's accuracy checks judge."""
    torch.manual_seed(0)
    ref = module()
    ours = module()
    ours.load_state_dict(ref.state_dict())
    inputs = make_inputs()
    copy = lambda xs, **k: [x.detach().clone().to(**k).requires_grad_(x.requires_grad) for x in xs]  # noqa: E731
    want = _step(ref, copy(inputs))
    got = _step(ours, copy(inputs), compiled(ours, target))
    if fp64_multiplier is None:
        for name, w in want.items():
            torch.testing.assert_close(got[name], w, msg=lambda m, name=name: f"{name}: {m}", **tol)
        return
    exact = module()
    exact.load_state_dict(ref.state_dict())
    truth = _step(exact.double(), copy(inputs, dtype=torch.float64))
    for name, w in want.items():
        err_eager = float((w.double() - truth[name]).square().mean().sqrt())
        err_coil = float((got[name].double() - truth[name]).square().mean().sqrt())
        assert err_coil <= fp64_multiplier * err_eager + 1e-6, (name, err_coil, err_eager)


# ---- 1. a view of an input at another storage offset -------------------------------

@pytest.mark.parametrize("target", TARGETS + ["triton"])
def test_input_views_follow_the_inputs_storage_offset(target):
    """q, k, v of one tensor: the graph compiled for q is called with k; x.t() feeds
    an extern through a view, which must start at k's offset, not q's."""
    if not target_available(target):
        pytest.skip(f"{target} backend not built")
    proj = lambda x, w: x.t() @ w  # noqa: E731
    w = torch.randn(16, 16)
    q, k, v = torch.randn(3, 16, 16).unbind(0)
    cf = compiled(proj, target)
    for x in (q, k, v, q):
        torch.testing.assert_close(cf(x, w), proj(x, w))


@pytest.mark.parametrize("target", TARGETS + ["triton"])
def test_kernels_read_inputs_at_any_storage_offset(target):
    """Compiled for a row at offset 16, called with rows at offsets 0 and 32."""
    if not target_available(target):
        pytest.skip(f"{target} backend not built")
    f = lambda x: (x * 2 + 1, x.view(4, 4).t().contiguous())  # noqa: E731
    base = torch.randn(4, 16)
    c = coil.compile_graph(make_fx(f)(base[1]), [base[1]], coil.Options(target=target, graph_cache=False))
    for row in (base[1], base[0], base[3]):
        for got, want in zip(c(row), f(row)):
            torch.testing.assert_close(got, want)


def test_a_view_of_an_input_is_placed_from_the_inputs_own_offset():
    """The wrapper's view line says where its storage starts: from its base's own
    offset (an input), not at an offset fixed at compile time."""
    proj = lambda x, w: (x.t() @ w,)  # noqa: E731
    q = torch.randn(3, 16, 16)[1]
    w = torch.randn(16, 16)
    program = coil.default_pipeline().run(make_fx(proj)(q, w), [q, w], until="wrap", options=coil.Options(target="cpp"))
    text = show(program)
    assert "reinterpret_tensor(x_1 at x_1+0) float32[16, 16] stride=[1, 16], offset=256 cpu" in text, text
    source = coil.compile_graph(make_fx(proj)(q, w), [q, w], coil.Options(target="cpp", graph_cache=False)).source
    assert "= reinterpret_view(x_1, (16, 16), (1, 16), 0)" in source  # 0 from x_1's own offset


@pytest.mark.parametrize("target", TARGETS + ["triton"])
def test_returned_views_are_views_only_where_the_caller_reaches_their_storage(target):
    """A returned view of an input or of a returned buffer is made with as_strided
    (eager's link to its base, its version counter); one over storage only the
    graph reaches (a saved activation, an extern's fresh result) is a tensor over
    that storage, as Inductor's are, which AOTAutograd saves without a detach."""
    if not target_available(target):
        pytest.skip(f"{target} backend not built")

    def f(x, w):
        y = x * 2
        hidden = x + 1
        return y, y.t(), x.t(), (x @ w).t(), hidden.t()

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(f)(x, w)
    program = coil.default_pipeline().run(gm, [x, w], until="wrap", options=coil.Options(target=target))
    text = show(program)
    views = [ln for ln in program.lines if type(ln).__name__ == "ReinterpretView"]
    mm = next(ln.name for ln in program.lines if getattr(ln, "kernel", "") == "aten.mm.default")
    y = program.lines[-1].names[0]
    assert {ln.base: ln.as_view for ln in views} == {"x_1": True, y: True, mm: False}, text
    assert f"= view(x_1 at x_1+0)" in text and f"= view({y})" in text and f"= reinterpret_tensor({mm}" in text
    outs = coil.compile_graph(gm, [x, w], coil.Options(target=target, graph_cache=False))(x, w)
    for got, want in zip(outs, f(x, w)):
        torch.testing.assert_close(got, want)
    assert outs[1]._base is outs[0] and outs[2]._base is x
    assert not outs[3]._is_view() and not outs[4]._is_view()
    assert outs[3].untyped_storage().data_ptr() == outs[3].data_ptr()  # over the mm's own storage


def test_a_saved_activation_view_keeps_autograd_checks_where_the_caller_holds_its_base():
    """Training through torch.compile: a forward that returns y and saves a view of
    it for the backward; writing into y in place before backward raises as in eager
    (the saved view shares y's version counter).  Made as a tensor over y's storage,
    the view would let the backward read the new y without a word."""
    def f(x, w):
        y = x @ w
        return y, (y.t() @ w).sum()  # the forward saves y.t() for w's gradient

    for fn in (f, torch.compile(f, backend="coil")):
        x = torch.randn(8, 8, requires_grad=True)
        w = torch.randn(8, 8, requires_grad=True)
        y, loss = fn(x, w)
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


# ---- 2. scalar tensors on the CPU, and messages that name the mismatch -------------

def test_input_mismatch_messages_name_what_differs():
    f = lambda x: (x + 1,)  # noqa: E731
    x = torch.randn(4, 3)
    c = coil.compile_graph(make_fx(f)(x), [x], coil.Options(target="cpp", graph_cache=False))
    with pytest.raises(coil.CoilError, match=r"compiled for size \[4, 3\], called with size \[4, 4\]"):
        c(torch.randn(4, 4))
    with pytest.raises(coil.CoilError, match="compiled for dtype torch.float32, called with torch.float16"):
        c(x.half())
    with pytest.raises(coil.CoilError, match=r"compiled for strides \[3, 1\], called with \[1, 4\]"):
        c(torch.randn(3, 4).t())
    with pytest.raises(coil.CoilError, match="compiled for device cpu, called with meta"):
        c(x.to("meta"))


class Block(torch.nn.Module):
    """A transformer block whose attention is F.scaled_dot_product_attention."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


@pytest.mark.parametrize("target", TARGETS)
def test_training_a_block_with_sdpa(target):
    grads_match(Block, lambda: [torch.randn(2, 16, 64, requires_grad=True)], target, atol=2e-4, rtol=2e-4)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_a_block_with_sdpa_on_cuda(dtype):
    """The backward of CUDA attention takes its RNG seed and offset as CPU scalar
    tensors, where the fake tensors said cuda: eager takes them, and so must coil."""
    def block() -> torch.nn.Module:
        return Block().to("cuda", dtype)

    inputs = lambda: [torch.randn(4, 128, 64, device="cuda", dtype=dtype, requires_grad=True)]  # noqa: E731
    if dtype == torch.float32:
        grads_match(block, inputs, "triton", atol=2e-3, rtol=2e-3)
    else:
        grads_match(block, inputs, "triton", fp64_multiplier=3.0)


@pytest.mark.parametrize("target", TARGETS)
def test_training_a_block_in_bfloat16_is_as_close_to_float64_as_eager(target):
    """In bfloat16 each gradient is judged against a float64 run: coil's error
    within three times eager's."""
    if not target_available(target):
        pytest.skip(f"{target} backend not built")
    grads_match(lambda: Block().to(torch.bfloat16),
                lambda: [torch.randn(2, 32, 64, dtype=torch.bfloat16, requires_grad=True)], target,
                fp64_multiplier=3.0)


@cuda
@pytest.mark.cuda
def test_a_cpu_scalar_tensor_is_taken_for_a_cuda_one():
    """compiled for a CUDA scalar read by a kernel, called with a CPU scalar."""
    f = lambda x, s: (x * s,)  # noqa: E731
    x, s = torch.randn(8, device="cuda"), torch.tensor(3.0, device="cuda")
    c = coil.compile_graph(make_fx(f)(x, s), [x, s], coil.Options(target="triton", graph_cache=False))
    torch.testing.assert_close(c(x, torch.tensor(2.0))[0], x * 2)


def _causal_mask(device):
    """What transformers' mask functions make from sizes alone: no tensor comes in."""
    i = torch.arange(64, device=device)
    return (i.unsqueeze(0) <= i.unsqueeze(1)).expand(4, 1, 64, 64)


def _devices(ir) -> set[str]:
    import re

    return set(re.findall(r"device='([^']*)'", repr(ir)))


def test_a_graph_that_takes_no_tensor_computes_where_its_tensors_are_made():
    """Wav2Vec2's training step on the H200: the graph building its attention mask
    takes no tensor, so coil took it for a CPU graph, put every buffer on the CPU
    and handed the mask back there (reduce-overhead: SDPA then met a CPU mask and
    a CUDA query; target triton: "runs kernels in the Triton interpreter").  The
    device is now read from the values the graph makes.  Traced with fake CUDA
    tensors, so that this machine without CUDA lowers it."""
    from coil.passes.lower import compute_device
    from coil.passes.pipeline import resolve_target

    gm = make_fx(lambda: _causal_mask("cuda"), tracing_mode="fake")()
    assert compute_device(gm, []) == "cuda:0"
    assert resolve_target(coil.Options(target="auto"), [], gm).target == "triton"
    program = coil.default_pipeline().run(gm, [], until="wrap", options=coil.Options(target="auto"))
    assert _devices(program) == {"cuda:0"}
    assert {k.device for k in program.kernel_program.specs} == {"cuda:0"}
    # a CPU scalar first among the inputs does not make a CUDA graph a CPU one
    assert compute_device(None, [torch.tensor(2.0), torch.empty(2, device="meta")]) == "cpu"
    assert compute_device(gm, [torch.tensor(2.0)]) == "cuda:0"


@pytest.mark.parametrize("target", TARGETS)
def test_a_mask_made_from_sizes_alone_on_the_cpu(target):
    out = compiled(lambda: _causal_mask("cpu"), target)()
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, _causal_mask("cpu"))


def test_a_graph_mixing_devices_never_moves_an_output():
    """A graph on CUDA computes its ops there, moving CPU tensors over, which is
    right where they flow into CUDA ops (a CPU arange moved to CUDA: one CUDA
    kernel); an output eager leaves on the CPU would come back on CUDA, so such a
    graph is refused when lowered (the Dynamo backend runs it eagerly)."""
    from coil.errors import CoilError

    x = torch.randn(8)
    gm = make_fx(lambda a: (a * 2, torch.arange(8, device="cuda") + 1), tracing_mode="fake")(x)
    with pytest.raises(CoilError, match=r"output 0 \(mul\) is on cpu in eager, computed on cuda:0"):
        coil.default_pipeline().run(gm, [x], until="lower", options=coil.Options(target="triton"))
    gm = make_fx(lambda: (torch.arange(8.) * 2).cumsum(0).to(device=torch.device("cuda", 0)) + 1,
                 tracing_mode="fake")()
    program = coil.default_pipeline().run(gm, [], until="wrap", options=coil.Options(target="auto"))
    assert [k.device for k in program.kernel_program.specs] == ["cuda:0"]


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_cuda_mask_made_from_sizes_alone(mode):
    """The end to end form of the Wav2Vec2 failure: the mask comes back on CUDA, as
    eager's does, and SDPA takes it."""
    q = torch.randn(4, 2, 64, 16, device="cuda")
    torch._dynamo.reset()
    mask = torch.compile(lambda: _causal_mask("cuda"), backend="coil", mode=mode)
    for _ in range(3):
        m = mask()
        assert m.device.type == "cuda"
        torch.testing.assert_close(m, _causal_mask("cuda"))
        torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q, attn_mask=m),
                                   F.scaled_dot_product_attention(q, q, q, attn_mask=_causal_mask("cuda")))


# ---- 3. the backward of nn.MultiheadAttention and nn.TransformerEncoderLayer -------

class SelfAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x)[0]


@pytest.mark.parametrize("target", TARGETS)
def test_multihead_attention_backward(target):
    grads_match(SelfAttention, lambda: [torch.randn(8, 16, 64, requires_grad=True)], target, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_transformer_encoder_layer_backward(target):
    grads_match(lambda: torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True),
                lambda: [torch.randn(8, 16, 64, requires_grad=True)], target, atol=1e-4, rtol=1e-4)


# ---- 4. tensor constants --------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS + ["triton"])
def test_where_with_a_tensor_constant(target):
    if not target_available(target):
        pytest.skip(f"{target} backend not built")
    f = lambda x: torch.where(x > 0, x, torch.tensor(0.5)) * 2  # noqa: E731
    x = torch.randn(64)
    torch.testing.assert_close(compiled(f, target)(x), f(x))


def test_a_tensor_constant_is_an_input_the_module_holds():
    table = torch.arange(6.0).reshape(2, 3)
    f = lambda x: (x + table,)  # noqa: E731
    x = torch.randn(2, 3)
    gm = make_fx(f)(x)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    lowered = show(coil.default_pipeline().run(gm, [x], until="lower", options=coil.Options(target="cpp")))
    assert "_tensor_constant0 = Constant(float32[2, 3] stride=[3, 1] cpu)" in lowered, lowered
    c = coil.compile_graph(gm, [x], coil.Options(target="cpp"))
    torch.testing.assert_close(c(x)[0], x + table)
    # cached, keyed by the constant's bytes (coil/graph_cache.py): another table, another key
    other = table + 1
    gm2 = make_fx(lambda x: (x + other,))(x)
    c2 = coil.compile_graph(gm2, [x], coil.Options(target="cpp"))
    assert c.cache_key is not None and c2.cache_key not in (None, c.cache_key)
    torch.testing.assert_close(c2(x)[0], x + other)


@pytest.mark.parametrize("target", TARGETS)
def test_index_put_with_a_tensor_value(target):
    def f(x, i):
        y = x.clone()
        y[i] = torch.tensor(7.0)
        return y * 2

    x, i = torch.randn(10), torch.tensor([1, 4, 4, 8])
    torch.testing.assert_close(compiled(f, target)(x, i), f(x, i))


@pytest.mark.parametrize("target", TARGETS)
def test_masked_reductions(target):
    f = lambda x, m: (torch.masked.sum(x, 1, mask=m), torch.masked.amax(x, 1, mask=m))  # noqa: E731
    x, m = torch.randn(6, 9), torch.rand(6, 9) > 0.3
    for got, want in zip(compiled(f, target)(x, m), f(x, m)):
        torch.testing.assert_close(got, want)


# ---- 5. complex, float8 and effectful ops run as externs, the rest still fuses ------

def rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as Llama's reference code writes it."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(-2).type_as(x) * 2 + 1


@pytest.mark.parametrize("target", TARGETS + ["triton"])
def test_rotary_embedding_through_complex(target):
    if not target_available(target):
        pytest.skip(f"{target} backend not built")
    x = torch.randn(2, 8, 4, 16)
    freqs = torch.polar(torch.ones(8, 1, 8), torch.randn(8, 1, 8))
    torch.testing.assert_close(compiled(rotary, target)(x, freqs), rotary(x, freqs))


def test_complex_nodes_are_externs_and_the_real_ones_still_fuse():
    x = torch.randn(2, 8, 4, 16)
    freqs = torch.polar(torch.ones(8, 1, 8), torch.randn(8, 1, 8))
    gm = make_fx(rotary)(x, freqs)
    sched = coil.default_pipeline().run(gm, [x, freqs], until="fuse", options=coil.Options(target="cpp"))
    lowered = show(coil.default_pipeline().run(gm, [x, freqs], until="lower", options=coil.Options(target="cpp")))
    assert "Extern aten.mul.Tensor" in lowered  # the complex product
    assert "Extern aten.view_as_real" in lowered
    assert any("mul" in k.name and "add" in k.name for k in sched.kernels), [k.name for k in sched.kernels]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [
    lambda x: torch.fft.rfft(x * 2).abs() + 1,
    lambda x: torch.fft.irfft(torch.fft.rfft(x), n=x.shape[-1]) - x,
    lambda x: (x.to(torch.complex64) * 1j).imag.sin(),
], ids=["rfft", "irfft", "complex_cast"])
def test_complex_programs(target, fn):
    x = torch.randn(4, 32)
    torch.testing.assert_close(compiled(fn, target)(x), fn(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [
    lambda a, b: torch.linalg.inv(a) @ b + 1,
    lambda a, b: torch.linalg.solve(a, b) * 2,
    lambda a, b: torch.linalg.cholesky(a @ a.mT) - 1,
], ids=["inv", "solve", "cholesky"])
def test_linalg_with_error_checks(target, fn):
    a = torch.randn(3, 5, 5) + 5 * torch.eye(5)
    b = torch.randn(3, 5, 2)
    torch.testing.assert_close(compiled(fn, target)(a, b), fn(a, b), atol=1e-4, rtol=1e-4)


def test_linalg_errors_still_raise():
    """The effectful check runs: a singular matrix raises as in eager."""
    f = lambda a: torch.linalg.inv(a) + 1  # noqa: E731
    c = compiled(f, "cpp")
    c(torch.eye(3) * 2)
    with pytest.raises(torch.linalg.LinAlgError):
        c(torch.zeros(3, 3))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_round_trip(target, dtype):
    f = lambda x: (x * 3).to(dtype).to(torch.float32) + 1  # noqa: E731
    x = torch.randn(64)
    torch.testing.assert_close(compiled(f, target)(x), f(x))


# ---- 6. data-dependent output sizes ---------------------------------------------------

def test_a_size_that_depends_on_data_is_refused_at_compile_time():
    f = lambda x: (x[x > 0] * 2,)  # noqa: E731
    x = torch.tensor([1.0, -1, 2, -2])
    with pytest.raises(coil.CoilError, match=r"the size of index's result depends on the values.*mul reads it"):
        coil.compile_graph(make_fx(f)(x), [x], coil.Options(target="cpp", graph_cache=False))


def test_a_size_that_depends_on_data_is_computed_when_nothing_reads_it():
    """Returned as it is, the extern's result has whatever size the data gives."""
    f = lambda x: (x[x > 0], torch.nonzero(x), x * 2)  # noqa: E731
    x = torch.tensor([1.0, -1, 2, -2])
    c = coil.compile_graph(make_fx(f)(x), [x], coil.Options(target="cpp", graph_cache=False))
    for y in (torch.tensor([1.0, 3, 2, -2]), torch.tensor([5.0, -3, -2, -2]), -torch.ones(4)):
        for got, want in zip(c(y), f(y)):
            torch.testing.assert_close(got, want)


# ---- 8. an extern's result in another dtype than its meta function says -------------

@pytest.mark.parametrize("target", TARGETS)
def test_batch_norm_with_update_in_bfloat16(target):
    """The functional op's meta function says float32 running stats; the CPU kernel
    returns bfloat16 ones.  coil converts them, never reads them as float."""
    def f(x, w, b, rm, rv):
        return torch.ops.aten._batch_norm_with_update(x, w, b, rm, rv, 0.1, 1e-5)[0] * 2

    args = [torch.randn(4, 3, 5), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.5]
    args = [a.bfloat16() for a in args]
    ours = [a.clone() for a in args]
    torch.testing.assert_close(compiled(f, target)(*ours), f(*args))
    torch.testing.assert_close(ours[3], args[3])  # running mean, updated in place
    torch.testing.assert_close(ours[4], args[4])


# ---- whole-graph fallback -----------------------------------------------------------

def test_a_graph_coil_cannot_take_runs_eagerly_with_one_warning(caplog, monkeypatch):
    """A higher-order op coil does not take (here torch.cond, taken out of
    passes/higher_order.py's table): the graph runs eagerly, and the warning
    names the reason."""
    from coil.passes import higher_order

    monkeypatch.delitem(higher_order.HIGHER_ORDER, "cond")

    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,)) + 1

    x = torch.randn(8)
    with caplog.at_level(logging.WARNING, logger="coil"):
        torch.testing.assert_close(compiled(f, "cpp", eager_fallback=True)(x), f(x))
    warnings = [r.getMessage() for r in caplog.records if "running it eagerly" in r.getMessage()]
    assert len(warnings) == 1 and "higher-order op cond is not one coil takes" in warnings[0], warnings
    with pytest.raises(Exception, match="higher-order op cond is not one coil takes"):
        compiled(f, "cpp", eager_fallback=False)(x)


def test_repeat_interleave_given_its_output_size_is_not_sized_by_data():
    """Found by the OpInfo suite: with output_size, the result's size is known."""
    f = lambda x, r: (x.repeat_interleave(r, dim=0, output_size=6) * 2,)  # noqa: E731
    x, r = torch.randn(3, 4), torch.tensor([1, 2, 3])
    c = coil.compile_graph(make_fx(f)(x, r), [x, r], coil.Options(target="cpp", graph_cache=False))
    for reps in (r, torch.tensor([3, 3, 0])):
        torch.testing.assert_close(c(x, reps)[0], f(x, reps)[0])


def test_every_target_spells_the_dtypes_lower_gives_kernels():
    """lower sends a node to a kernel only when all its dtypes are in KERNEL_DTYPES:
    each target's type table must cover them, or a kernel would fail to build."""
    from coil.backends.cpp.prelude import STORAGE_TYPES
    from coil.backends.triton.handler import TL_DTYPES
    from coil.passes.lower import KERNEL_DTYPES

    assert KERNEL_DTYPES <= set(STORAGE_TYPES)
    assert KERNEL_DTYPES <= set(TL_DTYPES)
    for dtype in KERNEL_DTYPES:  # and the reference target computes in each
        x = torch.arange(3).to(dtype)
        torch.testing.assert_close(compiled(lambda t: t.flip(0), "reference")(x), x.flip(0))


def _funnel() -> torch.nn.Module:
    from transformers import FunnelConfig, FunnelForMaskedLM

    return FunnelForMaskedLM(FunnelConfig(vocab_size=1000, d_model=64, n_head=4, d_head=16, d_inner=128,
                                          block_sizes=[1, 1], block_repeats=[1, 1], num_decoder_layers=1,
                                          hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0))


def _longformer() -> torch.nn.Module:
    from transformers import LongformerConfig, LongformerForMaskedLM

    return LongformerForMaskedLM(LongformerConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=128, attention_window=8,
                                                  max_position_embeddings=64, hidden_dropout_prob=0.0,
                                                  attention_probs_dropout_prob=0.0, pad_token_id=0))


@pytest.mark.parametrize("build", [_funnel, _longformer], ids=["funnel", "longformer"])
def test_training_steps_of_transformers_models_that_broke_coil(build):
    """Found by bench/probes/model_census.py: Funnel's relative-shift backward read
    past a buffer (an index split dropped a remainder that can be negative: garbage
    gradients on cpp), and Longformer's backward failed AOTAutograd's trace (coil's
    functional copy laid its result out as its source, and a later view of it did
    not hold).  One training step through coil on cpp matches eager's loss and
    gradients."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = build().train()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 1000, (2, 16), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.randint(1, 1000, (2, 16),
                                                                                                  generator=gen)}

    def step(m):
        m.zero_grad(set_to_none=True)
        loss = m(**inputs).loss
        loss.backward()
        m = getattr(m, "_orig_mod", m)  # torch.compile's wrapper: the same parameters
        return loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    want_loss, want = step(copy.deepcopy(model))
    got_loss, got = step(compiled(copy.deepcopy(model), "cpp"))
    torch._dynamo.reset()
    torch.testing.assert_close(got_loss, want_loss)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)


def _tiny_decoder(kind: str) -> torch.nn.Module:
    import transformers

    config = getattr(transformers, f"{kind}Config")(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                                     num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, max_position_embeddings=128,
                                                     pad_token_id=0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return getattr(transformers, f"{kind}ForCausalLM")(config).eval()


def _generate(model: torch.nn.Module, **kwargs) -> Any:
    ids = torch.randint(1, 1000, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                              min_new_tokens=6, do_sample=False, output_scores=True,
                              return_dict_in_generate=True, **kwargs)


@pytest.mark.parametrize("kind, cache", [("Llama", "dynamic"), ("Mistral", "dynamic"), ("Llama", "static")])
def test_greedy_generation_through_coil_matches_eager(kind, cache):
    """Text generation as people compile it (bench/probes/generate_census.py): the
    model's forward compiled over the growing DynamicCache (Dynamo recompiles with
    the length symbolic, and Mistral's sliding-window cache passes a length that
    may be 0), or transformers compiling the decoding step itself over a
    StaticCache.  Every step's scores match eager's and so do the tokens; no graph
    runs eagerly (the tests' fallback is off)."""
    pytest.importorskip("transformers")
    from transformers import CompileConfig

    model = _tiny_decoder(kind)
    kwargs: dict[str, Any] = {}
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    want = _generate(copy.deepcopy(model), **kwargs, **({"disable_compile": True} if cache == "static" else {}))
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    if cache == "static":
        config = CompileConfig(backend="coil", mode=None, options={"target": "cpp", "graph_cache": False})
        config._compile_all_devices = True  # transformers compiles generation on accelerators only, unless told
        kwargs["compile_config"] = config
    else:
        m.forward = torch.compile(m.forward, backend="coil", options={"target": "cpp", "graph_cache": False})
    from torch._dynamo.utils import counters

    counters.clear()
    got = _generate(m, **kwargs)
    compiled = counters["coil"]["compiled"]
    torch._dynamo.reset()
    assert compiled == (1 if cache == "static" else 3)  # prefill, the first step, then every later step
    assert len(got.scores) == len(want.scores) == 6
    for g, w in zip(got.scores, want.scores):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.sequences, want.sequences)


@pytest.mark.parametrize("target", TARGETS)
def test_jagged_nested_tensors_compile(target):
    """A jagged NestedTensor (torch.nested, layout=torch.jagged): AOTAutograd hands
    the graph its ragged dim as a nested-int SymInt input that no dense size uses;
    coil passes it on untouched (before: a TypeError reading its hint).  Forward
    and backward, a linear layer and a layer_norm over the jagged batch."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    parts = [torch.randn(3, 8), torch.randn(5, 8)]
    w, nw = torch.randn(4, 8), torch.randn(4)

    def fn(nt, w, nw):
        y = torch.nn.functional.linear(nt, w).relu()
        return torch.nn.functional.layer_norm(y, (4,), nw) + y.sin()

    def run(f):
        nt = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
        wg = w.clone().requires_grad_()
        out = f(nt, wg, nw)
        out.values().square().sum().backward()
        return [*out.unbind(), wg.grad, *nt.grad.unbind()]

    counters.clear()
    torch.testing.assert_close(run(compiled(fn, target)), run(fn), rtol=1e-4, atol=1e-4)
    assert counters["coil"]["compiled"] == 2 and not counters["coil"]["eager"], dict(counters["coil"])


def _two_dropouts(x, w):
    a = F.dropout(torch.mm(x, w), 0.5, training=True)  # first in the program, behind a matmul
    b = F.dropout(x, 0.5, training=True)  # second, reading only the input: ready first
    return a * 2, b


@pytest.mark.parametrize("target", TARGETS)
def test_random_draws_keep_the_programs_order(target):
    """Reordering for peak memory keeps the externs that draw random numbers in
    the graph's order (before: the input's dropout ran first and took the mask
    eager gave the other; the same seed gave other numbers than eager)."""
    x, w = torch.ones(16, 16), torch.ones(16, 16)
    torch.manual_seed(0)
    want = _two_dropouts(x, w)
    torch._dynamo.reset()
    g = torch.compile(_two_dropouts, backend="coil", options={"target": target, "eager_fallback": False})
    torch.manual_seed(0)
    got = g(x, w)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _router_noise(scores):
    """PhiMoE's sparse mixer, shortened: two exponential draws and a rand_like
    between them that reads what the first draw fed."""
    g1 = torch.empty_like(scores).exponential_().log()
    top = (scores - g1).amax(-1, keepdim=True)
    r = torch.rand_like(top)  # the second draw: after the first row max
    g2 = torch.empty_like(scores).exponential_().log()  # the third
    second = (scores * 2 - g2).amax(-1, keepdim=True)  # same rows as `top`: a fusion candidate
    return top + r, second


@pytest.mark.parametrize("target", TARGETS)
def test_a_kernel_is_never_fused_across_the_order_of_random_draws(target):
    """Two row maxes of one input are fused horizontally unless a draw lies between
    them: the second reads the third draw, the first feeds the second, and one
    kernel would have to run both before and after the second draw.  Before, fuse
    made that kernel, plan_memory's reorderings lost every step after it (a cycle
    of data and draw-order edges) and chose the shorter plan for its smaller peak:
    the wrapper failed its check and the graph ran eagerly (PhiMoE's training)."""
    from coil.ir.fused import FusedKernel
    from coil.ir.printer import show

    scores = torch.randn(32, 4)
    gm = make_fx(_router_noise)(scores)
    opts = coil.Options(target=target, eager_fallback=False)
    fused = coil.default_pipeline().run(gm, [scores], until="fuse", options=opts)
    origins = [{o for n in s.nodes for o in fused.buffer_graph.get(n).origins}
               for s in fused.steps if isinstance(s, FusedKernel)]
    assert not any({"amax", "amax_1"} <= o for o in origins), show(fused)
    assert any(d.verdict.value == "refused" and d.reason == "cycle" and d.direction.value == "horizontal"
               for d in fused.fusion_log), show(fused)
    torch.manual_seed(0)
    want = _router_noise(scores)
    compiled = coil.compile_graph(gm, [scores], opts)
    torch.manual_seed(0)
    got = compiled(scores)
    torch.testing.assert_close(list(got), list(want))


def test_a_reordering_that_leaves_out_steps_is_refused():
    """plan_memory's reorderings are topological orders; one that misses a step (a
    cycle among the steps) is an error, never a plan of a smaller peak."""
    from coil.ir.fused import ExternStep
    from coil.passes.plan_memory import _whole

    steps = [ExternStep("buf0"), ExternStep("buf1"), ExternStep("buf2")]
    assert _whole(steps[::-1], steps) == steps[::-1]
    with pytest.raises(RuntimeError, match=r"\['buf1'\] lie on a cycle"):
        _whole([steps[0], steps[2]], steps)


def test_checkpointed_dropout_trains_with_eagers_masks():
    """A dropout inside a non-reentrant checkpoint (run_and_save_rng_state) and one
    outside it draw in the program's order, in the forward and the recompute."""
    from torch.utils.checkpoint import checkpoint

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)

        def inner(self, h):
            return self.b(F.dropout(F.gelu(self.a(h)), 0.3, training=True))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False) + F.dropout(x, 0.2, training=True)

    torch.manual_seed(0)
    model = Block()
    twin = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend="coil", options={"eager_fallback": False})
    x = torch.randn(6, 8)
    for m in (model, compiled):
        torch.manual_seed(123)
        m(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


def test_a_sparse_embedding_gradient_trains():
    """nn.Embedding(sparse=True): the backward returns a sparse gradient, which the
    joint graph's no-op copy pass skips (before: `Cannot access storage of
    SparseTensorImpl`, raised past the eager fallback)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4, sparse=True)
    twin = copy.deepcopy(emb)
    ids = torch.tensor([[1, 2, 2], [7, 1, 0]])
    emb(ids).sum().backward()
    torch._dynamo.reset()
    torch.compile(lambda i: twin(i).sum(), backend="coil", options={"eager_fallback": False})(ids).backward()
    assert twin.weight.grad.is_sparse
    torch.testing.assert_close(twin.weight.grad.to_dense(), emb.weight.grad.to_dense())


@pytest.mark.parametrize("target", TARGETS)
def test_sanitize_never_poisons_an_input_written_in_place(target):
    """With `sanitize`, a buffer placed in an input's storage (a graph that mutates
    its input) is not poisoned when its name is freed: that storage is the
    caller's (before: the caller's tensor came back all NaN)."""
    def f(v, idx):
        v.index_put_((idx,), torch.ones(idx.shape[0], 2), accumulate=True)
        return v.sum()

    torch._dynamo.reset()
    g = torch.compile(f, backend="coil", options={"target": target, "sanitize": True, "eager_fallback": False})
    v, want = torch.zeros(5, 2), torch.zeros(5, 2)
    idx = torch.tensor([0, 2, 2, 4])
    assert float(g(v, idx)) == float(f(want, idx)) == 8.0
    torch.testing.assert_close(v, want)


class _ChannelsLastBlock(torch.nn.Module):
    """A convolution, BatchNorm and ReLU, a depthwise convolution gating a residual,
    then pooling and a linear layer.  Run channels-last (module and input), its
    pointwise buffers between the convolutions are laid out channels-last, which
    their kernels walk in memory order (realize's walk orders)."""

    def __init__(self, channels: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(channels)
        self.dw = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = y + torch.sigmoid(self.dw(y)) * y
        return self.fc(y.mean(dim=(2, 3)))


@pytest.mark.parametrize("target", TARGETS + ["triton"])
def test_training_a_channels_last_conv_block(target):
    if not target_available(target):
        pytest.skip(f"no {target} target here")
    grads_match(lambda: _ChannelsLastBlock().to(memory_format=torch.channels_last),
                lambda: [torch.randn(2, 3, 9, 7).to(memory_format=torch.channels_last).requires_grad_()],
                target, atol=1e-4, rtol=1e-4)
