"""The triton target end to end: every op case of tests/op_cases.py, then the kernel
shapes one at a time (pointwise tails, persistent and looped reductions, epilogues,
registers instead of memory), dtypes (half, int, bool, 0-d), the launch heuristics
and autotuning.

On a machine without CUDA the kernels run on CPU tensors in the Triton interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported).  Tests marked
`cuda` repeat cases on the GPU; run them without the interpreter to compile real
kernels:  TRITON_INTERPRET=0 python3 -m pytest -q -m cuda tests/test_triton_target.py
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, Sequence

import attrs
import pytest
import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.backends.triton import runtime
from coil.errors import CoilError
from coil.ir.expr import Cast, Load, Op, walk
from coil.ir.expr import loads as body_loads
from coil.ir.kernel import (XINDEX, YINDEX, Body, Flat, KernelSpec, LaunchConfig, LaunchRule, Loop, Rows, Split,
                            Tails, Tiled, Update)
from coil.options import TARGET_TRAITS, TRITON_LAUNCH, TRITON_SPLITS, TRITON_TILES
from coil.passes.schedule import launch as policy
from coil.passes.schedule.tiling import contiguous_axis
from coil.ir.module import CompiledModule
from op_cases import (
    CREATION_CASES,
    DECOMP_CASES,
    INDIRECT_CASES,
    POINTWISE_CASES,
    PROMOTION_CASES,
    REDUCTION_CASES,
    RUNNERS,
    VIEW_CASES,
    OpCase,
    check_case,
    tolerances,
)

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need TRITON_INTERPRET=1")
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
# masked-off lanes of the interpreter divide by zero and take logs of 0 on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEVICES = [
    pytest.param("cpu", marks=needs_interpreter),
    pytest.param("cuda", marks=needs_cuda),
]


# ---- helpers -----------------------------------------------------------------------------------


def compile_fn(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], **options: Any) -> Any:
    gm = make_fx(fn)(*inputs)
    return coil.compile_graph(gm, inputs, coil.Options(target="triton", **options))


def module_of(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], **options: Any) -> CompiledModule:
    gm = make_fx(fn)(*inputs)
    module = coil.default_pipeline().run(gm, inputs, options=coil.Options(target="triton", **options))
    assert isinstance(module, CompiledModule)
    return module


def check(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], atol: float | None = None,
          rtol: float | None = None, **options: Any) -> Any:
    """Compile, run, compare every output with eager (dtype and shape included)."""
    compiled = compile_fn(fn, inputs, **options)
    got = compiled(*inputs)
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)
    return compiled


def kernel_sources(compiled: Any) -> list[str]:
    return [k.source for k in compiled.module.kernels]


def specs(compiled: Any) -> tuple[KernelSpec, ...]:
    """The KernelProgram's specs behind a compiled module: its decisions."""
    return compiled.module.program.specs  # type: ignore[no-any-return]


def loops(k: KernelSpec) -> list[Loop]:
    return [st for st in k.stages if isinstance(st, Loop)]


def online(k: KernelSpec) -> dict[str, str | None]:
    """Online sum -> its max, over the kernel's loops."""
    return {a.node: a.partner for st in loops(k) for a in st.accumulators if a.update is Update.ONLINE_SUM}


def params(k: KernelSpec) -> list[tuple[str, str]]:
    """(pointer argument, buffer) of each parameter: what the kernel reads, then what it stores."""
    return [(p.arg, p.name) for p in k.params]


def stored(k: KernelSpec) -> list[str]:
    """The kernel's nodes that go to memory (the others stay in registers)."""
    return [n.name for n in k.nodes if n.store is not None]


def ops(k: KernelSpec) -> list[Op]:
    """Every operation of the kernel's node bodies."""
    return [e for n in k.nodes for e in walk(n.body) if isinstance(e, Op)]


def along_xindex(store: sympy.Expr | None) -> bool:
    """A tiled store whose offset steps 1 along xindex (yindex makes the rest)."""
    return store is not None and sympy.expand(store - XINDEX).free_symbols <= {YINDEX}


# ---- every op case -------------------------------------------------------------------------------

CASE_LISTS = {
    "pointwise": POINTWISE_CASES,
    "creation": CREATION_CASES,
    "promotion": PROMOTION_CASES,
    "reduction": REDUCTION_CASES,
    "view": VIEW_CASES,
    "decomp": DECOMP_CASES,
    "indirect": INDIRECT_CASES,
}


def covering_params(device_marks: Sequence[Any] = ()) -> list[Any]:
    """Every case, in every dtype it lists (on its first shape kind) and on every
    shape kind it lists (in its first dtype).  Dtypes drive the casts and op
    spellings, shape kinds the index math; their cross product adds no code path
    and would double the interpreter's time."""
    out = []
    for family, cases in CASE_LISTS.items():
        for c in cases:
            combos = [(c.shape_kinds[0], dt) for dt in c.dtypes] + [(k, c.dtypes[0]) for k in c.shape_kinds[1:]]
            for kind, dt in combos:
                out.append(pytest.param(c, kind, dt, marks=device_marks,
                                        id=f"{family}-{c.name}-{kind}-{str(dt).removeprefix('torch.')}"))
    return out


