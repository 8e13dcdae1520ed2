"""The OpInfo suite (issue 14): every OpInfo of torch's `op_db` through
`torch.compile(backend="coil")`, compared with eager PyTorch on the same inputs.

One test per op (variant included), dtype and target: CPU float32, bfloat16 and
int64 where the op supports them, on the reference and cpp targets, plus a
float32 subset of common ops on the triton target (under TRITON_INTERPRET=1).

Each sample of `op.sample_inputs` runs eagerly and compiled (Dynamo may break the
graph: a user sees that too), on copies of its tensors, and the outputs and the
inputs after the call (for ops that mutate them) are compared.  A sample passes
only when coil compiled a graph and ran it: a sample for which coil logged that it
ran a graph eagerly fails, and one for which Dynamo handed coil no graph at all is
counted apart (an op with only such samples is skipped: coil never saw it).  A
sample on which eager itself raises is skipped.

Modes: by default (CI) each op runs its first sample on cpp in every dtype and on
reference in float32 (about 2,400 tests; each compile costs 0.1-0.5 s), and an op
of the expected-failures table (tests/opinfo_xfail.py) runs until a sample fails,
so the table means the same in both modes (measured: 615 s of CPU with a cold
kernel cache, about 5 minutes on 2 workers).  COIL_OPINFO_SAMPLES=N runs the first N
samples of each instead (N=6 on cpp in float32: 689 passed in 246 s on 2 workers,
session 42).  COIL_OPINFO_FULL=1 runs every sample
of every op, dtype and target (hours on 2 cores: logspace alone has 1,201).
COIL_OPINFO_DYNAMIC=1 compiles with `dynamic=True`; COIL_OPINFO_GRAD=1 also takes
each floating sample's gradients through the backward graph coil compiles
(session 31, first samples: float32 cpp 651 passed, none failed; float32
reference and bfloat16 cpp 1,177 passed, none failed).  It found linalg's
training graphs failing in AOTAutograd's backward compile (IndexError: the
strides coil reported counted the effect token), fixed; gradients are compared
at GRAD_TOLERANCES.  CI runs the gradient mode on GRAD_OPS (38 ops, cpp,
float32: test_opinfo_grad).

Comparisons: values at assert_close's tolerances for the output's dtype (bfloat16
loosened to atol 1e-2, as Inductor's OpInfo test does); a float output that misses
eager's value may instead match eager run one precision up (float32 inputs as
float64, bfloat16 as float32), since coil keeps fused intermediates in float32 as
Inductor does.  Ops with random or undefined outputs are compared by shape and
dtype only, and so is any output that two seeded eager runs do not agree on.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import sys
from typing import Any, Callable, Iterator
from unittest import mock

import pytest
import torch
from torch.utils import _pytree as pytree

pytest.importorskip("expecttest", reason="torch's OpInfo database imports expecttest: pip install expecttest")

import torch.testing._internal.common_methods_invocations as common_methods  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.opinfo.core import OpInfo  # noqa: E402

from opinfo_xfail import expected_failure  # noqa: E402
from tests_helpers import target_available  # noqa: E402

F32, BF16, I64 = torch.float32, torch.bfloat16, torch.int64
DTYPES = (F32, BF16, I64)
TARGETS = ("reference", "cpp")

FULL = os.environ.get("COIL_OPINFO_FULL", "") not in ("", "0")
# COIL_OPINFO_DYNAMIC=1: every sample through torch.compile(dynamic=True), its sizes
# symbolic (a sweep of the symbolic lowerings; the expected-failures table is static's)
DYNAMIC = os.environ.get("COIL_OPINFO_DYNAMIC", "") not in ("", "0")
# COIL_OPINFO_GRAD=1: floating samples of ops that support autograd require grad, and
# each run also takes the gradients of its outputs (against seeded random cotangents)
# with respect to every input that requires grad, outside the compiled function: the
# backward graph AOTAutograd hands coil is compiled and compared too
GRAD = os.environ.get("COIL_OPINFO_GRAD", "") not in ("", "0")
# CI mode: the first sample of each op, dtype and target (sample_inputs' order); the
# reference target in float32 only (its bfloat16 and int64 runs are full mode's)
# (COIL_OPINFO_SAMPLES=N: the first N samples instead, a sweep between CI's and full mode's)
CI_SAMPLES = dict.fromkeys(("reference", "cpp", "triton"), int(os.environ.get("COIL_OPINFO_SAMPLES", "1")))
CI_DTYPES = {"reference": (F32,), "cpp": DTYPES}

# outputs drawn at random: compared by shape and dtype
RANDOM_OPS = frozenset({
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
    "normal.in_place", "normal.number_mean", "rand_like", "randint", "randint_like", "randn", "randn_like",
    "uniform", "nn.functional.alpha_dropout", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "nn.functional.rrelu",
    "svd_lowrank", "pca_lowrank",
})
# outputs left uninitialised: compared by shape and dtype
UNDEFINED_OPS = frozenset({
    "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided",
    "resize_", "resize_as_",
})

# the triton subset: common pointwise, reduction and view ops, float32, first sample
TRITON_OPS = (
    "abs", "add", "mul", "div.no_rounding_mode", "exp", "log", "sigmoid", "tanh", "sqrt", "rsqrt", "where",
    "clamp", "maximum", "pow", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "sum", "mean", "amax", "argmax", "var", "softmax", "log_softmax", "logsumexp", "cumsum",
    "nn.functional.layer_norm", "transpose", "permute", "reshape", "cat", "expand", "flip", "gather",
)

# the gradient subset CI runs (COIL_OPINFO_GRAD's mode, float32, cpp, first sample): the
# backward graphs of common training ops, and the ops whose backward broke once (linalg's
# effect tokens, kron's long sums)
GRAD_OPS = (
    "add", "mul", "div.no_rounding_mode", "exp", "tanh", "sigmoid", "pow", "where", "clamp",
    "nn.functional.gelu", "nn.functional.silu", "sum", "mean", "var", "amax", "softmax", "log_softmax",
    "logsumexp", "cumsum", "nn.functional.layer_norm", "nn.functional.group_norm", "nn.functional.batch_norm",
    "nn.functional.cross_entropy", "nn.functional.embedding", "gather", "index_select", "scatter_add",
    "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "matmul", "bmm",
    "nn.functional.scaled_dot_product_attention", "cat", "flip", "permute", "kron", "linalg.solve",
)

TOLERANCES = {F32: {"rtol": 1.3e-6, "atol": 1e-5}, BF16: {"rtol": 1.6e-2, "atol": 1e-2},
              torch.float16: {"rtol": 1e-3, "atol": 1e-3}, torch.float64: {"rtol": 1e-7, "atol": 1e-7},
              torch.complex64: {"rtol": 1.3e-6, "atol": 1e-5}, torch.complex128: {"rtol": 1e-7, "atol": 1e-7}}
UPCAST = {F32: torch.float64, BF16: F32}
# gradients (COIL_OPINFO_GRAD) are mostly sums that coil's kernels take in another order
# than eager's (kron's: a 200-element sum, coil's error against float64 2.5x eager's on the
# cpp target): float32 ones are compared at 1e-4, as forward outputs are not
GRAD_TOLERANCES = {**TOLERANCES, F32: {"rtol": 1e-4, "atol": 1e-4}}


def op_name(op: OpInfo) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ----------------------------------------------------------------------------- one sample

@dataclasses.dataclass
class OpRun:
    """What the samples of one op, dtype and target did."""

    passed: int = 0          # coil compiled a graph, ran it, and matched eager
    not_compiled: int = 0    # matched, but Dynamo handed coil no graph
    eager_fallback: int = 0  # coil logged that it ran a graph eagerly
    skipped: int = 0         # eager raises on the sample
    failures: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (sample index, why)


class _EagerLog(logging.Handler):
    """Counts coil's warnings that it ran a graph eagerly."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "eagerly" in msg:
            self.messages.append(msg)


