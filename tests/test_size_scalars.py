"""Sizes used as numbers: what text generation hands a backend (found by
bench/probes/generate_census.py).  A decoding step takes the cache's length as a
SymInt and computes with it: it adds it to a tensor (`arange(n) + past`), fills a
tensor with it, returns `past + 1`, and Dynamo folds sums of sizes into
`torch.sym_sum`.  A sliding-window cache's length may be 0 or 1 (Dynamo
specializes a tensor's sizes 0 and 1, not an int's), and a step Dynamo compiled
with the length specialized still takes it as an input and returns `8 + 1`.
Each of these ran eagerly (coil's fallback) before; each now compiles and matches
eager (the tests run with the fallback off, as every test does: a graph coil
could not compile would fail them)."""

from __future__ import annotations

import logging

import pytest
import sympy
import torch

import coil
from coil.ir.shapes import GraphSizes, ShapeInfo, SymbolFacts, size_symbol, unbacked_symbol
from tests_helpers import target_available

TARGETS = ["reference", "cpp", "triton"]


@pytest.fixture
def coil_log(caplog):
    caplog.set_level(logging.WARNING, logger="coil")
    return caplog


def _compile(fn, target, **options):
    if not target_available(target):
        pytest.skip(f"{target} not available")
    torch._dynamo.reset()
    return torch.compile(fn, backend="coil", dynamic=True, options={"target": target, **options})


def _eager_fallbacks(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "running it eagerly" in r.getMessage()]


def _sizes_as_operands(x, y):
    n = y.shape[0]
    return (x * n + torch.arange(x.shape[0]) + n, (x > n).float(), torch.where(x > 0, x, n),
            torch.full((x.shape[0],), n), x - torch.sym_sum([n, x.shape[0], 1]))


@pytest.mark.parametrize("target", TARGETS)
def test_a_size_is_an_operand_of_pointwise_ops(target, coil_log):
    g = _compile(_sizes_as_operands, target)
    for k in (3, 5, 9):
        x, y = torch.randn(k) * 4, torch.randn(k + 2)
        for got, want in zip(g(x, y), _sizes_as_operands(x, y)):
            torch.testing.assert_close(got, want)
    assert _eager_fallbacks(coil_log) == []


def _cache_step(x, n):
    torch._check(n >= 0)  # what a sliding-window cache's length knows: never negative, maybe 0 or 1
    k = torch.arange(n + 1, dtype=torch.float32)
    return x * n + k.sum(), torch.full((n + 2,), n), n + 1


@pytest.mark.parametrize("target", TARGETS)
def test_a_symint_input_that_may_be_0_or_1_compiles(target, coil_log):
    g = _compile(_cache_step, target)
    for n in (3, 0, 1, 7):
        x = torch.randn(4)
        got, want = g(x, n), _cache_step(x, n)
        torch.testing.assert_close(got, want)
    assert _eager_fallbacks(coil_log) == []


def test_such_an_input_is_a_u_symbol_bound_and_checked_on_entry(tmp_path):
    """The input becomes `u0` (nothing takes it to be at least 1), which `call`
    reads from the argument first, before any kernel or allocation uses it."""
    g = _compile(_cache_step, "cpp", debug_dir=str(tmp_path))
    g(torch.randn(4), 3)
    code = next(tmp_path.glob("*/output_code.py")).read_text()
    call = code[code.index("def call("):]
    assert "u0 = " in call
    first_use = min(call.index(w) for w in ("empty_strided", "cpp_fused") if w in call)
    assert call.index("u0 = ") < first_use


def test_entry_symbols_are_the_backed_and_those_a_symint_input_is():
    s0, u0, u1 = size_symbol(0), unbacked_symbol(0), unbacked_symbol(1)
    facts = ShapeInfo((SymbolFacts(s0, 4, 2, None), SymbolFacts(u0, 3, 0, 10, backed=False),
                       SymbolFacts(u1, 8192, 0, None, backed=False)))
    sizes = GraphSizes(facts, (("arg0_1", u0),), ("arg0_1", "arg1_1"))
    assert sizes.entry_symbols() == (s0, u0)  # u1 is an extern's result's size: bound after it runs


