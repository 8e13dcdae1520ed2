"""Device probe: where dynamic coil loses to static coil on the dynamic suite's small
batches.  For each batch workload (default: the eight of `--suite dynamic`) and each
batch size (BATCHES, default 1,2,5,8,13,32), dynamic coil (one graph for every size)
and static coil (one per size) are called under do_bench (wall µs a call), on the host
alone (µs a call to enqueue, bench.probes.common.host_us) and under the profiler (GPU µs
a call, kernel by kernel), so a gap shows as the host's or the kernels'.  Sources go to
$OUT/dynamic-small/<variant>/ (COIL_DUMP_SOURCES), the kernel rows to stdout.

    ONLY=rms_norm,cross_entropy BATCHES=1,8 python3 bench/probes/dynamic_small.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from bench.dynamic import BATCH_WORKLOADS, FUNCTIONS, SIZES, batch_workload  # noqa: E402
from bench.probes.common import OUT, bench_us, host_us, kernels_per_step  # noqa: E402

SIZE = SIZES["gpu"]
ONLY = tuple(n for n in os.environ.get("ONLY", ",".join(BATCH_WORKLOADS)).split(",") if n)
BATCHES = tuple(int(b) for b in os.environ.get("BATCHES", "1,2,5,8,13,32").split(",") if b)


def measure(name: str, dynamic: bool) -> dict[int, tuple[float, float, list[tuple[str, int, float]]]]:
    torch._dynamo.reset()
    torch._dynamo.config.cache_size_limit = 64
    os.environ["COIL_DUMP_SOURCES"] = os.path.join(OUT, "dynamic-small", "dynamic" if dynamic else "static")
    fn = torch.compile(FUNCTIONS[name], backend="coil", dynamic=dynamic, options={"target": "triton"})
    out = {}
    for b in BATCHES:
        inst = batch_workload(name, SIZE, b).build(torch.device("cuda"))
        ref = inst.fn(*inst.inputs)
        got = fn(*inst.inputs)
        torch.testing.assert_close(got, ref, rtol=inst_tol(name), atol=inst_tol(name))
        call = lambda inst=inst: fn(*inst.inputs)  # noqa: E731
        out[b] = (bench_us(call), host_us(call), kernels_per_step(call))
    return out


def inst_tol(name: str) -> float:
    return 1e-3 if name in ("seed", "add_transpose") else 3e-2


def main() -> None:
    print(f"torch {torch.__version__}; batches {BATCHES}", flush=True)
    for name in ONLY:
        dyn = measure(name, True)
        sta = measure(name, False)
        print(f"== {name}: µs a call (wall do_bench / host enqueue / GPU kernels)", flush=True)
        for b in BATCHES:
            row = []
            for label, m in (("dyn", dyn), ("static", sta)):
                wall, host, ks = m[b]
                gpu = sum(k[2] for k in ks)
                row.append(f"{label} {wall:7.1f} / {host:6.1f} / {gpu:7.1f}")
            print(f"  batch {b:3d}  " + "   ".join(row) + f"   dyn/static {dyn[b][0] / sta[b][0]:.2f}", flush=True)
        for b in BATCHES:
            for label, m in (("dyn", dyn), ("static", sta)):
                for k, n, us in m[b][2]:
                    print(f"    b{b} {label:6s} {us:7.1f} us x{n} {k[:90]}", flush=True)


if __name__ == "__main__":
    main()
