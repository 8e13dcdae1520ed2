"""A run-time choice between a persistent and a looped kernel (issue 17): on a
target whose traits ask for it (Triton's multi_kernel), a looped reduction over a
symbolic row whose hint fits one tile but whose range does not also gets a
persistent variant (KernelSpec.choice) with launches at the hint's RBLOCK and, as
tiers, at each power of two up to the persistent limit, and each call launches
the first whose bound its row meets: `if s1 <= 16:` the persistent kernel at
RBLOCK 16, `elif s1 <= 32:` at 32, ... up to 8192, else the looped one.

Golden text pins the printed programs of a symbolic softmax and layer_norm; the
numeric tests compile once (torch.compile, dynamic=True, at a hint of 16) and
run rows below and above the bound, counting which kernel each call launched;
static graphs, other targets and rows the range or the hint decides get no choice;
the verifier rejects a corrupted choice."""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator, Sequence

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import coil
from coil.ir.kernel import Choice, KernelProgram, KernelSpec, LaunchRule, Rows
from coil.ir.printer import show
from coil.ir.verify import VerifyError, verify
from coil.options import TARGET_TRAITS, Options
from golden_util import assert_golden
from tests_helpers import capture_aot, compiled_counted, trace

HINT = 16  # the row length every symbolic graph here is compiled at: RBLOCK 16
LIMIT = 8192  # Triton's persistent limit: the last tier's RBLOCK
TIERS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
# (rows, row length) of the calls: rows up to LIMIT launch the persistent variant at the
# least RBLOCK that holds them (HINT's or a tier's), the others loop
CALLS = [(8, HINT), (4, 5000), (6, 10), (3, 17), (5, 2), (2, LIMIT + 7)]


def _rblock(s: int) -> int:
    """The RBLOCK of the persistent launch a row of s takes (0: the looped kernel)."""
    return 0 if s > LIMIT else max(HINT, 1 << (s - 1).bit_length())


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _chained(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Four chained row reductions (max, the online sum, (y * x).sum, x.sum), an
    inner node stored (the softmax) and an outer one (the sums' total)."""
    y = torch.softmax(x, -1)
    return y, (y * x).sum(-1) + x.sum(-1)


CASES: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[torch.Tensor, ...]]]] = {
    "softmax": (_softmax, lambda b, s: (torch.randn(b, s),)),
    "layer_norm": (_layer_norm, lambda b, s: (torch.randn(b, s), torch.randn(s), torch.randn(s))),
    "chained": (_chained, lambda b, s: (torch.randn(b, s),)),
}


def _symbolic(case: str, target: str = "triton", stage: str = "schedule_kernels",
              inputs: Sequence[torch.Tensor] | None = None) -> Any:
    fn, make = CASES[case]
    gm, example = capture_aot(fn, inputs if inputs is not None else make(8, HINT))
    return coil.default_pipeline().run(gm, example, until=stage, options=Options(target=target))


def _only(kp: KernelProgram) -> KernelSpec:
    (k,) = kp.specs
    return k


def _without_bodies(text: str) -> str:
    """The printed program without the nodes' body lines (t0: ..., return ...)."""
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(("t", "return ")))


# ---- the program: both variants, the bound and why ------------------------------------------------