def test_a_symint_the_shape_env_lets_be_negative_compiles_for_0_up(coil_log):
    """Dynamo rarely knows an int's sign (Mistral's cache length comes as -oo..4094):
    coil compiles for 0 and up, an assumption the IR states (`assumed`), and a call
    with a negative value runs the graph eagerly, with one warning."""

    def f(x, n):
        return x * n + n

    g = _compile(f, "cpp")
    for n in (3, 5, 0, -4, 1, -2):
        x = torch.randn(4)
        torch.testing.assert_close(g(x, n), f(x, n))
    warned = [r.getMessage() for r in coil_log.records if "outside the range" in r.getMessage()]
    assert len(warned) == 1 and "= -4" in warned[0] and "running it eagerly" in warned[0]
    assert _eager_fallbacks(coil_log) == warned  # the graph itself compiled


def _from(x, n):
    return torch.arange(n, 5) * x.sum() + n, torch.nn.functional.pad(x, (n, 1))


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_a_symint_input_negative_at_the_first_call_compiles_for_that_value(target, coil_log):
    """arange's start and a negative pad, negative at the first call: coil's
    symbols are at least 0, so the graph is compiled for that one value (the IR
    says `assumed`) and another value runs it eagerly, with one warning.  Before,
    the graph was refused (`may be negative`) and ran eagerly at every call."""
    g = _compile(_from, target)
    for n in (-3, -3, -2, 4, -3):
        x = torch.randn(2, 6)
        for got, want in zip(g(x, n), _from(x, n)):
            torch.testing.assert_close(got, want)
    warned = [r.getMessage() for r in coil_log.records if "outside the range" in r.getMessage()]
    assert len(warned) == 1 and "= -2, outside the range -3..-3" in warned[0]
    assert not [m for m in _eager_fallbacks(coil_log) if m not in warned]  # the graph itself compiled


def test_a_symint_input_compiled_for_its_value_prints_so():
    from tests_helpers import capture_aot

    gm, ins = capture_aot(lambda x, n: x * n, (torch.randn(4), -3))
    lowered = coil.default_pipeline().run(gm, ins, until="lower", options=coil.Options(target="cpp"))
    assert lowered.sizes.fixed == (("arg2_1", -3),)
    assert "size input arg2_1 = -3 assumed" in lowered.sizes.show()
    assert lowered.sizes.assumed_inputs() == (("arg2_1", -3, -3),)


def test_the_assumed_range_prints_in_the_ir():
    import torch._dynamo.testing

    def f(x, n):
        return x * n

    backend = torch._dynamo.testing.AotEagerAndRecordGraphs()
    torch._dynamo.reset()
    torch.compile(f, backend=backend, dynamic=True)(torch.randn(4), 3)
    (gm,) = backend.fw_graphs
    ins = [p.meta["val"] for p in gm.graph.find_nodes(op="placeholder")]
    lowered = coil.default_pipeline().run(gm, ins, until="lower", options=coil.Options(target="cpp"))
    assert [f.show() for f in lowered.sizes.shapes.facts] == ["s0 in [2, oo] hint 4", "u0 in [0, oo] hint 3 unbacked assumed"]


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_a_static_graph_takes_and_returns_a_specialized_size(target):
    """A SymInt Dynamo specialized while tracing (`n == 8` branched on) stays an
    input of the graph, as a number, and `n + 1` is an output: Python arithmetic
    on sizes in a graph with no symbolic size (gemma2's decoding step)."""

    def f(x, n):
        if n == 8:
            return x + n, n + 1
        return x - n, n

    if not target_available(target):
        pytest.skip(f"{target} not available")
    torch._dynamo.reset()
    # automatic dynamic: the second call's new n makes n a SymInt, x keeps its static size
    from torch._dynamo.utils import counters

    counters.clear()
    g = torch.compile(f, backend="coil", options={"target": target})
    x = torch.randn(4)
    for n in (7, 8):
        got, want = g(x, n), f(x, n)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]
    # a static graph: not counted symbolic (with Options.dynamic off it ran eagerly)
    assert counters["coil"]["symbolic"] == 0 and counters["coil"]["eager"] == 0


