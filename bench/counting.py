"""Kernel launches per call.

CUDA: device-side events in torch.profiler (kernels, memsets, memcpys) per call, for
every variant.  CPU: coil: KernelCall + ExternCall lines of its wrapper programs;
Inductor: kernel and extern calls in the `call` functions of its output code; eager:
top-level aten ops seen by torch.profiler, minus views and no-op conversions."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

# Ops that only make views or read metadata: no kernel runs for them.
VIEW_OPS = frozenset(f"aten::{n}" for n in (
    "view", "_unsafe_view", "_reshape_alias", "t", "transpose", "permute", "expand", "expand_as", "broadcast_to",
    "as_strided", "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "unbind", "chunk",
    "narrow", "detach", "alias", "view_as", "lift_fresh", "empty", "empty_like", "empty_strided", "resize_",
    "result_type", "size", "stride", "numel", "dim", "is_nonzero", "item", "_local_scalar_dense",
))
# Ops that are no-ops unless they call an op that does work (a dtype change, a copy).
MAYBE_NOOP = frozenset(f"aten::{n}" for n in ("to", "type_as", "contiguous", "reshape", "flatten", "float", "type"))


def _does_work(event: Any) -> bool:
    if event.name in VIEW_OPS:
        return False
    if event.name in MAYBE_NOOP:
        return any(_does_work(c) for c in event.cpu_children if c.name.startswith("aten::"))
    return True


@dataclass(frozen=True)
class CudaProfile:
    """Per call: device-side events (kernels, memsets, memcpys), their summed
    durations, and CUDA graph launches (host-side cudaGraphLaunch calls; the
    kernels a graph replays are counted among the events)."""

    launches: float
    kernel_s: float
    graph_launches: float


def profiled_events(call: Callable[[], Any], reps: int = 3) -> list[Any]:
    """torch.profiler's events (host and device) while `call` runs `reps` times."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    return list(prof.events())


def on_device(events: list[Any]) -> list[Any]:
    """The device-side events among them: kernels, memsets, memcpys."""
    return [e for e in events if getattr(e.device_type, "name", "") == "CUDA"]


def cuda_profile(call: Callable[[], Any], reps: int = 3) -> CudaProfile:
    """What torch.profiler sees on the device while `call` runs `reps` times."""
    events = profiled_events(call, reps)
    device_events = on_device(events)
    kernel_us = sum(e.time_range.elapsed_us() for e in device_events)
    graphs = sum(1 for e in events if "GraphLaunch" in e.name and getattr(e.device_type, "name", "") != "CUDA")
    return CudaProfile(len(device_events) / reps, kernel_us / 1e6 / reps, graphs / reps)


def cuda_launches(call: Callable[[], Any], reps: int = 3) -> float:
    """Device-side events per call while `call` runs `reps` times."""
    return cuda_profile(call, reps).launches


def _has_aten_ancestor(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def eager_cpu_ops(call: Callable[[], Any]) -> Counter[str]:
    """Top-level aten ops of one call that do work (an op's own callees are not
    counted; views and no-op conversions are not counted)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return Counter(
        e.name for e in prof.events()
        if e.name.startswith("aten::") and not _has_aten_ancestor(e) and _does_work(e)
    )


def coil_launches(compiled: Iterable[Any]) -> int | None:
    """KernelCall + ExternCall lines over the compiled graphs; None when a graph ran
    eagerly (nothing to count)."""
    from coil.ir.wrapper import ExternCall, KernelCall

    total = 0
    for c in compiled:
        if c is None:
            return None
        total += sum(isinstance(line, (KernelCall, ExternCall)) for line in c.module.program.lines)
    return total


def coil_plan_peak(compiled: Iterable[Any]) -> int | None:
    """The largest planned peak among the compiled graphs (coil's own accounting)."""
    peaks = [c.module.plan.peak_bytes for c in compiled if c is not None]
    return max(peaks) if peaks else None


_LAUNCH = re.compile(
    r"^\s*(?:[\w, ]+=\s*)?(?:"
    r"(?:cpp_fused|cpp_kernel|triton_\w+|kernel)\w*(?:\.run)?\s*\("  # generated kernels
    r"|\w+\.run\s*\("                                             # triton launchers
    r"|extern_kernels\.\w+\s*\("                                  # mm, bmm, addmm, ...
    r"|torch\.ops\.\w+\.\w+(?:\.\w+)?\s*\("                       # fallbacks
    r"|aten\.\w+(?:\.\w+)?\s*\()"
)


def _call_body(source: str) -> list[str]:
    """The lines of the `def call(...)` function of an Inductor output_code.py."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith("def call("):
            indent = len(line) - len(stripped)
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            return body
    return []


def inductor_launches(codes: Iterable[str]) -> int | None:
    """Kernel and extern calls in the `call` functions of Inductor's output code."""
    codes = list(codes)
    if not codes:
        return None
    return sum(1 for src in codes for line in _call_body(src) if _LAUNCH.match(line))
