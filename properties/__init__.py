"""coil.properties: what users fuzz their own passes with.

    graphs(...)               hypothesis strategy: random FX graphs of aten ops + inputs
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
from coil.properties.strategies import (
    DrawnGraph,
    InputSpec,
    assert_matches_eager,
    graphs,
    input_specs,
    mismatch,
)

__all__ = [
    "DrawnGraph",
    "InputSpec",
    "InvariantError",
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
]
