"""Lowerings, one module per op family.  Importing this package fills LOWERINGS;
DECOMPOSITIONS is the table `lower` falls back to before an Extern."""

from coil.passes.lowerings import creation, indirect, pointwise, reductions, pooling, regions, scans, scatters, views  # noqa: F401  (registration)
from coil.passes.lowerings import prims  # noqa: F401  (registration; after pointwise, reductions, views)
from coil.passes.lowerings.decompositions import DECOMPOSITIONS, ONE_DEVICE_DECOMPOSITIONS
from coil.passes.lowerings.registry import LOWERINGS, register_lowering, register_pointwise

__all__ = ["DECOMPOSITIONS", "ONE_DEVICE_DECOMPOSITIONS", "LOWERINGS", "register_lowering", "register_pointwise"]
