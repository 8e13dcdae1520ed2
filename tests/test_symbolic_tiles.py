"""Tiles for symbolic sizes (issue 17) on the Triton target: a pointwise kernel
that reads an input transposed (x + y.t()) under torch.compile(dynamic=True)
runs on a Tiled space whose rows and columns are size expressions, its grid an
expression the wrapper evaluates once a call, its config from the hints, its
tails masked unless provably whole, and its programs all on grid axis 0 where
its row blocks may pass axis 1's limit (passes/schedule/tiling.py).

The numeric cases run the Triton kernels through the interpreter at sizes that
are and are not multiples of the tile, from one compiled graph, and read the
compiled module's source to be sure the tiled kernel is what ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import sympy
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import coil
from coil.ir.kernel import XINDEX, YINDEX, KernelProgram, Tiled
from coil.ir.printer import show
from coil.ir.shapes import ShapeInfo, SymbolFacts, size_symbol, unbacked_symbol
from coil.passes.schedule import tiling
from tests_helpers import capture_aot

SIZES = [(32, 64), (37, 129), (130, 17), (5, 3)]  # the first compiles (the hints); then tails, and a tiny one


def _program(fn: Callable[..., Any], *inputs: torch.Tensor) -> KernelProgram:
    gm, example = capture_aot(fn, inputs)
    out = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=coil.Options(target="triton"))
    assert isinstance(out, KernelProgram)
    return out


def _compiled(fn: Callable[..., Any], tmp_path: Path, **kw: Any) -> Callable[..., Any]:
    """torch.compile on coil's triton target, from a fresh Dynamo, with every
    compiled module's source written to tmp_path."""
    torch._dynamo.reset()
    counters.clear()
    options = {"target": "triton", "eager_fallback": False, "graph_cache": False, "dump_sources": str(tmp_path)}
    return torch.compile(fn, backend="coil", options=options, **kw)


def _source(tmp_path: Path) -> str:
    (path,) = tmp_path.glob("*.py")
    return path.read_text()


def _launch_line(source: str) -> str:
    """The kernel's launch line (its int32 kernel's, where it has an int64 twin too)."""
    lines = [ln.strip() for ln in source.splitlines() if "](" in ln and ln.strip().startswith("triton_")]
    narrow = [ln for ln in lines if "_i64[" not in ln]
    assert len(narrow) == 1 and len(lines) <= 2, lines
    return narrow[0]


def _check_one_graph() -> None:
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["symbolic"] == 1
    assert counters["coil"]["eager"] == 0


# ---- the printed program -------------------------------------------------------------------------


def test_printed_program_shows_the_symbolic_tile_and_its_grid() -> None:
    p = _program(lambda x, y: x + y.t(), torch.randn(32, 64), torch.randn(64, 32))
    (k,) = p.specs
    text = show(p)
    assert "space: tiled s1 rows x s0 cols (yindex s1 x xindex s0); programs on grid axis 0 alone" in text
    assert "index: int32 where s0*s1 < 2**31, else int64 (triton_poi_fused_add_t_0_i64); tails: outer yes, inner yes" in text
    assert "buf0: tiled pointwise float32 store=s0*yindex + xindex" in text
    assert "reads: arg3_1 at s0*yindex + xindex (yx), arg2_1 at s1*xindex + yindex (yx)" in text
    assert ("triton_poi_fused_add_t_0[(FloorDiv(s0 + 63, 64)*FloorDiv(s1 + 31, 32), 1, 1)] sizes=[s1, s0] "
            "YBLOCK=32, XBLOCK=64, num_warps=4  rule=tiled: a transposed read: 32x64 tiles") in text
    assert "(at the hints 32, 64); every block on grid axis 0" in text
    assert k.space == Tiled(size_symbol(1), size_symbol(0), False, True)
    assert k.symbols == ("s0", "s1")


