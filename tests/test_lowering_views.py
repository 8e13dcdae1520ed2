"""View lowerings: each view is an index remap folded into its reader, never a copy.

Every case of VIEW_CASES runs on a broadcast (stride-0) and a non-contiguous input
and is compared with eager; its IR must hold no Extern and no buffer but the
outputs of its pointwise consumer.  Views that are graph outputs become aliases of
their base (no copy) when their offset is affine, else one copy."""

from __future__ import annotations

from typing import Any, Sequence

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from coil.backends.reference import run_buffer_graph
from coil.ir.buffers import AliasBuffer, BufferGraph, ComputedBuffer, ExternBuffer
from coil.ir.expr import loads, xsym
from op_cases import VIEW_CASES, OpCase, buffer_graph, check_case_buffers, combination_id, combinations


@pytest.mark.parametrize("case, shape_kind, dtype", combinations(VIEW_CASES), ids=combination_id)
def test_view_folds_into_pointwise_consumer(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    checked, bg = check_case_buffers(case, shape_kind, dtype)
    kinds = [(b.name, type(b).__name__, b.rule) for b in bg.buffers]
    # one computed buffer per output, each the consumer itself: the views (and any
    # clone that reshape put before _unsafe_view) are inlined, none materialized
    assert all(isinstance(b, ComputedBuffer) and b.rule == "output" for b in bg.buffers), kinds
    assert len(bg.buffers) == len(checked.expected), kinds
    view_rows = [r for r in bg.realize_table if r.ir_node == "View"]
    assert view_rows and all(not r.realized and r.rule.startswith("index_remap") for r in view_rows)


def test_view_case_names_are_unique() -> None:
    names = [c.name for c in VIEW_CASES]
    assert len(names) == len(set(names))


def _buffers(fn: Any, *inputs: torch.Tensor) -> tuple[BufferGraph, tuple[torch.Tensor, ...]]:
    gm = make_fx(fn)(*inputs)
    bg = buffer_graph(gm, inputs)
    outs = run_buffer_graph(bg, inputs)
    expected = fn(*inputs)
    expected = tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)
    got = tuple(o for o in outs if o is not None)
    assert len(got) == len(expected)
    for o, e in zip(got, expected, strict=True):
        torch.testing.assert_close(o, e)
    return bg, got


def test_transpose_is_a_swapped_load_index() -> None:
    """The consumer of x.t() loads x at (x1, x0): the view is only an index."""
    bg, _ = _buffers(lambda x: x.t() * 2, torch.randn(4, 6))
    (buf,) = bg.buffers
    assert isinstance(buf, ComputedBuffer)
    (ld,) = loads(buf.body)
    assert ld.name == bg.inputs[0].name and ld.index == (xsym(1), xsym(0))


def test_slice_and_select_fold_into_an_affine_index() -> None:
    bg, _ = _buffers(lambda x: x[1:, ::2].select(0, -1) + 1, torch.randn(4, 6))
    (buf,) = bg.buffers
    (ld,) = loads(buf.body)
    assert ld.index == (sympy.Integer(3), 2 * xsym(0))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.t(),
        lambda x: x[:, 1::2],
        lambda x: x.unsqueeze(0).expand(3, 4, 6),
        lambda x: x.select(1, -1),
        lambda x: x.view(2, 2, 6),
        lambda x: x.permute(1, 0).unsqueeze(-1),
        lambda x: x.split([1, 3]),
        lambda x: x.unbind(1),
    ],
    ids=["t", "slice_step", "expand", "select", "view_split", "permute_unsqueeze", "split", "unbind"],
)
def test_output_view_of_input_is_an_alias(fn: Any) -> None:
    """A returned view is an AliasBuffer over the input's storage: no kernel, no copy."""
    x = torch.randn(4, 6)
    bg, outs = _buffers(fn, x)
    assert bg.buffers and all(isinstance(b, AliasBuffer) and b.base == bg.inputs[0].name for b in bg.buffers)
    for o in outs:
        assert o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_output_reshape_of_noncontig_input_is_one_copy() -> None:
    """(4, 6) stored transposed cannot be viewed as (24,): the output is materialized once."""
    x = torch.randn(6, 4).t()
    bg, _ = _buffers(lambda t: t.reshape(-1), x)
    assert [type(b) for b in bg.buffers] == [ComputedBuffer]


