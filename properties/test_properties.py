"""Property tests: on drawn graphs, every back-half invariant holds, compiled code
(sanitized or not) matches eager, and the BufferGraph means what the FX graph
means.  Then the checks themselves are checked: a hand-broken plan must fail the
sanitizer and each invariant with its exact message.

Settings are modest and derandomized, so CI sees the same examples every run;
COIL_PROPERTY_EXAMPLES raises the count for a longer local run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.backends.reference import run_buffer_graph
from coil.backends.runtime import load_module
from coil.ir.buffers import BufferGraph
from coil.ir.lowered import TensorRef
from coil.ir.wrapper import Alloc, ExternCall, Free, KernelCall, Line, ReinterpretView, Reuse, WrapperProgram
from coil.backends.kernel_gen import kernel_gen
from coil.properties import (
    DrawnGraph,
    InvariantError,
    assert_matches_eager,
    check_all,
    check_kernel_params,
    check_lifetimes,
    check_peak,
    check_reuse,
    check_schedule_topological,
    graphs,
)
from coil.properties.builder import VALUE_LIMIT, GraphBuilder
from coil.properties.simplify import simplify
from coil.properties.strategies import InputSpec, materialize

REFERENCE = coil.Options(target="reference")
SANITIZED = coil.Options(target="reference", sanitize=True)

CI = settings(
    max_examples=int(os.environ.get("COIL_PROPERTY_EXAMPLES", "50")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


# ---- properties of drawn graphs -------------------------------------------------------------


@CI
@given(graphs(max_nodes=6))
def test_drawn_graphs_are_well_formed(drawn: DrawnGraph) -> None:
    """The generator's own promises: bounded size, finite bounded values, and code
    that runs."""
    ops = [n for n in drawn.gm.graph.nodes if n.op == "call_function"]
    assert len(ops) <= 5 * 6  # each instruction: one op and at most four guards (or two getitems)
    assert 1 <= len(drawn.inputs) <= 3
    assert all(t.ndim <= 3 and all(1 <= s <= 6 for s in t.shape) for t in drawn.inputs)
    for out in drawn.eager():
        if out.is_floating_point() and out.numel():
            assert bool(torch.isfinite(out).all()) and float(out.abs().max()) <= VALUE_LIMIT
    assert drawn.code.lstrip().startswith("def forward(self")
    assert len(drawn.describe().splitlines()) == len(drawn.inputs)


@CI
@given(graphs())
def test_invariants_hold(drawn: DrawnGraph) -> None:
    program = coil.default_pipeline().run(drawn.gm, drawn.inputs, until="wrap", options=REFERENCE)
    assert isinstance(program, WrapperProgram)
    check_all(program)


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
@CI
@given(graphs())
def test_compiled_matches_eager(target: str, drawn: DrawnGraph) -> None:
    """Every kernel target, against eager (triton through the interpreter here)."""
    compiled = coil.compile_graph(drawn.gm, drawn.inputs, coil.Options(target=target))
    assert_matches_eager(drawn, compiled(*drawn.inputs))


@pytest.mark.parametrize("target", ["reference", "cpp"])
@CI
@given(graphs())
def test_sanitized_compiled_matches_eager(target: str, drawn: DrawnGraph) -> None:
    """With every free a poison, a read after the planned last use shows as NaN."""
    compiled = coil.compile_graph(drawn.gm, drawn.inputs, coil.Options(target=target, sanitize=True))
    assert_matches_eager(drawn, compiled(*drawn.inputs))


@CI
@given(graphs())
def test_buffer_graph_preserves_meaning(drawn: DrawnGraph) -> None:
    """lower + realize change the form, not the value: the reference interpreter
    running the BufferGraph gives eager's outputs."""
    bg = coil.default_pipeline().run(drawn.gm, drawn.inputs, until="realize", options=REFERENCE)
    assert isinstance(bg, BufferGraph)
    outputs = run_buffer_graph(bg, drawn.inputs)
    assert all(o is not None for o in outputs)
    assert_matches_eager(drawn, outputs)


