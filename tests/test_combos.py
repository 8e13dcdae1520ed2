"""Combo launches (passes/combine.py): neighbouring independent static pointwise
kernels launched as one Triton kernel, each program running one member's.

A compiled SGD step over 48 parameters launched 48 kernels on the H100 (0.485 ms
against Inductor's 0.379, whose foreach kernels update many parameters a launch);
with combos it launches 3 (0.54 ms against Inductor's 0.76 in session 37).
Options.combo_launches, on by default, turns them off.  Triton runs through the interpreter here,
so these tests judge the decisions, the sources and the values; the `cuda` ones
judge compiled kernels on a GPU."""

from __future__ import annotations

import os
import re

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.ir.invariants import InvariantError, check_all, check_combos
from coil.ir.kernel import Combo
from coil.ir.printer import show
from coil.ir.wrapper import KernelCall, WrapperProgram
from coil.passes.combine import _combined, combinable, combo_spec, conflicts, storage_roots
from coil.properties import DrawnGraph, assert_matches_eager, graphs
from test_optimizers import OPTIMIZERS, _steps_match
from tests_helpers import target_available

pytestmark = pytest.mark.skipif(not target_available("triton"), reason="triton not available")
HAS_CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
COMBOS = coil.Options(target="triton", combo_launches=True, graph_cache=False)
# the small graphs below with their inputs donated (as a backward's saved activations,
# freed after their last reader; not written over in place): a combo that allocates
# its members' outputs while such an input is still alive can raise the planned peak.
# An input the caller holds frees nothing, and every combo of graph outputs would fit
FREED = COMBOS.replace(donated_inputs=(0, 1, 2), inplace_buffers=False)


def _wrap(fn, inputs, options: coil.Options = FREED) -> WrapperProgram:
    program = coil.default_pipeline().run(make_fx(fn)(*inputs), inputs, until="wrap", options=options)
    assert isinstance(program, WrapperProgram)
    return program


def _three(a, b, c):
    return a * 2, b + 1, c.sin()


def _three_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(300, generator=g), torch.randn(50, 3, generator=g), torch.randn(4000, generator=g)]


def test_independent_kernels_launch_as_one_where_the_peak_allows() -> None:
    """mul and add run in one launch of 2 programs; sin's output would be allocated
    while the inputs freed after the combo are still alive, above the planned
    peak, so it keeps its own launch."""
    inputs = _three_inputs()
    w = _wrap(_three, inputs)
    text = show(w)
    assert text.splitlines()[1:7] == [
        "  buf0 = alloc float32[300] stride=[1] cpu",
        "  buf1 = alloc float32[50, 3] stride=[3, 1] cpu",
        "  triton_combo_0(a_1, b_1, buf0, buf1)  # combo: triton_poi_fused_mul_0 [0, 1), "
        "triton_poi_fused_add_1 [1, 2), num_warps=2",
        "  del a_1  # FreeLine",
        "  del b_1  # FreeLine",
        "  buf2 = alloc float32[4000] stride=[1] cpu",
    ], text
    assert "  triton_poi_fused_sin_2(c_1, buf2)" in text
    check_all(w)
    # inputs the caller holds: no free to wait for, all three launch as one
    held = _wrap(_three, inputs, COMBOS)
    assert [ln.kernel for ln in held.lines if isinstance(ln, KernelCall)] == ["triton_combo_0"], show(held)
    check_all(held)
    compiled = coil.compile_graph(make_fx(_three)(*inputs), inputs, FREED)
    for got, want in zip(compiled(*inputs), _three(*inputs)):
        torch.testing.assert_close(got, want)
    launches = re.findall(r"^\s+(\w+)\[", compiled.source, re.M)
    assert launches == ["triton_combo_0", "triton_poi_fused_sin_2"], compiled.source


def test_the_combo_kernel_calls_each_member_with_its_own_program() -> None:
    inputs = _three_inputs()
    compiled = coil.compile_graph(make_fx(_three)(*inputs), inputs, FREED)
    src = compiled.source
    combo = src[src.index("def triton_combo_0"):].split("\n\n")[0]
    assert combo.splitlines() == [
        "def triton_combo_0(in_ptr0, in_ptr1, out_ptr0, out_ptr1, programs, XBLOCK: tl.constexpr):",
        "    pid = tl.program_id(0)",
        "    if pid < 1:",
        "        triton_poi_fused_mul_0(in_ptr0, out_ptr0, 300, pid, 512)",
        "    else:",
        "        triton_poi_fused_add_1(in_ptr1, out_ptr1, 150, pid - 1, 256)",
    ]
    member = src[src.index("def triton_poi_fused_add_1"):].split("\n\n")[0].splitlines()
    assert member[:2] == ["def triton_poi_fused_add_1(in_ptr0, out_ptr0, xnumel, pid, XBLOCK: tl.constexpr):",
                          "    xoffset = pid * XBLOCK"]
    assert "triton_combo_0[(2,)](a_1, b_1, buf0, buf1, 2, XBLOCK=512, num_warps=2)" in src


