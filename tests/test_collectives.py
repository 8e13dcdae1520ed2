"""Asynchronous collectives (torch.distributed._functional_collectives) in coil's IR.

One-process tests trace functional collectives under a gloo group of world size 1
and pin the printed IR: each collective is an Extern paired with its wait_tensor,
and what it touches stays alive (never freed, reused or taken in place) until the
wait.  Two-process tests (torch.multiprocessing) compile functions calling
collectives, DDP, tensor-parallel and FSDP2 training, and compare with eager on
both ranks: with gloo on the CPU (cpp and reference targets), and with NCCL on a
host of two GPUs or more (triton; marked cuda: `TRITON_INTERPRET=0 python3 -m
pytest -m cuda tests/test_collectives.py`)."""

from __future__ import annotations

import os
import re
import tempfile

import attrs
import pytest
import torch

import coil
from coil.ir.buffers import Collective, CollectiveRole, ExternBuffer
from coil.ir.printer import show
from coil.ir.verify import VerifyError, verify

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def world1():
    """A one-process gloo group: functional collectives trace and run (on itself)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    path = tempfile.mktemp(prefix="coil-pg-")
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


def _overlapped(group: str):
    def fn(x, w):
        y = x * 2 + 1
        a = c10d.all_reduce(y, "sum", group)
        z = x.sin() * w  # between the collective and its wait
        a = c10d.wait_tensor(a)
        g = c10d.all_gather_into_tensor(a + z, 1, group)
        g = c10d.wait_tensor(g)
        return g * 3, z

    return fn


def _trace(group: str, stage: str, **options):
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(4, 3), torch.randn(4, 3)
    fn = _overlapped(group)
    gm = make_fx(fn)(x, w)
    opts = coil.Options(**{"target": "cpp", "graph_cache": False, "verify": True, **options})
    return coil.default_pipeline().run(gm, [x, w], until=stage, options=opts), fn, gm, (x, w)


def test_buffer_graph_pairs_collectives_with_waits(world1):
    g, *_ = _trace(world1, "realize")
    lines = [ln.strip() for ln in show(g).splitlines() if "ExternBuffer" in ln]
    assert [re.sub(r"^(buf\d+): ExternBuffer (\S+)\(.*\)(.*)  origins=\[\w+\]  (.*)$", r"\1 \2 \4", ln) for ln in lines] == [
        "buf1 _c10d_functional.all_reduce.default collective waited_by=[buf3]",
        "buf3 _c10d_functional.wait_tensor.default wait completes=[buf1]",
        "buf5 _c10d_functional.all_gather_into_tensor.default collective waited_by=[buf6]",
        "buf6 _c10d_functional.wait_tensor.default wait completes=[buf5]",
    ]
    # the collectives stay whole, reading the realized tensors they send
    assert lines[0].startswith(f"buf1: ExternBuffer _c10d_functional.all_reduce.default(buf0, 'sum', '{world1}')")
    assert lines[2].startswith(f"buf5: ExternBuffer _c10d_functional.all_gather_into_tensor.default(buf4, 1, '{world1}')")


def _replace(g, name, **changes):
    return attrs.evolve(g, buffers=tuple(attrs.evolve(b, **changes) if b.name == name else b for b in g.buffers))


def test_verifier_rejects_broken_pairing(world1):
    g, *_ = _trace(world1, "realize")
    verify(g, "realize")
    with pytest.raises(VerifyError, match=r"buf1: B7 _c10d_functional.all_reduce.default is not marked"):
        verify(_replace(g, "buf1", collective=None), "realize")
    with pytest.raises(VerifyError, match=r"buf1: B7 paired with buf6, which is not a later wait naming it back"):
        verify(_replace(g, "buf1", collective=Collective(CollectiveRole.ISSUE, ("buf6",))), "realize")
    with pytest.raises(VerifyError, match=r"buf1: B7 paired with buf3, which is not a later wait naming it back"):
        verify(_replace(g, "buf3", collective=Collective(CollectiveRole.WAIT, ())), "realize")
    with pytest.raises(VerifyError, match=r"buf3: B7 marked wait but aten.mm.default is not a wait"):
        verify(_replace(g, "buf3", kernel="aten.mm.default"), "realize")


def _two_in_flight(group: str):
    """all_gather_into_tensor's input is read while it is in flight: before the fix its
    storage (and all_reduce's) went back to the pool at the issue, and the next kernel
    took it (`buf2 = buf0; del buf0  # reuse` with all_reduce still in flight)."""

    def fn(x, w):
        a1 = c10d.all_reduce(x * 2, "sum", group)
        a2 = c10d.all_gather_into_tensor(w + 1, 1, group)
        a1 = c10d.wait_tensor(a1)
        z = a1.sin()
        a2 = c10d.wait_tensor(a2)
        return a2 + z

    return fn


def _plan(group: str, **options):
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(4, 3), torch.randn(4, 3)
    gm = make_fx(_two_in_flight(group))(x, w)
    opts = coil.Options(**{"target": "cpp", "graph_cache": False, "verify": True, **options})
    return coil.default_pipeline().run(gm, [x, w], until="plan_memory", options=opts)


def _step_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().split(" ")[0] in ("step", "alloc", "reuse", "free", "in_flight")]


def test_memory_plan_holds_collective_buffers_until_the_wait(world1):
    p = _plan(world1, reorder_for_peak_memory=False, overlap_bytes_limit=0)
    assert _step_lines(show(p)) == [
        "step 0: cpp_fused_mul_0 pointwise group=(12, 1) nodes=[buf0]",
        "alloc buf0",
        "free x_1",
        "step 1: extern buf1",
        "in_flight buf0, buf1",
        "step 2: cpp_fused_add_1 pointwise group=(12, 1) nodes=[buf2]",
        "alloc buf2",  # not buf0's storage: all_reduce is in flight
        "in_flight buf0, buf1",
        "free w_1",
        "step 3: extern buf3",
        "in_flight buf0, buf1, buf2, buf3",
        "step 4: extern buf4",
        "in_flight buf2, buf3",
        "free buf0",  # all_reduce's input, after its wait
        "step 5: extern buf5",
        "free buf2",
        "step 6: cpp_fused_add_sin_2 pointwise group=(12, 1) nodes=[buf6]",
        "alloc buf6",
        # the collectives' results die with the last reader of their waits' results
        # (wait_tensor returns the tensor it waits on: the wait mutates it)
        "free buf1, buf3",
    ]


def test_peak_memory_orders_keep_collectives_in_program_order(world1):
    from coil.ir.memory import Order
    from coil.passes.plan_memory import _kahn, _lpmf, removed_buffers

    s = _plan(world1, overlap_bytes_limit=0).schedule
    orders = {"lpmf": _lpmf(s.steps, s, removed_buffers(s)), "bfs": _kahn(s.steps, s.graph, Order.BFS),
              "dfs": _kahn(s.steps, s.graph, Order.DFS)}
    for name, order in orders.items():  # unchained, DFS issued all_gather (buf3) first
        issues = [st.nodes[0] for st in order if st.nodes[0] in ("buf1", "buf3")]
        assert issues == ["buf1", "buf3"], name
    p = _plan(world1, reorder_for_peak_memory=True, overlap_bytes_limit=0)
    assert [ps.step.nodes[0] for ps in p.steps if ps.step.nodes[0] in ("buf1", "buf3")] == ["buf1", "buf3"]


def _evolve_step(p, i, **changes):
    steps = list(p.steps)
    steps[i] = attrs.evolve(steps[i], **changes)
    return attrs.evolve(p, steps=tuple(steps))


def test_verifier_rejects_freeing_or_reusing_in_flight_buffers(world1):
    p = _plan(world1, reorder_for_peak_memory=False, overlap_bytes_limit=0)
    verify(p, "plan_memory")
    freed_early = _evolve_step(_evolve_step(p, 4, frees=()), 1, frees=("buf0",))
    with pytest.raises(VerifyError, match=r"buf1: M3 buf0 is freed after step 1, while collective buf1 \(step 1\) "
                                          r"is in flight until its wait at step 4"):
        verify(freed_early, "plan_memory")
    reused = _evolve_step(p, 2, allocs=(), reuses=(("buf2", "buf0"),))
    with pytest.raises(VerifyError, match=r"buf1: M3 buf2 takes the storage of buf0 as a reuse at step 2, while "
                                          r"collective buf1 \(step 1\) is in flight"):
        verify(reused, "plan_memory")
    in_place = _evolve_step(p, 2, allocs=(), reuses=(("buf2", "buf0"),), inplace=("buf2",))
    with pytest.raises(VerifyError, match=r"M3 buf2 takes the storage of buf0 in place at step 2"):
        verify(in_place, "plan_memory")
    with pytest.raises(VerifyError, match=r"M4 step 2 says in_flight \[\], the collectives' spans say \['buf0', 'buf1'\]"):
        verify(_evolve_step(p, 2, in_flight=()), "plan_memory")


# ---- two processes -------------------------------------------------------------------

WORLD = 2


@pytest.fixture(scope="module", params=[pytest.param("cpu", id="gloo"),
                                        pytest.param("cuda", id="nccl", marks=pytest.mark.cuda)])
def two_ranks(request, tmp_path_factory):
    """Spawns the two ranks once for the module and device; each runs every case of
    tests/collectives_worker.py and reports through a JSON file.  "cpu": gloo, coil's
    cpp and reference targets; "cuda": NCCL, a GPU a rank, the triton target (a
    multi-GPU host only)."""
    import json
    import time

    import torch.multiprocessing as mp

    device = request.param
    if device == "cuda" and torch.cuda.device_count() < WORLD:
        pytest.skip(f"NCCL ranks take a GPU each: {WORLD} needed, {torch.cuda.device_count()} here")
    out = tmp_path_factory.mktemp(f"ranks_{device}")
    from collectives_worker import worker

    start = time.perf_counter()
    ctx = mp.start_processes(worker, args=(WORLD, str(out / "store"), str(out), device), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {device} ranks did not finish in 240 s")
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return results, time.perf_counter() - start


def _case(two_ranks, name):
    results, _ = two_ranks
    if name not in results[0]:
        pytest.skip(f"{name}: not a case of these ranks' device")
    for rank, r in enumerate(results):
        assert "error" not in r[name], f"rank {rank}: {r[name]['error']}"
    return [r[name] for r in results]


@pytest.mark.parametrize("target", ["cpp", "reference", "triton"])
@pytest.mark.parametrize("fn", ["api", "ops"])
def test_functional_collectives_match_eager_on_every_rank(two_ranks, fn, target):
    for rank, r in enumerate(_case(two_ranks, f"{fn}_{target}")):
        assert r["max_err"] <= 1e-5, (rank, r)
        assert r["eager"] == 0 and r["compiled"] == 1 and r["graph_breaks"] == 0, (rank, r)
        # the collectives ran inside coil's wrapper, not around it
        assert r["collectives_in_wrapper"] == (5 if fn == "api" else 3), (rank, r)


def test_ddp_training_matches_eager_ddp(two_ranks):
    for rank, r in enumerate(_case(two_ranks, "ddp")):
        assert r["moved"] > 1e-3, (rank, r)  # the steps did train
        assert r["max_err"] <= 1e-6, (rank, r)
        # DDPOptimizer split the one Dynamo graph at the 1 MiB bucket into two pieces, and
        # coil compiled each piece's forward and backward
        assert r["eager"] == 0 and r["graphs"] == 1 and r["compiled"] == 4, (rank, r)


def test_coalesced_collective_is_completed_by_a_wait_per_result(world1):
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x, y):
        a, b = c10d.all_reduce_coalesced([x + 1, y * 2], "sum", world1)
        return c10d.wait_tensor(a) * 2, c10d.wait_tensor(b).sum()

    x, y = torch.randn(4, 3), torch.randn(5)
    gm = make_fx(fn)(x, y)
    opts = coil.Options(target="cpp", graph_cache=False, verify=True)
    g = coil.default_pipeline().run(gm, [x, y], until="realize", options=opts)
    text = show(g)
    issue = next(b for b in g.buffers if isinstance(b, ExternBuffer) and b.kernel.endswith("all_reduce_coalesced.default"))
    waits = [b for b in g.buffers if isinstance(b, ExternBuffer) and b.kernel.endswith("wait_tensor.default")]
    assert issue.collective == Collective(CollectiveRole.ISSUE, tuple(w.name for w in waits)) and len(waits) == 2, text
    outs = [b.name for b in g.buffers if getattr(b, "extern", None) == issue.name]
    for w, out in zip(waits, outs):
        assert f"{w.name}: ExternBuffer _c10d_functional.wait_tensor.default({out})" in text
        assert w.collective == Collective(CollectiveRole.WAIT, (issue.name,)) and w.mutated == (out,)
    compiled = coil.compile_graph(gm, [x, y], options=opts.replace(sanitize=True))
    for got, want in zip(compiled(x, y), fn(x, y)):
        torch.testing.assert_close(got, want)


def test_tensor_parallel_mlp_matches_eager(two_ranks):
    """DTensor's Colwise/Rowwise MLP: its forward graph all-reduces the row-split
    Linear's partial sums; AOTAutograd hands coil DTensor's script objects as inputs,
    which pass through to the outputs (backends/dynamo.py compiles around them)."""
    for rank, r in enumerate(_case(two_ranks, "tp")):
        assert r["max_err"] <= 1e-6, (rank, r)
        assert r["eager"] == 0 and r["compiled"] == 2 and r["graph_breaks"] == 0, (rank, r)
        assert r["collectives_in_wrapper"] >= 1, (rank, r)


def test_fsdp2_per_layer_compile_matches_eager_fsdp2(two_ranks):
    """FSDP2 on the CPU with gloo, compiled per layer (torchtitan's order): its hooks
    are not traceable in this torch, so the collectives stay outside the graphs."""
    for rank, r in enumerate(_case(two_ranks, "fsdp2")):
        assert r["max_err"] <= 1e-6, (rank, r)
        assert r["eager"] == 0 and r["compiled"] == 4 and r["graph_breaks"] == 0, (rank, r)  # 2 layers, fwd + bwd


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_invariants_hold_on_drawn_graphs_with_collectives(world1, target):
    """Drawn graphs with collectives added (coil.properties.collectives): the
    pipeline's verifiers (B7, F2, M3, M4 among them) pass, the wrapper keeps the
    back half's invariants, and the sanitized compile matches eager."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from coil.properties import assert_matches_eager, check_all, graphs
    from coil.properties.collectives import with_collectives

    @settings(max_examples=15, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(st.data())
    def check(data):
        drawn = data.draw(with_collectives(graphs(max_nodes=6, dtypes=(torch.float32,)), world1))
        opts = coil.Options(target=target, verify=True, graph_cache=False, sanitize=True)
        program = coil.default_pipeline().run(drawn.gm, drawn.inputs, until="wrap", options=opts)
        check_all(program)
        waits = sum(1 for n in drawn.gm.graph.nodes if n.target is c10d.wait_tensor.default)
        assert waits == sum(1 for b in program.buffer_graph.buffers
                            if isinstance(b, ExternBuffer) and b.collective is not None and b.collective.role == "wait")
        compiled = coil.compile_graph(drawn.gm, list(drawn.inputs), opts)
        assert_matches_eager(drawn, compiled(*drawn.fresh_inputs()))

    check()


# ---- the overlap stage -----------------------------------------------------------------------


def _back_to_back(group: str):
    """Two all_reduces, each waited at once, with compute the waits could hide behind."""

    def fn(x, w):
        a1 = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", group))
        b = a1.cos()
        a2 = c10d.wait_tensor(c10d.all_reduce(w * 3, "sum", group))
        return b + 1, a2 + 1

    return fn


def _early_input(group: str):
    """The collective's input is ready long before the program issues it."""

    def fn(x, w):
        y = x * 2
        z = w.sin() @ w.t()
        a = c10d.wait_tensor(c10d.all_reduce(y, "sum", group))
        u = z.cos()
        return a + 1, u

    return fn


def _stage(fn, stage, **options):
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    gm = make_fx(fn)(x, w)
    opts = coil.Options(**{"target": "cpp", "graph_cache": False, "verify": True, **options})
    return coil.default_pipeline().run(gm, [x, w], until=stage, options=opts), gm, (x, w), opts


def _steps(s) -> list[str]:
    from coil.ir.printer_back import step_label

    return [step_label(st) for st in s.steps]


def test_overlap_issues_early_and_waits_late(world1):
    fused, *_ = _stage(_early_input(world1), "fuse")
    s, gm, inputs, opts = _stage(_early_input(world1), "overlap")
    assert _steps(fused) == [
        "cpp_fused_mul_0 pointwise group=(64, 1) nodes=[buf0]", "cpp_fused_sin_1 pointwise group=(64, 1) nodes=[buf1]",
        "nop buf2", "extern buf3", "extern buf4", "extern buf5", "cpp_fused_cos_2 pointwise group=(64, 1) nodes=[buf6]",
        "cpp_fused_add_3 pointwise group=(64, 1) nodes=[buf7]"]
    # the all_reduce (buf4) goes right after its input, before the sin and the mm; its
    # wait (buf5) after the cos, right before its reader
    assert _steps(s) == [
        "cpp_fused_mul_0 pointwise group=(64, 1) nodes=[buf0]", "extern buf4",
        "cpp_fused_sin_1 pointwise group=(64, 1) nodes=[buf1]", "nop buf2", "extern buf3",
        "cpp_fused_cos_2 pointwise group=(64, 1) nodes=[buf6]", "extern buf5",
        "cpp_fused_add_3 pointwise group=(64, 1) nodes=[buf7]"]
    assert [d.show() for d in s.overlap_log] == [
        "issue buf4: step 4 -> 1 (bound: its input buf0) in_flight_bytes=512",
        "wait buf5: step 5 -> 6 (bound: its first reader buf7) in_flight_bytes=512",
    ]
    compiled = coil.compile_graph(gm, list(inputs), options=opts.replace(sanitize=True))
    for got, want in zip(compiled(*inputs), _early_input(world1)(*inputs)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("limit, moved_to, bound, most", [
    (1 << 30, 4, "its first reader buf6", 1024),  # both all_reduces in flight at once
    (1, 3, "bytes in flight over 512", 512),  # held to one at a time (512: fuse's order already had it)
])
def test_overlap_holds_bytes_in_flight_under_the_limit(world1, limit, moved_to, bound, most):
    from coil.passes.overlap import most_in_flight

    s, gm, inputs, opts = _stage(_back_to_back(world1), "overlap", overlap_bytes_limit=limit)
    first_wait = next(d for d in s.overlap_log if d.node == "buf2")
    assert (first_wait.before, first_wait.after, first_wait.bound) == (2, moved_to, bound)
    assert most_in_flight(s.buffer_graph, s.steps) == most
    compiled = coil.compile_graph(gm, list(inputs), options=opts.replace(sanitize=True))
    for got, want in zip(compiled(*inputs), _back_to_back(world1)(*inputs)):
        torch.testing.assert_close(got, want)


def test_overlap_is_pure_and_verified(world1):
    fused, _, _, opts = _stage(_early_input(world1), "fuse")
    from coil.passes.overlap import overlap

    assert overlap(fused, opts) == overlap(fused, opts) and fused.overlap_log == ()
    moved = overlap(fused, opts)
    assert overlap(fused, opts.replace(overlap_bytes_limit=0)) is fused
    verify(moved, "overlap")
    s, *_ = _stage(_two_in_flight(world1), "overlap")
    first = next(st for st in s.steps if st.nodes == ("buf1",))
    steps = [st for st in s.steps if st is not first]
    steps.insert(next(k for k, st in enumerate(steps) if st.nodes == ("buf3",)) + 1, first)
    # all_reduce (buf1) issued after all_gather (buf3): still topological (F1), out of program order (F2)
    with pytest.raises(VerifyError, match=r"buf3: F2 collective buf3 is issued at step 2, before buf1 \(step 3\)"):
        verify(attrs.evolve(s, steps=tuple(steps)), "overlap")


def test_explain_shows_the_overlap_log(world1, tmp_path, capsys):
    from coil.__main__ import main

    src = tmp_path / "prog.py"
    src.write_text(
        "import torch\n"
        "c = torch.ops._c10d_functional\n"
        "def fn(x, w):\n"
        "    y = x * 2\n"
        "    z = w.sin() @ w.t()\n"
        f"    a = c.wait_tensor(c.all_reduce(y, 'sum', {world1!r}))\n"
        "    u = z.cos()\n"
        "    return a + 1, u\n"
        "example_inputs = (torch.randn(8, 8), torch.randn(8, 8))\n")
    assert main(["explain", f"{src}:fn", "--target", "cpp", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    section = out[out.index("communication overlap (overlap)"):]
    rows = [ln.split() for ln in section.splitlines()[1:6] if ln.startswith("buf")]
    assert rows == [["buf4", "issue", "4", "1", "its", "input", "buf0", "512"],
                    ["buf5", "wait", "5", "6", "its", "first", "reader", "buf7", "512"]], section
