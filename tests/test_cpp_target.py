"""The cpp target end to end: every op case of tests/op_cases.py, the workloads of
issue 5 (softmax, layer_norm, var_mean, ...), half and integer dtypes, and the
build cache (compile errors, corrupted entries).

Each case compiles its own translation unit; the build cache (keyed by source
hash) makes a second run cheap.  By default each case runs every dtype once,
rotating through its shape kinds; COIL_CPP_FULL_MATRIX=1 runs every
(dtype, shape kind) pair.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import coil
import op_cases
from coil.backends.cpp import build
from coil.ir.expr import Check, Expr, Op, read_names, walk
from coil.ir.kernel import KernelSpec, Parallel, Rows, Split, Streams
from op_cases import RUNNERS, OpCase, check_case

CASE_LISTS = ("POINTWISE_CASES", "CREATION_CASES", "PROMOTION_CASES", "REDUCTION_CASES", "VIEW_CASES", "DECOMP_CASES",
              "INDIRECT_CASES")
FULL_MATRIX = os.environ.get("COIL_CPP_FULL_MATRIX", "") not in ("", "0")


def matrix(cases: Sequence[OpCase]) -> list[Any]:
    """(case, shape kind, dtype) params: every dtype of every case, shape kinds in rotation."""
    out = []
    for case in cases:
        for i, dtype in enumerate(case.dtypes):
            kinds = case.shape_kinds if FULL_MATRIX else (case.shape_kinds[i % len(case.shape_kinds)],)
            for kind in kinds:
                out.append(pytest.param(case, kind, dtype, id=f"{case.id}-{kind}-{str(dtype).removeprefix('torch.')}"))
    return out


ALL_CASES: list[OpCase] = [c for name in CASE_LISTS for c in getattr(op_cases, name)]


@pytest.mark.parametrize(("case", "shape_kind", "dtype"), matrix(ALL_CASES))
def test_op_case(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    check_case(case, shape_kind, dtype, RUNNERS["cpp"])


# ---- workloads ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)



def compile_cpp(fn: Callable[..., Any], *inputs: torch.Tensor, **opts: Any) -> Any:
    gm = make_fx(fn)(*inputs)
    return coil.compile_graph(gm, inputs, coil.Options(target="cpp", **opts))


def flatten(out: Any) -> tuple[torch.Tensor, ...]:
    """Eager's (possibly nested) outputs as the flat tuple a compiled graph returns."""
    if isinstance(out, (tuple, list)):
        return tuple(t for o in out for t in flatten(o))
    return (out,)


def check(fn: Callable[..., Any], *inputs: torch.Tensor, sum_tolerance: bool = False, **opts: Any) -> Any:
    """Compile for cpp, run, compare with eager.  `sum_tolerance`: float32 sums over
    hundreds of elements, added in another order than eager adds them."""
    compiled = compile_cpp(fn, *inputs, **opts)
    expected = flatten(fn(*inputs))
    actual = compiled(*inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        tol = {"atol": 1e-4, "rtol": 1e-4} if sum_tolerance else op_cases.tolerances(e.dtype)
        torch.testing.assert_close(a, e, atol=tol.get("atol"), rtol=tol.get("rtol"), equal_nan=True)
    return compiled


def specs(compiled: Any) -> tuple[KernelSpec, ...]:
    """The KernelProgram's specs behind a compiled module: its decisions."""
    return compiled.module.program.specs  # type: ignore[no-any-return]


def ops(k: KernelSpec) -> list[Op]:
    """Every operation of the kernel's node bodies."""
    return [e for n in k.nodes for e in walk(n.body) if isinstance(e, Op)]


def seed_fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return ((a + b) * c.relu()).sum(dim=-1)


def test_seed_is_one_cpp_kernel() -> None:
    a, b, c = (torch.randn(64, 128) for _ in range(3))
    compiled = check(seed_fn, a, b, c)
    (k,) = specs(compiled)
    # one kernel: a row loop of 128 for each of the 64 rows, too little work for threads
    assert k.name == "cpp_fused_add_mul_relu_sum_0" and k.space == Rows(64, 128, looped=True)
    assert k.nest is not None and (k.nest.xsizes, k.nest.rsizes, k.nest.parallel) == ((64,), (128,), None)
    assert [n.name for n in k.nodes if n.store is not None] == ["buf0"]
    # the renderer: coil's own prelude, no ATen
    assert '#include "coil_prelude.h"' in compiled.source and "ATen" not in compiled.source


def test_auto_target_picks_cpp_on_cpu() -> None:
    a, b, c = (torch.randn(8, 16) for _ in range(3))
    gm = make_fx(seed_fn)(a, b, c)
    compiled = coil.compile_graph(gm, (a, b, c), coil.Options(target="auto"))
    # the C++ target: its kernels run as loop nests
    assert compiled.module.target == "cpp" and [k.nest is not None for k in specs(compiled)] == [True]


@pytest.mark.parametrize("shape", [(64, 128), (3, 1000), (5, 7)])
def test_softmax(shape: tuple[int, ...]) -> None:
    compiled = check(lambda x: torch.softmax(x, -1), torch.randn(shape))
    (k,) = specs(compiled)
    assert k.space == Rows(shape[0], shape[1], looped=True)


def test_log_softmax_dim0() -> None:
    check(lambda x: torch.log_softmax(x, 0), torch.randn(33, 17))


def test_gelu_tanh_over_its_whole_range() -> None:
    """x * sigmoid(2z) for gelu(approximate="tanh"): eager's values within float32
    rounding from -40 to 40, inf and NaN passed through."""
    x = torch.cat([torch.linspace(-40, 40, 8001), torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])])
    check(lambda a: F.gelu(a, approximate="tanh"), x)


@pytest.mark.skipif(not build.has_libmvec(), reason="no glibc libmvec: sin and cos stay scalar")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sin_and_cos_of_one_value_stay_vector_calls(dtype: torch.dtype) -> None:
    """A rotary embedding's x * cos(t) + rotate(x) * sin(t): GCC would merge the
    builtin sin and cos of t into one sincos call, which libmvec has no vector
    variant of, and leave the loop scalar.  The prelude's names keep them two
    vector calls: the library links libmvec's sin and cos and no sincos."""
    import subprocess

    def rotary(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * t.cos() + rotated * t.sin()

    x, t = torch.randn(2, 4, 64, 32, dtype=dtype), torch.randn(64, 32, dtype=dtype) * 10
    compiled = check(rotary, x, t)
    so = compiled.namespace["_cpp_lib"]._name
    listed = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True, check=True).stdout
    symbols = [ln.split()[-1].split("@")[0] for ln in listed.splitlines() if ln.strip()]
    suffix = "f" if dtype == torch.float32 else ""
    assert any(s.startswith("_ZGV") and s.endswith(f"_sin{suffix}") for s in symbols), symbols
    assert any(s.startswith("_ZGV") and s.endswith(f"_cos{suffix}") for s in symbols), symbols
    assert not any("sincos" in s for s in symbols), symbols


