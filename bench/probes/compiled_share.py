"""Device probe: how much of a training step's host time is the compiled code's own
(coil's or Inductor's: their wrappers, launches, CUDA-graph replays) and how much is
everyone else's (Dynamo's guards, AOTAutograd's wrappers, the autograd engine, the
model's Python), measured without a profiler: AOTAutograd calls every compiled
graph through `call_func_at_runtime_with_args`, which this wraps with a clock.

For each model named on the command line (bench/hf_models.py names; default t5
bert), at the models suite's `small` size in bf16, for each compile mode in
$COMPILE_MODES (comma-separated; default `default,reduce-overhead`), it prints per
step: the host's enqueue time and, for each function AOTAutograd called, the
host µs a step inside it (the outermost is AOTAutograd's own autograd.Function
around the forward graph; the others are the compiled forward and backward, each
named when it returns, so the inner forward comes first).  The backward runs on
the autograd engine's device thread; the clock counts it there.  Torch 2.11 calls
all three through that function; 2.13 calls only the backward so.
Run from the repository root on a CUDA machine:
`python3 bench/probes/compiled_share.py t5 bert`."""
from __future__ import annotations

import collections
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  (before AOTAutograd's wrappers: they import each other)
import torch._functorch._aot_autograd.runtime_wrappers as rw  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402
from bench.probes.common import host_us  # noqa: E402

STEPS = 50


class Clock:
    """The wrapped call_func_at_runtime_with_args: µs spent in each function it
    calls, by the function's name and the order it was first seen."""

    def __init__(self) -> None:
        self.real = rw.call_func_at_runtime_with_args
        self.spent: collections.Counter[str] = collections.Counter()
        self.names: dict[int, str] = {}
        self.on = False

    def __call__(self, f, args, **kw):
        if not self.on:
            return self.real(f, args, **kw)
        t0 = time.perf_counter()
        try:
            return self.real(f, args, **kw)
        finally:
            name = self.names.setdefault(id(f), f"#{len(self.names)} {getattr(f, '__qualname__', type(f).__name__)}")
            self.spent[name] += time.perf_counter() - t0


def main() -> None:
    names = sys.argv[1:] or ["t5", "bert"]
    modes = os.environ.get("COMPILE_MODES", "default,reduce-overhead").split(",")
    clock = Clock()
    rw.call_func_at_runtime_with_args = clock  # type: ignore[assignment]
    for name in names:
        for mode in modes:
            calls = {}
            torch._dynamo.reset()  # not between the variants: it would drop the first one's compiled code
            for v in ("inductor", "coil"):
                model, inputs = make_case(name, "train", "cuda", size=SIZES["small"], dtype=torch.bfloat16)
                f = compile_model(v, mode, model, "triton", None)
                call = step_call(f, model, inputs, "train", mode == "reduce-overhead")
                for _ in range(5):
                    call()
                calls[v] = call
            print(f"== {name} train {mode} (host us a step)", flush=True)
            for _ in range(2):
                for v, c in calls.items():
                    clock.spent.clear()
                    clock.names.clear()
                    torch.cuda.synchronize()
                    clock.on = True
                    t0 = time.perf_counter()
                    for _ in range(STEPS):
                        c()
                    enqueue = (time.perf_counter() - t0) / STEPS * 1e6
                    torch.cuda.synchronize()
                    clock.on = False
                    parts = ", ".join(f"{n} {s / STEPS * 1e6:.0f}" for n, s in clock.spent.items())
                    print(f"  {v:9s} host {host_us(c, STEPS):7.0f} (clocked {enqueue:7.0f}): {parts}", flush=True)


if __name__ == "__main__":
    main()
