"""in_cond(graphs): drawn graphs run as the branches of `torch.cond`.

The drawn graph is the true branch; the false branch is the same graph with its
float results doubled, so the two differ wherever the graph computes floats.  A
first input, a float vector, picks the branch (`p.sum() > 0`).  The graph is
traced with make_fx over fake tensors, as AOTAutograd traces a user's cond: one
`higher_order.cond` whose branches are subgraphs with fake values on their
inputs, which coil compiles as graphs of their own (passes/higher_order.py).
Eager PyTorch stays the oracle: `DrawnGraph.eager()` runs the traced graph, and
`flipped(d)` gives the inputs that take the other branch.

A drawn graph the tracer refuses as a branch (one whose branches' results would
differ in strides, which torch.cond does not allow) is filtered out.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import torch
from hypothesis import assume
from torch.fx.experimental.proxy_tensor import make_fx

from coil.properties.strategies import DrawnGraph, InputSpec, materialize


def _branches(gm: torch.fx.GraphModule) -> tuple[Any, Any]:
    def true_fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(o.clone() for o in gm(*xs) if isinstance(o, torch.Tensor))

    def false_fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(o * 2 if o.is_floating_point() else o.clone() for o in gm(*xs) if isinstance(o, torch.Tensor))

    return true_fn, false_fn


@st.composite
def in_cond(draw: st.DrawFn, graphs: st.SearchStrategy[DrawnGraph]) -> DrawnGraph:
    drawn = draw(graphs)
    if any(not isinstance(s, InputSpec) for s in drawn.specs):
        assume(False)  # a symbolic graph's size inputs: the branches take tensors only
    pick = InputSpec((3,), torch.float32, "contiguous", (), "normal", draw(st.integers(0, 2**16)))
    true_fn, false_fn = _branches(drawn.gm)

    def fn(p: torch.Tensor, *xs: torch.Tensor) -> Any:
        return torch.cond(p.sum() > 0, true_fn, false_fn, xs)

    inputs = (materialize(pick), *drawn.fresh_inputs())
    try:
        traced = make_fx(fn, tracing_mode="fake")(*inputs)
    except RuntimeError:  # branches torch.cond refuses (their results' strides differ)
        assume(False)
        raise
    return DrawnGraph(traced, inputs, (pick, *drawn.specs), ("cond", *drawn.instructions))


def flipped(drawn: DrawnGraph) -> tuple[Any, ...]:
    """Fresh inputs of an `in_cond` graph that take the other branch (the picking
    vector negated)."""
    p, *rest = drawn.fresh_inputs()
    return (-p, *rest)
