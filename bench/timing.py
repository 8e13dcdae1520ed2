"""Median time per call, and the device's copy rate measured the same way."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_median_s(fn: Callable[[], Any], warmup_ms: int = 25, rep_ms: int = 100, min_calls: int = 1) -> float:
    """triton.testing.do_bench (L2 flushed before each call), median; CUDA events as
    the fallback where triton is missing.  do_bench repeats the call for `rep_ms`
    after its estimate of one call; with `min_calls`, the repeats last long enough
    for at least about that many calls (one_call_s gives the estimate): a 15 ms
    training step under 30 ms of repeats was timed twice, and the median of two is
    their mean, which one slow call of the host moves."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return _cuda_events_median_s(fn, max(3, warmup_ms // 5), max(30, min_calls))
    if min_calls > 1:
        # one call more than asked: do_bench's own estimate of a call may come out longer
        rep_ms = max(rep_ms, math.ceil((min_calls + 1) * one_call_s(fn) * 1e3))
    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) / 1e3


def one_call_s(fn: Callable[[], Any]) -> float:
    """The faster of two synchronised calls.  One call alone is one sample, and a
    slow one stretches every repeat of the timing after it: session 46's first H100
    cases spent 3.3x the seconds in their timings that the same cases had spent
    before min_calls, on another H100 (a variant's first call after another
    variant's timing is the suspect; the records' `timing_s_rounds` show what each
    timing took)."""
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def _cuda_events_median_s(fn: Callable[[], Any], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(statistics.median(times))


def back_to_back_s(fn: Callable[[], Any], device: torch.device, target_s: float = 0.15) -> float:
    """Wall time per call of calls made back to back, synchronised once at the end:
    a training loop's steady state, where a call's host work overlaps the GPU work
    of the call before it.  do_bench (cuda_median_s) times each call between CUDA
    events after flushing L2, which for a step bound by the host measures neither
    the host's time nor the GPU's alone.  Two loops, of n and 2n calls, each
    started on an idle device and synchronised at its end: their difference over n
    leaves out what both have once (the first call's start, the last one's tail).
    n is chosen from one synchronised call so the two loops last about `target_s`."""
    def loop(n: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync(device)
        return time.perf_counter() - t0

    one = loop(1)
    n = max(3, min(1000, int(target_s / 3 / max(one, 1e-6))))
    short, long = loop(n), loop(2 * n)
    return (long - short) / n if long > short else long / (2 * n)


@dataclass(frozen=True)
class Pace:
    """How long one CUDA timing takes: do_bench's repeats (`rep_ms`, after 25 ms
    of warm-up, and long enough for `min_calls` calls) and the back-to-back loops
    (`wall_s`, both loops together)."""

    rep_ms: int = 100
    wall_s: float = 0.15
    min_calls: int = 1


DEFAULT_PACE = Pace()
# more, shorter rounds for the models suite on CUDA: a step of milliseconds is bound by
# the host, and on the H200's shared host a whole round of one variant moved by up to 2x
# (session 25: T5's Inductor rounds 3.14, 6.73, 3.23 ms); the median of many short rounds
# leaves out more such rounds than that of a few long ones, in about the same time; each
# round's do_bench times at least 8 calls (a large model's training step of 15 ms had two)
SHORT_PACE = Pace(rep_ms=30, wall_s=0.05, min_calls=8)


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float | None = None  # CPU only: the least-disturbed sample
    load: float | None = None  # CPU only: the load average when it was timed
    wall_s: float | None = None  # CUDA, where asked for: back_to_back_s
    spent_s: float | None = None  # CUDA: the seconds this timing took, all its calls together


def cpu_timing(fn: Callable[[], Any], sample_s: float = 0.02, total_s: float = 1.0,
               min_samples: int = 5, max_samples: int = 51) -> Timing:
    """Warmed-up wall clock: each sample times a loop of n calls (n chosen so a
    sample lasts about `sample_s`); median (and min) over the samples."""
    fn()
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(sample_s / one))
    samples = max(min_samples, min(max_samples, int(total_s / (n * one))))
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return Timing(float(statistics.median(times)), min(times))


def measure(fn: Callable[[], Any], device: torch.device, quick: bool = False, wall: bool = False,
            pace: Pace = DEFAULT_PACE) -> Timing:
    """The median time per call; with `wall` on CUDA, the back-to-back wall time
    too (on the CPU the median is wall time already).  `pace`: how long a CUDA
    timing takes."""
    if device.type == "cuda":
        t0 = time.perf_counter()
        median = cuda_median_s(fn, rep_ms=pace.rep_ms, min_calls=pace.min_calls)
        wall_s = back_to_back_s(fn, device, pace.wall_s) if wall else None
        return Timing(median, wall_s=wall_s, spent_s=time.perf_counter() - t0)
    return cpu_timing(fn, total_s=0.2 if quick else 1.0)


def copy_rate_bytes_per_s(device: torch.device, quick: bool = False, nbytes: int | None = None) -> float:
    """Bytes read + written per second by a device-to-device tensor copy, timed like
    the workloads.  Default size: 1 GiB on CUDA, 256 MiB on the CPU (64 MiB when
    quick); `nbytes` (read + written) sizes it like a workload instead."""
    if nbytes is not None:
        numel = max(1, nbytes // 8)
    else:
        numel = (1 << 28) if device.type == "cuda" else (1 << 24 if quick else 1 << 26)
    src = torch.ones(numel, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = measure(lambda: dst.copy_(src), device, quick).median_s
    return 2 * src.numel() * src.element_size() / seconds