@needs_interpreter
@pytest.mark.parametrize("case, shape_kind, dtype", covering_params())
def test_op_case(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    check_case(case, shape_kind, dtype, RUNNERS["triton"])


def on_cuda(t: torch.Tensor) -> torch.Tensor:
    """A GPU copy with the same strides and storage offset (expanded ones too)."""
    storage = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()).cuda()
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def check_case_cuda(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    """check_case, traced and run on the GPU (so creation ops get device='cuda')."""
    inputs = tuple(on_cuda(t) for t in case.make_inputs(dtype, shape_kind, torch.Generator().manual_seed(0)))
    try:
        want = case.fn(*inputs)
    except RuntimeError as e:
        if "same device" not in str(e):
            raise
        pytest.skip("the case builds CPU tensors of its own (weights, constants)")
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    if any(not w.is_cuda for w in want):
        pytest.skip("eager makes CPU tensors here: those kernels need the interpreter")
    gm = make_fx(case.fn)(*inputs)
    got = coil.compile_graph(gm, inputs, coil.Options(target="triton", emulate_precision_casts=True))(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, **tolerances(w.dtype))


@pytest.mark.parametrize("case, shape_kind, dtype", covering_params(needs_cuda))
def test_op_case_cuda(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    check_case_cuda(case, shape_kind, dtype)


# ---- the seed ---------------------------------------------------------------------------------------


def seed_fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return ((a + b) * c.relu()).sum(dim=-1)


@pytest.mark.parametrize("device", DEVICES)
def test_seed_is_one_kernel_loading_three_inputs(device: str) -> None:
    inputs = [torch.randn(64, 128, device=device) for _ in range(3)]
    compiled = check(seed_fn, inputs)
    (k,) = specs(compiled)
    assert k.name == "triton_per_fused_add_mul_relu_sum_0" and k.space == Rows(64, 128, looped=False)
    # three inputs read, one sum a row in one pass over it, stored; 64 x 128 leaves no tail to mask
    assert params(k) == [("in_ptr0", "a_1"), ("in_ptr1", "b_1"), ("in_ptr2", "c_1"), ("out_ptr0", "buf0")]
    assert [(n.name, n.reduction_type) for n in k.nodes] == [("buf0", "sum")] and k.stages == (Body(("buf0",), loads(k)),)
    assert k.tails == Tails(outer=False, inner=False)
    assert k.launches[0].sizes == (64, 128) and k.launches[0].rule is LaunchRule.PERSISTENT
    # the renderer's signature: the pointers in the spec's order, then the sizes and blocks
    (src,) = kernel_sources(compiled)
    assert re.search(r"def triton_per_fused_add_mul_relu_sum_0\(in_ptr0, in_ptr1, in_ptr2, out_ptr0, "
                     r"xnumel, rnumel, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr\)", src)
    guard = "with torch.cuda.device('cuda:0'):" if device == "cuda" else "with interpreted():"
    assert f"    {guard}\n" in compiled.source


# ---- pointwise ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_pointwise_tail(device: str) -> None:
    """1043 elements: the second program's lanes past the end are masked."""
    x = torch.randn(7, 149, device=device)
    compiled = check(lambda a: a * 2 + 1, [x])
    (k,) = specs(compiled)
    assert k.space == Flat(1043, 1) and k.tails is not None and k.tails.outer
    (launch,) = k.launches
    assert (launch.sizes, launch.config.xblock, launch.grid) == ((1043,), 1024, (2, 1, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_and_offset_inputs(device: str) -> None:
    base = torch.randn(40, 30, device=device)
    check(lambda a, b: a.sin() + b, [base.t(), torch.randn(31, 41, device=device)[1:, 1:]])


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim_output(device: str) -> None:
    check(lambda a, b: (a * b).sum(), [torch.randn(5, 7, device=device), torch.randn((), device=device)])
    check(lambda a: a + 1, [torch.randn((), device=device)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_compute_in_float32(device: str, dtype: torch.dtype) -> None:
    x = torch.randn(16, 33, device=device).to(dtype)
    y = torch.randn(33, device=device).to(dtype)
    compiled = check(lambda a, b: (a * b + 1).softmax(-1), [x, y], atol=1e-2, rtol=1.6e-2)
    (k,) = specs(compiled)
    # the half loads widen: every operation runs in float32; the one output narrows at its store
    assert ops(k) and {op.dtype for op in ops(k)} == {torch.float32}
    (out,) = [n for n in k.nodes if n.store is not None]
    assert out.dtype == dtype and isinstance(out.body, Cast) and out.body.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
def test_int_inputs(device: str) -> None:
    a = torch.randint(-50, 50, (9, 13), device=device, dtype=torch.int32)
    b = torch.randint(1, 7, (13,), device=device, dtype=torch.int32)
    check(lambda x, y: (x // y, x % y, x.sum(-1), (x * y).amax(0), x.to(torch.int64).prod(-1)), [a, b])


@pytest.mark.parametrize("device", DEVICES)
def test_bool_outputs(device: str) -> None:
    x = torch.randn(6, 10, device=device)
    check(lambda a: (a > 0, (a > 1).any(-1), (a > -2).all(-1), (a > 0) & (a < 1)), [x])


@pytest.mark.parametrize("device", DEVICES)
def test_zero_size_kernel_is_not_launched(device: str) -> None:
    compiled = check(lambda a: a * 2, [torch.randn(0, 5, device=device)])
    assert [k.launches for k in specs(compiled)] == [()]
    assert "nothing to compute" in compiled.source


# ---- reductions -------------------------------------------------------------------------------------

LOOPED = {"persistent_reduction_threshold": 16}
KINDS = [pytest.param({}, id="persistent"), pytest.param(LOOPED, id="looped")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", KINDS)
def test_softmax_is_one_kernel(device: str, opts: dict[str, Any]) -> None:
    compiled = check(lambda a: torch.softmax(a, -1), [torch.randn(12, 40, device=device)], **opts)
    (k,) = specs(compiled)
    # max, sum and the output (exp(x - max) inlined in the sum and the division: the row
    # max is a trivial read); registers, not memory, carry buf0 and buf1; the input is
    # read, the output stored
    assert stored(k) == ["buf2"] and params(k) == [("in_ptr0", "a_1"), ("out_ptr0", "buf2")]
    if not opts:  # the row held whole: one pass reads it once
        assert k.space == Rows(12, 40, looped=False) and k.stages == (Body(("buf0", "buf1", "buf2"), loads(k)),)
    else:  # max and the sum of exp online in one loop; the division in a second, with a tail
        assert k.space == Rows(12, 40, looped=True) and k.tails is not None and k.tails.inner
        assert [st.nodes for st in loops(k)] == [("buf0", "buf1"), ("buf2",)]
        assert online(k) == {"buf1": "buf0"} and k.name.startswith("triton_red_")
        # the renderer writes each loop's body twice: unmasked for full steps, masked for the tail
        (src,) = kernel_sources(compiled)
        assert src.count("if 40 % RBLOCK != 0:") == 2


@pytest.mark.parametrize("device", DEVICES)
def test_online_softmax_edge_values(device: str) -> None:
    """Rows of -inf, a NaN, a +inf, a -inf prefix, and a tail step (50 = 16 * 3 + 2):
    the online sum gives what max-then-sum gives."""
    x = torch.randn(6, 50, device=device)
    x[0, :] = float("-inf")
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3, :20] = float("-inf")
    x[4, 49] = 80.0  # a new max in the last (partial) step rescales the whole sum
    for fn in (lambda a: torch.softmax(a, -1), lambda a: torch.log_softmax(a, -1)):
        compiled = check(fn, [x], **LOOPED)
        assert online(specs(compiled)[0])
    # logsumexp subtracts where(|max| == inf, 0, max), not the max itself: two loops
    check(lambda a: a.logsumexp(-1), [x], **LOOPED)


@pytest.mark.parametrize("device", DEVICES)
def test_online_sum_needs_the_same_values(device: str) -> None:
    """sum(exp(y - max(x))) with y != x keeps the two-loop form."""
    x, y = torch.randn(4, 40, device=device), torch.randn(4, 40, device=device)
    compiled = check(lambda a, b: torch.exp(b - a.amax(-1, keepdim=True)).sum(-1), [x, y], **LOOPED)
    (k,) = specs(compiled)
    assert not online(k) and len(loops(k)) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_reads_logits_in_one_loop(device: str) -> None:
    x, t = torch.randn(8, 300, device=device), torch.randint(0, 300, (8,), device=device)
    compiled = check(lambda a, b: torch.nn.functional.cross_entropy(a, b), [x, t], atol=1e-5, rtol=1e-5, **LOOPED)
    assert any(online(k) for k in specs(compiled))


def test_persistent_threshold_by_target() -> None:
    """Rows up to 8192 stay in registers on the triton target; the others keep 1024."""
    assert coil.Options(target="triton").persistent_limit() == 8192
    assert coil.Options(target="cpp").persistent_limit() == 1024
    assert coil.Options(target="triton", persistent_reduction_threshold=16).persistent_limit() == 16
    x = torch.randn(2, 4096)
    gm = make_fx(lambda a: torch.softmax(a, -1))(x)
    fused = coil.default_pipeline().run(gm, [x], until="fuse", options=coil.Options(target="triton"))
    assert [k.kind for k in fused.kernels] == ["persistent"]


# ---- 2-D tiles for transposed reads -------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn,shapes", [
    (lambda a, b: a + b.t(), [(64, 48), (48, 64)]),
    (lambda a, b: a.t() * 2 - b, [(40, 33), (33, 40)]),  # tails on both axes
    (lambda a, b: (a.permute(0, 2, 1) * 2 + b).sin(), [(3, 40, 33), (3, 33, 40)]),
    (lambda a: a.t().contiguous(), [(48, 80)]),
])
def test_transposed_reads_are_tiled(device: str, fn: Callable[..., Any], shapes: list[tuple[int, ...]]) -> None:
    compiled = check(fn, [torch.randn(s, device=device) for s in shapes])
    (k,) = specs(compiled)
    assert isinstance(k.space, Tiled) and k.launches[0].rule is LaunchRule.TILED
    assert k.launches[0].sizes == (k.space.ynumel, k.space.xnumel)


@pytest.mark.parametrize("device", DEVICES)
def test_contiguous_and_small_pointwise_stay_1d(device: str) -> None:
    for fn, shapes in ((lambda a, b: a + b, [(64, 48), (64, 48)]), (lambda a, b: a + b.t(), [(8, 8), (8, 8)]),
                       (lambda a, b: a + b, [(64, 48), (48,)])):
        compiled = check(fn, [torch.randn(s, device=device) for s in shapes])
        assert [type(k.space) for k in specs(compiled)] == [Flat]


def loads(k: KernelSpec) -> tuple[Load, ...]:
    """A one-scope kernel's loads from memory, in the order its bodies read them
    (the order its scope issues them first)."""
    inside = {n.name for n in k.nodes}
    return tuple(dict.fromkeys(ld for n in k.nodes for ld in body_loads(n.body) if ld.name not in inside))


def tile_load_axes(compiled: Any) -> list[str | None]:
    """The axis each load of the one tiled kernel runs along ("x", "y" or None),
    in the order its spec issues them."""
    program = compiled.module.program
    (k,) = program.specs
    (body,) = k.stages
    return [contiguous_axis(program.layout(ld.name).offset_of(ld.index)) for ld in body.loads]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [[(48, 64), (64, 48)], [(37, 53), (53, 37)]])  # the second with tails
def test_a_column_major_output_lays_its_tile_transposed(device: str, shapes: list[tuple[int, int]]) -> None:
    """y.t() + x: eager's output is column-major, and its kernel walks it in memory
    order (realize's walk order), so the split's rows are the output's columns and
    the tile's xindex runs down them: the store (and the programs' order) goes
    along the output in memory, and x is the read the tile turns; the strides
    match eager's.  (Walked in its logical order, the same tile lay transposed.)"""
    fn = lambda a, b: a.t() + b  # noqa: E731
    inputs = [torch.randn(s, device=device) for s in shapes]
    compiled = check(fn, inputs)
    assert compiled(*inputs)[0].stride() == fn(*inputs).stride() == (1, shapes[0][1])
    rows, cols = shapes[1]
    # ynumel is the output's column count, xnumel its row count; the store steps 1 along xindex
    (k,) = specs(compiled)
    assert k.space == Tiled(cols, rows) and (k.space.ynumel, k.space.xnumel) == (cols, rows)
    (out,) = k.nodes
    assert out.store == XINDEX + rows * YINDEX, out.store


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn,shapes", [
    (lambda a, b: a + b.t(), [(64, 48), (48, 64)]),
    (lambda a, b: b.t() + a, [(64, 48), (48, 64)]),
    (lambda a, b: a.t() + b, [(48, 64), (64, 48)]),
    (lambda a, b, c, d: a + b.t() + c * d.t(), [(64, 48), (48, 64), (64, 48), (48, 64)]),
])
def test_tiled_loads_along_the_store_come_first(device: str, fn: Callable[..., Any],
                                                 shapes: list[tuple[int, ...]]) -> None:
    """Whatever the order in the graph, a tiled kernel loads what runs along its
    store's axis (xindex + N*yindex) before what runs across it (N*xindex + yindex)."""
    compiled = check(fn, [torch.randn(s, device=device) for s in shapes])
    (k,) = specs(compiled)
    assert isinstance(k.space, Tiled) and stored(k) == [k.nodes[-1].name] and along_xindex(k.nodes[-1].store)
    # the spec's order of the loads
    axes = tile_load_axes(compiled)
    along, across = [a == "x" for a in axes], [a == "y" for a in axes]
    assert any(along) and any(across)
    assert along == sorted(along, reverse=True), axes  # every along-load before every across-load


def _tile(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> tuple[int, int, bool]:
    """(ynumel, xnumel, transposed) of the one kernel's tile, scheduled on meta tensors."""
    kp = coil.default_pipeline().run(make_fx(fn)(*inputs), inputs, until="schedule_kernels",
                                     options=coil.Options(target="triton"))
    (k,) = kp.specs
    assert isinstance(k.space, Tiled)
    return k.space.ynumel, k.space.xnumel, k.space.transposed


def test_a_tile_too_wide_for_grid_axis_1_stays_plain() -> None:
    """A column-major output 16 x 2**21 is walked in memory order (realize's walk
    order): a split of 2**21 rows of 16, whose row blocks (at most 65535 of at
    least 16 on grid axis 1) would overflow axis 1, so the tile lies transposed,
    its rows on axis 0; a narrow one lies plain.  Either way xindex runs along the
    output in memory.  Compiled on meta tensors: nothing runs."""
    wide = 1 << 21
    assert wide > TRITON_TILES.max_grid_y * TRITON_TILES.min_side
    fn = lambda a, b: a.t() + b  # noqa: E731
    inputs = [torch.empty(wide, 16, device="meta"), torch.empty(16, wide, device="meta")]
    assert _tile(fn, inputs) == (16, wide, True)
    narrow = [torch.empty(64, 16, device="meta"), torch.empty(16, 64, device="meta")]
    assert _tile(fn, narrow) == (64, 16, False)


def test_a_tile_too_tall_for_grid_axis_1_lays_transposed() -> None:
    """A row-major output of more than 65535 x 16 rows: a plain tile's row blocks
    would overflow grid axis 1, so the tile lies transposed, rows on axis 0 (it was
    not tiled at all before, reading b.t() with a stride).  Compiled on meta tensors."""
    tall = 1 << 21
    assert tall > TRITON_TILES.max_grid_y * TRITON_TILES.min_side
    fn = lambda a, b: a + b.t()  # noqa: E731
    inputs = [torch.empty(tall, 16, device="meta"), torch.empty(16, tall, device="meta")]
    assert _tile(fn, inputs) == (16, tall, True)
    both = [torch.empty(tall, tall >> 4, device="meta"), torch.empty(tall >> 4, tall, device="meta")]
    assert (tall >> 4) * 16 == tall  # 2**17 columns fit axis 1 ...
    assert _tile(fn, both) == (tall >> 4, tall, True)


@pytest.mark.parametrize("device", DEVICES)
def test_a_transposed_tall_tile_matches_eager(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule at a size the interpreter can run: grid axis 1 cut to 2 blocks,
    a 96x24 output (more than 2 x 16 rows, at most 2 x 16 columns) lays its tile
    transposed and matches eager, tails included."""
    tiles = attrs.evolve(TRITON_TILES, max_grid_y=2)
    monkeypatch.setitem(TARGET_TRAITS, "triton", attrs.evolve(TARGET_TRAITS["triton"], tiles=tiles))
    a, b = torch.randn(96, 24, device=device), torch.randn(24, 96, device=device)
    compiled = check(lambda x, y: x + y.t(), [a, b])
    (k,) = specs(compiled)
    assert k.space == Tiled(96, 24, transposed=True) and k.launches[0].sizes == (24, 96)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_a_tile_too_tall_for_grid_axis_1_runs_on_cuda() -> None:
    """At the real limit: 2**21 x 16 (128 MiB a tensor), transposed tile, eager's values."""
    a, b = torch.randn(1 << 21, 16, device="cuda"), torch.randn(16, 1 << 21, device="cuda")
    compiled = check(lambda x, y: x + y.t(), [a, b])
    (k,) = specs(compiled)
    assert k.space == Tiled(1 << 21, 16, transposed=True)
    assert k.launches[0].rule is LaunchRule.TILED and k.launches[0].sizes == (16, 1 << 21)


_TILE_OPS = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "max": torch.maximum}


@settings(max_examples=int(os.environ.get("COIL_PROPERTY_EXAMPLES", "8")), deadline=None, derandomize=True,
          database=None)
@given(rows=st.integers(16, 70), cols=st.integers(16, 70),
       flips=st.lists(st.booleans(), min_size=2, max_size=4).filter(lambda f: any(f) and not all(f)),
       ops=st.lists(st.sampled_from(sorted(_TILE_OPS)), min_size=3, max_size=3), sin=st.booleans())
def test_tiles_match_eager_whatever_the_orientation(rows: int, cols: int, flips: list[bool], ops: list[str],
                                                     sin: bool) -> None:
    """Random mixes of plain and transposed operands (the first operand decides
    whether eager's output is row- or column-major), ragged sizes: the tiled kernel
    matches eager's values and strides, stores along xindex, and loads along its
    store before across it."""
    gen = torch.Generator().manual_seed(rows * 100 + cols)
    inputs = [torch.randn((cols, rows) if f else (rows, cols), generator=gen) for f in flips]

    def fn(*xs: torch.Tensor) -> torch.Tensor:
        vals = [x.t() if f else x for x, f in zip(xs, flips)]
        out = vals[0]
        for v, op in zip(vals[1:], ops):
            out = _TILE_OPS[op](out, v)
        return out.sin() if sin else out

    compiled = check(fn, inputs)
    assert compiled(*inputs)[0].stride() == fn(*inputs).stride()
    (k,) = specs(compiled)
    assert isinstance(k.space, Tiled) and stored(k) == [k.nodes[-1].name]
    assert along_xindex(k.nodes[-1].store), k.nodes[-1].store
    along = [a == "x" for a in tile_load_axes(compiled)]
    assert along == sorted(along, reverse=True), along


def test_tiled_launch_configs() -> None:
    cfg = policy.heuristic_config(TRITON_LAUNCH, "tiled", 8192, 8192)
    assert (cfg.yblock, cfg.xblock) == (64, 64) and cfg.meta() == {"YBLOCK": 64, "XBLOCK": 64}
    assert runtime.grid2(8192, 8192, 64, 64) == (128, 128)
    for c in policy.candidate_configs(TRITON_LAUNCH, "tiled", 40, 33):
        assert c.yblock >= 16 and c.xblock <= 64


@pytest.mark.parametrize("device", DEVICES)
def test_half_intermediates_stay_float32_unless_emulated(device: str) -> None:
    """gelu(x + b) + r in bfloat16: by default x + b and the gelu are not rounded
    between the fused ops (one rounding, at the store); with
    emulate_precision_casts every intermediate rounds as eager does."""
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(64, 48, generator=g, dtype=torch.bfloat16).to(device) for _ in range(2))
    b = torch.randn(48, generator=g, dtype=torch.bfloat16).to(device)
    fn = lambda a, c, d: torch.nn.functional.gelu(a + c, approximate="tanh") + d  # noqa: E731
    fast = check(fn, [x, b, r], atol=1e-2, rtol=1.6e-2)
    exact = check(fn, [x, b, r], atol=0, rtol=0, emulate_precision_casts=True)  # bit for bit
    # the decision: where the bodies round to bfloat16 (the store's, or after every op)
    rounds = [sum(isinstance(e, Cast) and e.dtype == torch.bfloat16 for n in k.nodes for e in set(walk(n.body)))
              for (k,) in (specs(fast), specs(exact))]
    assert rounds == [1, 3], rounds
    # the renderer's spelling of each rounding
    (src_fast,), (src_exact,) = kernel_sources(fast), kernel_sources(exact)
    assert src_fast.count("_coil_to_bf16(") == 1 and src_exact.count("_coil_to_bf16(") == 3
    # against float32 math, one rounding is on average closer than eager's three
    truth = fn(x.float(), b.float(), r.float())
    err = lambda out: (out.float() - truth).abs().mean().item()  # noqa: E731
    assert err(fast(x, b, r)[0]) <= err(fn(x, b, r))


@pytest.mark.parametrize("device", DEVICES)
def test_masks_only_where_a_launch_can_leave_a_tail(device: str) -> None:
    """4096 elements divide by every pointwise block size: no outer tail (the
    renderer makes that mask a constant); 4100 do not: a tail (a real comparison).
    Rows of 64 (a power of two) fill RBLOCK, 128 of them every XBLOCK; 130 rows of
    60 leave tails on both axes."""
    ((even,), (odd,)) = (specs(check(lambda a: a * 2, [torch.randn(n, device=device)])) for n in (4096, 4100))
    assert even.tails is not None and not even.tails.outer
    assert odd.tails is not None and odd.tails.outer
    (rows,) = specs(check(lambda a: a.softmax(-1), [torch.randn(128, 64, device=device)]))
    assert rows.tails == Tails(outer=False, inner=False)
    (tails,) = specs(check(lambda a: a.softmax(-1), [torch.randn(130, 60, device=device)]))
    assert tails.tails == Tails(outer=True, inner=True)


@pytest.mark.parametrize("device", DEVICES)
def test_loads_come_first(device: str) -> None:
    """Every load from memory precedes the arithmetic, so their latency overlaps it."""
    x, r = torch.randn(64, 48, device=device), torch.randn(64, 48, device=device)
    b = torch.randn(48, device=device)
    compiled = check(lambda a, c, d: torch.tanh(a + c) * 2 + d, [x, b, r])
    body = [ln.strip() for ln in kernel_sources(compiled)[0].splitlines() if ln.strip().startswith("tmp")]
    assert [("tl.load(" in ln) for ln in body[:3]] == [True, True, True]
    assert not any("tl.load(" in ln for ln in body[3:])


def test_native_helpers_on_gpu_only() -> None:
    from coil.backends.triton.helpers import helpers_for

    src = ["x = _coil_tanh(y); z = _coil_to_bf16(x)"]
    portable, native = "\n".join(helpers_for(src)), "\n".join(helpers_for(src, native=True))
    assert "bitcast" in portable and "_coil_expm1" in portable and "libdevice" not in portable
    assert "libdevice.tanh(x)" in native and "x.to(tl.bfloat16)" in native and "_coil_expm1" not in native
    # a NaN-aware row max / min: two reductions in the interpreter, one max.NaN / min.NaN reduce on a GPU
    src = ["m = _coil_row_max_nan(t)[:, None]; n = _coil_row_min_nan(t)[:, None]"]
    portable, native = "\n".join(helpers_for(src)), "\n".join(helpers_for(src, native=True))
    assert "tl.reduce(" not in portable and "(x != x)" in portable
    assert native.count("tl.reduce(x, 1, _coil_") == 2 and "def _coil_max_nan_combine" in native
    assert "def _coil_min_nan_combine" in native and "propagate_nan=tl.PropagateNan.ALL" in native


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", KINDS)
def test_layer_norm(device: str, opts: dict[str, Any]) -> None:
    x = torch.randn(10, 48, device=device)
    w, b = torch.randn(48, device=device), torch.randn(48, device=device)
    check(lambda a, c, d: torch.nn.functional.layer_norm(a, (48,), c, d), [x, w, b], atol=1e-5, rtol=1e-4, **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", KINDS)
def test_var_mean_is_one_kernel_with_two_outputs(device: str, opts: dict[str, Any]) -> None:
    x = torch.randn(7, 50, device=device) * 3 + 10
    compiled = check(lambda a: torch.var_mean(a, -1, correction=1), [x], **opts)
    (k,) = specs(compiled)
    # the variance and the mean stored; their reductions stay in registers
    assert stored(k) == ["buf1", "buf3"] and [p for p, _ in params(k)] == ["in_ptr0", "out_ptr0", "out_ptr1"]
    assert all(n.store is None for n in k.nodes if n.reduction_type)


@pytest.mark.parametrize("device", DEVICES)
def test_looped_reduction_with_a_tail(device: str) -> None:
    """1500 > RBLOCK = 1024: two steps, the second one partly masked."""
    x = torch.randn(20, 1500, generator=torch.Generator().manual_seed(0)).to(device)
    fn = lambda a: (a.sum(-1), a.amax(-1), a.argmin(-1), a.var(-1))  # noqa: E731
    # sums of 1500 terms in another order: a few float32 ulps of the terms' size
    compiled = check(fn, [x], atol=1e-4, rtol=1e-5, **LOOPED)
    assert {k.launches[0].config.rblock for k in specs(compiled)} == {1024}
    assert all(k.tails is not None and k.tails.inner for k in specs(compiled))
    # a few rows take steps as wide as 8192 elements (here the whole row at once)
    compiled = check(fn, [x[:3]], atol=1e-4, rtol=1e-5, **LOOPED)
    assert {(k.launches[0].rule, k.launches[0].config.rblock) for k in specs(compiled)} == {(LaunchRule.FEW_ROWS, 2048)}


def test_reduction_heuristics() -> None:
    assert policy.heuristic_config(TRITON_LAUNCH, "reduction", 1, 16384) == LaunchConfig(1, 8192, 16)
    assert policy.heuristic_config(TRITON_LAUNCH, "reduction", 16384, 32000) == LaunchConfig(1, 1024, 2)
    # long rows of an odd length (no row start 16-byte aligned: element-wise loads): 16 warps
    assert policy.heuristic_config(TRITON_LAUNCH, "reduction", 4096, 16383) == LaunchConfig(1, 1024, 16)
    assert policy.heuristic_config(TRITON_LAUNCH, "reduction", 4096, 16384) == LaunchConfig(1, 1024, 2)
    assert policy.heuristic_config(TRITON_LAUNCH, "reduction", 4096, 3001).num_warps == 2
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 32768, 4096) == LaunchConfig(1, 4096, 4)
    # a chain of row reductions: one row a program, a warp per 1024 elements
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 1000, 1024, reductions=2) == LaunchConfig(4, 1024, 4)
    # many rows of 256-1024 (a transformer's norms over batch x sequence rows): a row a
    # program on one warp; fewer rows, or longer ones, keep the usual rule
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 1024, 1024, reductions=2) == LaunchConfig(1, 1024, 1)
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 2048, 512, reductions=3) == LaunchConfig(1, 512, 1)
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 4096, 200) == LaunchConfig(1, 256, 1)
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 512, 512, reductions=3) == LaunchConfig(8, 512, 4)
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 2048, 2048, reductions=3) == LaunchConfig(2, 2048, 4)
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 4096, 128) == LaunchConfig(32, 128, 4)
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 1024, 1024, reductions=8) == LaunchConfig(1, 1024, 1)
    assert policy.heuristic_config(TRITON_LAUNCH, "persistent", 64, 4096, reductions=12) == LaunchConfig(1, 4096, 4)
    assert policy.chain_config(TRITON_LAUNCH, 1024) in policy.candidate_configs(TRITON_LAUNCH, "persistent", 1024, 1024)


