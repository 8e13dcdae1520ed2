"""Device probe: BatchNorm's statistics in training, channels-last bf16, the
kernels where ResNet's training step loses most GPU time to Inductor on the H200
(stop 20: coil's split statistics and their combines 9.7 µs a layer of 128
channels at 28x28, Inductor's 4.4).  For each of ResNet's BatchNorm shapes, a
forward (var_mean over N, H, W, then the normalised output) and a backward's
reductions (sum of the gradient and of gradient x centred input, then dx):
Inductor against coil with each set of split traits below (TRITON_SPLITS
patched for the probe only), timed in interleaved rounds, then every kernel of
each variant with its time (the profiler) so the first launch and the combine
show apart.  Run from the repository root on a CUDA machine."""
import os
import sys

sys.path.insert(0, os.getcwd())
import attrs  # noqa: E402
import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import coil  # noqa: E402
from bench.probes.common import kernels_per_step, timed_rounds  # noqa: E402
from coil import options as coil_options  # noqa: E402

SHAPES = [(8, 64, 112, 112), (8, 64, 56, 56), (8, 128, 28, 28), (8, 256, 14, 14), (8, 512, 7, 7)]
BASE = coil_options.TRITON_SPLITS
SPLITS = {
    "coil": BASE,
    "x64r32": attrs.evolve(BASE, column_xblock=64, column_rblock=32),
    "x64r16": attrs.evolve(BASE, column_xblock=64, column_rblock=16),
    "chunk256": attrs.evolve(BASE, min_column_chunk=256),
    "x64chunk256": attrs.evolve(BASE, column_xblock=64, column_rblock=32, min_column_chunk=256),
    "parts64": attrs.evolve(BASE, max_column_parts=64),
    "nosplit": attrs.evolve(BASE, column_min=1 << 40),
}


def forward(x, w, b):
    xf = x.float()
    var, mean = torch.var_mean(xf, dim=[0, 2, 3], correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    y = (xf - mean[None, :, None, None]) * (rstd * w)[None, :, None, None] + b[None, :, None, None]
    return y.to(torch.bfloat16), mean, rstd


def backward(g, x, mean, rstd, w):
    gf, xc = g.float(), x.float() - mean[None, :, None, None]
    s1 = gf.sum([0, 2, 3])
    s2 = (gf * xc).sum([0, 2, 3])
    n = x.numel() // x.shape[1]
    dx = (gf - s1[None, :, None, None] / n - xc * (s2 * rstd * rstd / n)[None, :, None, None]) \
        * (rstd * w)[None, :, None, None]
    return dx.to(torch.bfloat16), s1, s2


def launch_line(line: str) -> str:
    """A launch's kernel, grid and config, without its arguments."""
    call = line.split("# ")[-1].strip()
    return call.split("](")[0] + "] " + call[call.find("XBLOCK="):]


def compiled(fn, inputs, splits):
    traits = coil_options.TARGET_TRAITS["triton"]
    coil_options.TARGET_TRAITS["triton"] = attrs.evolve(traits, splits=splits)
    try:
        gm = make_fx(fn)(*inputs)
        return coil.compile_graph(gm, list(inputs), coil.Options(target="triton", graph_cache=False))
    finally:
        coil_options.TARGET_TRAITS["triton"] = traits


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    for shape in SHAPES:
        c = shape[1]
        x = torch.randn(shape, device=dev).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        g = torch.randn(shape, device=dev).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
        w, b = torch.rand(c, device=dev) + 0.5, torch.randn(c, device=dev)
        mean, rstd = forward(x, w, b)[1:]
        for label, fn, inputs in (("forward", forward, (x, w, b)), ("backward", backward, (g, x, mean, rstd, w))):
            ref = fn(*inputs)
            torch._dynamo.reset()
            ind = torch.compile(fn)
            ind(*inputs)
            fns = {"inductor": lambda ind=ind, inputs=inputs: ind(*inputs)}
            launches = {}
            for name, splits in SPLITS.items():
                cf = compiled(fn, inputs, splits)
                for a, e in zip(cf(*inputs), ref):
                    torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2)
                fns[name] = lambda cf=cf, inputs=inputs: cf(*inputs)
                launches[name] = [launch_line(ln) for ln in cf.module.source.splitlines()
                                  if "triton_" in ln and "](" in ln and "XBLOCK=" in ln]
            timed_rounds(f"{label} {shape}", fns, 5)
            for name, f in fns.items():
                rows = [r for r in kernels_per_step(f) if "triton" in r[0] or "coil" in r[0]]
                print(f"  {name:12s} " + "; ".join(f"{k[-28:]} {us:.2f}" for k, _, us in rows), flush=True)
                for ln in launches.get(name, []):
                    print(f"      {ln}", flush=True)


if __name__ == "__main__":
    main()
