"""Device probe: what cuDNN's conv1d costs in each input layout, and coil's 1-d
convolutions as 2-d ones (conv_taps.TapsChoice.rows_2d) on the models that have them.

Part `encoder`: Wav2Vec2's feature encoder at the models suite's size
(bench/hf_models.py: 8 x 81920 samples, 512 channels, seven convolutions with GELU,
the first with GroupNorm), run eagerly in $DTYPE (default bfloat16) in three forms:
as the model has it (every activation (batch, channels, frames) contiguous); with
every convolution's input made channel-minor first (strides (frames x channels, 1,
channels)); and each convolution as the 2-d convolution of one row it is, on
channels-last (batch, channels, 1, frames) tensors.  For each form: every CUDA
kernel a call runs, by total time (the profiler), so cuDNN's own layout conversions
(nchwToNhwc / nhwcToNchw) show apart from its convolution kernels (the copies a
form makes to change layouts are listed too: coil's kernels would write those
layouts), and the outputs are checked against each other.  Session 57 (H100): the
first two forms both spent 624-631 of 1610 µs in cuDNN's conversions (PyTorch's
conv1d makes its input contiguous first).

Part `models`: for each model in $MODELS (default wav2vec2,whisper_encoder) at the
models suite's small size, inference and a training step by Inductor, by coil, and
by coil with rows_2d on the CPU only (1-d convolutions kept 1-d on CUDA), timed in
interleaved rounds (do_bench, median of $ROUNDS, default 5), with each one's kernels
and GPU time a step.  $PARTS (default encoder,models) picks the parts.  Run from the
repository root on a CUDA machine: `python3 bench/probes/conv1d_layouts.py`.

Session 58 (H100, bfloat16), before rows_2d held "cuda" by default; GPU µs a step
(kernels), Inductor / coil 1-d / coil 2-d:
    wav2vec2 small         infer   3142 (182)   3148 (178)   2580 (150)
    wav2vec2 small         train   7520 (468)   6675 (430)   6436 (408)
    whisper_encoder small  infer    339 (78)     324 (73)     288 (70)
    whisper_encoder small  train   1274 (284)   1255 (267)   1257 (267)
The third form above spent 169 µs in conversions where the first spent 630."""
import functools
import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import step_call  # noqa: E402
from bench.probes.common import kernels_per_step, timed_rounds  # noqa: E402
from coil.backends.dynamo import coil_backend  # noqa: E402
from coil.passes.lowerings.conv_taps import TapsChoice  # noqa: E402

DTYPE = getattr(torch, os.environ.get("DTYPE", "bfloat16"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
LAYERS = ((512, 10, 5),) + ((512, 3, 2),) * 4 + ((512, 2, 2),) * 2


def channel_minor(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def encoder(x: torch.Tensor, weights: list[torch.Tensor], norm: torch.nn.GroupNorm, form: str) -> torch.Tensor:
    for i, ((_, _, stride), w) in enumerate(zip(LAYERS, weights)):
        if form == "minor" and i > 0:
            x = channel_minor(x)
        if form == "rows":
            cl = torch.channels_last
            x = F.conv2d(x.unsqueeze(2).contiguous(memory_format=cl), w.unsqueeze(2).contiguous(memory_format=cl),
                         stride=(1, stride)).squeeze(2)
        else:
            x = F.conv1d(x, w, stride=stride)
        if i == 0:
            x = norm(x)
        x = F.gelu(x)
    return x


FORMS = {"plain": "as the model has it", "minor": "channel-minor inputs", "rows": "2-d of one row, channels-last"}


def encoder_part() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights, cin = [], 1
    for c, k, _ in LAYERS:
        weights.append(torch.randn(c, cin, k, device=dev, dtype=DTYPE) * (cin * k) ** -0.5)
        cin = c
    norm = torch.nn.GroupNorm(512, 512).to(dev, DTYPE)
    x = torch.randn(8, 1, 81920, device=dev, dtype=DTYPE)
    with torch.no_grad():
        outs = {}
        for form, name in FORMS.items():
            outs[form] = encoder(x, weights, norm, form)
            print(f"== {name}: output strides {outs[form].stride()}", flush=True)
            rows = kernels_per_step(lambda form=form: encoder(x, weights, norm, form))
            total = sum(us for _, _, us in rows)
            layout = sum(us for k, _, us in rows if "To" in k and ("nchw" in k.lower() or "nhwc" in k.lower()))
            print(f"   {sum(n for _, n, _ in rows)} kernels, {total:.1f} us on the GPU, "
                  f"{layout:.1f} us of them cuDNN's layout conversions", flush=True)
            for k, n, us in rows[:12]:
                print(f"   {us:9.1f} us  {n:3d} x  {k[:110]}", flush=True)
        for form in ("minor", "rows"):
            torch.testing.assert_close(outs[form], outs["plain"], atol=3e-2, rtol=3e-2)


def models_part(names: list[str]) -> None:
    for name in names:
        for mode in ("infer", "train"):
            torch.manual_seed(0)
            model, inputs = make_case(name, mode, "cuda", size=SIZES["small"], dtype=DTYPE)
            torch._dynamo.reset()
            compiled = {
                "inductor": torch.compile(model),
                "coil": torch.compile(model, backend="coil"),
                "coil 1-d on cuda": torch.compile(model, backend=functools.partial(
                    coil_backend, taps=TapsChoice(rows_2d=("cpu",)))),
            }
            fns = {k: step_call(f, model, inputs, mode, False) for k, f in compiled.items()}
            for f in fns.values():
                f()
                f()
            timed_rounds(f"{name} small {mode}", fns, ROUNDS)
            for key, fn in fns.items():
                rows = kernels_per_step(fn)
                print(f"   {key}: {sum(n for _, n, _ in rows)} kernels, {sum(us for _, _, us in rows):.1f} us on "
                      "the GPU; " + "; ".join(f"{k[:50]} {us:.1f}" for k, _, us in rows[:3]), flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0), DTYPE, flush=True)
    parts = os.environ.get("PARTS", "encoder,models").split(",")
    if "encoder" in parts:
        encoder_part()
    if "models" in parts:
        models_part(os.environ.get("MODELS", "wav2vec2,whisper_encoder").split(","))
