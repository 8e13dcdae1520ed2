"""Device probe: convolutions of one input channel a group and few taps, as cuDNN's
convolution (what Inductor and coil call now) against the same sum written as
pointwise products of strided slices (what a lowering by taps would hand coil's
fusion).  Two blocks, each compiled by Inductor and by coil in both forms, timed in
interleaved rounds (do_bench, the median of $ROUNDS, default 5) in $DTYPE (default
bfloat16), inference and a training step:

- Wav2Vec2's first feature layer at the models suite's small size: conv1d 1 -> 512
  channels, 10 taps, stride 5, no bias, over 8 x 81920 samples, then GroupNorm of
  512 groups and GELU (bench/hf_models.py's Wav2Vec2);
- a MobileNetV2 depthwise block: 3x3 conv of 144 groups, stride 1, padding 1, over
  32 x 144 x 56 x 56, then BatchNorm (eval statistics) and ReLU6.

Each form is checked against eager first.  Run from the repository root on a CUDA
machine: `python3 bench/probes/few_taps.py`; `DEVICE=cpu DTYPE=float32` compiles
(cpp) and checks every case without timing it.

Session 57 (H100, bf16) ran it with a lowering that took every such convolution by
taps on CUDA (`coil aten` below was that lowering's; it is not in coil):

    block            step   Inductor aten   coil aten   Inductor taps   coil taps   (GPU µs)
    wav2vec2 conv0   infer  504 (4 kernels) 535 (1)     442 (1)         534 (1)
    wav2vec2 conv0   train  2634            2693        2760            2709
    depthwise 3x3    infer  77              79          59              79
    depthwise 3x3    train  552             743         555             702

Fused into one kernel, the products are recomputed in the GroupNorm's two passes
over 16 383 frames a row, and that kernel takes longer than cuDNN's convolution and
Inductor's GroupNorm together; in the models (Wav2Vec2 small: GPU 3192 µs a step by
taps, 3135 without, infer; 6958 and 6707 train) nothing was gained, so coil keeps
cuDNN's convolution here."""
import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.probes.common import kernels_per_step, timed_rounds  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "5"))
DTYPE = getattr(torch, os.environ.get("DTYPE", "bfloat16"))
dev = torch.device(os.environ.get("DEVICE", "cuda"))
TARGET = "triton" if dev.type == "cuda" else "cpp"


def taps_1d(x: torch.Tensor, w: torch.Tensor, stride: int) -> torch.Tensor:
    """conv1d(x, w, stride) for x of one channel: the sum over taps j of x's frames
    from j every `stride` times w[:, 0, j]."""
    k = w.shape[-1]
    tout = (x.shape[-1] - k) // stride + 1
    out = None
    for j in range(k):
        part = x[:, :, j:j + stride * (tout - 1) + 1:stride] * w[:, 0, j].view(1, -1, 1)
        out = part if out is None else out + part
    return out


def taps_depthwise(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A depthwise 3x3 conv2d, stride 1, padding 1, as nine shifted products."""
    h, wd = x.shape[-2:]
    xp = F.pad(x, [1, 1, 1, 1])
    out = None
    for i in range(3):
        for j in range(3):
            part = xp[:, :, i:i + h, j:j + wd] * w[:, 0, i, j].view(1, -1, 1, 1)
            out = part if out is None else out + part
    return out


class Feature0(torch.nn.Module):
    def __init__(self, by_taps: bool) -> None:
        super().__init__()
        self.by_taps = by_taps
        self.conv = torch.nn.Conv1d(1, 512, 10, stride=5, bias=False)
        self.norm = torch.nn.GroupNorm(512, 512)

    def forward(self, x):
        y = taps_1d(x, self.conv.weight, 5) if self.by_taps else self.conv(x)
        return F.gelu(self.norm(y))


class Depthwise(torch.nn.Module):
    def __init__(self, by_taps: bool) -> None:
        super().__init__()
        self.by_taps = by_taps
        self.conv = torch.nn.Conv2d(144, 144, 3, padding=1, groups=144, bias=False)
        self.bn = torch.nn.BatchNorm2d(144)

    def forward(self, x):
        y = taps_depthwise(x, self.conv.weight) if self.by_taps else self.conv(x)
        return F.relu6(self.bn(y))


def run(name, make_block, x) -> None:
    torch.manual_seed(0)
    blocks = {f: make_block(f == "taps").to(dev, DTYPE) for f in ("aten", "taps")}
    blocks["taps"].load_state_dict(blocks["aten"].state_dict())
    for b in blocks.values():
        b.eval()
    with torch.no_grad():
        want = blocks["aten"](x)
        torch.testing.assert_close(blocks["taps"](x), want, atol=5e-2, rtol=5e-2)
    torch._dynamo.reset()
    compiled = {}
    for form, b in blocks.items():
        compiled[f"inductor {form}"] = (b, torch.compile(b))
        compiled[f"coil {form}"] = (b, torch.compile(b, backend="coil", options={"target": TARGET}))
    for mode in ("infer", "train"):
        def step(b, f, mode=mode):
            if mode == "infer":
                with torch.no_grad():
                    return f(x)
            for p in b.parameters():
                p.grad = None
            f(x).float().square().mean().backward()
        fns = {}
        for key, (b, f) in compiled.items():
            if mode == "infer":
                with torch.no_grad():
                    torch.testing.assert_close(f(x), want, atol=5e-2, rtol=5e-2)
            step(b, f)
            fns[key] = lambda b=b, f=f: step(b, f)
        if dev.type != "cuda":
            for f in fns.values():
                f()
            print(f"== {name} {mode}: checked, not timed ({', '.join(fns)})", flush=True)
            continue
        timed_rounds(f"{name} {mode}", fns, ROUNDS, base="inductor aten")
        for key, fn in fns.items():
            rows = kernels_per_step(fn)
            total = sum(us for _, _, us in rows)
            print(f"   {key}: {sum(n for _, n, _ in rows)} kernels, {total:.1f} us on the GPU; "
                  + "; ".join(f"{k[:60]} {us:.1f}" for k, _, us in rows[:4]), flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", DTYPE, flush=True)
    small = dev.type != "cuda"  # the CPU only checks: smaller inputs
    run("wav2vec2 conv0", Feature0, torch.randn(8, 1, 8192 if small else 81920, device=dev, dtype=DTYPE))
    run("depthwise 3x3", Depthwise, torch.randn(4 if small else 32, 144, 56, 56, device=dev, dtype=DTYPE))
