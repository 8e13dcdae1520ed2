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
import torch  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402

import coil  # noqa: E402
from bench.hf_models import SIZES, make_case  # noqa: E402


def graphs_of(name: str, mode: str) -> list:
    graphs = []

    def capture(gm, inputs):
        graphs.append((gm, list(inputs)))
        return gm.forward

    model, inputs = make_case(name, mode, "cpu", size=SIZES["cpu"], dtype=torch.float32)
    f = torch.compile(model, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture))
    if mode == "train":
        f(**inputs).loss.backward()
    else:
        with torch.no_grad():
            f(**inputs)
    torch._dynamo.reset()
    return graphs


def main() -> None:
    warnings.filterwarnings("ignore")
    mode = os.environ.get("MODE", "train")
    options = coil.Options(target=os.environ.get("TARGET", "triton"))
    profile = cProfile.Profile() if os.environ.get("PROFILE") == "1" else None
    for name in sys.argv[1:] or ["gpt2", "t5", "wav2vec2", "mobilenet_v2"]:
        graphs = graphs_of(name, mode)
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
