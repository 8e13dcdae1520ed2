"""Shared fixtures.  Triton kernels run on CPU tensors through the interpreter, so
TRITON_INTERPRET must be set before triton is first imported."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402


@pytest.fixture(autouse=True)
def _deterministic_inputs() -> None:
    """Every test draws its random inputs from the same seed, so a tolerance that
    holds once holds on every run (and on every xdist worker)."""
    torch.manual_seed(0)


def seed_fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The seed's function."""
    return ((a + b) * c.relu()).sum(dim=-1)


@pytest.fixture
def seed_graph() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    torch.manual_seed(0)
    inputs = [torch.randn(64, 128) for _ in range(3)]
    return make_fx(seed_fn)(*inputs), inputs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `cuda` judge compiled GPU kernels (libdevice, bound launches,
    CUDA graphs): under the interpreter they would judge something else, so they
    skip there, saying how to run them."""
    if os.environ.get("TRITON_INTERPRET") != "1" or not torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="compiled CUDA kernels: run with TRITON_INTERPRET=0 python3 -m pytest -m cuda")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
