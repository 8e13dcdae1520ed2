"""The decomposition table and the prims lowerings.

Ops without a lowering (softmax, layer_norm, activations' backward ops, losses)
arrive as pointwise ops and reductions, whether the graph comes from make_fx (which
keeps _softmax or native_layer_norm whole, so `lower` decomposes them) or from
AOTAutograd with a decomposition table (which hands coil prims.* ops).  Only
scatter (a data-dependent write) and the matrix products and convolutions stay
Extern; gather is an indirect read inside a kernel."""

from __future__ import annotations

import functools
import re
import math
from typing import Any, Callable, Mapping, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch._functorch.aot_autograd import aot_function, aot_module_simplified, make_boxed_func
from torch.fx.experimental.proxy_tensor import make_fx

from coil.backends.reference import run_buffer_graph
from coil.ir.buffers import BufferGraph, ExternBuffer
from coil.passes.lowerings import DECOMPOSITIONS, LOWERINGS
from coil.passes.lowerings.registry import find_lowering
from op_cases import (
    DECOMP_CASES,
    DECOMP_EXTERNS,
    OpCase,
    buffer_graph,
    check_case_buffers,
    combination_id,
    combinations,
)


aten = torch.ops.aten
DATA_DEPENDENT = frozenset({"aten.scatter.value"})


def _externs(bg: BufferGraph) -> set[str]:
    return {b.kernel for b in bg.buffers if isinstance(b, ExternBuffer)}


