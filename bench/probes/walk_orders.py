"""Device probe: realize's walk orders on the GPU.  Pointwise graphs whose outputs
are laid out channels-last or transposed (the layouts a walk order changes), and a
channels-last conv block's inference and training step, each compiled by Inductor
and by coil with `walk_orders` on ("auto") and off, timed in interleaved rounds
(do_bench, the median of $ROUNDS, default 5), in $DTYPE (default bfloat16); the
pointwise graphs (tests/test_walk_order.py's) are checked against eager in float64 first
(the block, tests/test_real_programs.py's at 64 channels, has its numerics tested
there).  Run from the repository root on a CUDA machine:
`python3 bench/probes/walk_orders.py`; `DEVICE=cpu DTYPE=float32` compiles (cpp) and
checks every case here without timing it."""
import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import coil  # noqa: E402
from bench.probes.common import timed_rounds  # noqa: E402

# the graphs and the block of the tests, at the sizes below (tests/ ahead of the root,
# whose conftest.py is not the tests')
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from test_real_programs import _ChannelsLastBlock  # noqa: E402
from test_walk_order import _bias_relu, _taps, _transposed  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "5"))
DTYPE = getattr(torch, os.environ.get("DTYPE", "bfloat16"))
dev = torch.device(os.environ.get("DEVICE", "cuda"))
TARGET = "triton" if dev.type == "cuda" else "cpp"


def timed(name, fns):
    """timed_rounds on a GPU; on the CPU each is only called (the check ran already)."""
    if dev.type == "cuda":
        return timed_rounds(name, fns, ROUNDS)
    for f in fns.values():
        f()
    print(f"== {name}: checked, not timed ({', '.join(fns)})", flush=True)


def cl(*shape):
    return torch.randn(*shape, device=dev, dtype=DTYPE).to(memory_format=torch.channels_last)


CASES = {
    "bias_relu 32x128x56x56": (_bias_relu, lambda: [cl(32, 128, 56, 56), torch.randn(128, device=dev, dtype=DTYPE)]),
    "taps 32x64x56x56": (_taps, lambda: [cl(32, 64, 56, 56), torch.randn(64, 1, 3, 3, device=dev, dtype=DTYPE)]),
    "transposed 8192x4096": (_transposed, lambda: [torch.randn(8192, 4096, device=dev, dtype=DTYPE),
                                                   torch.randn(4096, 1, device=dev, dtype=DTYPE)]),
}


def graphs() -> None:
    for name, (fn, make) in CASES.items():
        args = make()
        want = fn(*[a.double() for a in args])  # eager's bfloat16 rounds each of the taps' products and sums
        gm = make_fx(fn)(*args)
        fns = {"inductor": (lambda f=torch.compile(fn): f(*args))}
        for walk in ("auto", "off"):
            c = coil.compile_graph(gm, args, coil.Options(target=TARGET, graph_cache=False, walk_orders=walk))
            torch.testing.assert_close(c(*args)[0].double(), want, atol=2e-2, rtol=2e-2)
            fns[f"coil walk={walk}"] = lambda c=c: c(*args)
        timed(name, fns)


def block() -> None:
    torch.manual_seed(0)
    model = _ChannelsLastBlock(channels=64, classes=10).to(dev, DTYPE).to(memory_format=torch.channels_last)
    x = cl(32, 3, 112, 112)
    torch._dynamo.reset()
    compiled = {"inductor": torch.compile(model)}
    for walk in ("auto", "off"):
        compiled[f"coil walk={walk}"] = torch.compile(model, backend="coil",
                                                      options={"walk_orders": walk, "target": TARGET})
    for mode in ("infer", "train"):
        def step(f, mode=mode):
            if mode == "infer":
                with torch.no_grad():
                    return f(x)
            for p in model.parameters():
                p.grad = None
            f(x).float().square().mean().backward()
        fns = {}
        for k, f in compiled.items():
            step(f)
            fns[k] = lambda f=f: step(f)
        timed(f"channels-last block {mode}", fns)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", DTYPE, flush=True)
    graphs()
    block()