def test_output_view_of_reduction_aliases_the_reduction() -> None:
    bg, _ = _buffers(lambda x: x.sum(1).unsqueeze(0), torch.randn(4, 6))
    assert [type(b) for b in bg.buffers] == [ComputedBuffer, AliasBuffer]
    assert bg.buffers[1].base == bg.buffers[0].name  # type: ignore[union-attr]


def test_output_view_of_pointwise_is_computed_in_view_order() -> None:
    bg, (out,) = _buffers(lambda x: (x + 1).t(), torch.randn(4, 6))
    assert [type(b) for b in bg.buffers] == [ComputedBuffer]
    assert out.shape == (6, 4)


def test_view_feeding_an_extern_is_an_alias_not_a_copy() -> None:
    """mm needs a real tensor: the transposed operand is a strided alias."""
    bg, _ = _buffers(lambda a, b: a @ b.t(), torch.randn(3, 4), torch.randn(5, 4))
    assert [type(b) for b in bg.buffers] == [AliasBuffer, ExternBuffer]
    assert bg.buffers[0].rule == "extern_input_view"


def test_flattening_view_of_a_computed_buffer_feeding_an_extern_is_an_alias() -> None:
    """(2, 8, 64) -> (16, 64) of a layer_norm's output before a matmul: the flat
    index (64*i + j) // 512 with j < 64 simplifies to i // 8, so the view's offset
    is affine and the matmul reads the buffer itself."""
    fn = lambda x, w: torch.nn.functional.layer_norm(x, (64,)).view(-1, 64) @ w  # noqa: E731
    bg, _ = _buffers(fn, torch.randn(2, 8, 64), torch.randn(64, 32))
    (alias,) = [b for b in bg.buffers if isinstance(b, AliasBuffer)]
    assert alias.rule == "extern_input_view" and isinstance(bg.buffers[-1], ExternBuffer)
    assert alias.base == "buf2" and bg.buffers[2].ops[-1] == "mul"  # the normalized rows, no copy of them
    assert not [b for b in bg.buffers if isinstance(b, ComputedBuffer) and "view" in b.ops]


def test_floordiv_of_a_scaled_index_drops_the_remainder() -> None:
    from coil.ir.indexing import FloorDiv, ModularIndexing, simplify_index

    i, j = sympy.symbols("i j", integer=True, nonnegative=True)
    rng = {i: 16, j: 64}
    assert simplify_index(FloorDiv(64 * i + j, 512), rng) == FloorDiv(i, 8)
    assert simplify_index(ModularIndexing(64 * i + j, 128, 4), rng) == ModularIndexing(i, 2, 4)
    assert simplify_index(512 * FloorDiv(64 * i + j, 512) + 64 * ModularIndexing(i, 1, 8) + j, rng) == 64 * i + j
    # j may reach 64 here: the remainder can carry, nothing is dropped
    assert simplify_index(FloorDiv(64 * i + j, 512), {i: 16, j: 65}) == FloorDiv(64 * i + j, 512)


