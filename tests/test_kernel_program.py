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
from coil.ir.kernel import (
    Accumulator,
    Flat,
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
    Tiled,
    Update,
)
from coil.ir.printer import show
from coil.ir.verify import VerifyError, verify
from golden_util import assert_golden
from tests_helpers import run_until


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


def _long_row() -> KernelProgram:
    return program(lambda a: a.sum(), [torch.randn(40000)])


def _transpose_add() -> KernelProgram:
    return program(lambda a, b: a + b.t(), [torch.randn(64, 96), torch.randn(96, 64)])


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
    "long_row_sum": _long_row,
    "transpose_add": _transpose_add,
    "cross_entropy": _cross_entropy,
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
    "nest_merge": lambda: program(lambda a: a.permute(1, 0, 2, 3) * 2, [torch.randn(4, 8, 32, 64)], target="cpp"),
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
    is shared among threads, the lanes' loop in blocks."""
    (k,) = CPP_GOLDEN["column_sum"]().specs
    assert k.space == Rows(70, 600, looped=True, columns=True, lanes=64)
    assert _loops(k) == LoopNest((70,), (600,), parallel=Parallel(1, 2, 1))
    (narrow,) = program(lambda a: a.sum(0), [torch.randn(600, 7)], target="cpp").specs
    assert narrow.space == Rows(7, 600, looped=True) and narrow.nest is not None and narrow.nest.parallel is None


def test_cpp_long_row_splits_among_threads() -> None:
    """One row of 40000: its r loop dealt out to 64 threads, into partial results
    combined in order; the parts loop is the parallel one."""
    (k,) = CPP_GOLDEN["long_row_sum"]().specs
    assert k.space == Split(1, 40000, 64, 625, 1, False, (), even=True)
    assert _loops(k) == LoopNest((1,), (40000,), parallel=Parallel(1, 64, 1))
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
    assert loops[1].computes == (k.nodes[1].name, k.nodes[3].name)  # exp(x - max) recomputed, then divided


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
    _reject(_with(kp, dropped), rf"{k.nodes[1].name}: K2 sits in no stage of {k.name}")


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


def test_specs_follow_the_plans_kernels() -> None:
    kp = _cross_entropy()
    _reject(attrs.evolve(kp, specs=kp.specs[::-1]), "K1 specs do not match the plan's kernels")
