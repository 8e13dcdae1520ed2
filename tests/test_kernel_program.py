"""schedule_kernels : MemoryPlan -> KernelProgram.  Golden text pins the decisions
for a handful of graphs (where each node runs, loops and their accumulators, the
online softmax, tiles, splits, columns, launches and why); the verifier rejects
hand-corrupted programs and says which kernel or node and which rule; and the
pass is pure and makes each target's decisions (launches, loop nests) only for the
targets whose traits ask for them."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs
import pytest
import torch
import torch.nn.functional as F

import coil
from coil.ir.expr import Load, Op, loads, walk
from coil.ir.kernel import (
    Accumulator,
    Body,
    Flat,
    Hoisted,
    KernelLaunch,
    KernelProgram,
    KernelSpec,
    LaunchRule,
    Loop,
    LoopNest,
    NestTile,
    Outer,
    Parallel,
    Rows,
    Split,
    Streams,
    Tiled,
    Update,
)
from coil.ir.printer import show
from coil.ir.verify import VerifyError, verify
from coil.options import ColumnTraits
from coil.passes.kernel_model import down_columns
from golden_util import assert_golden
from tests_helpers import run_until, target_available
from torch.fx.experimental.proxy_tensor import make_fx

from coil.passes.schedule.nest import loop_symbol


def program(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], target: str = "triton",
            **options: Any) -> KernelProgram:
    kp = run_until(fn, inputs, "schedule_kernels", target=target, **options)
    assert isinstance(kp, KernelProgram)
    return kp


def _softmax() -> KernelProgram:
    return program(lambda a: torch.softmax(a, -1), [torch.randn(4, 10000)])


def _layer_norm() -> KernelProgram:
    return program(lambda a, w, b: F.layer_norm(a, (10000,), w, b),
                   [torch.randn(4, 10000), torch.randn(10000), torch.randn(10000)])


def _column_sum() -> KernelProgram:
    return program(lambda a: a.sum(0), [torch.randn(600, 70)])


def _row_scaled_column_sum(target: str = "triton") -> KernelProgram:
    """(a * m).sum(0), m a per-row vector (the same for every column): down the
    columns on both targets (kernel_model.down_columns)."""
    return program(lambda a, m: (a * m).sum(0), [torch.randn(600, 70), torch.randn(600, 1)], target=target)


def _long_row() -> KernelProgram:
    return program(lambda a: a.sum(), [torch.randn(40000)])


def _transpose_add() -> KernelProgram:
    return program(lambda a, b: a + b.t(), [torch.randn(64, 96), torch.randn(96, 64)])


def _checked_gather() -> KernelProgram:
    """An index and a divisor checked at run time (on CPU tensors: both asserted)."""
    g = torch.Generator().manual_seed(0)
    return program(lambda x, i, d: x.gather(1, i) // d,
                   [torch.randint(-5, 5, (4, 6), generator=g), torch.randint(0, 6, (4, 2), generator=g),
                    torch.randint(1, 3, (4, 2), generator=g)])


def _ce(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(a, t)


def _ce_inputs() -> list[torch.Tensor]:
    return [torch.randn(16, 10000), torch.randint(0, 10000, (16,))]


def _cross_entropy() -> KernelProgram:
    return program(_ce, _ce_inputs())


GOLDEN: dict[str, Callable[[], KernelProgram]] = {
    "softmax": _softmax,
    "layer_norm": _layer_norm,
    "column_sum": _column_sum,
    "row_scaled_column_sum": _row_scaled_column_sum,
    "long_row_sum": _long_row,
    "transpose_add": _transpose_add,
    "cross_entropy": _cross_entropy,
    "checked_gather": _checked_gather,
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden(name: str) -> None:
    assert_golden(f"kernels_{name}.txt", show(GOLDEN[name]()))


def test_golden_softmax_on_cpp() -> None:
    """The C++ target's program: the same nodes and stages, no launches (OpenMP hands
    out the iterations of the loops the nest makes parallel), a loop nest, and no
    online softmax (it has no such trait)."""
    assert_golden("kernels_softmax_cpp.txt", show(program(lambda a: torch.softmax(a, -1), [torch.randn(4, 10000)],
                                                          target="cpp", persistent_reduction_threshold=1024)))


# the C++ target's loop nests (passes/schedule/nest.py, threads.py): each case's program as golden
# text, and the decisions it pins
CPP_GOLDEN: dict[str, Callable[[], KernelProgram]] = {
    "column_sum": lambda: program(lambda a: a.sum(0), [torch.randn(600, 70)], target="cpp"),
    "long_row_sum": lambda: program(lambda a: a.sum(), [torch.randn(40000)], target="cpp"),
    "transpose_add": lambda: program(lambda a, b: a + b.t(), [torch.randn(128, 320), torch.randn(320, 128)],
                                     target="cpp"),
    "nest_merge": lambda: program(lambda a: (a.permute(1, 0, 2, 3) * 2).contiguous(), [torch.randn(4, 8, 32, 64)],
                                  target="cpp"),
    "streamed_store": lambda: program(lambda a, b: a * 2 + b, [torch.randn(1100, 1001), torch.randn(1100, 1001)],
                                      target="cpp"),
    "row_division": lambda: program(lambda a: a / a.sum(-1, keepdim=True), [torch.randn(8, 300)], target="cpp"),
    "row_scaled_column_sum": lambda: _row_scaled_column_sum("cpp"),
}


@pytest.mark.parametrize("name", sorted(CPP_GOLDEN))
def test_golden_on_cpp(name: str) -> None:
    assert_golden(f"kernels_{name}_cpp.txt", show(CPP_GOLDEN[name]()))


def _loops(k: KernelSpec) -> LoopNest:
    """A spec's nest without its nodes (the golden text pins those)."""
    assert k.nest is not None and tuple(n.name for n in k.nest.nodes) == tuple(n.name for n in k.nodes)
    return attrs.evolve(k.nest, nodes=())


def test_cpp_column_sum_runs_columns_in_lanes() -> None:
    """x.sum(0): the innermost x loop walks memory, the r loop strides it: 64
    neighbouring columns run together, one vector lane each, and every x loop
    is shared among threads, the lanes' loop in blocks; each column's float sum
    runs in blocks of 64 rows (the power of two near 600 ** (2/3)), summed apart."""
    (k,) = CPP_GOLDEN["column_sum"]().specs
    assert k.space == Rows(70, 600, looped=True, columns=True, lanes=64)
    assert _loops(k) == LoopNest((70,), (600,), parallel=Parallel(1, 2, 1), rblock=64)
    (narrow,) = program(lambda a: a.sum(0), [torch.randn(600, 7)], target="cpp").specs
    assert narrow.space == Rows(7, 600, looped=True) and narrow.nest is not None and narrow.nest.parallel is None


