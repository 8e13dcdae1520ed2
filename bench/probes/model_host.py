"""Device probe: where the host's time goes in a real model's call.  For each model
named on the command line (bench/hf_models.py names; default gpt2, llama,
mobilenet_v2), inference at the models suite's `small` size in bf16: host time per
call (enqueue only) and wall time per call (synchronised) for eager, Inductor and
coil; then a cProfile of coil's calls by own time, and the first lines of coil's
largest output_code.py call.  Run from the repository root on a CUDA machine."""
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.probes.common import host_us  # noqa: E402
from bench.variants import Capture, make_callable, record_coil_graphs  # noqa: E402


def wall_us(fn, n=100):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    names = sys.argv[1:] or ["gpt2", "llama", "mobilenet_v2"]
    for name in names:
        model, inputs = make_case(name, "infer", "cuda", size=SIZES["small"], dtype=torch.bfloat16)
        calls = {}
        for v in ("eager", "inductor", "coil"):
            f = make_callable(v, model, "triton", None)

            def call(f=f):
                with torch.no_grad():
                    return f(**inputs)
            cap = Capture()
            with record_coil_graphs(cap):
                call()
            for _ in range(2):
                call()
            if v == "coil":
                graphs = [g for g in cap.coil_graphs if g is not None]
            calls[v] = call
        for rnd in range(2):
            for v, c in calls.items():
                print(f"{name:14s} {v:9s} host {host_us(c, 100):8.1f} us  wall {wall_us(c):8.1f} us", flush=True)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            calls["coil"]()
        pr.disable()
        torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(28)
        if graphs:
            text = max((g.source for g in graphs), key=len)
            i = text.find("def call(")
            print(text[i:i + 5000])


if __name__ == "__main__":
    main()
