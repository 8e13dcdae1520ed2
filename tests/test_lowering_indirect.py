"""Indirect reads: gather, index.Tensor, index_select and embedding as IndirectLoads
(and scatter of one element per row as a pointwise where).

Every case of INDIRECT_CASES runs through lower + realize and the reference
interpreter (the compiled targets run them from test_cpp_target and
test_triton_target) with no Extern left.  Then: the IR of a gather (golden text),
how substitution binds the indirect index when realize inlines a producer, the
verifier's rules, fusion and plan_memory never serving an indirect read from
registers, and cross_entropy: its log-softmax is never written, forward and
backward through torch.compile on every target.  (Out-of-range indices, and the
checks that catch them: test_bounds.py.)"""

from __future__ import annotations

from typing import Any, Sequence

import attrs
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.backends.reference import ReferenceHandler, loop_env
from coil.ir.buffers import BufferGraph, ComputedBuffer, ExternBuffer
from coil.ir.expr import (
    Check,
    IndexExpr,
    IndirectLoad,
    Load,
    Op,
    evaluate,
    indirect_loads,
    indsym,
    rewrite,
    substitute_symbols,
    walk,
    xsyms,
)
from coil.ir.layout import Layout
from coil.ir.printer import show
from tests_helpers import target_available
from coil.ir.schedule import StarDep
from coil.ir.verify import VerifyError, verify
from coil.ir.wrapper import Alloc
from coil.properties.invariants import InvariantError, check_all, check_indirect_reads
from golden_util import assert_golden
from op_cases import INDIRECT_CASES, OpCase, check_case_buffers, combination_id, combinations
from tests_helpers import compile_ref, run_until

TARGETS = ["reference", "cpp", "triton"]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes


@pytest.mark.parametrize("case, shape_kind, dtype", combinations(INDIRECT_CASES), ids=combination_id)
def test_indirect_case_is_an_indirect_load(case: OpCase, shape_kind: str, dtype: torch.dtype) -> None:
    _, bg = check_case_buffers(case, shape_kind, dtype)
    assert not [b.kernel for b in bg.buffers if isinstance(b, ExternBuffer)], show(bg)
    if torch.ops.aten.scatter not in case.targets:  # scatter compares positions instead
        assert any(indirect_loads(b.body) for b in bg.buffers if isinstance(b, ComputedBuffer)), show(bg)


def test_indirect_case_names_are_unique() -> None:
    names = [c.name for c in INDIRECT_CASES]
    assert len(names) == len(set(names))


# ---- golden IR ------------------------------------------------------------------------------------


def _log_softmax_gather(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.gather(x.log_softmax(1), 1, t[:, None])


def _gather_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 6), torch.tensor([0, 5, 2, 3])]


@pytest.mark.parametrize("stage", ["lower", "realize", "extract_deps"])
def test_log_softmax_gather_golden(stage: str) -> None:
    """The gather is one pointwise node; realize inlines the log-softmax into its
    indirect read (no buffer of it); the read is a StarDep of the input."""
    ir = run_until(_log_softmax_gather, _gather_inputs(), stage)
    assert_golden(f"indirect_gather_{stage}.txt", show(ir))


def test_log_softmax_is_inlined_into_the_gather() -> None:
    bg = run_until(_log_softmax_gather, _gather_inputs(), "realize")
    assert isinstance(bg, BufferGraph)
    assert [b.rule for b in bg.buffers] == ["reduction", "reduction", "output"]
    out = bg.buffers[-1]
    assert isinstance(out, ComputedBuffer)
    (ld,) = indirect_loads(out.body)
    assert ld.name == bg.inputs[0].name and ld.index == (xsyms(1)[0], indsym(0)) and ld.sizes == (6,)
    sg = run_until(_log_softmax_gather, _gather_inputs(), "extract_deps")
    assert StarDep(bg.inputs[0].name) in sg.node(out.name).read_writes.reads


# ---- substitution binds the indirect index ------------------------------------------------------