@pytest.mark.parametrize("case, shape_kind, dtype", combinations(DECOMP_CASES), ids=combination_id)
def test_decomposition_matches_eager(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    _, bg = check_case_buffers(case, shape_kind, dtype)
    allowed = DECOMP_EXTERNS.get(case.name, frozenset())
    assert _externs(bg) <= allowed, f"{case.name} fell back to Extern: {_externs(bg) - allowed}"


def test_decomp_externs_name_real_cases() -> None:
    names = [c.name for c in DECOMP_CASES]
    assert len(names) == len(set(names)) and set(DECOMP_EXTERNS) <= set(names)


# ---- make_fx keeps the composite ops whole; lower decomposes them -----------------------


@pytest.mark.parametrize(
    "fn, op",
    [
        (lambda x, w, b: torch.softmax(x, -1), aten._softmax.default),
        (lambda x, w, b: torch.log_softmax(x, 1), aten._log_softmax.default),
        (lambda x, w, b: F.layer_norm(x, (6,), w, b), aten.native_layer_norm.default),
        (lambda x, w, b: torch.var_mean(x, -1), aten.var_mean.correction),
        (lambda x, w, b: x.std(-1), aten.std.correction),
    ],
    ids=["softmax", "log_softmax", "layer_norm", "var_mean", "std"],
)
def test_make_fx_composites_lower_without_extern(fn: Callable[..., Any], op: Any) -> None:
    inputs = (torch.randn(4, 6), torch.randn(6), torch.randn(6))
    gm = make_fx(fn)(*inputs)
    assert op in [n.target for n in gm.graph.nodes], gm.code
    bg = buffer_graph(gm, inputs)
    assert not _externs(bg)
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(run_buffer_graph(bg, inputs), expected, strict=True):
        torch.testing.assert_close(got, want)


# ---- AOTAutograd: forward and backward graphs, with and without a table ------------------


def _coil_compiler(externs: set[str], graphs: list[torch.fx.GraphModule]) -> Callable[..., Any]:
    """An AOTAutograd compiler that runs the graph through lower + realize + the
    reference interpreter, recording the Externs it kept."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        graphs.append(gm)
        bg = buffer_graph(gm, example_inputs)
        externs.update(_externs(bg))

        def run(*args: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            return run_buffer_graph(bg, args)

        return make_boxed_func(run)

    return compile_graph


def _tables() -> dict[str, Mapping[Any, Any] | None]:
    from torch._inductor.decomposition import select_decomp_table

    return {"none": None, "coil": DECOMPOSITIONS, "core": core_aten_decompositions(), "inductor": select_decomp_table()}


TABLES = _tables()

# Constants are made inside the functions: AOTAutograd does not lift captured tensors.
AOT_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, 0),
    "layer_norm": lambda x: F.layer_norm(x, (6,), torch.arange(6.0) * 0.1 + 1, torch.arange(6.0) - 2),
    "var_mean": lambda x: torch.var_mean(x, -1)[0] * torch.var_mean(x, -1)[1],
    "std": lambda x: x.std(-1),
    "gelu": lambda x: F.gelu(x),
    "silu": lambda x: F.silu(x),
    "mse_loss": lambda x: F.mse_loss(x, torch.ones(4, 6)),
    "nll_loss": lambda x: F.nll_loss(x.log_softmax(1), torch.arange(4) * 7 % 6),
}


# "core" is left to the prims coverage test below: it is coil's table minus a few entries.
@pytest.mark.parametrize("table", ["none", "coil", "inductor"])
@pytest.mark.parametrize("name", list(AOT_FUNCTIONS))
def test_aot_forward_and_backward_lower_without_extern(name: str, table: str) -> None:
    fn = AOT_FUNCTIONS[name]
    externs: set[str] = set()
    graphs: list[torch.fx.GraphModule] = []
    compiler = _coil_compiler(externs, graphs)
    compiled = aot_function(fn, fw_compiler=compiler, bw_compiler=compiler, decompositions=TABLES[table])
    x = torch.randn(4, 6)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = compiled(x1), fn(x2)
    torch.testing.assert_close(out, expected)
    cotangent = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * cotangent).sum().backward()
    (expected * cotangent).sum().backward()
    # the backward graphs sum in another order than eager's kernels: float32 ulps
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    assert len(graphs) == 2  # forward and backward both went through coil
    assert externs <= DATA_DEPENDENT, externs


class _NormSoftmax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.softmax(self.norm(x), -1),)  # aot_module_simplified wants a tuple


def test_aot_module_simplified_forward_has_no_extern() -> None:
    mod = _NormSoftmax()
    x = torch.randn(4, 6)
    externs: set[str] = set()
    graphs: list[torch.fx.GraphModule] = []
    compiled = aot_module_simplified(torch.fx.symbolic_trace(mod), [x], fw_compiler=_coil_compiler(externs, graphs))
    torch.testing.assert_close(compiled(x)[0], mod(x)[0])
    assert graphs and not externs


def _fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], Any]:
    """x -> (fn(x), d sum(fn(x)) / dx), one parameter (make_fx counts defaulted ones)."""

    def run(x: torch.Tensor) -> Any:
        out = fn(x)
        return out, torch.autograd.grad(out.sum(), [x])

    return run


@pytest.mark.parametrize("table", ["coil", "core", "inductor"])
def test_prims_from_decomposed_graphs_all_have_lowerings(table: str) -> None:
    """Every prims op the tables emit for these forward + backward graphs is lowered."""
    seen: set[Any] = set()
    for fn in AOT_FUNCTIONS.values():
        gm = make_fx(_fwd_bwd(fn), decomposition_table=TABLES[table])(torch.randn(4, 6, requires_grad=True))
        seen |= {n.target for n in gm.graph.nodes if n.op == "call_function" and "prims." in str(n.target)}
    missing = {str(t) for t in seen if find_lowering(t) is None}
    assert not missing
    if table == "coil":  # the refs-based decompositions (var_mean, layer_norm) do emit prims
        assert {torch.ops.prims.var.default, torch.ops.prims.sum.default} <= seen


# ---- what stays Extern ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, inputs, kernel",
    [
        (torch.mm, (torch.randn(3, 4), torch.randn(4, 5)), "aten.mm.default"),
        (torch.bmm, (torch.randn(2, 3, 4), torch.randn(2, 4, 5)), "aten.bmm.default"),
        (lambda b, x, y: torch.addmm(b, x, y), (torch.randn(5), torch.randn(3, 4), torch.randn(4, 5)),
         "aten.addmm.default"),
        (lambda x, w: F.conv2d(x, w), (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)), "aten.convolution.default"),
    ],
    ids=["mm", "bmm", "addmm", "convolution"],
)
def test_matmul_and_convolution_stay_extern(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...],
                                            kernel: str) -> None:
    gm = make_fx(fn)(*inputs)
    bg = buffer_graph(gm, inputs)
    assert _externs(bg) == {kernel}
    (out,) = run_buffer_graph(bg, inputs)
    torch.testing.assert_close(out, fn(*inputs))


def test_extern_kernels_are_not_in_the_decomposition_table() -> None:
    for op in (aten.mm.default, aten.bmm.default, aten.addmm.default, aten.convolution.default):
        assert op not in DECOMPOSITIONS and op not in LOWERINGS


def test_batch_norm_training_updates_running_stats() -> None:
    """native_batch_norm in training decomposes to reductions plus copy_ into the
    running statistics, which eager also mutates."""
    x = torch.randn(2, 4, 3)
    stats = (torch.zeros(4), torch.ones(4))
    gm = make_fx(lambda t, m, v: F.batch_norm(t, m, v, training=True))(x, *(s.clone() for s in stats))
    mine, theirs = tuple(s.clone() for s in stats), tuple(s.clone() for s in stats)
    bg = buffer_graph(gm, (x, *mine))
    (out,) = run_buffer_graph(bg, (x, *mine))
    torch.testing.assert_close(out, F.batch_norm(x, *theirs, training=True))
    torch.testing.assert_close(mine, theirs)
    assert _externs(bg) == {"aten.copy_.default"}


# ---- AOTAutograd's joint graph: what the forward saves ------------------------------------------


@pytest.mark.parametrize(
    "make",
    [lambda: torch.randn(2, 3, 4, 5),  # contiguous
     lambda: torch.randn(2, 5, 3, 4).permute(0, 2, 3, 1),  # channels-last
     lambda: torch.randn(4, 1, 3).transpose(0, 2),  # a size-1 dim with an odd stride
     lambda: torch.randn(3, 8)[:, ::2],  # gapped: keeps the op
     lambda: torch.randn(3, 1).expand(3, 4)],  # overlapping: keeps the op
)
@pytest.mark.parametrize("op, args", [(aten.zeros_like.default, ()), (aten.ones_like.default, ()),
                                      (aten.full_like.default, (2.5,))])
def test_like_creations_decompose_to_full_with_eager_strides(make: Callable[[], torch.Tensor], op: Any,
                                                              args: tuple[Any, ...]) -> None:
    """zeros_like / ones_like / full_like as a `full` in the input's dense layout:
    eager's values and strides; where `full` cannot make the layout the op stays."""
    from coil.passes.lowerings.decompositions import AOT_ONLY_DECOMPOSITIONS

    x = make()
    got = AOT_ONLY_DECOMPOSITIONS[op](x, *args)
    want = op(x, *args)
    dense = torch._prims_common.is_non_overlapping_and_dense_or_false(x)
    assert (got is NotImplemented) == (not dense)
    if dense:
        assert got.stride() == want.stride() and got.dtype == want.dtype
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "make_self, make_src",
    [(lambda: torch.randn(2, 6, 4, 5).transpose(1, 2), lambda: torch.randn(2, 4, 6, 5)),  # transposed self
     (lambda: torch.randn(4, 5), lambda: torch.randn(5, 4).t()),  # contiguous self, transposed src
     (lambda: torch.randn(2, 5, 3, 4).permute(0, 2, 3, 1), lambda: torch.randn(3, 4, 5)),  # channels-last, broadcast
     (lambda: torch.randn(2, 3, 1).transpose(0, 1), lambda: torch.randn(3, 2, 1)),  # a size-1 dim
     (lambda: torch.randn(3, 4, 5, dtype=torch.float64), lambda: torch.randn(3, 4, 5)),  # a dtype change
     (lambda: torch.randn(4, 1).expand(4, 5), lambda: torch.randn(4, 5)),  # overlapping: contiguous, as eager
     (lambda: torch.randn(2, 8, 4, 5).transpose(1, 2)[:, :, :3], lambda: torch.randn(2, 4, 3, 5)),  # gapped
     (lambda: torch.randn(()), lambda: torch.randn(()))],
)
def test_copy_decomposition_lays_the_result_out_as_eager(make_self: Callable[[], torch.Tensor],
                                                         make_src: Callable[[], torch.Tensor]) -> None:
    """Functional copy(self, src) gives src's values in self's layout: a dense
    self's strides exactly, a gapped one's order densely (every view of eager's
    result fits it), an expanded one contiguous, as eager's copy does."""
    from coil.passes.lowerings.decompositions import copy

    self, src = make_self(), make_src()
    got, want = copy(self, src), aten.copy.default(self, src)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if torch._prims_common.is_non_overlapping_and_dense_or_false(want):
        assert got.stride() == want.stride()
    else:  # eager keeps the gaps: the same order, dense
        order = sorted(range(want.dim()), key=lambda d: -want.stride()[d])
        assert sorted(range(got.dim()), key=lambda d: -got.stride()[d]) == order and got.is_contiguous() == (
            order == sorted(order))


