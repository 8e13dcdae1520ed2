"""Probe: how long coil's passes take on a real model's graphs.  For each model named
on the command line (bench/hf_models.py names; default gpt2 t5 wav2vec2
mobilenet_v2), in $MODE (train, the default: the forward and backward graphs
AOTAutograd hands a backend; or infer), at the `cpu` size, the seconds coil's
pipeline takes from lower to kernel_gen for $TARGET (default triton), one process
for every model, its caches cold at the first.  No kernel is compiled or run, so
it runs on the CPU; with PROFILE=1 it prints a cProfile of the passes by
cumulative time as well."""
import cProfile
import os
import pstats
import sys
import time
import warnings

sys.path.insert(0, os.getcwd())

import coil  # noqa: E402
from bench.probes.common import aot_graphs  # noqa: E402


def main() -> None:
    warnings.filterwarnings("ignore")
    mode = os.environ.get("MODE", "train")
    options = coil.Options(target=os.environ.get("TARGET", "triton"))
    profile = cProfile.Profile() if os.environ.get("PROFILE") == "1" else None
    for name in sys.argv[1:] or ["gpt2", "t5", "wav2vec2", "mobilenet_v2"]:
        graphs = aot_graphs(name, mode)
        t0 = time.perf_counter()
        if profile is not None:
            profile.enable()
        for gm, inputs in graphs:
            coil.default_pipeline().run(gm, inputs, until="kernel_gen", options=options)
        if profile is not None:
            profile.disable()
        nodes = sum(len(gm.graph.nodes) for gm, _ in graphs)
        print(f"{name:16s} {mode}: {len(graphs)} graphs, {nodes} FX nodes, passes {time.perf_counter() - t0:.1f} s",
              flush=True)
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
