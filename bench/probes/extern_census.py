"""Probe: the Externs coil leaves in real models that are not matmuls, convolutions
or attention (issue 15's "fewer kernels").  For each model named on the command
line (bench/hf_models.py names; default all of them), in $MODE (infer, the
default, or train: forward and backward), the graphs AOTAutograd hands a backend
at the `cpu` size, lowered and realized by coil for $TARGET (default triton), and
the count of each such Extern.  Runs on the CPU (no kernel is compiled or run)."""
import collections
import os
import sys
import warnings

sys.path.insert(0, os.getcwd())

import coil  # noqa: E402
from bench.hf_models import ALL_MODELS  # noqa: E402
from bench.probes.common import aot_graphs  # noqa: E402
from coil.ir.buffers import ExternBuffer  # noqa: E402

# matmuls, convolutions and attention stay library calls, as they do under Inductor
LIBRARY = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product")  # prefixes: convolution_backward too


def census(name: str, mode: str, target: str) -> collections.Counter[str]:
    graphs = aot_graphs(name, mode)
    found: collections.Counter[str] = collections.Counter()
    for gm, ins in graphs:
        realized = coil.default_pipeline().run(gm, ins, until="realize", options=coil.Options(target=target))
        for b in realized.buffers:
            if isinstance(b, ExternBuffer) and not b.kernel.split(".")[1].startswith(LIBRARY):
                found[b.kernel] += 1
    return found


def main() -> None:
    warnings.filterwarnings("ignore")
    mode = os.environ.get("MODE", "infer")
    target = os.environ.get("TARGET", "triton")
    total: collections.Counter[str] = collections.Counter()
    for name in sys.argv[1:] or list(ALL_MODELS):
        found = census(name, mode, target)
        total.update(found)
        print(f"{name:16s} {mode}: {dict(found) or 'none'}", flush=True)
    print(f"all {mode}: {dict(total) or 'none'}")


if __name__ == "__main__":
    main()