def _sliding_chunk_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Longformer's sliding-window scores in small: zeros filled through slices,
    viewed and transposed, masked in place and added to; its backward views the
    gradient of the transposed tensor, which holds only in eager's layout."""
    b, h, w = 2, 4, 4
    chunked = torch.einsum("bcxd,bcyd->bcxy", q, k)  # (b * h, chunks, 2w, 2w)
    diag = chunked.new_zeros((b * h, 3, w, 2 * w + 1))
    diag[:, :-1, :, w:] = chunked[:, :, :w, : w + 1]
    diag[:, -1, :, w:] = chunked[:, -1, w:, : w + 1]
    diag[:, 1:, :, :w] = chunked[:, :, -(w + 1):-1, w:2 * w]
    diag = diag.view(b, h, 3 * w, 2 * w + 1).transpose(2, 1)
    beg = diag[:, :w, :, : w + 1]
    beg.masked_fill_(torch.ones(w, w + 1).tril().flip(0)[None, :, None, :] == 1, -1e4)
    diag += torch.zeros(b, 3 * w, 1, 2 * w + 1)
    return diag.softmax(-1)


def test_a_backward_that_views_a_copy_into_a_transposed_tensor_compiles() -> None:
    """The backward of in-place writes into a transposed view copies a gradient
    into the transposed layout and then views it: with the copy's result laid out
    as src (a contiguous gradient) instead of as self, AOTAutograd's trace failed
    (`Cannot view a tensor with shape ... as ...`; Longformer's training step).
    Now the step compiles and its gradients match eager's."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(8, 2, 8, 16, generator=gen, requires_grad=True)
    k = torch.randn(8, 2, 8, 16, generator=gen, requires_grad=True)
    want = _sliding_chunk_scores(q, k)
    want.pow(2).sum().backward()
    want_grads = (q.grad.clone(), k.grad.clone())
    q.grad = k.grad = None
    torch._dynamo.reset()
    try:
        got = torch.compile(_sliding_chunk_scores, backend="coil", options={"target": "cpp"})(q, k)
        got.pow(2).sum().backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want)
    for g, e in zip((q.grad, k.grad), want_grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cross_entropy_forward_saves_logits_and_row_statistics(dtype: torch.dtype) -> None:
    """A language-model loss (logits upcast, cross_entropy) in training: the
    forward saves the logits and two float32 numbers a row, as Inductor's does,
    not the float32 log-softmax (in bf16 twice the logits' bytes; in float32 as
    many, but the forward would write it all); the backward recomputes it inside
    its kernel.  Gradients match eager's.  In float32 this needs nll_loss_forward
    decomposed in the joint graph (AOT_ONLY_DECOMPOSITIONS): whole, it made the
    partitioner save the log-softmax."""
    import coil.backends.dynamo as dyn

    vocab = 1000
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []
    real = dyn._partition_fn()

    def spy(joint: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        fw, bw = real(joint, inputs, *args, **kwargs)
        outs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        saved.extend((tuple(o.meta["val"].shape), o.meta["val"].dtype) for o in outs[1:]
                     if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor))
        return fw, bw

    def f(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = (h @ w).float()
        return F.cross_entropy(logits.view(-1, vocab), labels.view(-1))

    h = torch.randn(4, 16, 64, dtype=dtype, requires_grad=True)
    w = torch.randn(64, vocab, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (4, 16))
    torch._dynamo.reset()
    orig = dyn._partition_fn
    dyn._partition_fn = lambda options=None: spy  # type: ignore[assignment]
    try:
        loss = torch.compile(f, backend="coil")(h, w, labels)
        loss.backward()
    finally:
        dyn._partition_fn = orig  # type: ignore[assignment]
        torch._dynamo.reset()
    got = (loss.detach(), h.grad, w.grad)
    h.grad = w.grad = None
    want_loss = f(h, w, labels)
    want_loss.backward()
    for g, e in zip(got, (want_loss.detach(), h.grad, w.grad)):
        torch.testing.assert_close(g.float(), e.float(), atol=2e-2, rtol=2e-2)
    assert ((64, vocab), dtype) in saved, saved  # the logits
    assert saved.count(((64, 1), torch.float32)) == 2, saved  # each row's max and log of its sum
    assert len([shape for shape, _ in saved if shape == (64, vocab)]) == 1, saved  # and no log-softmax
    assert ((64, 1), torch.float32) in saved, saved


def test_a_decomposition_is_traced_once_for_every_node_that_asks_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """passes/lower.py keeps each traced decomposition by its op, device and
    arguments' shapes, strides and dtypes: two softmaxes of one shape and one of
    another make two traces, and the lowered graph prints as it does with every
    node traced afresh."""
    import collections

    import coil
    from coil.ir.printer import show
    from coil.passes import lower as lower_mod

    def fn(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1) + torch.softmax(y, -1) + torch.softmax(z, -1).sum()

    inputs = [torch.randn(4, 8), torch.randn(4, 8), torch.randn(2, 5)]
    gm = make_fx(fn)(*inputs)
    traced: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    monkeypatch.setattr(lower_mod, "_TRACED", traced)
    calls: list[Any] = []
    real = lower_mod.trace_decomposition
    monkeypatch.setattr(lower_mod, "trace_decomposition", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    opts = coil.Options(target="reference")
    cached = coil.default_pipeline().run(gm, inputs, until="lower", options=opts)
    assert len(calls) == 2 and len(traced) == 2
    coil.default_pipeline().run(gm, inputs, until="lower", options=opts)
    assert len(calls) == 2  # the second compile traced nothing
    monkeypatch.setattr(lower_mod, "_trace_key", lambda *a: None)
    fresh = coil.default_pipeline().run(gm, inputs, until="lower", options=opts)
    assert len(calls) == 5
    assert show(cached) == show(fresh)


def _calls(graph: torch.fx.Graph) -> list[Any]:
    return [n.target for n in graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("op", ["batch_norm_backward", "sigmoid_backward", "layer_norm_backward", "batch_norm_training"])
def test_the_recorder_traces_a_decomposition_as_make_fx_does(op: str) -> None:
    """passes/lower.py records a decomposition on meta tensors with a plain dispatch
    mode: the same aten calls, in the same order, as make_fx's trace of it, with the
    CompositeImplicitAutograd ops make_fx decomposes (sigmoid_backward's conj_physical)
    decomposed, each call's value kept, and a tuple result's elements read through
    getitem."""
    from coil.passes import lower as lower_mod
    from coil.passes.lowerings import DECOMPOSITIONS

    m = functools.partial(torch.empty, device="meta")
    cl = torch.empty_strided((2, 6, 5, 5), (150, 1, 30, 6), device="meta")
    cases: dict[str, tuple[Any, tuple[Any, ...]]] = {
        "batch_norm_backward": (aten.native_batch_norm_backward.default,
                                (cl, cl, m(6), m(6), m(6), m(6), m(6), True, 1e-5, [True, True, True])),
        "sigmoid_backward": (aten.sigmoid_backward.default, (m(4, 3), m(4, 3))),
        "layer_norm_backward": (aten.native_layer_norm_backward.default,
                                (m(4, 8), m(4, 8), [8], m(4, 1), m(4, 1), m(8), m(8), [True, True, True])),
        "batch_norm_training": (aten._native_batch_norm_legit_functional.default,
                                (cl, m(6), m(6), m(6), m(6), True, 0.1, 1e-5)),
    }
    target, args = cases[op]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]

    def run(*ts: torch.Tensor) -> Any:
        it = iter(ts)
        return DECOMPOSITIONS[target](*[next(it) if isinstance(a, torch.Tensor) else a for a in args])

    recorded = lower_mod._record(run, tensors)
    assert recorded is not None
    assert _calls(recorded) == _calls(make_fx(run)(*tensors).graph)
    assert aten.conj_physical.default not in _calls(recorded)
    for n in recorded.nodes:
        if n.op != "output":
            assert "val" in n.meta, n


def test_the_recorder_leaves_to_make_fx_what_comes_from_outside_the_trace() -> None:
    """A tensor the trace did not make (a constant the decomposition built outside
    any op) is make_fx's to trace: the recorder gives up (returns None, and
    trace_decomposition then calls make_fx)."""
    from coil.passes import lower as lower_mod

    outside = torch.empty(3, device="meta")

    def run(x: torch.Tensor) -> torch.Tensor:
        return x + outside

    assert lower_mod._record(run, [torch.empty(3, device="meta")]) is None


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("mask", [(True, True, True), (False, True, True), (False, False, True)])
def test_a_convolution_bias_gradient_summed_apart_matches_aten(transposed: bool, mask: tuple[bool, ...]) -> None:
    """bias_gradient_apart (what the joint graph takes on a GPU): the bias gradient
    as a sum over every dim but the channels, and aten's kernel asked for the other
    two only; all three as aten's own convolution_backward gives them."""
    from coil.passes.lowerings.decompositions import bias_gradient_apart

    torch.manual_seed(0)
    x = torch.randn(2, 6, 9, 9)
    w = torch.randn(6, 4, 3, 3) if transposed else torch.randn(4, 3, 3, 3)  # transposed: in=6, out=4*groups
    groups = 1 if transposed else 2
    out = torch.ops.aten.convolution(x, w, torch.randn(4 if transposed else 4), [2, 2], [1, 1], [1, 1], transposed,
                                     [1, 1] if transposed else [0, 0], groups)
    dy = torch.randn_like(out)
    args = (dy, x, w, [4], [2, 2], [1, 1], [1, 1], transposed, [1, 1] if transposed else [0, 0], groups, list(mask))
    want = aten.convolution_backward.default(*args)
    got = bias_gradient_apart(*args)
    for g, e, m in zip(got, want, mask):
        assert (g is None) == (not m)
        if m:
            torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