def test_wrapper_evaluates_the_tiled_grid_once_a_call() -> None:
    gm, example = capture_aot(lambda x, y: x + y.t(), (torch.randn(32, 64), torch.randn(64, 32)))
    source = coil.default_pipeline().run(gm, example, options=coil.Options(target="triton")).source
    assert ("triton_poi_fused_add_t_0[grid2(s1, s0, 32, 64, one_axis=True)](arg2_1, arg3_1, buf0, s1, s0, s0, s1, "
            "YBLOCK=32, XBLOCK=64, num_warps=4)") in source
    kernel = source[source.index("@triton.jit"):source.index("def call(")]
    assert "def triton_poi_fused_add_t_0(in_ptr0, in_ptr1, out_ptr0, ynumel, xnumel, s0, s1, YBLOCK" in kernel
    for line in ("pid = tl.program_id(0).to(tl.int64)", "xblocks = tl.cdiv(xnumel, XBLOCK)",
                 "yoffset = (pid // xblocks) * YBLOCK", "xoffset = (pid % xblocks) * XBLOCK",
                 "ymask = yindex < ynumel", "xmask = xindex < xnumel",
                 "tl.load(in_ptr0 + (yindex + xindex*s1), yxmask, other=0)"):
        assert line in kernel, line


def test_bounded_rows_stay_on_two_grid_axes() -> None:
    """Rows bounded by their range (mark_dynamic's max) fit grid axis 1 for every
    size: the 2-D grid, and 32-bit indices."""
    x, y = torch.randn(32, 64), torch.randn(64, 32)
    gm, example = _capture_marked(lambda x, y: x + y.t(), (x, y), [(0, 0, 4096), (1, 1, 4096)])
    p = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=coil.Options(target="triton"))
    (k,) = p.specs
    assert isinstance(k.space, Tiled) and not k.space.one_axis and k.space.cols == 64
    (ln,) = k.launches
    assert ln.grid == (1, sympy.sympify("FloorDiv(s0 + 31, 32)", locals=_floordiv()), 1)
    assert not k.wide_index and k.wide is None  # bounded: int32 for every size, no int64 twin


def _capture_marked(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...],
                    marks: list[tuple[int, int, int]]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The inference graph and example inputs AOT hands a backend for `fn` with
    the (input, dim, max) of `marks` dynamic in [2, max] (capture_aot's, with ranges)."""
    from torch._dynamo.backends.common import aot_autograd

    got: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        got.append((gm, list(example_inputs)))
        return gm.forward

    for i, d, most in marks:
        torch._dynamo.mark_dynamic(inputs[i], d, min=2, max=most)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=keep, inference_compiler=keep))(*inputs)
    torch._dynamo.reset()
    return got[0]


def _floordiv() -> dict[str, Any]:
    from coil.ir.indexing import FloorDiv

    return {"FloorDiv": FloorDiv, "s0": size_symbol(0)}


# ---- numerics under the interpreter, one compiled graph ----------------------------------------------


def test_both_sizes_symbolic(tmp_path: Path) -> None:
    fn = lambda x, y: x + y.t()  # noqa: E731
    f = _compiled(fn, tmp_path, dynamic=True)
    for r, c in SIZES:
        x, y = torch.randn(r, c), torch.randn(c, r)
        torch.testing.assert_close(f(x, y), fn(x, y))
    _check_one_graph()
    assert "grid2(s1, s0, 32, 64, one_axis=True)" in _launch_line(_source(tmp_path))


def _rows_marked_dynamic(tmp_path: Path, **bounds: int) -> None:
    """x + y.t() for x of (r, 64), its rows (and y's columns) marked dynamic with
    `bounds` (mark_dynamic's min and max), compiled once and matching eager."""
    fn = lambda x, y: x + y.t()  # noqa: E731
    f = _compiled(fn, tmp_path)
    for r in (32, 37, 130, 5):
        x, y = torch.randn(r, 64), torch.randn(64, r)
        torch._dynamo.mark_dynamic(x, 0, **bounds)
        torch._dynamo.mark_dynamic(y, 1, **bounds)
        torch.testing.assert_close(f(x, y), fn(x, y))
    _check_one_graph()


def test_one_size_static(tmp_path: Path) -> None:
    """Rows symbolic (s0), columns static (64): the static side stays a literal."""
    _rows_marked_dynamic(tmp_path)
    assert "grid2(s0, 64, 32, 64, one_axis=True)" in _launch_line(_source(tmp_path))


def test_bounded_rows_run_on_two_axes(tmp_path: Path) -> None:
    _rows_marked_dynamic(tmp_path, min=2, max=4096)
    source = _source(tmp_path)
    assert "grid2(s0, 64, 32, 64)" in _launch_line(source)
    assert "yoffset = tl.program_id(1) * YBLOCK" in source