@pytest.mark.parametrize("device", DEVICES)
def test_kernels_of_the_same_source_are_defined_once(device: str) -> None:
    """Two layers alike: their pointwise kernels differ in name and comments only,
    so the module defines the first and names the second after it (Triton then
    compiles one function), and both still compute their own layer."""
    def layers(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = (x.relu() * 2) @ w
        return (h.relu() * 2) @ w

    g = torch.Generator().manual_seed(7)
    inputs = [torch.randn(16, 16, generator=g).to(device) for _ in range(2)]
    compiled = check(layers, inputs)
    names = [k.name for k in compiled.module.kernels]
    assert len(names) == 2 and names[0] != names[1]
    source = compiled.module.source
    assert f"def {names[0]}(" in source and f"def {names[1]}(" not in source
    assert f"\n{names[1]} = {names[0]}\n" in source


def test_shared_kernels_match_sources_function_by_function() -> None:
    """A split reduction's source defines two functions: a repeat of it names both
    after the earlier pair; a source that differs anywhere but in comments and
    names stays its own."""
    from coil.backends.triton.codegen import shared_kernels
    from coil.ir.module import KernelSource

    def split(name: str, note: str, step: int = 1) -> KernelSource:
        text = (f"@triton.jit\ndef {name}(a):\n    # {note}\n    x = a + {step}\n\n\n"
                f"@triton.jit\ndef {name}_combine(a):\n    y = a * 2\n")
        return KernelSource(name, text, "triton")

    kernels = [split("k_0", "buf1"), split("k_1", "buf7"), split("k_2", "buf9", step=3), split("k_3", "buf12")]
    assert shared_kernels(kernels) == {"k_1": "k_0", "k_1_combine": "k_0_combine",
                                       "k_3": "k_0", "k_3_combine": "k_0_combine"}


@pytest.mark.parametrize("device", DEVICES)
def test_a_norm_over_many_short_rows_runs_a_row_a_warp(device: str) -> None:
    """A residual add and LayerNorm over 1024 rows of 256 (a transformer's norm over
    batch x sequence): one row a program on one warp, as Inductor launches it on
    CUDA (bench/probes/norm_warps.py), and var_mean's sum and welford_m2 reduce the
    row once between them: two row reductions in the kernel, not three."""
    def norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x + r, (256,), w, b, 1e-5)

    g = torch.Generator().manual_seed(5)
    inputs = [torch.randn(1024, 256, generator=g).to(device) for _ in range(2)]
    inputs += [torch.randn(256, generator=g).to(device) for _ in range(2)]
    compiled = check(norm, inputs, atol=1e-5, rtol=1e-5)
    ((launch,),) = [k.launches for k in specs(compiled)]
    assert launch.rule is LaunchRule.WARP_ROWS and launch.config == LaunchConfig(1, 256, 1)
    assert "a row a program on one warp" in launch.why
    (src,) = kernel_sources(compiled)
    assert src.count("tl.sum(") == 2, src