def test_substitution_turns_loads_into_indirect_loads() -> None:
    x0, x1 = xsyms(2)
    t = Check(Load("t", (x0,), torch.int64), "index", 6, 0, wrap=True)
    producer = Op("mul", (Load("a", (x1, x0), torch.float32), IndexExpr(x1 + 1, torch.float32)), torch.float32)
    out = substitute_symbols(producer, {x0: x0, x1: indsym(0)}, ((t,), (6,)))
    (ld,) = indirect_loads(out)
    assert ld == IndirectLoad("a", (indsym(0), x0), torch.float32, (t,))
    assert not [e for e in walk(out) if isinstance(e, IndexExpr) and e.expr.has(indsym(0))]
    # evaluated: a[wrap(t[i]), i] * (wrap(t[i]) + 1)
    a, tv = torch.randn(6, 3), torch.tensor([5, -1, 2])
    layouts = {"a": Layout.of(a), "t": Layout.of(tv)}
    got = evaluate(out, ReferenceHandler(loop_env((3,), (), torch.device("cpu")), {"a": a, "t": tv}, layouts,
                                         torch.device("cpu")))
    w = torch.where(tv < 0, tv + 6, tv)
    torch.testing.assert_close(got.reshape(3), a[w, torch.arange(3)] * (w + 1).float())


def test_substitution_renumbers_nested_indirect_loads() -> None:
    """A producer that already reads indirectly keeps its own ind0; the reader's
    binding becomes ind1 of the merged load."""
    (x0,) = xsyms(1)
    inner = IndirectLoad("a", (indsym(0),), torch.float32, (Check(Load("u", (x0,), torch.int64), "gather", 5),))
    v = Check(Load("v", (x0,), torch.int64), "gather", 7)
    out = substitute_symbols(inner, {x0: indsym(0)}, ((v,), (7,)))
    u_at = IndirectLoad("u", (indsym(0),), torch.int64, (v,))
    assert out == IndirectLoad("a", (indsym(0),), torch.float32, (Check(u_at, "gather", 5),))


def test_index_expression_at_an_indirect_index_reads_the_checked_value() -> None:
    """An iota inlined at an indirect position becomes Ops on the Check (the
    position it stands for), which stays in the body."""
    (x0,) = xsyms(1)
    v = Check(Load("v", (x0,), torch.int32), "index", 4, 0, wrap=True)
    out = substitute_symbols(IndexExpr(x0 * 2, torch.int64), {x0: indsym(0)}, ((v,), (4,)))
    assert isinstance(out, Op) and out.name == "mul"
    assert v in out.args


# ---- the verifier ----------------------------------------------------------------------------------


def test_verifier_rejects_an_unbound_indirect_symbol() -> None:
    g = run_until(_log_softmax_gather, _gather_inputs(), "realize")
    out = g.buffers[-1]
    (ld,) = indirect_loads(out.body)
    bad_ld = IndirectLoad(ld.name, (ld.index[0], indsym(1)), ld.dtype, ld.values)
    body = rewrite(out.body, lambda e: bad_ld if e == ld else None)
    bad = attrs.evolve(g, buffers=g.buffers[:-1] + (attrs.evolve(out, body=body),))
    with pytest.raises(VerifyError, match=f"{out.name}: B4 uses symbol ind1 outside its loops"):
        verify(bad, "realize")


def test_verifier_rejects_an_indirect_load_of_a_later_buffer() -> None:
    g = run_until(_log_softmax_gather, _gather_inputs(), "realize")
    b0 = g.buffers[0]
    (x0,) = xsyms(1)
    bad_ld = IndirectLoad("buf2", (x0, indsym(0)), torch.float32,
                          (Check(Load(g.inputs[1].name, (x0,), torch.int64), "gather", 1, 1),))
    bad = attrs.evolve(g, buffers=(attrs.evolve(b0, body=Op("add", (b0.body, bad_ld), torch.float32)),) + g.buffers[1:])
    with pytest.raises(VerifyError, match="buf0: B2 loads buf2, not an input or earlier buffer"):
        verify(bad, "realize")