@settings(max_examples=3, deadline=None, derandomize=True, database=None)
@given(graphs(max_nodes=4))
def test_reproducer_runs(drawn: DrawnGraph) -> None:
    """The script `coil fuzz` prints rebuilds the graph and inputs and runs."""
    namespace: dict[str, Any] = {"__name__": "coil_reproducer"}
    exec(compile(drawn.reproducer(REFERENCE), "<reproducer>", "exec"), namespace)  # noqa: S102 - the point of the test
    for got, want in zip(namespace["inputs"], drawn.inputs):
        assert got.stride() == want.stride() and torch.equal(got, want)


def test_simplify_cuts_what_the_failure_does_not_need() -> None:
    """A failure that needs only the sin: the neg chain and the extra output go."""
    spec = InputSpec((2, 3), torch.float32, "transposed", (0, 1), "normal", 0)
    b = GraphBuilder()
    x = b.placeholder(materialize(spec))
    chain = x
    for _ in range(3):
        chain = b.call(torch.ops.aten.neg.default, (chain,))
    sin = b.call(torch.ops.aten.sin.default, (chain,))
    b.output([chain, sin])
    drawn = DrawnGraph(b.module(), tuple(b.inputs), (spec,), ("unary",) * 4)

    def needs_sin(d: DrawnGraph) -> bool:
        return any(n.target is torch.ops.aten.sin.default for n in d.gm.graph.nodes)

    small = simplify(drawn, needs_sin)
    assert [n.target for n in small.gm.graph.nodes if n.op == "call_function"] == [torch.ops.aten.sin.default]
    assert_matches_eager(small, small.eager())


# ---- a program with frees, reuses, externs and kernels, to break by hand -----------------------