def test_a_remainder_that_may_be_negative_is_not_dropped() -> None:
    """A masked load's index may go below 0 where its mask is off, and a split's
    remainder may be negative where the whole index is not: (32*x2 + x3 - 32) // 30
    at x2 = 2, x3 = 0 is 1, where the old split (16*x2) // 15 gave 2 (Funnel's
    relative-shift backward read past its buffer).  The split needs the remainder
    in [0, k) for every value."""
    from coil.ir.indexing import FloorDiv, ModularIndexing, simplify_index

    x2, x3 = sympy.symbols("x2 x3", integer=True, nonnegative=True)
    rng = {x2: 16, x3: 32}
    assert simplify_index(FloorDiv(32 * x2 + x3 - 32, 30), rng) == FloorDiv(32 * x2 + x3 - 32, 30)
    assert simplify_index(ModularIndexing(32 * x2 + x3 - 32, 1, 30), rng) == ModularIndexing(32 * x2 + x3 - 32, 1, 30)
    # a negative constant that the loops' least values cover still splits
    assert simplify_index(FloorDiv(64 * x2 + x3 + 32 - 16, 64), rng) == x2
    # (64*x2 + x3 - 16) // 64 is not x2 + (x3 - 16) // 64 for C, whose division truncates
    assert simplify_index(FloorDiv(64 * x2 + x3 - 16, 64), rng) == FloorDiv(64 * x2 + x3 - 16, 64)


def _c_value(e: sympy.Expr, point: dict[sympy.Symbol, int]) -> int:
    """e's value as C and Triton compute it: integer division truncates and the
    remainder takes the dividend's sign (Python's // and % floor)."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    def div(a: int, b: int) -> int:
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q

    if e.is_Integer:
        return int(e)
    if isinstance(e, sympy.Symbol):
        return point[e]
    args = [_c_value(a, point) for a in e.args]
    if isinstance(e, sympy.Add):
        return sum(args)
    if isinstance(e, sympy.Mul):
        out = 1
        for a in args:
            out *= a
        return out
    if isinstance(e, FloorDiv):
        return div(args[0], args[1])
    if isinstance(e, ModularIndexing):
        q = div(args[0], args[1])
        return q - args[2] * div(q, args[2])
    raise AssertionError(f"no C value for {e}")


@given(st.lists(st.integers(-3, 64), min_size=3, max_size=3), st.integers(2, 48), st.integers(1, 6),
       st.sampled_from(["floordiv", "mod"]))
@settings(max_examples=150, deadline=None)
def test_simplified_indices_keep_their_values_where_the_index_is_not_negative(
        coeffs: list[int], b: int, c: int, kind: str) -> None:
    """simplify_index is an identity at every point of the loops' box where the
    argument is at least 0 (a masked load's lanes with its mask on), with negative
    constants and coefficients among the terms, and its result reads the same under
    C's truncating division as under the floor (every FloorDiv and ModularIndexing
    it leaves has an argument at least 0 there)."""
    from coil.ir.indexing import FloorDiv, ModularIndexing, simplify_index

    i, j = sympy.symbols("i j", integer=True, nonnegative=True)
    rng = {i: 5, j: 7}
    a = coeffs[0] * i + coeffs[1] * j + (coeffs[2] - 40)
    e = FloorDiv(a, b) if kind == "floordiv" else ModularIndexing(a, 1, c * 3)
    got = simplify_index(e, rng)
    for vi in range(5):
        for vj in range(7):
            point = {i: vi, j: vj}
            arg = int(a.subs(point))
            if arg >= 0:
                want = arg // b if kind == "floordiv" else arg % (c * 3)
                assert _c_value(got, point) == want, (e, got, point)


def test_a_relative_shift_backward_reads_inside_its_buffer() -> None:
    """Funnel's relative shift (a reshape, a slice, a reshape, a slice): its
    backward scatters the gradient into zeros through two views, the second of a
    slice_scatter whose reads are masked.  On the reference target, which checks
    every masked read, and on cpp, gradients equal eager's."""
    def shift(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        b, h, s, r = x.shape
        p = (x * w).reshape(b, h, r, s)[:, :, 2:, :]
        return p.reshape(b, h, s, r - 2)[..., :s]

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 16, 32, generator=gen, requires_grad=True)
    w, g = torch.randn(32, generator=gen), torch.randn(2, 4, 16, 16, generator=gen)
    shift(x, w).backward(g)
    want = x.grad.clone()
    for target in ("reference", "cpp"):
        x.grad = None
        torch._dynamo.reset()
        try:
            torch.compile(shift, backend="coil", options={"target": target})(x, w).backward(g)
        finally:
            torch._dynamo.reset()
        torch.testing.assert_close(x.grad, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "fn, kernel",
    [(lambda x: x.view(torch.int32) + 1, "aten.view.dtype"),
     (lambda x: x.t().as_strided((2, 2), (1, 3)) * 2, "aten.as_strided.default")],
    ids=["view_dtype", "as_strided"],
)
def test_storage_views_stay_extern(fn: Any, kernel: str) -> None:
    """A bitcast, or a remap of the storage of a tensor eager holds non-contiguous,
    is not a remap of the logical index."""
    bg, _ = _buffers(fn, torch.randn(4, 6))
    assert kernel in [b.kernel for b in bg.buffers if isinstance(b, ExternBuffer)]


