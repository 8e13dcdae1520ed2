"""What a newcomer meets first: `coil --help` after a plain install, `coil demo` at
other sizes, the README's `coil.ir.printer.show`, debug_dir on a training step,
torch.compile's `mode=`, a compile without ResourceWarnings, and a replaced pass
that returns the wrong language (blamed on itself, not on the next stage)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import tomllib
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


# ---- coil --help without hypothesis ----------------------------------------------------------

BLOCK_HYPOTHESIS = """
    import sys

    class NoHypothesis:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "hypothesis":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoHypothesis())
"""


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["fuzz", "--help"]])
def test_help_needs_no_hypothesis(argv: list[str]) -> None:
    done = _python(BLOCK_HYPOTHESIS + f"""
    import runpy
    sys.argv = ["coil", *{argv!r}]
    runpy.run_module("coil", run_name="__main__")
    """)
    assert done.returncode == 0, done.stderr
    assert "usage: coil" in done.stdout


def test_fuzz_without_hypothesis_says_what_is_missing() -> None:
    done = _python(BLOCK_HYPOTHESIS + """
    from coil.__main__ import main
    main(["fuzz", "--examples", "1"])
    """)
    assert done.returncode != 0 and "coil fuzz: needs hypothesis" in done.stderr


def test_hypothesis_is_a_plain_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("hypothesis") for d in project["dependencies"])


def test_fuzz_dtype_names_are_the_generators() -> None:
    from coil.cli.fuzz import DTYPE_NAMES
    from coil.properties.strategies import DEFAULT_DTYPES

    assert tuple(DTYPE_NAMES.values()) == DEFAULT_DTYPES
    assert all(str(d) == f"torch.{n}" for n, d in DTYPE_NAMES.items())


# ---- coil demo at a size where float32 sums round differently ------------------------------------


def test_demo_at_4096_by_1024_matches_eager(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    assert main(["demo", "--size", "4096", "1024", "--target", "cpp"]) == 0
    out = capsys.readouterr().out
    assert "result matches eager (largest error against float64: coil" in out


def test_the_demo_comparison_still_catches_wrong_results() -> None:
    from coil.cli.demo import within_eager_error

    torch.manual_seed(0)
    a = torch.randn(64, 1024)
    exact, eager = a.double().sum(-1), a.sum(-1)
    assert within_eager_error(eager, eager, exact)[0]
    assert within_eager_error(a.flip(-1).sum(-1), eager, exact)[0]  # another order: as good
    wrong = eager.clone()
    wrong[3] += 1e-3
    assert not within_eager_error(wrong, eager, exact)[0]
    assert not within_eager_error(torch.full_like(eager, float("nan")), eager, exact)[0]
    assert not within_eager_error(eager[:-1], eager, exact)[0]
    assert not within_eager_error(eager.double(), eager, exact)[0]


# ---- import coil; coil.ir.printer.show(...) ----------------------------------------------------


def test_coil_ir_printer_is_reachable_after_import_coil() -> None:
    done = _python("""
    import torch
    import coil
    from torch.fx.experimental.proxy_tensor import make_fx

    print(coil.ir.printer.show.__name__, coil.ir.verify.verify.__name__, coil.passes.pipeline.__name__)
    inputs = [torch.randn(4, 8), torch.randn(4, 8)]
    gm = make_fx(lambda a, b: (a + b).relu().sum(-1))(*inputs)
    sched = coil.default_pipeline().run(gm, inputs, until="extract_deps")
    print(coil.ir.printer.show(sched))
    try:
        coil.ir.no_such_module
    except AttributeError as e:
        print("AttributeError:", e)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("show verify coil.passes.pipeline\n")
    assert "buf0" in done.stdout and "AttributeError: module 'coil.ir' has no attribute 'no_such_module'" in done.stdout


# ---- debug_dir: a folder per graph ------------------------------------------------------------


