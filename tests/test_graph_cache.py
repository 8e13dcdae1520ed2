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
    assert second.module.plan.peak_bytes == first.module.plan.peak_bytes


def test_cuda_graphs_load_what_the_default_mode_compiled(tmp_path: Path, no_pipeline: Callable[[], None]) -> None:
    """Options.cuda_graphs (mode="reduce-overhead") wraps the compiled call after it
    is built (backends/dynamo.py), so it is not part of the key: the same graph
    compiled for CUDA graphs loads the default mode's entry."""
    a, b = torch.randn(16, 40), torch.randn(16, 40)
    first = _compile(fn, [a, b], tmp_path)
    no_pipeline()
    second = _compile(fn, [a, b], tmp_path, cuda_graphs=True)
    assert second.source == first.source and len(list((tmp_path / "graphs").glob("*.pkl"))) == 1


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


def test_a_graph_with_a_tensor_constant_is_cached_by_its_value(tmp_path: Path,
                                                                no_pipeline: Callable[[], None]) -> None:
    """A tensor constant (get_attr: lower makes it an input the module holds) is
    part of the key by its bytes: the same code with another constant is another
    entry, and a training graph's entry loads under AOTAutograd's fake mode (where
    unpickling the constant crashed the process) with the constant's value."""
    x = torch.randn(4, 4)
    three = _compile(lambda a: ((a * torch.tensor(3.0)).sin(),), [x], tmp_path)
    four = _compile(lambda a: ((a * torch.tensor(4.0)).sin(),), [x], tmp_path)
    assert len(list((tmp_path / "graphs").glob("*.pkl"))) == 2
    torch.testing.assert_close(four(x)[0], (x * 4).sin())
    assert three.source == four.source  # the same code: only the constant's value tells them apart

    def f(a: torch.Tensor) -> torch.Tensor:
        return (a * torch.tensor(3.0)).sin()

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        torch._dynamo.reset()
        a = x.clone().requires_grad_()
        out = torch.compile(f, backend="coil", options={"cache_dir": str(tmp_path), "target": "cpp"})(a)
        out.sum().backward()
        assert a.grad is not None
        return out.detach(), a.grad

    first = step()
    n = len(list((tmp_path / "graphs").glob("*.pkl")))
    assert n >= 4  # and the forward and backward graphs
    no_pipeline()
    again = step()
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(again, ((x * 3).sin(), 3 * (x * 3).cos()))
    assert len(list((tmp_path / "graphs").glob("*.pkl"))) == n
    torch._dynamo.reset()


def test_constants_whose_bytes_do_not_say_it_all_are_not_cached() -> None:
    """A sparse, quantized (its scale is not in its bytes) or meta constant, or
    one too large to hash, leaves its graph uncached; a dense one is keyed."""
    import warnings

    def graph_holding(value: torch.Tensor) -> torch.fx.GraphModule:
        gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
        gm.register_buffer("_tensor_constant0", value)
        gm.graph.output((gm.graph.get_attr("_tensor_constant0"),))
        gm.recompile()
        return gm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated
        refused = [torch.randn(3).to_sparse(), torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8),
                   torch.empty(3, device="meta"), torch.zeros(graph_cache.CONSTANT_KEY_MAX + 1, dtype=torch.uint8)]
    for value in refused:
        assert graph_cache._constant_keys(graph_holding(value)) is None, value.layout
    (key,) = graph_cache._constant_keys(graph_holding(torch.tensor([1.5, 2.0]))) or [None]
    assert key is not None and key.startswith("C_tensor_constant0:T(2,)(1,)+0:torch.float32:cpu:")


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