def test_copy_variant_output_does_not_alias_its_input() -> None:
    """permute_copy returns a fresh tensor: as an output it is a computed buffer."""
    x = torch.randn(4, 6)
    bg, (out,) = _buffers(lambda t: torch.ops.aten.permute_copy(t, [1, 0]), x)
    assert [type(b) for b in bg.buffers] == [ComputedBuffer]
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "src, dst",
    [((4, 6), (2, 2, 6)), ((2, 3, 4), (6, 4)), ((6, 4), (4, 6)), ((2, 3, 4), (4, 3, 2)), ((24,), (2, 3, 4))],
    ids=["split", "merge", "neither", "reverse", "unflatten"],
)
def test_reshape_of_noncontig_input(src: Sequence[int], dst: Sequence[int]) -> None:
    """Row-major reinterpretation of a logical index, whatever the input's strides."""
    x = torch.randn(*reversed(src)).permute(*reversed(range(len(src))))
    _buffers(lambda t: t.reshape(dst) * 2, x)


# ---- as_strided over a contiguous input: a View (issue 15) ---------------------------------------


def _strided(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a = x * 2
    return (torch.ops.aten.as_strided(a, [2, 32], [32, 1]) + 1,   # Wav2Vec2's group norm: a reshape
            torch.ops.aten.as_strided(a, [3, 4], [1, 8], 5),      # a strided window from an offset
            torch.ops.aten.as_strided(a, [2, 2], [0, 3], 1) * 1,  # stride 0
            torch.ops.aten.as_strided(a[:, :0], [0, 3], [3, 1]),  # empty
            torch.ops.aten.as_strided(a.t(), [4, 4], [1, 2]),     # eager's input is not contiguous: Extern
            torch.ops.aten.as_strided(y[:, :2], [2, 2], [2, 1]),  # nor is a column slice: Extern
            torch.ops.aten.as_strided(y[:2], [3, 4], [4, 1]))     # past y[:2] into y's storage: Extern


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
def test_as_strided_of_a_contiguous_input_is_a_view(target: str) -> None:
    import coil
    from coil.ir.lowered import Extern, LoweredGraph
    from tests_helpers import target_available

    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    x, y = torch.randn(8, 8), torch.randn(4, 4)
    gm = make_fx(_strided)(x, y)
    g = coil.default_pipeline().run(gm, [x, y], until="lower", options=coil.Options(target=target))
    assert isinstance(g, LoweredGraph)
    assert [n.origin for n in g.nodes if isinstance(n, Extern)] == ["as_strided_4", "as_strided_5", "as_strided_6"]
    got = coil.compile_graph(gm, [x, y], coil.Options(target=target))(x, y)
    for k, (g_, e) in enumerate(zip(got, _strided(x, y))):
        torch.testing.assert_close(g_, e, rtol=0, atol=0, msg=lambda m: f"output {k}: {m}")
