"""Small helpers shared by test modules."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from conftest import seed_fn


def seed_eager(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    return seed_fn(*inputs)


def trace(fn: Callable[..., Any], *inputs: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn)(*inputs)


def run_until(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], stage: str, **options: Any) -> Any:
    opts = coil.Options(**{"target": "reference", **options})
    return coil.default_pipeline().run(trace(fn, *inputs), list(inputs), until=stage, options=opts)


def compile_ref(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], **options: Any) -> Any:
    opts = coil.Options(**{"target": "reference", **options})
    return coil.compile_graph(trace(fn, *inputs), list(inputs), opts)


def target_available(target: str) -> bool:
    """Whether kernel_gen can load the target's backend here."""
    from coil.backends.kernel_gen import backend_for

    try:
        backend_for(target)
    except (ImportError, AttributeError, coil.CoilError):
        return False
    return True


def make(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random values of any dtype: booleans, small integers of both signs, normal floats."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    if not dtype.is_floating_point:
        return torch.randint(-9, 10, shape, dtype=dtype)
    return torch.randn(shape).to(dtype)


def lowered(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], target: str = "reference") -> Any:
    """gm through lower: its LoweredGraph."""
    from coil.ir.lowered import LoweredGraph

    out = coil.default_pipeline().run(gm, inputs, until="lower", options=coil.Options(target=target))
    assert isinstance(out, LoweredGraph)
    return out


def lowered_externs(g: Any) -> list[str]:
    """The aten ops a LoweredGraph leaves as Extern calls, in order."""
    from coil.ir.lowered import Extern

    return [n.kernel for n in g.nodes if isinstance(n, Extern)]


def capture_aot(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> tuple[torch.fx.GraphModule, list[Any]]:
    """The inference graph and example inputs (SymInts, fake tensors of symbolic
    sizes) that torch.compile(dynamic=True) hands a backend at the AOT level."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    got: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=keep, inference_compiler=keep), dynamic=True)(*inputs)
    torch._dynamo.reset()
    return got[0]


def compiled_counted(fn: Callable[..., Any], target: str, **kw: Any) -> Callable[..., Any]:
    """torch.compile(fn, backend="coil") from a fresh Dynamo with its counters
    cleared, so a test can count the graphs coil compiled and left eager; no eager
    fallback, and no graph cache (a graph an earlier test cached would load through
    its link, uncounted)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    return torch.compile(fn, backend="coil", options={"target": target, "eager_fallback": False, "graph_cache": False},
                         **kw)