def test_the_key_follows_the_origins_lower_reads() -> None:
    """A gather that came from a decomposed nll_loss raises nll_loss's error
    (lower reads the node's `original_aten`, which gm.code does not show): a plain
    gather of the same code must not load its compiled module."""
    def gather(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.gather(x, 1, i)

    inputs = [torch.randn(4, 3), torch.tensor([[0], [2], [1], [1]])]
    gm = make_fx(gather)(*inputs)
    plain = graph_cache.graph_key(gm, inputs, coil.Options(target="cpp"))
    node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.gather.default)
    node.meta["original_aten"] = torch.ops.aten.nll_loss_forward.default
    assert graph_cache.graph_key(gm, inputs, coil.Options(target="cpp")) != plain
    node.meta["original_aten"] = torch.ops.aten.gather.default  # an origin lower does not read
    assert graph_cache.graph_key(gm, inputs, coil.Options(target="cpp")) == plain


# Dynamo graphs: the link that lets a warm compile skip AOTAutograd


def _through_dynamo(f: Callable[..., Any], inputs: list[torch.Tensor], cache: Path) -> Any:
    torch._dynamo.reset()
    return torch.compile(f, backend="coil", options={"target": "cpp", "cache_dir": str(cache)})(*inputs)


def _links(cache: Path) -> list[Path]:
    return sorted((cache / "graphs").glob("*.link"))