def kernel_text(source: str) -> str:
    """The C++ kernels of an output_code.py, without the #include and the wrapper."""
    return source[source.index("// cpp_fused"):source.index("\'\'\'\n")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pow_small_integer_exponents_are_products(dtype: torch.dtype) -> None:
    """x ** n for a constant integer |n| <= 4 multiplies (GELU's x ** 3 as x * x * x,
    as eager computes it) instead of calling pow; other exponents still call pow.
    Zeros of both signs, infinities and NaN give eager's values."""
    x = torch.cat([torch.randn(500) * 3, torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"),
                                                       float("nan")])]).to(dtype)
    for n in (-4, -3, -2, 0, 3, 4, 2.5, 5, -5):
        compiled = check(lambda x: torch.pow(x, n), x)
        assert any(op.name == "pow" for k in specs(compiled) for op in ops(k)) == (n in (2.5, 5, -5)), n
    compiled = check(lambda x: F.gelu(x, approximate="tanh") + 0.044715 * torch.pow(x, 3.0), x)
    assert not any(op.name == "pow" for k in specs(compiled) for op in ops(k))


def r_loop_bodies(source: str, having: str = "") -> list[str]:
    """The text of every r-loop (`for (int64_t ir0 ...`), by indentation, of the
    kernels whose text contains `having`."""
    kernels = ["// cpp_fused" + k for k in kernel_text(source).split("// cpp_fused")[1:]]
    lines = [ln for k in kernels if having in k for ln in k.splitlines()]
    out = []
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith("for (int64_t ir0"):
            pad = len(ln) - len(ln.lstrip())
            body = [b for b in itertools.takewhile(lambda b: len(b) - len(b.lstrip()) > pad, lines[i + 1:])]
            out.append("\n".join(body))
    return out


def cross_entropy_grad(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_()
    with torch.enable_grad():
        loss = F.cross_entropy(x, t)
    return torch.autograd.grad(loss, x)[0]


def hoisted(k: KernelSpec) -> list[Expr]:
    """Every subtree the spec has the kernel's r-loops compute once per row."""
    return [e for h in k.hoisted for root in h.hoisted for e in walk(root)]


def test_row_invariant_values_computed_before_the_r_loop() -> None:
    """What an r-loop computes from the xindex alone (cross_entropy's backward: the
    target's index Check; log_softmax: log of the row's sum) runs once per row,
    before the loop, not once per element: a Check in the loop keeps it from
    vectorising.  An out-of-range target still raises eager's error; ignored
    targets (-100) still count for nothing."""
    x, t = torch.randn(16, 300), torch.randint(0, 300, (16,))
    t[3] = -100
    compiled = check(cross_entropy_grad, x, t)
    grad = next(k for k in specs(compiled) if any(op.name == "exp" for op in ops(k)))  # the gradient's kernel
    assert any(isinstance(e, Check) for e in hoisted(grad)) and any(
        isinstance(e, Op) and e.name == "log" for e in hoisted(grad))
    # the renderer spells them before the r-loop
    bodies = r_loop_bodies(compiled.source, having="coil_exp(")
    assert bodies and not any("coil_check_index(" in b or "coil_log(" in b for b in bodies), bodies
    bad = t.clone()
    bad[5] = 300
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):  # the gradient's scatter fails first
        compiled(x, bad)
    compiled = check(lambda x: torch.log_softmax(x, -1), torch.randn(7, 1029))
    (k,) = specs(compiled)
    assert any(isinstance(e, Op) and e.name == "log" for e in hoisted(k))
    w, idx = torch.randn(10), torch.tensor([3, 0, 9, -1])
    check(lambda x, w, idx: (x * w[idx][:, None]).sum(-1) / w[idx].exp(), torch.randn(4, 50), w, idx,
          sum_tolerance=True)


def test_layer_norm() -> None:
    x, w, b = torch.randn(32, 256), torch.randn(256), torch.randn(256)
    check(lambda x, w, b: F.layer_norm(x, (256,), w, b), x, w, b)


def test_layer_norm_bf16() -> None:
    x, w, b = (t.bfloat16() for t in (torch.randn(16, 64), torch.randn(64), torch.randn(64)))
    check(lambda x, w, b: F.layer_norm(x, (64,), w, b), x, w, b)


def test_var_mean() -> None:
    x = torch.randn(16, 300) * 3 + 10
    check(lambda x: torch.var_mean(x, -1), x)
    check(lambda x: torch.var_mean(x, 0, correction=0), x)


@pytest.mark.parametrize("n", [1, 7, 16, 100, 1000, 1029])
def test_row_scratch(n: int) -> None:
    """softmax's exp(x - max) is computed in the sum's r-loop, kept in a row-sized
    scratch array and read back by the output loop instead of computed again; rows
    of every length (vector tails included) give eager's values."""
    x = torch.randn(13, n) * 4
    compiled = check(lambda x: torch.softmax(x, -1), x)
    if n > 1:  # a row of one is no reduction
        (k,) = specs(compiled)
        (a,) = k.scratch
        assert (a.first, a.last) == (1, 2) and isinstance(a.expr, Op) and a.expr.name == "exp"
        # the renderer stores it and computes exp once
        kernel = compiled.source[compiled.source.index("// cpp_fused"):]
        assert "row0[ir0] = " in kernel and kernel.count("coil_exp(") == 1
    check(lambda x: torch.log_softmax(x, -1), x)
    check(lambda x: F.layer_norm(F.gelu(x), (n,)), x)
    check(lambda x: (torch.softmax(x, -1), x.exp().sum(-1)), x)
    check(lambda x: torch.softmax(x.bfloat16().float(), -1).bfloat16(), x)


def test_row_scratch_only_for_costly_values() -> None:
    """Cheap recomputations (layer_norm's x - mean) stay recomputed; rows too long
    for the stack budget fall back to recomputing; several reduction dims index
    the scratch array by the flat rindex."""
    x = torch.randn(8, 300)
    assert [k.scratch for k in specs(check(lambda x: F.layer_norm(x, (300,)), x))] == [()]
    assert [len(k.scratch) for k in specs(check(lambda x: F.layer_norm(F.gelu(x), (300,)), x))] == [1]
    assert [k.scratch for k in specs(check(lambda x: torch.softmax(x, -1), torch.randn(2, 20000)))] == [()]
    y = torch.randn(6, 5, 33)
    compiled = check(lambda y: torch.softmax(y.flatten(1), -1).view(6, 5, 33), y)
    assert [len(k.scratch) for k in specs(compiled)] == [1]
    check(lambda y: (y - y.amax((0, 2), keepdim=True)).exp() / (y - y.amax((0, 2), keepdim=True)).exp().sum(
        (0, 2), keepdim=True), y)