def test_output_transposed(tmp_path: Path) -> None:
    """y.t() + x: the output takes y.t()'s column-major strides, so the tile runs
    transposed (xindex along the rows, programs down the columns)."""
    fn = lambda x, y: y.t() + x  # noqa: E731
    p = _program(fn, torch.randn(32, 64), torch.randn(64, 32))
    (k,) = p.specs
    assert isinstance(k.space, Tiled) and k.space.transposed
    assert "transposed: xindex along the rows" in show(p)
    f = _compiled(fn, tmp_path, dynamic=True)
    for r, c in SIZES:
        x, y = torch.randn(r, c), torch.randn(c, r)
        got, want = f(x, y), fn(x, y)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    _check_one_graph()
    assert "grid2(s0, s1, 64, 32, one_axis=True)" in _launch_line(_source(tmp_path))


def test_rows_a_multiple_of_every_block_drop_their_mask(tmp_path: Path) -> None:
    """128*s0 rows are whole blocks for every s0 (ShapeInfo.known_multiple): the
    row mask is constant; the columns' (s1) is not."""
    fn = lambda x, y: x.flatten(0, 1) + y.t()  # noqa: E731
    f = _compiled(fn, tmp_path)
    for b, c in ((2, 32), (3, 37), (5, 20)):
        x, y = torch.randn(b, 128, c), torch.randn(c, b * 128)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 2)
        torch._dynamo.mark_dynamic(y, 0)
        torch._dynamo.mark_dynamic(y, 1)
        torch.testing.assert_close(f(x, y), fn(x, y))
    source = _source(tmp_path)
    assert counters["coil"]["compiled"] >= 1 and counters["coil"]["eager"] == 0
    assert "ymask = tl.full([YBLOCK, 1], True, tl.int1)" in source
    assert "xmask = xindex < xnumel" in source


def test_no_transposed_read_is_not_tiled(tmp_path: Path) -> None:
    fn = lambda x, y: x + y  # noqa: E731
    p = _program(fn, torch.randn(32, 64), torch.randn(32, 64))
    assert not any(isinstance(k.space, Tiled) for k in p.specs)
    f = _compiled(fn, tmp_path, dynamic=True)
    for r, c in SIZES:
        x, y = torch.randn(r, c), torch.randn(r, c)
        torch.testing.assert_close(f(x, y), fn(x, y))
    _check_one_graph()
    source = _source(tmp_path)
    assert "YBLOCK" not in source and "grid(s0*s1, " in _launch_line(source)


def test_too_narrow_at_the_hints_is_not_tiled() -> None:
    """Whether a tile is worth it is judged at the hints: 8 rows are fewer than
    a tile's least side."""
    p = _program(lambda x, y: x + y.t(), torch.randn(8, 64), torch.randn(64, 8))
    assert not any(isinstance(k.space, Tiled) for k in p.specs)


# ---- the proofs -------------------------------------------------------------------------------------


def test_steps_are_judged_for_every_size() -> None:
    """A stride s1 (at least 2) moves; a stride u0 (data-dependent: maybe 0 or 1)
    proves nothing, so no access is taken to run down the columns by it."""
    s0, s1, u0 = size_symbol(0), size_symbol(1), unbacked_symbol(0)
    info = ShapeInfo((SymbolFacts(s0, 32, 2, None), SymbolFacts(s1, 64, 2, None),
                      SymbolFacts(u0, 64, 0, None, backed=False)))
    assert tiling.contiguous_axis(s1 * XINDEX + YINDEX, info) == "y"
    assert tiling.contiguous_axis(XINDEX + s0 * YINDEX, info) == "x"
    assert tiling.contiguous_axis(u0 * XINDEX + YINDEX, info) is None
    assert tiling.contiguous_axis(s1 * XINDEX + YINDEX) == "y"  # s* is at least 2 without the ranges too
    assert tiling._quotient(s0 * s1, s1) == s0 and tiling._quotient(128 * s0, 64) == 2 * s0
    assert tiling._quotient(s0 * s1, 2) is None and tiling._quotient(s0 + s1, s1) is None
    assert tiling._quotient(12, 4) == 3 and tiling._quotient(12, 5) is None