@pytest.fixture
def no_aot(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call to make every later AOTAutograd compile fail: what compiles then came through a link."""

    def forbid() -> None:
        import torch._dynamo.backends.common as common

        def aot_autograd(**_k: Any) -> Any:
            raise AssertionError("AOTAutograd ran")

        monkeypatch.setattr(common, "aot_autograd", aot_autograd)

    return forbid


def two_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.nn.functional.gelu(x + y.t(), approximate="tanh").sum(-1), (x * 2).relu()


def test_an_inference_graph_loads_through_its_link(tmp_path: Path, no_aot: Callable[[], None]) -> None:
    x, y = torch.randn(8, 12), torch.randn(12, 8)
    first = _through_dynamo(two_outputs, [x, y], tmp_path)
    assert len(_links(tmp_path)) == 1
    link_target = _links(tmp_path)[0].read_text()
    assert (tmp_path / "graphs" / f"{link_target}.pkl").exists()
    no_aot()
    x2, y2 = torch.randn(8, 12), torch.randn(12, 8)
    again = _through_dynamo(two_outputs, [x2, y2], tmp_path)
    torch.testing.assert_close(first, two_outputs(x, y))
    assert isinstance(again, tuple) and len(again) == 2
    torch.testing.assert_close(again, two_outputs(x2, y2))


def test_a_symbolic_graph_links_and_serves_another_batch_size(tmp_path: Path, no_aot: Callable[[], None]) -> None:
    """Under dynamic=True the link keys on the graph's symbolic sizes (and their
    ranges): a compile at batch 8 leaves one, and in a fresh Dynamo a call at batch
    13 loads the compiled graph through it, without AOTAutograd, and is right."""
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x + y, -1) * 2

    def run(b: int) -> None:
        torch._dynamo.reset()
        x, y = torch.randn(b, 12), torch.randn(b, 12)
        compiled = torch.compile(f, backend="coil", dynamic=True,
                                 options={"target": "cpp", "cache_dir": str(tmp_path)})
        torch.testing.assert_close(compiled(x, y), f(x, y))

    run(8)
    assert len(_links(tmp_path)) == 1
    no_aot()
    run(13)
    run(5)
    assert len(_links(tmp_path)) == 1


def test_a_grad_free_graph_of_inputs_that_need_grad_links(tmp_path: Path, no_aot: Callable[[], None]) -> None:
    x, y = torch.randn(8, 12, requires_grad=True), torch.randn(12, 8)
    with torch.no_grad():
        _through_dynamo(two_outputs, [x, y], tmp_path)
        assert len(_links(tmp_path)) == 1
        no_aot()
        got = _through_dynamo(two_outputs, [x, y], tmp_path)
        torch.testing.assert_close(got, two_outputs(x, y))
    assert not got[0].requires_grad


def _mutates(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x * y


def _views_input(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.t(), x + y


@torch._dynamo.allow_in_graph
def _kept_whole(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def _calls_user_function(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _kept_whole(x) + y


@pytest.mark.parametrize("fn", [_mutates, _views_input, _calls_user_function])
def test_graphs_that_need_aot_autograd_get_no_link(tmp_path: Path, fn: Callable[..., Any]) -> None:
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    want = fn(x.clone(), y)
    got = _through_dynamo(fn, [x.clone(), y], tmp_path)
    assert not _links(tmp_path)
    again_x = x.clone()
    again = _through_dynamo(fn, [again_x, y], tmp_path)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(again, want)
    if fn is _mutates:
        torch.testing.assert_close(again_x, x + 1)


def _returns_input(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, x + y


def _views_intermediate(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = x + y
    return z, z.view(-1)


@pytest.mark.parametrize("fn", [_returns_input, _views_intermediate])
def test_aliases_come_back_the_same_through_the_link(tmp_path: Path, no_aot: Callable[[], None],
                                                      fn: Callable[..., Any]) -> None:
    """Dynamo returns an input itself outside the graph, and AOTAutograd leaves a
    view of an intermediate to coil's graph (which returns it as a view), so both
    graphs link, and through the link the outputs alias as they did before."""
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    first = _through_dynamo(fn, [x, y], tmp_path)
    assert len(_links(tmp_path)) == 1
    no_aot()
    got = _through_dynamo(fn, [x, y], tmp_path)
    torch.testing.assert_close(got, fn(x, y))
    if fn is _returns_input:
        assert first[0] is x and got[0] is x
    else:
        assert first[1]._base is first[0] and got[1]._base is got[0]


def test_training_and_autocast_get_no_link(tmp_path: Path) -> None:
    x, y = torch.randn(8, 12, requires_grad=True), torch.randn(12, 8)
    out = _through_dynamo(two_outputs, [x, y], tmp_path)
    out[0].sum().backward()
    assert x.grad is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _through_dynamo(two_outputs, [x.detach(), y], tmp_path)
    assert not _links(tmp_path)


def test_the_link_key_follows_global_state() -> None:
    x, y = torch.randn(4, 6), torch.randn(6, 4)
    gms: list[torch.fx.GraphModule] = []

    def grab(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        gms.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(two_outputs, backend=grab)(x, y)
    opts = coil.Options(target="cpp")
    key = graph_cache.dynamo_key(gms[0], [x, y], opts)
    assert key is not None and key == graph_cache.dynamo_key(gms[0], [x.clone(), y.clone()], opts)
    with torch.no_grad():
        assert graph_cache.dynamo_key(gms[0], [x, y], opts) not in (key, None)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert graph_cache.dynamo_key(gms[0], [x, y], opts) not in (key, None)
    finally:
        torch.set_default_dtype(default)
    assert graph_cache.dynamo_key(gms[0], [x, y.t().contiguous().t()], opts) not in (key, None)
    assert graph_cache.dynamo_key(gms[0], [x, y], coil.Options(target="reference")) not in (key, None)
    assert graph_cache.dynamo_key(gms[0], [x, y], coil.Options(target="cpp", graph_cache=False)) is None


def _dynamo_graphs(fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[tuple[torch.fx.GraphModule, list[Any]]]:
    """The graphs (and example inputs) Dynamo hands a backend over these calls."""
    got: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def grab(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        got.append((gm, list(inputs)))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=grab)
    with torch.no_grad():
        for args in calls:
            compiled(*args)
    return got


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _even_doubled(x: torch.Tensor) -> torch.Tensor:
    torch._check(x.shape[0] % 2 == 0)  # a guard on the size: s0 even
    return x * 2


def _even_sides_doubled(x: torch.Tensor) -> torch.Tensor:
    torch._check(x.shape[0] % 2 == 0)
    torch._check(x.shape[1] % 2 == 0)
    return x * 2


def _shifted(x: torch.Tensor, k: int) -> torch.Tensor:
    return x + k


def test_a_symbolic_link_is_keyed_by_the_guards_without_reading_them_into_rules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Dynamo graph of symbolic sizes is linked under its guards, ranges and sizes
    as the ShapeEnv holds them: the same graph and guards again give the same key;
    a guard more (s0 even), a bounded range or a SymInt negative at the first call
    (compiled for that value) another; and the key reads no size rules (SizeMap.of,
    seconds for Swin's guards)."""
    from coil.passes.symbolic import SizeMap

    opts = coil.Options(target="cpp")

    def key(fn: Callable[..., Any], *calls: tuple[Any, ...]) -> str | None:
        gm, inputs = _dynamo_graphs(fn, list(calls))[-1]
        assert any(isinstance(v, torch.SymInt) for v in inputs)
        return graph_cache.dynamo_key(gm, inputs, opts)

    def refuse(*_: Any) -> Any:
        raise AssertionError("the link's key read the guards into rules")

    monkeypatch.setattr(SizeMap, "of", classmethod(refuse))
    plain = key(_doubled, (torch.randn(8, 4),), (torch.randn(10, 4),))
    assert plain is not None and plain == key(_doubled, (torch.randn(8, 4),), (torch.randn(12, 4),))
    assert key(_even_doubled, (torch.randn(8, 4),), (torch.randn(10, 4),)) not in (plain, None)
    bounded = torch.randn(10, 4)
    torch._dynamo.mark_dynamic(bounded, 0, min=2, max=64)
    assert key(_doubled, (torch.randn(8, 4),), (bounded,)) not in (plain, None)
    # Dynamo's list of guards for one program differs between processes in order and repeats
    gm, inputs = _dynamo_graphs(_even_sides_doubled, [(torch.randn(8, 4),), (torch.randn(10, 6),)])[-1]
    env = next(v for v in inputs if isinstance(v, torch.SymInt)).node.shape_env
    first = graph_cache.dynamo_key(gm, inputs, opts)
    assert len(env.guards) > 1
    env.guards[:] = [*reversed(env.guards), env.guards[0]]
    assert graph_cache.dynamo_key(gm, inputs, opts) == first
    x = torch.randn(4)
    positive = key(_shifted, (x, 3), (x, 5))
    assert positive is not None and positive == key(_shifted, (x, 4), (x, 6))
    assert key(_shifted, (x, -3), (x, -5)) not in (positive, None)


