"""coil: a compiler from PyTorch graphs to fused kernels.

    torch.compile(fn, backend="coil")
    compiled = coil.compile_graph(gm, example_inputs, options=coil.Options(...))
    p = coil.default_pipeline(); ir = p.run(gm, inputs, until="fuse")
"""

from __future__ import annotations

from typing import Any, Sequence

from coil.errors import CoilError
from coil.options import Options
from coil.passes.pipeline import Pipeline, default_pipeline

__all__ = ["CoilError", "Options", "Pipeline", "backend", "compile_graph", "default_pipeline"]


def compile_graph(gm: Any, example_inputs: Sequence[Any], options: Options | None = None,
                  pipeline: Pipeline | None = None) -> Any:
    """Compile an FX graph of aten ops; returns `compiled(*inputs) -> tuple` with
    `compiled.source` (the whole output_code.py)."""
    from coil import graph_cache
    from coil.backends.runtime import load_module

    opts = options or Options.from_env()
    key = graph_cache.graph_key(gm, example_inputs, opts) if pipeline is None else None
    module = graph_cache.load(key, opts.cache_dir) if key else None
    if module is None:
        module = (pipeline or default_pipeline()).run(gm, example_inputs, options=opts)
        if key:
            graph_cache.store(key, module, opts.cache_dir)
    compiled = load_module(module, opts.cache_dir)
    compiled.cache_key = key
    return compiled


def __getattr__(name: str) -> Any:
    if name == "backend":
        from coil.backends.dynamo import coil_backend

        return coil_backend
    raise AttributeError(name)