def test_a_max_of_sizes_in_a_cpp_kernel_compiles(tmp_path, coil_log):
    """`max(0, s - 4)` as a value in a kernel: the cpp target printed std::max,
    which its prelude (no <algorithm>) does not declare, and g++ failed."""

    def f(x):
        return x + torch.sym_max(x.shape[0] - 4, 0)

    g = _compile(f, "cpp", debug_dir=str(tmp_path))
    for k in (3, 6, 9):
        x = torch.randn(k)
        torch.testing.assert_close(g(x), f(x))
    assert _eager_fallbacks(coil_log) == []
    code = "".join(p.read_text() for p in tmp_path.glob("*/output_code.py"))
    assert "std::max" not in code


def test_debug_dir_keeps_the_graph_of_a_graph_that_failed_and_charts_symbolic_sizes(tmp_path, coil_log,
                                                                                     monkeypatch):
    """`graph.txt` (the aten graph coil was handed) is written before lowering, so
    a graph coil ran eagerly still shows what it was; the lifetime chart of a
    symbolic graph draws its buffers at the hints (it raised on comparing them)."""

    from coil.errors import CoilError
    from coil.passes.lowerings.registry import LOWERINGS

    def refuse(*_args, **_kwargs):
        raise CoilError("refused here (the test's lowering)")

    monkeypatch.setitem(LOWERINGS, torch.ops.aten.view.default, refuse)  # a graph coil refuses
    g = _compile(lambda x: x.view(2, -1) * 3, "cpp", debug_dir=str(tmp_path), eager_fallback=True)
    g(torch.randn(1, 4, 5))
    monkeypatch.undo()
    assert _eager_fallbacks(coil_log)
    (failed,) = [p for p in tmp_path.iterdir() if not (p / "00_lower.txt").exists()]
    assert "torch.ops.aten.view.default" in (failed / "graph.txt").read_text()

    g = _compile(lambda x: (x * 2).sum(0), "cpp", debug_dir=str(tmp_path / "sym"))
    for k in (3, 5):
        g(torch.randn(k, 4))
    charts = list((tmp_path / "sym").glob("*/lifetimes.png"))
    assert charts and all(c.stat().st_size > 0 for c in charts)
    assert all((p / "graph.txt").exists() for p in (tmp_path / "sym").iterdir())