def _copy(x: Any) -> Any:
    """A tensor with its own storage and the same sizes, strides and offset (a
    leaf that requires grad where `x` does)."""
    if not isinstance(x, torch.Tensor) or x.layout != torch.strided or type(x) is not torch.Tensor:
        return x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
    grad = x.requires_grad
    x = x.detach()
    storage = x.untyped_storage().clone() if x.device.type != "meta" else x.untyped_storage()
    out = torch.empty(0, dtype=x.dtype, device=x.device)
    out.set_(storage, x.storage_offset(), x.size(), x.stride())
    return out.requires_grad_(grad)


def _upcast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype == dtype and x.layout == torch.strided:
        return _copy(x).detach().to(UPCAST[dtype]).requires_grad_(x.requires_grad)
    return _copy(x)


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    torch.manual_seed(0)
    out = fn(*args, **kwargs)
    return (out, _grads(out, (args, kwargs))) if GRAD else out


def _grads(out: Any, inputs: Any) -> tuple[Any, ...]:
    """The gradients of `out`'s floating outputs that require grad, against
    cotangents drawn from a fixed seed, with respect to the tensors of `inputs`
    that require grad (None where one is unused); () when there are none."""
    leaves = [t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad
            and o.is_floating_point()]
    if not leaves or not outs:
        return ()
    gen = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype) for o in outs]
    return torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)