@pytest.mark.parametrize("device", DEVICES)
def test_reduction_chain_launches_a_row_per_program(device: str) -> None:
    """graph_2000's shape: each step's max feeds the next; the kernel holding eight
    or more of them launches one row per program on one warp, and stays exact."""
    def chain(y: torch.Tensor) -> torch.Tensor:
        for _ in range(6):
            y = y - y.amax(-1, keepdim=True) * 0.5
        return y

    x = torch.randn(16, 1024, generator=torch.Generator().manual_seed(3)).to(device)
    compiled = check(chain, [x], atol=1e-5, rtol=1e-5)
    ((launch,),) = [k.launches for k in specs(compiled)]
    assert launch.rule is LaunchRule.PERSISTENT and launch.config == LaunchConfig(4, 1024, 4)  # six: the usual
    compiled = check(lambda y: chain(chain(y)), [x], atol=1e-5, rtol=1e-5)
    ((launch,),) = [k.launches for k in specs(compiled)]
    assert launch.rule is LaunchRule.CHAINED and launch.config == LaunchConfig(1, 1024, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_over_its_whole_range(device: str, dtype: torch.dtype) -> None:
    """gelu(approximate="tanh") is computed as x * sigmoid(2z): the same function
    as eager's 0.5 x (1 + tanh z), within float32 rounding, out to where it is 0
    or x, with inf and NaN passed through."""
    x = torch.cat([torch.linspace(-40, 40, 8001), torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])])
    x = x.to(device=device, dtype=dtype)
    check(lambda a: F.gelu(a, approximate="tanh"), [x])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", KINDS)
