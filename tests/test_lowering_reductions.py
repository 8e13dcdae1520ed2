"""Reduction lowerings against eager PyTorch: every case of REDUCTION_CASES on a
broadcast and a non-contiguous input, in float32 and at least one other dtype,
through lower + realize + the reference interpreter.  Each also checks the IR: no
Extern, and the reduction types the lowering is meant to use."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil.backends.reference import run_buffer_graph
from coil.ir.buffers import BufferGraph, ComputedBuffer, ExternBuffer
from coil.ir.expr import loads
from op_cases import (
    REDUCTION_CASES,
    REDUCTION_TYPES_OF,
    OpCase,
    buffer_graph,
    check_case_buffers,
    combination_id,
    combinations,
)


# Why a non-reduction buffer may exist in a reduction graph: it is an output, an
# output that is a view of a reduction (argmax keepdim), or the broadcast input two
# reductions read (max.dim's values and indices, var_mean's two halves).
ALLOWED_RULES = frozenset({"reduction", "output", "output_view", "reuse"})


def _reduction_types(bg: BufferGraph) -> set[str]:
    return {b.reduction_type for b in bg.buffers if isinstance(b, ComputedBuffer) and b.reduction_type is not None}


@pytest.mark.parametrize("case, shape_kind, dtype", combinations(REDUCTION_CASES), ids=combination_id)
def test_reduction_matches_eager(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    _, bg = check_case_buffers(case, shape_kind, dtype)
    externs = [b.kernel for b in bg.buffers if isinstance(b, ExternBuffer)]
    assert not externs, f"{case.name} fell back to Extern: {externs}"
    assert {b.rule for b in bg.buffers} <= ALLOWED_RULES, [(b.name, b.rule) for b in bg.buffers]
    expected = REDUCTION_TYPES_OF.get(case.name)
    if expected is not None:
        assert _reduction_types(bg) == expected


def test_every_case_table_entry_is_unique() -> None:
    names = [c.name for c in REDUCTION_CASES]
    assert len(names) == len(set(names))
    assert set(REDUCTION_TYPES_OF) <= set(names)


@pytest.mark.parametrize("name", ["sum_dim", "amax_dim", "argmin_dim", "any_dim", "mean_dim", "var_dim", "prod_dim"])
def test_single_reduction_inlines_its_broadcast_input(name: str) -> None:
    """x + y has one reader, the reduction: its body reads both inputs itself."""
    case = next(c for c in REDUCTION_CASES if c.name == name)
    _, bg = check_case_buffers(case, "broadcast", torch.float32)
    (red,) = [b for b in bg.buffers if isinstance(b, ComputedBuffer) and b.is_reduction]
    assert {ld.name for ld in loads(red.body)} == {i.name for i in bg.inputs}
    assert all(b.rule in ("reduction", "output") for b in bg.buffers)


def _run(fn: Any, *inputs: torch.Tensor) -> tuple[BufferGraph, tuple[torch.Tensor, ...]]:
    gm = make_fx(fn)(*inputs)
    bg = buffer_graph(gm, inputs)
    outs = run_buffer_graph(bg, inputs)
    return bg, tuple(o for o in outs if o is not None)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sum(1),
        lambda x: x.prod(1, keepdim=True),
        lambda x: x.any(1),
        lambda x: x.all(-1),
        lambda x: x.mean(1),
        lambda x: x.sum(),
    ],
    ids=["sum", "prod_keepdim", "any", "all", "mean_nan", "sum_all"],
)
def test_reduction_over_empty_dim_gives_identity(fn: Any) -> None:
    x = torch.randn(3, 0)
    _, (out,) = _run(fn, x)
    torch.testing.assert_close(out, fn(x), equal_nan=True)


@pytest.mark.parametrize(
    "fn",
    [lambda x: x.sum(), lambda x: x.argmax(), lambda x: x.argmin(0, keepdim=True), lambda x: x.amax(),
     lambda x: torch.var_mean(x, correction=0)],
    ids=["sum", "argmax", "argmin_keepdim", "amax", "var_mean"],
)
def test_reduction_of_zero_dim_tensor(fn: Any) -> None:
    x = torch.tensor(2.5)
    _, outs = _run(fn, x)
    expected = fn(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for o, e in zip(outs, expected, strict=True):
        torch.testing.assert_close(o, e, equal_nan=True)


def test_any_of_uint8_stays_uint8() -> None:
    x = torch.tensor([[0, 3, 0], [0, 0, 0]], dtype=torch.uint8)
    _, (out,) = _run(lambda t: t.any(1), x)
    assert out.dtype == torch.uint8
    torch.testing.assert_close(out, x.any(1))


def test_binary_max_min_are_elementwise() -> None:
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    bg, (hi, lo) = _run(lambda x, y: (torch.ops.aten.max.other(x, y), torch.ops.aten.min.other(x, y)), a, b)
    assert not _reduction_types(bg)
    torch.testing.assert_close(hi, torch.maximum(a, b))
    torch.testing.assert_close(lo, torch.minimum(a, b))


def test_max_dim_of_bool_mask_gives_first_true_index() -> None:
    m = torch.tensor([[False, True, True], [False, False, False]])
    _, (values, indices) = _run(lambda x: torch.max(x, 1), m)
    torch.testing.assert_close(values, torch.tensor([True, False]))
    torch.testing.assert_close(indices, torch.tensor([1, 0]))


@pytest.mark.filterwarnings("ignore:.*degrees of freedom")
@pytest.mark.parametrize("correction", [0, 1, 2.5, 4, 5])
def test_var_divides_by_n_minus_correction_clamped_at_zero(correction: float) -> None:
    """n = 4: correction 4 divides by zero (inf), 5 by max(-1, 0) = 0 too."""
    x = torch.tensor([[1.0, 2.0, 4.0, 8.0], [3.0, 3.0, 3.0, 3.0]])
    _, (out,) = _run(lambda t: t.var(1, correction=correction), x)
    torch.testing.assert_close(out, x.var(1, correction=correction), equal_nan=True)


def test_var_is_welford_m2_over_the_reduced_elements() -> None:
    """The welford_m2 reduction sums squared deviations from the row mean."""
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    bg, (out,) = _run(lambda t: t.var(1, correction=0), x)
    assert _reduction_types(bg) == {"welford_m2"}
    torch.testing.assert_close(out, torch.tensor([3.5]))  # mean 3: m2 = 4 + 1 + 0 + 9 = 14, / 4


@pytest.mark.parametrize("target", ["reference", "cpp"])
@pytest.mark.parametrize(
    "fn, shape",
    [(lambda x: x.amax(1), (0, 4)), (lambda x: x.max(1), (0, 3)), (lambda x: x.argmin(-1), (2, 0, 3)),
     (lambda x: torch.softmax(x, -1), (5, 0, 0)), (lambda x: x.sum(0), (3, 0))],
    ids=["amax", "max_dim", "argmin", "softmax_empty_rows", "sum"],
)
def test_reduction_into_empty_output(fn: Any, shape: tuple[int, ...], target: str) -> None:
    """An output of no elements needs no reduction, even one without an identity
    (OpInfo's softmax of a (5, 0, 0) input: amax over one -inf pad into (5, 0, 1))."""
    import coil

    x = torch.randn(shape)
    compiled = coil.compile_graph(make_fx(fn)(x), [x], coil.Options(target=target, graph_cache=False))
    expected = fn(x)
    expected = tuple(expected) if isinstance(expected, tuple) else (expected,)
    for o, e in zip(compiled(x), expected, strict=True):
        torch.testing.assert_close(o, e)


def test_a_reduction_walks_its_dims_in_memory_order() -> None:
    """A channels-last tensor's sum reads memory in order: the r symbols take the
    dims by stride, largest first (C, the innermost in memory, last), and the
    index names them where they stand.  A partial sum of a transposed input
    likewise; argmax of all dims keeps the logical order its index counts in."""
    from tests_helpers import run_until

    from coil.ir.printer import show

    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    printed = show(run_until(lambda a: (a.sum(),), [x], "lower"))
    assert "sum_1 = Reduction[sum, float32[] over [2, 4, 5, 3]]" in printed, printed
    assert "load a_1[r0, r3, r1, r2]" in printed, printed
    t = x.permute(0, 1, 3, 2)  # strides (60, 1, 3, 15)
    printed = show(run_until(lambda a: (a.sum((2, 3)), a.argmax()), [t], "lower"))
    assert "sum_1 = Reduction[sum, float32[2, 3] over [4, 5]]" in printed, printed
    assert "load a_1[x0, x1, r1, r0]" in printed, printed
    assert "argmax__1 = Reduction[argmax, int64[] over [120]]" in printed and "load argmax[r0]" in printed, printed


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_reductions_of_a_channels_last_tensor_match_eager(target: str) -> None:
    """sum, mean, var, amax, prod and argmax over all or some dims of a
    channels-last tensor, its r loops in memory order (one loop on the cpp
    target: 57 against 5 us for x.sum() at 1x64x32x32, one thread)."""
    import coil

    x = torch.randn(2, 16, 6, 7).to(memory_format=torch.channels_last)

    def fn(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (a.sum(), a.mean((0, 2, 3)), a.var((1, 2)), a.amax((1, 3)), (a * 0.1 + 1).prod(),
                a.argmax(), a.sum((2, 3), keepdim=True))

    compiled = coil.compile_graph(make_fx(fn)(x), [x], coil.Options(target=target, graph_cache=False))
    for got, want in zip(compiled(x), fn(x), strict=True):
        torch.testing.assert_close(got, want)
    if target == "cpp":
        one = coil.compile_graph(make_fx(lambda a: (a.sum(),))(x), [x], coil.Options(target="cpp", graph_cache=False))
        kernel = one.source[one.source.find('extern "C"'):]
        assert "ir0" in kernel and "ir1" not in kernel, kernel
