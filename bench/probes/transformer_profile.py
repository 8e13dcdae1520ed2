"""Device probe: the transformer block's forward+backward step (bf16 b8 s1024 d1024
h16), coil against Inductor: time per step (do_bench), the GPU's kernel time per
step from the profiler (so host gaps show as the difference), and each one's
kernels by total time, with coil's Triton kernels named."""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import triton.testing  # noqa: E402

from bench.probes.common import kernels_per_step, workload_steps  # noqa: E402


def main():
    for variant, step in workload_steps("gpu", "transformer_block", ("inductor", "coil", "eager")).items():
        ms = triton.testing.do_bench(step, warmup=25, rep=300, return_mode="median")
        rows = kernels_per_step(step)
        gpu_us = sum(r[2] for r in rows)
        print(f"== {variant}: {ms * 1e3:.0f} us a step, kernels {gpu_us:.0f} us a step, "
              f"{sum(r[1] for r in rows)} launches", flush=True)
        for name, n, us in rows[:22]:
            print(f"   {us:8.1f} us  x{n:<3d} {name[:100]}", flush=True)
    torch._dynamo.reset()


if __name__ == "__main__":
    main()
