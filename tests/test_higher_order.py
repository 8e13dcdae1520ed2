"""Higher-order ops (passes/higher_order.py): torch.cond, while_loop, scan, map,
nested_compile_region (invoke_subgraph), flex_attention and mutating custom ops
(auto_functionalized_v2) compile, with their subgraphs compiled by coil, where
each of them used to send the whole graph to eager."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import coil
from coil.backends.runtime import SubgraphFn, load_module
from coil.errors import CoilError
from coil.ir.printer import show
from golden_util import assert_golden

TARGETS = ["reference", "cpp"]


def forward_graph(fn, *args):
    """The forward graph AOTAutograd makes of fn, and its fake inputs."""
    got = []

    def grab(gm, example_inputs):
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=grab))(*args)
    return got[0]


def compiled(fn, target, dynamic=None):
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(fn, backend="coil", dynamic=dynamic, options={"target": target, "graph_cache": False})


def assert_compiled(graphs=1):
    """Every graph Dynamo made went through coil, none to eager."""
    assert counters["coil"]["compiled"] >= graphs and not counters["coil"]["eager"], dict(counters["coil"])


def cond_fn(x, y):
    return torch.cond(x.sum() > 0, lambda a, b: (a * b).sin(), lambda a, b: (a - b).cos(), (x, y))[0] + 1


# ---- lower: one Extern, its subgraphs arguments ---------------------------------------------


def test_cond_is_one_extern_with_compiled_branches():
    gm, inputs = forward_graph(cond_fn, torch.randn(8, 16), torch.randn(8, 16))
    ir = coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target="cpp"))
    assert_golden("higher_order_cond_lower.txt", show(ir))


def test_flex_attention_keeps_its_score_mod_as_fx_and_its_tuples():
    """flex_attention vmaps its score_mod: that subgraph stays an FX graph.  Its block
    mask is a Python tuple and its kernel options a dict, printed as such."""
    from torch.nn.attention.flex_attention import flex_attention

    def fn(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q, kv: torch.where(q >= kv, s, -float("inf")))

    gm, inputs = forward_graph(fn, *(torch.randn(1, 2, 32, 8) for _ in range(3)))
    text = show(coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target="cpp")))
    line = next(ln for ln in text.splitlines() if "higher_order.flex_attention" in ln)
    assert "subgraph(sdpa_score0, eager)" in line and "subgraph(sdpa_mask0, eager)" in line, line
    assert "{'BACKEND': 'AUTO'" in line and ", subgraph(sdpa_mask0, eager))" in line, line


def test_an_unknown_higher_order_op_is_refused_by_name():
    gm, inputs = forward_graph(cond_fn, torch.randn(4), torch.randn(4))
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond)
    node.target = torch.ops.higher_order.run_const_graph  # a higher-order op coil does not take
    with pytest.raises(CoilError, match="higher-order op run_const_graph is not one coil takes"):
        coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target="cpp"))


# ---- the runtime: subgraphs compiled once, a failed one runs as FX ----------------------------


def test_branches_are_coil_compiled_modules():
    gm, inputs = forward_graph(cond_fn, torch.randn(8, 16), torch.randn(8, 16))
    fn = coil.compile_graph(gm, inputs, coil.Options(target="cpp", graph_cache=False))
    assert "higher_order_cond(buf1, subgraph_true_graph_0, subgraph_false_graph_0, (arg0_1, arg1_1))" in fn.source
    for name in ("subgraph_true_graph_0", "subgraph_false_graph_0"):
        sub = fn.namespace[name]
        assert isinstance(sub, SubgraphFn) and "def call(args)" in sub.compiled.source
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    for sign in (1, -1):
        torch.testing.assert_close(fn(sign * x.abs(), y)[0], cond_fn(sign * x.abs(), y))


def test_a_subgraph_that_does_not_compile_runs_as_fx(caplog):
    gm, inputs = forward_graph(cond_fn, torch.randn(8, 16), torch.randn(8, 16))
    module = coil.default_pipeline().run(gm, inputs, options=coil.Options(target="cpp", graph_cache=False))

    def refuse(sub):
        raise CoilError(f"no compile of {sub.name} today", stage="lower")

    with caplog.at_level(logging.WARNING, logger="coil"):
        fn = load_module(module, None, refuse)
    assert fn.namespace["subgraph_true_graph_0"] is gm.true_graph_0
    assert "subgraph true_graph_0 of higher_order.cond was not compiled ([lower] no compile of true_graph_0" \
        in caplog.text
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    torch.testing.assert_close(fn(x.abs(), y)[0], cond_fn(x.abs(), y))


def test_cond_and_while_loop_are_not_recorded_into_cuda_graphs():
    from coil.backends.cudagraphs import capture_verdict, graph_facts

    gm, inputs = forward_graph(cond_fn, torch.randn(4), torch.randn(4))
    _, _, syncs = graph_facts(gm, "inference")
    assert syncs == ["higher_order.cond"]
    assert capture_verdict(inputs, frozenset(), frozenset(), syncs) == \
        "higher_order.cond waits for the GPU (the host reads a tensor to choose what runs next)"


# ---- through torch.compile, against eager ------------------------------------------------------


def _while(x, n):
    return while_loop(lambda i, v: i < n, lambda i, v: (i + 1, v * 1.5 + v.sin()),
                      (torch.zeros((), dtype=torch.int64), x))[1]


def _scan(init, xs):
    def comb(c, x):
        n = c * 0.5 + x.tanh()
        return n, n.sin()

    return scan(comb, init, xs)


def _map(xs, y):
    from torch._higher_order_ops.map import map as hop_map

    return hop_map(lambda x, y: x.exp() + y, xs, y)


@torch.compiler.nested_compile_region
def _region(x, w):
    return (x @ w).relu() * 2


def _regions(x, w):
    return _region(_region(x, w), w).sum(1)


def _nested(x, n):
    """A cond inside a loop's body: the body's compile meets the cond's subgraphs."""
    def body(i, v):
        return i + 1, torch.cond(v.sum() > 0, lambda a: a * 0.5 - 1, lambda a: a.cos() + 1, (v,))

    return while_loop(lambda i, v: i < n, body, (torch.zeros((), dtype=torch.int64), x))[1]


