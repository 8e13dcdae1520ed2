"""Compiled optimizer steps and the `_foreach_*` ops (passes/lowerings/foreach.py).

Before: every `_foreach_*` op of torch.optim's multi-tensor step was an Extern
call, and each of the parameters' and states' write-backs one more `copy_`: a
compiled AdamW step over a 4-layer encoder (48 tensors) took 5.4 ms on the CPU
against eager's 1.9 and Inductor's 0.9.  Now each foreach op is one per-tensor op
per element, the chain of one parameter fuses into one kernel that writes the
parameter and its state in place, and the C++ target computes the bias
corrections of the 0-d step count once per call (LoopNest.invariants) where it
called powf twice per element.  bench/probes/optimizer_step.py measures it."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.ir.lowered import Extern
from coil.ir.printer import show
from coil.passes.lower import FxGraph, _spans_devices, ensure_meta
from tests_helpers import run_until, target_available


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(), torch.nn.LayerNorm(20),
                               torch.nn.Linear(20, 6))


def _steps_match(make_opt, target: str, steps: int = 3, whole_step: bool = False,
                 extra: dict | None = None) -> None:
    """`steps` optimizer steps, eager and with the step (or the whole training step)
    compiled by coil, from the same weights and data: parameters and every tensor
    of the optimizer's state agree with eager's, or are at most 4x as far as
    eager's from a float64 run's (a fused step rounds otherwise: RMSprop's centered
    `square_avg - grad_avg ** 2` cancels, and Inductor's step is as far).  `extra`:
    more of coil's options."""
    ref, ours, exact = _model(), _model(), _model().double()
    o_ref, o_ours, o_exact = make_opt(ref.parameters()), make_opt(ours.parameters()), make_opt(exact.parameters())
    torch._dynamo.reset()
    opts = {"target": target, "graph_cache": False, **(extra or {})}

    def train(m, o, x):
        o.zero_grad(set_to_none=True)
        loss = m(x).square().mean()
        loss.backward()
        o.step()
        return loss

    step = torch.compile(o_ours.step, backend="coil", options=opts)
    whole = torch.compile(train, backend="coil", options=opts)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 12, generator=g)
        want = train(ref, o_ref, x)
        train(exact, o_exact, x.double())
        if whole_step:
            got = whole(ours, o_ours, x)
            torch.testing.assert_close(got, want)
        else:
            o_ours.zero_grad(set_to_none=True)
            ours(x).square().mean().backward()
            step()
    pairs = [(name, q, p, e) for (name, p), q, e in zip(ref.named_parameters(), ours.parameters(), exact.parameters())]
    for k, (s_ref, s_ours, s_exact) in enumerate(zip(o_ref.state.values(), o_ours.state.values(),
                                                     o_exact.state.values())):
        pairs += [(f"state {k} {key}", s_ours[key], v, s_exact[key]) for key, v in s_ref.items()
                  if isinstance(v, torch.Tensor)]
    for name, got, want, best in pairs:
        if torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            continue
        ours_off = (got.double() - best).abs().max().item()
        eager_off = (want.double() - best).abs().max().item()
        assert ours_off <= 4 * eager_off + 1e-7, f"{name}: {ours_off} from float64, eager {eager_off}"


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=True),
    "adamw_for_loop": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, foreach=False),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=0.01),
    "radam": lambda ps: torch.optim.RAdam(ps, lr=0.01),
    "rprop": lambda ps: torch.optim.Rprop(ps, lr=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_compiled_optimizer_step_matches_eager_on_cpp(name: str) -> None:
    _steps_match(OPTIMIZERS[name], "cpp")


@pytest.mark.parametrize("target", ["reference", "triton"])
def test_a_compiled_adam_step_matches_eager(target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} not available")
    _steps_match(OPTIMIZERS["adamw_foreach"], target, steps=2)


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_a_whole_training_step_with_its_optimizer_compiles(target: str) -> None:
    _steps_match(OPTIMIZERS["adam"], target, whole_step=True)


def test_clip_grad_norm_compiles() -> None:
    """clip_grad_norm_ (foreach norm, stack, foreach mul by a 0-d tensor)."""
    ref, ours = _model(), _model()
    x = torch.randn(5, 12)
    for m in (ref, ours):
        m(x).square().sum().backward()

    def clip(ps):
        return torch.nn.utils.clip_grad_norm_(ps, 0.1)

    want = clip(list(ref.parameters()))
    torch._dynamo.reset()
    got = torch.compile(clip, backend="coil", options={"target": "cpp", "graph_cache": False})(list(ours.parameters()))
    torch.testing.assert_close(got, want)
    for p, q in zip(ref.parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


def _lists(n: int = 3, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 5), (7,), ()][:n]
    return [[torch.rand(s, generator=g) + 0.5 for s in shapes] for _ in range(3)]


aten = torch.ops.aten
# (name, fn of three lists a, b, c): every decomposed family and overload
FOREACH_CASES = {
    "unary": lambda a, b, c: aten._foreach_sqrt.default(a) + aten._foreach_lgamma.default(b)
    + aten._foreach_sign.default(c) + aten._foreach_zero.default(a),
    "unary_newer": lambda a, b, c: aten._foreach_clone.default(b) + aten._foreach_max.default(c),
    "binary_list": lambda a, b, c: aten._foreach_add.List(a, b, alpha=2) + aten._foreach_div.List(a, b)
    + aten._foreach_pow.List(a, b) + aten._foreach_maximum.List(a, c) + aten._foreach_clamp_min.List(a, b),
    "binary_scalar": lambda a, b, c: aten._foreach_sub.Scalar(a, 0.5) + aten._foreach_pow.Scalar(b, 3)
    + aten._foreach_minimum.Scalar(c, 0.9) + aten._foreach_clamp_max.Scalar(a, 1.0),
    "binary_scalar_list": lambda a, b, c: aten._foreach_mul.ScalarList(a, [2.0, -1.0, 0.5])
    + aten._foreach_maximum.ScalarList(b, [0.7, 1.0, 1.2]),
    "binary_tensor": lambda a, b, c: aten._foreach_mul.Tensor(a, c[2]) + aten._foreach_add.Tensor(b, c[2], alpha=3),
    "pow_scalar_and_tensor": lambda a, b, c: aten._foreach_pow.ScalarAndTensor(0.9, a),
    "pointwise3": lambda a, b, c: aten._foreach_addcmul.Scalar(a, b, c, 0.5)
    + aten._foreach_addcdiv.ScalarList(a, b, c, [1.0, 2.0, 3.0]),
    "lerp": lambda a, b, c: aten._foreach_lerp.Scalar(a, b, 0.3) + aten._foreach_lerp.ScalarList(a, b, [0.1, 0.2, 0.3])
    + aten._foreach_lerp.List(a, b, c),
    "copy_norm": lambda a, b, c: aten._foreach_copy.default(a, b) + aten._foreach_norm.Scalar(c, 3),
}


# ops newer than some torch coil runs on (torch 2.11 on the device has no `_foreach_clone`)
NEWER_FOREACH_OPS = {"unary_newer": ("_foreach_clone", "_foreach_max")}


@pytest.mark.parametrize("case", sorted(FOREACH_CASES))
def test_foreach_ops_lower_to_kernels_and_match_eager(case: str) -> None:
    missing = [name for name in NEWER_FOREACH_OPS.get(case, ()) if not hasattr(aten, name)]
    if missing:
        pytest.skip(f"this torch has no {missing}")
    fn = FOREACH_CASES[case]
    a, b, c = _lists()
    gm = make_fx(lambda a, b, c: tuple(fn(a, b, c)))(a, b, c)
    assert any("_foreach" in str(n.target) for n in gm.graph.nodes)
    flat = [*a, *b, *c]

    def flat_fn(*xs):
        return tuple(fn(list(xs[0:3]), list(xs[3:6]), list(xs[6:9])))

    gm = make_fx(flat_fn)(*flat)
    lowered = run_until(flat_fn, flat, "lower")
    externs = [n.kernel for n in lowered.nodes if isinstance(n, Extern)]
    assert not any("_foreach" in k for k in externs), externs  # lgamma is an Extern of its own
    for target in ("reference", "cpp"):
        got = coil.compile_graph(gm, flat, coil.Options(target=target, graph_cache=False))(*flat)
        for k, (x, y) in enumerate(zip(got, flat_fn(*flat))):
            torch.testing.assert_close(x, y, msg=lambda m, k=k: f"{target} output {k}: {m}")


def test_the_device_rule_tells_a_cpu_step_count_from_the_graphs_device() -> None:
    """A CUDA optimizer's step counts may live on the CPU: lower decomposes a
    foreach op only where `_spans_devices` finds every tensor of the call on the
    graph's device, else the op stays an Extern.  This checks the rule on CPU
    tensors against a CUDA graph's device name; no CUDA graph has run it."""
    steps = [torch.tensor(1.0), torch.tensor(2.0)]
    gm = make_fx(lambda a, b: tuple(aten._foreach_pow.ScalarAndTensor(0.9, [a, b])))(*steps)
    vals = ensure_meta(FxGraph(gm, tuple(steps)))
    node = next(n for n in gm.graph.nodes if "_foreach" in str(n.target))
    assert _spans_devices(node, vals, "cuda:0")
    assert not _spans_devices(node, vals, "cpu")


def test_an_adam_steps_bias_correction_is_computed_once_per_call() -> None:
    """`p - lr * m / sqrt(1 - 0.999 ** step)` with a 0-d step count: the C++ nest
    computes the invariant once, before its loops; the loop calls no powf."""
    p, m, step = torch.randn(4096), torch.randn(4096), torch.tensor(3.0)

    def fn(p, m, step):
        return (p - 0.01 * m / torch.sqrt(1 - torch.pow(0.999, step)),)

    gm = make_fx(fn)(p, m, step)
    program = run_until(fn, [p, m, step], "schedule_kernels", target="cpp")
    text = show(program)
    assert "invariant 0, once per call" in text, text
    compiled = coil.compile_graph(gm, [p, m, step], coil.Options(target="cpp", graph_cache=False))
    kernel = compiled.source[compiled.source.find('extern "C"'):]
    loop = kernel[kernel.find("for ("):]
    assert "const float inv" in kernel[:kernel.find("for (")] and "coil_pow" not in loop, kernel[:1500]
    torch.testing.assert_close(compiled(p, m, step)[0], fn(p, m, step)[0])


def test_integer_divisions_are_never_hoisted() -> None:
    """`x + c // d` of 0-d integers stays in the loop (hoisted, an integer division
    the loop would never reach could trap); `x + c / d` of floats is hoisted."""
    x = torch.arange(64)
    c, d = torch.tensor(7), torch.tensor(2)
    for fn, hoisted in ((lambda x, c, d: (x + c // d,), False),
                        (lambda x, c, d: (x.float() + torch.sqrt(c.float() / d.float()),), True)):
        program = run_until(fn, [x, c, d], "schedule_kernels", target="cpp")
        assert any(s.nest is not None and s.nest.invariants for s in program.specs) == hoisted, show(program)
        got = coil.compile_graph(make_fx(fn)(x, c, d), [x, c, d], coil.Options(target="cpp", graph_cache=False))
        torch.testing.assert_close(got(x, c, d)[0], fn(x, c, d)[0])


def test_the_verifier_refuses_an_invariant_that_reads_a_loop_variable() -> None:
    import attrs

    from coil.ir.expr import Load, walk
    from coil.ir.verify_kernel import verify_kernel_program

    p, m, step = torch.randn(64), torch.randn(64), torch.tensor(3.0)
    program = run_until(lambda p, m, step: (p * m / torch.sqrt(step),), [p, m, step], "schedule_kernels",
                        target="cpp")
    verify_kernel_program(program, "schedule_kernels")
    spec = next(s for s in program.specs if s.nest is not None and s.nest.invariants)
    varying = next(e for n in spec.nest.nodes for e in walk(n.body)
                   if isinstance(e, Load) and any(i.free_symbols for i in e.index))
    bad = attrs.evolve(spec, nest=attrs.evolve(spec.nest, invariants=(varying,)))
    with pytest.raises(coil.CoilError, match="K10 an invariant reading loop variables"):
        verify_kernel_program(attrs.evolve(program, specs=tuple(bad if s is spec else s for s in program.specs)),
                              "schedule_kernels")


def test_a_compiled_adamw_step_makes_no_copy_and_no_foreach_call(tmp_path) -> None:
    """The write-backs of a compiled AdamW step are in place, in the kernels: the
    wrapper calls no `copy_` (each was an Extern call per tensor) and no foreach op."""
    model = _model()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    opt.step()  # the state exists: the compiled step is the steady one
    torch._dynamo.reset()
    torch.compile(opt.step, backend="coil",
                  options={"target": "cpp", "graph_cache": False, "debug_dir": str(tmp_path)})()
    codes = sorted(tmp_path.glob("*/output_code.py"))
    assert codes
    for code in codes:
        wrapper = code.read_text()
        call = wrapper[wrapper.index("def call("):]
        assert "copy_" not in call and "_foreach" not in call, call[:3000]


_UNARY_FNS = [torch.exp, torch.sqrt, torch.log1p, torch.tanh, torch.sigmoid, torch.reciprocal, torch.rsqrt,
              lambda v: v * 2 + 1, lambda v: 1 - v, lambda v: torch.pow(0.9, v)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, len(_UNARY_FNS) - 1), min_size=1, max_size=5),
       st.lists(st.integers(0, len(_UNARY_FNS) - 1), min_size=0, max_size=3),
       st.sampled_from(["add", "mul", "div", "where"]), st.integers(1, 3))
def test_values_of_0d_tensors_hoisted_or_not_match_eager(chain, inner, combine, rank) -> None:
    """Property: a chain of costly ops on 0-d tensors (a step count, a scale),
    combined with full tensors, computes eager's values on the cpp target whether
    the chain is hoisted (LoopNest.invariants) or not."""
    shape = (3, 5, 7)[:rank]

    def fn(x, s, t):
        v = s.abs() + 0.5
        for k in chain:
            v = _UNARY_FNS[k](v)
        w = x
        for k in inner:
            w = _UNARY_FNS[k](w.abs() + 0.5)
        out = {"add": lambda: w + v, "mul": lambda: w * v, "div": lambda: w / (v + t),
               "where": lambda: torch.where(x > 0, v, w)}[combine]()
        return (out, v * t)

    g = torch.Generator().manual_seed(len(chain) * 7 + rank)
    x, s, t = torch.randn(shape, generator=g), torch.rand((), generator=g), torch.rand((), generator=g) + 1
    got = coil.compile_graph(make_fx(fn)(x, s, t), [x, s, t], coil.Options(target="cpp", graph_cache=False))(x, s, t)
    for a, b in zip(got, fn(x, s, t)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_a_transformers_training_step_with_adamw_matches_eager() -> None:
    """A Llama from bench/hf_models.py at the CPU size (random weights, dropout 0):
    forward, backward and AdamW in one compiled function, two steps, against
    eager.  Parameters whose gradient is next to zero (an attention key's bias:
    softmax ignores it, so its gradient is rounding noise) are left out: Adam
    turns noise into a full step of either sign, with Inductor as with coil."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    pytest.importorskip("transformers")
    from bench.hf_models import MODELS, SIZES

    spec, size = MODELS["llama"], SIZES["cpu"]
    torch.manual_seed(0)
    ref = spec.build(size, "sdpa").train()
    ours = copy.deepcopy(ref)
    o_ref, o_ours = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ref, ours))

    def step(m, o, inputs):
        o.zero_grad(set_to_none=True)
        loss = m(**inputs).loss
        loss.backward()
        o.step()
        return loss.detach()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="coil", options={"target": "cpp", "graph_cache": False})
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        inputs = spec.inputs(size, g, True)
        torch.testing.assert_close(compiled(ours, o_ours, inputs), step(ref, o_ref, inputs))
    checked = 0
    for (name, p), q in zip(ref.named_parameters(), ours.parameters()):
        if p.grad is None or p.grad.abs().max() < 1e-6:
            continue
        checked += 1
        assert (q - p).abs().max() <= 1e-3 * p.abs().max(), name
    assert checked > 10


def test_the_foreach_table_skips_ops_this_torch_lacks() -> None:
    """torch 2.11 (the device's) has no `_foreach_clone`: the table must build without it, not fail at import."""
    from coil.passes.lowerings.foreach import _overload
    assert _overload("_foreach_no_such_op") is None
    assert _overload("_foreach_add", "NoSuchOverload") is None
    assert _overload("_foreach_add", "List") is aten._foreach_add.List
