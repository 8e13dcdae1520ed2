"""CPU probe: the C++ target's long float sums, against eager, in time and in
distance from the float64 result.  Runs on the CPU from the repository root
(THREADS=n, default 1; DYNAMIC=1 compiles through torch.compile(dynamic=True), the
sizes symbolic).

Session 33 (2026-12-05, the 2-vCPU VM, one thread, medians of 7 x 10 calls), before
(703a714) / after the blocked sums (8d1f888, 30db2cf), ms: x.sum() of 2^20 float32
0.619 / 0.145 (eager 0.150), of 2^24 16.1 / 2.70 (eager 2.59), var_mean over rows of
2^18 (8 rows) 2.41 / 0.48 (eager 12.0); rows of 16384, softmax and layer_norm
unchanged.  Distance from float64 (before / after / eager): the sum of (64, 16384)
values near 3 clamped to +-0.0447, 5.12 / 0.030 / 0.011; a column sum of (65536, 64)
2.36 / 0.067 at 30db2cf (blocks of 1024 rows) / 0.036, and 0.167 since the column
blocks became about the square root of the rows (256 here, 3.9x eager's: the chain
of block sums, at the sum's full size, is the longer one).  Session 34: blocks of
about rows ** (2/3) (2048 here), 0.0745 against eager's 0.0433, 0.615 ms against
eager's 0.996.  Before, a split's part
was one scalar add chain (no omp simd) and a column one add chain per lane.

Session 38 (2250b0b..bb92279, one thread, under a helper's load), coil / eager ms and
distance from float64: sums of 0.1 in blocks folded in double, a split's part in
blocks of 256: 2^16 values 0.005 / 0.003 ms, 0.000977 / 0.000977 (before, 6.7e-7
relative off: 4.5x eager's); 2^24 values 2.82 / 2.50 ms, 0.25 / 1.5; a channels-last
x.sum() (1, 64, 32, 32) read in memory order 0.005 / 0.004 ms (57 us before);
softmax over (64, 32000) 1.91 / 1.26 ms (10.1 before: its reciprocal's bool guard
kept the dividing loop scalar).  DYNAMIC=1: x.sum(0) of (65536, 64) in lanes 1.18 /
1.08 ms (26.8 on rows before), x.sum() of 2^24 values of 0.1 in blocks 1.12 / 1.5 from
float64 (2.5e-3 relative off before, at 2^22); softmax over (256, 4096) with row
scratch sized at run time (session 39) 0.76 ms, static 0.75 (1.03 before, in one
A/B); the channels-last sum in memory order by its strides' hints, its loops merged
into one (session 39): 0.081 -> 0.023 ms (the dynamic call's host work is most of it);
x.sum() of 2^24 values split among threads as a static one is (session 39): THREADS=2
2.56 -> 1.28 ms, and 0.25 from float64 (1.12 before: the parts fold in double)."""
import os
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil

def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)) + 3


CASES = {
    "full_sum_1M": (lambda x: (x.sum(),), (1 << 20,)),
    "sum_of_0.1_2^16": (lambda x: (x.sum(),), lambda: torch.full((1 << 16,), 0.1)),
    "sum_of_0.1_2^24": (lambda x: (x.sum(),), lambda: torch.full((1 << 24,), 0.1)),
    "channels_last_sum": (lambda x: (x.sum(),), lambda: _randn(1, 64, 32, 32).to(memory_format=torch.channels_last)),
    "softmax_64x32000": (lambda x: (x.softmax(-1),), (64, 32000)),
    "full_sum_16M": (lambda x: (x.sum(),), (1 << 24,)),
    "row_sum_64x16384": (lambda x: (x.sum(-1),), (64, 16384)),
    "column_sum_65536x64": (lambda x: (x.sum(0),), (65536, 64)),
    "softmax_256x4096": (lambda x: (x.softmax(-1),), (256, 4096)),
    "layernorm_512x2048": (lambda x: (torch.nn.functional.layer_norm(x, (2048,)),), (512, 2048)),
    "var_mean_8x262144": (lambda x: torch.var_mean(x, -1), (8, 1 << 18)),
}


def median_ms(fn, x) -> float:
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(10):
            fn(x)
        times.append((time.perf_counter() - t0) / 10)
    return sorted(times)[3] * 1e3


def main() -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    dynamic = os.environ.get("DYNAMIC") == "1"
    for name, (f, shape) in CASES.items():
        x = shape() if callable(shape) else _randn(*shape)
        if dynamic:  # through torch.compile, its sizes symbolic (Dynamo's dynamic=True)
            torch._dynamo.reset()
            c = torch.compile(f, backend="coil", dynamic=True, options={"target": "cpp"})
        else:
            c = coil.compile_graph(make_fx(f)(x), [x], coil.Options(target="cpp", graph_cache=False))
        exact = f(x.double())
        err = max((g.double() - e).abs().max().item() for g, e in zip(c(x), exact))
        eager_err = max((g.double() - e).abs().max().item() for g, e in zip(f(x), exact))
        print(f"{name:22s} coil {median_ms(c, x):8.3f} ms  eager {median_ms(f, x):8.3f} ms   "
              f"from float64: coil {err:.3g}, eager {eager_err:.3g}", flush=True)


if __name__ == "__main__":
    main()
