"""The compiled-graph cache (coil/graph_cache.py): a graph compiled once loads from
the cache dir; any change to what the result depends on compiles again; a bad
entry is rebuilt."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil import graph_cache
from coil.passes.pipeline import Pipeline


def _compile(fn: Callable[..., Any], inputs: list[torch.Tensor], cache: Path, **options: Any) -> Any:
    gm = make_fx(fn)(*inputs)
    return coil.compile_graph(gm, inputs, coil.Options(target="cpp", cache_dir=str(cache), **options))


@pytest.fixture
def no_pipeline(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call to make every later pipeline run fail: what compiles then came from the cache."""

    def forbid() -> None:
        def run(*_a: Any, **_k: Any) -> Any:
            raise AssertionError("the pipeline ran")

        monkeypatch.setattr(Pipeline, "run", run)

    return forbid


def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * 2 + b).softmax(-1)


def test_second_compile_loads_from_the_cache(tmp_path: Path, no_pipeline: Callable[[], None]) -> None:
    a, b = torch.randn(16, 40), torch.randn(16, 40)
    first = _compile(fn, [a, b], tmp_path)
    assert len(list((tmp_path / "graphs").glob("*.pkl"))) == 1
    no_pipeline()
    second = _compile(fn, [a, b], tmp_path)
    assert second.source == first.source
    torch.testing.assert_close(second(a, b)[0], fn(a, b))
    assert second.module.program.plan.peak_bytes == first.module.program.plan.peak_bytes


@pytest.mark.parametrize("change", ["layout", "dtype", "options", "graph"])
def test_what_the_result_depends_on_misses(tmp_path: Path, change: str) -> None:
    a, b = torch.randn(16, 40), torch.randn(16, 40)
    base = _compile(fn, [a, b], tmp_path)
    other: Any
    if change == "layout":
        other = _compile(fn, [a, b.t().contiguous().t()], tmp_path)
    elif change == "dtype":
        other = _compile(fn, [a.double(), b.double()], tmp_path)
    elif change == "options":
        other = _compile(fn, [a, b], tmp_path, max_fusion_size=1)
    else:
        other = _compile(lambda x, y: (x * 3 + y).softmax(-1), [a, b], tmp_path)
    # a second entry: the key differed, the pipeline ran and stored its result
    assert len(list((tmp_path / "graphs").glob("*.pkl"))) == 2
    assert other.source != base.source or change == "layout"


def test_a_bad_entry_is_compiled_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    _compile(fn, [a, b], tmp_path)
    (entry,) = (tmp_path / "graphs").glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    with caplog.at_level(logging.WARNING, logger="coil"):
        again = _compile(fn, [a, b], tmp_path)
    assert "does not load" in caplog.text
    torch.testing.assert_close(again(a, b)[0], fn(a, b))
    assert graph_cache.load(entry.stem, str(tmp_path)) is not None  # rewritten


def test_showing_stages_and_opting_out_skip_the_cache(tmp_path: Path) -> None:
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    _compile(fn, [a, b], tmp_path, debug_dir=str(tmp_path / "dbg"))
    _compile(fn, [a, b], tmp_path, graph_cache=False)
    assert not list((tmp_path / "graphs").glob("*.pkl"))
    assert (tmp_path / "dbg").exists()


def test_the_key_follows_coil_source_and_options() -> None:
    gm = make_fx(fn)(torch.randn(2, 3), torch.randn(2, 3))
    inputs = [torch.randn(2, 3), torch.randn(2, 3)]
    k = graph_cache.graph_key(gm, inputs, coil.Options(target="cpp"))
    assert k is not None and len(k) == 32
    assert k == graph_cache.graph_key(gm, inputs, coil.Options(target="cpp", cache_dir="/elsewhere"))
    assert k != graph_cache.graph_key(gm, inputs, coil.Options(target="reference"))
    assert len(graph_cache.coil_source_hash()) == 64
