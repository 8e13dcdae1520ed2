"""Device probe: what int64 index math costs a dynamic kernel.  A workload of the
dynamic suite (default cross_entropy) is captured with symbolic sizes at batch
HINT (default 1) as torch.compile(dynamic=True) hands it to a backend, compiled by
coil (int32 index math where the offsets fit: KernelSpec.wide), and timed at each
of BATCHES against the same source launching its int64 twins always (each
`< 2147483648` test made false) and against static coil at that batch.  GPU µs a call from the profiler, kernel by kernel.

    NAME=cross_entropy BATCHES=1,8,32 python3 bench/probes/dynamic_index.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

import coil  # noqa: E402
from bench.dynamic import FUNCTIONS, SIZES, batch_workload  # noqa: E402
from bench.probes.common import compile_coil, kernels_per_step, variant  # noqa: E402

sys.path.insert(0, os.path.join(os.getcwd(), "tests"))  # tests' conftest before the root's
from tests_helpers import capture_aot  # noqa: E402

NAME = os.environ.get("NAME", "cross_entropy")
HINT = int(os.environ.get("HINT", "1"))
BATCHES = tuple(int(b) for b in os.environ.get("BATCHES", "1,8,32").split(",") if b)
SIZE = SIZES["gpu"]


def wide(source: str) -> str:
    return source.replace(" < 2147483648", " < 0")


def main() -> None:
    dev = torch.device("cuda")
    inst = batch_workload(NAME, SIZE, HINT).build(dev)
    gm, example = capture_aot(FUNCTIONS[NAME], inst.inputs)
    dyn = coil.compile_graph(gm, example, coil.Options(target="triton", graph_cache=False))
    src = dyn.module.source
    print(f"{NAME}: index width tests in the dynamic source: {src.count(' < 2147483648')}", flush=True)
    dyn64 = variant(dyn, wide(src))
    for b in BATCHES:
        inst = batch_workload(NAME, SIZE, b).build(dev)
        sizes = [int(v) for v in _size_args(gm, inst.inputs)]
        ref = inst.fn(*inst.inputs)
        for label, fn in (("dyn int32", dyn), ("dyn int64", dyn64)):
            got = fn(*sizes, *inst.inputs)[0]
            torch.testing.assert_close(got, ref, rtol=3e-2, atol=3e-2)
        static = compile_coil(inst)
        rows = {"dyn int32": lambda: dyn(*sizes, *inst.inputs), "dyn int64": lambda: dyn64(*sizes, *inst.inputs),
                "static": lambda: static(*inst.inputs)}
        for label, call in rows.items():
            ks = kernels_per_step(call)
            print(f"  batch {b:3d} {label:10s} GPU {sum(k[2] for k in ks):8.1f} us  "
                  + "  ".join(f"{k[0][:40]} {k[2]:.1f}" for k in ks), flush=True)


def _size_args(gm: torch.fx.GraphModule, tensors: tuple[torch.Tensor, ...]) -> list[int]:
    """The values of the graph's SymInt placeholders for these tensors: each is
    the first tensor size its example value equals (hint), matched by position."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    syms = [n.meta["val"] for n in placeholders if isinstance(n.meta.get("val"), torch.SymInt)]
    fakes = [n.meta["val"] for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)]
    out = []
    for s in syms:
        expr = s.node.expr
        found = None
        for fake, real in zip(fakes, tensors):
            for d, v in enumerate(fake.shape):
                if isinstance(v, torch.SymInt) and v.node.expr == expr and not free_symbols(v) - {expr}:
                    found = real.shape[d]
                    break
            if found is not None:
                break
        assert found is not None, s
        out.append(found)
    return out


if __name__ == "__main__":
    main()
