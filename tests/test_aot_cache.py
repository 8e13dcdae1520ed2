"""AOTAutograd's cache for coil's training graphs (backends/aot_cache.py): a
second compile of a training graph, in a fresh Dynamo, loads AOTAutograd's result
and coil's compiled graphs instead of tracing; anything that would make the
entry wrong is a miss; Inductor's entries and coil's never meet; torch's config
is left as it was."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from torch._dynamo.utils import counters

import coil  # noqa: F401 - registers the backend
from coil.backends import aot_cache
from coil.options import Options


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Fresh Inductor and coil cache folders for this test (AOTAutograd's entries
    live in Inductor's), a fresh Dynamo before and after."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path / "coil"))
    torch._dynamo.reset()
    counters.clear()
    yield tmp_path
    torch._dynamo.reset()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4))


def _train(call: Any, model: torch.nn.Module, n: int = 8) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One training step of `model` through `call` (the model, or a compiled
    function of it) on n rows: the loss and the gradients."""
    model.zero_grad(set_to_none=True)
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(n))
    loss = call(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _step(model: torch.nn.Module, options: dict[str, Any] | None = None, backend: str = "coil"
          ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One compiled training step from a fresh Dynamo."""
    torch._dynamo.reset()
    # the test's graph is small: every training graph goes into the cache (Options.aot_cache_nodes)
    f = torch.compile(model, backend=backend, options={"aot_cache_nodes": 0, **(options or {})}) \
        if backend == "coil" else torch.compile(model, backend=backend)
    return _train(f, model)


def _eager(model: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    return _train(model, model)


def _assert_as_eager(got: tuple[torch.Tensor, list[torch.Tensor]], want: tuple[torch.Tensor, list[torch.Tensor]]
                     ) -> None:
    torch.testing.assert_close(got[0], want[0])
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w)


def _aot() -> dict[str, int]:
    return dict(counters["aot_autograd"])


def test_a_second_compile_of_a_training_graph_loads_aotautograds_result(caches: Path) -> None:
    model = _model()
    want = _eager(model)
    _assert_as_eager(_step(model), want)
    assert _aot().get("autograd_cache_saved") == 1 and not _aot().get("autograd_cache_hit")
    assert counters["coil"]["compiled"] == 2 and not counters["coil"]["aot_cache_hits"]
    counters.clear()
    _assert_as_eager(_step(model), want)
    # the forward and the backward came from the caches: AOTAutograd traced nothing, coil compiled nothing
    assert _aot().get("autograd_cache_hit") == 1, _aot()
    assert counters["coil"]["aot_cache_hits"] == 2 and counters["coil"]["compiled"] == 2
    assert not _aot().get("autograd_cache_bypass"), _aot()


def test_the_loaded_backward_runs_coils_compiled_graph(caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a hit the graphs are coil's compiled modules (no eager stand-in): the
    loaded forward and backward carry their compiled graphs, from coil's cache."""
    model = _model()
    _step(model)
    loaded: list[Any] = []
    real = aot_cache.CoilOutputCode.post_compile

    def post_compile(self: Any, *a: Any) -> None:
        real(self, *a)
        loaded.append(self)

    monkeypatch.setattr(aot_cache.CoilOutputCode, "post_compile", post_compile)
    _step(model)
    assert sorted(c.kind for c in loaded) == ["backward", "forward"]
    for c in loaded:
        assert c.compiled is not None and c.compiled.cache_key == c.key
        assert "def call" in c.compiled.source


def test_a_graph_gone_from_coils_cache_is_a_miss_and_compiles_again(caches: Path) -> None:
    model = _model()
    want = _eager(model)
    _step(model)
    for f in (caches / "coil" / "graphs").glob("*.pkl"):
        f.unlink()
    counters.clear()
    _assert_as_eager(_step(model), want)
    assert _aot().get("autograd_cache_miss") == 1 and not _aot().get("autograd_cache_hit"), _aot()
    assert counters["coil"]["compiled"] == 2 and not counters["coil"]["aot_cache_hits"]
    counters.clear()
    _step(model)  # stored again
    assert counters["coil"]["aot_cache_hits"] == 2


def test_other_options_or_another_cache_folder_miss(caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    want = _eager(model)
    _step(model)
    counters.clear()
    _assert_as_eager(_step(model, {"fusion_rounds": 3}), want)
    assert not counters["coil"]["aot_cache_hits"] and _aot().get("autograd_cache_miss") == 1
    monkeypatch.setenv("COIL_CACHE_DIR", str(caches / "coil-other"))
    counters.clear()
    _assert_as_eager(_step(model), want)
    assert not counters["coil"]["aot_cache_hits"] and _aot().get("autograd_cache_miss") == 1
    assert aot_cache.key_tag(Options()) != aot_cache.key_tag(Options(fusion_rounds=3))


def test_inductors_entries_and_coils_never_meet(caches: Path) -> None:
    """The same graph compiled by Inductor first: coil's compile misses (its key
    carries coil's tag) and does not load Inductor's entry; then each hits its own."""
    model = _model()
    want = _eager(model)
    _step(model, backend="inductor")
    assert _aot().get("autograd_cache_saved") == 1
    counters.clear()
    _assert_as_eager(_step(model), want)
    assert _aot().get("autograd_cache_miss") == 1 and not _aot().get("autograd_cache_hit"), _aot()
    assert counters["coil"]["compiled"] == 2
    counters.clear()
    _step(model, backend="inductor")
    assert _aot().get("autograd_cache_hit") == 1 and not counters["coil"]["compiled"]


def test_torch_config_is_left_as_it_was(caches: Path) -> None:
    """coil turns bundled entries on for its own compile and backward only."""
    model = _model()
    tag = torch.compiler.config.cache_key_tag
    assert not torch._functorch.config.bundled_autograd_cache
    _step(model)
    assert not torch._functorch.config.bundled_autograd_cache
    assert torch.compiler.config.cache_key_tag == tag


def test_off_with_torchs_switch_or_without_the_graph_cache(caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    _step(model, {"graph_cache": False})
    assert not _aot().get("autograd_cache_saved")
    monkeypatch.setattr(torch._functorch.config, "enable_autograd_cache", False)
    _step(model)
    assert not _aot().get("autograd_cache_saved")
    counters.clear()
    _step(model)
    assert not counters["coil"]["aot_cache_hits"] and counters["coil"]["compiled"] == 2


def test_small_graphs_are_not_stored(caches: Path) -> None:
    """By default a training graph under Options.aot_cache_nodes Dynamo nodes does
    not pay torch's key; with the limit at the graph's size it does."""
    model = _model()
    _step(model, {"aot_cache_nodes": 100})
    assert not _aot().get("autograd_cache_saved") and not _aot().get("autograd_cache_miss")
    nodes = 12  # the Dynamo graph: 6 parameters and the input, 4 calls, the output
    _step(model, {"aot_cache_nodes": nodes + 1})
    assert not _aot().get("autograd_cache_saved")
    _step(model, {"aot_cache_nodes": nodes})
    assert _aot().get("autograd_cache_saved") == 1
    counters.clear()
    _step(model, {"aot_cache_nodes": -1})
    assert not _aot().get("autograd_cache_saved") and not _aot().get("autograd_cache_miss")
    assert Options().aot_cache_nodes == 100


def test_inference_graphs_are_not_stored(caches: Path) -> None:
    """torch's key costs a process about a second at its first use; inference
    graphs, cheap to trace and mostly linked by the graph cache, do not pay it."""
    model = _model()
    with torch.no_grad():
        torch.compile(model, backend="coil")(torch.randn(8, 16))
    assert not _aot().get("autograd_cache_saved") and not _aot().get("autograd_cache_miss")


@pytest.mark.parametrize("why", ["eager", "cuda_graphs", "no_key"])
def test_a_graph_whose_call_needs_more_than_its_module_is_not_stored(why: str, caches: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """An eager stand-in, a CUDA-graph replay, a graph compiled without the graph
    cache: prepare_for_serialization refuses them, and AOTAutograd then stores no
    entry (a bypass, logged)."""
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    def graph(a: torch.Tensor) -> torch.Tensor:
        return a + 1

    class Compiled:
        cache_key = None if why == "no_key" else "k" * 32
        assumed_ranges = ()

    def run(args: list[Any]) -> Any:
        return graph(*args)

    if why != "eager":
        run._boxed_call = True  # type: ignore[attr-defined]
        run.compiled = Compiled()  # type: ignore[attr-defined]
        run.options = Options(cuda_graphs=why == "cuda_graphs")  # type: ignore[attr-defined]
    code = aot_cache.CoilOutputCode.made("forward", run if why != "eager" else graph)
    torch.testing.assert_close(code([torch.ones(2)]), torch.full((2,), 2.0))
    with pytest.raises(BypassAOTAutogradCache, match="not cached"):
        code.prepare_for_serialization()


def test_a_training_graph_run_eagerly_is_not_stored(caches: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A graph coil cannot compile runs eagerly (eager_fallback); its entry is not
    written, so the next start tries to compile it again."""
    from coil.errors import CoilError

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise CoilError("refused for the test")

    monkeypatch.setattr(coil, "compile_graph", refuse)
    model = _model()
    want = _eager(model)
    with caplog.at_level(logging.WARNING, logger="coil"):
        _assert_as_eager(_step(model, {"eager_fallback": True}), want)
    assert "running it eagerly" in caplog.text
    assert not _aot().get("autograd_cache_saved") and _aot().get("autograd_cache_bypass")


def test_a_symbolic_training_graph_loads_and_serves_every_size(caches: Path) -> None:
    """dynamic=True: the entry holds AOTAutograd's guards on the symbols, and the
    graph coil compiled for every size; a fresh Dynamo loads it and trains at
    sizes other than the first compile's, as eager does."""
    model = _model()
    f = torch.compile(model, backend="coil", dynamic=True, options={"aot_cache_nodes": 0})
    _assert_as_eager(_train(f, model, 8), _train(model, model, 8))
    assert counters["coil"]["symbolic"] == 2 and _aot().get("autograd_cache_saved") == 1
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(model, backend="coil", dynamic=True, options={"aot_cache_nodes": 0})
    for n in (8, 5, 33):
        _assert_as_eager(_train(f, model, n), _train(model, model, n))
    assert counters["coil"]["aot_cache_hits"] == 2 and counters["coil"]["symbolic"] == 2, dict(counters["coil"])
    assert not counters["coil"]["eager"]


def test_graph_breaks_each_graph_loads(caches: Path) -> None:
    """A function Dynamo splits at a graph break: each Dynamo graph has its entry."""
    model = _model()

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = model[1](model[0](x))
        torch._dynamo.graph_break()
        return model[3](model[2](h))

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        return _train(torch.compile(fn, backend="coil", options={"aot_cache_nodes": 0}), model)

    want = _eager(model)
    _assert_as_eager(run(), want)
    assert _aot().get("autograd_cache_saved") == 2
    torch._dynamo.reset()
    counters.clear()
    _assert_as_eager(run(), want)
    assert _aot().get("autograd_cache_hit") == 2 and counters["coil"]["aot_cache_hits"] == 4


def test_the_bundled_flag_goes_back_once_at_the_entrys_writing_or_the_first_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward's compile turns bundled entries on; the entry's writing (on
    AOTAutograd's copy) turns them off, so a check failing before the first call
    cannot leave them on; the first call then changes nothing (a user's own
    setting in between stays)."""
    import copy

    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    monkeypatch.setattr(torch._functorch.config, "bundled_autograd_cache", False)

    def graph(a: torch.Tensor) -> torch.Tensor:
        return a * 2

    code = aot_cache.serializable(lambda gm, ex: graph, "backward").compiler_fn(None, [])
    assert torch._functorch.config.bundled_autograd_cache
    with pytest.raises(BypassAOTAutogradCache):  # an eager graph: refused, and the flag back all the same
        copy.copy(code).prepare_for_serialization()
    assert not torch._functorch.config.bundled_autograd_cache
    torch._functorch.config.bundled_autograd_cache = True  # the user's, now
    torch.testing.assert_close(code([torch.ones(2)]), torch.full((2,), 2.0))
    assert torch._functorch.config.bundled_autograd_cache


def test_the_key_skips_inductors_codegen_registration_and_puts_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the backend call torch's key neither registers Inductor's codegen nor
    counts the devices that registered no pass; a device backend's own pass stays
    in it; both names come back after."""
    from torch._inductor import codecache
    from torch._inductor.codegen import common

    def device_pass(gm: torch.fx.Graph) -> None:
        pass

    monkeypatch.setitem(common.custom_backend_passes, "coil_test_none", None)
    monkeypatch.setitem(common.custom_backend_passes, "coil_test_pass", device_pass)
    real = codecache.init_backend_registration
    with aot_cache.key_without_inductor_codegen():
        assert codecache.init_backend_registration is not real
        assert codecache.init_backend_registration() is None
        assert "coil_test_none" not in codecache.custom_backend_passes
        assert codecache.custom_backend_passes["coil_test_pass"] is device_pass
    assert codecache.init_backend_registration is real
    assert codecache.custom_backend_passes is common.custom_backend_passes


def test_a_fresh_process_never_imports_inductors_codegen_and_its_key_holds_after_inductor_registers(
        tmp_path: Path) -> None:
    """In a fresh process a training step stores its entry without Inductor's
    codegen registered (0.7 s of imports on a 2-core VM); after Inductor registers
    it (as a compile with Inductor would), the same step still hits that entry."""
    import os
    import subprocess
    import sys

    script = r'''
import torch
from torch._dynamo.utils import counters
from torch._inductor.codegen import common
import coil
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
def step():
    torch._dynamo.reset()
    f = torch.compile(model, backend="coil", options={"aot_cache_nodes": 0})
    f(torch.randn(8, 16)).square().mean().backward()
step()
print("saved", counters["aot_autograd"]["autograd_cache_saved"], "registered", common.init_backend_registration.cache_info().currsize)
common.init_backend_registration()
counters.clear()
step()
print("hit", counters["aot_autograd"]["autograd_cache_hit"], "loaded", counters["coil"]["aot_cache_hits"])
'''
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), COIL_CACHE_DIR=str(tmp_path / "coil"),
               COIL_AOT_CACHE_NODES="0")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert "saved 1 registered 0" in lines, run.stdout
    assert "hit 1 loaded 2" in lines, run.stdout
