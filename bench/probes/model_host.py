"""Device probe: where the host's time goes in a real model's call.  For each model
named on the command line (bench/hf_models.py names; default gpt2, llama,
mobilenet_v2), at the models suite's $SIZE (default `small`) in bf16, in $MODE (infer, the
default, or train: the models suite's step) and $COMPILE_MODE (default, or
reduce-overhead): host time per call (enqueue only) and wall time per call
(synchronised) for eager, Inductor and coil; then a cProfile of coil's calls by own
time (Inductor's too), and the first lines of coil's largest output_code.py call
(with $SOURCES a folder, every coil graph's source is written there; TORCH_LOGS=output_code
prints Inductor's).  Run from the
repository root on a CUDA machine."""
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402
from bench.probes.common import host_us  # noqa: E402
from bench.variants import Capture, record_coil_graphs  # noqa: E402


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
    mode = os.environ.get("MODE", "infer")
    compile_mode = os.environ.get("COMPILE_MODE", "default")
    graphs = []
    for name in names:
        calls = {}
        for v in ("eager", "inductor", "coil"):
            model, inputs = make_case(name, mode, "cuda", size=SIZES[os.environ.get("SIZE", "small")], dtype=torch.bfloat16)
            f = compile_model(v, compile_mode, model, "triton", None)
            call = step_call(f, model, inputs, mode, compile_mode != "default")
            cap = Capture()
            with record_coil_graphs(cap):
                call()
            for _ in range(3):
                call()
            if v == "coil":
                graphs = [g for g in cap.coil_graphs if g is not None]
            calls[v] = call
        print(f"== {name} {mode} {compile_mode}", flush=True)
        for rnd in range(2):
            for v, c in calls.items():
                print(f"{name:14s} {v:9s} host {host_us(c, 100):8.1f} us  wall {wall_us(c):8.1f} us", flush=True)
        for v in ("inductor", "coil"):
            torch.cuda.synchronize()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(50):
                calls[v]()
            pr.disable()
            torch.cuda.synchronize()
            print(f"== cProfile of {v}, 50 calls", flush=True)
            pstats.Stats(pr).sort_stats("tottime").print_stats(28)
            print(f"== cProfile of {v}, 50 calls, by cumulative time", flush=True)
            pstats.Stats(pr).sort_stats("cumulative").print_stats(24)
        if graphs and os.environ.get("SOURCES"):  # every coil graph's output_code.py, in full
            os.makedirs(os.environ["SOURCES"], exist_ok=True)
            for k, g in enumerate(graphs):
                with open(os.path.join(os.environ["SOURCES"], f"{name}-{mode}-{k}.py"), "w") as f:
                    f.write(g.source)
        if graphs:
            text = max((g.source for g in graphs), key=len)
            i = text.find("def call(")
            print(text[i:i + 5000])


if __name__ == "__main__":
    main()
