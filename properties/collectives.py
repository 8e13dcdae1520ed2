"""with_collectives(graphs, group): drawn graphs with asynchronous collectives added.

Each drawn graph gets some of its float results sent through
`_c10d_functional.all_reduce` (sum) or `all_gather_into_tensor` (along dim 0) and
completed by `wait_tensor`.  Each wait is put right after the collective or right
before the result's first reader, so that other work may run while it is in
flight.  On a group of one rank both are the identity, so eager's outputs do not
change, and the graph tests how coil pairs, holds and moves collectives: the
MemoryPlan verifier's in-flight rules (M3, M4), the overlap stage, sanitize.  The
caller brings the process group (a gloo group of world size 1 will do).
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
import torch

from coil.properties.strategies import DrawnGraph

_C10D = torch.ops._c10d_functional


def _candidates(drawn: DrawnGraph, gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Float tensor results of ops that something reads, in graph order (their values
    from a run on the drawn inputs: drawn graphs carry no fake values)."""
    values: dict[torch.fx.Node, object] = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> object:
            values[n] = out = super().run_node(n)
            return out

    Record(gm).run(*drawn.fresh_inputs())
    return [n for n, v in values.items()
            if n.op == "call_function" and isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 1
            and v.numel() > 0 and bool(n.users)]


@st.composite
def with_collectives(draw: st.DrawFn, graphs: st.SearchStrategy[DrawnGraph], group: str,
                     max_collectives: int = 3) -> DrawnGraph:
    drawn = draw(graphs)
    gm = torch.fx.GraphModule(drawn.gm, drawn.gm.graph.__deepcopy__())
    nodes = _candidates(drawn, gm)
    if not nodes:
        return drawn
    picked = draw(st.lists(st.sampled_from(range(len(nodes))), min_size=1, max_size=max_collectives, unique=True))
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for k in sorted(picked):
        n = nodes[k]
        users = sorted(n.users, key=lambda u: order[u])
        gather = draw(st.booleans())
        with gm.graph.inserting_after(n):
            c = (gm.graph.call_function(_C10D.all_gather_into_tensor.default, (n, 1, group)) if gather
                 else gm.graph.call_function(_C10D.all_reduce.default, (n, "sum", group)))
        late = draw(st.booleans())  # the wait right before the first reader, or right after the collective
        with (gm.graph.inserting_before(users[0]) if late else gm.graph.inserting_after(c)):
            w = gm.graph.call_function(_C10D.wait_tensor.default, (c,))
        for u in users:
            u.replace_input_with(n, w)
    gm.graph.lint()
    gm.recompile()
    return attrs.evolve(drawn, gm=gm, instructions=(*drawn.instructions, f"collectives x{len(picked)}"))