def test_a_damaged_or_dangling_link_compiles_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    x, y = torch.randn(8, 12), torch.randn(12, 8)
    _through_dynamo(two_outputs, [x, y], tmp_path)
    (link,) = _links(tmp_path)
    link.write_text("not a key")
    with caplog.at_level(logging.WARNING, logger="coil"):
        got = _through_dynamo(two_outputs, [x, y], tmp_path)
    assert "damaged" in caplog.text
    torch.testing.assert_close(got, two_outputs(x, y))
    target = link.read_text()  # stored again
    (tmp_path / "graphs" / f"{target}.pkl").unlink()
    got = _through_dynamo(two_outputs, [x, y], tmp_path)
    torch.testing.assert_close(got, two_outputs(x, y))
    assert (tmp_path / "graphs" / f"{target}.pkl").exists()


@pytest.mark.parametrize("graph_cache_on", [True, False])
def test_a_passed_through_graph_is_called_without_aot_wrappers(tmp_path: Path, graph_cache_on: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On a miss, too (and with the cache off), a graph AOTAutograd passed through
    is called directly; one it had to wrap keeps its wrappers."""
    import coil.backends.dynamo as dyn

    direct: list[Any] = []
    real = dyn._direct

    def spy(compiled: Any, call: Any) -> Any:
        direct.append(compiled)
        return real(compiled, call)

    monkeypatch.setattr(dyn, "_direct", spy)
    x, y = torch.randn(8, 12), torch.randn(12, 8)
    options = {"target": "cpp", "cache_dir": str(tmp_path), "graph_cache": graph_cache_on}
    for fn, args in ((two_outputs, (x, y)), (_views_input, (x, y.t()))):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="coil", options=options)(*args), fn(*args))
    assert len(direct) == 1 and "relu" in direct[0].source
    assert bool(_links(tmp_path)) == graph_cache_on


def test_a_link_that_cannot_be_written_does_not_fail_the_compile(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import coil.backends.runtime as runtime

    real = runtime.write_atomic

    def refuse_links(path: str, data: bytes) -> None:
        if path.endswith(".link"):
            raise PermissionError(path)
        real(path, data)

    monkeypatch.setattr(runtime, "write_atomic", refuse_links)
    x, y = torch.randn(8, 12), torch.randn(12, 8)
    torch.testing.assert_close(_through_dynamo(two_outputs, [x, y], tmp_path), two_outputs(x, y))
    assert not _links(tmp_path) and list((tmp_path / "graphs").glob("*.pkl"))


def _cond_and_scan(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torch._higher_order_ops.scan import scan

    a = torch.cond(x.sum() > 0, lambda x: x.sin() * 2, lambda x: x.cos() + 1, (x,))

    def combine(c: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = c + v * 2
        return n, n.clone()

    return a, scan(combine, y[0], y)[1]


def _aot_forward(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    from torch._dynamo.backends.common import aot_autograd

    got: list[Any] = []

    def grab(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=grab))(*args)
    return got[0]


def test_a_graph_with_higher_order_ops_is_cached_with_its_subgraphs(tmp_path: Path,
                                                                     no_pipeline: Callable[[], None]) -> None:
    """cond's branches and scan's combine function: the module is pickled with its
    subgraphs (their fake inputs as layouts), keyed by each subgraph's text, and
    each subgraph's own compile is cached too.  The second compile runs no pass."""
    x, y = torch.randn(8), torch.randn(5, 3)
    gm, inputs = _aot_forward(_cond_and_scan, x, y)
    opts = coil.Options(target="cpp", cache_dir=str(tmp_path))
    first = coil.compile_graph(gm, inputs, opts)
    assert len(list((tmp_path / "graphs").glob("*.pkl"))) == 4  # the graph, two branches, the combine function
    no_pipeline()
    second = coil.compile_graph(gm, inputs, opts)
    for s in (1.0, -1.0):
        for got, want in zip(second(x * s, y), _cond_and_scan(x * s, y)):
            torch.testing.assert_close(got, want)
    assert second.source == first.source


def test_a_subgraph_is_keyed_by_its_meaning_not_its_node_names() -> None:
    """A subgraph's key holds its graph's text (graph_text), which neither node
    names nor node metadata change: FX's own pickle of a GraphModule traces its
    code again and renames its nodes (`sin` becomes `sin_default`)."""
    import pickle

    gm = make_fx(lambda x: (x.sin() * 2,))(torch.randn(4))
    again = pickle.loads(pickle.dumps(gm))
    assert gm.code != again.code
    assert graph_cache.graph_text(gm) == graph_cache.graph_text(again)
    other = make_fx(lambda x: (x.cos() * 2,))(torch.randn(4))
    assert graph_cache.graph_text(other) != graph_cache.graph_text(gm)


def test_a_graph_with_higher_order_ops_loads_in_another_process(tmp_path: Path) -> None:
    """What the cache is for: a second process compiles nothing (the pipeline is
    forbidden there) and computes eager's values, both branches."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}]
        import torch, coil
        from coil.passes.pipeline import Pipeline
        from test_graph_cache import _cond_and_scan
        if sys.argv[1] == "second":
            def run(*a, **k):
                raise AssertionError("the pipeline ran")
            Pipeline.run = run
        x, y = torch.randn(8), torch.randn(5, 3)
        c = torch.compile(_cond_and_scan, backend="coil", options={{"target": "cpp", "cache_dir": {str(tmp_path)!r}}})
        for s in (1.0, -1.0):
            for got, want in zip(c(x * s, y), _cond_and_scan(x * s, y)):
                torch.testing.assert_close(got, want)
        print("ok", sys.argv[1])
    """))
    env = {**__import__("os").environ, "COIL_EAGER_FALLBACK": "0"}
    for run in ("first", "second"):
        done = subprocess.run([sys.executable, str(script), run], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0 and f"ok {run}" in done.stdout, done.stderr[-3000:]


def test_a_cached_subgraph_keeps_its_random_ops(tmp_path: Path, no_pipeline: Callable[[], None]) -> None:
    """A subgraph is pickled node by node (ir/lowered.py: graph_state): FX's own
    pickle of a GraphModule traces its code again, which would run `rand` once and
    keep its values as a constant, so the cached branch would give the same
    'random' numbers at every call."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x + torch.rand(8), lambda x: x - 1, (x,))

    x = torch.ones(8)
    gm, inputs = _aot_forward(fn, x)
    opts = coil.Options(target="cpp", cache_dir=str(tmp_path))
    coil.compile_graph(gm, inputs, opts)
    no_pipeline()
    loaded = coil.compile_graph(gm, inputs, opts)
    a, b = loaded(x)[0], loaded(x)[0]
    assert not torch.equal(a, b) and ((a - 1) >= 0).all() and ((a - 1) < 1).all()


def test_graph_text_tells_overloads_apart() -> None:
    """add.Tensor and add.Scalar (one op, two overloads) are two graphs."""
    x = torch.randn(4)
    tensor = make_fx(lambda x: (torch.ops.aten.add.Tensor(x, x),))(x)
    scalar = make_fx(lambda x: (torch.ops.aten.add.Scalar(x, 2),))(x)
    assert "aten.add.Tensor" in graph_cache.graph_text(tensor) and "aten.add.Scalar" in graph_cache.graph_text(scalar)


def test_a_backend_bound_to_another_taps_choice_never_loads_the_others_graph(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The joint graph's decompositions are the backend's TapsChoice's: bound with
    rows_2d off, a conv1d stays 1-d; with it on (the CPU's default), it is a 2-d
    convolution of one row.  Both compiles of one inference graph, cache on, each
    get their own graph (the handler's cache_key is in the link's key and in
    AOTAutograd's tag), and a third compile with the first handler's settings loads
    the first's."""
    import functools

    from bench.variants import Capture, record_coil_graphs
    from coil.backends import aot_cache
    from coil.backends.dynamo import coil_backend
    from coil.passes.lowerings.conv_taps import TapsChoice

    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    conv = torch.nn.Conv1d(4, 6, 3, stride=2)
    x = torch.randn(2, 4, 20)
    want = conv(x)
    sources = []
    for rows in ((), ("cpu",), ()):
        torch._dynamo.reset()
        backend = functools.partial(coil_backend, options={"target": "cpp"}, taps=TapsChoice(rows_2d=rows))
        cap = Capture()
        with record_coil_graphs(cap), torch.no_grad():
            torch.testing.assert_close(torch.compile(conv, backend=backend)(x), want)
        (compiled,) = cap.coil_graphs
        sources.append(compiled.source)
        call = compiled.source.split("def call")[1]
        assert (", [1, 2], [0, 0], [1, 1], False" in call) == bool(rows), call
    assert sources[0] == sources[2] and sources[0] != sources[1]
    assert TapsChoice(rows_2d=()).cache_key() != TapsChoice().cache_key()
    assert aot_cache.key_tag(coil.Options(), TapsChoice(rows_2d=()).cache_key()) != \
        aot_cache.key_tag(coil.Options(), TapsChoice().cache_key())