def test_indirect_values_must_be_checked_integers() -> None:
    with pytest.raises(ValueError, match="must be an integer"):
        IndirectLoad("a", (indsym(0),), torch.float32, (Check(Load("f", (), torch.float32), "gather", 3),))
    with pytest.raises(ValueError, match="indirect index Load: must be an index Check"):
        IndirectLoad("a", (indsym(0),), torch.float32, (Load("i", (), torch.int64),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="indirect index Check: must be an index Check"):
        IndirectLoad("a", (indsym(0),), torch.float32, (Check(Load("i", (), torch.int64), "division"),))


# ---- fusion and memory: an indirectly read buffer is never in registers ------------------------


def _reused_then_gathered(x: torch.Tensor, z: torch.Tensor, i: torch.Tensor) -> Any:
    y = x + z  # two nontrivial reads, two full readers: realized (reuse)
    return y * 3, y.amax(1), torch.gather(y, 1, i)


def _reused_inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g), torch.randint(0, 6, (4, 6), generator=g)]


def test_indirectly_read_buffer_is_not_fused_nor_removed() -> None:
    inputs = _reused_inputs()
    w = run_until(_reused_then_gathered, inputs, "wrap")
    s = w.schedule
    bg = w.buffer_graph
    y = next(b for b in bg.buffers if b.rule == "reuse")
    gather = next(b for b in bg.buffers if isinstance(b, ComputedBuffer) and indirect_loads(b.body))
    assert indirect_loads(gather.body)[0].name == y.name
    owner = {n: k.name for k in s.kernels for n in k.nodes}
    assert owner[y.name] != owner[gather.name], show(s)
    assert y.name not in w.plan.removed
    assert any(d.verdict == "illegal" and d.reason.startswith("index") for d in s.fusion_log
               if {d.node1, d.node2} & {y.name, gather.name})
    check_all(w)
    for target in TARGETS:
        got = coil.compile_graph(make_fx(_reused_then_gathered)(*inputs), inputs, coil.Options(target=target))(*inputs)
        for a, b in zip(got, _reused_then_gathered(*inputs), strict=True):
            torch.testing.assert_close(a, b)


def test_invariant_catches_an_indirectly_read_buffer_in_registers() -> None:
    w = run_until(_reused_then_gathered, _reused_inputs(), "wrap")
    y = next(b.name for b in w.buffers if b.rule == "reuse")
    check_indirect_reads(w)
    plan = attrs.evolve(w.plan, removed=w.plan.removed | {y})
    bad = attrs.evolve(w, kernel_program=attrs.evolve(w.kernel_program, plan=plan))
    with pytest.raises(InvariantError, match=f"reads {y} indirectly, but {y} is kept in registers"):
        check_indirect_reads(bad)
    s = w.schedule
    gather = next(k for k in s.kernels if any(indirect_loads(w.get(n).body) for n in k.nodes))
    merged = attrs.evolve(gather, nodes=(y, *gather.nodes))
    plan = attrs.evolve(w.plan, schedule=attrs.evolve(s, steps=tuple(merged if st is gather else st for st in s.steps)))
    bad = attrs.evolve(w, kernel_program=attrs.evolve(w.kernel_program, plan=plan))
    with pytest.raises(InvariantError, match=f"reads {y} indirectly, but the same kernel writes it"):
        check_indirect_reads(bad)


@pytest.mark.parametrize("target", TARGETS)
def test_out_of_range_index_raises_as_eager_does(target: str) -> None:
    """An index out of range raises eager's IndexError (it used to be clamped and
    read); a negative one in range counts from the end."""
    x = torch.randn(5, 6)
    gm = make_fx(lambda x, i: x[i] * 2)(x, torch.tensor([1, 2]))
    compiled = coil.compile_graph(gm, [x, torch.tensor([1, 2])], coil.Options(target=target))
    with pytest.raises(IndexError, match="out of bounds for dimension 0 with size 5"):
        compiled(x, torch.tensor([7, -9]))
    (out,) = compiled(x, torch.tensor([4, -5]))
    torch.testing.assert_close(out, torch.stack([x[4], x[0]]) * 2)