def _down_columns(k: KernelSpec) -> bool:
    """A spec's answer to kernel_model.down_columns: Triton's rows or split over
    blocks of columns, the C++ target's columns in vector lanes."""
    space = k.space
    if isinstance(space, Rows):
        return space.columns and (k.nest is None or space.lanes > 0)
    return isinstance(space, Split) and space.columns


def _permuted_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """layer_norm over the channels of a channel-first (B, C, T) tensor: its reads
    walk memory along T, the kernel's x, while it stores along C, its rows."""
    h = x.permute(0, 2, 1) * 2
    return h, F.layer_norm(h, (x.shape[1],), w, b)


# (function, inputs, down the columns on triton, on cpp)
COLUMN_CASES: dict[str, tuple[Callable[..., torch.Tensor], list[torch.Tensor], bool, bool]] = {
    "column_sum": (lambda a: a.sum(0), [torch.randn(600, 70)], True, True),
    "row_sum": (lambda a: a.sum(1), [torch.randn(600, 70)], False, False),
    # a per-row vector, the same for every column, does not count against columns: m of
    # shape (rows, 1), and layer_norm's mean and rstd in its weight's gradient
    "row_scaled": (lambda a, m: (a * m).sum(0), [torch.randn(600, 70), torch.randn(600, 1)], True, True),
    "layer_norm_weight_grad": (lambda x, mu, rs, g: ((x - mu) * rs * g).sum(0),
                               [torch.randn(600, 70), torch.randn(600, 1), torch.randn(600, 1),
                                torch.randn(600, 70)], True, True),
    # a read along the row (a column-major operand) keeps the kernel on rows
    "column_major_operand": (lambda a, b: (a * b).sum(0), [torch.randn(600, 70), torch.randn(70, 600).t()],
                             False, False),
    # runs of 4 neighbouring columns: enough for Triton's flat xindex (ColumnTraits.run_min 1),
    # too few for the C++ target's lanes (8)
    "short_runs": (lambda a: a.sum(1), [torch.randn(40, 200, 4)], True, False),
    # stores along the row: the C++ target's lanes would scatter them (ColumnTraits.stores_count)
    "stores_along_rows": (_permuted_layer_norm, [torch.randn(2, 256, 16), torch.randn(256), torch.randn(256)],
                          True, False),
}


@pytest.mark.parametrize("name", sorted(COLUMN_CASES))
def test_one_column_rule_decides_on_both_targets(name: str) -> None:
    """kernel_model.down_columns, on Triton's flat xindex / rindex and on the C++
    target's innermost x and r loops, differing only in their ColumnTraits (run_min,
    stores_count)."""
    fn, inputs, triton, cpp = COLUMN_CASES[name]
    for target, want in (("triton", triton), ("cpp", cpp)):
        (k,) = program(fn, inputs, target=target).specs
        assert _down_columns(k) == want, (target, k.space)


def test_down_columns_rule() -> None:
    """The rule on (x-step, r-step) pairs of reads and stores, a run and the traits."""
    flat, lanes = ColumnTraits(), ColumnTraits(run_min=8, stores_count=True)
    for traits in (flat, lanes):
        assert down_columns([(1, 70)], [(1, 0)], 70, traits)  # x.sum(0)
        assert down_columns([(1, 70), (0, 1)], [], 70, traits)  # a per-row vector does not count
        assert not down_columns([(1, 70), (600, 1)], [], 70, traits)  # a read along the row does
        assert not down_columns([(0, 1), (70, 0)], [], 70, traits)  # nothing walks memory along x
        assert not down_columns([(1, 0)], [], 70, traits)  # nor strides it along r
    assert not down_columns([(1, 70)], [], 4, lanes) and down_columns([(1, 70)], [], 4, flat)  # a run of 4
    assert not down_columns([(1, 70)], [(70, 1)], 70, lanes) and down_columns([(1, 70)], [(70, 1)], 70, flat)


def test_cpp_long_row_splits_among_threads() -> None:
    """One row of 40000: its r loop dealt out to 64 threads, into partial results
    combined in order; the parts loop is the parallel one, and each part of 625
    runs in blocks of 256 (NestTraits.split_sum_block)."""
    (k,) = CPP_GOLDEN["long_row_sum"]().specs
    assert k.space == Split(1, 40000, 64, 625, 1, False, (), even=True)
    assert _loops(k) == LoopNest((1,), (40000,), parallel=Parallel(1, 64, 1), rblock=256)
    (short,) = program(lambda a: a.sum(-1), [torch.randn(4, 1000)], target="cpp").specs
    assert isinstance(short.space, Rows) and _loops(short) == LoopNest((4,), (1000,))


def test_cpp_transposed_read_runs_in_tiles() -> None:
    """a + b.t(): b's read walks memory along the outer loop, so both loops run in
    64x64 tiles with b's staged, the tile loops shared among threads."""
    (k,) = CPP_GOLDEN["transpose_add"]().specs
    assert isinstance(k.space, Flat) and k.nest is not None and k.nest.xsizes == (128, 320)
    tile = k.nest.tile
    assert isinstance(tile, NestTile) and (tile.u, tile.v, tile.side) == (0, 1, 64)
    assert [(r.buffer, r.stride) for r in tile.staged] == [("b_1", 128)]
    assert k.nest.parallel == Parallel(2, 2 * 5, 1)
    (plain,) = program(lambda a, b: a + b, [torch.randn(128, 320), torch.randn(128, 320)], target="cpp").specs
    assert plain.nest is not None and plain.nest.xsizes == (128 * 320,) and plain.nest.tile is None


def test_cpp_nest_merges_the_dims_every_index_walks_as_one() -> None:
    """A permuted copy: the two inner dims are contiguous in both the read and
    the write and merge into one loop; the permuted outer two stay apart, and as
    the loops outside the innermost they are shared among threads.  A long
    innermost loop with few iterations outside it runs in blocks."""
    (k,) = CPP_GOLDEN["nest_merge"]().specs
    assert _loops(k) == LoopNest((8, 4, 32 * 64), (), parallel=Parallel(2, 32, 1))
    (flat,) = program(lambda a: a * 2, [torch.randn(2, 20000)], target="cpp").specs
    assert _loops(flat) == LoopNest((40000,), (), block=4096, parallel=Parallel(1, 10, 1))


def _cpp_softmax(shape: tuple[int, int] = (4, 10000)) -> KernelProgram:
    return program(lambda a: torch.softmax(a, -1), [torch.randn(shape)], target="cpp",
                   persistent_reduction_threshold=1024)


