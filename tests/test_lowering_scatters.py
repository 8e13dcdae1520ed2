"""index_put lowers to a masked Reduction (and a Pointwise) instead of an Extern
while it is small (passes/lowerings/scatters.py, issue 15).

The cases run as one graph against eager on the reference, cpp and triton
targets (the interpreter) in float32, bfloat16, int64 and bool, with no Extern
left: accumulate with duplicate and negative indices, the last write winning
without accumulate, two index tensors, a leading None, a 2-d index tensor,
broadcast values, no rows.  Then: an index out of range raises eager's
IndexError; past SCATTER_WORK the Extern stays; an embedding's gradient into a
small table is one kernel with what feeds and reads it, forward and backward
through torch.compile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.ir.fused import ExternStep, FusedSchedule
from coil.ir.lowered import Reduction
from coil.ir.printer import show
from coil.passes.lowerings.scatters import SCATTER_WORK
from tests_helpers import lowered, lowered_externs as externs, make, target_available

aten = torch.ops.aten
TARGETS = ["reference", "cpp", "triton"]
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes


def puts(x: torch.Tensor, v: torch.Tensor, w: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x (4, 5), v (6, 5), w (4, 6); i, j (6,) in [-4, 4) with duplicates."""
    return (
        aten.index_put(x, [i], v, True),                             # duplicates add up, negatives wrap
        aten.index_put(x, [i], v, False),                            # the last write wins
        aten.index_put(x, [None, j], w, True),                       # along dim 1
        aten.index_put(x, [i, j], v[:, 0], True),                    # two index tensors: single elements
        aten.index_put(x, [i, j], v[:, 0], False),
        aten.index_put(x, [i.view(2, 3)], v.view(2, 3, 5), True),   # a 2-d index tensor
        aten.index_put(x, [i], v[0], True),                          # values broadcast over the rows
        aten.index_put(x, [i, j], v[:1, 0], False),                  # one value for every row
        aten.index_put(x, [i[:0]], v[:0], True),                     # no rows: x
    )


def index_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    i = torch.tensor([1, -1, 1, 0, 3, 1])
    j = torch.tensor([2, 2, -4, 4, 0, -1])
    return [make((4, 5), dtype), make((6, 5), dtype), make((4, 6), dtype), i, j]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_put_matches_eager_without_externs(dtype: torch.dtype, target: str) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    inputs = index_inputs(dtype)
    gm = make_fx(puts)(*inputs)
    g = lowered(gm, inputs, target)
    assert externs(g) == [], show(g)
    assert any(isinstance(n, Reduction) and n.op == "index_put" for n in g.nodes), show(g)
    got = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    expected = puts(*inputs)
    assert len(got) == len(expected)
    for k, (g_, e) in enumerate(zip(got, expected)):
        assert g_.dtype == e.dtype and g_.shape == e.shape, (k, g_.dtype, e.dtype, g_.shape, e.shape)
        # floats are summed in float32, eager rounds each add to the dtype: near a
        # cancellation bfloat16 differs by a few of its roundings of the addends (~2)
        tol: dict[str, Any] = ({"rtol": 0, "atol": 0} if not e.dtype.is_floating_point
                               else {"rtol": 1.6e-2, "atol": 2e-2} if e.dtype == torch.bfloat16 else {})
        torch.testing.assert_close(g_, e, **tol, msg=lambda m: f"case {k}: {m}")


@pytest.mark.parametrize("target", ["reference", "cpp"])
@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("bad", [4, -5])
def test_index_out_of_range_raises_eagers_error(bad: int, accumulate: bool, target: str) -> None:
    x, v = torch.randn(4, 3), torch.randn(2, 3)
    ok = torch.tensor([0, -4])
    gm = make_fx(lambda x, i, v: aten.index_put(x, [i], v, accumulate) * 2)(x, ok, v)
    compiled = coil.compile_graph(gm, [x, ok, v], coil.Options(target=target))
    with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension 0 with size 4"):
        compiled(x, torch.tensor([0, bad]), v)
    torch.testing.assert_close(compiled(x, ok, v)[0], aten.index_put(x, [ok], v, accumulate) * 2)


