"""CPU probe: what is live at the peak of a real model's step, for Inductor and coil
(cpp), from the CPU allocator's events (torch.profiler, profile_memory=True).

For each model named on the command line (bench/hf_models.py names; default t5), at
the models suite's $SIZE (default large) with $BATCH (1), $SEQ (64), $LAYERS (2) and
$IMAGE (224) in its place, in bfloat16, in $MODE (train, the default: the models
suite's step; or infer): after two warm steps, with Python's garbage collector off,
one step is profiled; the probe prints its peak above what was allocated before
it, the ops running at that moment (with their input shapes), and the largest
blocks live then with the ops that allocated them.  Each compiler runs in a fresh
process ($VARIANTS, default inductor,coil), so neither's allocations linger in the
other's count.  The device probe train_memory.py says the same on a GPU with
CUDA's memory history; this one runs here, where a GPU is scarce: found T5's
float32 embedding gradients (250 MiB each at hidden 2048) held to the end of the
backward.  `python3 bench/probes/cpu_train_memory.py t5` from the repository root."""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.hf_models import _loss as model_loss  # noqa: E402

MiB = 2**20


def _size() -> Any:
    base = SIZES[os.environ.get("SIZE", "large")]
    return dataclasses.replace(base, batch=int(os.environ.get("BATCH", 1)), seq=int(os.environ.get("SEQ", 64)),
                               layers=int(os.environ.get("LAYERS", 2)), image=int(os.environ.get("IMAGE", 224)))


def _trace(step: Any) -> list[dict[str, Any]]:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]
    finally:
        os.unlink(path)


def _enclosing(trace: list[dict[str, Any]], ts: float) -> list[dict[str, Any]]:
    return sorted((e for e in trace if e.get("ph") == "X" and float(e["ts"]) <= ts <= float(e["ts"]) + float(e.get("dur", 0))),
                  key=lambda e: float(e["ts"]))


def one(name: str, variant: str) -> None:
    mode = os.environ.get("MODE", "train")
    model, inputs = make_case(name, mode, "cpu", size=_size(), dtype=torch.bfloat16)
    f = torch.compile(model) if variant == "inductor" else torch.compile(model, backend="coil", options={"target": "cpp"})

    def step() -> Any:
        if mode == "infer":
            with torch.no_grad():
                return f(**inputs)
        for p in model.parameters():
            p.grad = None
        loss = model_loss(f(**inputs))
        loss.backward()
        return loss

    step()
    step()
    gc.collect()
    gc.disable()
    trace = _trace(step)
    mem = sorted((e for e in trace if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                 key=lambda e: float(e["ts"]))
    base = int(mem[0]["args"]["Total Allocated"]) - int(mem[0]["args"]["Bytes"])
    top = max(mem, key=lambda e: int(e["args"]["Total Allocated"]))
    ts = float(top["ts"])
    print(f"== {name} {mode} {variant}: peak {(int(top['args']['Total Allocated']) - base) / MiB:.1f} MiB", flush=True)
    for e in _enclosing(trace, ts)[1:]:
        print(f"  during {e['name'][:100]} {str(e.get('args', {}).get('Input Dims', ''))[:160]}")
    live: dict[Any, tuple[int, float]] = {}
    for e in mem:
        if float(e["ts"]) > ts:
            break
        b = int(e["args"]["Bytes"])
        if b > 0:
            live[e["args"].get("Addr")] = (b, float(e["ts"]))
        else:
            live.pop(e["args"].get("Addr"), None)
    for b, at in sorted(live.values(), reverse=True)[:10]:
        ops = [e["name"][:80] for e in _enclosing(trace, at)[1:]]
        print(f"  live {b / MiB:8.1f} MiB  from {' < '.join(reversed(ops[-2:]))}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        one(sys.argv[2], sys.argv[3])
        return
    for name in sys.argv[1:] or ["t5"]:
        for v in os.environ.get("VARIANTS", "inductor,coil").split(","):
            subprocess.run([sys.executable, __file__, "--one", name, v], check=False)


if __name__ == "__main__":
    main()
