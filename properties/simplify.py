"""Graph-level shrinking, after hypothesis has shrunk the drawn program.

Hypothesis shrinks the choices that built a graph; it cannot delete an instruction
whose result later instructions name, so a shrunk failure keeps filler (a chain of
`neg`s where it replaced ops by the simplest one).  `simplify` edits the FX graph
itself with two moves, each kept only when the failure stays the same, until
neither applies:

- drop an output (and the code only it needed);
- bypass a node: its readers read one of its arguments instead, one with the same
  shape and dtype, so every reader still type-checks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
import torch.fx
from coil.properties.strategies import DrawnGraph


def _values(drawn: DrawnGraph) -> dict[str, Any]:
    """Every node's eager value, by node name."""
    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            values[n.name] = super().run_node(n)
            return values[n.name]

    Recorder(drawn.gm).run(*drawn.fresh_inputs())
    return values


def _rebuilt(drawn: DrawnGraph, edit: Callable[[torch.fx.Graph], None]) -> DrawnGraph:
    gm = copy.deepcopy(drawn.gm)
    edit(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    # fresh inputs: a failing candidate may have written to the ones it ran on
    return attrs.evolve(drawn, gm=gm, inputs=drawn.fresh_inputs())


def _output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in graph.nodes if n.op == "output")


def _outputs(graph: torch.fx.Graph) -> tuple[Any, ...]:
    """The output node's values (graphs() always returns a tuple)."""
    outs = _output_node(graph).args[0]
    assert isinstance(outs, (tuple, list))
    return tuple(outs)


def _without_output(drawn: DrawnGraph, i: int) -> DrawnGraph:
    def edit(graph: torch.fx.Graph) -> None:
        outs = list(_outputs(graph))
        del outs[i]
        _output_node(graph).args = (tuple(outs),)

    return _rebuilt(drawn, edit)


def _bypassed(drawn: DrawnGraph, node: str, arg: str) -> DrawnGraph:
    def edit(graph: torch.fx.Graph) -> None:
        by_name = {n.name: n for n in graph.nodes}
        by_name[node].replace_all_uses_with(by_name[arg])

    return _rebuilt(drawn, edit)


def _same_type(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.shape == b.shape and a.dtype == b.dtype)


def candidates(drawn: DrawnGraph) -> Iterator[DrawnGraph]:
    """Smaller graphs one move away, outputs first (they free the most code)."""
    outputs = _outputs(drawn.gm.graph)
    for i in range(len(outputs) - 1, -1, -1):
        if len(outputs) > 1:
            yield _without_output(drawn, i)
    values = _values(drawn)
    for n in reversed(list(drawn.gm.graph.nodes)):
        if n.op != "call_function":
            continue
        for a in n.all_input_nodes:
            if _same_type(values.get(n.name), values.get(a.name)):
                yield _bypassed(drawn, n.name, a.name)


def simplify(drawn: DrawnGraph, still_fails: Callable[[DrawnGraph], bool], max_rounds: int = 100) -> DrawnGraph:
    """Apply moves while `still_fails` holds; the first move that keeps the failure
    is taken, then the search restarts from the smaller graph."""
    for _ in range(max_rounds):
        smaller = next((c for c in candidates(drawn) if still_fails(c)), None)
        if smaller is None:
            return drawn
        drawn = smaller
    return drawn