def test_the_combo_is_compiled_ahead_and_its_members_are_not() -> None:
    """On CUDA, output_code.py compiles its launches when it loads (runtime.precompile):
    the combo's is one of them; its members are never launched alone."""
    from coil.backends.triton.codegen import precompile_specs

    specs = precompile_specs(_wrap(_three, _three_inputs()))
    assert specs == [
        "    (triton_combo_0, (torch.float32, torch.float32, torch.float32, torch.float32, 2,), "
        "{'XBLOCK': 512, 'num_warps': 2}, 'cpu'),",
        "    (triton_poi_fused_sin_2, (torch.float32, torch.float32, 4000,), {'XBLOCK': 1024, 'num_warps': 4}, 'cpu'),",
    ]


def test_combos_are_on_by_default_and_off_when_asked_under_autotuning_and_on_other_targets() -> None:
    inputs = _three_inputs()
    assert _wrap(_three, inputs, coil.Options(target="triton", graph_cache=False)).combos
    for options in (COMBOS.replace(combo_launches=False), COMBOS.replace(autotune=True),
                    COMBOS.replace(target="cpp"), COMBOS.replace(target="reference")):
        w = _wrap(_three, inputs, options)
        assert w.combos == () and "combo" not in show(w), options


def _chain(a, x, y):
    b = a * 2
    c = b + 1
    return b, c, x.cos(), y * 3


def _chain_inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(64, generator=g), torch.randn(64, generator=g), torch.randn(4096, generator=g)]


def test_a_kernel_reading_what_another_writes_is_not_its_partner() -> None:
    """One kernel an op: b = a * 2 and c = b + 1 may not run at once; b and cos(x)
    may, and do (y * 3's output, the largest, is allocated after the inputs
    freed after the combo: the plan's peak holds)."""
    inputs = _chain_inputs()
    w = _wrap(_chain, inputs, FREED.replace(max_fusion_size=1))
    kernels = [s.name for s in w.specs]
    assert kernels == ["triton_poi_fused_mul_0", "triton_poi_fused_add_1", "triton_poi_fused_cos_2",
                       "triton_poi_fused_mul_3"]
    (combo,) = w.combos
    assert isinstance(combo.space, Combo) and combo.space.members == ("triton_poi_fused_mul_0", "triton_poi_fused_cos_2")
    assert [ln.kernel for ln in w.lines if isinstance(ln, KernelCall)] == [
        "triton_combo_0", "triton_poi_fused_mul_3", "triton_poi_fused_add_1"]
    check_all(w)
    compiled = coil.compile_graph(make_fx(_chain)(*inputs), inputs, FREED.replace(max_fusion_size=1))
    assert re.findall(r"^\s+(\w+)\[", compiled.source, re.M) == [
        "triton_combo_0", "triton_poi_fused_mul_3", "triton_poi_fused_add_1"]
    for got, want in zip(compiled(*inputs), _chain(*inputs)):
        torch.testing.assert_close(got, want)


def test_the_verifier_refuses_a_combo_of_dependent_kernels() -> None:
    """Combining b = a * 2 with c = b + 1 by hand (as a pass that ignored the
    dependence would): check_combos names the buffer both touch."""
    w = _wrap(_chain, _chain_inputs(), COMBOS.replace(max_fusion_size=1, combo_launches=False))
    first, second = w.spec("triton_poi_fused_mul_0"), w.spec("triton_poi_fused_add_1")
    assert conflicts([first, second], storage_roots(w.lines)) == f"{second.name} touches buf0, which {first.name} writes"
    at = [i for i, ln in enumerate(w.lines) if isinstance(ln, KernelCall) and ln.kernel in (first.name, second.name)]
    spec = combo_spec("triton_combo_0", [first, second])
    lines = _combined(w.lines, at, KernelCall(spec.name, tuple(p.name for p in spec.params)))
    bad = attrs.evolve(w, lines=tuple(lines), combos=(spec,))
    with pytest.raises(InvariantError, match="both touch buf0, which one of them writes"):
        check_combos(bad)
    # a member also launched on its own, and programs not laid end to end
    twice = attrs.evolve(w, combos=(combo_spec("triton_combo_0", [w.specs[2], w.specs[3]]),))
    with pytest.raises(InvariantError, match="called 0 times"):
        check_combos(twice)
    shifted = attrs.evolve(spec, space=attrs.evolve(spec.space, starts=(0, 5)))
    with pytest.raises(InvariantError, match="starts at program 5"):
        check_combos(attrs.evolve(bad, combos=(shifted,)))
    # a member whose kernel is chosen by call (here: symbolic sizes) cannot be one
    good = _wrap(_chain, _chain_inputs(), FREED.replace(max_fusion_size=1))
    check_combos(good)
    kp = good.kernel_program
    sized = attrs.evolve(kp, specs=tuple(attrs.evolve(k, symbols=("s0",)) if k.name == first.name else k
                                         for k in kp.specs))
    with pytest.raises(InvariantError, match="member triton_poi_fused_mul_0 chooses its kernel by call"):
        check_combos(attrs.evolve(good, kernel_program=sized))


