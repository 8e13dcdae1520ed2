"""Elementwise and creation lowerings against eager PyTorch.

Every case of POINTWISE_CASES, CREATION_CASES and PROMOTION_CASES is traced with
make_fx, lowered, realized and run by the reference interpreter, then compared with
eager.  Each run also checks that the op was lowered (no ExternBuffer) and that the
body is well typed, which the reference interpreter alone would not notice (torch
promotes mixed operands silently; a C++ or Triton backend would not).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil.ir.buffers import BufferGraph, ComputedBuffer, ExternBuffer
from coil.ir.expr import COMPARISONS, LOGICAL, Cast, Constant, Expr, Op, walk
from coil.ir.lowered import LoweredGraph, Pointwise
from coil.ir.printer import show
from coil.options import Options
from coil.passes.lowerings import LOWERINGS
from coil.passes.lowerings.registry import LowerCtx
from op_cases import (
    BOOL,
    CREATION_CASES,
    F16,
    F32,
    F64,
    I32,
    I64,
    LOWER_REALIZE,
    POINTWISE_CASES,
    PROMOTION_CASES,
    OpCase,
    buffer_graph,
    check_case,
    run_buffers,
)

aten = torch.ops.aten
HALF = (torch.float16, torch.bfloat16)


# ---- what every lowered body must satisfy ---------------------------------------------------


def _constant_error(c: Constant) -> str | None:
    want = bool if c.dtype == torch.bool else float if c.dtype.is_floating_point else int
    return None if type(c.value) is want else f"constant {c.value!r} is {type(c.value).__name__}, dtype {c.dtype}"


def _op_error(e: Op) -> str | None:
    """Arguments agree with the op: comparisons compare one dtype and give bool,
    logical ops and where's condition take bools, arithmetic stays in its dtype and
    never in a half type (half types compute in float32)."""
    dts = [a.dtype for a in e.args]
    if e.name == "where":
        ok = dts[0] == torch.bool and dts[1] == dts[2] == e.dtype
    elif e.name in LOGICAL:
        ok = all(d == torch.bool for d in dts) and e.dtype == torch.bool
    elif e.name in COMPARISONS:
        ok = len(set(dts)) == 1 and e.dtype == torch.bool and dts[0] not in HALF
    else:
        ok = all(d == e.dtype for d in dts) and e.dtype not in HALF
    return None if ok else f"{e.name}{tuple(dts)} -> {e.dtype}"


def body_errors(body: Expr) -> list[str]:
    errors: list[str | None] = []
    for e in walk(body):
        if isinstance(e, Constant):
            errors.append(_constant_error(e))
        elif isinstance(e, Op):
            errors.append(_op_error(e))
    return [e for e in errors if e is not None]


def externs(bg: BufferGraph) -> list[str]:
    return [b.kernel for b in bg.buffers if isinstance(b, ExternBuffer)]


def graph_body_errors(bg: BufferGraph) -> list[str]:
    return [f"{b.name}: {err}" for b in bg.buffers if isinstance(b, ComputedBuffer) for err in body_errors(b.body)]


# ---- the table ---------------------------------------------------------------------------------


def _dtypes_for(case: OpCase, shape_kind: str) -> Sequence[torch.dtype]:
    """Every dtype on broadcast shapes; float32 (or the first) and one more on
    strided inputs; one on expanded and 0-d inputs.  Keeps the run short."""
    if shape_kind == "broadcast":
        return case.dtypes
    return case.dtypes[:2] if shape_kind == "noncontig" else case.dtypes[:1]


def _params(cases: Sequence[OpCase]) -> Iterator[Any]:
    for case in cases:
        for kind in case.shape_kinds:
            for dt in _dtypes_for(case, kind):
                yield pytest.param(case, kind, dt, id=f"{case.name}-{kind}-{str(dt).removeprefix('torch.')}")


def _check_lowered(case: OpCase, shape_kind: str, dtype: torch.dtype) -> torch.Tensor:
    """check_case through the reference runner, keeping the BufferGraph to assert no
    Extern fallback and well-typed bodies; returns the first output."""
    graphs: list[BufferGraph] = []

    def runner(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        graphs.append(buffer_graph(gm, inputs))
        return run_buffers(graphs[-1], inputs)

    checked = check_case(case, shape_kind, dtype, runner)
    (bg,) = graphs
    assert externs(bg) == [], f"{case.name} fell back to an Extern:\n{show(bg)}"
    assert graph_body_errors(bg) == [], f"{case.name}: ill-typed body:\n{show(bg)}"
    return checked.actual[0]


@pytest.mark.parametrize("case, shape_kind, dtype", list(_params(POINTWISE_CASES)))
def test_pointwise(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    _check_lowered(case, shape_kind, dtype)


@pytest.mark.parametrize("case, shape_kind, dtype", list(_params(CREATION_CASES)))
def test_creation(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    _check_lowered(case, shape_kind, dtype)


PROMOTED: dict[str, torch.dtype] = {
    "int32_plus_float_scalar": F32,
    "int64_times_float_scalar": F32,
    "bool_plus_int_scalar": I64,
    "f16_plus_float_scalar": F16,
    "int32_plus_int64": I64,
    "f16_plus_f32": F32,
    "bf16_plus_f16": F32,
    "bool_plus_int32": I32,
    "int32_plus_f64": F64,
    "zerodim_f64_plus_f16": F16,  # a 0-d tensor of the same category does not promote
    "zerodim_f32_plus_int32": F32,  # ... one of a higher category does
    "zerodim_int64_plus_int32": I32,
    "zerodim_int64_times_bool": I64,
    "div_int32_int32": F32,
    "div_int64_scalar": F32,
    "floor_div_int32_int64": I64,
    "exp_int64": F32,
    "sqrt_bool": F32,
    "pow_int32_f32": F32,
    "pow_bool_scalar": I64,
    "where_int32_f16": F16,
    "eq_int32_f32": BOOL,
    "clamp_int32_f32_bounds": F32,
    "maximum_f16_zerodim_f32": F16,
}


def test_promotion_table_is_complete() -> None:
    assert sorted(PROMOTED) == sorted(c.name for c in PROMOTION_CASES)


@pytest.mark.parametrize("case, shape_kind, dtype", list(_params(PROMOTION_CASES)))
def test_type_promotion(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    assert _check_lowered(case, shape_kind, dtype).dtype == PROMOTED[case.name]


def test_all_zero_dim_inputs_give_a_zero_dim_result() -> None:
    x, y = torch.tensor(3, dtype=torch.int32), torch.tensor(0.25, dtype=torch.float64)
    gm = make_fx(lambda a, b: a * b + 1)(x, y)
    (out,) = run_buffers(buffer_graph(gm, (x, y)), (x, y))
    assert out.shape == () and out.dtype == torch.float64 and out.item() == 1.75


# ---- what the lowerings emit ----------------------------------------------------------------


def _lowered(fn: Any, *inputs: torch.Tensor) -> LoweredGraph:
    lg = LOWER_REALIZE.run(make_fx(fn)(*inputs), inputs, until="lower", options=Options(target="reference"))
    assert isinstance(lg, LoweredGraph)
    return lg


def _op_names(lg: LoweredGraph) -> list[str]:
    return [e.name for n in lg.nodes if isinstance(n, Pointwise) for e in walk(n.body) if isinstance(e, Op)]


@pytest.mark.parametrize(
    "fn, ops",
    [
        (lambda b: b + b, ["logical_or"]),
        (lambda b: b * b, ["logical_and"]),
        (lambda b: ~b, ["logical_not"]),
        (lambda b: b & b, ["logical_and"]),
        (lambda b: b | b, ["logical_or"]),
        (lambda b: b ^ b, ["logical_xor"]),
        (lambda b: torch.maximum(b, b), ["logical_or"]),
        (lambda b: torch.minimum(b, b), ["logical_and"]),
    ],
)
def test_bool_arithmetic_lowers_to_logical_ops(fn: Any, ops: list[str]) -> None:
    """Triton's int1 would wrap True + True to False, C's ~true is -2: on bools the
    arithmetic and bitwise ops are the logical ones, as in Inductor."""
    b = torch.tensor([[True, False], [True, True]])
    assert _op_names(_lowered(fn, b)) == ops


@pytest.mark.parametrize(
    "exponent, ops",
    [(2, ["mul"]), (2.0, ["mul"]), (0.5, ["sqrt"]), (-1.0, ["reciprocal"]), (1, []), (0, []),
     (3, ["mul", "mul"]), (3.0, ["mul", "mul"]), (4, ["mul", "mul"]), (-2, ["mul", "reciprocal"]),
     (-4.0, ["mul", "mul", "reciprocal"]), (5, ["pow"]), (1.7, ["pow"])],
)
def test_pow_scalar_exponent_uses_exact_ops(exponent: float, ops: list[str]) -> None:
    assert _op_names(_lowered(lambda x: torch.pow(x, exponent), torch.rand(3) + 0.5)) == ops


@pytest.mark.parametrize("fn", [torch.floor, torch.ceil, torch.trunc, torch.round])
def test_rounding_an_integer_tensor_is_a_copy(fn: Any) -> None:
    x = torch.tensor([-3, 0, 7], dtype=torch.int32)
    lg = _lowered(fn, x)
    assert _op_names(lg) == []
    torch.testing.assert_close(run_buffers(buffer_graph(make_fx(fn)(x), (x,)), (x,))[0], fn(x))


@pytest.mark.parametrize(
    "decimals, values, expected",
    [
        (-1, [15.0, 25.0, 35.0, -45.0, 1234.5, 0.5], [20.0, 20.0, 40.0, -40.0, 1230.0, 0.0]),
        (-2, [-13650.0009765625, 250.0], [-13700.0, 200.0]),
        (-3, [-11258.3984375, 2500.0], [-11000.0, 2000.0]),
        (2, [0.125, -1.005], [0.12, -1.0]),
    ],
)
def test_round_decimals_is_exact_like_eager(decimals: int, values: list[float], expected: list[float]) -> None:
    """aten scales by an exact power of ten: x / 100 for decimals=-2, where x * 0.01
    (0.01 inexact) rounds -13650.001 the other way and leaves -10999.999 for -11000."""
    x = torch.tensor(values)
    gm = make_fx(lambda t: torch.round(t, decimals=decimals))(x)
    (out,) = run_buffers(buffer_graph(gm, (x,)), (x,))
    assert out.tolist() == torch.round(x, decimals=decimals).tolist() == torch.tensor(expected).tolist()


def test_logical_ops_read_their_inputs_as_bool() -> None:
    lg = _lowered(torch.logical_and, torch.tensor([0.0, 0.5, -2.0]), torch.tensor([3, 0, 1], dtype=torch.int32))
    (node,) = [n for n in lg.nodes if isinstance(n, Pointwise)]
    casts = [e for e in walk(node.body) if isinstance(e, Cast)]
    assert [(c.arg.dtype, c.dtype) for c in casts] == [(torch.float32, torch.bool), (torch.int32, torch.bool)]


def test_golden_int_tensor_times_float_scalar_plus_mask() -> None:
    x = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    m = torch.tensor([True, False, True])
    text = show(_lowered(lambda a, b: a * 2.5 + b, x, m))
    assert text == "\n".join([
        "LoweredGraph",
        "  a_1 = Input(int32[2, 3] stride=[3, 1] cpu)",
        "  b_1 = Input(bool[3] stride=[1] cpu)",
        "  mul = Pointwise[float32[2, 3]] from mul (mul):",
        "    t0: int32 = load a_1[x0, x1]",
        "    t1: float32 = cast(t0)",
        "    t2: float32 = mul(t1, 2.5)",
        "    return t2",
        "  add = Pointwise[float32[2, 3]] from add (add):",
        "    t0: float32 = load mul[x0, x1]",
        "    t1: bool = load b_1[x1]",
        "    t2: float32 = cast(t1)",
        "    t3: float32 = add(t0, t2)",
        "    return t3",
        "  return (add,)",
    ])


# ---- registration and fallback --------------------------------------------------------------


def test_packets_register_only_functional_tensor_overloads() -> None:
    """`out=` variants and the Python-scalar overloads of a packet (`aten.add.int`,
    list concatenation `aten.add.t`) are not elementwise tensor ops: they stay Externs."""
    for lowered in (aten.add.Tensor, aten.add.Scalar, aten.pow.Scalar, aten.where.ScalarOther, aten.round.decimals):
        assert lowered in LOWERINGS, lowered
    for extern in (aten.add.out, aten.add.int, aten.add.t, aten.pow.Tensor_Scalar_out, aten.eq.int, aten.round.float):
        assert extern not in LOWERINGS, extern


def test_creation_honours_the_device_argument() -> None:
    ctx = LowerCtx("full", "full", "cpu")
    v = LOWERINGS[aten.full.default](ctx, [2, 3], 1.5, dtype=torch.float32, device=torch.device("cuda", 1))
    assert v.device == "cuda:1" and ctx.nodes[-1].device == "cuda:1"
    w = LOWERINGS[aten.arange.start](ctx, 0, 4, dtype=torch.int64)
    assert w.device == "cpu" and w.size == (4,)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_unknown_op_falls_back_to_extern(layout: str) -> None:
    x = torch.randn(5, 4)
    x = x.t().contiguous().t() if layout == "transposed" else x

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = torch.ops.aten.cumprod.default(t, 1)
        return c, c * 2 + t

    gm = make_fx(fn)(x)
    bg = buffer_graph(gm, (x,))
    assert externs(bg) == ["aten.cumprod.default"]
    assert any(isinstance(b, ComputedBuffer) for b in bg.buffers)  # the pointwise tail is still lowered
    for got, want in zip(run_buffers(bg, (x,)), fn(x)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
def test_negative_zero_is_not_merged_with_zero_in_one_kernel(target: str) -> None:
    """A kernel shares equal subexpressions across its nodes (evaluate's memo): -0.0
    and 0.0 are equal to Python, but a Constant keeps them apart (its value compares
    by repr), so where(x > 0, x, -0.0) keeps eager's sign bits next to the 0.0 of its
    comparison, and NaN constants still merge with each other."""
    import coil
    from tests_helpers import target_available

    if not target_available(target):
        pytest.skip(f"{target} is not available here")
    assert Constant(-0.0, torch.float32) != Constant(0.0, torch.float32)
    assert Constant(float("nan"), torch.float32) == Constant(float("nan"), torch.float32)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.where(x > 0, x, torch.full_like(x, -0.0)), torch.where(x < 0, torch.zeros_like(x), x * -0.0)

    x = torch.randn(64)
    compiled = coil.compile_graph(make_fx(fn)(x), [x], Options(target=target, graph_cache=False))
    for got, want in zip(compiled(x), fn(x)):
        torch.testing.assert_close(got, want)
        assert torch.equal(torch.signbit(got), torch.signbit(want))