def test_a_diagonal_of_a_static_and_a_symbolic_dim_launches(tmp_path: Path) -> None:
    """Found by the tile draws (properties: test_symbolic_triton_tiles_...), the
    first symbolic draws on Triton: a diagonal of (16, s0) is min(16, s0) long,
    whose launch grid (min(16, s0) + 15) // 16 the kernel verifier could not
    prove positive and refused."""
    fn = lambda x: -torch.diagonal(x)  # noqa: E731
    f = _compiled(fn, tmp_path)
    for c in (16, 3, 40):
        x = torch.randn(16, c)
        torch._dynamo.mark_dynamic(x, 1)
        torch.testing.assert_close(f(x), fn(x))
    _check_one_graph()


def test_a_slice_that_may_be_empty_launches_under_its_guard(tmp_path: Path) -> None:
    """Found by the tile draws: x[2:] of s0 rows has 16*s0 - 32 elements, none
    where s0 is 2; the kernel verifier refused that launch size, although `call`
    launches such a kernel only under `if 16*s0 - 32 > 0`."""
    fn = lambda x: -x[2:]  # noqa: E731
    f = _compiled(fn, tmp_path)
    for r in (16, 4, 9):
        x = torch.randn(r, 16)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(f(x), fn(x))
    _check_one_graph()
    assert "if 16*s0 - 32 > 0:" in _source(tmp_path)