def test_python_floor_division_of_sizes_is_a_floordiv():
    """`a // b` of sympy sizes is `floor(a/b)`, which a lowering may compute
    (stft's frame count): coil's sizes keep it as FloorDiv, which every printer
    spells; the wrapper printed `floor(s0/2)` and the call failed on the name."""
    from coil.ir.indexing import FloorDiv
    from coil.ir.shapes import norm

    s0, s1 = size_symbol(0), size_symbol(1)
    assert norm(s0 // 2 + 1) == FloorDiv(s0, 2) + 1
    assert norm(sympy.ceiling(s0 / 3)) == FloorDiv(s0 + 2, 3)
    assert norm((s0 - 4) // s1) == FloorDiv(s0 - 4, s1)


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_stft_with_symbolic_lengths(target):
    def f(x):
        return torch.view_as_real(torch.stft(x, n_fft=10, return_complex=True))

    g = _compile(f, target)
    for n in (100, 57, 64):
        x = torch.randn(n)
        torch.testing.assert_close(g(x), f(x))


def test_an_extern_sized_by_a_symint_input_is_not_ordered_after_its_own_result():
    """topk(x, k) with k a SymInt input (a `u` symbol known on entry): extract_deps
    ordered each extern after the extern whose result's size binds its symbols,
    and took topk's own result for k's binder: a cycle, which fuse refused."""

    def f(x, k):
        return torch.topk(x, k)

    g = _compile(f, "cpp")
    for shape, k in (((5, 10, 5), 3), ((4, 7, 6), 2), ((3, 9, 4), 0)):
        x = torch.randn(shape)
        got, want = g(x, k), f(x, k)
        torch.testing.assert_close(got.values, want.values)
        torch.testing.assert_close(got.indices, want.indices)


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_chunks_of_a_symbolic_dim_split_as_the_aten_op(target):
    """chunk and split of a symbolic dim: how many chunks there are is Dynamo's
    guard, so the split is aten's, as an extern (it raised `'FloorDiv' object is
    not iterable`); the chunks then fuse into what reads them."""

    def f(x):
        a, b, c = x.chunk(3, 0)
        return a * 2, b + c[:1].sum(), torch.split(x, 4, 1)[0] * 3

    g = _compile(f, target)
    for n in (9, 12):
        x = torch.randn(n, 10)
        for got, want in zip(g(x), f(x)):
            torch.testing.assert_close(got, want)


def test_split_with_sizes_a_symint_input_gives_splits_as_the_aten_op():
    """split(x, [1, k, 1]) with k a SymInt input: that the sizes sum to the dim is
    Dynamo's guard (s0 == u0 + 2), not something coil can show, so aten splits."""

    def f(x, k):
        a, b, c = torch.split(x, [1, k, 1])
        return a + c, b * 2

    g = _compile(f, "cpp")
    for k in (5, 8, 0):
        x = torch.randn(k + 2, 3)
        for got, want in zip(g(x, k), f(x, k)):
            torch.testing.assert_close(got, want)


def _float_sizes(x):
    bn = torch.nn.functional.batch_norm
    return (x * (x.shape[0] / 3) + x.sum() / x.shape[1], torch.nn.functional.instance_norm(x),
            torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"),
            bn(x, torch.zeros(3), torch.ones(3), training=True))


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
def test_floats_computed_from_sizes_are_scalars_of_the_kernels(target):
    """`s0 / 3`, `sym_float(s0)` (a mean's 1 / n in batch_norm and instance_norm,
    interpolate's scales): float64 expressions of the sizes that pointwise ops
    take as scalars.  Each ran its graph eagerly (`cannot call truediv`), the
    training graphs of a ResNet at a symbolic batch among them."""
    g = _compile(_float_sizes, target)
    for n in (5, 7):
        x = torch.randn(n, 3, 6, 4)
        for got, want in zip(g(x), _float_sizes(x)):
            torch.testing.assert_close(got, want)


def test_a_float_of_sizes_is_refused_as_an_externs_argument():
    from coil.ir.expr import Cast, IndexExpr
    from coil.passes.lower import lower_extern
    from coil.passes.lowerings.registry import LowerCtx
    from coil.errors import CoilError

    ctx = LowerCtx("", "", "cpu")
    half = Cast(IndexExpr(size_symbol(0)), torch.float64)
    with pytest.raises(CoilError, match="a float computed from sizes"):
        lower_extern(ctx, torch.ops.aten.full.default, ([2], half), {}, torch.empty(2))


def _powers_of_sizes(x):
    # sdpa's scale, 1 / sqrt(head_dim) at a symbolic head_dim, and powers of sizes
    # whose exponent is an int: s0 ** 2 an int, s1 ** -1 a float (as in Python)
    return (x * (1.0 / torch.sym_float(x.shape[-1]) ** 0.5), x + x.shape[0] ** 2, x * x.shape[1] ** -1)


@pytest.mark.parametrize("target", TARGETS)
def test_powers_of_sizes_are_scalars_of_the_kernels(target):
    g = _compile(_powers_of_sizes, target)
    for shape in ((3, 4), (5, 9)):
        x = torch.randn(shape)
        for got, want in zip(g(x), _powers_of_sizes(x)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("target", ["reference", "cpp"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_interpolate_at_a_scale_factor_under_dynamic_sizes(target, mode, coil_log):
    """F.interpolate(x, scale_factor=1.5 or 0.5): its output size is
    `math.trunc(sym_float(h) * 1.5)`, and the ShapeEnv spells the tensors' sizes
    TruncToInt(1.5*ToFloat(s0)).  Both become FloorDiv(3*s0, 2) (the float is
    exactly 3/2); before, the graph ran eagerly.  Odd sizes check the floor,
    training the backward (upsample's gradient)."""
    import torch.nn.functional as F

    def fn(x):
        up = F.interpolate(x, scale_factor=1.5, mode=mode)
        down = F.interpolate(x, scale_factor=0.5, mode=mode)
        return up.sin().sum((-1, -2)) + down.cos().mean((-1, -2))

    c = _compile(fn, target)
    for h, w in ((8, 10), (7, 9), (12, 5)):
        x = torch.randn(2, 3, h, w, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        want, got = fn(x), c(x2)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        want.square().sum().backward()
        got.square().sum().backward()
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-4)
    assert not _eager_fallbacks(coil_log)


def test_a_float_of_sizes_is_rounded_to_a_size_only_where_exact():
    import math

    from coil.errors import CoilError
    from coil.ir.expr import Cast, Constant, IndexExpr, Op
    from coil.ir.indexing import FloorDiv
    from coil.passes.symbolic import size_arith

    s0 = size_symbol(0)
    h = Cast(IndexExpr(s0), torch.float64)
    f64 = torch.float64
    assert size_arith(math.trunc, [Op("mul", (h, Constant(1.5, f64)), f64)]) == FloorDiv(3 * s0, 2)
    assert size_arith(math.ceil, [Op("mul", (h, Constant(0.5, f64)), f64)]) == FloorDiv(s0 + 1, 2)
    assert size_arith(math.floor, [Op("truediv", (h, Constant(3.0, f64)), f64)]) == FloorDiv(s0, 3)
    with pytest.raises(CoilError, match="does not hold exactly"):  # 2/3 is no float
        size_arith(math.trunc, [Op("mul", (h, Constant(0.6666666666666666, f64)), f64)])
    with pytest.raises(CoilError, match="does not hold exactly"):  # s0 / 3 rounded, then carried on
        size_arith(math.trunc, [Op("mul", (Op("truediv", (h, Constant(3.0, f64)), f64), Constant(3.0, f64)), f64)])
    with pytest.raises(CoilError, match="may be negative"):
        size_arith(math.trunc, [Op("sub", (Constant(2.0, f64), h), f64)])
    # MobileViT's `math.ceil(h_patches / 2)` of a patch count FloorDiv(s0 - 1, 8) + 1: ceil
    # holds whatever the sign; trunc of it is refused (FloorDiv(-1, 8) is -1 at s0 = 0)
    patches = Cast(IndexExpr(FloorDiv(s0 - 1, 8) + 1), torch.float64)
    assert size_arith(math.ceil, [Op("truediv", (patches, Constant(2.0, f64)), f64)]) == \
        FloorDiv(FloorDiv(s0 - 1, 8) + 2, 2)
    with pytest.raises(CoilError, match="may be negative"):
        size_arith(math.trunc, [Op("mul", (Cast(IndexExpr(FloorDiv(s0 - 1, 8)), f64), Constant(1.5, f64)), f64)])


def _float_arange(x):
    # position grids at fractional steps up to floats of sizes: lengths s1 (the ceiling of
    # s1 * 0.5 / 0.5, of (s1 / 4) / 0.25) and s0 (of s0 * 1.5 - s0 / 2; halves and quarters
    # are exact in binary, so their quotients are the ratios)
    return (x + torch.arange(0, x.shape[-1] * 0.5, 0.5), torch.arange(x.shape[0] / 2, x.shape[0] * 1.5) * 2,
            x * torch.arange(0, x.shape[-1] / 4, 0.25))


@pytest.mark.parametrize("target", TARGETS)
def test_arange_to_a_float_of_sizes_compiles_where_its_length_is_a_size(target, coil_log):
    """arange whose bounds are floats of sizes: its length (the ShapeEnv's
    `CeilToInt(...)` of the result) is a size where the float is an exact ratio
    of sizes (before: a TypeError in lower, and the graph ran eagerly; a division
    by a power of two inside it was refused too); its values count from the float
    start in the accumulation dtype, as eager's do."""
    g = _compile(_float_arange, target)
    for n, m in ((4, 8), (7, 11)):
        x = torch.randn(n, m)
        for got, want in zip(g(x), _float_arange(x)):
            torch.testing.assert_close(got, want)
    assert not _eager_fallbacks(coil_log)


def test_arange_to_a_float_of_sizes_that_is_no_size_runs_eagerly_with_the_reason(coil_log):
    def fn(x):
        # s1 / 3 is not exact in binary: the ceiling of a later step could be one off the ratio's
        return torch.arange(0, x.shape[-1] / 3, 1 / 3).sum() + x.sum()

    g = _compile(fn, "cpp", eager_fallback=True)
    for m in (8, 11):
        x = torch.randn(3, m)
        torch.testing.assert_close(g(x), fn(x))
    assert any("a float computed from sizes" in m for m in _eager_fallbacks(coil_log)), coil_log.text
