"""The torch.compile entry: `torch.compile(model, backend="coil", options={...})`.

Dynamo hands over an FX graph of torch calls; AOTAutograd, with coil's
decomposition table, turns it into forward (and backward) graphs of aten ops; each
goes through `coil.compile_graph`.  A graph coil cannot take (symbolic shapes) runs
eagerly with a logged warning instead of failing the user's model."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping, Sequence

import torch

from coil.options import Options

log = logging.getLogger("coil")


@functools.lru_cache(maxsize=1)
def aot_decompositions() -> dict[Any, Callable[..., Any]]:
    """Core ATen decompositions plus the fusion-friendly ones, minus the ops coil
    lowers itself (those arrive whole and fuse better that way)."""
    from coil.passes.lowerings import DECOMPOSITIONS, LOWERINGS

    return {op: fn for op, fn in DECOMPOSITIONS.items() if op not in LOWERINGS}


def _static(inputs: Sequence[Any]) -> bool:
    for x in inputs:
        if isinstance(x, torch.SymInt):
            return False
        if isinstance(x, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
            return False
    return True


def _graph_compiler(options: Options, kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
    def compile_one(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from coil import compile_graph

        if not _static(example_inputs):
            log.warning("coil: %s graph has symbolic shapes; running it eagerly", kind)
            return gm.forward
        compiled = compile_graph(gm, list(example_inputs), options)
        log.debug("coil: compiled %s graph (%d nodes)", kind, len(gm.graph.nodes))

        def run(args: list[Any]) -> Any:
            return compiled.call_boxed(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        run.compiled = compiled  # type: ignore[attr-defined]
        return run

    return compile_one


def coil_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None,
                 **_: Any) -> Callable[..., Any]:
    """The Dynamo backend (entry point `coil`)."""
    from torch._dynamo.backends.common import aot_autograd

    opts = Options.from_mapping(options)
    backend = aot_autograd(
        fw_compiler=_graph_compiler(opts, "forward"),
        bw_compiler=_graph_compiler(opts, "backward"),
        inference_compiler=_graph_compiler(opts, "inference"),
        decompositions=aot_decompositions(),
    )
    return backend(gm, example_inputs)