def test_past_the_work_limit_stays_extern() -> None:
    """numel(x) * rows past SCATTER_WORK: eager's scatter is cheaper."""
    rows = 16
    x = torch.randn(SCATTER_WORK // rows // 8, 8)
    for n, want in ((x.shape[0], []), (x.shape[0] + 1, ["aten.index_put.default"])):
        args = [torch.randn(n, 8), torch.randint(0, n, (rows,)), torch.randn(rows, 8)]
        gm = make_fx(lambda x, i, v: aten.index_put(x, [i], v, True))(*args)
        assert externs(lowered(gm, args)) == want


def embedding_grad(idx: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return aten.embedding_dense_backward(g.relu(), idx, 8, -1, False) * 0.5


@pytest.mark.parametrize("target", TARGETS)
def test_embedding_gradient_fuses_into_one_kernel(target: str) -> None:
    """embedding_dense_backward decomposes into an accumulating index_put into
    zeros: one kernel with the relu before it and the scale after."""
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    inputs = [torch.randint(-8, 8, (4, 6)), torch.randn(4, 6, 3)]
    gm = make_fx(embedding_grad)(*inputs)
    fused = coil.default_pipeline().run(gm, inputs, until="fuse", options=coil.Options(target=target))
    assert isinstance(fused, FusedSchedule)
    assert len(fused.kernels) == 1 and not fused_externs(fused), show(fused)
    assert "index_put" in fused.kernels[0].name
    (got,) = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    torch.testing.assert_close(got, embedding_grad(*inputs))


def fused_externs(fused: FusedSchedule) -> list[ExternStep]:
    return [s for s in fused.steps if isinstance(s, ExternStep)]


class RelativeBias(torch.nn.Module):
    """T5's relative-position bias: a small table read at bucket positions."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(8, 4)

    def forward(self, buckets: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (x + self.table(buckets).permute(2, 0, 1)).softmax(-1)


@pytest.mark.parametrize("target", TARGETS)
def test_relative_bias_training_has_no_index_put_extern(target: str, tmp_path: Path) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    torch.manual_seed(0)
    model = RelativeBias()
    buckets = torch.randint(0, 8, (16, 16))
    x = torch.randn(4, 16, 16, requires_grad=True)
    expected = model(buckets, x)
    expected.square().sum().backward()
    want = [x.grad.clone(), model.table.weight.grad.clone()]  # type: ignore[union-attr]
    x.grad = model.table.weight.grad = None
    options = {"target": target, "debug_dir": str(tmp_path / "debug"), "cache_dir": str(tmp_path / "cache"),
               "graph_cache": False}
    torch._dynamo.reset()
    got = torch.compile(model, backend="coil", options=options)(buckets, x)
    torch.testing.assert_close(got, expected)
    got.square().sum().backward()
    for t, w in zip([x.grad, model.table.weight.grad], want):
        torch.testing.assert_close(t, w, rtol=1e-4, atol=1e-4)
    texts = {p.name: (p / "00_lower.txt").read_text() for p in sorted((tmp_path / "debug").iterdir())
             if (p / "00_lower.txt").exists()}
    assert set(texts) == {"0_forward", "1_backward"}
    assert "(index_put):" in texts["1_backward"]
    assert not any("= Extern" in text for text in texts.values()), texts


def big_embedding_grad(idx: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return aten.embedding_dense_backward(g.relu(), idx, 500, 3, False) * 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("target", TARGETS)
def test_large_embedding_gradient_is_one_index_add(target: str, dtype: torch.dtype) -> None:
    """Past EMBEDDING_SCATTER_WORK the gradient is an index_add into float32
    zeros (one atomic kernel on CUDA, where an accumulating index_put sorts the
    indices first), the padding row's gradient masked out as eager does."""
    from coil.passes.lowerings.decompositions import EMBEDDING_SCATTER_WORK

    if not target_available(target):
        pytest.skip(f"{target} backend not available")
    idx = torch.randint(0, 500, (4, 32))
    idx[0, :6] = 3  # the padding index: no gradient
    idx[1, :5] = 9  # duplicates add up
    inputs = [idx, torch.randn(4, 32, 16).to(dtype)]
    assert 500 * 16 * idx.numel() > EMBEDDING_SCATTER_WORK
    gm = make_fx(big_embedding_grad)(*inputs)
    graph = lowered(gm, inputs, target)
    # aten's in-place kernel on a buffer a kernel filled with zeros: no clone inside aten
    assert externs(graph) == ["aten.index_add_.default"], show(graph)
    compiled = coil.compile_graph(gm, inputs, coil.Options(target=target))
    assert "= aten_index_add__default(" in compiled.source and "aten_index_add__default = aten_op(torch.ops.aten.index_add_.default)" in compiled.source
    assert "aten.index_add.default(" not in compiled.source
    (got,) = compiled(*inputs)
    want = big_embedding_grad(*inputs)
    assert got.dtype == want.dtype and not got[3].any()
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, want, **tol)


def test_deterministic_mode_keeps_torchs_embedding_gradient() -> None:
    """Under torch.use_deterministic_algorithms the gradient keeps torch's
    decomposition (index_put, whose CUDA kernel is deterministic)."""
    idx, g = torch.randint(0, 500, (4, 32)), torch.randn(4, 32, 16)
    gm = make_fx(big_embedding_grad)(idx, g)
    torch.use_deterministic_algorithms(True)
    try:
        graph = lowered(gm, [idx, g])
    finally:
        torch.use_deterministic_algorithms(False)
    assert externs(graph) == ["aten._unsafe_index_put.default"], show(graph)


def test_the_graph_cache_keeps_deterministic_mode_apart(tmp_path: Path) -> None:
    """A graph compiled outside deterministic mode (index_add) is not loaded from
    the cache inside it, where lower keeps torch's decomposition."""
    idx, g = torch.randint(0, 500, (4, 32)), torch.randn(4, 32, 16)
    gm = make_fx(big_embedding_grad)(idx, g)
    options = coil.Options(target="reference", cache_dir=str(tmp_path))
    assert "index_add" in coil.compile_graph(gm, [idx, g], options).source
    torch.use_deterministic_algorithms(True)
    try:
        source = coil.compile_graph(gm, [idx, g], options).source
    finally:
        torch.use_deterministic_algorithms(False)
    assert "index_add" not in source and "index_put" in source


@pytest.mark.parametrize("target", TARGETS)
def test_index_add_leaves_its_input_alone(target: str) -> None:
    """index_add adds into a copy of its input (made by a kernel): the input, read
    again afterwards, keeps its values; alpha scales the source."""
    if not target_available(target):
        pytest.skip(f"{target} backend not available")

    def f(x: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.index_add(x, 1, idx, src, alpha=3), x * 2

    inputs = [torch.randn(5, 7), torch.tensor([0, 6, 0, 2]), torch.randn(5, 4)]
    gm = make_fx(f)(*inputs)
    assert externs(lowered(gm, inputs, target)) == ["aten.index_add_.default"]
    got = coil.compile_graph(gm, inputs, coil.Options(target=target))(*inputs)
    for g, w in zip(got, f(*inputs)):
        torch.testing.assert_close(g, w)


def _tied_sum(a: torch.Tensor, b: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor]:
    """A tied embedding's gradient: the projection's (a matmul, read transposed) plus
    the embedding's (an index_add into zeros, seen through a view)."""
    table = torch.zeros(b.shape[1], a.shape[1]).index_add(0, idx, src).view(b.shape[1], a.shape[1])
    return ((a.t() @ b).t() + table,)


def test_a_sum_with_an_index_add_into_zeros_adds_into_a_copy_of_the_addend() -> None:
    """x + index_add(zeros, ...) is index_add(x, ...): the table's zeros are never
    written and the sum never read back; index_add's lowering copies x in a
    kernel and aten adds the rows into it.  Values are eager's (up to the order
    of additions where an index repeats)."""
    from coil.passes.lowerings.scatters import index_add_into_addend

    a, b = torch.randn(6, 4), torch.randn(6, 10)
    idx, src = torch.tensor([1, 7, 1, 3, 9]), torch.randn(5, 4)
    gm = make_fx(_tied_sum)(a, b, idx, src)
    new = index_add_into_addend(gm)
    assert new is not None
    targets = [n.target for n in new.graph.nodes if n.op == "call_function"]
    assert aten.zeros.default not in targets and aten.full.default not in targets, new.code
    assert aten.add.Tensor not in targets and targets.count(aten.index_add.default) == 1, new.code
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(aten.add.Tensor) == 1  # gm unchanged
    torch.testing.assert_close(new(a, b, idx, src)[0], _tied_sum(a, b, idx, src)[0])
    for target in ("cpp", "reference"):
        got = coil.compile_graph(gm, [a, b, idx, src], coil.Options(target=target, graph_cache=False))(a, b, idx, src)
        want = _tied_sum(a, b, idx, src)[0]
        torch.testing.assert_close(got[0], want)
        assert got[0].stride() == want.stride()


def test_a_tied_embeddings_training_step_matches_eager() -> None:
    """A language model whose output projection is its embedding table: the
    table's gradient is the projection's plus the embedding's, and its vocabulary
    is large enough for the index_add gradient; through torch.compile both
    gradients are eager's."""
    import torch.nn as nn

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(3000, 32)
            self.norm = nn.LayerNorm(32)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.norm(self.emb(ids))
            logits = h @ self.emb.weight.t()
            return nn.functional.cross_entropy(logits.view(-1, 3000), ids.view(-1))

    torch.manual_seed(0)
    ours, ref = Tied(), Tied()
    ref.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 3000, (4, 64))
    ids[0, :8] = 5  # repeated rows
    torch._dynamo.reset()
    f = torch.compile(ours, backend="coil", options={"target": "cpp", "eager_fallback": False, "graph_cache": False})
    f(ids).backward()
    ref(ids).backward()
    torch._dynamo.reset()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("case", ["other_reader", "two_dtypes", "nonzero_fill", "doubled"])
def test_a_sum_that_is_not_that_pattern_is_left_alone(case: str) -> None:
    from coil.passes.lowerings.scatters import index_add_into_addend

    x, idx, src = torch.randn(10, 4), torch.tensor([1, 7, 1]), torch.randn(3, 4)

    def other_reader(x, idx, src):
        t = torch.zeros(10, 4).index_add(0, idx, src)
        return x + t, t * 2

    def two_dtypes(x, idx, src):
        return (x.double() + torch.zeros(10, 4).index_add(0, idx, src),)

    def nonzero_fill(x, idx, src):
        return (x + torch.ones(10, 4).index_add(0, idx, src),)

    def doubled(x, idx, src):
        t = torch.zeros(10, 4).index_add(0, idx, src)
        return (t + t,)

    fn = {"other_reader": other_reader, "two_dtypes": two_dtypes, "nonzero_fill": nonzero_fill,
          "doubled": doubled}[case]
    assert index_add_into_addend(make_fx(fn)(x, idx, src)) is None
