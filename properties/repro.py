"""Reproducers: a drawn graph as a self-contained script (graph code, inputs with
their exact values, strides and offsets, and the comparison that failed)."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import attrs
import torch

from coil.options import Options

if TYPE_CHECKING:
    from coil.properties.strategies import DrawnGraph


def tensor_literal(t: torch.Tensor) -> str:
    """Python that rebuilds `t`: its whole storage, then as_strided."""
    n = t.untyped_storage().nbytes() // t.element_size()
    storage = t.as_strided((n,), (1,), 0).cpu()
    values = storage.tolist()
    return (
        f"torch.tensor({values!r}, dtype={t.dtype})"
        f".as_strided({tuple(t.shape)}, {tuple(t.stride())}, {t.storage_offset()})"
    )


def _options_literal(options: Options) -> str:
    """`coil.Options(...)` with the fields that differ from the defaults; the local
    folders (cache, debug and replay dumps) stay out: they mean nothing on another machine; so
    do eager_fallback and aot_cache_nodes, which only torch.compile reads."""
    changed = [f"{f.name}={getattr(options, f.name)!r}" for f in attrs.fields(Options)
               if getattr(options, f.name) != f.default
               and f.name not in ("cache_dir", "debug_dir", "dump_sources", "eager_fallback", "aot_cache_nodes")]
    return f"coil.Options({', '.join(changed)})"


def reproducer(drawn: DrawnGraph, options: Options) -> str:
    """The script: inputs as made before any run (fresh from their specs), the
    graph traced again from its code, compiled with `options`, compared with eager."""
    inputs = "\n".join(f"    {tensor_literal(t)}," for t in drawn.fresh_inputs())
    forward = textwrap.dedent(drawn.code).strip()
    return f'''# coil fuzz reproducer
# {drawn.describe().replace(chr(10), chr(10) + "# ")}
import torch
from torch import device  # the graph code spells devices as device(type='cpu')
from torch.fx.experimental.proxy_tensor import make_fx

import coil

{forward}


inputs = [
{inputs}
]
gm = make_fx(lambda *args: forward(None, *args))(*inputs)
expected = gm(*inputs)
compiled = coil.compile_graph(gm, inputs, {_options_literal(options)})
for i, (got, want) in enumerate(zip(compiled(*inputs), expected)):
    torch.testing.assert_close(got, want, equal_nan=True, check_stride=False, msg=lambda m: f"output {{i}}: {{m}}")
print("outputs match eager")
'''