def _hoisted(k: KernelSpec) -> dict[int, Hoisted]:
    return {h.level: h for h in k.hoisted}


def test_cpp_softmax_keeps_its_exp_in_a_row_scratch_array() -> None:
    """softmax's exp(x - max): the sum's loop stores it into a row-sized array that
    the output loop reads instead of computing it again; that loop reads the row
    sum once per row and multiplies by its reciprocal instead of dividing."""
    (k,) = _cpp_softmax().specs
    (a,) = k.scratch
    assert (a.slot, a.first, a.last) == (0, 1, 2) and isinstance(a.expr, Op) and a.expr.name == "exp"
    assert k.nest is not None and a.expr in walk(k.nest.nodes[1].body)  # buf1's, in the nest's loop variables
    out = _hoisted(k)[2]
    (div,) = out.reciprocals
    assert isinstance(div, Op) and div.name == "truediv"
    assert out.hoisted == (div.args[1],) and isinstance(div.args[1], Load) and div.args[1].name == "buf2"
    assert k.streams is None and _hoisted(k)[1].reciprocals == ()


def test_cpp_row_scratch_only_for_costly_values_within_its_budget() -> None:
    """Cheap recomputations (layer_norm's x - mean) stay recomputed, a gelu before
    it is kept; rows too long for the 64 KiB budget are recomputed; a chain of row
    reductions reuses one array, each loop writing where the last read."""
    def layer_norm(gelu: bool) -> KernelSpec:
        (k,) = program(lambda a: F.layer_norm(F.gelu(a) if gelu else a, (300,)), [torch.randn(8, 300)],
                       target="cpp").specs
        return k

    assert layer_norm(False).scratch == () and layer_norm(True).scratch != ()
    (long,) = _cpp_softmax((2, 20000)).specs
    assert long.scratch == ()

    def chain(y: torch.Tensor) -> torch.Tensor:
        for _ in range(6):
            y = y - y.amax(-1, keepdim=True) * 0.5
        return y

    (k,) = program(chain, [torch.randn(5, 3000)], target="cpp").specs
    # from the fifth loop on, the value of y costs enough to keep
    assert [(a.slot, a.first, a.last) for a in k.scratch] == [(0, 4, 5), (0, 5, 6)]


def test_cpp_division_by_a_row_value_takes_its_reciprocal() -> None:
    """x / x.sum(-1): the output loop reads the sum once per row and multiplies by
    its reciprocal; x / x.sum() over rows split among threads does too, and a
    division by what varies along the row stays a division."""
    (k,) = CPP_GOLDEN["row_division"]().specs
    (h,) = k.hoisted
    (div,) = h.reciprocals
    assert h.level == 1 and isinstance(div, Op) and div.name == "truediv" and h.hoisted == (div.args[1],)
    (whole,) = program(lambda a: a / a.sum(), [torch.randn(1000)], target="cpp").specs
    assert [len(h.reciprocals) for h in whole.hoisted] == [1]
    (pointwise,) = program(lambda a, b: (a / b).sum(-1), [torch.randn(8, 300), torch.randn(8, 300)],
                           target="cpp").specs
    assert not any(h.reciprocals for h in pointwise.hoisted)


def test_cpp_row_invariants_are_hoisted() -> None:
    """log_softmax's log of the row sum is computed once per row, before the
    output loop; a reduction down columns (its rows in vector lanes) hoists
    nothing, nor does the Triton target."""
    (k,) = program(lambda a: torch.log_softmax(a, -1), [torch.randn(7, 1029)], target="cpp").specs
    last = _hoisted(k)[max(_hoisted(k))]
    assert any(isinstance(e, Op) and e.name == "log" for r in last.hoisted for e in walk(r))
    (cols,) = CPP_GOLDEN["column_sum"]().specs
    assert cols.hoisted == () and cols.scratch == ()
    (tri,) = _softmax().specs
    assert (tri.hoisted, tri.scratch, tri.streams) == ((), (), None)


def test_cpp_streams_large_outputs_of_memory_bound_kernels() -> None:
    """A large output (4 MiB or more) of a memory-bound pointwise kernel, walked
    contiguously by the innermost loop, is streamed in chunks of 256 bytes (a
    tiled nest: a whole tile); compute-bound kernels and small outputs are not."""
    (k,) = CPP_GOLDEN["streamed_store"]().specs
    assert k.streams == Streams(("buf0",), 64)
    x, y = torch.randn(1100, 1001), torch.randn(1100, 1001)
    (half,) = program(lambda b: b * 3, [torch.randn(2100, 1100).bfloat16()], target="cpp").specs
    assert half.streams == Streams(("buf0",), 128)
    (tiled,) = program(lambda a, b: a + b.t(), [torch.randn(1030, 1030), torch.randn(1030, 1030)], target="cpp").specs
    assert tiled.nest is not None and tiled.nest.tile is not None and tiled.streams == Streams(("buf0",), 64 * 64)
    (costly,) = program(lambda a: a.exp() * a.sigmoid(), [x], target="cpp").specs
    (small,) = program(lambda a, b: a + b, [x[:100], y[:100]], target="cpp").specs
    assert costly.streams is None and small.streams is None


# ---- the decisions, read from the program ------------------------------------------------------