def test_argmax_first_index_and_nan(device: str, opts: dict[str, Any]) -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, -1.0] * 5, [2.0, float("nan"), 5.0, float("nan")] * 5,
                      [float("-inf")] * 20, [0.0] * 19 + [7.0]], device=device)
    check(lambda a: (a.argmax(-1), a.argmin(-1), a.amax(-1), a.amin(-1)), [x], **opts)
    ints = torch.tensor([[4, 1, 4, 1] * 5, [-3] * 20], device=device, dtype=torch.int32)
    check(lambda a: (a.argmax(-1), a.argmin(-1), a.amax(-1)), [ints], **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", KINDS)
def test_amax_propagates_nan(device: str, opts: dict[str, Any]) -> None:
    x = torch.randn(5, 30, device=device)
    x[1, 7] = float("nan")
    x[3, 29] = float("nan")
    check(lambda a: (a.amax(-1), a.amin(-1), *a.max(-1)), [x], **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", KINDS)
def test_prod_any_all_over_bool_and_float(device: str, opts: dict[str, Any]) -> None:
    x = torch.rand(6, 20, device=device) + 0.5
    m = torch.rand(6, 20, device=device) > 0.1
    check(lambda a, b: (a.prod(-1), b.any(-1), b.all(-1), b.sum(-1), b.amax(-1)), [x, m], **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", KINDS)
def test_full_reduction_to_zero_dim(device: str, opts: dict[str, Any]) -> None:
    x = torch.randn(9, 11, device=device)
    check(lambda a: (a.sum(), a.amax(), a.argmax(), a.var()), [x], atol=1e-5, rtol=1e-5, **opts)


@pytest.mark.parametrize("device", DEVICES)
def test_reduction_over_a_transposed_input(device: str) -> None:
    x = torch.randn(33, 17, device=device).t()
    check(lambda a: (a.sum(-1), a.mean(0), a.amax(-1)), [x], **LOOPED)
    check(lambda a: (a.sum(-1), a.mean(0), a.amax(-1)), [x])


@pytest.mark.parametrize("device", DEVICES)
def test_epilogue_reads_reduction_from_registers(device: str) -> None:
    """x - x.mean(-1) fused: the mean never goes to memory."""
    x = torch.randn(8, 24, device=device)
    compiled = check(lambda a: a - a.mean(-1, keepdim=True), [x])
    (k,) = specs(compiled)
    assert k.space == Rows(8, 24, looped=False) and k.stages == (Body(("buf0", "buf1"), loads(k)),)
    assert params(k) == [("in_ptr0", "a_1"), ("out_ptr0", "buf1")] and stored(k) == ["buf1"]
    assert k.node("buf0").reduction_type == "sum" and k.node("buf1").deps == ("buf0",)


def test_kernel_comments_name_the_ops() -> None:
    src = module_of(lambda a: torch.softmax(a, -1), [torch.randn(4, 8)]).kernels[0].source
    assert "# buf0: reduction max from _softmax" in src


def test_int64_indexing_past_2_31() -> None:
    """Offsets at or past 2**31 switch the kernel's index math to int64 (compiled on
    meta tensors: they allocate nothing), and the renderer starts it at the program id."""
    big = torch.empty(2**31 + 8, device="meta", dtype=torch.int8)
    module = module_of(lambda a: a + 1, [big])
    (k,) = module.program.specs
    assert k.wide_index
    assert "tl.program_id(0).to(tl.int64)" in module.kernels[0].source
    small = torch.empty(1024, device="meta", dtype=torch.int8)
    (k,) = module_of(lambda a: a + 1, [small]).program.specs
    assert not k.wide_index


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA or torch.cuda.get_device_properties(0).total_memory < 16 * 2**30 if HAS_CUDA else True,
                    reason="needs a CUDA device with 16 GiB")
def test_int64_indexing_runs_on_cuda() -> None:
    x = torch.ones(2**31 + 1000, device="cuda", dtype=torch.int8)
    x[-3] = 5
    (out,) = compile_fn(lambda a: a * 2, [x])(x)
    assert out[-3].item() == 10 and out[0].item() == 2 and out[-1].item() == 2


# ---- launch heuristics, autotuning, guards --------------------------------------------------------------


@pytest.mark.parametrize("kind, xnumel, rnumel", [
    ("pointwise", 10, 1), ("pointwise", 10**6, 1), ("persistent", 1000, 7), ("persistent", 3, 1024),
    ("reduction", 64, 5000), ("reduction", 1, 10**6),
])
def test_configs_are_legal(kind: str, xnumel: int, rnumel: int) -> None:
    for cfg in policy.candidate_configs(TRITON_LAUNCH, kind, xnumel, rnumel):
        assert cfg.xblock & (cfg.xblock - 1) == 0 and cfg.num_warps in (1, 2, 4, 8, 16)
        if kind == "persistent":
            assert cfg.rblock >= rnumel  # the whole row in one tile
        if kind == "pointwise":
            assert cfg.rblock == 0
    h = policy.heuristic_config(TRITON_LAUNCH, kind, xnumel, rnumel)
    assert h == policy.candidate_configs(TRITON_LAUNCH, kind, xnumel, rnumel)[0]
    assert math.prod(runtime.grid(xnumel, h.xblock)) * h.xblock >= xnumel


def test_pointwise_heuristic() -> None:
    assert policy.heuristic_config(TRITON_LAUNCH, "pointwise", 1 << 20, 1) == LaunchConfig(1024, 0, 4)
    assert policy.heuristic_config(TRITON_LAUNCH, "pointwise", 24, 1).xblock == 32


@needs_interpreter
def test_autotune_option_keeps_cpu_launches() -> None:
    """With autotune on, CPU (interpreted) kernels launch with the written config."""
    compiled = check(lambda a: torch.softmax(a, -1), [torch.randn(4, 16)], autotune=True)
    assert [k.config_kind for k in specs(compiled)] == ["persistent"]
    assert re.search(r"triton_per_\w+ = autotuned\(triton_per_\w+, 'persistent'\)", compiled.source)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_autotune_on_cuda_caches_the_winner(tmp_path: Any) -> None:
    x = torch.randn(64, 3000, device="cuda")
    compiled = check(lambda a: torch.softmax(a, -1), [x], autotune=True, cache_dir=str(tmp_path))
    tuned = list((tmp_path / "triton-autotune").glob("*.json"))
    assert len(tuned) == len(compiled.module.kernels)
    check(lambda a: torch.softmax(a, -1), [x], autotune=True, cache_dir=str(tmp_path))  # from the cache


def test_cpu_tensors_without_interpreter_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "interpreter_on", lambda: False)
    with pytest.raises(CoilError, match="TRITON_INTERPRET=1"):
        with runtime.interpreted():
            pass


# ---- split reductions: one long row over many programs ---------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_full_reductions_split_over_programs(device: str) -> None:
    """A row of 40,000 elements: 157 programs of 256 each store partial results,
    then one program combines them and computes what follows (the mean's division)."""
    x = torch.randn(200, 200, device=device)
    x[7, 9] = float("nan")
    y = torch.randn(40000, device=device)
    compiled = check(lambda a: (a.sum(), a.mean(), a.amax(), a.amin(), (a > 3).any(), (a > -9).all()), [y],
                     atol=1e-4, rtol=1e-5)
    (k,) = specs(compiled)
    assert isinstance(k.space, Split) and (k.space.parts, k.space.chunk) == (157, 256)
    # two functions: the partials', then their combine
    assert [(ln.function, ln.rule) for ln in k.launches] == [(k.name, LaunchRule.SPLIT),
                                                             (f"{k.name}_combine", LaunchRule.COMBINE)]
    assert [ln.grid for ln in k.launches] == [(157, 1, 1), (1, 1, 1)]
    check(lambda a: (a.amax(), a.amin(), a.sum()), [x], atol=1e-4, rtol=1e-5)  # NaN reaches max and min
    # an elementwise output of the same kernel: each program stores its own chunk of it
    compiled = check(lambda a: ((a * 2).exp(), (a * 2).exp().sum()), [y], atol=1e-3, rtol=1e-5)
    (k,) = specs(compiled)
    assert isinstance(k.space, Split) and [n.role.value for n in k.nodes if n.store is not None] == ["inner", "reduction"]


@pytest.mark.parametrize("device", DEVICES)
def test_split_keeps_integer_sums_and_gathers(device: str) -> None:
    """cross_entropy's mean over 16,384 rows: the count of counted targets (int64)
    and the gathered log-probabilities split; ignored targets count for nothing."""
    x = torch.randn(16384, 6, device=device)
    t = torch.randint(0, 6, (16384,), device=device)
    t[::7] = -100
    compiled = check(lambda a, b: torch.nn.functional.cross_entropy(a, b), [x, t], atol=1e-5, rtol=1e-5)
    split = [k.space for k in specs(compiled) if isinstance(k.space, Split)]
    assert len(split) == 1 and split[0].xnumel == 1
    assert torch.int64 in [dt for _, dt in split[0].workspaces]


@pytest.mark.parametrize("device", DEVICES)
def test_welford_and_arg_reductions_split(device: str) -> None:
    """var / std (Welford: each program stores mean, M2 and count, merged as Chan
    does), argmax / argmin (the extreme and its first index; ties and NaN pick the
    earliest), over 40,000 elements in 157 programs."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(40000, generator=g) * 3 + 100).to(device)
    x[[7, 30001]] = 500.0  # a tie for the max across two programs: the first index wins
    x[[9000, 39999]] = -400.0
    compiled = check(lambda a: (a.var(), a.std(correction=0), a.argmax(), a.argmin()), [x], atol=1e-3, rtol=1e-4)
    # workspaces: mean, M2 and count for var and for std, value and index for argmax and for argmin
    (k,) = specs(compiled)
    assert isinstance(k.space, Split) and (k.space.xnumel, k.space.parts) == (1, 157)
    dtypes = [dt for _, dt in k.space.workspaces]
    assert (dtypes.count(torch.float32), dtypes.count(torch.int64), len(dtypes)) == (8, 2, 10)
    # the int64 ones: the indices of argmax and argmin
    args = [n.name for n in k.nodes if n.reduction_type in ("argmax", "argmin")]
    assert len(args) == 2 and [w for w, dt in k.space.workspaces if dt == torch.int64] == args
    y = x.clone()
    y[[12345, 20000]] = float("nan")
    check(lambda a: (a.argmax(), a.argmin(), a.var()), [y])
    check(lambda a: (a > 120).int().argmax(), [x])  # bool -> int argmax: the first True


@pytest.mark.parametrize("device", DEVICES)
def test_a_few_long_rows_split_too(device: str) -> None:
    """Three rows of 20,000: a (79, 3) grid of partials, one combining program per row."""
    x = torch.randn(3, 20000, generator=torch.Generator().manual_seed(5)).to(device)
    x[1, 19999] = float("nan")
    x[2, 123] = 50.0
    fn = lambda a: (a.sum(-1), a.amax(-1), a.var(-1), a.argmax(-1), a.argmin(-1), (a * 2).exp().sum(-1))  # noqa: E731
    compiled = check(fn, [x], atol=1e-3, rtol=1e-4)
    (k,) = specs(compiled)
    assert [(ln.rule, ln.grid) for ln in k.launches] == [(LaunchRule.SPLIT, (79, 3, 1)), (LaunchRule.COMBINE, (3, 1, 1))]


def test_a_splits_workspace_on_cuda_is_allocated_without_the_dispatcher() -> None:
    """Generated for fake CUDA tensors (nothing runs): the partials of a split
    reduction live in a workspace allocated as coil's buffers are on the device
    `call` runs on (empty_strided_cuda, no dispatcher: a microsecond less for each
    of a training step's split reductions)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 2**20, device="cuda")
    gm = make_fx(lambda a: (a.sum(1),), tracing_mode="fake")(x)
    out = coil.default_pipeline().run(gm, [x], until="kernel_gen", options=coil.Options(target="triton",
                                                                                         graph_cache=False))
    assert isinstance(out, CompiledModule)
    assert [type(k.space) for k in out.program.specs] == [Split]
    assert "ws0_0 = empty_strided_cuda((1024,), (1,), torch.float32)" in out.source, out.source


@pytest.mark.parametrize("device", DEVICES)
def test_what_does_not_split(device: str) -> None:
    """Short rows and many rows keep one kernel."""
    SPLIT_MAX_ROWS, SPLIT_MIN = TRITON_SPLITS.max_rows, TRITON_SPLITS.row_min
    for fn, x in ((lambda a: a.sum(), torch.randn(SPLIT_MIN - 1, device=device)),
                  (lambda a: a.sum(-1), torch.randn(SPLIT_MAX_ROWS + 1, SPLIT_MIN, device=device))):
        compiled = check(fn, [x], atol=1e-4, rtol=1e-4)
        assert not any(isinstance(k.space, Split) for k in specs(compiled))


# ---- reductions down columns: a block of neighbouring columns a program -------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_column_reductions_split_over_blocks_of_columns(device: str) -> None:
    """x.sum(0) of a row-major 2500 x 70 and its kin: each read steps 1 along the
    kernel's rows (the columns), so the kernel loops over the rows with 32 columns a
    program, and, as 3 column blocks cannot fill a GPU, splits the 2500 rows over 20
    programs a block (128 rows each), then combines a block of columns a program.
    Every reduction type with split partials, ragged at both ends."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(2500, 70, generator=g) * 3).to(device)
    x[[5, 2400], 3] = 50.0  # a tie for column 3's max across programs: the first index wins
    x[17, 9] = float("nan")
    fns = (lambda a: a.sum(0), lambda a: a.mean(0), lambda a: a.amax(0), lambda a: a.amin(0),
           lambda a: a.argmax(0), lambda a: a.argmin(0), lambda a: a.var(0), lambda a: (a * 1e-3 + 1).prod(0),
           lambda a: (a > 4).any(0), lambda a: (a > -9).all(0))
    for fn in fns:
        compiled = check(fn, [x], atol=1e-3, rtol=1e-4)
        ((first, combine),) = [k.launches for k in specs(compiled)]
        assert first.grid == (20, 3, 1) and (first.config.xblock, first.config.rblock) == (32, 64), first
        assert combine.grid == (3, 1, 1) and combine.config.xblock == 32, combine
    ints = torch.randint(-5, 5, (2500, 70), generator=g, dtype=torch.int32).to(device)
    check(lambda a: a.sum(0), [ints])
    # layer_norm's weight gradient: per-row mean and rstd (the same for every column) do
    # not make it a row reduction
    mean, rstd = torch.randn(2500, generator=g).to(device), torch.rand(2500, generator=g).to(device)
    compiled = check(lambda dy, a, m, r: (dy * (a - m[:, None]) * r[:, None]).sum(0), [x.nan_to_num(), x * 0.5, mean, rstd],
                     atol=1e-3, rtol=1e-4)
    assert specs(compiled)[0].launches[0].grid == (20, 3, 1)
    check(lambda a: a.sum((0, 1)), [x.view(25, 100, 70)], atol=1e-3, rtol=1e-4)  # two leading dims as rows
    # ViT's LayerNorm weight gradient: 1576 rows (from COLUMN_SPLIT_MIN) of 512 columns split too
    vit = torch.randn(1576, 512, generator=g).to(device)
    ((first, combine),) = [k.launches for k in specs(check(lambda a, b: (a * b).sum(0), [vit, vit * 0.5],
                                                             atol=1e-3, rtol=1e-4))]
    assert (first.grid, combine.grid) == ((13, 16, 1), (16, 1, 1)), (first, combine)


@pytest.mark.parametrize("device", DEVICES)
def test_a_combine_of_many_partials_runs_on_narrower_column_blocks(device: str) -> None:
    """ResNet's BatchNorm statistics in channels-last: 64 columns down 25088 rows
    split into 196 partials a column.  The first launch keeps its 32 columns a
    program; the combine merges 4 columns a program (1024 partials), 16 programs
    where a block of 32 made 2, and its values are eager's."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(25088, 64, generator=g).to(device)
    compiled = check(lambda a: torch.var_mean(a, 0, correction=0), [x], atol=1e-3, rtol=1e-4)
    ((first, combine),) = [k.launches for k in specs(compiled)]
    assert first.grid == (196, 2, 1) and first.config.xblock == 32, first
    assert combine.grid == (16, 1, 1) and (combine.config.xblock, combine.config.rblock) == (4, 256), combine
    assert "a block of 4 columns (of the first launch's 32)" in combine.why


@pytest.mark.parametrize("device", DEVICES)
def test_short_or_wide_column_reductions_loop_without_splitting(device: str) -> None:
    """Columns shorter than 1024 rows, or more column blocks than the split's 1024
    programs, run as one looped kernel with 32 columns a program; a second pass
    over the columns (softmax(0)) keeps its reductions and passes correct."""
    x = torch.randn(600, 70, device=device)
    compiled = check(lambda a: a.sum(0), [x], atol=1e-4, rtol=1e-4)
    (k,) = specs(compiled)
    assert k.space == Rows(70, 600, looped=True, columns=True)
    ((launch,),) = [k.launches]
    assert launch.rule is LaunchRule.COLUMNS and (launch.config.xblock, launch.config.rblock) == (32, 64)
    check(lambda a: a.softmax(0), [torch.randn(2500, 40, device=device)], atol=1e-5, rtol=1e-4)
    check(lambda a: a - a.mean(0), [torch.randn(700, 33, device=device)], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_row_reductions_keep_their_kernels(device: str) -> None:
    """Reductions along a row (contiguous along rindex) are not column reductions:
    sum(-1) of a row-major matrix, and sum(0) of a column-major one, stay
    persistent, one or a few rows a program."""
    x = torch.randn(300, 200, device=device)
    for fn, inp in ((lambda a: a.sum(-1), x), (lambda a: a.sum(0), x.t().contiguous().t())):
        (k,) = specs(check(fn, [inp], atol=1e-4, rtol=1e-4))
        assert isinstance(k.space, Rows) and not k.space.looped and not k.space.columns, k.space


def test_reads_down_columns_decides_the_kind_on_triton_only() -> None:
    """The kernel model's test, and fuse's use of it: looped on triton (from
    the triton trait's column_loop_min rows on), persistent on the other targets and
    for shorter columns."""
    column_loop_min = coil.Options(target="triton").traits().column_loop_min
    assert column_loop_min is not None

    def kinds(x: torch.Tensor, target: str) -> list[str]:
        gm = make_fx(lambda a: a.sum(0))(x)
        sched = coil.default_pipeline().run(gm, [x], until="fuse", options=coil.Options(target=target))
        return [k.kind for k in sched.kernels]

    tall = torch.empty(column_loop_min, 64, device="meta")
    short = torch.empty(column_loop_min - 1, 64, device="meta")
    assert kinds(tall, "triton") == ["reduction"]
    assert kinds(short, "triton") == ["persistent"]
    assert kinds(tall, "cpp") == ["persistent"]
    assert kinds(tall.t().contiguous().t(), "triton") == ["persistent"]  # column-major: a row reduction


@settings(max_examples=int(os.environ.get("COIL_PROPERTY_EXAMPLES", "8")), deadline=None, derandomize=True,
          database=None)
@given(rows=st.integers(130, 4200), cols=st.integers(2, 100), op=st.sampled_from(["sum", "amax", "mean", "var"]),
       scale=st.booleans())
def test_column_reductions_match_eager(rows: int, cols: int, op: str, scale: bool) -> None:
    """Any height (looped, split or not) and width (one column to several blocks,
    ragged): the column reduction matches eager, and reads a block of columns a
    program (XBLOCK 32, or the next power of two of a narrower width); a split's
    combine merges a block of at most that many columns, narrowed to COMBINE_TILE
    partial results a program."""
    from coil.passes.schedule.launch import COMBINE_TILE

    gen = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randn(rows, cols, generator=gen)

    def fn(a: torch.Tensor) -> torch.Tensor:
        b = a * 2 + 1 if scale else a
        return getattr(b, op)(0)

    compiled = check(fn, [x], atol=1e-4, rtol=1e-4)
    want = min(32, 1 << (cols - 1).bit_length())
    for k in specs(compiled):
        for ln in k.launches:
            if ln.rule is LaunchRule.COMBINE:
                assert ln.config.xblock == max(1, min(want, COMBINE_TILE // ln.config.rblock)), ln
            else:
                assert ln.config.xblock == want, k.launches


@pytest.mark.parametrize("device", DEVICES)
def test_second_passes_over_long_rows_run_as_split_kernels(device: str) -> None:
    """A second pass over a few long rows (x - x.mean(), layer_norm of one row, a
    full softmax or logsumexp) is not fused with the reduction before it: each
    reduction splits over many programs and the pass runs as its own kernel.  Rows
    shorter than Options.split_second_pass (or with it 0) keep one kernel."""
    SPLIT_MIN = TRITON_SPLITS.row_min
    x = torch.randn(2 * SPLIT_MIN, generator=torch.Generator().manual_seed(5)).to(device)
    for fn, split_kernels in ((lambda a: a - a.mean(), 1),
                           (lambda a: torch.nn.functional.layer_norm(a, (a.shape[-1],)), 1),
                           (lambda a: a.logsumexp(0), 2),
                           (lambda a: a.softmax(0), 2)):
        compiled = check(fn, [x], atol=1e-5, rtol=1e-4, split_second_pass=2 * SPLIT_MIN)
        assert sum(isinstance(k.space, Split) for k in specs(compiled)) == split_kernels, compiled.source
        assert any(d.reason.startswith("split: ") for d in compiled.module.schedule.fusion_log)
        for limit in (0, 2 * SPLIT_MIN + 1):
            whole = check(fn, [x], atol=1e-5, rtol=1e-4, split_second_pass=limit)
            assert [len(k.launches) for k in specs(whole)] == [1]


def test_precompile_specs_match_the_launch_lines() -> None:
    """Each plain launch line gets a precompile spec with the same sizes, blocks and
    warps, its tensors given by dtype; a split reduction's two launches get none."""
    from coil.backends.triton.codegen import precompile_specs

    x, i, y, z = torch.randn(64, 300), torch.randint(0, 300, (64,)), torch.randn(40000), torch.randn(96, 96)
    fn = lambda a, t, b, c: (a.softmax(-1) * 2, F.cross_entropy(a, t), b.sum(), c + c.t())  # noqa: E731
    module = module_of(fn, [x, i, y, z])
    specs = precompile_specs(module.program)
    launches = re.findall(r"^\s+(triton_\w+)\[(.*?)\]\((.*?)\)$", module.source, re.M)
    plain = [(name, args) for name, grid_text, args in launches if grid_text.startswith("grid")]
    assert len(launches) == len(plain) + 2  # the sum is split: no spec for its two launches
    assert any(grid_text.startswith("grid2(") for _, grid_text, _ in launches)  # a tiled launch has one
    assert len(specs) == len(plain) >= 3
    for spec, (name, args) in zip(specs, plain):
        assert spec.lstrip().startswith(f"({name}, (")
        parts = [a.strip() for a in args.split(",")]
        sizes = [a for a in parts if a.isdigit()]
        tensors = [a for a in parts if not a.isdigit() and "=" not in a]
        meta = dict(a.split("=") for a in parts if "=" in a)
        assert spec.count("torch.") == len(tensors)
        assert f"{', '.join(sizes)},)" in spec
        for key, v in meta.items():
            assert f"'{key}': {v}" in spec
    assert not any("_combine" in s for s in specs)


def test_precompile_warms_every_kernel_and_survives_a_failure() -> None:
    """runtime.precompile calls each kernel's warmup with the spec's arguments on a
    one-program grid, several at a time; one that raises is left to its launch."""
    import threading

    calls: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = []

    class Kernel:
        def __init__(self, name: str, fails: bool = False) -> None:
            self.__name__, self.fails = name, fails
            self.kernel = None  # as Triton's JITFunction has one (None until launched)

        def warmup(self, *args: Any, grid: tuple[int, ...], **meta: Any) -> None:
            calls.append((self.__name__, args, {"grid": grid, **meta}, threading.current_thread().name))
            if self.fails:
                raise RuntimeError("no compiler here")

    class Wrapped:  # as Launcher and fast_launch hold a JITFunction
        def __init__(self, kernel: Kernel) -> None:
            self.kernel = kernel

    specs = [(Kernel("k0"), (torch.float32, 16), {"XBLOCK": 16, "num_warps": 1}, "cpu"),
             (Wrapped(Kernel("k1", fails=True)), (torch.bfloat16, torch.float32, 8, 4), {"XBLOCK": 1, "RBLOCK": 4, "num_warps": 2}, "cpu"),
             (Kernel("k2"), (torch.int64, 3), {"XBLOCK": 4, "num_warps": 1}, "cpu")]
    runtime.precompile(specs)
    got = {c[0]: c for c in calls}
    assert sorted(got) == ["k0", "k1", "k2"]
    assert got["k1"][1] == (torch.bfloat16, torch.float32, 8, 4)
    assert got["k1"][2] == {"grid": (1,), "XBLOCK": 1, "RBLOCK": 4, "num_warps": 2}
    if len(os.sched_getaffinity(0)) > 1:
        assert all(c[3].startswith("coil-precompile") for c in calls)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_precompiled_kernels_are_not_compiled_again(tmp_path: Any) -> None:
    """On CUDA every plain kernel is compiled when output_code.py loads for the
    first time (a cache without its kernel images: triton/images.py); the first
    call finds each in Triton's cache (no new entry) and is right."""
    from coil.backends.triton.runtime import Launcher

    def cached(jit: Any) -> int:
        return sum(len(c[0]) for c in jit.device_caches.values())

    x = torch.randn(512, 700, device="cuda")
    fn = lambda a: (a.softmax(-1), a.t() * 2, (a * 3).sum(-1))  # noqa: E731
    compiled = compile_fn(fn, [x], graph_cache=False, cache_dir=str(tmp_path))
    assert "PRECOMPILE = [" in compiled.source
    launchers = [v for v in compiled.namespace.values() if isinstance(v, Launcher)]
    before = [cached(f.kernel) for f in launchers]
    assert before and all(n == 1 for n in before), (before, compiled.source)
    for got, want in zip(compiled(x), fn(x)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)  # sums of 700 terms in another order
    after = [cached(f.kernel) for f in launchers]
    assert after == before, (before, after, compiled.source)


def test_inputs_that_keep_their_place_are_not_tested_for_alignment() -> None:
    """Generated for fake CUDA tensors (nothing runs): the wrapper tests the
    addresses of the inputs its kernels read on every call, except those
    Options.aligned_inputs names (parameters and buffers, which keep their place);
    with all of them named it takes the stream without a test."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        inputs = [torch.empty(64, 32, device="cuda"), torch.empty(32, device="cuda"), torch.empty(32, device="cuda")]
    gm = make_fx(lambda x, w, b: (x * w + b).relu(), tracing_mode="fake")(*inputs)

    def prologue(**kw: Any) -> str:
        out = coil.default_pipeline().run(gm, inputs, until="kernel_gen",
                                          options=coil.Options(target="triton", graph_cache=False, **kw))
        return next(ln.strip() for ln in out.source.splitlines() if ln.strip().startswith("stream0 ="))

    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    x, w, b = names
    everything = prologue()
    assert all(f"{n}.data_ptr()" in everything for n in names), everything
    assert prologue(aligned_inputs=(1, 2)) == f"stream0 = None if ({x}.data_ptr()) & 15 else raw_stream(0)"
    assert prologue(aligned_inputs=(0, 1, 2)) == "stream0 = raw_stream(0)"


def test_only_static_inputs_at_aligned_offsets_are_named_aligned(monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamo._aligned_static_inputs: AOTAutograd's static inputs of a forward graph
    whose storage offsets keep 16-byte alignment; none for a backward, none on the CPU
    (meta tensors stand for CUDA ones here: a CPU build cannot make CUDA views)."""
    from torch._guards import TracingContext

    from coil.backends import dynamo

    base = torch.empty(100, device="meta")
    inputs = [torch.empty(8, device="meta"), base[4:12], base[1:9], torch.empty(8, device="meta")]
    gm = make_fx(lambda a, b, c, d: a + b + c + d)(*inputs)
    assert dynamo._aligned_static_inputs(gm, inputs, "forward") == ()  # not on CUDA
    monkeypatch.setattr(dynamo, "_on_cuda", lambda _: True)

    class Meta:
        static_input_indices = [1, 2, 3]

    ctx = TracingContext(None)
    ctx.fw_metadata = Meta()  # type: ignore[assignment]
    with torch._guards.tracing(ctx):
        assert dynamo._aligned_static_inputs(gm, inputs, "forward") == (1, 3)  # offset 4 floats: 16 bytes
        assert dynamo._aligned_static_inputs(gm, inputs, "backward") == ()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_launchers_bind_and_key_on_alignment() -> None:
    """On CUDA the wrapper launches through Launchers: Triton's path at the first
    call, its compiled launcher bound with the arguments prepared after that.  A
    misaligned view of the input goes through the keyed path (another
    specialization) and still gives the right result; aligned calls after it
    take the bound path again."""
    from coil.backends.triton.runtime import Launcher

    base = torch.randn(4097 * 64 + 1, device="cuda")
    aligned, shifted = base[: 4096 * 64].view(4096, 64), base[1: 4096 * 64 + 1].view(4096, 64)
    fn = lambda a: (a.softmax(-1), a.sum())  # noqa: E731 - a persistent and a split kernel
    compiled = compile_fn(fn, [aligned])
    assert "stream0 = None if (a_1.data_ptr()) & 15 else raw_stream(0)" in compiled.source, compiled.source
    launchers = [v for v in compiled.namespace.values() if isinstance(v, Launcher)]
    assert len(launchers) == 3  # softmax, split sum and its combine
    for x in (aligned, aligned, shifted, shifted, aligned, aligned):
        got = compiled(x)
        torch.testing.assert_close(got[0], x.softmax(-1))
        torch.testing.assert_close(got[1], x.sum(), rtol=1e-5, atol=1e-3)
    assert all(f.run is not None for f in launchers), [f.rule for f in launchers]
    assert all(f.rule.startswith("bound") for f in launchers)
    assert all(len(f.keyed.compiled) == 1 for f in launchers)  # the misaligned specialization, keyed


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_bound_launches_follow_the_current_stream() -> None:
    """A bound launch takes the stream current when `call` starts, so work on a
    side stream (as CUDA graph capture runs) stays on it and is right."""
    x = torch.randn(1024, 512, device="cuda")
    fn = lambda a: (a.softmax(-1) * 2,)  # noqa: E731
    compiled = compile_fn(fn, [x])
    compiled(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = compiled(x)[0]
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(got, fn(x)[0])


_FULL = {
    "sum": lambda a: a.sum(-1), "mean": lambda a: a.mean(-1), "amax": lambda a: a.amax(-1),
    "amin": lambda a: a.amin(-1), "argmax": lambda a: a.argmax(-1), "argmin": lambda a: a.argmin(-1),
    "var": lambda a: a.var(-1), "std0": lambda a: a.std(-1, correction=0), "any": lambda a: (a > 2.5).any(-1),
    "all": lambda a: (a > -2.5).all(-1),
}


@settings(max_examples=int(os.environ.get("COIL_PROPERTY_EXAMPLES", "8")), deadline=None, derandomize=True,
          database=None)
@given(rows=st.integers(1, 3), n=st.integers(16384, 2 * 16384),
       kinds=st.lists(st.sampled_from(sorted(_FULL)), min_size=1, max_size=3, unique=True),
       specials=st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                   st.sampled_from([float("nan"), float("inf"), float("-inf"), 9.0, -9.0])),
                         max_size=3))
def test_split_reductions_match_eager(rows: int, n: int, kinds: list[str], specials: list[tuple[float, float]]) -> None:
    """Split reductions of a few rows of random lengths (a ragged last program) with
    NaN, infinities and ties at random places give eager's results."""
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n))
    for where, value in specials:
        flat = int(where * rows * n)
        x[flat // n, flat % n] = value
    fns = [_FULL[k] for k in kinds]
    compiled = check(lambda a: tuple(f(a) for f in fns), [x], atol=1e-3, rtol=1e-4)
    assert [k.launches[1].grid for k in specs(compiled) if isinstance(k.space, Split)] == [(rows, 1, 1)]


# second passes over a row, each reading one or two reductions of it element by element
_SECOND_PASS = {
    "center": lambda a: a - a.mean(-1, keepdim=True),
    "softmax": lambda a: a.softmax(-1),
    "log_softmax": lambda a: a.log_softmax(-1),
    "layer_norm": lambda a: F.layer_norm(a, (a.shape[-1],)),
    "two_pass_var": lambda a: ((a - a.mean(-1, keepdim=True)) ** 2).mean(-1),
    "scale_by_max": lambda a: a / a.abs().amax(-1, keepdim=True) + a.sum(-1, keepdim=True),
}


@settings(max_examples=int(os.environ.get("COIL_PROPERTY_EXAMPLES", "8")), deadline=None, derandomize=True,
          database=None)
@given(rows=st.integers(1, 3), n=st.integers(16384, 2 * 16384),
       kinds=st.lists(st.sampled_from(sorted(_SECOND_PASS)), min_size=1, max_size=3, unique=True))
def test_split_second_passes_match_eager(rows: int, n: int, kinds: list[str]) -> None:
    """With split_second_pass at the split minimum, random mixes of second passes
    over a few rows of random lengths run as split reductions plus separate passes
    (none fused back into one program a row) and give eager's results."""
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n + rows))
    fns = [_SECOND_PASS[k] for k in kinds]
    compiled = check(lambda a: tuple(f(a) for f in fns), [x], atol=1e-4, rtol=1e-4, split_second_pass=16384)
    program = compiled.module.program
    looped = [k for k in program.specs if k.kind == "reduction"]
    assert looped and all(isinstance(k.space, Split) for k in looped), compiled.source



def test_a_launcher_whose_bound_call_is_refused_falls_back() -> None:
    """A Triton whose compiled launcher takes other arguments than the shape read
    at binding refuses them before launching (TypeError): the Launcher unbinds, says
    why, and launches through Triton's path."""
    from coil.backends.triton.runtime import Launcher

    launched: list[tuple[Any, ...]] = []

    class Kernel:  # no arg_names: the keyed path is Triton's own launch (no CUDA driver here)
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **meta: launched.append((grid, args, meta))

    lau = Launcher(Kernel(), (4, 1, 1), (16,), {"XBLOCK": 4, "num_warps": 1})

    def refuse(*args: Any) -> None:
        raise TypeError("function takes 17 positional arguments")

    lau.run, lau.head, lau.tail = refuse, (), (16, 4)
    lau(123, "x")
    assert lau.run is None and not lau.bind and lau.rule.startswith("not bound: this Triton's launcher refused")
    assert launched == [((4, 1, 1), ("x", 16), {"XBLOCK": 4, "num_warps": 1})]


def test_int_key_matches_tritons_specialization() -> None:
    """fast_launch's key of an integer argument separates every pair of values
    this Triton compiles differently (its native_specialize_impl, where it has one):
    two values with the same key must share a kernel."""
    from coil.backends.triton.runtime import int_key

    native = pytest.importorskip("triton._C.libtriton").__dict__.get("native_specialize_impl")
    if native is None:
        pytest.skip("this Triton specializes in Python")
    from triton.backends.compiler import BaseBackend

    values = [0, 1, 2, 3, 15, 16, 17, 31, 32, 48, 4095, 4096, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
              2**40, -1, -16, -(2**31), -(2**31) - 1]
    by_key: dict[Any, set[Any]] = {}
    for v in values:
        by_key.setdefault(int_key(v), set()).add(native(BaseBackend, v, False, True, True))
    assert all(len(specs) == 1 for specs in by_key.values()), by_key


def test_fast_launch_keys_symbolic_sizes_not_grids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic graph's launches through fast_launch: a new grid with sizes of
    the same specialization runs the kernel already compiled (no Triton binding);
    a size equal to 1, off a multiple of 16 or past int32 goes through Triton's
    path once for its own specialization."""
    from coil.backends.triton import runtime

    monkeypatch.setattr(runtime, "_current_stream", lambda: (lambda: 7))
    triton_calls: list[tuple[Any, ...]] = []
    runs: list[tuple[Any, ...]] = []

    class Compiled:
        function, packed_metadata = "fn", "md"

        def __init__(self, tag: int) -> None:
            self.tag = tag

        def run(self, *args: Any) -> None:
            runs.append((self.tag, *args))

    class Kernel:
        arg_names = ("in_ptr0", "out_ptr0", "xnumel", "s0", "XBLOCK")

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **meta: Any) -> Compiled:
                triton_calls.append((grid, args, meta))
                return Compiled(len(triton_calls))
            return launch

    fl = runtime.fast_launch(Kernel())
    assert fl.enabled
    x, y = torch.empty(64), torch.empty(64)
    for n in (32, 48, 64, 17, 33, 1, 32):
        fl[(n // 16 + 1,)](x, y, n, n, XBLOCK=16, num_warps=1)
    # 32 compiles (Triton's path), 48 and 64 reuse it; 17 compiles, 33 reuses; 1 compiles; 32 reuses
    assert [c[1][2] for c in triton_calls] == [32, 17, 1]
    assert [(r[0], r[1], r[-3]) for r in runs] == [(1, 4, 48), (1, 5, 64), (2, 3, 33), (1, 3, 32)]
    assert all(r[4] == 7 and r[5:7] == ("fn", "md") for r in runs)


def test_sized_launcher_binds_once_a_specialization(monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic launch's SizedLauncher (here against a launcher of Triton 3.6's
    shape): the first call of each specialization of the sizes (int_key) goes
    through Triton, later ones call the bound launcher with this call's grid and
    sizes; a stream of None (an input not aligned) goes the keyed way and binds
    nothing; a launcher that refuses the bound arguments is unbound and the
    launch goes through Triton's path."""
    from coil.backends.triton import runtime

    monkeypatch.setattr(runtime, "_current_stream", lambda: (lambda: 7))
    triton_calls: list[tuple[Any, ...]] = []
    bound: list[tuple[Any, ...]] = []

    class Run36:  # Triton 3.6's CudaLauncher: grid, stream, function, *args
        launch_cooperative_grid, launch_pdl = False, False
        refuse = False

        def __call__(self, gridX: int, gridY: int, gridZ: int, stream: int, function: Any, *args: Any) -> None:
            raise AssertionError("the bound path calls launch, not the launcher object")

        @staticmethod
        def launch(*args: Any) -> None:
            if Run36.refuse:
                raise TypeError("function takes 17 positional arguments")
            bound.append(args)

    class Compiled:
        function, packed_metadata = "fn", "md"
        run = Run36()

    class Kernel:
        arg_names = ("in_ptr0", "out_ptr0", "xnumel", "s0", "XBLOCK")

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **meta: Any) -> Compiled:
                triton_calls.append((grid, args, meta))
                return Compiled()
            return launch

    sl = runtime.SizedLauncher(Kernel(), {"XBLOCK": 16, "num_warps": 1})
    x, y = torch.empty(64), torch.empty(64)
    for n in (32, 48, 64, 17, 33, 1, 32):
        sl(5, runtime.grid(n, 16), (n, n), x, y)
    # 32 binds (Triton's path), 48 and 64 reuse it; 17 binds, 33 reuses; 1 binds; 32 reuses
    assert [c[1][2] for c in triton_calls] == [32, 17, 1] and len(sl.bound) == 3, sl.rule
    assert sl.rule.startswith("bound")
    assert [b[:4] for b in bound] == [(3, 1, 1, 5), (4, 1, 1, 5), (3, 1, 1, 5), (2, 1, 1, 5)]
    head = ("fn", False, False, None, None, "md", None, None, None)
    assert all(b[4:13] == head for b in bound)
    assert [b[13:] for b in bound] == [(x, y, n, n, 16) for n in (48, 64, 33, 32)]
    sl(None, runtime.grid(40, 16), (40, 40), x, y)  # misaligned: Triton's path, nothing bound
    assert len(triton_calls) == 4 and len(bound) == 4
    Run36.refuse = True
    sl(5, runtime.grid(48, 16), (48, 48), x, y)
    assert not sl.bound and not sl.bind and sl.rule.startswith("not bound: this Triton's launcher refused")
    assert len(triton_calls) == 5 and triton_calls[-1][1][2] == 48


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pow_small_integer_exponents_are_products(dtype: torch.dtype) -> None:
    """x ** n for a constant integer |n| <= 4 is lowered as products (GELU's x ** 3),
    so the kernel has no pow; other exponents still do.  Zeros of both signs,
    infinities and NaN give eager's values."""
    x = torch.cat([torch.randn(500) * 3, torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"),
                                                       float("nan")])]).to(dtype)
    for n in (-4, -3, -2, 0, 3, 4, 2.5, 5):
        compiled = check(lambda x: torch.pow(x, n), [x])
        assert any(op.name == "pow" for k in specs(compiled) for op in ops(k)) == (n in (2.5, 5)), n


