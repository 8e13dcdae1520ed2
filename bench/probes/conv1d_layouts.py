"""Device probe: what cuDNN's conv1d costs in each input layout.  Wav2Vec2's feature
encoder at the models suite's size (bench/hf_models.py: 8 x 81920 samples, 512
channels, seven convolutions with GELU, the first with GroupNorm), run eagerly in
$DTYPE (default bfloat16) in two forms: as the model has it (every activation
(batch, channels, frames) contiguous), and with every convolution's input made
channel-minor first (strides (frames x channels, 1, channels): what a fused kernel
writing the activation could lay out at no cost).  For each form: every CUDA kernel
a call runs, by total time (the profiler), so cuDNN's own layout conversions
(nchwToNhwc / nhwcToNchw) show apart from its convolution kernels; the copies the
second form makes to change layouts are listed too (coil would not run them), and
the outputs are checked against each other.  Run from the repository root on a
CUDA machine: `python3 bench/probes/conv1d_layouts.py`."""
import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.probes.common import kernels_per_step  # noqa: E402

DTYPE = getattr(torch, os.environ.get("DTYPE", "bfloat16"))
LAYERS = ((512, 10, 5),) + ((512, 3, 2),) * 4 + ((512, 2, 2),) * 2


def channel_minor(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def encoder(x: torch.Tensor, weights: list[torch.Tensor], norm: torch.nn.GroupNorm, minor: bool) -> torch.Tensor:
    for i, ((_, _, stride), w) in enumerate(zip(LAYERS, weights)):
        if minor and i > 0:
            x = channel_minor(x)
        x = F.conv1d(x, w, stride=stride)
        if i == 0:
            x = norm(x)
        x = F.gelu(x)
    return x


def main() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights, cin = [], 1
    for c, k, _ in LAYERS:
        weights.append(torch.randn(c, cin, k, device=dev, dtype=DTYPE) * (cin * k) ** -0.5)
        cin = c
    norm = torch.nn.GroupNorm(512, 512).to(dev, DTYPE)
    x = torch.randn(8, 1, 81920, device=dev, dtype=DTYPE)
    print(torch.cuda.get_device_name(0), DTYPE, flush=True)
    with torch.no_grad():
        outs = {}
        for minor in (False, True):
            name = "channel-minor inputs" if minor else "as the model has it"
            outs[minor] = encoder(x, weights, norm, minor)
            print(f"== {name}: output strides {outs[minor].stride()}", flush=True)
            rows = kernels_per_step(lambda: encoder(x, weights, norm, minor))
            total = sum(us for _, _, us in rows)
            layout = sum(us for k, _, us in rows if "To" in k and ("nchw" in k.lower() or "nhwc" in k.lower()))
            print(f"   {sum(n for _, n, _ in rows)} kernels, {total:.1f} us on the GPU, "
                  f"{layout:.1f} us of them cuDNN's layout conversions", flush=True)
            for k, n, us in rows[:14]:
                print(f"   {us:9.1f} us  {n:3d} x  {k[:110]}", flush=True)
        torch.testing.assert_close(outs[True], outs[False], atol=3e-2, rtol=3e-2)


if __name__ == "__main__":
    main()
