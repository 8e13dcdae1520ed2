"""The invariants every back-half IR keeps, as users run them on their own passes:
they live in coil.ir.invariants (the IR's own layer, which the verifiers run) and
are re-exported here, beside the strategies and families that fuzz them."""

from coil.ir.invariants import (  # noqa: F401 - the public names of coil.properties.invariants
    InvariantError,
    check_schedule_topological,
    check_lifetimes,
    check_reuse,
    replay_peak,
    check_peak,
    check_kernel_params,
    check_indirect_reads,
    check_all,
)
