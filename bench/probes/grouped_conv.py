"""Device probe: Wav2Vec2's positional convolution, a grouped conv1d with a long
kernel (2048 channels in 16 groups, 128 taps, padding 64, over 256 frames of 8
clips at the suite's large size; 512 channels at the small one), in bfloat16.
It is an Extern call for eager, Inductor and coil alike; the models suite's
large Wav2Vec2 rows sit at coil/Inductor 1.00 (40.7 against 40.8 ms on the H200),
so the time is in this call.  Times aten's convolution (cuDNN) forward and
forward + backward against the same sum as matrix products over the taps
(`taps` at a time: the padded input viewed as (batch, group, channel x taps,
frame) by strides, copied chunk by chunk, and multiplied by bmm), and prints the
kernels cuDNN runs.  Run from the repository root on a CUDA machine:
`python3 bench/probes/grouped_conv.py`."""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.testing import do_bench  # noqa: E402


def conv_as_bmm(x: torch.Tensor, w: torch.Tensor, groups: int, pad: int, taps: int) -> torch.Tensor:
    """conv1d(x, w, padding=pad, groups=groups) as sum over tap chunks of bmm."""
    b, c, t = x.shape
    o, cg, k = w.shape
    g = groups
    og = o // g
    tout = t + 2 * pad - k + 1
    xp = F.pad(x, (pad, pad))
    wg = w.view(g, og, cg, k)
    out = None
    for k0 in range(0, k, taps):
        kk = min(taps, k - k0)
        # (b, g, cg, kk, tout): element [.., ci, j, s] = xp[b, g*cg + ci, s + k0 + j]
        view = xp.as_strided((b, g, cg, kk, tout), (c * xp.shape[-1], cg * xp.shape[-1], xp.shape[-1], 1, 1),
                             xp.storage_offset() + k0)
        cols = view.permute(1, 2, 3, 0, 4).reshape(g, cg * kk, b * tout)  # the copy
        wk = wg[..., k0:k0 + kk].reshape(g, og, cg * kk)
        part = torch.bmm(wk, cols)  # (g, og, b * tout)
        out = part if out is None else out.add_(part)
    assert out is not None
    return out.view(g, og, b, tout).permute(2, 0, 1, 3).reshape(b, o, tout)


def main() -> None:
    dev = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    for name, c in (("small", 512), ("large", 2048)):
        g, k, pad, b, t = 16, 128, 64, 8, 256
        x = torch.randn(b, c, t, device=dev, dtype=torch.bfloat16)
        w = torch.randn(c, c // g, k, device=dev, dtype=torch.bfloat16) * 0.02
        ref = F.conv1d(x.double(), w.double(), padding=pad, groups=g)
        eager = F.conv1d(x, w, padding=pad, groups=g)
        rows = [("cudnn", lambda: F.conv1d(x, w, padding=pad, groups=g))]
        for taps in (8, 16, 32, 128):
            got = conv_as_bmm(x, w, g, pad, taps)
            err = (got.double() - ref).pow(2).mean().sqrt().item()
            e_err = (eager.double() - ref).pow(2).mean().sqrt().item()
            print(f"{name} taps={taps}: RMSE vs fp64 {err:.3g} (cudnn {e_err:.3g})")
            rows.append((f"bmm taps={taps}", lambda taps=taps: conv_as_bmm(x, w, g, pad, taps)))
        for label, fn in rows:
            ms = do_bench(fn, warmup=5, rep=50)
            print(f"{name} fwd {label:14s} {ms * 1000:9.1f} us")
        xg = x.clone().requires_grad_(True)
        wg = w.clone().requires_grad_(True)
        go = torch.randn_like(eager)

        def fb_cudnn() -> None:
            torch.autograd.grad(F.conv1d(xg, wg, padding=pad, groups=g), (xg, wg), go)

        def fb_bmm(taps: int) -> None:
            torch.autograd.grad(conv_as_bmm(xg, wg, g, pad, taps), (xg, wg), go)
        print(f"{name} fwd+bwd cudnn          {do_bench(fb_cudnn, warmup=3, rep=50) * 1000:9.1f} us")
        for taps in (16, 32):
            print(f"{name} fwd+bwd bmm taps={taps:3d}  {do_bench(lambda: fb_bmm(taps), warmup=3, rep=50) * 1000:9.1f} us")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fb_cudnn()
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            if ev.device_time_total > 0:
                print(f"  {name} cudnn kernel {ev.key[:90]}: {ev.device_time_total:.0f} us x{ev.count}")


if __name__ == "__main__":
    main()