@pytest.mark.parametrize("case", ["softmax", "layer_norm"])
def test_golden_symbolic_program_has_both_variants(case: str) -> None:
    kp = _symbolic(case)
    assert_golden(f"kernels_{case}_symbolic.txt", show(kp))
    k = _only(kp)
    c = k.choice
    assert c is not None and isinstance(k.space, Rows) and k.space.looped
    v = c.persistent
    assert k.name.startswith("triton_red_fused_") and v.name == "triton_per_fused_" + k.name[len("triton_red_fused_"):]
    assert isinstance(v.space, Rows) and not v.space.looped and v.nodes == k.nodes and v.params == k.params
    (ln,) = v.launches
    assert (c.rnumel, c.rblock, ln.config.rblock, ln.rule) == (k.group[1], LIMIT, HINT, LaunchRule.PERSISTENT)
    assert [t.config.rblock for t in c.tiers] == TIERS and c.bounds() == (HINT, *TIERS)
    assert all(t.function == v.name and t.rule is LaunchRule.PERSISTENT for t in c.tiers)
    # the tiers are configured as static rows of their RBLOCK are: fewer rows a program as rows grow
    assert [t.config.xblock for t in c.tiers] == [8, 8, 8, 8, 8, 4, 2, 1, 1]
    assert v.tails is not None and v.tails.inner and v.tails.outer  # rindex < rnumel; XBLOCK 8 of s0 rows
    assert k.tails is not None and not k.tails.outer  # the looped kernel's one row a program: no partial block
    text = show(kp)
    assert (f"    choice: {v.name} where s1 <= 8192, else {k.name}: rows of s1 in [2, oo], hint 16: the range "
            "exceeds the persistent limit 8192, the hint fits one tile; held whole where s1 <= 8192 "
            "(RBLOCK 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192), looped above") in text
    assert "    tiers:\n" in text
    assert f"      {v.name}: persistent group=(s0, s1) cpu" in text
    assert "        space: rows s0 x s1, persistent" in text


def test_wrapper_and_output_code_choose_once_a_call() -> None:
    w = _symbolic("softmax", stage="wrap")
    k = _only(w.kernel_program)
    assert k.choice is not None
    per, red = k.choice.persistent.name, k.name
    assert [ln for ln in show(w).splitlines() if "fused" in ln or "2147483648" in ln] == [
        "  if s0*s1 < 2147483648:",
        f"    if s1 <= 8192: {per}(arg2_1, buf2, s0, s1)", f"    else: {red}(arg2_1, buf2, s0, s1)",
        f"  else: {red}_i64 (or its persistent variant)(arg2_1, buf2, s0, s1)"]
    fn, make = CASES["softmax"]
    gm, example = capture_aot(fn, make(8, HINT))
    source = coil.compile_graph(gm, example, Options(target="triton")).source
    launch = source.index("        if s0*s1 < 2147483648:\n")
    lines = source[launch:].splitlines()[:46]
    assert lines[:5] == [
        "        if s0*s1 < 2147483648:",
        "            if s1 <= 16:",
        f"                {per}[grid(s0, 8)](arg2_1, buf2, s0, s1, s0, s1, XBLOCK=8, RBLOCK=16, num_warps=1)",
        "            elif s1 <= 32:",
        f"                {per}[grid(s0, 8)](arg2_1, buf2, s0, s1, s0, s1, XBLOCK=8, RBLOCK=32, num_warps=1)",
    ]
    assert lines[19:25] == [
        "            elif s1 <= 8192:",
        f"                {per}[grid(s0, 1)](arg2_1, buf2, s0, s1, s0, s1, XBLOCK=1, RBLOCK=8192, num_warps=8)",
        "            else:",
        f"                {red}[grid(s0, 1)](arg2_1, buf2, s0, s1, s0, s1, XBLOCK=1, RBLOCK=16, num_warps=1)",
        "        else:",
        "            if s1 <= 16:",
    ]
    assert lines[-2:] == [
        "            else:",
        f"                {red}_i64[grid(s0, 1)](arg2_1, buf2, s0, s1, s0, s1, XBLOCK=1, RBLOCK=16, num_warps=1)",
    ]
    kernel = source[source.index(f"def {per}("):]
    assert "    rindex = tl.arange(0, RBLOCK)[None, :]\n    rmask = rindex < rnumel\n" in kernel
    assert "for roffset in range" not in kernel.split("\n\n\n")[0]  # the variant holds its row in one tile
    wide = source[source.index(f"def {per}_i64("):]
    assert "    rindex = tl.arange(0, RBLOCK)[None, :].to(tl.int64)\n    rmask = rindex < rnumel\n" in wide
    assert source.count("@triton.jit\ndef triton_") == 4


