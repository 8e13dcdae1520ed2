"""coil.properties: what users fuzz their own passes with.

    graphs(...)               hypothesis strategy: random FX graphs of aten ops + inputs
    symbolic_graphs(...)      the same graphs traced with symbolic sizes (torch.compile's
                              dynamic shapes), with other sizes to run them at
    assert_matches_eager(d, outs)   dtype-aware comparison with eager PyTorch
    check_all(w) and the other invariants of the back half (invariants.py)
"""

from coil.properties.invariants import (
    InvariantError,
    check_all,
    check_kernel_params,
    check_lifetimes,
    check_peak,
    check_reuse,
    check_schedule_topological,
    replay_peak,
)
from typing import Any

# the strategies need hypothesis: imported on first use, so the verifier (which
# checks the invariants above on every compile) does not pay for hypothesis
_STRATEGIES = frozenset({"DrawnGraph", "InputSpec", "assert_matches_eager", "graphs", "input_specs", "mismatch"})
_SYMBOLIC = frozenset({"SymbolicGraph", "symbolic_graphs"})


def __getattr__(name: str) -> Any:
    if name in _STRATEGIES:
        from coil.properties import strategies

        return getattr(strategies, name)
    if name in _SYMBOLIC:
        from coil.properties import symbolic

        return getattr(symbolic, name)
    raise AttributeError(name)


__all__ = [
    "DrawnGraph",
    "InputSpec",
    "InvariantError",
    "SymbolicGraph",
    "assert_matches_eager",
    "check_all",
    "check_kernel_params",
    "check_lifetimes",
    "check_peak",
    "check_reuse",
    "check_schedule_topological",
    "graphs",
    "input_specs",
    "mismatch",
    "replay_peak",
    "symbolic_graphs",
]
