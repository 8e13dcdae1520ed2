"""Errors eager raises are raised by compiled code too (issue 14, item 7).

An index out of range raises what eager raises for its op, and a negative one
wraps where eager wraps it (x[idx]) and raises where eager does not (gather,
index_select, embedding, nll_loss); integer //, %, fmod and trunc division by
zero raise RuntimeError("ZeroDivisionError") on the CPU, as eager does, while
float division by zero stays inf and nan.  Each case runs through
torch.compile(backend="coil") on the cpp and reference targets and on triton
under the interpreter, out of range (the error) and in range (eager's values).

Then the decision itself, in the printed IR: a Check the value ranges prove
(an arange, a clamp, a remainder) prints "proven" and emits no test; an index
loaded from a tensor prints "checked".  value_range is sound on drawn programs.
The cpp target reads its error word only after kernels that check.  On CUDA
(skipped here) a failed check is a device-side assert, run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any, Callable, Sequence

import pytest
import sympy
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.backends.reference import ReferenceHandler, loop_env
from coil.ir.bounds import load_in_bounds, runtime_checks, value_range
from coil.ir.buffers import BufferGraph, ComputedBuffer, ExternBuffer
from coil.ir.expr import Check, Constant, Expr, IndexExpr, Load, Op, evaluate, walk, xsyms
from coil.ir.layout import Layout
from coil.ir.module import CompiledModule
from coil.ir.printer import show

TARGETS = ["cpp", "reference", "triton"]
HAS_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked-off lanes


def compiled(fn: Callable[..., Any], target: str) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="coil", options={"target": target})


def buffer_graph(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], fake: bool = True) -> BufferGraph:
    """Traced on fake tensors by default: eager would raise on an index out of range."""
    gm = make_fx(fn, tracing_mode="fake" if fake else "real")(*inputs)
    bg = coil.default_pipeline().run(gm, list(inputs), until="realize", options=coil.Options(target="reference"))
    assert isinstance(bg, BufferGraph)
    return bg


def checks_of(bg: BufferGraph) -> list[Check]:
    return [e for b in bg.buffers if isinstance(b, ComputedBuffer) for e in walk(b.body) if isinstance(e, Check)]


# ---- out of range: each op raises eager's error -------------------------------------------------

_x = torch.randn(4, 3)
_w = torch.tensor([0.5, 2.0, 1.0])


def _nll(reduction: str, weight: torch.Tensor | None = None) -> Callable[..., torch.Tensor]:
    def fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(x.log_softmax(1), t, weight=weight, reduction=reduction)

    return fn


def _cross_entropy(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(x, t)


def _gather(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x.gather(1, i) * 2


def _embedding(w: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return F.embedding(i, w) + 1


def _index(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x[i] * 3


def _index_two(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    return x[i, j]


def _index_dim1(x: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    return x[:, j]


# name, fn, fixed leading inputs, a bad last input, eager's error and a word of its
# message, good last inputs (negative ones in range where eager accepts them)
RAISE_CASES: list[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...], torch.Tensor, type, str,
                        list[torch.Tensor]]] = [
    ("cross_entropy", _cross_entropy, (torch.randn(4, 2),), torch.tensor([0, 1, 5, 1]), IndexError,
     "Target .*out of bounds", [torch.tensor([0, 1, 1, 0]), torch.tensor([0, -100, 1, -100])]),
    ("cross_entropy_negative", _cross_entropy, (torch.randn(4, 2),), torch.tensor([0, -1, 1, 1]), IndexError,
     "Target .*out of bounds", [torch.tensor([1, 1, 0, 0])]),
    ("nll_loss_none", _nll("none"), (_x,), torch.tensor([0, 3, 1, 2]), IndexError, "Target .*out of bounds",
     [torch.tensor([2, 0, -100, 1])]),
    ("nll_loss_sum_weight", _nll("sum", _w), (_x,), torch.tensor([0, 1, 1, 7]), IndexError,
     "Target .*out of bounds", [torch.tensor([2, 0, -100, 1])]),
    ("nll_loss_mean_weight", _nll("mean", _w), (_x,), torch.tensor([-2, 1, 1, 0]), IndexError,
     "Target .*out of bounds", [torch.tensor([2, 0, 1, 1])]),
    ("gather", _gather, (_x,), torch.tensor([[0], [3], [1], [1]]), RuntimeError,
     "index 3 is out of bounds for dimension 1 with size 3|out of bounds", [torch.tensor([[0], [2], [1], [1]])]),
    ("gather_negative", _gather, (_x,), torch.tensor([[0], [-1], [1], [1]]), RuntimeError, "out of bounds",
     [torch.tensor([[2], [2], [0], [1]])]),
    ("embedding", _embedding, (_x,), torch.tensor([[0, 4]]), IndexError, "out of range",
     [torch.tensor([[0, 3], [2, 1]])]),
    ("embedding_negative", _embedding, (_x,), torch.tensor([[0, -1]]), IndexError, "out of range",
     [torch.tensor([[3, 3]])]),
    ("index_select_dim0", lambda x, i: x.index_select(0, i), (_x,), torch.tensor([0, 4]), IndexError,
     "out of range", [torch.tensor([3, 0, 3])]),
    ("index_select_dim0_negative", lambda x, i: x.index_select(0, i), (_x,), torch.tensor([-1]), IndexError,
     "out of range", [torch.tensor([1])]),
    ("index_select_dim1", lambda x, i: x.index_select(1, i), (_x,), torch.tensor([0, 3]), RuntimeError,
     "out of DATA bounds", [torch.tensor([2, 0])]),
    ("index_select_dim1_negative", lambda x, i: x.index_select(1, i), (_x,), torch.tensor([-1, 0]), RuntimeError,
     "out of DATA bounds", [torch.tensor([1, 1])]),
    ("index", _index, (_x,), torch.tensor([0, 4]), IndexError, "out of bounds for dimension 0 with size 4",
     [torch.tensor([0, -1, -4, 3])]),
    ("index_negative", _index, (_x,), torch.tensor([1, -5]), IndexError, "out of bounds for dimension 0 with size 4",
     [torch.tensor([-2, 2])]),
    ("index_dim1", _index_dim1, (_x,), torch.tensor([1, -4]), IndexError, "out of bounds .*with size 3",
     [torch.tensor([-3, 2, -1])]),
    ("index_two_tensors", _index_two, (_x, torch.tensor([0, 3])), torch.tensor([1, 3]), IndexError,
     "out of bounds for dimension 1 with size 3", [torch.tensor([-1, 2])]),
]


def _case_id(c: tuple[Any, ...]) -> str:
    return str(c[0])


@pytest.mark.parametrize("case", RAISE_CASES, ids=_case_id)
def test_each_out_of_range_case_is_a_checked_read(case: tuple[Any, ...]) -> None:
    """The case compiles to coil's own kernels (no Extern that would raise by
    itself), with a run-time check."""
    _, fn, lead, bad, _, _, good = case
    bg = buffer_graph(fn, [*lead, good[0]], fake=False)  # the weight of nll_loss is a real tensor
    assert not [b for b in bg.buffers if isinstance(b, ExternBuffer)], show(bg)
    assert any(c.checked and c.kind == "index" for c in checks_of(bg)), show(bg)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", RAISE_CASES, ids=_case_id)
def test_out_of_range_raises_eagers_error(case: tuple[Any, ...], target: str) -> None:
    name, fn, lead, bad, error, word, good = case
    with pytest.raises(error):
        fn(*lead, bad)
    # reads are exact; a loss sums in its own order
    tol: dict[str, Any] = {} if name.startswith(("cross", "nll")) else {"rtol": 0, "atol": 0}
    f = compiled(fn, target)
    for g in good:
        torch.testing.assert_close(f(*lead, g), fn(*lead, g), **tol)
    with pytest.raises(error, match=word):
        f(*lead, bad)
    torch.testing.assert_close(f(*lead, good[0]), fn(*lead, good[0]), **tol)  # the channel is clean again


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_a_training_cross_entropy_raises_nll_losss_error(target: str) -> None:
    """In training AOTAutograd decomposes nll_loss_forward (so the partitioner saves
    the logits, not the log-softmax): its gather's check still raises eager's
    IndexError for a bad target, not gather's RuntimeError.  Gradients match."""
    def f(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(x * 2, t)

    torch._dynamo.reset()
    g = torch.compile(f, backend="coil", options={"target": target, "eager_fallback": False, "graph_cache": False})
    x = torch.randn(4, 3, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    g(x, torch.tensor([0, 1, 2, 1])).backward()
    f(ref, torch.tensor([0, 1, 2, 1])).backward()
    torch.testing.assert_close(x.grad, ref.grad)
    with pytest.raises(IndexError, match=r"^Target 5 is out of bounds\.$"):
        g(x, torch.tensor([0, 1, 5, 1]))
    with pytest.raises(IndexError, match=r"^Target -1 is out of bounds\.$"):
        g(x, torch.tensor([0, -1, 2, 1]))
    torch._dynamo.reset()


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_the_error_names_the_bad_value(target: str) -> None:
    f = compiled(_cross_entropy, target)
    with pytest.raises(IndexError, match=r"^Target 5 is out of bounds\.$"):
        f(torch.randn(4, 2), torch.tensor([0, 1, 5, 1]))
    g = compiled(_gather, target)
    with pytest.raises(RuntimeError, match=r"^index -1 is out of bounds for dimension 1 with size 3$"):
        g(_x, torch.tensor([[0], [-1], [1], [1]]))


@pytest.mark.parametrize("target", TARGETS)
def test_a_large_parallel_loss_raises_on_its_one_bad_target(target: str) -> None:
    """cross_entropy over many rows (the C++ kernel's rows run on several threads;
    Triton's in several programs): the one bad target at the end is found."""
    n, c = 4096 if target != "triton" else 600, 100
    logits, t = torch.randn(n, c), torch.randint(0, c, (n,))
    f = compiled(_cross_entropy, target)
    torch.testing.assert_close(f(logits, t), _cross_entropy(logits, t))
    t[-1] = c
    with pytest.raises(IndexError, match="Target .*out of bounds"):
        f(logits, t)


@pytest.mark.parametrize("target", TARGETS)
def test_a_read_that_ignores_the_index_still_checks_it(target: str) -> None:
    """x.expand(4, 3)[i] reads x[0, j] whatever i is (the index's position is a
    broadcast dim): eager still raises on i, so the check stays (keep_checks)."""
    fn = lambda x, i: x.expand(4, 3)[i]  # noqa: E731
    x = torch.randn(1, 3)
    bg = buffer_graph(fn, [x, torch.tensor([0, 3])])
    (buf,) = bg.buffers
    assert isinstance(buf, ComputedBuffer) and isinstance(buf.body, Op) and buf.body.name == "where", show(bg)
    assert [c.status for c in checks_of(bg)] == ["checked"]
    f = compiled(fn, target)
    torch.testing.assert_close(f(x, torch.tensor([-4, 3])), fn(x, torch.tensor([-4, 3])))
    with pytest.raises(IndexError, match="out of bounds"):
        f(x, torch.tensor([0, 4]))


def test_triton_tail_lanes_do_not_trip_the_check() -> None:
    """Lanes past the end of a block load 0 for the index, and 0 - 1 is out of
    range: the assert must only look at lanes that exist (37 elements, blocks of
    a power of two)."""
    fn = lambda x, i: x.gather(1, i - 1)  # noqa: E731
    x, i = torch.randn(37, 5), torch.randint(1, 6, (37, 1))
    f = compiled(fn, "triton")
    torch.testing.assert_close(f(x, i), fn(x, i))
    i[20, 0] = 0
    with pytest.raises(RuntimeError, match="out of bounds"):
        f(x, i)


def test_interpreter_options_are_restored_after_a_failed_check() -> None:
    from triton.runtime import interpreter

    before = interpreter.interpreter_builder.options
    f = compiled(_gather, "triton")
    with pytest.raises(RuntimeError):
        f(_x, torch.tensor([[0], [3], [1], [1]]))
    assert interpreter.interpreter_builder.options == before


# ---- integer division by zero ------------------------------------------------------------------

DIVISIONS: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = [
    ("floordiv", lambda a, b: a // b),
    ("div_floor", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    ("div_trunc", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    ("remainder", lambda a, b: a % b),
    ("fmod", lambda a, b: torch.fmod(a, b)),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("name, fn", DIVISIONS, ids=[d[0] for d in DIVISIONS])
def test_integer_division_by_zero_raises(name: str, fn: Callable[..., torch.Tensor], dtype: torch.dtype,
                                         target: str) -> None:
    a = torch.tensor([7, -7, 9, -9, 0, 5], dtype=dtype)
    good, bad = torch.tensor([2, 2, -4, -4, 3, 1], dtype=dtype), torch.tensor([2, 0, 3, 1, 1, 1], dtype=dtype)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, bad)
    f = compiled(fn, target)
    torch.testing.assert_close(f(a, good), fn(a, good), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, bad)


@pytest.mark.parametrize("target", TARGETS)
def test_integer_division_by_a_zero_scalar_raises(target: str) -> None:
    fn = lambda a: a % 0  # noqa: E731
    f = compiled(fn, target)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(torch.tensor([3, 4]))


@pytest.mark.parametrize("target", TARGETS)
def test_float_division_by_zero_stays_inf_and_nan(target: str) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a / b, a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")

    a, b = torch.tensor([1.0, -1.0, 0.0, 3.0]), torch.tensor([0.0, 0.0, 0.0, 2.0])
    for got, want in zip(compiled(fn, target)(a, b), fn(a, b), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)


# ---- the decision, in the printed IR -------------------------------------------------------------


def _body_text(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> str:
    bg = buffer_graph(fn, inputs)
    (buf,) = [b for b in bg.buffers if isinstance(b, ComputedBuffer)]
    return "\n".join(ln.strip() for ln in show(bg).splitlines() if ln.startswith("    "))


def test_an_arange_index_is_proven() -> None:
    text = _body_text(lambda x: x[torch.arange(3)] + x[torch.arange(3) - 2], [torch.randn(4, 3)])
    assert text == textwrap.dedent("""\
        t0: int64 = index x0
        t1: int64 = check(t0 in [0, 4) wrap, index dim 0): proven, range [0, 2]
        t2: float32 = load x_1[ind0, x1] with ind0=t1
        t3: int64 = sub(t0, 2)
        t4: int64 = check(t3 in [0, 4) wrap, index dim 0): proven, range [-2, 0]
        t5: float32 = load x_1[ind0, x1] with ind0=t4
        t6: float32 = add(t2, t5)
        return t6""")


def test_an_arange_past_the_end_keeps_its_check() -> None:
    text = _body_text(lambda x: x[torch.arange(5)], [torch.randn(4, 3)])
    assert "check(t0 in [0, 4) wrap, index dim 0): checked, range [0, 4]" in text


def test_a_clamped_gather_is_proven_and_a_loaded_one_checked() -> None:
    x, i = torch.randn(4, 3), torch.tensor([[0], [5], [1], [-1]])
    text = _body_text(lambda x, i: x.gather(1, i.clamp(0, 2)), [x, i])
    assert text == textwrap.dedent("""\
        t0: int64 = load i_1[x0, 0]
        t1: int64 = maximum(t0, 0)
        t2: int64 = minimum(t1, 2)
        t3: int64 = check(t2 in [0, 3), gather dim 1): proven, range [0, 2]
        t4: float32 = load x_1[x0, ind0] with ind0=t3
        return t4""")
    assert "check(t2 in [0, 3), gather dim 1): checked, range [0, 3]" in _body_text(
        lambda x, i: x.gather(1, i.clamp(0, 3)), [x, i])
    assert "check(t0 in [0, 3), gather dim 1): checked, range any int64" in _body_text(
        lambda x, i: x.gather(1, i), [x, i])
    assert "check(t1 in [0, 3), gather dim 1): proven, range [0, 2]" in _body_text(
        lambda x, i: x.gather(1, i % 3), [x, i])


def test_divisor_checks_print_their_decision() -> None:
    a, b = torch.tensor([5, 7]), torch.tensor([2, 1])
    assert "check(t1 != 0, division): checked, range any int64" in _body_text(lambda a, b: a // b, [a, b])
    assert "check(t2 != 0, division): proven, range [1, 9223372036854775807]" in _body_text(
        lambda a, b: a // b.clamp(min=1), [a, b])
    # a nonzero constant divisor needs no check at all
    assert "check" not in _body_text(lambda a: a // 3 + a % -2, [a])


def test_the_lowering_leaves_every_check_to_be_decided() -> None:
    """lower makes each Check "checked" with no range; realize decides."""
    x = torch.randn(4, 3)
    g = coil.default_pipeline().run(make_fx(lambda x: x[torch.arange(3)])(x), [x], until="lower")
    (c,) = [e for n in g.nodes if hasattr(n, "body") for e in walk(n.body) if isinstance(e, Check)]
    assert (c.status, c.range) == ("checked", None)


def test_cpp_reads_the_error_word_only_after_kernels_that_check() -> None:
    x, i = torch.randn(4, 3), torch.tensor([[0], [2], [1], [1]])

    def source(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> str:
        return str(coil.compile_graph(make_fx(fn)(*inputs), list(inputs), coil.Options(target="cpp")).source)

    def checks(src: str) -> bool:  # the scalar form, or the reductions of an `omp simd` loop (LoopCheck)
        kernel = src.split("extern \"C\" void cpp_fused")[1]
        return "coil_check_index(" in kernel or "coil_fail(" in kernel

    checked = source(lambda x, i: x.gather(1, i), [x, i])
    assert checked.count("if _cpp_err[0]: _cpp_build.raise_check(_cpp_err)") == 1
    assert checks(checked)
    proven = source(lambda x, i: x.gather(1, i.clamp(0, 2)), [x, i])
    assert "_cpp_err[0]" not in proven and not checks(proven)
    assert "_cpp_err[0]" not in source(lambda x: x + 1, [x])


@pytest.mark.parametrize("reduce", [False, True], ids=["pointwise", "softmax"])
def test_cpp_checks_in_a_vector_loop_are_reductions(reduce: bool) -> None:
    """A position that varies along the innermost loop (T5's bucket gather) is
    checked without a branch (LoopCheck): the loop vectorises, the largest bad
    position is reported after it as eager's error, and in range the values are
    eager's."""
    table = torch.randn(32)

    def fn(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        y = x + table[i]
        return torch.softmax(y, -1) if reduce else y * 2

    x = torch.randn(4, 64)
    good = torch.randint(0, 32, (4, 64))
    c = coil.compile_graph(make_fx(fn)(x, good), [x, good], coil.Options(target="cpp"))
    kernel = c.source.split("extern \"C\" void cpp_fused")[1]
    assert "coil_check_index(" not in kernel and "reduction(max:chk" in kernel
    torch.testing.assert_close(c(x, good)[0], fn(x, good))
    for bad, value in ((40, 40), (-40, -40)):
        i = good.clone()
        i[2, 17] = bad
        with pytest.raises(IndexError, match=f"^index {value} is out of bounds for dimension 0 with size 32$"):
            fn(x, i)
        with pytest.raises(IndexError, match=f"^index {value} is out of bounds for dimension 0 with size 32$"):
            c(x, i)


# ---- value ranges are sound ----------------------------------------------------------------------


@st.composite
def _int_expr(draw: st.DrawFn, depth: int = 0) -> Expr:
    """A small integer body over x0 in [0, 6) and x1 in [0, 5): loads of data,
    iotas, constants and the ops value_range knows."""
    x0, x1 = xsyms(2)
    dt = torch.int64
    if depth >= 3 or draw(st.integers(0, 3)) == 0:
        kind = draw(st.sampled_from(["load", "index", "const"]))
        if kind == "load":
            return Load(draw(st.sampled_from(["a", "b"])), (x0, x1), dt)
        if kind == "index":
            a, b, c = (draw(st.integers(-n, n)) for n in (3, 3, 5))
            return IndexExpr(a * x0 + b * x1 + c, dt)
        return Constant(draw(st.integers(-7, 7)), dt)
    name = draw(st.sampled_from(["add", "sub", "mul", "maximum", "minimum", "neg", "abs", "where", "floordiv",
                                 "truncdiv", "remainder", "fmod", "bitwise_and", "relu", "sign"]))
    a = draw(_int_expr(depth + 1))
    if name in ("neg", "abs", "relu", "sign"):
        return Op(name, (a,), dt)
    b = draw(_int_expr(depth + 1))
    if name == "where":
        return Op("where", (Op("lt", (a, b), torch.bool), a, b), dt)
    if name in ("floordiv", "truncdiv", "remainder", "fmod"):
        b = Check(Op("add", (Op("abs", (b,), dt), Constant(1, dt)), dt), "division")
    return Op(name, (a, b), dt)


@settings(max_examples=300, deadline=None)
@given(_int_expr(), st.integers(0, 2**32 - 1))
def test_value_range_holds_every_value(expr: Expr, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    scale = [10, 1000, 2**40][seed % 3]
    data = {n: torch.randint(-scale, scale, (6, 5), generator=g) for n in ("a", "b")}
    ranges = dict(zip(xsyms(2), (6, 5)))
    r = value_range(expr, ranges)
    assert r is not None
    layouts = {n: Layout.of(t) for n, t in data.items()}
    got = evaluate(expr, ReferenceHandler(loop_env((6, 5), (), torch.device("cpu")), data, layouts,
                                          torch.device("cpu")))
    assert int(got.min()) >= r[0] and int(got.max()) <= r[1], (r, got)


@st.composite
def _masked_load(draw: st.DrawFn) -> tuple[Load, tuple[int, int]]:
    """A load of a (4, 5) tensor over x0 in [0, 6), x1 in [0, 5) at a shifted
    index, masked by drawn tests: comparisons of a symbol with a constant (the
    kind the analysis reads), and others it must not trust (an or, a test of
    an expression)."""
    x0, x1 = xsyms(2)
    tests: list[Expr] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["lt", "le", "gt", "ge", "eq", "or", "expr"]))
        sym = draw(st.sampled_from([x0, x1]))
        c = draw(st.integers(-2, 7))
        if kind == "or":
            a = Op("lt", (IndexExpr(sym), Constant(c, torch.int64)), torch.bool)
            tests.append(Op("logical_or", (a, Op("ge", (IndexExpr(x1), Constant(0, torch.int64)), torch.bool)),
                            torch.bool))
        elif kind == "expr":
            tests.append(Op("lt", (IndexExpr(sym - 3), Constant(c, torch.int64)), torch.bool))
        else:
            tests.append(Op(kind, (IndexExpr(sym), Constant(c, torch.int64)), torch.bool))
    mask: Expr | None = None
    for t in tests:
        mask = t if mask is None else Op("logical_and", (mask, t), torch.bool)
    index = (x0 + draw(st.integers(-4, 4)), draw(st.integers(-2, 2)) * x1 + draw(st.integers(-4, 4)))
    return Load("a", index, torch.float32, mask), (4, 5)


@settings(max_examples=300, deadline=None)
@given(_masked_load())
def test_load_in_bounds_is_sound(drawn: tuple[Load, tuple[int, int]]) -> None:
    """Where load_in_bounds claims a masked load inside its tensor, no point
    of the loops where the mask holds indexes outside it."""
    ld, size = drawn
    ranges = dict(zip(xsyms(2), (6, 5)))
    if not load_in_bounds(ld, size, ranges):
        return
    env = loop_env((6, 5), (), torch.device("cpu"))
    holds = torch.ones(6, 5, dtype=torch.bool) if ld.mask is None else torch.broadcast_to(
        evaluate(ld.mask, ReferenceHandler(env, {}, {}, torch.device("cpu"))), (6, 5))
    for p0, p1 in holds.nonzero().tolist():
        at = {xsyms(2)[0]: p0, xsyms(2)[1]: p1}
        for i, n in zip(ld.index, size):
            assert 0 <= int(i.subs(at)) < n, (ld, p0, p1)


def test_a_mask_proves_a_shifted_load_in_bounds_and_nothing_else_does() -> None:
    """x[x1 - 32] over x1 in [0, 64) of a 32-element x: inside where x1 >= 32;
    not without the mask, nor under a mask the analysis cannot read."""
    (x1,) = xsyms(1)
    ranges = {x1: 64}
    ge = Op("ge", (IndexExpr(x1), Constant(32, torch.int64)), torch.bool)
    shifted = Load("x", (x1 - 32,), torch.float32, ge)
    assert load_in_bounds(shifted, (32,), ranges)
    assert not load_in_bounds(Load("x", (x1 - 32,), torch.float32), (32,), ranges)
    either = Op("logical_or", (ge, ge), torch.bool)
    assert not load_in_bounds(Load("x", (x1 - 32,), torch.float32, either), (32,), ranges)
    assert not load_in_bounds(Load("x", (x1 - 31,), torch.float32, ge), (32,), ranges)  # one past the end


def test_value_range_of_index_arithmetic() -> None:
    x0, x1 = xsyms(2)
    ranges = {x0: 4, x1: 8}
    assert value_range(IndexExpr(2 * x0 - x1 + 1), ranges) == (-6, 7)
    assert value_range(Op("remainder", (Load("a", (x0,), torch.int64), Constant(5, torch.int64)), torch.int64),
                       ranges) == (0, 4)
    assert value_range(Load("a", (x0,), torch.int32), ranges) == (-(2**31), 2**31 - 1)
    assert value_range(Load("a", (x0,), torch.float32), ranges) is None
    # a product that may overflow int32 is the whole dtype
    big = Op("mul", (IndexExpr(sympy.Integer(2**20) * x1, torch.int32), Constant(2**12, torch.int32)), torch.int32)
    assert value_range(big, ranges) == (-(2**31), 2**31 - 1)


def test_runtime_checks_lists_only_the_checked() -> None:
    (x0,) = xsyms(1)
    kept = Check(Load("i", (x0,), torch.int64), "gather", 3, 1)
    dropped = Check(IndexExpr(x0), "gather", 3, 1, status="proven", range=(0, 2))
    assert runtime_checks(Op("add", (kept, dropped), torch.int64)) == [kept]


def test_a_check_rejects_a_bad_shape() -> None:
    (x0,) = xsyms(1)
    i = Load("i", (x0,), torch.int64)
    with pytest.raises(ValueError, match="a divisor check has size 0"):
        Check(i, "gather")
    with pytest.raises(ValueError, match="unknown check error"):
        Check(i, "nope", 3)
    with pytest.raises(ValueError, match="unknown check status"):
        Check(i, "gather", 3, status="maybe")


# ---- CUDA: a device-side assert, as in eager (run in a subprocess: it poisons the context) --------


def _run_cuda_script(body: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = "import torch, coil\nimport torch.nn.functional as F\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_out_of_range_index_is_a_device_side_assert() -> None:
    done = _run_cuda_script("""
        f = torch.compile(lambda x, t: F.cross_entropy(x, t), backend="coil")
        x = torch.randn(8, 5, device="cuda")
        good = torch.tensor([0, 1, 4, 2, 3, 3, 1, -100], device="cuda")
        torch.testing.assert_close(f(x, good), F.cross_entropy(x, good))
        print("in range: ok", flush=True)
        bad = good.clone()
        bad[5] = 5
        f(x, bad)
        torch.cuda.synchronize()
        print("no assert", flush=True)
    """)
    assert "in range: ok" in done.stdout, done.stderr
    assert "no assert" not in done.stdout
    assert done.returncode != 0
    assert "device-side assert" in done.stderr or "Assertion" in done.stderr, done.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_integer_division_by_zero_does_not_raise() -> None:
    """On CUDA eager does not check a zero divisor either: no assert, and the
    nonzero lanes equal eager's."""
    done = _run_cuda_script("""
        f = torch.compile(lambda a, b, i, x: (a // b, a % b, x[i]), backend="coil")
        a = torch.tensor([7, -7, 9, 4], device="cuda")
        b = torch.tensor([2, 0, -4, 3], device="cuda")
        x, i = torch.randn(5, device="cuda"), torch.tensor([0, -1, 4], device="cuda")
        q, r, y = f(a, b, i, x)
        torch.cuda.synchronize()
        nz = b != 0
        assert torch.equal(q[nz], (a // b)[nz]) and torch.equal(r[nz], (a % b)[nz])
        assert torch.equal(y, x[i])
        print("ok", flush=True)
    """)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_cuda_source_compiles_the_asserts_in() -> None:
    """Generated for fake CUDA tensors (nothing runs): a kernel whose index is
    checked launches with debug on and overflow sanitizing off (Triton drops
    device asserts otherwise); a kernel whose only check is a divisor has neither
    the assert nor the options (eager does not check it on CUDA)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def module(fn: Callable[..., Any], make: Callable[[], list[torch.Tensor]]) -> CompiledModule:
        with FakeTensorMode():
            inputs = make()
        gm = make_fx(fn, tracing_mode="fake")(*inputs)
        out = coil.default_pipeline().run(gm, inputs, until="kernel_gen",
                                          options=coil.Options(target="triton", graph_cache=False))
        assert isinstance(out, CompiledModule)
        return out

    gather = module(lambda x, i: x.gather(1, i) + 1,
                    lambda: [torch.empty(4, 6, device="cuda"), torch.empty(4, 2, dtype=torch.int64, device="cuda")])
    assert [k.asserts for k in gather.program.specs] == [("index",)]  # the decision, in the spec
    # its spelling: the assert, and the options its Launcher and its precompile spec launch it with
    assert "tl.device_assert(" in gather.source
    assert "{'XBLOCK': 16, 'num_warps': 1, 'debug': True, 'sanitize_overflow': False})" in gather.source
    assert "'debug': True, 'sanitize_overflow': False}" in gather.source
    division = module(lambda a, b: a // b, lambda: [torch.empty(8, dtype=torch.int64, device="cuda")] * 2)
    assert [k.asserts for k in division.program.specs] == [()]


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_of_one_index_a_row_raises_as_eager(target: str) -> None:
    """scatter is lowered as a compare with the row's index (no indirect read):
    the index is checked all the same."""
    fn = lambda x, i: x.scatter(1, i, 2.0)  # noqa: E731
    x = torch.zeros(3, 4)
    f = compiled(fn, target)
    good = torch.tensor([[3], [0], [2]])
    torch.testing.assert_close(f(x, good), fn(x, good), rtol=0, atol=0)
    for bad in (torch.tensor([[4], [0], [2]]), torch.tensor([[1], [-1], [2]])):
        with pytest.raises(RuntimeError, match="out of bounds"):
            fn(x, bad)
        with pytest.raises(RuntimeError, match="out of bounds"):
            f(x, bad)


def test_a_comparison_decided_over_its_ranges_is_a_constant() -> None:
    """value_range of a comparison is [1, 1] where it holds for every value, [0, 0]
    where for none, else [0, 1] (the C++ target's pieces fold comparisons so)."""
    import coil.ir.bounds as bounds

    i = sympy.Symbol("ix0", integer=True, nonnegative=True)
    idx = IndexExpr(i)

    def cmp(name: str, k: int) -> Op:
        return Op(name, (idx, Constant(k, torch.int64)), torch.bool)

    r = {i: 16}  # i in [0, 15]
    assert bounds.value_range(cmp("lt", 16), r) == (1, 1)
    assert bounds.value_range(cmp("ge", 16), r) == (0, 0)
    assert bounds.value_range(cmp("lt", 8), r) == (0, 1)
    assert bounds.value_range(cmp("le", 15), r) == (1, 1)
    assert bounds.value_range(cmp("gt", 15), r) == (0, 0)
    assert bounds.value_range(cmp("ne", 20), r) == (1, 1)
    assert bounds.value_range(cmp("eq", 20), r) == (0, 0)
    assert bounds.value_range(cmp("eq", 3), {i: 1}) == (0, 0) and bounds.value_range(cmp("eq", 0), {i: 1}) == (1, 1)


def test_value_among_decides_comparisons_over_spans_of_several_loops() -> None:
    """max_pool2d_with_indices' `index < 0` (no element of the window taken yet):
    the index a select took is one of two loop expressions, each nonnegative over
    the spans, whatever the loaded values chose; a comparison of constants is
    decided anywhere; one reading a loop outside the spans, or a span where it
    changes, is not."""
    from coil.ir.bounds import value_among

    x0, x1 = xsyms(2)
    i64 = torch.int64
    chosen = Op("where", (Op("gt", (Load("a", (x0, x1), torch.float32), Load("a", (x0, x1 + 1), torch.float32)),
                                 torch.bool),
                          IndexExpr(64 * x0 + 2 * x1 - 1), IndexExpr(64 * x0 + 2 * x1)), i64)
    none_taken = Op("lt", (chosen, Constant(0, i64)), torch.bool)
    assert value_among(none_taken, {x0: (0, 16), x1: (1, 16)}) is False
    assert value_among(none_taken, {x0: (1, 16), x1: (0, 16)}) is False
    assert value_among(none_taken, {x0: (0, 16), x1: (0, 16)}) is None  # x0 = x1 = 0 reads -1
    assert value_among(none_taken, {x1: (1, 16)}) is None  # x0 unknown
    assert value_among(Op("lt", (Constant(-1, i64), Constant(0, i64)), torch.bool), {}) is True
    assert value_among(Op("gt", (Load("a", (x0,), torch.float32), Constant(0.0, torch.float32)), torch.bool),
                       {x0: (0, 4)}) is None  # a loaded float