def test_row_scratch_chain_reuses_arrays() -> None:
    """A chain of row reductions (graph_2000's `y = y - y.amax(-1) * 0.5`): each
    r-loop reads the previous value of y from a scratch array instead of redoing
    the whole chain, and writes the next one into the same array."""

    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(40):
            x = x - x.amax(-1, keepdim=True) * 0.5
        return x

    compiled = check(chain, torch.randn(5, 3000))
    arrays = [k.scratch for k in specs(compiled)]
    assert sum(map(len, arrays)) > 30 and {a.slot for scratch in arrays for a in scratch} == {0}
    assert all(a.last == b.first for scratch in arrays for a, b in itertools.pairwise(scratch))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_division_by_row_value_uses_reciprocal(dtype: torch.dtype) -> None:
    """x / x.sum(-1) multiplies by the row's reciprocal; divisors whose reciprocal
    is not a normal number (zero, subnormal, huge, inf, NaN) still divide."""
    x = torch.rand(9, 70, dtype=torch.float64) + 0.5
    x[1] = 0.0  # 0 / 0
    x[2] = 1e-300 if dtype == torch.float64 else 1e-41  # a subnormal sum
    x[3] = torch.finfo(dtype).max / 4  # the sum overflows to inf
    x[4, 5] = float("nan")
    x[5, :69] = 0.0  # one nonzero element: exactly 1
    x[6] *= -1e30 if dtype != torch.bfloat16 else -1e20
    x = x.to(dtype)
    compiled = check(lambda x: (x / x.sum(-1, keepdim=True), x / x.amax(-1, keepdim=True) * 3), x)
    (k,) = specs(compiled)
    # one division by the row's sum, one by its max (each read once per row)
    divisors = [d.args[1] for h in k.hoisted for d in h.reciprocals if isinstance(d, Op)]
    assert sorted(name for d in divisors for name in read_names(d)) == sorted(
        n.name for n in k.nodes if n.reduction_type in ("sum", "max"))
    # the renderer guards each reciprocal, with a flag of the compute type (not a bool)
    assert "_ok != " in compiled.source


def _vectorized(source: str, tmp_path: Any) -> tuple[list[tuple[int, int]], set[tuple[int, int]]]:
    """The `omp simd` loops of a module's C++ (first and last line), and those of
    them GCC's report says it vectorized (-fopt-info-vec, coil's flags)."""
    from bench.probes.cpp_vectorized import gcc_report, simd_loops, vectorized

    cpp, report = gcc_report(source, str(tmp_path), "optimized")
    assert cpp, source
    loops = simd_loops(cpp)
    return loops, vectorized(loops, report)


@pytest.mark.parametrize("rows", [1 << 12, 32000])
def test_a_division_by_a_row_value_vectorizes_beside_exp(rows: int, tmp_path: Any) -> None:
    """softmax over rows too long for row scratch (32000 floats: 125 KiB) computes
    exp(x - max) again in the loop that divides by the sum.  With the reciprocal's
    guard a bool, GCC 12 vectorized no such loop (`no vectype` for its loads): 10.1
    ms a call at (64, 32000) on one thread, eager 1.3; with a flag of the compute
    type every `omp simd` loop of the kernel vectorizes (1.8 ms)."""
    x = torch.randn(4, rows)
    compiled = check(lambda x: (torch.softmax(x, -1),), x)
    assert ("row0[" in compiled.source) == (rows < 16384), compiled.source  # scratch only for the short rows
    loops, done = _vectorized(compiled.source, tmp_path)
    assert loops and set(loops) == done, (loops, done)


def test_argmax_argmin_ties_and_nan() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 2.0, float("nan"), 5.0], [-1.0, -1.0, -2.0, -2.0]])
    check(lambda x: (x.argmax(-1), x.argmin(-1), x.argmax(0), x.argmax()), x)


def test_amax_nan_propagates() -> None:
    x = torch.randn(64, 100)
    x[3, 7] = float("nan")
    x[10, 99] = float("nan")
    check(lambda x: (x.amax(-1), x.amin(-1), x.amax(0), x.max()), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32])
def test_transposed_input(dtype: torch.dtype) -> None:
    """The nest runs in 64 x 64 tiles, the transposed read staged through a local
    tile (the renderer's coil_transpose_tile); the ragged edge reads plainly."""
    x, y = torch.randn(100, 70).to(dtype), torch.randn(70, 100).to(dtype)
    compiled = check(lambda x, y: x + y.t(), x, y)
    (k,) = specs(compiled)
    # x's rows (v, innermost) in 64 x 64 tiles; y read transposed through a staged tile
    assert k.nest is not None and k.nest.xsizes == (100, 70)
    tile = k.nest.tile
    assert tile is not None and (tile.u, tile.v, tile.side) == (0, 1, 64)
    assert [(r.buffer, r.stride) for r in tile.staged] == [("y_1", 100)]
    check(lambda x: x.t().contiguous() * 2, torch.randn(65, 130).to(dtype))
    check(lambda x: x.permute(2, 0, 1) + 1, torch.randn(40, 3, 64).to(dtype))


def test_streaming_stores() -> None:
    """A large output of a memory-bound pointwise kernel is computed in chunks into
    a local buffer and streamed out (non-temporal stores): rows that are not a
    multiple of the chunk nor aligned, transposed tiles with ragged edges, bf16.
    Compute-bound kernels and small outputs keep plain stores."""
    x, y = torch.randn(1100, 1001), torch.randn(1100, 1001)
    compiled = check(lambda x, y: x * 2 + y, x, y)
    assert [k.streams for k in specs(compiled)] == [Streams(("buf0",), 64)]
    # the renderer streams it out
    assert "coil_stream(out_ptr" in compiled.source
    check(lambda x, y: x * 2 + y, x, y, num_threads=2)
    z = torch.randn(1030, 1030)
    compiled = check(lambda x, y: x + y.t(), z, torch.randn(1030, 1030))
    (k,) = specs(compiled)
    assert k.nest is not None and k.nest.tile is not None and k.nest.tile.side == 64 and k.nest.tile.staged
    assert k.streams == Streams(("buf0",), 64 * 64)
    b = torch.randn(2100, 1100).bfloat16()
    assert [k.streams for k in specs(check(lambda b: b * 3, b))] == [Streams(("buf0",), 128)]
    assert [k.streams for k in specs(check(lambda x: x.exp() * x.sigmoid(), x))] == [None]
    assert [k.streams for k in specs(check(lambda x, y: x + y, x[:100], y[:100]))] == [None]


def test_loop_index_keeps_divisions_out_of_inner_loops() -> None:
    """(1024*i + j) // 131072 is i // 128 when j < 1024, and digits of one
    variable merge back: the transformer block's head reshapes become plain
    copies instead of a division per element."""
    import sympy

    from coil.passes.schedule.nest import loop_index
    from coil.ir.indexing import FloorDiv, ModularIndexing

    i, j, x = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("ix0", "ix1", "ix2"))
    ranges = {i: 512, j: 1024, x: 524288}
    assert loop_index(j + 131072 * FloorDiv(1024 * i + j, 131072) + 1024 * ModularIndexing(i, 1, 128), ranges) == 1024 * i + j
    assert loop_index(FloorDiv(1024 * i + j + 5, 131072), ranges) == FloorDiv(1024 * i + j + 5, 131072)
    digits = (131072 * FloorDiv(1024 * FloorDiv(x, 1024) + ModularIndexing(x, 1, 1024), 131072)
              + ModularIndexing(x, 1, 1024) + 1024 * ModularIndexing(FloorDiv(x, 1024), 1, 128))
    assert loop_index(digits, ranges) == x
    y = torch.randn(4, 128, 256)
    check(lambda y: (y.view(4, 128, 4, 64).transpose(1, 2).reshape(16, 128, 64) * 2).transpose(0, 1), y)