def test_online_softmax_runs_the_sum_in_its_maxs_loop() -> None:
    (k,) = _softmax().specs
    assert k.space == Rows(4, 10000, looped=True)
    loops = [st for st in k.stages if isinstance(st, Loop)]
    assert [st.level for st in loops] == [0, 1]
    mx, sm = loops[0].accumulators
    assert (mx.reduction_type, mx.update, sm.reduction_type, sm.update) == ("max", Update.ROW_MAX, "sum",
                                                                            Update.ONLINE_SUM)
    assert sm.partner == mx.node and mx.partner == sm.node
    # the division, with exp(x - max) inlined in it (recomputed: Triton's reuse rule
    # counts the row max as trivial, so exp(x - max) is no buffer)
    assert len(k.nodes) == 3 and loops[1].computes == (k.nodes[2].name,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_running_row_max_has_the_values_dtype(dtype: torch.dtype) -> None:
    """An online softmax keeps its running row max in its values' dtype, float32
    or float64 (half values would widen to float32; softmax's lowering widens them
    already); only the max's accumulator names a dtype."""
    (k,) = program(lambda a: torch.softmax(a, -1), [torch.randn(4, 10000, dtype=dtype)]).specs
    mx, sm = next(st for st in k.stages if isinstance(st, Loop)).accumulators
    assert k.node(mx.node).body.dtype == dtype and (mx.update, mx.dtype, sm.dtype) == (Update.ROW_MAX, dtype, None)
    from coil.passes.schedule.loops import row_max_dtype

    assert [row_max_dtype(dt) for dt in (torch.float16, torch.bfloat16)] == [torch.float32] * 2


def test_online_softmax_needs_the_trait() -> None:
    """Without the online_softmax trait, the sum of exp runs in a loop of its own,
    after its max's: three loops, each reading the row."""
    from coil.options import TARGET_TRAITS

    traits = attrs.evolve(TARGET_TRAITS["triton"], online_softmax=False)
    with pytest.MonkeyPatch.context() as m:
        m.setitem(TARGET_TRAITS, "triton", traits)
        (k,) = _softmax().specs
    loops = [st for st in k.stages if isinstance(st, Loop)]
    assert [st.level for st in loops] == [0, 1, 2]
    assert all(a.update is Update.LANES and not a.second_pass for st in loops for a in st.accumulators)


def test_layer_norm_reads_its_rows_twice_or_three_times() -> None:
    """On Triton, Welford's updates reduce the row in one loop and the normalization
    reads it again in a second; the C++ target's welford_m2 takes a second pass of
    its own (the mean, then the squared deviations), so the normalization runs in a
    third."""
    (k,) = _layer_norm().specs
    first, second = (st for st in k.stages if isinstance(st, Loop))
    assert {a.reduction_type for a in first.accumulators} == {"welford_m2", "sum"}
    assert not any(a.second_pass for a in first.accumulators) and not second.accumulators
    assert second.level == 1
    (c,) = program(lambda a, w, b: F.layer_norm(a, (10000,), w, b),
                   [torch.randn(4, 10000), torch.randn(10000), torch.randn(10000)], target="cpp").specs
    first, second = (st for st in c.stages if isinstance(st, Loop))
    assert [(a.reduction_type, a.second_pass) for a in first.accumulators] == [("welford_m2", True), ("sum", False)]
    assert second.level == 2


def test_split_and_column_decisions() -> None:
    (k,) = _long_row().specs
    assert isinstance(k.space, Split) and (k.space.parts, k.space.chunk, k.space.xblock) == (157, 256, 1)
    assert [ln.rule for ln in k.launches] == [LaunchRule.SPLIT, LaunchRule.COMBINE]
    assert [ln.grid for ln in k.launches] == [(157, 1, 1), (1, 1, 1)]
    (c,) = _column_sum().specs
    assert c.space == Rows(70, 600, looped=True, columns=True) and c.config_kind == "columns"
    assert c.launches[0].rule is LaunchRule.COLUMNS and c.launches[0].config.xblock == 32
    (tall,) = program(lambda a: a.sum(0), [torch.randn(3000, 40)]).specs
    assert isinstance(tall.space, Split) and tall.space.columns and tall.space.xblock == 32


def test_tiles_and_their_tails() -> None:
    (k,) = _transpose_add().specs
    assert k.space == Tiled(64, 96) and k.tails is not None and not k.tails.outer and k.tails.inner
    assert k.launches[0].config.yblock and k.launches[0].sizes == (64, 96)
    (plain,) = program(lambda a, b: a + b, [torch.randn(64, 96), torch.randn(64, 96)]).specs
    assert plain.space == Flat(64 * 96, 1) and plain.launches[0].rule is LaunchRule.POINTWISE


def _read_before_the_loop() -> KernelProgram:
    """y[:, 0].exp(), a per-row output computed before the loop, and a row sum
    whose body reads y[:, 0] too."""
    return program(lambda x, y: ((x + y[:, :1]).sum(-1), y[:, 0].exp()), [torch.randn(4, 10000), torch.randn(4, 3)])


def _first(k: KernelSpec) -> list[list[str]]:
    """The buffers each Body or Loop stage loads first, in order."""
    return [[ld.name for ld in st.loads] for st in k.stages if isinstance(st, (Body, Loop))]


def test_tiled_loads_along_the_store_come_first() -> None:
    """b.t() + a stores along xindex: a's load (along it) is issued before b's
    (across it), whatever the order in the graph; a flat kernel's in the order its
    bodies read them."""
    (k,) = program(lambda a, b: b.t() + a, [torch.randn(64, 96), torch.randn(96, 64)]).specs
    assert isinstance(k.space, Tiled) and _first(k) == [["b_1", "a_1"]]
    assert _first(_transpose_add().specs[0]) == [["a_1", "b_1"]]
    (flat,) = program(lambda a, b: b + a, [torch.randn(64, 96), torch.randn(64, 96)]).specs
    assert _first(flat) == [["b_1", "a_1"]]


def test_each_loop_loads_first_what_no_stage_before_it_loaded() -> None:
    """layer_norm: each loop issues its row's loads first, the second the weight and
    bias too; a per-row value an outer stage read before the loop is not loaded
    again in it; the C++ target's scopes issue none."""
    (k,) = _layer_norm().specs
    assert _first(k) == [["a_1"], ["a_1", "w_1", "b_1"]]
    (k,) = _read_before_the_loop().specs
    assert isinstance(k.stages[0], Outer) and _first(k) == [["x_1"]]
    assert all(f == [] for f in _first(_cpp_softmax().specs[0]))


def _split_with_running_mean() -> KernelProgram:
    """BatchNorm's statistics as a split down long columns, a running mean updated
    after them (read per column once the partials are combined)."""
    def stats(x: torch.Tensor, rm: torch.Tensor) -> Any:
        var, mean = torch.var_mean(x, dim=[0, 2, 3], correction=0)
        return rm * 0.9 + mean * 0.1, torch.rsqrt(var + 1e-5)

    x = torch.randn(8, 64, 56, 56).contiguous(memory_format=torch.channels_last)
    return program(stats, [x, torch.randn(64)])


def test_a_split_combine_loads_what_follows_it_first() -> None:
    """A split's Outer stage after its loop names the per-row loads its combine
    issues first (the running mean's); the combine's source loads them, then
    every partial result, before any arithmetic; a kernel that does not split
    gives its Outer stages none."""
    kp = _split_with_running_mean()
    (k,) = kp.specs
    assert isinstance(k.space, Split)
    after = [st for st in k.stages if isinstance(st, Outer) and st.level > 0]
    assert [[ld.name for ld in st.loads] for st in after] == [["rm_1"]]
    assert "; loads first rm_1[xindex]" in show(kp)
    from coil.backends.triton.split import split_source

    src = split_source(k).source
    combine = src[src.index("_combine("):]
    body = combine.splitlines()
    first_math = next(i for i, ln in enumerate(body) if "tl.sum" in ln)
    loads_at = [i for i, ln in enumerate(body) if "tl.load(" in ln]
    assert len(loads_at) == 5 and max(loads_at) < first_math  # rm and the four partials
    assert "in_ptr1 + xindex" in body[loads_at[0]]
    (plain,) = _layer_norm().specs
    assert all(not st.loads for st in plain.stages if isinstance(st, Outer))


def test_outer_loads_only_after_a_splits_loop() -> None:
    kp = _split_with_running_mean()
    (k,) = kp.specs
    i, st = next((i, st) for i, st in enumerate(k.stages) if isinstance(st, Outer) and st.level > 0)
    _reject(_with(kp, attrs.evolve(k, stages=(*k.stages[:i], attrs.evolve(st, loads=st.loads * 2),
                                              *k.stages[i + 1:]))),
            rf"{k.name}: K12 outer {st.level} issues first loads of \['rm_1', 'rm_1'\]")
    kp = _read_before_the_loop()
    (k,) = kp.specs
    outer = k.stages[0]
    assert isinstance(outer, Outer)
    per_row = tuple(ld for n in outer.nodes for ld in loads(k.node(n).body))
    names = ", ".join(repr(ld.name) for ld in per_row)
    _reject(_with(kp, attrs.evolve(k, stages=(attrs.evolve(outer, loads=per_row), *k.stages[1:]))),
            rf"{k.name}: K12 outer 0 issues first loads of \[{names}\]: only a split's stages after its loop")


def _conv_bn_conv(x: torch.Tensor, cw: torch.Tensor, m: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                  b: torch.Tensor) -> torch.Tensor:
    y = F.hardtanh(F.batch_norm(F.conv2d(x, cw, padding=1), m, v, w, b, training=False, eps=1e-3), 0, 6)
    return F.conv2d(y, cw, padding=1).sum((2, 3))


def _bn_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 8, 6, 6, generator=g), torch.randn(8, 8, 3, 3, generator=g) * 0.1,
            torch.randn(8, generator=g), torch.rand(8, generator=g) + 0.5, torch.randn(8, generator=g),
            torch.randn(8, generator=g)]