CASES = {
    "cond_true": (cond_fn, lambda: (torch.randn(8, 16).abs(), torch.randn(8, 16))),
    "cond_false": (cond_fn, lambda: (-torch.randn(8, 16).abs(), torch.randn(8, 16))),
    "while_loop": (_while, lambda: (torch.randn(4, 4), torch.tensor(3))),
    "scan": (_scan, lambda: (torch.randn(4), torch.randn(6, 4))),
    "map": (_map, lambda: (torch.randn(3, 4, 4), torch.randn(4))),
    "nested_compile_region": (_regions, lambda: (torch.randn(8, 8), torch.randn(8, 8))),
    "cond_in_a_loop": (_nested, lambda: (torch.randn(4, 4), torch.tensor(5))),
}


@pytest.mark.parametrize("target", [*TARGETS, "triton"])  # triton: the interpreter on the CPU (CI)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_eager(case, target):
    fn, make = CASES[case]
    args = make()
    torch.testing.assert_close(compiled(fn, target)(*args), fn(*args))
    assert_compiled()


@pytest.mark.parametrize("target", TARGETS)
def test_flex_attention(target):
    from torch.nn.attention.flex_attention import flex_attention

    def fn(q, k, v):
        causal = lambda s, b, h, q, kv: torch.where(q >= kv, s, -float("inf"))  # noqa: E731
        return flex_attention(q.sin(), k, v, score_mod=causal) * 2

    q, k, v = (torch.randn(2, 2, 64, 16) for _ in range(3))
    torch.testing.assert_close(compiled(fn, target)(q, k, v), fn(q, k, v), rtol=1e-4, atol=1e-4)
    assert_compiled()