def chain(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    """Matmuls (Extern calls) between pointwise kernels: every buffer has one size,
    so plan_memory frees and reuses."""
    b = x.sin() @ w
    c = b.cos() @ w
    e = (c.exp() + 1) @ w
    return (e.softmax(-1),)


@pytest.fixture(scope="module")
def chain_case() -> tuple[WrapperProgram, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    inputs = (torch.randn(8, 8), torch.randn(8, 8))
    gm = make_fx(chain)(*inputs)
    program = coil.default_pipeline().run(gm, inputs, until="wrap", options=REFERENCE)
    assert isinstance(program, WrapperProgram)
    check_all(program)
    assert any(isinstance(ln, Reuse) for ln in program.lines), "the chain should reuse a buffer"
    return program, inputs, chain(*inputs)


def uses(line: Line) -> set[str]:
    match line:
        case KernelCall():
            return set(line.args)
        case ExternCall():
            return {a.name for a in line.args if isinstance(a, TensorRef)}
    return set()


def index_of(program: WrapperProgram, pred: Callable[[Line], bool]) -> int:
    return next(k for k, ln in enumerate(program.lines) if pred(ln))


def with_lines(program: WrapperProgram, lines: list[Line]) -> WrapperProgram:
    return attrs.evolve(program, lines=tuple(lines))


def free_moved_before_last_use(program: WrapperProgram) -> tuple[WrapperProgram, str, int]:
    """The first freed buffer's Free, moved to just before the line that reads it
    last: (broken program, buffer, the reading line's new index)."""
    k_free = index_of(program, lambda ln: isinstance(ln, Free) and ln.kind == "buffer")
    name = program.lines[k_free].name  # type: ignore[union-attr]
    k_use = max(k for k in range(k_free) if name in uses(program.lines[k]))
    lines = list(program.lines)
    free = lines.pop(k_free)
    lines.insert(k_use, free)
    return with_lines(program, lines), name, k_use + 1


def run_program(program: WrapperProgram, options: coil.Options, inputs: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    return load_module(kernel_gen(program, options))(*inputs)


def test_free_before_named_use_is_caught(chain_case: Any) -> None:
    """Freed before a line that names it: check_lifetimes says so, and the rendered
    wrapper fails at once, since its `del` unbinds the name (sanitized or not)."""
    program, inputs, _ = chain_case
    broken, name, k_use = free_moved_before_last_use(program)
    with pytest.raises(InvariantError, match=re.escape(f"line {k_use}: {name} used after its free")):
        check_lifetimes(broken)
    for options in (REFERENCE, SANITIZED):
        with pytest.raises(UnboundLocalError, match=name):
            run_program(broken, options, inputs)


def aliased(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
    """b.t() reaches the second matmul as a ReinterpretView of b's buffer."""
    a = x.sin()
    b = a @ w
    return (b.t() @ w + a,)


@pytest.fixture(scope="module")
def aliased_case() -> tuple[WrapperProgram, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    inputs = (torch.randn(8, 8), torch.randn(8, 8))
    program = coil.default_pipeline().run(make_fx(aliased)(*inputs), inputs, until="wrap", options=REFERENCE)
    assert isinstance(program, WrapperProgram)
    check_all(program)
    return program, inputs, aliased(*inputs)


def base_freed_before_alias_use(program: WrapperProgram) -> tuple[WrapperProgram, str]:
    """The Free of a view's base, moved to just after the view is made: the base's
    storage dies while the view still has a reader.  (broken program, base)"""
    k_view, view = next((k, ln) for k, ln in enumerate(program.lines) if isinstance(ln, ReinterpretView))
    k_free = index_of(program, lambda ln: isinstance(ln, Free) and ln.name == view.base)
    assert k_free > k_view + 1 and any(view.name in uses(ln) for ln in program.lines[k_view + 1 : k_free])
    lines = list(program.lines)
    lines.insert(k_view + 1, lines.pop(k_free))
    return with_lines(program, lines), view.base


def test_sanitize_catches_free_before_last_use(aliased_case: Any) -> None:
    """The base's last use is through its view, so no name is read after its
    `del`: only the sanitizer's poison shows the early free, as NaN."""
    program, inputs, expected = aliased_case
    torch.testing.assert_close(run_program(program, SANITIZED, inputs), expected)
    broken, base = base_freed_before_alias_use(program)
    (out,) = run_program(broken, SANITIZED, inputs)
    assert torch.isnan(out).any(), f"reading {base} (through its view) after its free went unnoticed"
    # without the sanitizer the same broken plan computes the right numbers: the bug hides
    torch.testing.assert_close(run_program(broken, REFERENCE, inputs), expected)


def test_check_lifetimes_catches_free_before_alias_use(aliased_case: Any) -> None:
    broken, base = base_freed_before_alias_use(aliased_case[0])
    with pytest.raises(InvariantError, match=re.escape(base)):
        check_lifetimes(broken)


# ---- each invariant, broken by hand -----------------------------------------------------------


def test_swapped_steps_are_not_topological(chain_case: Any) -> None:
    schedule = chain_case[0].schedule
    s0, s1, *rest = schedule.steps
    swapped = attrs.evolve(schedule, steps=(s1, s0, *rest))
    with pytest.raises(InvariantError, match=re.escape(f"step 0 ({s1.nodes[0]}) reads {s0.nodes[0]}, produced later at step 1: not topological")):
        check_schedule_topological(swapped)


def test_a_step_twice_is_caught(chain_case: Any) -> None:
    schedule = chain_case[0].schedule
    twice = attrs.evolve(schedule, steps=(*schedule.steps, schedule.steps[0]))
    last = len(schedule.steps)
    with pytest.raises(InvariantError, match=re.escape(f"{schedule.steps[0].nodes[0]} appears in steps 0 and {last}")):
        check_schedule_topological(twice)


def test_a_dropped_step_is_caught(chain_case: Any) -> None:
    schedule = chain_case[0].schedule
    dropped = attrs.evolve(schedule, steps=schedule.steps[1:])
    with pytest.raises(InvariantError, match=re.escape(f"scheduler nodes in no step: {list(schedule.steps[0].nodes)}")):
        check_schedule_topological(dropped)


def test_dropped_alloc_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    k = index_of(program, lambda ln: isinstance(ln, Alloc))
    name = program.lines[k].name
    lines = list(program.lines)
    del lines[k]
    k_use = index_of(with_lines(program, lines), lambda ln: name in uses(ln))
    with pytest.raises(InvariantError, match=re.escape(f"line {k_use}: {name} used before it is allocated")):
        check_lifetimes(with_lines(program, lines))


def test_duplicated_free_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    k = index_of(program, lambda ln: isinstance(ln, Free) and ln.kind == "buffer")
    lines = list(program.lines)
    lines.insert(k + 1, lines[k])
    with pytest.raises(InvariantError, match=re.escape(f"line {k + 1}: {lines[k].name} freed twice")):
        check_lifetimes(with_lines(program, lines))


def test_alloc_twice_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    k = index_of(program, lambda ln: isinstance(ln, Alloc))
    lines = list(program.lines)
    lines.insert(k + 1, lines[k])
    with pytest.raises(InvariantError, match=re.escape(f"line {k + 1}: {lines[k].name} allocated twice")):
        check_lifetimes(with_lines(program, lines))


def test_output_used_after_free_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    (out,) = program.lines[-1].names
    lines = [*program.lines[:-1], Free(out, "buffer"), program.lines[-1]]
    with pytest.raises(InvariantError, match=re.escape(f"line {len(lines) - 1}: {out} used after its free")):
        check_lifetimes(with_lines(program, lines))


def test_output_freed_after_return_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    (out,) = program.lines[-1].names
    lines = [*program.lines, Free(out, "buffer")]
    with pytest.raises(InvariantError, match=re.escape(f"outputs freed before return: {[out]}")):
        check_lifetimes(with_lines(program, lines))


def test_use_after_reuse_is_caught(chain_case: Any) -> None:
    """The storage passes to a new owner, yet a later line reads the old name."""
    program = chain_case[0]
    k = index_of(program, lambda ln: isinstance(ln, Reuse))
    reuse = program.lines[k]
    k_next = index_of(program, lambda ln: isinstance(ln, ExternCall) and reuse.new in uses(ln))
    call = program.lines[k_next]
    args = tuple(TensorRef(reuse.old) if a == TensorRef(reuse.new) else a for a in call.args)
    lines = list(program.lines)
    lines[k_next] = attrs.evolve(call, args=args)
    with pytest.raises(InvariantError, match=re.escape(f"line {k}: {reuse.new} takes {reuse.old}'s storage but {reuse.old} is used later")):
        check_reuse(with_lines(program, lines))


def test_reuse_of_another_size_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    bg = program.buffer_graph
    k = index_of(program, lambda ln: isinstance(ln, Reuse))
    reuse = program.lines[k]
    other = next(b.name for b in bg.buffers
                 if b.layout is not None and b.layout.nbytes != bg.layout(reuse.new).nbytes)
    lines = list(program.lines)
    lines[k] = attrs.evolve(reuse, old=other)
    with pytest.raises(InvariantError, match=re.escape(f"line {k}: {reuse.new} reuses {other} of another size, dtype or device")):
        check_reuse(with_lines(program, lines))


def test_reuse_of_an_input_is_caught(chain_case: Any) -> None:
    """Taking the storage of a graph input (dead by then, but the caller's) is refused."""
    program = chain_case[0]
    first_input = program.inputs[0]
    k_input_free = index_of(program, lambda ln: isinstance(ln, Free) and ln.name == first_input)
    k = next(k for k, ln in enumerate(program.lines) if isinstance(ln, Reuse) and k > k_input_free)
    lines = list(program.lines)
    lines[k] = attrs.evolve(lines[k], old=first_input)
    with pytest.raises(InvariantError, match=re.escape(f"line {k}: {lines[k].new} reuses graph input {first_input}")):
        check_reuse(with_lines(program, lines))


def test_wrong_peak_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    peak = program.plan.peak_bytes
    plan = attrs.evolve(program.plan, peak_bytes=peak + 4)
    wrong = attrs.evolve(program, kernel_program=attrs.evolve(program.kernel_program, plan=plan))
    with pytest.raises(InvariantError, match=re.escape(f"peak estimate {peak + 4} bytes, replay of the wrapper gives {peak}")):
        check_peak(wrong)


def test_changed_kernel_args_are_caught(chain_case: Any) -> None:
    program = chain_case[0]
    k = index_of(program, lambda ln: isinstance(ln, KernelCall) and len(ln.args) >= 2)
    call = program.lines[k]
    lines = list(program.lines)
    lines[k] = attrs.evolve(call, args=call.args[:-1])
    want = sorted(call.args)
    with pytest.raises(InvariantError, match=re.escape(f"{call.kernel}: arguments {sorted(call.args[:-1])} != read_writes minus removed {want}")):
        check_kernel_params(with_lines(program, lines))


def test_duplicated_kernel_arg_is_caught(chain_case: Any) -> None:
    program = chain_case[0]
    k = index_of(program, lambda ln: isinstance(ln, KernelCall))
    call = program.lines[k]
    lines = list(program.lines)
    lines[k] = attrs.evolve(call, args=(*call.args, call.args[0]))
    with pytest.raises(InvariantError, match=re.escape(f"{call.kernel}: arguments")):
        check_kernel_params(with_lines(program, lines))