def test_a_channels_last_batch_norm_reads_its_scale_from_a_lane_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inference BatchNorm between convolutions on the C++ target: channels innermost,
    its 1 / sqrt(var + eps) varies by channel alone and costs a square root and a
    division, so the nest computes it once per call into a lane table (printed),
    and the kernel's source reads it there; the mean, weight and bias are plain
    loads (too cheap for a table).  The values are those computed in place."""
    import coil.options as options

    kp = program(_conv_bn_conv, _bn_inputs(), target="cpp")
    (k,) = [k for k in kp.specs if k.nest is not None and k.nest.tables]
    assert k.nest is not None and len(k.nest.tables) == 1
    (t,) = k.nest.tables
    assert {op.name for op in walk(t) if isinstance(op, Op)} >= {"sqrt", "reciprocal"}
    assert [ld.name for ld in loads(t)] == ["v_1"]
    assert "lane table 0: " in show(kp)
    if not target_available("cpp"):
        return
    inputs = _bn_inputs()
    gm = make_fx(_conv_bn_conv)(*inputs)
    with_tables = coil.compile_graph(gm, inputs, coil.Options(target="cpp", graph_cache=False))
    src = with_tables.module.source
    assert "alignas(64) float lane" in src and "* lane" in src
    monkeypatch.setitem(options.TARGET_TRAITS, "cpp", attrs.evolve(options.TARGET_TRAITS["cpp"], lane_tables=None))
    plain = coil.compile_graph(make_fx(_conv_bn_conv)(*inputs), inputs, coil.Options(target="cpp", graph_cache=False))
    assert "lane" not in plain.module.source
    assert torch.equal(with_tables(*inputs)[0], plain(*inputs)[0])
    torch.testing.assert_close(with_tables(*inputs)[0], _conv_bn_conv(*inputs), rtol=1e-4, atol=1e-4)


def test_a_lane_table_reading_an_outer_loop_is_rejected() -> None:
    kp = program(_conv_bn_conv, _bn_inputs(), target="cpp")
    (k,) = [k for k in kp.specs if k.nest is not None and k.nest.tables]
    assert k.nest is not None
    outer = next(e for n in k.nest.nodes for e in walk(n.body)
                 if isinstance(e, Load) and e.name not in {"v_1", "m_1", "w_1", "b_1"})
    bad = attrs.evolve(k, nest=attrs.evolve(k.nest, tables=(outer,)))
    _reject(_with(kp, bad), rf"{k.name}: K10 a lane table reading loop variables \['ix0', 'ix1'\]")
    foreign = Op("sqrt", (Load("v_1", (loop_symbol("ix", 0),), torch.float32),), torch.float32)
    _reject(_with(kp, attrs.evolve(k, nest=attrs.evolve(k.nest, tables=(foreign,)))),
            rf"{k.name}: K10 a lane table that is no subtree")


def test_device_asserts_by_device_and_target() -> None:
    """An interpreted kernel (CPU tensors) asserts its index and its divisor checks;
    a target whose checks are no device asserts (the C++ target) records none."""
    (k,) = _checked_gather().specs
    assert k.asserts == ("index", "divisor") and k.device == "cpu"
    (c,) = program(lambda x, i, d: x.gather(1, i) // d,
                   [torch.randint(-5, 5, (4, 6)), torch.randint(0, 6, (4, 2)), torch.randint(1, 3, (4, 2))],
                   target="cpp").specs
    assert c.asserts == ()
    (plain,) = _softmax().specs
    assert plain.asserts == ()


def test_chains_and_wide_rows_have_their_rules() -> None:
    def chain(y: torch.Tensor) -> torch.Tensor:
        for _ in range(8):
            y = y - y.amax(-1, keepdim=True) * 0.5
        return y

    (k,) = program(chain, [torch.randn(64, 1024)]).specs
    assert k.launches[0].rule is LaunchRule.CHAINED and k.launches[0].config.xblock == 1
    (odd,) = program(lambda a: a.sum(-1), [torch.randn(16, 16383)]).specs
    assert odd.launches[0].rule is LaunchRule.UNALIGNED and odd.launches[0].config.num_warps == 16


def test_other_targets_get_stages_but_no_launches() -> None:
    """The C++ target's rows always loop, persistent or not (its backend's r-loops
    are these stages), without online sums; no launch or tail is planned for it."""
    for target in ("cpp", "reference"):
        for cols in (10000, 40):
            (k,) = program(lambda a: torch.softmax(a, -1), [torch.randn(4, cols)], target=target).specs
            assert k.kind == ("reduction" if cols > 1024 else "persistent")
            assert k.space == Rows(4, cols, looped=True) and k.launches == () and k.tails is None
            assert [st.level for st in k.stages if isinstance(st, Loop)] == [0, 1, 2]
            assert not any(a.update is not Update.LANES for st in k.stages if isinstance(st, Loop)
                           for a in st.accumulators)


def test_the_pass_is_pure() -> None:
    """Equal inputs give equal programs (names and all), and the plan is kept whole."""
    a, b = _cross_entropy(), _cross_entropy()
    assert a == b and show(a) == show(b)
    assert a.plan == run_until(_ce, _ce_inputs(), "plan_memory", target="triton")


def test_the_wrapper_calls_with_the_specs_parameters() -> None:
    w = run_until(lambda a: torch.softmax(a, -1), [torch.randn(4, 10000)], "wrap", target="triton")
    (k,) = w.specs
    call = next(ln for ln in w.lines if getattr(ln, "kernel", None) == k.name)
    assert call.args == tuple(p.name for p in k.params)


# ---- the verifier ------------------------------------------------------------------------------


def _with(kp: KernelProgram, spec: KernelSpec) -> KernelProgram:
    return attrs.evolve(kp, specs=tuple(spec if s.name == spec.name else s for s in kp.specs))


def _reject(kp: KernelProgram, message: str) -> None:
    with pytest.raises(VerifyError, match=message):
        verify(kp, "schedule_kernels")


def test_the_verifier_accepts_what_the_pass_makes() -> None:
    for make in (*GOLDEN.values(), *CPP_GOLDEN.values()):
        verify(make(), "schedule_kernels")


def test_a_node_in_two_stages_or_none() -> None:
    kp = _softmax()
    (k,) = kp.specs
    assert not any(isinstance(st, Outer) for st in k.stages)  # softmax's per-row values all come from loops
    first = k.stages[0]
    assert isinstance(first, Loop)
    doubled = attrs.evolve(k, stages=(*k.stages, Outer(2, (first.nodes[0],))))
    _reject(_with(kp, doubled), rf"\[schedule_kernels\].*{first.nodes[0]}: K2 sits in stages 0 and 2 of {k.name}")
    dropped = attrs.evolve(k, stages=k.stages[:1])
    missing = next(n.name for n in k.nodes if n.name not in first.nodes)
    _reject(_with(kp, dropped), rf"{missing}: K2 sits in no stage of {k.name}")


def test_a_node_before_what_it_reads() -> None:
    kp = _layer_norm()
    (k,) = kp.specs
    first, second = (st for st in k.stages if isinstance(st, Loop))
    last = k.nodes[-1]
    mean = next(d for d in last.deps if k.node(d).reduction_type)
    early = attrs.evolve(k, stages=(attrs.evolve(first, nodes=(*first.nodes, last.name),
                                                 computes=(*first.computes, last.name)),))
    _reject(_with(kp, early), rf"{last.name}: K3 reads {mean} in the loop that reduces it")
    swapped = attrs.evolve(k, stages=(second, first))
    _reject(_with(kp, swapped), rf"{last.name}: K3 reads \w+, which does not run before it")


def test_a_second_pass_only_for_welford_and_read_after_it() -> None:
    kp = program(lambda a, w, b: F.layer_norm(a, (10000,), w, b),
                 [torch.randn(4, 10000), torch.randn(10000), torch.randn(10000)], target="cpp")
    (k,) = kp.specs
    first, second = (st for st in k.stages if isinstance(st, Loop))
    welford, mean = first.accumulators
    early = attrs.evolve(k, stages=(first, attrs.evolve(second, level=1)))
    _reject(_with(kp, early), rf"{second.nodes[0]}: K3 reads {welford.node} in the loop that reduces it")
    twice = attrs.evolve(first, accumulators=(welford, attrs.evolve(mean, second_pass=True)))
    _reject(_with(kp, attrs.evolve(k, stages=(twice, second))),
            rf"{mean.node}: K6 a second pass over the row for a sum accumulator")


def test_a_stored_node_that_is_no_parameter() -> None:
    kp = _softmax()
    (k,) = kp.specs
    node = k.nodes[0]
    assert node.store is None
    stored = attrs.evolve(k, nodes=(attrs.evolve(node, store=k.nodes[-1].store), *k.nodes[1:]))
    _reject(_with(kp, stored), rf"{node.name}: K5 stored, but not a parameter {k.name} writes")


def test_a_loop_computes_nodes_of_later_loops() -> None:
    """K4: the softmax's first loop may compute its own nodes, never the output
    that belongs to the second (it needs the finished row max and sum)."""
    kp = _softmax()
    (k,) = kp.specs
    first, second = k.stages
    assert isinstance(first, Loop) and isinstance(second, Loop)
    late = second.computes[-1]
    early = attrs.evolve(k, stages=(attrs.evolve(first, computes=(*first.computes, late)), second))
    _reject(_with(kp, early), rf"{late}: K4 computed in loop 0 of {k.name}, but not a node of it or an earlier loop")


def test_accumulators_match_the_reductions() -> None:
    kp = _softmax()
    (k,) = kp.specs
    loop = k.stages[0]
    assert isinstance(loop, Loop)
    mx, sm = loop.accumulators
    missing = attrs.evolve(k, stages=(attrs.evolve(loop, accumulators=(mx,)), *k.stages[1:]))
    _reject(_with(kp, missing), rf"{k.name}: K6 loop 0 accumulates \['{mx.node}'\], its reductions are")
    lonely = attrs.evolve(k, stages=(attrs.evolve(loop, accumulators=(Accumulator(mx.node, "max", Update.LANES), sm)),
                                     *k.stages[1:]))
    _reject(_with(kp, lonely), rf"{sm.node}: K6 an online sum whose partner {mx.node} keeps no row max in its loop")
    for bad in (attrs.evolve(mx, dtype=None), attrs.evolve(mx, dtype=torch.int64), attrs.evolve(mx, dtype=torch.float16)):
        narrow = attrs.evolve(k, stages=(attrs.evolve(loop, accumulators=(bad, sm)), *k.stages[1:]))
        _reject(_with(kp, narrow), rf"{mx.node}: K6 a row_max accumulator kept in {bad.dtype} for torch.float32 values")
    typed = attrs.evolve(k, stages=(attrs.evolve(loop, accumulators=(mx, attrs.evolve(sm, dtype=torch.float32))),
                                    *k.stages[1:]))
    _reject(_with(kp, typed), rf"{sm.node}: K6 a online_sum accumulator kept in torch.float32")


def test_a_space_that_does_not_fit() -> None:
    kp = _softmax()
    (k,) = kp.specs
    _reject(_with(kp, attrs.evolve(k, space=Flat(4, 10000))),
            rf"{k.name}: K7 a reduction kernel of group \(4, 10000\) cannot run on that space")
    _reject(_with(kp, attrs.evolve(k, space=Rows(4, 10000, looped=False))),
            rf"{k.name}: K7 a reduction kernel of group \(4, 10000\) cannot run on that space")


def test_a_launch_with_an_empty_grid() -> None:
    kp = _transpose_add()
    (k,) = kp.specs
    (ln,) = k.launches
    empty = attrs.evolve(k, launches=(attrs.evolve(ln, grid=(0, 1, 1)),))
    _reject(_with(kp, empty), rf"{k.name}: K8 launch of {k.name}: grid \(0, 1, 1\)")
    odd = attrs.evolve(k, launches=(attrs.evolve(ln, config=attrs.evolve(ln.config, xblock=48)),))
    _reject(_with(kp, odd), rf"{k.name}: K8 launch of {k.name}: grid")
    twice = attrs.evolve(k, launches=(ln, KernelLaunch(ln.function, ln.grid, ln.sizes, ln.config, ln.rule, ln.why)))
    _reject(_with(kp, twice), rf"{k.name}: K8 2 launches for its space")


def test_a_loop_nest_that_does_not_fit() -> None:
    kp = CPP_GOLDEN["nest_merge"]()
    (k,) = kp.specs
    assert k.nest is not None
    short = attrs.evolve(k, nest=attrs.evolve(k.nest, xsizes=(8, 4, 64)))
    _reject(_with(kp, short), rf"{k.name}: K9 loop nest \[8, 4, 64\] x \[\] does not cover group \(65536, 1\)")
    par = attrs.evolve(k, nest=attrs.evolve(k.nest, parallel=Parallel(2, 32, 0)))
    _reject(_with(kp, par), rf"{k.name}: K9 2 parallel loop\(s\) of 32 iterations in chunks of 0")
    tiled = attrs.evolve(k, nest=attrs.evolve(k.nest, tile=NestTile(1, 2, 64, ())))
    _reject(_with(kp, tiled), rf"{k.name}: K9 tiles of x loops 1 and 2, 64 a side, do not fit the nest")
    nodeless = attrs.evolve(k, nest=attrs.evolve(k.nest, nodes=()))
    _reject(_with(kp, nodeless), rf"{k.name}: K9 loop nest's nodes \[\] are not the kernel's")


def test_lanes_and_even_splits_need_their_nest() -> None:
    kp = CPP_GOLDEN["column_sum"]()
    (k,) = kp.specs
    assert isinstance(k.space, Rows)
    wide = attrs.evolve(k, space=attrs.evolve(k.space, lanes=128))
    _reject(_with(kp, wide), rf"{k.name}: K9 128 lanes, more than the innermost x loop's 70 columns")
    _reject(_with(kp, attrs.evolve(k, nest=None)), rf"{k.name}: K9 lanes without a loop nest")
    kp = CPP_GOLDEN["long_row_sum"]()
    (k,) = kp.specs
    assert isinstance(k.space, Split)
    uneven = attrs.evolve(k, space=attrs.evolve(k.space, chunk=640))
    _reject(_with(kp, uneven), rf"{k.name}: K9 an even split into 64 parts of 640 does not fit the outer r loop")
    _reject(_with(kp, attrs.evolve(k, nest=None)), rf"{k.name}: K9 an even split without a loop nest")


def test_streams_that_are_no_stored_buffer() -> None:
    kp = CPP_GOLDEN["streamed_store"]()
    (k,) = kp.specs
    assert k.streams is not None
    _reject(_with(kp, attrs.evolve(k, streams=Streams(("a_1",), 64))),
            rf"a_1: K10 streamed, but not a buffer {k.name} stores")
    _reject(_with(kp, attrs.evolve(k, streams=attrs.evolve(k.streams, chunk=0))),
            rf"{k.name}: K10 streams \['buf0'\] in chunks of 0")
    kp = _cpp_softmax()
    (k,) = kp.specs
    _reject(_with(kp, attrs.evolve(k, streams=Streams(("buf3",), 64))),
            rf"{k.name}: K10 streams \['buf3'\] in chunks of 64 in a nest with r loops \[10000\]")


def test_scratch_arrays_out_of_their_loops() -> None:
    kp = _cpp_softmax()
    (k,) = kp.specs
    (a,) = k.scratch
    backwards = attrs.evolve(k, scratch=(attrs.evolve(a, first=2, last=1),))
    _reject(_with(kp, backwards), rf"{k.name}: K10 scratch row0 stored in loop 2 and read up to loop 1: not loops")
    beyond = attrs.evolve(k, scratch=(attrs.evolve(a, last=3),))
    _reject(_with(kp, beyond), rf"{k.name}: K10 scratch row0 stored in loop 1 and read up to loop 3")
    early = attrs.evolve(k, scratch=(attrs.evolve(a, first=0),))
    _reject(_with(kp, early), rf"{k.name}: K10 scratch row0 holds a value loop 0 does not compute")
    assert k.nest is not None
    taken = attrs.evolve(k, scratch=(attrs.evolve(a, first=0, last=2, expr=k.nest.nodes[0].body), a))
    _reject(_with(kp, taken), rf"{k.name}: K10 scratch row0 stored in loop 1 while loop 2 still reads it")
    _reject(_with(kp, attrs.evolve(k, nest=None)), rf"{k.name}: K10 streams, scratch arrays or hoisted values without")


def test_hoisted_values_that_vary_along_the_row() -> None:
    kp = _cpp_softmax()
    (k,) = kp.specs
    out = _hoisted(k)[2]
    (div,) = out.reciprocals
    (a,) = k.scratch
    varying = attrs.evolve(out, hoisted=(*out.hoisted, a.expr))
    _reject(_with(kp, attrs.evolve(k, hoisted=(_hoisted(k)[1], varying))),
            rf"{k.name}: K10 loop 2 hoists a value that it does not compute or that varies along the row")
    misplaced = attrs.evolve(out, level=0)
    _reject(_with(kp, attrs.evolve(k, hoisted=(_hoisted(k)[1], misplaced))),
            rf"{k.name}: K10 loop 0 hoists a value that it does not compute")
    no_division = attrs.evolve(out, reciprocals=(div.args[1],))
    _reject(_with(kp, attrs.evolve(k, hoisted=(_hoisted(k)[1], no_division))),
            rf"{k.name}: K10 loop 2 multiplies by a reciprocal where it does not divide")
    nowhere = attrs.evolve(out, level=5)
    _reject(_with(kp, attrs.evolve(k, hoisted=(nowhere,))), rf"{k.name}: K10 values hoisted out of loop 5")


def test_specs_follow_the_plans_kernels() -> None:
    kp = _cross_entropy()
    _reject(attrs.evolve(kp, specs=kp.specs[::-1]), "K1 specs do not match the plan's kernels")


def test_loads_first_that_do_not_fit() -> None:
    kp = _transpose_add()
    (k,) = kp.specs
    (body,) = k.stages
    assert isinstance(body, Body)
    for wrong in (body.loads[:1], body.loads * 2):
        _reject(_with(kp, attrs.evolve(k, stages=(attrs.evolve(body, loads=wrong),))),
                rf"{k.name}: K12 the body issues first loads of \[{', '.join(repr(ld.name) for ld in wrong)}\], not each once")
    kp = _layer_norm()
    (k,) = kp.specs
    first, second = k.stages[0], k.stages[-1]
    assert isinstance(first, Loop) and isinstance(second, Loop)
    _reject(_with(kp, attrs.evolve(k, stages=(attrs.evolve(first, loads=second.loads), *k.stages[1:]))),
            rf"{k.name}: K12 the loop 0 issues first loads of \['a_1', 'w_1', 'b_1'\]")
    kp = _read_before_the_loop()
    (k,) = kp.specs
    outer, loop, *rest = k.stages
    assert isinstance(outer, Outer) and isinstance(loop, Loop)
    again = tuple(ld for n in loop.computes for ld in loads(k.node(n).body) if ld.name == "y_1")
    _reject(_with(kp, attrs.evolve(k, stages=(outer, attrs.evolve(loop, loads=loop.loads + again), *rest))),
            rf"{k.name}: K12 the loop 0 issues first loads of \['x_1', 'y_1'\]")


def test_a_split_fixes_its_launches() -> None:
    """A split's two launches are neither autotuned nor compiled ahead; a kernel's
    one launch is both."""
    kp = _long_row()
    (k,) = kp.specs
    assert len(k.launches) == 2 and all(ln.fixed for ln in k.launches)
    assert not any(ln.fixed for s in _softmax().specs for ln in s.launches)
    _reject(_with(kp, attrs.evolve(k, launches=(attrs.evolve(k.launches[0], fixed=""), k.launches[1]))),
            rf"{k.name}: K15 2 launches, not all of them fixed")


def _split_prelude() -> KernelProgram:
    """y.exp(), an output, computed before the split loop that reads it."""

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m = y.exp()
        return (x * m).sum(), m

    return program(fn, [torch.randn(40000), torch.randn(())])


def test_a_split_computes_its_prelude_before_its_loop() -> None:
    """Each partial program computes the per-row nodes of outer stage 0 before its
    loop: y.exp(), which the loop reads; without it the verifier rejects it."""
    kp = _split_prelude()
    (k,) = kp.specs
    assert isinstance(k.space, Split) and k.space.prelude == ("buf0",) and isinstance(k.stages[0], Outer)
    assert isinstance(_long_row().specs[0].space, Split) and _long_row().specs[0].space.prelude == ()
    _reject(_with(kp, attrs.evolve(k, space=attrs.evolve(k.space, prelude=()))),
            rf"{k.name}: K14 prelude \[\]: not in order nodes of outer stage 0 \['buf0'\] with those its loop reads")
    _reject(_with(kp, attrs.evolve(k, space=attrs.evolve(k.space, prelude=("buf0", "buf1")))), rf"{k.name}: K14 prelude")


def test_reads_that_do_not_fit() -> None:
    """Each load from memory once, with the tails of what it uses: a read dropped,
    named twice or masked by other tails is rejected; the C++ target records none."""
    kp = _checked_gather()
    (k,) = kp.specs
    assert [(r.load.name, r.tails) for r in k.reads] == [("i_1", "x"), ("x_1", "x"), ("d_1", "x")]
    _reject(_with(kp, attrs.evolve(k, reads=k.reads[1:])), rf"{k.name}: K13 reads of \['x_1', 'd_1'\] are not")
    _reject(_with(kp, attrs.evolve(k, reads=k.reads + k.reads[:1])), rf"{k.name}: K13 reads of")
    _reject(_with(kp, attrs.evolve(k, reads=(attrs.evolve(k.reads[0], tails="xr"), *k.reads[1:]))),
            rf"{k.name}: K13 a read of i_1 at .* masked by tails 'xr'")
    _reject(_with(kp, attrs.evolve(k, reads=(*k.reads[:1], attrs.evolve(k.reads[1], tails="rx"), *k.reads[2:]))),
            rf"{k.name}: K13 a read of x_1 at .* masked by tails 'rx'")
    (c,) = program(lambda a: a * 2, [torch.randn(8)], target="cpp").specs
    assert c.reads == ()


def test_asserts_that_do_not_fit() -> None:
    kp = _checked_gather()
    (k,) = kp.specs
    _reject(_with(kp, attrs.evolve(k, device="cuda:0")),
            rf"{k.name}: K11 asserts \['index', 'divisor'\] on cuda:0, its bodies check \['divisor', 'index'\]")
    _reject(_with(kp, attrs.evolve(k, asserts=("divisor", "index"))), rf"{k.name}: K11 asserts \['divisor', 'index'\]")
    kp = _softmax()
    (k,) = kp.specs
    _reject(_with(kp, attrs.evolve(k, asserts=("index",))), rf"{k.name}: K11 asserts \['index'\] on cpu, its bodies check \[\]")


@pytest.mark.parametrize("target", ["triton", "cpp"])
def test_comparisons_the_ranges_decide_are_folded(target: str) -> None:
    """A depthwise 3x3 stencil over a zero-padded 6x5 image: of each tap's window
    tests (row and column at least 1, below 7 and 6 in the padded image) only those
    that can fail over the output's ranges stay, so the kernel computes 4 distinct
    comparisons, not 16, and the centre tap loads unmasked; the output is eager's."""
    def taps(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xp = F.pad(x, (1, 1, 1, 1))
        out = torch.zeros_like(x)
        for i in range(3):
            for j in range(3):
                out = out + xp[:, :, i:i + 6, j:j + 5] * w[:, 0, i, j].view(1, -1, 1, 1)
        return out

    x, w = torch.randn(2, 3, 6, 5), torch.randn(3, 1, 3, 3)
    kp = program(taps, [x, w], target=target)
    (node,) = [n for k in kp.specs for n in k.nodes]
    compares = {e for e in walk(node.body) if isinstance(e, Op) and e.name in ("lt", "le", "gt", "ge")}
    assert len(compares) == 4, compares
    masks = [ld.mask for ld in loads(node.body)]
    assert len(masks) == 18 and sum(m is None for m in masks) == 1 + 9  # the centre tap's load of x, the weights
    got = coil.compile_graph(make_fx(taps)(x, w), [x, w], coil.Options(target=target, graph_cache=False))(x, w)
    torch.testing.assert_close(got[0], taps(x, w))