def test_the_joint_graph_sums_a_convolution_bias_gradient_apart_off_the_cpu() -> None:
    """Traced with the backend's table: off the CPU (meta tensors here; a GPU's on
    the device) the backward asks aten's convolution_backward for no bias gradient
    and sums it itself; on the CPU the op stays whole with all three."""
    from coil.backends.dynamo import aot_decompositions

    def step(x, w, b):
        y = torch.nn.functional.conv2d(x, w, b, padding=1)
        return torch.autograd.grad(y.square().sum(), (x, w, b))

    for device in ("cpu", "meta"):
        args = [torch.randn(2, 3, 8, 8, device=device, requires_grad=True),
                torch.randn(4, 3, 3, 3, device=device, requires_grad=True),
                torch.randn(4, device=device, requires_grad=True)]
        gm = make_fx(step, decomposition_table=aot_decompositions())(*args)
        masks = [n.args[-1] for n in gm.graph.nodes if n.target is aten.convolution_backward.default]
        sums = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList and list(n.args[1]) == [0, 2, 3]]
        assert masks == ([[True, True, True]] if device == "cpu" else [[True, True, False]])
        assert len(sums) == (device == "meta")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_convolution_bias_gradient_is_a_kernel_of_coil_on_cuda() -> None:
    """A conv -> GELU training step through the backend on CUDA: the backward's
    convolution_backward computes no bias gradient (its mask's last entry is
    False), a Triton kernel of coil sums it, and the gradients are eager's."""
    from bench.variants import Capture, record_coil_graphs

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3, padding=1).cuda()

    def step(x):
        return torch.nn.functional.gelu(conv(x)).square().mean()

    x = torch.randn(4, 8, 16, 16, device="cuda")
    step(x).backward()
    want = [conv.weight.grad.clone(), conv.bias.grad.clone()]
    conv.zero_grad()
    cap = Capture()
    with record_coil_graphs(cap):
        torch.compile(step, backend="coil", options={"target": "triton"})(x).backward()
    torch.testing.assert_close([conv.weight.grad, conv.bias.grad], want, atol=1e-4, rtol=1e-4)
    backward = cap.coil_graphs[-1].source
    assert "[True, True, False]" in backward or "[False, True, False]" in backward
    assert ", True])" not in backward.split("def call")[1]