_GRADS = _grads  # the gradient mode's own, which test_opinfo_grad wraps to count


def _compare(actual: Any, expected: Any, shape_only: bool) -> None:
    """Outputs and inputs compared at TOLERANCES; in GRAD mode `actual` and
    `expected` are (outputs, gradients), the gradients at GRAD_TOLERANCES."""
    if GRAD:
        _compare_leaves(actual[0], expected[0], shape_only, TOLERANCES)
        _compare_leaves(actual[1], expected[1], shape_only, GRAD_TOLERANCES, "gradient")
        return
    _compare_leaves(actual, expected, shape_only, TOLERANCES)


def _compare_leaves(actual: Any, expected: Any, shape_only: bool, tolerances: dict[torch.dtype, dict[str, float]],
                    what: str = "output") -> None:
    got, want = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} {what}s, eager gives {len(want)}")
    for i, (a, e) in enumerate(zip(got, want)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"{what} {i}: {type(a).__name__}, eager gives a tensor")
            if shape_only:
                if a.shape != e.shape or a.dtype != e.dtype:
                    raise AssertionError(f"{what} {i}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}")
                continue
            tol = tolerances.get(e.dtype, {"rtol": 0, "atol": 0} if not e.is_floating_point() else {})  # ints: exact
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m, i=i: f"{what} {i}: {m}", **tol)
        elif not shape_only and not (a == e or (isinstance(e, float) and e != e and a != a)):
            raise AssertionError(f"{what} {i}: {a!r}, eager gives {e!r}")


def _check(fn: Callable[..., Any], compiled: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
           dtype: torch.dtype, shape_only: bool, first: Any) -> None:
    """Run `fn` eagerly and `compiled` on copies of the sample; raise on a mismatch.
    `first` is an earlier eager run's output: where this run's differs, the op's
    output is not determined by its inputs and the seed, and only shapes count."""
    e_args, e_kwargs = pytree.tree_map(_copy, (args, kwargs))
    c_args, c_kwargs = pytree.tree_map(_copy, (args, kwargs))
    expected = _call(fn, e_args, e_kwargs)
    if not shape_only:
        try:
            _compare(first, expected, False)
        except AssertionError:
            shape_only = True
    actual = _call(compiled, c_args, c_kwargs)
    try:
        if GRAD:  # ((outputs, inputs after the call), gradients)
            _compare(((actual[0], c_args, c_kwargs), actual[1]), ((expected[0], e_args, e_kwargs), expected[1]),
                     shape_only)
        else:
            _compare((actual, c_args, c_kwargs), (expected, e_args, e_kwargs), shape_only)
    except AssertionError as mismatch:
        if dtype not in UPCAST:
            raise
        # eager one precision up, rounded to the compiled outputs' dtypes
        try:
            u_args, u_kwargs = pytree.tree_map(lambda x: _upcast(x, dtype), (args, kwargs))
            ref = _call(fn, u_args, u_kwargs)
            ref = pytree.tree_map(lambda r, a: r.to(a.dtype) if isinstance(r, torch.Tensor) and isinstance(a, torch.Tensor)
                                  and r.is_floating_point() else r, ref, actual)
            _compare(actual, ref, shape_only)
        except Exception:
            raise mismatch from None