# ---- cross_entropy ------------------------------------------------------------------------------------


def _cross_entropy(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), t)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_cross_entropy_writes_no_log_softmax(target: str, dtype: torch.dtype) -> None:
    """No buffer of N * C elements exists: the loss kernel reads logits[i, t[i]]
    once per row, next to the row's max and sum of exponentials."""
    n, c = 16, 50
    logits, t = torch.randn(n, c).to(dtype), torch.randint(0, c, (n,))
    gm = make_fx(_cross_entropy)(logits, t)
    w = coil.default_pipeline().run(gm, [logits, t], until="wrap", options=coil.Options(target=target))
    bg = w.buffer_graph
    assert not [b.name for b in bg.buffers if b.layout is not None and b.layout.numel == n * c], show(bg)
    assert not [b for b in bg.buffers if isinstance(b, ExternBuffer)], show(bg)
    assert all(ln.layout.numel < n * c for ln in w.lines if isinstance(ln, Alloc))
    check_all(w)
    compiled = coil.compile_graph(gm, [logits, t], coil.Options(target=target))
    assert "aten.gather" not in compiled.source
    torch.testing.assert_close(compiled(logits, t)[0], _cross_entropy(logits, t))


_available = target_available


@pytest.mark.parametrize("target", TARGETS)
def test_cross_entropy_forward_backward_through_torch_compile(target: str) -> None:
    if not _available(target):
        pytest.skip(f"{target} backend not built")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 30, generator=g)
    t = torch.randint(0, 30, (12,), generator=g)
    t[3] = -100  # ignore_index
    x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    f = torch.compile(_cross_entropy, backend="coil", options={"target": target})
    got, want = f(x1, t), _cross_entropy(x2, t)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x1.grad, x2.grad)


def test_cross_entropy_forward_and_backward_keep_no_extern() -> None:
    """Through AOTAutograd: the forward's gather and the backward's scatter (one
    -1 per row of a zeros tensor) are both kernels, and the backward is one kernel."""
    from torch._functorch.aot_autograd import aot_function, make_boxed_func

    programs: list[Any] = []

    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        programs.append(coil.default_pipeline().run(gm, list(example_inputs), until="wrap",
                                                    options=coil.Options(target="reference")))
        return make_boxed_func(coil.compile_graph(gm, list(example_inputs), coil.Options(target="cpp")))

    f = aot_function(_cross_entropy, fw_compiler=compiler, bw_compiler=compiler)
    logits, t = torch.randn(10, 7), torch.randint(0, 7, (10,))
    x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got, want = f(x1, t), _cross_entropy(x2, t)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x1.grad, x2.grad)
    assert len(programs) == 2
    for w in programs:
        assert not [b for b in w.buffers if isinstance(b, ExternBuffer)], show(w)
        check_all(w)
    assert len(programs[1].kernels) == 1, show(programs[1].schedule)


@pytest.mark.parametrize("target", TARGETS)
def test_embedding_forward_backward_through_torch_compile(target: str) -> None:
    if not _available(target):
        pytest.skip(f"{target} backend not built")
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = torch.nn.Embedding(20, 8)
    model = torch.nn.Embedding(20, 8)
    model.load_state_dict(eager.state_dict())
    idx = torch.randint(0, 20, (3, 5))

    def step(m: Any) -> torch.Tensor:
        out = (m(idx) * 2).tanh()
        out.sum().backward()
        return out

    want = step(eager)
    got = step(torch.compile(model, backend="coil", options={"target": target}))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(model.weight.grad, eager.weight.grad)


def test_reference_kernels_compute_the_gather() -> None:
    inputs: Sequence[torch.Tensor] = _gather_inputs()
    got = compile_ref(_log_softmax_gather, inputs)(*inputs)[0]
    torch.testing.assert_close(got, _log_softmax_gather(*inputs))