# ---- a bfloat16's truth ----------------------------------------------------------------------------


_TRUTH_OPS = {
    "logical_and": lambda x: torch.logical_and(x, x),
    "logical_or": lambda x: torch.logical_or(x, x.flip(0)),
    "logical_not": lambda x: torch.logical_not(x),
    "to_bool": lambda x: x.to(torch.bool),
    "where_on_it": lambda x: torch.where(x.to(torch.bool), 1.0, 2.0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", sorted(_TRUTH_OPS))
def test_a_bfloat16_is_true_where_its_value_is_nonzero(device: str, op: str) -> None:
    """Whether a bfloat16 is nonzero is a comparison of its value, as float32: the
    interpreter compared it with 0 by its bits, so -0.0 was true there (a graph of
    logical_and(x, x) failed the hypothesis property on a rounded -0.0)."""
    x = torch.tensor([-0.0, 0.0, 1.0, -1.0, -2.5, 3.0, float("nan"), 1e-38], dtype=torch.bfloat16, device=device)
    compiled = compile_fn(_TRUTH_OPS[op], [x])
    (got,) = compiled(x)
    assert torch.equal(got, _TRUTH_OPS[op](x)), (got, _TRUTH_OPS[op](x))


@pytest.mark.parametrize("device", DEVICES)
def test_one_element_read_under_a_mask_loads_through_a_block_pointer(device: str) -> None:
    """A cat of an expanded one-element input reads that element under each half's
    mask: its pointer is one address, which Triton does not load through a block
    mask ("Mask argument cannot be block type if pointer argument is not a block";
    found by the combos property test, combos or not).  The pointer takes the mask's
    shape."""
    x = torch.randn(1, device=device).expand(1, 2, 1)

    def fn(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        neg = -a
        return neg.sum(), torch.cat([neg, neg], 1)

    compiled = check(fn, [x])
    assert "tl.zeros_like(" in compiled.source


def _relu_batch_norm_backward(dy, x, w, mean, rstd):
    """BatchNorm's input gradient behind a ReLU, on channels-last bfloat16, as
    torch decomposes it: the ReLU gradient is read by two per-channel sums (down
    its channels) and by the elementwise gradient."""
    g = torch.where(x > 0, dy, torch.zeros((), dtype=dy.dtype)).float()
    sub = x.float() - mean[None, :, None, None]
    s1, s2 = g.sum((0, 2, 3)), (g * sub).sum((0, 2, 3))
    n = x.numel() // x.shape[1]
    a, b = (s1 / n)[None, :, None, None], (s2 / n * rstd * rstd)[None, :, None, None]
    return ((g - sub * b - a) * (rstd * w)[None, :, None, None]).to(dy.dtype), s2 * rstd, s1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(4, 16, 6, 6), (8, 40, 9, 7), (8, 48, 48, 48)])
def test_a_pointwise_node_walks_a_column_reductions_order(device: str, shape: tuple[int, ...]) -> None:
    """The ReLU gradient, a buffer for its several readers, is read by the sums at
    [r0, x0, r1, r2]: realize gives it that inner order (channel first), so it runs
    inside the sums' kernel and writes its value from there: two kernels, not
    three, and eager's values.  The reference target keeps three.  At 8 x 48 x 48
    the sums split over many programs, each storing its share of the gradient."""
    cl = torch.channels_last
    inputs = [torch.randn(shape, device=device).to(memory_format=cl).bfloat16(),
              torch.randn(shape, device=device).to(memory_format=cl).bfloat16(),
              torch.randn(shape[1], device=device), torch.randn(shape[1], device=device) * 0.1,
              torch.rand(shape[1], device=device) + 0.5]
    compiled = check(_relu_batch_norm_backward, inputs, atol=3e-2, rtol=3e-2)
    relu = next(b for b in compiled.module.buffers if "where" in b.origins and not b.is_reduction)
    assert relu.inner_order == (1, 0, 2, 3)
    ks = specs(compiled)
    assert len(ks) == 2 and relu.name in [n.name for n in ks[0].nodes] and ks[0].space.columns
    from tests_helpers import run_until

    assert len(run_until(_relu_batch_norm_backward, [t.cpu() for t in inputs], "fuse").kernels) == 3
    # Options.inner_orders="off" (COIL_INNER_ORDERS=off): no order, three kernels on Triton too
    off = check(_relu_batch_norm_backward, inputs, atol=3e-2, rtol=3e-2, inner_orders="off")
    assert len(specs(off)) == 3 and not any(getattr(b, "inner_order", ()) for b in off.module.buffers)


def _bn_relu6_backward(dy, x, m, r, w, b):
    """MobileNetV2's backward through BatchNorm + ReLU6: the forward's output is
    recomputed from the convolution's (five reads: a buffer), the ReLU6 gradient
    reads it, and two per-channel sums read the gradient down its channels."""
    y = ((x.float() - m[None, :, None, None]) * r[None, :, None, None] * w[None, :, None, None]
         + b[None, :, None, None]).to(dy.dtype)
    g = torch.where((y <= 0) | (y >= 6), torch.zeros((), dtype=dy.dtype), dy).float()
    s1, s2 = g.sum((0, 2, 3)), (g * (x.float() - m[None, :, None, None])).sum((0, 2, 3))
    return (g - s1[None, :, None, None] * s2[None, :, None, None] * 1e-3).to(dy.dtype), s1, s2


@pytest.mark.parametrize("device", DEVICES)
def test_a_pointwise_node_read_whole_by_an_ordered_one_walks_its_order(device: str) -> None:
    """The recomputed BatchNorm output, read at its own index by the ordered ReLU6
    gradient, takes the same inner order, so both run inside the sums' kernel."""
    cl, shape = torch.channels_last, (4, 24, 6, 6)
    inputs = [torch.randn(shape, device=device).to(memory_format=cl).bfloat16(),
              (torch.randn(shape, device=device) * 4).to(memory_format=cl).bfloat16(),
              *(torch.rand(24, device=device) + 0.5 for _ in range(4))]
    compiled = check(_bn_relu6_backward, inputs, atol=2e-2, rtol=2e-2)
    ordered = [b.name for b in compiled.module.buffers if getattr(b, "inner_order", ())]
    ks = specs(compiled)
    assert len(ordered) == 2 and len(ks) == 2 and set(ordered) <= {n.name for n in ks[0].nodes}


def _softmax_backward_and_batch_sum(g, y):
    """T5's attention: the softmax gradient (a second pass over the rows of its own
    sum) is read whole by the next op and summed over the batch (the position
    bias's gradient), which reads it with its dims permuted."""
    d = y * (g - (g * y).sum(-1, keepdim=True))
    return d * 2, d.sum(0)


def test_a_reductions_second_pass_keeps_its_own_order() -> None:
    """The softmax gradient reads its row sum at its own leading dims: it is that
    sum's second pass, so the batch sum's permuted read gives it no inner order
    (ordered, it would leave the softmax's kernel), and it runs in the row kernel."""
    inputs = [torch.randn(2, 4, 8, 8), torch.softmax(torch.randn(2, 4, 8, 8), -1)]
    compiled = check(_softmax_backward_and_batch_sum, inputs, atol=1e-5, rtol=1e-5)
    assert not any(getattr(b, "inner_order", ()) for b in compiled.module.buffers)
    grad = next(b for b in compiled.module.buffers if b.rule == "reuse")
    rows, batch = specs(compiled)
    assert rows.space == Rows(64, 8, looped=False) and grad.name in [n.name for n in rows.nodes]
    assert batch.space.rnumel == 2 and grad.name not in [n.name for n in batch.nodes]