def test_erf_is_accurate() -> None:
    """coil's own float erf (a polynomial, not libm's) over a dense sweep of floats:
    within 3 ulp of erf computed in float64; NaN, +-0, +-inf and the saturated tail exact."""
    bits = torch.arange(0, 0x40A00000, 997, dtype=torch.int64).to(torch.int32).view(torch.float32)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 4.0, 1e4])
    x = torch.cat([bits, -bits, torch.tensor([1e-30, 3.9]), special])
    got = compile_cpp(torch.erf, x)(x)[0]
    ref = torch.erf(x.double())
    ulp = (torch.nextafter(ref.float().abs(), torch.tensor(float("inf"))) - ref.float().abs()).double()
    assert ((got.double() - ref).abs() / ulp).nan_to_num(0.0).max() <= 3.0
    torch.testing.assert_close(got[-len(special):], torch.erf(special), equal_nan=True, atol=0, rtol=0)
    assert torch.signbit(got[-len(special) + 1])


def test_half_inputs() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        x, y = torch.randn(32, 48, dtype=dtype), torch.randn(32, 48, dtype=dtype)
        check(lambda x, y: ((x * y).exp().sum(-1), (x - y).sigmoid()), x, y)


def test_int_inputs() -> None:
    x = torch.randint(-50, 50, (16, 40), dtype=torch.int32)
    y = torch.randint(1, 9, (16, 40), dtype=torch.int64)
    check(lambda x, y: (x // y, x % y, (x * y).sum(-1), x.amax(0), x.prod(-1)), x, y)


def test_bool_outputs() -> None:
    x = torch.randn(20, 30)
    check(lambda x: (x > 0, (x > 1).any(-1), (x > -3).all(-1), torch.isnan(x.log())), x)


def test_zero_dim_outputs() -> None:
    x = torch.randn(10, 10)
    check(lambda x: (x.sum(), x.amax(), x.mean() * 2), x)
    check(lambda s, x: s * x, torch.tensor(3.0), x)


def test_empty_reduction() -> None:
    check(lambda x: (x.sum(-1), x.prod(-1), x.any(-1)), torch.randn(4, 0))


def test_large_parallel_kernels() -> None:
    x, y = torch.randn(256, 1024), torch.randn(1024)
    compiled = check(lambda x, y: (torch.softmax(x + y, -1), (x * y).sum(0)), x, y, sum_tolerance=True)
    # the column sum: 1024 columns as 256 x 4 loops, both collapsed on threads; the softmax's 256 rows
    assert {k.space: k.nest and k.nest.parallel for k in specs(compiled)} == {
        Rows(1024, 256, looped=True): Parallel(loops=2, iterations=1024, chunk=16),
        Rows(256, 1024, looped=True): Parallel(loops=1, iterations=256, chunk=4)}
    compiled = check(lambda x: x * 3 + 1, torch.randn(1 << 17), num_threads=2)
    # blocks of 4096 elements, one block a chunk; the thread count is the options', spelt by the renderer
    (k,) = specs(compiled)
    assert k.nest is not None and k.nest.block == 4096 and k.nest.parallel == Parallel(1, 32, 1)
    assert "num_threads(2)" in compiled.source


def test_split_reductions() -> None:
    """Few rows, long rows: each row is split among threads and the partials are
    combined in order (argmax keeps the first of two equal maxima)."""
    x = torch.randn(1 << 16)
    x[1000] = x[60000] = 50.0
    compiled = check(lambda x: (x.sum(), x.amax(), x.argmax(), torch.var_mean(x), (x > 4).any(), (x > -9).all()), x,
                     sum_tolerance=True)
    (k,) = specs(compiled)
    # the one row in 64 parts of 1024 elements, the parts on threads; partials combined in the kernel
    assert k.space == Split(1, 1 << 16, parts=64, chunk=1024, xblock=1, columns=False, workspaces=(), even=True)
    assert k.nest is not None and k.nest.parallel == Parallel(loops=1, iterations=64, chunk=1)
    y = torch.randn(3, 40000)
    check(lambda y: (y.argmin(-1), torch.softmax(y, -1), y.amin(-1)), y, sum_tolerance=True)


def test_column_reductions() -> None:
    """Reductions over a strided dim run a block of output columns per thread, one
    accumulator slot per column: every reduction kind, a ragged last block, NaN."""
    x = torch.randn(300, 200)
    x[7, 3] = float("nan")
    compiled = check(lambda x: (x.sum(0), x.amax(0), x.amin(0), x.argmax(0), x.argmin(0), x.prod(0) * 0,
                                (x > 2).any(0), (x > -3).all(0)), x, sum_tolerance=True)
    (k,) = specs(compiled)
    # 200 columns in blocks of 64 lanes (the last ragged), the 4 blocks on threads
    assert k.space == Rows(200, 300, looped=True, columns=True, lanes=64)
    assert k.nest is not None and k.nest.parallel == Parallel(loops=1, iterations=4, chunk=1)
    check(lambda x: (torch.var_mean(x, 0), x - x.mean(0), torch.softmax(x, 0)), torch.randn(96, 130), sum_tolerance=True)
    check(lambda x: x.sum((0, 2)), torch.randn(20, 70, 3), sum_tolerance=True)


def test_inputs_are_checked_on_each_call() -> None:
    """The per-call input check (a fast field comparison) still rejects another
    size, dtype or stride, and a size-1 dim's stride does not matter."""
    x = torch.randn(4, 1, 6)
    compiled = compile_cpp(lambda x: x * 2, x)
    torch.testing.assert_close(compiled(x.clone())[0], x * 2)
    torch.testing.assert_close(compiled(torch.randn(6, 1, 4).permute(2, 1, 0).contiguous())[0].shape, x.shape)
    for bad in (torch.randn(4, 1, 7), x.double(), torch.randn(6, 1, 4).permute(2, 1, 0)):
        with pytest.raises(coil.CoilError):
            compiled(bad)
    with pytest.raises(coil.CoilError):
        compiled(x, x)


# ---- the build cache -----------------------------------------------------------------------------


def test_compile_error_names_the_source(tmp_path: Any) -> None:
    source = 'extern "C" void broken(float* p) { p[0] = undefined_name; }\n'
    with pytest.raises(coil.CoilError) as info:
        build.build(source, str(tmp_path))
    entry = build.cache_entry(source, str(tmp_path))
    assert entry.cpp in str(info.value)
    assert "undefined_name" in str(info.value)
    assert os.path.exists(entry.cpp) and not os.path.exists(entry.so)


def test_corrupted_cache_entry_is_rebuilt(tmp_path: Any) -> None:
    source = 'extern "C" void add_one(float* p, int64_t n, int64_t m) { for (int64_t i = 0; i < n; ++i) p[i] += 1; }\n'
    source = "#include <cstdint>\n" + source
    path = build.build(source, str(tmp_path))  # built, never loaded in this process
    with open(path, "wb") as f:
        f.write(b"garbage, not an ELF file")
    lib = build.load_library(source, str(tmp_path))
    t = torch.zeros(5)
    build.bind(lib, "add_one", 1)(t.data_ptr(), 5, 0)
    assert t.tolist() == [1.0] * 5
    assert build.is_valid(build.cache_entry(source, str(tmp_path)))


_SHIFT = ('#include <cstdint>\nextern "C" void shift(float* __restrict__ out, const float* __restrict__ a, '
          'int64_t n, int64_t k) { for (int64_t i = 0; i < n; ++i) out[i] = a[i] + k; }\n')


def test_the_launcher_takes_tensors_and_reads_their_pointers_in_c(tmp_path: Any) -> None:
    """build.launcher's kernel takes the tensors themselves (a view's pointer is its
    own element, storage offset included), checks them, and is torch's C call
    where the helper builds here (backends/cpp/fastcall.py)."""
    from coil.backends.cpp import fastcall

    lib = build.load_library(_SHIFT, str(tmp_path))
    k = build.launcher(lib, "shift", 2, 2, str(tmp_path))
    assert fastcall.available(str(tmp_path)) and type(k).__name__ == "builtin_function_or_method"
    out, a = torch.zeros(6), torch.arange(8.0)
    k(out, a[2:], 6, 10)
    assert out.tolist() == [12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
    with pytest.raises(TypeError, match="argument 1 is not a tensor"):
        k(out, 3, 6, 10)
    with pytest.raises(TypeError, match="takes 4 arguments, 3 given"):
        k(out, a, 6)
    # a tensor whose data torch refuses (as a tracer's FakeTensors: "Cannot access data
    # pointer"): its data_ptr throws in C++, which reaches the caller as an error where it
    # ended the process (std::terminate)
    refused = torch.zeros(6)
    torch._C._set_throw_on_mutable_data_ptr(refused)
    with pytest.raises(RuntimeError, match="argument 0 has no data to run on: Cannot access data pointer"):
        k(refused, a, 6, 10)


def test_without_the_c_launcher_kernels_go_through_ctypes(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the helper cannot be had (no Python.h, another ABI), a launcher calls
    the ctypes function with the pointers read in Python: the same results."""
    from coil.backends.cpp import fastcall

    monkeypatch.setattr(fastcall, "_maker", lambda cache_dir: None)
    lib = build.load_library(_SHIFT, str(tmp_path))
    k = build.launcher(lib, "shift", 2, 2, str(tmp_path))
    assert type(k).__name__ == "function"
    out = torch.zeros(3)
    k(out, torch.ones(3), 3, 2)
    assert out.tolist() == [3.0, 3.0, 3.0]

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).relu()

    x = torch.randn(10, 7)
    compiled = coil.compile_graph(make_fx(fn)(x), [x], coil.Options(target="cpp", cache_dir=str(tmp_path),
                                                                      graph_cache=False))
    torch.testing.assert_close(compiled(x)[0], fn(x))
    assert ".data_ptr()" not in compiled.module.source  # the module passes tensors either way


def test_loader_rejecting_entry_is_rebuilt(tmp_path: Any) -> None:
    """A sidecar that vouches for a bad .so (say, written by a broken tool) still
    cannot make coil crash: dlopen's OSError triggers one rebuild."""
    source = '#include <cstdint>\nextern "C" void noop(int64_t a, int64_t b) {}\n'
    entry = build.cache_entry(source, str(tmp_path))
    build.build(source, str(tmp_path))
    with open(entry.so, "wb") as f:
        f.write(b"\x7fELF broken")
    with open(entry.sidecar, "w") as f:
        json.dump({"key": entry.key, "so_sha256": build._sha256_file(entry.so)}, f)
    assert build.is_valid(entry)
    build.load_library(source, str(tmp_path))
    assert build.is_valid(entry)


def test_cache_hit_skips_the_compiler(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(8, 8)
    compile_cpp(lambda x: x * 2, x, cache_dir=str(tmp_path))

    def no_compile(*_a: Any, **_k: Any) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(build, "compile_entry", no_compile)
    compiled = compile_cpp(lambda x: x * 2, x, cache_dir=str(tmp_path))
    torch.testing.assert_close(compiled(x)[0], x * 2)


def test_kernels_of_the_same_source_are_compiled_once() -> None:
    """Three layers alike: the second and third layers' kernels differ from each
    other in name and comments only (the first reads the graph's input, which may
    alias nothing: its pointers are __restrict__), so the translation unit defines
    one of them and the module calls the other by its name; every layer still
    computes its own values."""
    def layers(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = (x.relu() * 2) @ w
        return x

    compiled = check(layers, torch.randn(16, 16), torch.randn(16, 16))
    names = [k.name for k in compiled.module.kernels]
    assert len(names) == 3
    source = compiled.module.source
    assert f'void {names[1]}(' in source and f'void {names[2]}(' not in source
    assert f"\n{names[2]} = {names[1]}  # the same kernel's source\n" in source


@pytest.mark.parametrize("shape", [(1 << 20,), (64, 16384), (8, 1 << 18), (65536, 64)])
def test_long_float_sums_stay_near_eager_accuracy(shape: tuple[int, ...]) -> None:
    """A float32 sum over many elements: on rows, a split's parts or down columns
    (lanes), in blocks (LoopNest.rblock), the parts folded pairwise.  Before,
    each was one serial add chain: x.sum() of 2^20 elements of about 3 was 5.1 off
    the float64 sum where eager was 0.011 off (470x), a column sum of 65536 rows 2.36
    where eager was 0.036; now each result is within a few times eager's distance
    from float64 (or 2 float32 ulps of it)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) + 3

    def fn(x):
        return x.sum(), x.clamp(-1, 4).sum(-1), torch.var_mean(x, -1)[0], x.sum(0)

    got = coil.compile_graph(make_fx(fn)(x), [x], coil.Options(target="cpp", graph_cache=False))(x)
    want, exact = fn(x), fn(x.double())
    for g_, w, e in zip(got, want, exact):
        ours, eagers = (g_.double() - e).abs().max().item(), (w.double() - e).abs().max().item()
        ulp = torch.finfo(torch.float32).eps * e.abs().max().item()
        assert ours <= max(4 * eagers, 2 * ulp), (ours, eagers, ulp)


@pytest.mark.parametrize("n", [1 << 16, 1 << 20, 1 << 24])
def test_a_sum_of_equal_values_is_as_near_the_exact_sum_as_eager(n: int) -> None:
    """x.sum() of n values of 0.1, split among threads: each part in blocks whose
    float sums are folded in double, the parts folded in double.  Blocks folded
    in float were 4.5x eager's error at 2^16 (6.7e-7 off, relative, against 1.5e-7)
    and 4.4x at 2^24 (2.3e-6: outside assert_close's rtol of eager)."""
    x = torch.full((n,), 0.1)
    fn = coil.compile_graph(make_fx(lambda x: (x.sum(),))(x), [x], coil.Options(target="cpp", graph_cache=False))
    exact = torch.tensor(0.1).double() * n
    ours, eagers = abs(fn(x)[0].double() - exact).item(), abs(x.sum().double() - exact).item()
    assert ours <= eagers, (ours, eagers)


def test_a_split_sum_runs_its_parts_as_simd_blocks() -> None:
    x = torch.randn(1 << 20)
    fn = coil.compile_graph(make_fx(lambda x: (x.sum(),))(x), [x], coil.Options(target="cpp", graph_cache=False))
    kernel = fn.source[fn.source.find('extern "C"'):]
    assert "#pragma omp simd reduction(+:acc0)" in kernel and "ir0_b += 256" in kernel, kernel[:2000]
    assert "acc0_w += acc0_k;" in kernel and "double acc0_p[64];" in kernel  # the blocks and parts folded in double
    assert "acc0_p[c] += acc0_p[c + s];" in kernel  # the parts folded pairwise


def test_a_column_sum_over_two_dims_runs_in_blocks_of_its_outer_rows() -> None:
    """Found by `coil fuzz --target cpp`: (1 / (|a| + 1)).sum([0, -2]) of an int
    (23, 29, 8) tensor runs down 8 columns in lanes over two r loops, each lane
    one add chain of 667 values: 16 float32 ulps off float64 where eager was 1.
    The outer r loop now runs in blocks (one step of 29 rows each), summed apart."""
    bad = []
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        a = torch.randint(-2, 3, (23 * 240 + 8,), generator=g, dtype=torch.int32).as_strided((23, 29, 8), (240, 8, 1), 8)

        def fn(a):
            return ((1.0 / (a.abs() + 1)).sum([0, -2]),)

        got = coil.compile_graph(make_fx(fn)(a), [a], coil.Options(target="cpp", graph_cache=False))(a)[0]
        exact = (1.0 / (a.abs().double() + 1)).sum([0, -2])
        ours, eagers = (got.double() - exact).abs().max().item(), (fn(a)[0].double() - exact).abs().max().item()
        ulp = torch.finfo(torch.float32).eps * exact.abs().max().item()
        if ours > max(4 * eagers, 2 * ulp):
            bad.append((seed, ours, eagers, ulp))
    assert not bad, bad


def test_the_negation_of_a_negative_constant_compiles() -> None:
    """Found by `coil fuzz --target cpp` (seed 20261206): neg(full(-1)) was spelt
    `(--1.0f)`, a decrement, and g++ refused the kernel."""
    x = torch.randn(3)

    def fn(x):
        return (torch.neg(torch.full((3,), -1.0)).exp() + x, -torch.full((2,), -2, dtype=torch.int64))

    got = coil.compile_graph(make_fx(fn)(x), [x], coil.Options(target="cpp", graph_cache=False))(x)
    for a, b in zip(got, fn(x)):
        torch.testing.assert_close(a, b)


def test_a_row_over_several_r_loops_sums_in_blocks_of_its_outer_loop() -> None:
    """Found by `coil fuzz --target cpp` (seed 20261207): the full sum of a
    (15, 26, 2) value read through a transposed input runs over three r loops, and
    was one add chain of 780 values (2 lanes of 390), up to 5.5 float32 ulps off
    float64 where eager was 0.9.  Its outermost r loop now runs in blocks (one
    step: 26 values a lane, about 390 ** (2/3) rounded down), each summed apart."""
    bad = []
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(26, 15, 2, generator=g).transpose(0, 1)
        b = torch.randn(15, 26, 2, generator=g)

        def fn(a, b):
            return (torch.where(b > 0, b, a).clamp(-1.28, 1.28).sum(),)

        compiled = coil.compile_graph(make_fx(fn)(a, b), [a, b], coil.Options(target="cpp", graph_cache=False))
        exact = fn(a.double(), b.double())[0]
        ours = (compiled(a, b)[0].double() - exact).abs().item()
        eagers = (fn(a, b)[0].double() - exact).abs().item()
        ulp = torch.finfo(torch.float32).eps * exact.abs().item()
        if ours > max(4 * eagers, 2 * ulp):
            bad.append((seed, ours, eagers, ulp))
    assert not bad, bad
    from coil.ir.printer import show
    from tests_helpers import run_until

    text = show(run_until(fn, [a, b], "schedule_kernels", target="cpp"))
    assert "outermost r loop in blocks of 1, each summed apart" in text, text


def test_batch_norm_statistics_over_short_inner_runs_sum_in_blocks() -> None:
    """Found by a sweep of transformers' vision models (LeViT's training step:
    its gradients 2.3x eager's error against float64, Inductor's 1.5x): the mean
    over (N, H, W) of an (8, 16, 4, 4) input runs over two r loops, 8 runs of 16
    values.  GCC gave the inner loop 16 lanes of one value each and added them
    into the row's accumulator one after another, so the row was one add chain of
    128 values; at a mean of 100 and a spread of 0.1 the mean was 4.0e-5 off where
    eager's is 9.7e-6.  The outer loop now runs in blocks of 2 steps, each summed
    in double."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 4, 4, generator=g) * 0.1 + 100.0

    def fn(x):
        return torch.var_mean(x, (0, 2, 3), correction=0)

    compiled = coil.compile_graph(make_fx(fn)(x), [x], coil.Options(target="cpp", graph_cache=False))
    exact = fn(x.double())
    for ours, eagers, want in zip(compiled(x), fn(x), exact):
        err, eager_err = (ours.double() - want).abs().max().item(), (eagers.double() - want).abs().max().item()
        assert err <= max(eager_err, torch.finfo(torch.float32).eps * want.abs().max().item()), (err, eager_err)
    from coil.ir.printer import show
    from tests_helpers import run_until

    text = show(run_until(fn, [x], "schedule_kernels", target="cpp"))
    assert "outermost r loop in blocks of 2, each summed apart" in text, text


# ---- pieces: the innermost loop cut where its comparisons change (passes/schedule/pieces.py) -----


def _rotary(x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor]:
    half = x.shape[-1] // 2
    return (x * p.cos() + torch.cat((-x[..., half:], x[..., :half]), -1) * p.sin(),)


# name, fn, inputs, the pieces of the innermost loop (None: not cut)
PIECE_CASES: list[tuple[str, Callable[..., Any], list[torch.Tensor], str | None]] = [
    ("rotary", _rotary, [torch.randn(3, 2, 8, 32), torch.randn(8, 32)], "[0, 16), [16, 32)"),
    ("uneven_cat", lambda x, y: (torch.cat((x.sin(), y.cos()), -1),), [torch.randn(4, 5), torch.randn(4, 11)],
     "[0, 5), [5, 16)"),
    ("pad_both_ends", lambda x: (F.pad(x.sin(), (2, 3), value=0.5),), [torch.randn(6, 7)], "[0, 2), [2, 9), [9, 12)"),
    ("no_call", lambda x, y: (torch.cat((x.exp(), y), -1),), [torch.randn(4, 5), torch.randn(4, 3)], None),
    ("cut_along_an_outer_dim", lambda x, y: (torch.cat((x, y), 0).sin(),), [torch.randn(3, 8), torch.randn(2, 8)],
     None),
]


@pytest.mark.parametrize("case", PIECE_CASES, ids=[c[0] for c in PIECE_CASES])
def test_a_loop_with_sin_or_cos_runs_in_pieces_without_masks(case: Any) -> None:
    """GCC 12 vectorises no loop that reads through a mask or selects and also calls
    sin or cos (coil's names are no builtins, so it does not if-convert): such a
    nest's innermost loop runs in pieces, each with its comparisons folded, so the
    C++ loops hold no `?` at all.  Without sin or cos (GCC's masked loads then
    work), or with the comparisons along an outer loop, the nest stays whole."""
    from tests_helpers import run_until

    from coil.ir.printer import show

    _, fn, inputs, spans = case
    program = run_until(fn, inputs, "schedule_kernels", target="cpp")
    text = show(program)
    compiled = coil.compile_graph(make_fx(fn)(*inputs), inputs, coil.Options(target="cpp", graph_cache=False))
    kernel = compiled.source[compiled.source.find('extern "C"'):compiled.source.find("'''\n")]
    if spans is None:
        assert "in pieces" not in text, text
    else:
        assert f"innermost x loop in pieces {spans}, its comparisons constant in each" in text, text
        assert "?" not in kernel and kernel.count("#pragma omp simd") == spans.count("["), kernel
    for got, want in zip(compiled(*inputs), fn(*inputs)):
        torch.testing.assert_close(got, want)


def test_the_verifier_refuses_cuts_that_leave_a_comparison_varying() -> None:
    import attrs
    from tests_helpers import run_until

    from coil.ir.verify_kernel import verify_kernel_program

    x, p = torch.randn(2, 4, 32), torch.randn(4, 32)
    program = run_until(_rotary, [x, p], "schedule_kernels", target="cpp")
    verify_kernel_program(program, "schedule_kernels")
    spec = next(s for s in program.specs if s.nest is not None and s.nest.cuts)
    for cuts, word in (((8,), "varies in piece"), ((16, 16), "not increasing"), ((40,), "not increasing")):
        bad = attrs.evolve(spec, nest=attrs.evolve(spec.nest, cuts=cuts))
        with pytest.raises(coil.CoilError, match=f"K10 .*{word}"):
            verify_kernel_program(attrs.evolve(program, specs=tuple(bad if s is spec else s for s in program.specs)),
                                  "schedule_kernels")


@settings(max_examples=25, deadline=None)
@given(widths=st.lists(st.integers(1, 9), min_size=1, max_size=3), pad=st.tuples(st.integers(-2, 4), st.integers(-2, 4)),
       rows=st.integers(1, 4), unary=st.sampled_from(["sin", "cos"]), neg_half=st.booleans())
def test_pieces_of_cats_and_pads_under_sin_and_cos_match_eager(widths: list[int], pad: tuple[int, int], rows: int,
                                                                unary: str, neg_half: bool) -> None:
    """Any cat of a few widths along the innermost dim, padded (or cropped, by a
    negative pad) at either end, through sin or cos, with a rotary-style negated
    half: whether its loop is cut into pieces or not, the values are eager's."""
    parts = [torch.randn(rows, w) for w in widths]

    def fn(*xs: torch.Tensor) -> tuple[torch.Tensor]:
        ys = [getattr(x, unary)() if k % 2 == 0 else x for k, x in enumerate(xs)]
        if neg_half:
            ys[0] = -ys[0]
        y = torch.cat(ys, -1)
        if y.shape[-1] + min(pad[0], 0) + min(pad[1], 0) <= 0:  # cropped away
            return (y.sin(),)
        return (getattr(F.pad(y, pad, value=0.25), unary)() * y.sum(-1, keepdim=True).cos(),)

    got = coil.compile_graph(make_fx(fn)(*parts), parts, coil.Options(target="cpp", graph_cache=False))(*parts)
    torch.testing.assert_close(got[0], fn(*parts)[0])


# ---- guards: the innermost loop in versions by comparisons of outer loops (pieces.py) ----------


def _stem(x: torch.Tensor, w: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor]:
    """ResNet's stem: the pool runs channels-last, channels innermost, its window's
    masks along h and w (outer loops)."""
    y = torch.relu(F.conv2d(x, w, stride=2, padding=3))
    p = torch.ops.aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0]
    return (F.conv2d(p, w2).sum(),)


def _pool(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ops.aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])


# name, fn, inputs, the versions as printed (None: none), whether every mask is an outer loop's
GUARD_CASES: list[tuple[str, Callable[..., Any], list[torch.Tensor], str | None, bool]] = [
    ("channels_last_pool", _stem, [torch.randn(1, 3, 32, 32), torch.randn(8, 3, 7, 7), torch.randn(8, 8, 1, 1)],
     "4 versions (of 4), one for each value the loops reach of the outer loops' (2*ix1 - 1 >= 0), (2*ix0 - 1 >= 0)",
     True),
    # NCHW: its window's masks along w read the innermost loop, which runs in pieces
    # in every version (versions alone kept masked loads, and MobileNetV2's pads
    # vectorized not); where every guard holds, the middle piece reads unmasked
    ("pool_with_indices", _pool, [torch.randn(2, 4, 9, 11)],
     "3 versions (of 4), one for each value the loops reach of the outer loops' (2*ix1 + 1 < 9), (2*ix1 - 1 >= 0)",
     True),
    ("pad_along_the_last_two_dims", lambda x: (F.pad(x.relu(), (1, 1, 1, 1)),), [torch.randn(2, 3, 5, 6)],
     "3 versions (of 4), one for each value the loops reach of the outer loops' (ix1 >= 1), (ix1 < 6)", True),
    # a cat along the innermost dim: its masks read that loop alone: neither (GCC
    # if-converts the loop and vectorizes it with masked loads)
    ("cat_along_the_last_dim", lambda x, y: (torch.cat((x, y), -1) * 2,), [torch.randn(3, 8), torch.randn(3, 5)],
     None, False),
    ("cat_along_an_outer_dim", lambda x, y: (torch.cat((x, y), 0) * 2,), [torch.randn(3, 8), torch.randn(2, 8)],
     "2 versions (of 4), one for each value the loops reach of the outer loops' (ix0 < 3), (ix0 >= 3)", True),
]


@pytest.mark.parametrize("case", GUARD_CASES, ids=[c[0] for c in GUARD_CASES])
def test_loads_masked_by_outer_loops_run_in_versions_of_the_inner_loop(case: Any) -> None:
    """GCC 12 vectorizes no version of a loop whose loads are masked, even where
    the mask is constant along it: a channels-last 3x3 max_pool2d over 64 channels
    took 1344 us a call, 37 with the masks decided.  The comparisons of outer loops
    that mask loads (LoopNest.guards) are computed before the innermost loop, which
    runs in one version for each of their values: in the version where all hold,
    no load is masked."""
    from tests_helpers import run_until

    from coil.ir.printer import show

    _, fn, inputs, versions, outer_only = case
    text = show(run_until(fn, inputs, "schedule_kernels", target="cpp"))
    compiled = coil.compile_graph(make_fx(fn)(*inputs), inputs, coil.Options(target="cpp", graph_cache=False))
    source = compiled.source
    if versions is None:
        assert "versions" not in text and "guard" not in source, text
    else:
        assert f"innermost x loop in {versions}" in text, text
        assert ("innermost x loop in pieces" in text) == (case[0] in ("pool_with_indices", "pad_along_the_last_two_dims")), text
        n = int(versions.split()[0])
        start = source.find("if (guard")
        assert start > 0 and source.count("#pragma omp simd", start) >= n, source
        first = source[start:source.find("} else if", start)]  # the version where every guard holds
        assert ("? in_ptr" not in first) == outer_only, first
        if case[0] == "pool_with_indices":
            # the index taken is never -1 there (some element of the window taken):
            # GCC 12 made `index < 0` control flow and vectorized no piece of the loop
            assert "< static_cast<int64_t>(0LL)" not in first, first
    for got, want in zip(compiled(*inputs), fn(*inputs)):
        if got.dtype == torch.int64:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_the_verifier_refuses_bad_guards_and_versions() -> None:
    import attrs
    from tests_helpers import run_until

    from coil.ir.expr import Constant, IndexExpr, Op
    from coil.ir.verify_kernel import verify_kernel_program

    inputs = [torch.randn(1, 3, 32, 32), torch.randn(8, 3, 7, 7), torch.randn(8, 8, 1, 1)]
    program = run_until(_stem, inputs, "schedule_kernels", target="cpp")
    verify_kernel_program(program, "schedule_kernels")
    spec = next(s for s in program.specs if s.nest is not None and s.nest.guards)
    nest = spec.nest
    inner = Op("ge", (IndexExpr(sympy.Symbol("ix2", integer=True, nonnegative=True) - 1, torch.int64),
                      Constant(0, torch.int64)), torch.bool)
    for guards, versions, word in (((nest.guards[0], nest.guards[0]), nest.versions, "a guard twice"),
                                   ((inner,), ((True,), (False,)), "reading outer loop variables alone"),
                                   (nest.guards, (), "versions \\[\\]: none"),
                                   (nest.guards, nest.versions[:1] * 2, "one twice"),
                                   (nest.guards, ((True,),), "not one value a guard")):
        bad = attrs.evolve(spec, nest=attrs.evolve(nest, guards=guards, versions=versions))
        with pytest.raises(coil.CoilError, match=f"K10 .*{word}"):
            verify_kernel_program(attrs.evolve(program, specs=tuple(bad if s is spec else s for s in program.specs)),
                                  "schedule_kernels")


@settings(max_examples=25, deadline=None)
@given(size=st.tuples(st.integers(3, 9), st.integers(3, 9)), kernel=st.integers(1, 3), stride=st.integers(1, 3),
       pad=st.integers(0, 1), channels_last=st.booleans(), cat=st.integers(1, 3))
def test_pools_and_outer_cats_in_versions_match_eager(size: tuple[int, int], kernel: int, stride: int, pad: int,
                                                      channels_last: bool, cat: int) -> None:
    """max_pool2d of any small window, stride and padding, channels-last or not,
    beside a cat along an outer dim: whatever versions the loops run in, the values
    and indices are eager's."""
    pad = min(pad, kernel // 2)
    x = torch.randn(2, 3, *size)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = torch.randn(cat, 3, *size)

    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        v, i = torch.ops.aten.max_pool2d_with_indices.default(a, [kernel, kernel], [stride, stride], [pad, pad])
        return v, i, torch.cat((a, b), 0).relu()

    got = coil.compile_graph(make_fx(fn)(x, y), [x, y], coil.Options(target="cpp", graph_cache=False))(x, y)
    for g, w in zip(got, fn(x, y)):
        assert torch.equal(g, w)
    # every value of the guards that the outer loops reach, point by point, is a version
    from tests_helpers import run_until

    from coil.ir.bounds import value_over

    for spec in run_until(fn, [x, y], "schedule_kernels", target="cpp").specs:
        nest = spec.nest
        if nest is None or not nest.guards:
            continue
        outer = [sympy.Symbol(f"ix{i}", integer=True, nonnegative=True) for i in range(len(nest.xsizes) - 1)]
        for point in itertools.product(*(range(n) for n in nest.xsizes[:-1])):
            values = []
            for g in nest.guards:
                e = coil.ir.expr.substitute_symbols(g, {s: sympy.Integer(v) for s, v in zip(outer[1:], point[1:])})
                values.append(value_over(e, outer[0], point[0], point[0] + 1))
            assert tuple(values) in nest.versions, (point, values, nest.versions)


def _clamped_sum(c: float) -> Callable[[torch.Tensor], tuple[torch.Tensor]]:
    def fn(a: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.clamp(a.abs() + 1, -c, c).sum(),)

    return fn


@pytest.mark.parametrize("case", ["blocks", "even_split"])
def test_a_sum_over_several_r_loops_of_equal_values_rounds_once(case: str) -> None:
    """Found by `coil fuzz --target cpp` (seed 20261210, 3 of 500): many equal
    values (a clamp to a small constant) summed over several r loops, a transposed
    input's (a row in blocks of its outer r loop) or a cat of expanded ones' (a
    split dealt out evenly to threads).  Each block or part added its inner runs'
    partials into one float, one after another, and every rounding went the same
    way: 1.7e-6 off, relative, where eager's cascade is 5e-8.  They now sum and fold
    in double, rounded to float once.  Since the r loops walk memory in order
    (reductions.memory_order), those inputs are one loop; a slice's rows, not
    contiguous with the next, keep two."""
    if case == "blocks":
        c, a = 0.06993006993006994, torch.randn(26, 50, 12)[:, :, :11]  # 14300 values
    else:
        c, a = 0.016592553262095973, torch.randn(40, 26, 64)[:, :, :58].permute(2, 0, 1)  # 60320 values
    fn = _clamped_sum(c)
    compiled = coil.compile_graph(make_fx(fn)(a), [a], coil.Options(target="cpp", graph_cache=False))
    kernel = compiled.source[compiled.source.find('extern "C"'):]
    assert "double acc" in kernel and "ir1" in kernel, kernel
    exact = torch.tensor(c, dtype=torch.float32).double() * a.numel()
    got = compiled(a)[0].double()
    assert abs(got - exact) / exact < 1e-7, (got, exact)
    torch.testing.assert_close(compiled(a)[0], fn(a)[0])


def test_the_outer_loops_span_in_a_version_is_where_its_guards_have_their_values() -> None:
    """NCHW max_pool2d over 9 rows: the guards (2*ix1 + 1 < 9) and (2*ix1 - 1 >= 0)
    both hold for output rows 1-3, the first fails at row 4, the second at row 0;
    the pieces of each version fold comparisons over those spans."""
    from tests_helpers import run_until

    from coil.ir.printer_kernel import comparison_text
    from coil.passes.schedule.pieces import outer_spans

    program = run_until(_pool, [torch.randn(2, 4, 9, 11)], "schedule_kernels", target="cpp")
    (spec,) = program.specs
    nest = spec.nest
    x0, x1 = sympy.Symbol("ix0", integer=True, nonnegative=True), sympy.Symbol("ix1", integer=True, nonnegative=True)
    assert [comparison_text(g) for g in nest.guards] == ["(2*ix1 + 1 < 9)", "(2*ix1 - 1 >= 0)"]
    spans = {values: outer_spans(nest, values) for values in nest.versions}
    assert spans == {(True, True): {x0: (0, 8), x1: (1, 4)}, (False, True): {x0: (0, 8), x1: (4, 5)},
                     (True, False): {x0: (0, 8), x1: (0, 1)}}, spans
    assert outer_spans(nest) == {x0: (0, 8), x1: (0, 5)}
