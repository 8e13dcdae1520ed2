"""Device probe: the transformer block's step is bound by the host on the H200
(transformer_profile.py: coil's kernels take 1.48 ms a step, the step 2.6-3.1 ms).
Host time per step for eager, Inductor and coil, and a cProfile of coil's steps by
own time, to show where the host's microseconds go."""
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.probes.common import host_us, workload_steps  # noqa: E402


def main():
    steps = workload_steps("gpu", "transformer_block", ("eager", "inductor", "coil"))
    for variant, step in steps.items():
        print(f"{variant:9s} host {host_us(step, 50):8.1f} us a step", flush=True)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(50):
        steps["coil"]()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
