"""CPU probe: a real model's call, kernel by kernel, for Inductor and coil (cpp).

For each model named on the command line (bench/hf_models.py names; default t5),
at the models suite's `cpu` size in float32 on one thread, in $MODE (infer, the
default, or train: the models suite's step): both compiled modules' kernel
functions (`cpp_fused_*`, Inductor's and coil's alike) are wrapped with a timer in
the modules' namespaces, the step runs $CALLS times (default 30), and the probe
prints each compiler's wall time a step, the kernels' share of it and its slowest
kernels, by name, calls a step and microseconds a call.  What is not a kernel
(matmuls, other externs, the wrapper's Python, Dynamo) is the rest.  Unlike the
device probes this one runs here: `python3 bench/probes/cpu_kernels.py t5 gpt2`
from the repository root."""
from __future__ import annotations

import collections
import gc
import os
import sys
import time
import types
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402


def namespaces() -> list[dict[str, Any]]:
    """The global namespaces of every compiled module alive (Inductor's output code
    is a module; coil's CompiledFn keeps only its module's dict)."""
    out = []
    for o in gc.get_objects():
        try:
            d = vars(o) if isinstance(o, types.ModuleType) else o
        except ReferenceError:  # a dead weak proxy
            continue
        if isinstance(d, dict) and "call" in d and any(isinstance(k, str) and k.startswith("cpp_fused") for k in d):
            out.append(d)
    return out


def wrap(spaces: list[dict[str, Any]], times: dict[str, list[float]]) -> None:
    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter

        def run(*args: Any) -> Any:
            t0 = clock()
            r = fn(*args)
            times[name].append(clock() - t0)
            return r
        return run

    for d in spaces:
        tag = str(d.get("__name__", ""))[-6:]
        for k, v in list(d.items()):
            if k.startswith("cpp_fused") and callable(v):
                d[k] = timed(f"{tag}.{k}", v)


def main() -> None:
    names = sys.argv[1:] or ["t5"]
    mode = os.environ.get("MODE", "infer")
    calls = int(os.environ.get("CALLS", "30"))
    torch.set_num_threads(1)
    for name in names:
        for variant in ("inductor", "coil"):
            model, inputs = make_case(name, mode, "cpu", size=SIZES["cpu"], dtype=torch.float32)
            seen = {id(d) for d in namespaces()}
            f = compile_model(variant, "default", model, "cpp", 1)
            step = step_call(f, model, inputs, mode, False)
            for _ in range(3):
                step()
            times: dict[str, list[float]] = collections.defaultdict(list)
            wrap([d for d in namespaces() if id(d) not in seen], times)
            step()
            times.clear()
            t0 = time.perf_counter()
            for _ in range(calls):
                step()
            wall = (time.perf_counter() - t0) / calls * 1e6
            total = sum(sum(v) for v in times.values()) / calls * 1e6
            print(f"== {name} {mode} {variant}: {wall:.0f} us a step, kernels {total:.0f} us "
                  f"({sum(len(v) for v in times.values()) // calls} calls a step)", flush=True)
            rows = sorted(times.items(), key=lambda kv: -sum(kv[1]))
            for k, v in rows[:12]:
                per = len(v) / calls
                print(f"   {sum(v) / calls * 1e6:8.1f} us  {per:4.0f} x {sum(v) / len(v) * 1e6:8.1f}  {k}")


if __name__ == "__main__":
    main()