@pytest.mark.parametrize("target", TARGETS)
def test_out_dtype_int8_matmul(target):
    """out_dtype(mm, int32, a_int8, b_int8): an int8 matmul accumulating in int32, as
    int8 weight quantization writes it; its scale fuses after it."""
    from torch._higher_order_ops.out_dtype import out_dtype

    def fn(a, b, s):
        return out_dtype(torch.ops.aten.mm.default, torch.int32, a, b).float() * s

    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 127, (8, 16), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 127, (16, 4), dtype=torch.int8, generator=g)
    s = torch.rand(4, generator=g)
    torch.testing.assert_close(compiled(fn, target)(a, b, s), fn(a, b, s))
    assert_compiled()


@torch.library.custom_op("coil_test::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


def _mutations(x, w):
    y = x * 2
    scale_(y, 3.0)  # a temporary nothing else reads: written in place
    z = x.cos()
    scale_(z[:, 1:3], -1.0)  # a slice of one: in place too
    q = x.exp()
    r = q + 1
    scale_(q, 2.0)  # read before by r: cloned
    scale_(w, 0.5)  # an input: cloned, and copied back into the caller's tensor
    return y + 1, z.sum(0), q * r


def test_a_mutating_custom_op_writes_into_temporaries_in_place():
    gm, inputs = forward_graph(_mutations, torch.randn(6, 6), torch.randn(6))
    text = show(coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target="cpp")))
    calls = [ln.split(" = ", 1)[1] for ln in text.splitlines() if "Extern higher_order.auto_functionalized_v2" in ln]
    assert [("_only_clone_these_bases=()" in c, c.split(" -> ")[1].split(" from")[0]) for c in calls] == [
        (True, "tuple mutates ['mul']"), (True, "tuple mutates ['cos']"), (False, "tuple"), (False, "tuple")]
    assert calls[0].startswith("Extern higher_order.auto_functionalized_v2(coil_test.scale_.default, "), calls[0]


@pytest.mark.parametrize("target", TARGETS)
def test_a_custom_op_that_mutates(target):
    """auto_functionalized_v2: on a temporary, on a slice of one, on one read
    elsewhere, on an input; sanitized, so a freed buffer read shows."""
    x = torch.randn(6, 6)
    w1 = torch.randn(6)
    w2 = w1.clone()
    torch._dynamo.reset()
    counters.clear()
    c = torch.compile(_mutations, backend="coil", options={"target": target, "graph_cache": False, "sanitize": True})
    torch.testing.assert_close(c(x, w1), _mutations(x, w2))
    torch.testing.assert_close(w1, w2)  # the input's mutation reaches the caller
    assert_compiled()


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_sizes_through_a_cond(target):
    def fn(x):
        return torch.cond(x.shape[0] > 4, lambda a: a.sin() * a.shape[0], lambda a: a.cos(), (x,))

    c = compiled(fn, target, dynamic=True)
    for n in (6, 3, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(c(x), fn(x))
    assert_compiled()


def _train(fn, params, x, target):
    """fn's output and the gradients of its parameters and input, eager and compiled."""
    out = {}
    for name, run in (("eager", fn), ("coil", compiled(fn, target))):
        for p in params:
            p.grad = None
        xs = x.detach().clone().requires_grad_()
        y = run(xs)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        out[name] = [y.detach(), xs.grad, *(p.grad for p in params)]
    torch.testing.assert_close(out["coil"], out["eager"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_training_through_cond_scan_and_a_region(target):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16, 16) * 0.2)
    _train(lambda x: torch.cond(x.sum() > 0, lambda a: (a @ w).sin(), lambda a: (a * 2).cos() @ w, (x,)),
           [w], torch.randn(8, 16).abs(), target)
    assert_compiled(2)
    v = torch.nn.Parameter(torch.randn(4, 4) * 0.3)

    def rnn(xs):
        def comb(c, x):
            n = (c @ v).tanh() + x
            return n, n * 2

        return scan(comb, torch.zeros(3, 4), xs)[1]

    _train(rnn, [v], torch.randn(5, 3, 4), target)
    assert_compiled(2)
    lin = torch.nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def block(x):
        return torch.nn.functional.gelu(lin(x))

    _train(lambda x: block(block(x) + x), list(lin.parameters()), torch.randn(4, 8), target)
    assert_compiled(2)


def _checkpointed_attention(q, k, v):
    def attn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * 2

    return torch.utils.checkpoint.checkpoint(attn, q, k, v, use_reentrant=False)


def test_checkpointed_attention_hands_out_its_nested_results():
    """Activation checkpointing wraps attention in run_and_save_rng_state, whose
    result is (rng state, the op's tuple): each tensor a MultiOutput at its path."""
    gm, inputs = forward_graph(_checkpointed_attention, *(torch.randn(1, 2, 8, 4, requires_grad=True)
                                                          for _ in range(3)))
    ir = coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target="cpp"))
    assert_golden("higher_order_checkpointed_attention_lower.txt", show(ir))