# ---- both branches in one compiled graph, against eager ---------------------------------------------


class _Counted:
    """A Triton kernel whose launches (`kernel[grid](...)`) are counted by name and RBLOCK."""

    def __init__(self, kernel: Any, name: str, count: collections.Counter[tuple[str, int]]) -> None:
        self.kernel, self.name, self.count = kernel, name, count

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.count[self.name, kwargs["RBLOCK"]] += 1
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[tuple[str, int]]]:
    """Counts the launches of every kernel of the modules coil loads meanwhile."""
    from coil.backends import runtime

    count: collections.Counter[tuple[str, int]] = collections.Counter()
    load = runtime.load_module

    def counting(module: Any, directory: str | None = None, compile_subgraph: Any = None) -> Any:
        fn = load(module, directory, compile_subgraph)
        for k in module.kernels:
            fn.namespace[k.name] = _Counted(fn.namespace[k.name], k.name, count)
        return fn

    monkeypatch.setattr(runtime, "load_module", counting)
    yield count


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_graph_runs_both_variants_as_eager(case: str, launches: collections.Counter[tuple[str, int]]) -> None:
    fn, make = CASES[case]
    f = compiled_counted(fn, "triton", dynamic=True)
    for b, s in CALLS:
        args = make(b, s)
        torch.testing.assert_close(f(*args), fn(*args))
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["symbolic"] == 1
    assert counters["coil"]["eager"] == 0
    k = _only(_symbolic(case))
    assert k.choice is not None
    rblock = k.launches[0].config.rblock
    want = collections.Counter((k.choice.persistent.name, _rblock(s)) if _rblock(s) else (k.name, rblock)
                               for _, s in CALLS)
    assert launches == want and len(want) == 4  # the hint's RBLOCK, two tiers, the looped kernel


def test_a_graph_called_directly_runs_the_variant_its_row_fits() -> None:
    """coil.compile_graph's callable at rows of each bound and one past it: the
    hint's RBLOCK, the next tier's, the last tier's and the looped kernel."""
    fn, make = CASES["layer_norm"]
    gm, example = capture_aot(fn, make(8, HINT))
    compiled = coil.compile_graph(gm, example, Options(target="triton"))
    count: collections.Counter[tuple[str, int]] = collections.Counter()
    for k in compiled.module.kernels:
        compiled.namespace[k.name] = _Counted(compiled.namespace[k.name], k.name, count)
    spec = _only(compiled.module.kernel_program)
    assert spec.choice is not None
    per = spec.choice.persistent.name
    runs = ((HINT, (per, HINT)), (HINT + 1, (per, 2 * HINT)), (LIMIT, (per, LIMIT)), (LIMIT + 1, (spec.name, HINT)))
    for s, ran in runs:
        args = make(3, s)
        torch.testing.assert_close(compiled(3, s, *args)[0], fn(*args))
        assert count[ran] == 1, (s, count)
    assert sum(count.values()) == len(runs)


# ---- where there is no choice ------------------------------------------------------------------