def test_lerp_of_a_transposed_operand_lowers_with_symbolic_sizes() -> None:
    """Found by the tile draws: torch's lerp decomposition computes its result's
    strides with torch.sym_max, which lower did not take as size arithmetic
    ("cannot call sym_max as an extern") when an operand was transposed."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from coil.properties.symbolic import capture

    aten = torch.ops.aten

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return aten.lerp.Scalar(b, aten.where.ScalarSelf(aten.gt.Scalar(a, 0), 3, b), 0.25)

    a, b = torch.randn(19, 18).t(), torch.randn(18, 19)
    got = capture(make_fx(fn)(a, b), [a.clone(), b.clone()], [(0, 1), (1, 1)])
    assert got is not None
    gm, example, _ = got
    compiled = coil.compile_graph(gm, example, coil.Options(target="triton"))
    for c in (19, 5, 33):
        a, b = torch.randn(c, 18).t(), torch.randn(18, c)
        torch.testing.assert_close(compiled(c, a, b)[0], fn(a, b))


# ---- the C++ target's nests ---------------------------------------------------------------------------


def _cpp_compiled(fn: Callable[..., Any], tmp_path: Path, **kw: Any) -> Callable[..., Any]:
    torch._dynamo.reset()
    counters.clear()
    options = {"target": "cpp", "eager_fallback": False, "graph_cache": False, "dump_sources": str(tmp_path)}
    return torch.compile(fn, backend="coil", options=options, **kw)


def test_cpp_nest_tiles_a_symbolic_transposed_read() -> None:
    gm, example = capture_aot(lambda x, y: x + y.t(), (torch.randn(64, 96), torch.randn(96, 64)))
    p = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=coil.Options(target="cpp"))
    text = show(p)
    assert "nest: x loops [s1, s0]" in text
    assert "x loops 0 and 1 in 64x64 tiles, staging arg2_1 at ix0 + ix1*s1 (stride s1)" in text
    (k,) = p.specs
    assert k.nest is not None and k.nest.tile is not None and k.nest.tile.staged[0].stride == size_symbol(1)
    source = coil.default_pipeline().run(gm, example, options=coil.Options(target="cpp")).source
    assert "coil_transpose_tile<64>(in_ptr0 + (64*ix0_t + 64*ix1_t*s1), s1, st0);" in source
    assert "if (ix0_t * 64 + 64 <= xnumel / (s0) && ix1_t * 64 + 64 <= s0) {" in source


@pytest.mark.parametrize("case", ["x + y.t()", "y.t() + x", "one static"])
def test_cpp_symbolic_tiles_match_eager(case: str, tmp_path: Path) -> None:
    """From one compiled graph, at sizes with whole tiles, ragged edges and none
    whole (5 x 3); the first (the hints, 256 x 160) shares its tiles among threads."""
    fn = (lambda x, y: y.t() + x) if case == "y.t() + x" else (lambda x, y: x + y.t())
    f = _cpp_compiled(fn, tmp_path, **({} if case == "one static" else {"dynamic": True}))
    for r, c in [(256, 160), (37, 129), (130, 64), (5, 3)]:
        c = 160 if case == "one static" else c
        x, y = torch.randn(r, c), torch.randn(c, r)
        if case == "one static":
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(y, 1)
        got, want = f(x, y), fn(x, y)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    _check_one_graph()
    source = _source(tmp_path)
    assert "coil_transpose_tile<64>(" in source and "omp parallel for collapse(2)" in source


def test_a_persistent_reduction_shorter_than_its_rows_is_refused(tmp_path: Path) -> None:
    """Found by the tile draws (the diagonal of (17, s0), summed: min(17, s0)
    elements), the same with a plain bound: rows of s0 in [2, 64] reduced
    persistently.  A launch whose RBLOCK is the hint's (16) would drop the
    elements past 16 at s0 = 40: the kernel verifier refuses it (K8)."""
    import attrs

    from coil.errors import CoilError
    from coil.ir.verify_kernel import verify_kernel_program

    seen: list[Any] = []

    def keep(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        seen.append((gm, example))
        return gm.forward

    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    x = torch.randn(8, 16)
    torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
    torch.compile(lambda t: t.sum(-1), backend=aot_autograd(fw_compiler=keep, inference_compiler=keep))(x)
    gm, example = seen[0]
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels",
                                     options=coil.Options(target="triton"))
    (k,) = kp.specs
    (ln,) = k.launches
    assert str(k.kind) == "persistent" and ln.config.rblock == 64, ln  # the bound's, not the hint's 16
    short = attrs.evolve(k, launches=(attrs.evolve(ln, config=attrs.evolve(ln.config, rblock=16)),))
    with pytest.raises(CoilError, match="K8 persistent launch"):
        verify_kernel_program(attrs.evolve(kp, specs=(short,)), "schedule_kernels")


def test_a_persistent_reduction_holds_its_longest_row(tmp_path: Path) -> None:
    """Rows of s0 in [2, 64], compiled once: the persistent launch takes RBLOCK
    from the bound (64), not the hint (16), and rows of 40 and 64 sum whole
    (launch.config_hints; kernel verifier K8 refused the hint's RBLOCK)."""
    fn = lambda x: x.sum(-1)  # noqa: E731
    f = _compiled(fn, tmp_path)
    for c in (16, 40, 64):
        x = torch.randn(8, c)
        torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
        torch.testing.assert_close(f(x), fn(x))
    _check_one_graph()


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_cpp_symbolic_pointwise_kernels_share_their_outer_loops(rank: int, tmp_path: Path) -> None:
    """A symbolic pointwise kernel with work enough at its hints for threads
    (CPP_NESTS.parallel_min_work): the threads share the loops outside the `omp
    simd` one, as a static kernel's do, and a 1-d kernel's blocks.  It collapsed
    every x loop, the simd loop too, and g++ refused the kernel ("not enough for
    loops to collapse"; a 1-d kernel failed in kernel_gen): found by OPT and Falcon
    at two sequence lengths (bench/probes/model_census.py with SEQS)."""
    emb = torch.randn(1000, 48)

    def f(ids: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.nn.functional.embedding(ids, emb) * 2, x * 3 + 1  # the embedding's kernel checks its indices

    # no size equal to another only at one n (Dynamo's duck sizing would make them one symbol)
    shape = {1: lambda n: (n * 4096,), 2: lambda n: (n * 64, 384), 3: lambda n: (3, n * 32, 384)}[rank]
    g = _cpp_compiled(f, tmp_path, dynamic=True)
    for n in (16, 7, 24):
        ids, x = torch.randint(0, 1000, (2, n * 32)), torch.randn(shape(n))
        for got, want in zip(g(ids, x), f(ids, x)):
            torch.testing.assert_close(got, want)
    assert counters["coil"]["compiled"] == 1
    source = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    assert "omp parallel for" in source  # and g++ took it: the fallback is off


def test_a_view_whose_minus_one_divides_symbolic_sizes_allocates_an_int_size(tmp_path: Path) -> None:
    """`x.view(-1, 4, 768)` over (2, s, 3072) with every size symbolic: the -1 is
    `s0*s1*s2/3072`, whole wherever Dynamo's guards admit the call; the wrapper
    printed it as Python's true division, and torch refused the float size."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1, 4, 768) + 1

    g = _cpp_compiled(f, tmp_path, dynamic=True)
    for n in (3, 5):
        x = torch.randn(2, n, 3072)
        torch.testing.assert_close(g(x), f(x))
    assert counters["coil"]["compiled"] == 1
