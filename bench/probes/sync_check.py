"""Device probe: does a compiled step make the host wait for the GPU?  A step whose
host work runs ahead of its kernels overlaps the two; one sync (a `.item()`, a
copy to the CPU, a size read from the data) makes the host wait for every kernel
queued before it, and the step's wall time becomes host + GPU instead of the larger
of them.  For each model named on the command line (bench/hf_models.py names;
default t5 vit), at the models suite's `small` size in bf16 and in $MODE (train,
the default, or infer), Inductor's and coil's steps run three times warm and then
twice under `torch.cuda.set_sync_debug_mode("warn")` (compiled in $COMPILE_MODE: default, or reduce-overhead for both); the probe prints how many
synchronizing calls each step made and, for each distinct one, the Python line that
made it.  Run from the repository root on a CUDA
machine: `MODE=train python3 bench/probes/sync_check.py t5 vit`."""
from __future__ import annotations

import collections
import os
import sys
import warnings

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402


def syncs(call, steps: int = 2) -> collections.Counter[str]:
    """The synchronizing calls of `steps` steps, by where they came from."""
    found: collections.Counter[str] = collections.Counter()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        text = str(w.message)
        if "synchroniz" not in text or "debug mode is a prototype" in text:  # the mode's own notice
            continue
        found[f"{text[:90]} at {w.filename}:{w.lineno}"] += 1
    return found


def main() -> None:
    names = sys.argv[1:] or ["t5", "vit"]
    mode = os.environ.get("MODE", "train")
    compile_mode = os.environ.get("COMPILE_MODE", "default")
    for name in names:
        for v in ("inductor", "coil"):
            torch._dynamo.reset()
            model, inputs = make_case(name, mode, "cuda", size=SIZES["small"], dtype=torch.bfloat16)
            f = compile_model(v, compile_mode, model, "triton", None)
            call = step_call(f, model, inputs, mode, compile_mode != "default")
            for _ in range(3):
                call()
            found = syncs(call)
            print(f"== {name} {mode} {compile_mode} {v}: {sum(found.values()) / 2:g} synchronizing calls a step", flush=True)
            for where, n in found.most_common(8):
                print(f"   {n / 2:g} a step: {where}", flush=True)


if __name__ == "__main__":
    main()