def _source(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> str:
    return coil.compile_graph(gm, list(inputs), Options(target="triton", graph_cache=False)).source


def test_static_graphs_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static graphs have no choice: their sources are byte-identical with the
    trait off; a symbolic graph's are not (the trait is what makes the choice)."""
    from conftest import seed_fn

    static = [(_softmax, (torch.randn(8, HINT),)), (_softmax, (torch.randn(8, 10000),)),
              (_layer_norm, CASES["layer_norm"][1](8, 4096)), (_chained, (torch.randn(8, 300),)),
              (seed_fn, tuple(torch.randn(64, 128) for _ in range(3)))]
    graphs = [(trace(fn, *inputs), inputs) for fn, inputs in static] + [capture_aot(_softmax, (torch.randn(8, HINT),))]
    on = [_source(gm, inputs) for gm, inputs in graphs]
    monkeypatch.setitem(TARGET_TRAITS, "triton", attrs.evolve(TARGET_TRAITS["triton"], multi_kernel=False))
    off = [_source(gm, inputs) for gm, inputs in graphs]
    assert on[:-1] == off[:-1]
    assert "if s1 <= 16:" in on[-1] and "elif s1 <= 8192:" in on[-1]
    assert "if s1 <= 16:" not in off[-1] and "triton_per" not in off[-1]


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_other_targets_loop_either_way(target: str) -> None:
    k = _only(_symbolic("softmax", target=target))
    assert k.choice is None and "choice:" not in show(_symbolic("softmax", target=target))


def test_a_range_that_fits_is_persistent_and_a_hint_that_does_not_loops() -> None:
    x = torch.randn(8, HINT)
    torch._dynamo.mark_dynamic(x, 1, min=2, max=4096)
    bounded = _only(_symbolic("softmax", inputs=(x,)))
    assert isinstance(bounded.space, Rows) and not bounded.space.looped and bounded.choice is None
    wide = _only(_symbolic("softmax", inputs=(torch.randn(8, 10000),)))
    assert isinstance(wide.space, Rows) and wide.space.looped and wide.choice is None


# ---- the verifier ------------------------------------------------------------------------------


def _reject(kp: KernelProgram, k: KernelSpec, message: str) -> None:
    with pytest.raises(VerifyError, match=message):
        verify(attrs.evolve(kp, specs=(k,)), "schedule_kernels")


def test_the_verifier_rejects_a_corrupted_choice() -> None:
    kp = _symbolic("chained")
    k = _only(kp)
    c = k.choice
    assert c is not None
    verify(kp, "schedule_kernels")
    v = c.persistent
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, rblock=32)),
            rf"{v.name}: K16 the persistent variant of {k.name} for rows up to 32")
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, persistent=attrs.evolve(v, name=k.name))),
            rf"{k.name}: K16 the persistent variant of {k.name}")
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, persistent=attrs.evolve(v, nodes=v.nodes[:-1]))),
            rf"{v.name}: K16 computes other nodes, parameters or sizes than {k.name}")
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, rnumel=k.group[0])), rf"{k.name}: K16 a choice on a reduction")
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, tiers=c.tiers[::-1])),
            rf"{v.name}: K16 the persistent variant of {k.name} for rows up to {LIMIT}")
    other = attrs.evolve(c.tiers[0], function=k.name)  # a tier launching the looped kernel
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, tiers=(other, *c.tiers[1:]))),
            rf"{v.name}: K16 the persistent variant of {k.name}")
    short = attrs.evolve(c.tiers[-1], config=attrs.evolve(c.tiers[-1].config, rblock=4096))
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, tiers=(*c.tiers[:-1], short))),
            rf"{v.name}: K16 .* hold rows up to their rising bounds")
    broken = attrs.evolve(v, stages=v.stages + v.stages)  # every node in two stages: the variant keeps K2 too
    _reject(kp, attrs.evolve(k, choice=attrs.evolve(c, persistent=broken)), rf"K2 sits in stages 0 and 1 of {v.name}")
    static = _static_softmax()
    s = _only(static)
    _reject(static, attrs.evolve(s, choice=Choice(attrs.evolve(s, name="triton_per_x"), s.group[1], 16, "")),
            rf"{s.name}: K16 a choice on a persistent kernel of group \(8, 16\)")


def _static_softmax() -> KernelProgram:
    x = torch.randn(8, HINT)
    kp = coil.default_pipeline().run(trace(_softmax, x), [x], until="schedule_kernels", options=Options(target="triton"))
    assert isinstance(kp, KernelProgram)
    return kp
