"""Probe: realize's reuse rule (Options.realize_reuse) on real models.  With it on,
a pointwise node read whole by several readers while itself reading more than one
tensor becomes a buffer (BatchNorm's backward computes x - mean once, in a kernel
of its own); with it off, each reader recomputes it, as Inductor does.  For each
model named on the command line (bench/hf_models.py names; default resnet
mobilenet_v2 bert), in $MODE (train, the default, or infer), on $DEVICE (cpu, the
default, at the models suite's `cpu` size in float32 on one thread; cuda at
`small` in bf16): Inductor and coil with the rule on and off, compiled side by
side, each step timed in interleaved rounds (median of the rounds' medians), with
the kernels and externs coil's wrappers launch a step.  Runs here on the CPU:
`python3 bench/probes/realize_reuse.py resnet`; on a CUDA machine with DEVICE=cuda.
$OPTION names another realize option to compare the same way, over the values in
$VALUES (comma-separated; default on,off): `OPTION=inner_orders VALUES=auto,on`."""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import step_call  # noqa: E402
from bench.variants import Capture, record_coil_graphs  # noqa: E402
from coil.ir.wrapper import ExternCall, KernelCall  # noqa: E402

DEVICE = os.environ.get("DEVICE", "cpu")
MODE = os.environ.get("MODE", "train")
ROUNDS = int(os.environ.get("ROUNDS", "5"))
OPTION = os.environ.get("OPTION", "realize_reuse")
VALUES = os.environ.get("VALUES", "on,off").split(",")


def timed_ms(call: Callable[[], Any], steps: int) -> float:
    times = []
    for _ in range(steps):
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    names = sys.argv[1:] or ["resnet", "mobilenet_v2", "bert"]
    if DEVICE == "cpu":
        torch.set_num_threads(1)
    size, dtype = (SIZES["cpu"], torch.float32) if DEVICE == "cpu" else (SIZES["small"], torch.bfloat16)
    target = "cpp" if DEVICE == "cpu" else "triton"
    for name in names:
        torch._dynamo.reset()
        calls: dict[str, Callable[[], Any]] = {}
        launched: dict[str, int] = {}
        short = OPTION.replace("realize_", "")
        for label, reuse in (("inductor", None), *((f"coil {short} {v}", v) for v in VALUES)):
            model, inputs = make_case(name, MODE, DEVICE, size=size, dtype=dtype)
            if reuse is None:
                f = torch.compile(model)
            else:
                f = torch.compile(model, backend="coil", options={"target": target, OPTION: reuse})
            call = step_call(f, model, inputs, MODE, False)
            cap = Capture()
            with record_coil_graphs(cap):
                call()
            launched[label] = sum(1 for g in cap.coil_graphs if g is not None for ln in g.module.program.lines
                                  if isinstance(ln, (KernelCall, ExternCall)))
            calls[label] = call
        steps = 20 if DEVICE == "cpu" else 50
        rounds: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(ROUNDS):
            for label, call in calls.items():
                rounds[label].append(timed_ms(call, steps))
        med = {k: statistics.median(v) for k, v in rounds.items()}
        print(f"== {name} {MODE} {DEVICE}: ms a step, median of {ROUNDS} rounds (spread min-max)", flush=True)
        for label, ms in med.items():
            extra = f"  launches {launched[label]}" if label != "inductor" else ""
            print(f"  {label:22s} {ms:8.3f}  x Inductor {ms / med['inductor']:.3f}  "
                  f"({min(rounds[label]):.3f}-{max(rounds[label]):.3f}){extra}", flush=True)


if __name__ == "__main__":
    main()