@pytest.mark.parametrize("target", TARGETS)
def test_training_through_checkpointed_attention(target):
    """Forward and backward both compile (none runs eagerly) and match eager."""
    torch.manual_seed(0)
    k, v = (torch.nn.Parameter(torch.randn(2, 4, 16, 8)) for _ in range(2))
    _train(lambda q: _checkpointed_attention(q, k, v), [k, v], torch.randn(2, 4, 16, 8), target)
    assert_compiled(2)


# ---- property: drawn graphs as the branches of a cond ---------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_drawn_graphs_as_cond_branches_match_eager(target):
    """coil.properties.control_flow.in_cond: a drawn graph and its doubled twin as
    cond's branches; both branches of the compiled graph match eager, sanitized."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from coil.properties import assert_matches_eager, graphs
    from coil.properties.control_flow import flipped, in_cond

    @settings(max_examples=12, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(st.data())
    def check(data):
        drawn = data.draw(in_cond(graphs(max_nodes=5, dtypes=(torch.float32,))))
        fn = coil.compile_graph(drawn.gm, list(drawn.inputs),
                                coil.Options(target=target, graph_cache=False, sanitize=True))
        assert all(isinstance(fn.namespace[f"subgraph_{b}_graph_0"], SubgraphFn) for b in ("true", "false"))
        assert_matches_eager(drawn, fn(*drawn.fresh_inputs()))
        other = flipped(drawn)
        torch.testing.assert_close(list(fn(*other)), list(drawn.gm(*flipped(drawn))), equal_nan=True)

    check()


@pytest.mark.parametrize("target", [*TARGETS, "triton"])
def test_a_user_triton_kernel_through_its_functional_wrapper(target):
    """triton_kernel_wrapper_functional (what AOTAutograd makes of a user's Triton
    kernel), traced with make_fx: a dict-valued Extern (its MultiOutput reads the
    key) whose kwargs are a dict, run here under Triton's interpreter."""
    import os

    import triton
    import triton.language as tl
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_functional
    from torch.fx.experimental.proxy_tensor import make_fx

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton kernel on the CPU: needs TRITON_INTERPRET=1")

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=mask) + tl.load(y_ptr + i, mask=mask), mask=mask)

    kernel, constants = kernel_side_table.add_kernel(add_kernel), kernel_side_table.add_constant_args({"BLOCK": 64})

    def fn(x, y):
        a = x.sin()
        out = torch.zeros_like(a)
        res = triton_kernel_wrapper_functional(
            kernel_idx=kernel, constant_args_idx=constants, grid=[(2, 1, 1)], tma_descriptor_metadata={},
            kwargs={"x_ptr": a, "y_ptr": y, "out_ptr": out, "n": 100}, tensors_to_clone=["out_ptr"])
        return (res["out_ptr"] * 2,)

    x, y = torch.randn(100), torch.randn(100)
    gm = make_fx(fn, tracing_mode="fake")(x, y)
    opts = coil.Options(target=target, graph_cache=False, sanitize=True)
    text = show(coil.default_pipeline().run(gm, [x, y], until="lower", options=opts))
    assert "kwargs={'x_ptr': sin, 'y_ptr': y_1, 'out_ptr': zeros_like, 'n': 100}" in text, text
    assert "MultiOutput triton_kernel_wrapper_functional_proxy['out_ptr']" in text, text
    torch.testing.assert_close(coil.compile_graph(gm, [x, y], opts)(x, y)[0], fn(x, y)[0])
    # its kernel_idx indexes this process's table of kernels: such a graph is never cached
    from coil import graph_cache

    assert graph_cache.graph_key(gm, [x, y], opts.replace(graph_cache=True)) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (Dynamo cannot trace a Triton kernel "
                    "under Triton's CPU interpreter)")