def _unseeded(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """OpInfo's wrapper_set_seed without its freeze_rng_state, which Dynamo does not
    trace: it would hand coil no graph for the ops OpInfo calls through it (the
    random ones, empty_strided, scaled_dot_product_attention, ...).  Each call is
    seeded by `_call` instead."""
    return op(*args, **kwargs)


def _first_line(e: BaseException) -> str:
    """The exception's type and message, its first lines joined (at most 400 characters)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {' | '.join(lines[:4])}"[:400]


def run_op(op: OpInfo, dtype: torch.dtype, target: str, limit: int | None, stop_at_failure: bool = True) -> OpRun:
    """Run `op`'s first `limit` samples (all when None) of `dtype` through coil's
    `target`, stopping at the first failure when asked."""
    import torch._dynamo.utils

    name = op_name(op)
    shape_only = name in RANDOM_OPS or name in UNDEFINED_OPS
    run = OpRun()
    torch._dynamo.reset()
    torch.manual_seed(0)
    grad = GRAD and dtype.is_floating_point and op.supports_autograd
    samples = op.sample_inputs("cpu", dtype, requires_grad=grad)
    fn = op.op
    compiled = torch.compile(lambda *a, **k: fn(*a, **k), backend="coil", dynamic=DYNAMIC,
                             options={"target": target, "graph_cache": False})
    handler = _EagerLog()
    compiled_any = False
    log = logging.getLogger("coil")
    log.addHandler(handler)
    try:
        with torch._dynamo.config.patch(recompile_limit=10_000, accumulated_recompile_limit=100_000,
                                        fail_on_recompile_limit_hit=True), \
                mock.patch.object(common_methods, "wrapper_set_seed", _unseeded):
            for i, sample in enumerate(itertools.islice(samples, limit)):
                args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
                try:
                    first = _call(fn, *pytree.tree_map(_copy, (args, kwargs)))
                except Exception:
                    run.skipped += 1
                    continue
                graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
                eager_before = len(handler.messages)
                try:
                    _check(fn, compiled, args, kwargs, dtype, shape_only, first)
                except Exception as e:  # noqa: BLE001 - every failure is recorded with its message
                    run.failures.append((i, _first_line(e)))
                    if stop_at_failure:
                        break
                    continue
                if len(handler.messages) > eager_before:
                    run.eager_fallback += 1
                    run.failures.append((i, f"coil ran a graph eagerly: {handler.messages[-1]}"))
                    if stop_at_failure:
                        break
                else:
                    # a sample whose shapes an earlier one had runs that sample's graph
                    compiled_any = compiled_any or torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
                    if compiled_any:
                        run.passed += 1
                    else:
                        run.not_compiled += 1
    finally:
        log.removeHandler(handler)
        torch._dynamo.reset()
    return run


# ----------------------------------------------------------------------------- the tests

def _cases(targets: tuple[str, ...], dtypes: tuple[torch.dtype, ...], names: tuple[str, ...] | None = None
           ) -> Iterator[Any]:
    for op in op_db:
        if names is not None and op_name(op) not in names:
            continue
        supported = op.supported_dtypes("cpu")
        for dtype in dtypes:
            if dtype not in supported:
                continue
            for target in targets:
                yield pytest.param(op, dtype, target, id=f"{op_name(op)}-{_dtype_name(dtype)}-{target}")


def _verdict(op: OpInfo, dtype: torch.dtype, target: str, limit: int | None) -> None:
    if not target_available(target):
        pytest.skip(f"{target} backend not built")
    name = op_name(op)
    reason = expected_failure(op.name, op.variant_test_name, dtype, target)
    run = run_op(op, dtype, target, None if (FULL or reason) else limit)
    if reason is not None:
        if run.failures:
            pytest.xfail(reason)
        pytest.fail(f"{name} {dtype} {target} unexpectedly passed ({run.passed} samples): "
                    f"remove its entry from tests/opinfo_xfail.py ({reason})")
    if run.failures:
        i, why = run.failures[0]
        pytest.fail(f"{name} {dtype} {target}, sample {i}: {why}", pytrace=False)
    if run.passed == 0:
        if run.not_compiled:
            pytest.skip("Dynamo hands coil no graph for this op (it graph-breaks on it)")
        pytest.skip("eager raises on every sample" if run.skipped else "no samples")


@pytest.mark.parametrize("op, dtype, target", [case for target in TARGETS
                                                for case in _cases((target,), DTYPES if FULL else CI_DTYPES[target])])
def test_opinfo(op: OpInfo, dtype: torch.dtype, target: str) -> None:
    _verdict(op, dtype, target, CI_SAMPLES[target])


@pytest.mark.parametrize("op, dtype, target", list(_cases(("cpp",), (F32,), GRAD_OPS)))
def test_opinfo_grad(op: OpInfo, dtype: torch.dtype, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """GRAD_OPS with their gradients, as COIL_OPINFO_GRAD=1 runs every op."""
    if not op.supports_autograd:
        pytest.skip("no autograd")
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "GRAD", True)
    taken: list[int] = []

    def grads(out: Any, inputs: Any) -> tuple[Any, ...]:
        got = _GRADS(out, inputs)
        taken.append(len(got))
        return got

    monkeypatch.setattr(module, "_grads", grads)
    _verdict(op, dtype, target, CI_SAMPLES[target])
    assert max(taken, default=0) > 0, "no gradient was taken"


@pytest.mark.parametrize("op, dtype, target", list(_cases(("triton",), (F32,), TRITON_OPS)))
def test_opinfo_triton(op: OpInfo, dtype: torch.dtype, target: str) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the triton subset runs under TRITON_INTERPRET=1")
    _verdict(op, dtype, target, CI_SAMPLES[target])
