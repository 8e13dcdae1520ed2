"""Device probe: the models suite's slow first timing.  In session 47's H100
records (`h100-models-pin46`, `timing_s_rounds`) the first round's timing of each
compiled variant in the default mode took about that variant's first call again
(T5's training step: coil 5.7 s, Inductor 2.3 s, then 0.25-0.37 s a round), where
eager's and the reduce-overhead variants' did not.

For each model named on the command line (bench/hf_models.py names; default
distilbert) at $SIZE (default small) in $MODE (default train), bfloat16 on CUDA,
this prepares every variant as the suite does (`bench.models.prepare`: compile, a
checked first step, three warm steps, the profiler's step, the peak-memory step),
in the suite's order, then calls each variant's step twice, synchronised, with
Dynamo's recompiles logged, and prints each call's seconds.  ORDER=default_only
prepares the default-mode variants alone, ORDER=ro_first the reduce-overhead ones
first: a slow first call that goes away with them tells what the other variants'
preparation does to it.  Run from the repository root (the caches as they are:
cold first calls, which do not matter to the question); DEVICE=cpu SIZE=tiny
smoke-runs the script itself.

Run on an H100 in session 49 (`smart.sh`, small DistilBERT training): the first
call after every variant is prepared took 1.05 s (Inductor) and 1.20 s (coil),
the second 0.010 and 0.035 s; the reduce-overhead variants' first calls were not
slow.  Each slow call was a Dynamo recompile of transformers' forward `wrapper`
(one code object shared by every copy of the model), its reason Dynamo's
BACKEND_MATCH failure: the code object's cache entries are keyed on the backend
callable, and after the other variants have compiled the same code object, the
default-mode variant's own entry no longer matches, so its first call compiles
again (from the warm caches).  Both compilers alike; the suite's call before the
timed rounds (`before_timing_compiles` in its records) now takes that compile."""
from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, expected, make_case  # noqa: E402
from bench.models import DTYPES, VARIANTS, Case, Config, prepare  # noqa: E402
from bench.timing import sync  # noqa: E402


def main() -> None:
    warnings.filterwarnings("ignore")
    # DEVICE=cpu: a smoke run of the script itself (cpp target, float32, default mode only)
    dev = os.environ.get("DEVICE", "cuda")
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("first_timing.py measures CUDA runs: no CUDA device here (DEVICE=cpu smoke-runs it)")
    target, dtype_name = ("triton", "bfloat16") if dev == "cuda" else ("cpp", "float32")
    torch._logging.set_logs(recompiles=True)
    size, mode = SIZES[os.environ.get("SIZE", "small")], os.environ.get("MODE", "train")
    order = os.environ.get("ORDER", "suite")
    variants = list(VARIANTS)
    if order == "default_only" or dev != "cuda":
        variants = [v for v in variants if v[1] == "default"]
    elif order == "ro_first":
        variants.sort(key=lambda v: v[1] == "default")
    cfg = Config(sizes=(size.name,), only=(), modes=(mode,), compile_modes=("default", "reduce-overhead"),
                 variants=("eager", "inductor", "coil"), device=dev, dtype=dtype_name, target=target,
                 rounds=1, budget_s=None, threads=None, out=Path("/tmp"), name=None, merge=False, resume=False)
    device = torch.device(dev)
    for name in sys.argv[1:] or ["distilbert"]:
        model, inputs = make_case(name, mode, dev, size=size, dtype=DTYPES[dtype_name])
        want = expected(model, inputs, mode)
        case = Case(name, size, mode, {})
        calls: dict[str, Any] = {}
        torch._dynamo.reset()
        for variant, cmode in variants:
            rec: dict[str, Any] = {"status": "pending"}
            t0 = time.perf_counter()
            calls[f"{variant}/{cmode}"] = prepare(variant, cmode, case, model, inputs, want, device, target,
                                                  cfg, rec).call
            print(f"[prepared] {name} {mode} {variant}/{cmode}: {time.perf_counter() - t0:.2f} s "
                  f"(first call {rec.get('first_call_s')} s)", flush=True)
        for key, call in calls.items():
            for i in range(2):
                sync(device)
                t0 = time.perf_counter()
                call()
                sync(device)
                print(f"[call {i}] {name} {mode} {key}: {time.perf_counter() - t0:.3f} s", flush=True)
        calls.clear()
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
