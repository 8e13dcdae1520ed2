"""Device probe: Wav2Vec2's positional convolution, a grouped conv1d with a long
kernel (16 groups, 128 taps, padding 64, over 256 frames of 8 clips; 512
channels at the models suite's small size, 2048 at its large one), in bfloat16.
It is an Extern call (cuDNN) for eager and Inductor; the suite's large Wav2Vec2
rows sat at coil/Inductor 1.00 (40.7 against 40.8 ms on the H200), so the time
is in this call.  Times aten's convolution forward, and forward + backward,
against coil's by-taps form (passes/lowerings/conv_taps.py, run eagerly: the
same aten ops coil's graph calls, with its pointwise parts unfused) at several
chunk sizes, for 128 taps and for fewer (where LONG_TAPS puts the line), and
prints the kernels cuDNN runs.  Run from the repository root on a CUDA machine:
`python3 bench/probes/grouped_conv.py`."""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from coil.passes.lowerings import conv_taps  # noqa: E402


def us(fn) -> str:
    return f"{do_bench(fn, warmup=3, rep=40) * 1000:9.1f} us"


def main() -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("device:", torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch", torch.__version__)
    shapes = (("small", 512, 128), ("large", 2048, 128), ("small", 512, 64), ("small", 512, 32),
              ("small", 512, 16))
    for name, c, k in shapes:
        g, b, t = 16, 8, 256
        pad = k // 2
        x = torch.randn(b, c, t, device=dev, dtype=torch.bfloat16)
        w = torch.randn(c, c // g, k, device=dev, dtype=torch.bfloat16) * 0.02
        ref = F.conv1d(x.double(), w.double(), padding=pad, groups=g)
        eager = F.conv1d(x, w, padding=pad, groups=g)
        e_err = (eager.double() - ref).pow(2).mean().sqrt().item()
        label = f"{name} c={c} k={k}"
        go = torch.randn_like(eager)
        args = ([1], [pad], [1], False, [0], g)
        print(f"{label} fwd cudnn      {us(lambda: F.conv1d(x, w, padding=pad, groups=g))}")
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        print(f"{label} fwd+bwd cudnn  {us(lambda: torch.autograd.grad(F.conv1d(xg, wg, padding=pad, groups=g), (xg, wg), go))}")
        default = conv_taps.CHUNK_BYTES
        for mib in (16, 64, 256):
            conv_taps.CHUNK_BYTES = mib << 20
            kk = conv_taps.taps_a_chunk(b, c, eager.shape[-1], k, 2)
            got = conv_taps.by_taps(x, w, None, *args)
            err = (got.double() - ref).pow(2).mean().sqrt().item()

            def fb() -> None:
                y = conv_taps.by_taps(x, w, None, *args)
                conv_taps.backward_by_taps(go, x, w, [c], *args, [True, True, False])
                del y
            print(f"{label} taps {kk:3d} a chunk ({mib} MiB): fwd {us(lambda: conv_taps.by_taps(x, w, None, *args))}, "
                  f"fwd+bwd {us(fb)}; RMSE vs fp64 {err:.3g} (cudnn {e_err:.3g})")
        conv_taps.CHUNK_BYTES = default
        if k == 128:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                torch.autograd.grad(F.conv1d(xg, wg, padding=pad, groups=g), (xg, wg), go)
                torch.cuda.synchronize()
            for ev in prof.key_averages():
                if ev.device_time_total > 0:
                    print(f"  {label} cudnn kernel {ev.key[:80]}: {ev.device_time_total:.0f} us x{ev.count}")


if __name__ == "__main__":
    main()
