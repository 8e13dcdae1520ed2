"""Data-dependent (unbacked) sizes: with capture_dynamic_output_shape_ops, Dynamo keeps
nonzero, masked_select and x[mask] in the graph, their results sized by a symbol
(`u0`) that only the run knows.  coil runs the op as an Extern, `call` binds `u0`
from its result (and checks its range), and the kernels after it take `u0` like any
size, 0 included.  With capture_scalar_outputs, an `.item()` used as a size is one
too: its Extern returns the number, and `call` binds `u0 = buf0` from it.

Each case runs at inputs that select no element, one, and many, on every target;
the counters say coil compiled the graph (none ran eagerly) and the results match
eager."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
import sympy
import torch
from torch._dynamo.utils import counters

from coil.ir.shapes import SymbolFacts, ShapeInfo, gt, is_size_symbol, le, lower_bound, size_symbol, unbacked_symbol
from coil.options import Options
from tests_helpers import compiled_counted
from coil.passes.fuse import _kind, _merged_group
from coil.ir.fused import KernelKind

TARGETS = ["cpp", "reference", "triton"]  # triton on CPU tensors: the interpreter (tests/conftest.py)


@pytest.fixture(autouse=True)
def capture_data_dependent_ops() -> Iterator[None]:
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        yield
    torch._dynamo.reset()


def _selecting(k: int, shape: tuple[int, ...] = (4, 3)) -> torch.Tensor:
    """An input of `shape` with exactly k positive elements (k < 0: random, about half)."""
    if k < 0:
        return torch.randn(shape)
    x = -torch.rand(shape) - 0.5
    x.view(-1)[torch.randperm(x.numel())[:k]] = torch.rand(k) + 0.75
    return x


def _nonzero(x: torch.Tensor) -> Any:
    idx = torch.nonzero(x > 0)
    return idx * 2 + 1, (idx.float() * 2).sum(0)


def _masked_select(x: torch.Tensor) -> Any:
    return torch.masked_select(x, x > 0) * 2 + 1


def _bool_index(x: torch.Tensor) -> Any:
    return x[x > 0].exp().sum()


def _size_only(x: torch.Tensor) -> Any:
    # a kernel that reads nothing of nonzero's result, only its size: it must still run after it
    idx = torch.nonzero(x.sin() > 0)
    return torch.arange(idx.shape[0], dtype=torch.float32) * 3 + 1, idx


CASES: dict[str, Callable[[torch.Tensor], Any]] = {
    "nonzero": _nonzero, "masked_select": _masked_select, "bool_index": _bool_index, "size_only": _size_only,
}


_compiled = compiled_counted


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_data_dependent_sizes_compile_once_and_match_eager(case: str, target: str) -> None:
    fn = CASES[case]
    f = _compiled(fn, target)
    for k in (0, 1, -1, 12):  # no element selected, one, about half, all
        x = _selecting(k)
        torch.testing.assert_close(f(x), fn(x))
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


@pytest.mark.parametrize("target", TARGETS)
def test_data_dependent_sizes_under_dynamic_shapes(target: str) -> None:
    """Backed sizes (s0) and data-dependent ones (u0) in one graph: u0 has no upper
    bound then, so its reductions loop (softmax's over u0 + 1 elements too)."""
    def fn(x: torch.Tensor) -> Any:
        idx = torch.nonzero(x > 0)
        return ((idx.float() * 2).sum(0), x[x > 0].exp().sum(), torch.masked_select(x, x < 0) * 2,
                x[x > 0].softmax(0))

    f = _compiled(fn, target, dynamic=True)
    for b, k in [(2, 0), (5, 1), (16, -1), (9, 27)]:
        x = _selecting(k, (b, 3))
        torch.testing.assert_close(f(x), fn(x))
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def _capture(fn: Callable[..., Any], x: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The inference graph and example inputs torch.compile hands a backend."""
    from torch._dynamo.backends.common import aot_autograd

    got: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=keep))(x)
    return got[0]


def test_wrapper_binds_u0_after_its_extern_and_checks_its_range() -> None:
    import coil
    from coil.ir.printer import show

    gm, example = _capture(_nonzero, _selecting(3))
    w = coil.default_pipeline().run(gm, example, until="wrap", options=Options(target="cpp"))
    assert "# size u0 in [0, 12] hint 12 unbacked" in show(w)
    src = coil.default_pipeline().run(gm, example, options=Options(target="cpp")).source
    lines = [ln.strip() for ln in src[src.index("def call"):].splitlines()]
    bind = lines.index("u0 = buf1.size()[0]")
    assert lines[bind - 1].startswith("buf1 = aten_nonzero_default(")
    assert lines[bind + 1].startswith("if not 0 <= u0 <= 12: raise RuntimeError")
    assert all("u0" not in ln for ln in lines[:bind])
    calls = [ln for ln in lines if ln.startswith("cpp_fused")]
    assert calls[-1].endswith(", u0)")  # the kernel after it takes u0 as an argument


def test_asserts_proved_by_ranges_are_dropped_others_run() -> None:
    """torch._check(u0 >= 2) narrows u0's range: the assert is dropped, the range
    checked where u0 is bound (eager raises, coil too).  u0 <= s0 is no range: it
    stays, an Extern that runs _assert_scalar."""
    def narrowed(x: torch.Tensor) -> Any:
        idx = torch.nonzero(x > 0)
        torch._check(idx.shape[0] >= 2)
        return idx * 2

    f = _compiled(narrowed, "cpp")
    x = _selecting(5)
    torch.testing.assert_close(f(x), narrowed(x))
    x = _selecting(1)
    with pytest.raises(RuntimeError):
        narrowed(x)
    with pytest.raises(RuntimeError, match="outside the range 2..12"):
        f(x)

    def relation(x: torch.Tensor) -> Any:
        idx = torch.nonzero(x > 0)
        torch._check(idx.shape[0] <= x.shape[0])
        return idx * 2

    f = _compiled(relation, "cpp", dynamic=True)
    x = _selecting(2, (5, 3))
    torch.testing.assert_close(f(x), relation(x))
    x = _selecting(7, (5, 3))
    with pytest.raises(RuntimeError, match="u0 <= s"):
        f(x)
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def test_unbacked_symbols_are_sizes_that_may_be_zero() -> None:
    u0, s0 = unbacked_symbol(0), size_symbol(0)
    assert is_size_symbol(u0) and is_size_symbol(s0)
    assert lower_bound(u0) == 0 and lower_bound(2 * u0 + s0) == 2 and lower_bound(s0 * u0) == 0
    assert not gt(u0, 0) and not gt(u0, 1) and gt(s0, 1) and not le(u0, 1)
    # a row of u0 elements is reduced (looped: no bound), never taken as one element
    o = Options(target="cpp")
    assert _kind((2, u0), o) is KernelKind.REDUCTION
    bounded = ShapeInfo((SymbolFacts(u0, 12, 0, 12, backed=False),))
    assert _kind((2, u0), o, bounded) is KernelKind.PERSISTENT
    assert _kind((2, 1), o) is KernelKind.POINTWISE and _kind((2, 0), o) is KernelKind.POINTWISE
    # the pointwise producer of a reduction over u0 fuses with it
    assert _merged_group((2, u0), (2 * u0, 1)) == (2, u0)
    assert _merged_group((2, u0), (2 * s0, 1)) is None
    # inside a loop over u0 elements, u0 >= 1: x % u0 is x there
    from coil.ir.indexing import ModularIndexing, simplify_index

    r0 = sympy.Symbol("r0", integer=True, nonnegative=True)
    assert simplify_index(ModularIndexing(r0, 1, u0), {r0: u0}) == r0


def _item_head(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
    k = n.item()
    torch._check(k >= 0)
    torch._check(k <= x.shape[0])
    return x[:k].sum(0) * 2, torch.arange(k) * 2, x.new_full((k,), 1.5).cumsum(0)


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_an_item_used_as_a_size_is_bound_from_its_extern(target: str) -> None:
    """`.item()` of an int tensor used as a size (before: `returns SymInt, not a
    tensor`, and the graph ran eagerly): the Extern's number is the size u0, bound
    right after it and checked against the range torch._check gave it."""
    import coil
    from coil.ir.printer import show

    got: list[Any] = []

    def grab(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        got.append((gm, inputs))
        return gm.forward

    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    torch.compile(_item_head, backend=aot_autograd(fw_compiler=grab))(torch.randn(6, 4), torch.tensor(3))
    gm, inputs = got[0]
    opts = Options(target=target, graph_cache=False)
    text = show(coil.default_pipeline().run(gm, inputs, until="realize", options=opts))
    assert "ExternBuffer aten._local_scalar_dense.default(arg0_1) -> the size u0" in text, text
    source = coil.compile_graph(gm, inputs, opts).source
    assert "    u0 = buf0\n    if not 0 <= u0 <= 6: raise RuntimeError" in source, source
    fn = compiled_counted(_item_head, target)
    for k in (3, 0, 6, 1):
        x, n = torch.randn(6, 4), torch.tensor(k)
        torch.testing.assert_close(fn(x, n), _item_head(x, n))
    assert counters["coil"]["compiled"] >= 1 and not counters["coil"]["eager"], dict(counters["coil"])


def _trained(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A training step through data-dependent sizes: the backward's inputs (the
    gradient of `x[x > 0]`, the saved indices of nonzero) are sized by u0."""
    sel = x[x > 0]
    picked = w[torch.nonzero(x.sum(1) > 0)[:, 0]]
    return (sel.exp() * w.sum()).sum() + torch.masked_select(x.sin(), x < 0).square().sum() + picked.tanh().sum()


@pytest.mark.parametrize("target", TARGETS)
def test_training_through_data_dependent_sizes_compiles_the_backward(target: str) -> None:
    """The backward of a graph with data-dependent sizes takes u0 as an input's
    size (before: `input size u0 depends on data`, and it ran eagerly): `call`
    reads it from that input on entry.  One forward and one backward compiled, for
    every count of selected elements, none included."""
    f = _compiled(_trained, target)
    for k in (0, 1, -1, 12):
        x, w = _selecting(k), torch.randn(4, 5)
        x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
        x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
        want = _trained(x1, w1)
        want.backward()
        got = f(x2, w2)
        got.backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(x2.grad, x1.grad)
        torch.testing.assert_close(w2.grad, w1.grad)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 2 and counters["coil"]["eager"] == 0, dict(counters["coil"])


def test_a_backward_reads_u0_from_its_inputs_size_on_entry() -> None:
    import coil
    from coil.ir.printer import show
    from torch._dynamo.backends.common import aot_autograd

    got: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def grab(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        got.append((gm, list(inputs)))
        return gm.forward

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x[x > 0].exp() * 2).sum()

    torch._dynamo.reset()
    x = _selecting(5).requires_grad_()
    torch.compile(fn, backend=aot_autograd(fw_compiler=lambda gm, inputs: gm.forward, bw_compiler=grab))(x)
    gm, inputs = got[0]
    opts = Options(target="cpp", graph_cache=False)
    text = show(coil.default_pipeline().run(gm, inputs, until="wrap", options=opts))
    assert "unbacked from an input" in text, text
    src = coil.compile_graph(gm, inputs, opts).source
    body = [ln.strip() for ln in src[src.index("def call"):].splitlines()]
    names = [n.strip() for n in body[1].split("=")[0].split(",")]  # the unpacked inputs
    reads = [ln for ln in body if ln.startswith("u0 = ")]
    assert len(reads) == 1, src
    # read from an input (the SymInt AOTAutograd saved, or a tensor's size) before anything runs,
    # its range checked as where an Extern's result binds it
    assert reads[0].split(" = ")[1].split(".size()")[0] in names, src
    at = body.index(reads[0])
    assert body[at + 1].startswith("if not 0 <= u0 <= 12: raise RuntimeError"), src
    assert at < min(k for k, ln in enumerate(body) if ln.startswith(("cpp_fused", "buf")))