# ---- long grouped conv1d by taps (conv_taps.py) -----------------------------------------------


@pytest.mark.parametrize("b, c, o, t, k, groups, pad", [
    (2, 32, 32, 40, 32, 4, 16),  # Wav2Vec2's shape in small: padding k/2, one frame more out
    (3, 16, 24, 50, 33, 8, 0),  # odd taps, no padding, more outputs than inputs a group
    (2, 16, 16, 37, 40, 2, 39),  # the most padding (k - 1)
])
def test_a_long_grouped_conv1d_by_taps_matches_aten_forward_and_backward(
        b: int, c: int, o: int, t: int, k: int, groups: int, pad: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """conv_taps' forward and its three gradients, with chunks of 5 taps (so the
    last chunk is short), are aten's convolution and convolution_backward in
    float64; a chunk's columns fit CHUNK_BYTES."""
    from coil.passes.lowerings import conv_taps

    torch.manual_seed(0)
    x = torch.randn(b, c, t, dtype=torch.float64)
    w = torch.randn(o, c // groups, k, dtype=torch.float64)
    bias = torch.randn(o, dtype=torch.float64)
    args = ([1], [pad], [1], False, [0], groups)
    want = aten.convolution.default(x, w, bias, *args)
    tout = want.shape[-1]
    monkeypatch.setattr(conv_taps, "CHUNK_BYTES", b * c * tout * 8 * 5)
    assert conv_taps.taps_a_chunk(b, c, tout, k, 8) == 5
    torch.testing.assert_close(conv_taps.by_taps(x, w, bias, *args), want)
    dy = torch.randn_like(want)
    for mask in ([True, True, True], [False, True, False], [True, False, False]):
        theirs = aten.convolution_backward.default(dy, x, w, [o], *args, mask)
        mine = conv_taps.backward_by_taps(dy, x, w, [o], *args, mask)
        for m, e, on in zip(mine, theirs, mask):
            assert (m is None) == (not on)
            if on:
                torch.testing.assert_close(m, e)


@pytest.mark.parametrize("case", ["few taps", "one group", "strided", "dilated", "2-d", "transposed"])
def test_convolutions_by_taps_does_not_take_stay_whole(case: str) -> None:
    """Short kernels (cuDNN is fast there), ungrouped ones (already one GEMM),
    strides, dilations, 2-D and transposed convolutions stay aten's."""
    from coil.passes.lowerings import conv_taps

    x, w = torch.randn(2, 32, 40), torch.randn(32, 8, 32)
    stride, dilation, transposed, groups = [1], [1], False, 4
    if case == "few taps":
        w = torch.randn(32, 8, conv_taps.LONG_TAPS - 1)
    elif case == "one group":
        w, groups = torch.randn(32, 32, 32), 1
    elif case == "strided":
        stride = [2]
    elif case == "dilated":
        dilation = [2]
    elif case == "2-d":
        x, w = torch.randn(2, 32, 40, 40), torch.randn(32, 8, 32, 32)
    else:
        transposed = True
    assert conv_taps.by_taps(x, w, None, stride, [0], dilation, transposed, [0], groups) is NotImplemented


@pytest.mark.parametrize("faster", ["taps", "aten", "taps forward only"])
def test_the_joint_graph_takes_a_long_grouped_conv1d_by_taps_where_it_measures_faster(
        faster: str, caplog: pytest.LogCaptureFixture) -> None:
    """Traced with the backend's table, a training step of Wav2Vec2's positional
    convolution (grouped, 128 taps) on a timed device (here the meta device, with a
    timer that answers as told) has each of its two convolutions by taps (bmm)
    where the timer says taps are faster, aten's where not; each choice is logged
    with both times, and asked once a shape.  On the CPU both stay aten's, untimed."""
    from coil.backends.dynamo import aot_decompositions
    from coil.passes.lowerings import conv_taps

    asked: list[int] = []

    def timer(whole: Callable[[], Any], taps: Callable[[], Any]) -> tuple[float, float]:
        asked.append(1)
        forward = len(asked) == 1
        wins = faster == "taps" or (faster == "taps forward only" and forward)
        return (2.0, 1.0) if wins else (1.0, 2.0)

    taps = conv_taps.TapsChoice(timer, ("cuda", "meta"))

    def step(x, w, b):
        y = torch.nn.functional.conv1d(x, w, b, padding=64, groups=16)
        return torch.autograd.grad(torch.nn.functional.gelu(y).square().sum(), (x, w, b))

    for device in ("cpu", "meta", "meta"):
        args = [torch.randn(2, 64, 48, device=device, requires_grad=True),
                torch.randn(64, 4, 128, device=device, requires_grad=True),
                torch.randn(64, device=device, requires_grad=True)]
        with caplog.at_level("INFO", logger="coil"):
            gm = make_fx(step, decomposition_table=aot_decompositions(taps))(*args)
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        whole = {t for t in targets if t in (aten.convolution.default, aten.convolution_backward.default)}
        if device == "cpu" or faster == "aten":
            assert whole == {aten.convolution.default, aten.convolution_backward.default}
        elif faster == "taps":
            assert not whole and aten.bmm.default in targets
        else:
            assert whole == {aten.convolution_backward.default} and aten.bmm.default in targets
    assert len(asked) == 2  # the forward and the backward, once each: the second trace asked none
    # kept by this handler, one answer each for the meta device's forward and backward (the CPU's untimed)
    assert sorted((k[-2], k[-1]) for k in taps.answers) == [("meta", False), ("meta", True)]
    logged = [r.getMessage() for r in caplog.records if "grouped conv1d" in r.getMessage()]
    forward_said = "aten's 1.000 ms, by taps 2.000 ms: aten's" if faster == "aten" else \
        "aten's 2.000 ms, by taps 1.000 ms: by taps"
    backward_said = "aten's 2.000 ms, by taps 1.000 ms: by taps" if faster == "taps" else \
        "aten's 1.000 ms, by taps 2.000 ms: aten's"
    assert len(logged) == 2 and forward_said in logged[0] and "backward" not in logged[0]
    assert "backward" in logged[1] and backward_said in logged[1]


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_a_training_step_by_taps_compiles_and_matches_eager(target: str) -> None:
    """The joint graph by taps (conv_taps' functions in the table, so on the CPU),
    compiled by coil: its kernels (the pad and columns, the chunks' sum) and the
    bmm Externs give eager's output and gradients."""
    from coil import compile_graph
    from coil.backends.dynamo import aot_decompositions
    from coil.options import Options
    from coil.passes.lowerings import conv_taps

    table = aot_decompositions() | {aten.convolution.default: conv_taps.by_taps,
                                    aten.convolution_backward.default: conv_taps.backward_by_taps}

    def step(x, w, b):
        y = torch.nn.functional.conv1d(x, w, b, padding=32, groups=8)
        return (y,) + torch.autograd.grad(torch.nn.functional.gelu(y).square().sum(), (x, w, b))

    torch.manual_seed(0)
    args = [torch.randn(2, 32, 24, requires_grad=True), torch.randn(32, 4, 64, requires_grad=True) * 0.1,
            torch.randn(32, requires_grad=True)]
    gm = make_fx(step, decomposition_table=table)(*args)
    assert not any(n.target is aten.convolution.default for n in gm.graph.nodes)
    plain = [a.detach() for a in args]
    got = compile_graph(gm, plain, Options(target=target, graph_cache=False))(*plain)
    torch.testing.assert_close(list(got), list(step(*args)), atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_normed_positional_conv_runs_by_taps_on_cuda(dtype: torch.dtype) -> None:
    """Wav2Vec2's positional convolution (weight norm, 16 groups, 128 taps, padding
    64, GELU) trained through the backend on CUDA, with the timer answering "by
    taps" (at this size cuDNN may well be faster): neither compiled graph calls a
    convolution, and the output and gradients are as close to float64's as eager's
    are, within 2x by RMSE (eager's cuDNN convolution takes TF32 in float32)."""
    import copy
    import functools

    from bench.variants import Capture, record_coil_graphs
    from coil.backends.dynamo import coil_backend
    from coil.passes.lowerings import conv_taps

    backend = functools.partial(coil_backend, taps=conv_taps.TapsChoice(lambda whole, taps: (2.0, 1.0)))
    torch.manual_seed(0)
    conv = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Conv1d(256, 256, 128, padding=64, groups=16), name="weight", dim=2).to("cuda", dtype)
    conv64 = copy.deepcopy(conv).double()

    def run(module: torch.nn.Module, x: torch.Tensor, compiled: bool = False) -> list[torch.Tensor]:
        x = x.detach().clone().requires_grad_(True)
        module.zero_grad()

        def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.nn.functional.gelu(module(x)[..., :-1])
            return y, y.double().square().sum()

        fn = torch.compile(step, backend=backend, options={"target": "triton", "graph_cache": False}) if compiled \
            else step
        y, loss = fn(x)
        loss.backward()
        return [y.detach().double(), x.grad.double()] + [p.grad.double() for p in module.parameters()]

    x = torch.randn(4, 256, 96, device="cuda", dtype=dtype)
    ref, eager = run(conv64, x.double()), run(conv, x)
    cap = Capture()
    with record_coil_graphs(cap):
        got = run(conv, x, compiled=True)

    def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a - b).square().mean().sqrt().item()

    for g, e, r in zip(got, eager, ref):
        assert rmse(g, r) <= 2 * rmse(e, r) + 1e-6 * r.abs().max().item()
    sources = [g.source for g in cap.coil_graphs]
    assert len(sources) == 2 and all("convolution" not in s for s in sources)
    assert all("bmm" in s for s in sources)


@pytest.mark.parametrize("target", ["triton", "cpp"])
def test_fuse_keeps_each_chunks_columns_apart_so_one_chunk_is_held_at_a_time(
        target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunks' column copies all read the input, so fuse would merge them into
    one kernel run before the first bmm, holding every chunk's columns at once.
    Its memory rule refuses that (each chunk writes 62 MiB, read by its own bmm
    alone; fused they save the 2 MiB input's reads): the planned peak is about one
    chunk's columns.  With the rule off, the two large chunks fuse and the peak
    holds both."""
    import coil
    from coil.options import Options
    from coil.passes import fuse as fuse_mod
    from coil.passes.lowerings import conv_taps

    table = {aten.convolution.default: conv_taps.by_taps}
    x, w = torch.randn(2, 256, 1024), torch.randn(256, 16, 64)
    gm = make_fx(lambda x, w: (F.conv1d(x, w, padding=32, groups=16),), decomposition_table=table)(x, w)
    assert conv_taps.taps_a_chunk(2, 256, 1025, 64, 4) == 31  # chunks of 31, 31 and 2 taps
    opts = Options(target=target, graph_cache=False)
    mib = 1 << 20

    def plan() -> tuple[Any, Any]:
        return (coil.default_pipeline().run(gm, (x, w), until="fuse", options=opts),
                coil.default_pipeline().run(gm, (x, w), until="plan_memory", options=opts))

    fs, mp = plan()
    refused = [d for d in fs.fusion_log if d.verdict == "refused" and d.reason.startswith("memory:")]
    assert refused and "would be written before" in refused[0].reason
    assert 62 * mib < mp.peak_bytes < 2 * 62 * mib
    monkeypatch.setattr(fuse_mod, "HOIST_BYTES", 1 << 60)
    fs_off, mp_off = plan()
    assert len(fs_off.kernels) < len(fs.kernels) and mp_off.peak_bytes > 2 * 62 * mib


def test_a_training_step_by_taps_saves_no_columns_for_the_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight's gradient takes its columns of grad_output, so the joint graph
    holds no second copy of the forward's columns to merge with them, and the
    partitioner (coil's, around min-cut) saves nothing larger than the input for
    the backward.  With columns of x in the backward, AOTAutograd's CSE made them
    the forward's, and the partitioner saved every chunk's (it saves what a
    backward's bmm reads): Wav2Vec2's small training step planned 268 MiB of saved
    tensors in the positional convolution's graph, 15 now."""
    from torch._functorch.aot_autograd import aot_function

    from coil.backends.dynamo import _partition_fn, aot_decompositions
    from coil.passes.lowerings import conv_taps

    table = aot_decompositions() | {aten.convolution.default: conv_taps.by_taps,
                                    aten.convolution_backward.default: conv_taps.backward_by_taps}
    b, c, t, k = 2, 32, 40, 32
    monkeypatch.setattr(conv_taps, "CHUNK_BYTES", b * c * (t + 1) * 4 * 8)  # 4 chunks of 8 taps, each 8x x
    saved: list[torch.Size] = []

    def forward(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        saved.extend(o.meta["val"].shape for o in outs[1:] if isinstance(o.meta.get("val"), torch.Tensor))
        return make_boxed_func(gm.forward)

    fn = aot_function(lambda x, w: F.gelu(F.conv1d(x, w, padding=16, groups=4)), fw_compiler=forward,
                      bw_compiler=lambda gm, _: make_boxed_func(gm.forward), decompositions=table,
                      partition_fn=_partition_fn())
    x = torch.randn(b, c, t, requires_grad=True)
    w = torch.randn(c, c // 4, k, requires_grad=True)
    fn(x, w).sum().backward()
    assert saved and max(math.prod(s) for s in saved) <= 2 * x.numel()
    torch.testing.assert_close(w.grad, torch.autograd.grad(F.gelu(F.conv1d(x, w, padding=16, groups=4)).sum(), w)[0],
                               atol=1e-3, rtol=1e-3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_choice_by_taps_is_timed_on_the_gpu_once_a_shape(caplog: pytest.LogCaptureFixture) -> None:
    """A TapsChoice on CUDA times both forms of the forward and of the backward
    (positive times, logged), and a second ask of the same shape is answered from
    what it kept, untimed.  Which form wins is the GPU's business: not asserted."""
    from coil.passes.lowerings import conv_taps

    taps = conv_taps.TapsChoice()
    x = torch.empty(4, 256, 96, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(256, 16, 128, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level("INFO", logger="coil"):
        for backward in (False, True, False, True):
            assert isinstance(taps.taken(x, w, 64, 16, backward), bool)
    logged = [r.getMessage() for r in caplog.records if "grouped conv1d" in r.getMessage()]
    assert len(logged) == 2 and len(taps.answers) == 2
    for line in logged:
        whole, taps = (float(m) for m in re.findall(r"(\d+\.\d+) ms", line))
        assert whole > 0 and taps > 0


@pytest.mark.parametrize("taps_faster", [True, False])
def test_the_choice_runs_both_forms_outside_the_trace_and_the_step_matches_eager(
        taps_faster: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Through torch.compile on the CPU (a timed device of the TapsChoice bound to
    the backend here, the cpp target): AOTAutograd traces with fake tensors, and
    the choice runs both forms of the forward and of the backward for real on
    random tensors (its timer calls them and checks they agree); the step then
    matches eager whichever form the timer names.  A timer that raises keeps
    aten's convolution, with a warning; a TapsChoice that does not time the CPU
    keeps it untimed."""
    import functools

    from coil.backends.dynamo import coil_backend
    from coil.passes.lowerings import conv_taps

    called: list[str] = []

    def timer(whole: Callable[[], Any], taps: Callable[[], Any]) -> tuple[float, float]:
        a, b = whole(), taps()
        mine = [t for t in (b if isinstance(b, tuple) else (b,)) if t is not None]
        theirs = [t for t in (a if isinstance(a, tuple) else (a,)) if t is not None]
        torch.testing.assert_close(mine, theirs, atol=1e-3, rtol=1e-3)
        called.append(type(mine[0]).__name__)
        return (2.0, 1.0) if taps_faster else (1.0, 2.0)

    backend = functools.partial(coil_backend, taps=conv_taps.TapsChoice(timer, ("cpu",)))
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(64, 64, 48, padding=24, groups=8)

    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(conv(x)).square().sum()

    x = torch.randn(2, 64, 40, requires_grad=True)
    step(x).backward()
    want = [x.grad.clone(), conv.weight.grad.clone(), conv.bias.grad.clone()]
    x.grad = None
    conv.zero_grad()
    torch._dynamo.reset()
    with caplog.at_level("INFO", logger="coil"):
        torch.compile(step, backend=backend, options={"target": "cpp", "graph_cache": False})(x).backward()
    torch.testing.assert_close([x.grad, conv.weight.grad, conv.bias.grad], want, atol=1e-3, rtol=1e-3)
    assert called == ["Tensor", "Tensor"]  # forward, then backward: real tensors, not fake ones
    logged = [r.getMessage() for r in caplog.records if "grouped conv1d" in r.getMessage()]
    assert len(logged) == 2 and all(("by taps" if taps_faster else "aten's") in m.split(": ")[-1] for m in logged)

    def broken(whole: Callable[[], Any], taps: Callable[[], Any]) -> tuple[float, float]:
        raise RuntimeError("out of memory")

    kept = conv_taps.TapsChoice(broken, ("cpu",))
    assert kept.taken(torch.empty(2, 64, 41), conv.weight, 24, 8, backward=False) is False
    assert "timing it by taps failed (RuntimeError: out of memory)" in caplog.text
    assert conv_taps.TapsChoice(timer).taken(torch.empty(2, 64, 41), conv.weight, 24, 8, False) is False  # CPU: untimed
    assert len(called) == 2


# ---- 1-d convolutions as 2-d convolutions of one row (conv_taps.conv1d_as_2d) -------------------


@pytest.mark.parametrize("stride, padding, dilation, groups, bias", [
    (5, 0, 1, 1, False),  # Wav2Vec2's first feature layer
    (2, 1, 1, 1, True),  # Whisper's second convolution
    (1, 3, 2, 4, True),  # dilated, grouped
])
def test_a_1d_convolution_as_a_2d_one_of_one_row_is_atens(stride: int, padding: int, dilation: int, groups: int,
                                                         bias: bool) -> None:
    """conv1d_as_2d is aten's 1-d convolution (float64), strided, padded, dilated and
    grouped, with and without a bias; its result has the 1-d result's size."""
    from coil.passes.lowerings import conv_taps

    torch.manual_seed(0)
    x, w = torch.randn(2, 8, 40, dtype=torch.float64), torch.randn(12, 8 // groups, 3, dtype=torch.float64)
    b = torch.randn(12, dtype=torch.float64) if bias else None
    want = aten.convolution.default(x, w, b, [stride], [padding], [dilation], False, [0], groups)
    got = conv_taps.conv1d_as_2d(x, w, b, [stride], [padding], [dilation], [0], groups)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("rows_2d", [("cpu",), ()])
def test_the_joint_graph_traces_a_1d_convolution_as_a_2d_one_on_the_rows_2d_devices(
        rows_2d: tuple[str, ...]) -> None:
    """Traced with the backend's table, a training step's conv1d is a 2-d
    convolution of unsqueezed input and weight on a device in rows_2d (its backward
    stays the 1-d convolution_backward, which the layout pass leaves as it is), and
    the 1-d convolution elsewhere; a transposed one stays 1-d.  A long grouped conv1d
    that the timer says runs faster by taps still goes by taps."""
    from coil.backends.dynamo import aot_decompositions
    from coil.passes.lowerings import conv_taps

    def step(x, w, wt, wp):
        y = F.conv_transpose1d(F.gelu(F.conv1d(x, w, stride=2)), wt)
        z = F.conv1d(y, wp, padding=16, groups=4)
        return torch.autograd.grad(z.square().sum(), (w, wt, wp))

    args = [torch.randn(2, 8, 40), torch.randn(8, 8, 3, requires_grad=True), torch.randn(8, 8, 3, requires_grad=True),
            torch.randn(8, 2, conv_taps.LONG_TAPS, requires_grad=True)]
    taps = conv_taps.TapsChoice(lambda whole, by_taps: (2.0, 1.0), ("cpu",), rows_2d=rows_2d)
    gm = make_fx(step, decomposition_table=aot_decompositions(taps))(*args)
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    ranks = sorted((len(n.args[0].meta["val"].shape), n.args[6]) for n in convs)  # (rank, transposed)
    assert ranks == ([(3, True), (4, False)] if rows_2d else [(3, False), (3, True)])
    assert aten.bmm.default in [n.target for n in gm.graph.nodes]  # the long grouped one, by taps
    assert all(len(n.args[0].meta["val"].shape) == 3 for n in gm.graph.nodes
               if n.target is aten.convolution_backward.default)


def test_a_1d_convolution_stack_runs_channels_last_on_the_cpp_target() -> None:
    """Wav2Vec2's feature encoder in small (conv1d, GroupNorm, GELU, two strided
    conv1d with GELU) through the backend on the CPU: in inference its convolutions
    after the first (whose one input channel is either layout) are 2-d ones that
    give channels-last results (the layout pass; the C++ target's training keeps
    eager's layouts, channels_last_training), and inference and a training step
    give eager's output and gradients."""
    from bench.variants import Capture, record_coil_graphs
    from coil.ir.buffers import ExternBuffer

    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Conv1d(1, 16, 10, stride=5, bias=False), torch.nn.GroupNorm(16, 16),
                              torch.nn.GELU(), torch.nn.Conv1d(16, 16, 3, stride=2, bias=False), torch.nn.GELU(),
                              torch.nn.Conv1d(16, 16, 2, stride=2, bias=False), torch.nn.GELU())
    x = torch.randn(2, 1, 400)
    want = enc(x)
    want.square().sum().backward()
    grads = [p.grad.clone() for p in enc.parameters()]
    enc.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(enc, backend="coil", options={"target": "cpp", "graph_cache": False})
    cap = Capture()
    with record_coil_graphs(cap), torch.no_grad():
        torch.testing.assert_close(compiled(x), want, atol=1e-5, rtol=1e-5)
    bg = cap.coil_graphs[0].module.buffer_graph
    convs = [b.layout for b in bg.buffers if isinstance(b, ExternBuffer) and b.kernel == "aten.convolution.default"]
    assert [c.size[2] for c in convs] == [1, 1, 1]
    assert [c.stride for c in convs[1:]] == [(39 * 16, 1, 39 * 16, 16), (19 * 16, 1, 19 * 16, 16)]
    got = compiled(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close([p.grad for p in enc.parameters()], grads, atol=1e-4, rtol=1e-4)