def test_a_storage_reused_by_a_partner_counts_as_touched() -> None:
    """The storage a reuse hands on is its old owner's: a kernel writing bufB,
    which took bufA's storage, conflicts with one reading bufA."""
    w = _wrap(_chain, _chain_inputs(), COMBOS.replace(max_fusion_size=1, combo_launches=False))
    a, b = w.specs[1], w.specs[2]  # c = b + 1 reads buf0; cos(x) writes its own buffer
    out = next(p.name for p in b.params if p.role.value == "out")
    assert conflicts([a, b], {}) is None
    assert conflicts([a, b], {out: "buf0"}) == f"{b.name} writes buf0, which {a.name} touches"


def test_only_static_flat_pointwise_kernels_are_members() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 48, generator=g)
    w = _wrap(lambda a, b: (a.sum(1), b * 3), [x, x.clone()], COMBOS.replace(combo_launches=False))
    kinds = {s.name: combinable(s) for s in w.specs}
    assert sorted(kinds.values()) == [False, True], kinds
    # a.t() + b: a column-major output (walked in memory order) and b read across it: tiled
    transposed = _wrap(lambda a, b: (a.t() + b, b * 2), [x, torch.randn(48, 32, generator=g)],
                       COMBOS.replace(combo_launches=False))
    assert [combinable(s) for s in transposed.specs].count(False) >= 1  # the transposed add runs tiled
    # a.t() + b.t(): both reads and the (column-major) store run along memory: flat, a member
    same = _wrap(lambda a, b: (a.t() + b.t(), b * 2), [x, x.clone()], COMBOS.replace(combo_launches=False))
    assert all(combinable(s) for s in same.specs)


def test_explain_lists_the_combo_and_each_members_programs() -> None:
    from coil.backends.triton.codegen import launch_decisions

    rows = launch_decisions(_wrap(_three, _three_inputs()))
    assert rows[0][:3] == ("triton_combo_0", "combo", "(2,) XBLOCK=512, num_warps=2")
    assert rows[0][3].startswith("2 independent pointwise kernels in one launch")
    assert rows[1][:3] == ("triton_poi_fused_mul_0", "pointwise", "programs [0, 1) of triton_combo_0, XBLOCK=512")
    assert rows[2][:3] == ("triton_poi_fused_add_1", "pointwise", "programs [1, 2) of triton_combo_0, XBLOCK=256")


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw_foreach", "rmsprop"])
def test_a_compiled_optimizer_step_with_combos_matches_eager(name: str, tmp_path) -> None:
    """The per-parameter update kernels of a foreach step launch together (after
    the one kernel that counts every parameter's step, which they read), and the
    parameters and states match eager's."""
    _steps_match(OPTIMIZERS[name], "triton", steps=2,
                 extra={"combo_launches": True, "debug_dir": str(tmp_path)})
    sources = [p.read_text() for p in sorted(tmp_path.glob("*/output_code.py"))]
    assert any("triton_combo_0[(" in s for s in sources)
    steady = sources[-1]  # the step after the first: every parameter's state exists
    launches = re.findall(r"^\s+(\w+)\[", steady, re.M)
    assert launches[-1] == "triton_combo_0" and len(launches) <= 2, launches
    combo = steady[steady.index("def triton_combo_0"):].split("\n\n")[0]
    assert len(re.findall(r"^        triton_poi", combo, re.M)) >= 6  # the model's 6 parameters' updates, at least


@settings(max_examples=int(os.environ.get("COIL_PROPERTY_EXAMPLES", "25")), deadline=None, derandomize=True,
          database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                HealthCheck.data_too_large])
@given(graphs())
def test_drawn_graphs_with_combos_keep_the_invariants_and_match_eager(drawn: DrawnGraph) -> None:
    """Kernels of one op each, so that there are many to combine."""
    options = COMBOS.replace(max_fusion_size=1)
    program = coil.default_pipeline().run(drawn.gm, drawn.inputs, until="wrap", options=options)
    check_all(program)
    compiled = coil.compile_graph(drawn.gm, drawn.inputs, options)
    assert_matches_eager(drawn, compiled(*drawn.inputs))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["sgd_momentum", "adamw_foreach"])
def test_a_compiled_optimizer_step_with_combos_matches_eager_on_cuda(name: str) -> None:
    torch.manual_seed(0)
    params = [torch.randn(s, device="cuda", requires_grad=True) for s in [(128, 64), (64,), (3000,), (7, 5)]]
    ref = [p.detach().clone().requires_grad_() for p in params]
    for p, q in zip(params, ref):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    opt, opt_ref = OPTIMIZERS[name](params), OPTIMIZERS[name](ref)
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="coil", options={"combo_launches": True, "graph_cache": False})
    for _ in range(3):
        step()
        opt_ref.step()
    for p, q in zip(params, ref):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