def test_a_user_triton_kernel_inside_the_graph():
    """triton_kernel_wrapper_functional: the user's kernel runs between coil's."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=mask) + tl.load(y_ptr + i, mask=mask), mask=mask)

    def fn(x, y):
        a = x.sin()
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 128),)](a, y, out, a.numel(), BLOCK=128)
        return out * 2

    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    torch.testing.assert_close(compiled(fn, "triton")(x, y), fn(x, y))
    assert_compiled()


def test_a_compiled_cond_calls_its_branch_without_the_ops_dispatch(monkeypatch):
    """output_code.py binds higher_order.cond to runtime.run_cond, which calls the
    branch pred picks (the op's dense implementation) without the higher-order
    op's dispatch, about 40 µs a call on the CPU (a cond of two one-kernel
    branches: 56 -> 16 µs, Inductor 18)."""
    from coil.backends.runtime import aten_op, run_cond

    assert aten_op(torch.ops.higher_order.cond) is run_cond

    def f(x):
        return torch.cond(x.sum() > 0, lambda x: x.sin() * 2, lambda x: x.cos() + 1, (x,))

    x = torch.randn(16)
    gm, inputs = forward_graph(f, x)
    fn = coil.compile_graph(gm, inputs, coil.Options(target="cpp", graph_cache=False))
    want = {s: f(x.abs() * s) for s in (1.0, -1.0)}

    def dispatched(*_a, **_k):
        raise AssertionError("the higher-order op was dispatched")

    monkeypatch.setattr(type(torch.ops.higher_order.cond), "__call__", dispatched)
    for s, w in want.items():
        torch.testing.assert_close(fn(x.abs() * s)[0], w)


def test_a_compiled_while_loop_runs_without_the_ops_dispatch(monkeypatch):
    """runtime.run_while_loop: torch 2.13's dense implementation, without the op's
    dispatch (16 steps of a one-kernel body on the CPU: 163 -> 110 µs, Inductor 72),
    at 0, 1 and 5 steps; with no step it returns fresh tensors, as eager does."""
    from coil.backends.runtime import aten_op, run_while_loop

    assert aten_op(torch.ops.higher_order.while_loop) is run_while_loop

    def looping(n):
        def f(x):
            return while_loop(lambda i, x: i < n, lambda i, x: (i + 1, x * 0.5 + 1), (torch.tensor(0), x))
        return f

    x = torch.randn(8)
    compiled = {}
    for n in (0, 1, 5):
        gm, inputs = forward_graph(looping(n), x)
        compiled[n] = (coil.compile_graph(gm, inputs, coil.Options(target="cpp", graph_cache=False)), looping(n)(x))

    def dispatched(*_a, **_k):
        raise AssertionError("the higher-order op was dispatched")

    monkeypatch.setattr(type(torch.ops.higher_order.while_loop), "__call__", dispatched)
    for n, (fn, want) in compiled.items():
        got = fn(x)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        if n == 0:
            assert got[-1].data_ptr() != x.data_ptr()