def test_debug_dir_keeps_forward_backward_and_inference(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    options = {"target": "cpp", "debug_dir": str(tmp_path), "cache_dir": str(tmp_path / "cache")}
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="coil", options=options)
    compiled(x).sum().backward()
    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(model, backend="coil", options=options)(x)
    folders = sorted(p.name for p in tmp_path.iterdir() if p.name != "cache")
    assert folders == ["0_forward", "1_backward", "2_inference"]
    sources = [(tmp_path / f / "output_code.py").read_text() for f in folders]
    assert len(set(sources)) == 3 and all("def call(args" in s for s in sources)
    assert all((tmp_path / f / "00_lower.txt").exists() for f in folders)


def test_debug_dir_never_overwrites_a_folder(tmp_path: Path) -> None:
    (tmp_path / "7_forward").mkdir()
    (tmp_path / "7_forward" / "mine.txt").write_text("keep")
    (tmp_path / "notes").mkdir()
    inputs = [torch.randn(4, 8)]
    gm = make_fx(lambda a: a.exp().sum(-1))(*inputs)
    for _ in range(2):
        coil.compile_graph(gm, inputs, coil.Options(target="reference", debug_dir=str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["7_forward", "8_graph", "9_graph", "notes"]
    assert (tmp_path / "7_forward" / "mine.txt").read_text() == "keep"
    assert (tmp_path / "9_graph" / "output_code.py").exists()


# ---- torch.compile(mode=...) -------------------------------------------------------------------


@pytest.fixture
def seen_options(monkeypatch: pytest.MonkeyPatch) -> list[coil.Options]:
    """The Options each graph was compiled with through torch.compile."""
    seen: list[coil.Options] = []
    real = coil.compile_graph

    def spy(gm: Any, inputs: Any, options: Any = None, *a: Any, **k: Any) -> Any:
        seen.append(options)
        return real(gm, inputs, options, *a, **k)

    monkeypatch.setattr(coil, "compile_graph", spy)
    return seen


def _compile_with_mode(mode: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COIL_TARGET", "cpp")
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    out = torch.compile(lambda t: t.relu() * 3, backend="coil", mode=mode)(x)
    torch.testing.assert_close(out, x.relu() * 3)


@pytest.mark.parametrize("mode", [None, "default"])
def test_mode_default_changes_nothing(mode: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      seen_options: list[coil.Options]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _compile_with_mode(mode, tmp_path, monkeypatch)
    assert seen_options and not any(o.autotune for o in seen_options)


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_max_autotune_turns_on_autotune(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        seen_options: list[coil.Options], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="coil"):
        _compile_with_mode(mode, tmp_path, monkeypatch)
    assert seen_options and all(o.autotune for o in seen_options)
    assert f"mode='{mode}' turns on Options.autotune" in caplog.text


def test_reduce_overhead_turns_on_cuda_graphs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              seen_options: list[coil.Options],
                                              caplog: pytest.LogCaptureFixture) -> None:
    """reduce-overhead asks for CUDA graphs; a graph on CPU tensors runs without
    them, and the log says why."""
    with caplog.at_level(logging.INFO, logger="coil"):
        _compile_with_mode("reduce-overhead", tmp_path, monkeypatch)
    assert seen_options and all(o.cuda_graphs and not o.autotune for o in seen_options)
    assert "graph runs without CUDA graphs: input 0 is a CPU tensor" in caplog.text


def test_an_unknown_mode_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Exception, match="unknown torch.compile mode 'fastest' for backend 'coil'; known modes: "
                                        "default, reduce-overhead, max-autotune"):
        _compile_with_mode("fastest", tmp_path, monkeypatch)


# ---- no ResourceWarning ----------------------------------------------------------------------


def test_a_compile_leaves_no_unclosed_file(tmp_path: Path) -> None:
    done = _python(f"""
    import gc, warnings
    import torch, coil
    from torch.fx.experimental.proxy_tensor import make_fx

    warnings.simplefilter("error", ResourceWarning)
    x = torch.randn(8, 16)
    for target in ("cpp", "reference"):
        for _ in range(2):  # a cold compile, then one from the caches
            gm = make_fx(lambda t: (t * 2).sum(-1))(x)
            coil.compile_graph(gm, [x], coil.Options(target=target, cache_dir={str(tmp_path)!r}))(x)
    for _ in range(2):
        torch._dynamo.reset()
        torch.compile(lambda t: t.relu() + 1, backend="coil", options={{"cache_dir": {str(tmp_path)!r}}})(x)
    gc.collect()
    print("done")
    """, "-X", "dev")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n" and "ResourceWarning" not in done.stderr, done.stderr


# ---- a pass that returns the wrong language ---------------------------------------------------


def _seed() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    inputs = [torch.randn(4, 8), torch.randn(4, 8)]
    return make_fx(lambda a, b: (a * b).relu().sum(-1))(*inputs), inputs


def test_a_replaced_pass_of_the_wrong_language_is_blamed() -> None:
    gm, inputs = _seed()
    p = coil.default_pipeline().replace("fuse", lambda g, o: g)  # hands on its ScheduleGraph
    with pytest.raises(coil.CoilError) as info:
        p.run(gm, inputs, options=coil.Options(target="reference"))
    assert info.value.stage == "fuse"
    assert "stage 'fuse' returned ScheduleGraph, but a 'fuse' stage must return a FusedSchedule" in str(info.value)


def test_an_inserted_stage_must_return_what_the_next_stage_reads() -> None:
    gm, inputs = _seed()

    def my_check(plan: Any, o: coil.Options) -> None:
        assert plan.peak_bytes >= 0  # forgot to return the plan

    p = coil.default_pipeline().insert_after("plan_memory", my_check)
    with pytest.raises(coil.CoilError) as info:
        p.run(gm, inputs, options=coil.Options(target="reference"))
    assert info.value.stage == "my_check"
    assert "stage 'my_check' returned NoneType, but the next stage, 'schedule_kernels', reads a MemoryPlan" in str(info.value)


def test_a_checker_that_returns_what_it_got_is_fine() -> None:
    gm, inputs = _seed()
    seen: list[str] = []

    def my_check(plan: Any, o: coil.Options) -> Any:
        seen.append(type(plan).__name__)
        return plan

    p = coil.default_pipeline().insert_after("plan_memory", my_check)
    compiled = coil.compile_graph(gm, inputs, coil.Options(target="reference"), pipeline=p)
    torch.testing.assert_close(compiled(*inputs)[0], (inputs[0] * inputs[1]).relu().sum(-1))
    assert seen == ["MemoryPlan"]
    # a last stage of a language coil does not know: returned as it is, not verified
    wrapped = p.insert_after("kernel_gen", lambda m, o: {"module": m}, "package").run(
        gm, inputs, options=coil.Options(target="reference"))
    assert set(wrapped) == {"module"}


def test_a_verifiers_own_type_error_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from coil.ir import registry
    from coil.ir.fused import FusedSchedule
    from coil.ir.verify import UnknownLanguage, verify

    def broken(ir: Any, stage: str) -> None:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setitem(registry.VERIFIERS, FusedSchedule, broken)  # type: ignore[index]
    gm, inputs = _seed()
    with pytest.raises(coil.CoilError) as info:
        coil.default_pipeline().run(gm, inputs, options=coil.Options(target="reference"))
    assert info.value.stage == "fuse"
    assert "verifying FusedSchedule: TypeError: unsupported operand" in str(info.value)
    # the verifier's own error is the cause, with its traceback down to the line that raised
    cause = info.value.__cause__
    assert type(cause) is TypeError
    assert traceback.extract_tb(cause.__traceback__)[-1].name == "broken"
    with pytest.raises(UnknownLanguage, match="no verifier for dict"):
        verify({}, "x")
