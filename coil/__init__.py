"""coil: a compiler from PyTorch graphs to fused kernels.

    torch.compile(fn, backend="coil")
    compiled = coil.compile_graph(gm, example_inputs, options=coil.Options(...))
    p = coil.default_pipeline(); ir = p.run(gm, inputs, until="fuse")
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from coil.errors import CoilError
from coil.options import Options
from coil.passes.pipeline import Pipeline

__all__ = ["CoilError", "Options", "Pipeline", "backend", "compile_graph", "default_pipeline"]


def default_pipeline() -> Pipeline:
    """The default passes and the backends' kernel_gen, with coil's observers:
    Options.debug_dir's files (one folder per graph) and Options.dump_sources's
    source (process replay)."""
    from coil.backends.kernel_gen import kernel_gen
    from coil.graph_cache import dump_sources_observer
    from coil.passes.pipeline import default_pipeline as default_passes
    from coil.report import debug_dir_observer

    return attrs.evolve(default_passes(kernel_gen), observers=(debug_dir_observer, dump_sources_observer))


def compile_graph(gm: Any, example_inputs: Sequence[Any], options: Options | None = None,
                  pipeline: Pipeline | None = None, *, kind: str = "graph") -> Any:
    """Compile an FX graph of aten ops; returns `compiled(*inputs) -> tuple` with
    `compiled.source` (the whole output_code.py).  `kind` names the graph's
    debug_dir folder (`<n>_<kind>`: forward, backward, inference...)."""
    from coil import graph_cache

    opts = options or Options.from_env()
    key = (graph_cache.graph_key(gm, example_inputs, opts, subgraph=kind.startswith("subgraph"))
           if pipeline is None else None)
    module = graph_cache.load(key, opts.cache_dir) if key else None
    if module is None:
        module = (pipeline or default_pipeline()).run(gm, example_inputs, options=opts, kind=kind)
        if key:
            graph_cache.store(key, module, opts.cache_dir)
    return _loaded(module, key, opts, pipeline)


def load_compiled(key: str, options: Options) -> Any | None:
    """The compiled graph that compile_graph stored in the graph cache under `key`
    with these options, loaded as compile_graph would return it; None where the
    entry is gone or does not load (AOTAutograd's cache holds such keys:
    backends/aot_cache.py)."""
    from coil import graph_cache

    module = graph_cache.load(key, options.cache_dir)
    return None if module is None else _loaded(module, key, options, None)


def _loaded(module: Any, key: str | None, opts: Options, pipeline: Pipeline | None) -> Any:
    """A compiled module loaded and its `call` wrapped (load_module).  A higher-order
    op's subgraph (cond's branches, a loop's body) compiles as its graph did, with
    what is that graph's own dropped: its donated inputs, its free output strides,
    its CUDA graphs (the outer graph's recording holds the subgraph's)."""
    from coil.backends.runtime import load_module

    sub_opts = opts.replace(donated_inputs=(), free_output_strides=(), aligned_inputs=(), cuda_graphs=False)
    compiled = load_module(module, opts.cache_dir,
                           lambda sub: compile_graph(sub.gm, sub.inputs, sub_opts, pipeline, kind=f"subgraph-{sub.name}"))
    compiled.cache_key = key
    return compiled


# loaded on first use (coil.ir brings sympy, coil.properties hypothesis), so that
# `import coil; coil.ir.printer.show(ir)` works without importing them by hand
_SUBPACKAGES = ("ir", "passes", "backends", "properties")


def __getattr__(name: str) -> Any:
    if name == "backend":
        from coil.backends.dynamo import coil_backend

        return coil_backend
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"coil.{name}")
    raise AttributeError(f"module 'coil' has no attribute {name!r}")
