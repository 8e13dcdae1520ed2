"""Peak memory of one call, above what was allocated before it (outputs included).

CUDA: torch.cuda.max_memory_allocated.  CPU: the tensor allocations of the CPU
allocator as torch.profiler(profile_memory=True) reports them (each event carries
the running total of bytes allocated while profiling); memory a kernel takes for
itself outside torch's allocator is not seen."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def cuda_peak_bytes(call: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def cuda_peak_over(run: Callable[[], Any]) -> int:
    """CUDA: the most allocated while `run` runs, above what was allocated before
    (over several calls: a CUDA graph's recording allocates its memory pool)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def _memory_events(prof: Any) -> list[dict[str, Any]]:
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    events = [e for e in trace.get("traceEvents", []) if e.get("name") == "[memory]"]
    return sorted((e for e in events if e.get("args", {}).get("Device Type") == 0), key=lambda e: float(e["ts"]))


def cpu_peak_bytes(call: Callable[[], Any]) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = call()
    del out
    events = _memory_events(prof)
    if not events:
        return 0
    first = events[0]["args"]
    base = int(first["Total Allocated"]) - int(first["Bytes"])
    return max(int(e["args"]["Total Allocated"]) for e in events) - base


def peak_bytes(call: Callable[[], Any], device: torch.device) -> int:
    return cuda_peak_bytes(call) if device.type == "cuda" else cpu_peak_bytes(call)
