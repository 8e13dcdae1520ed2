"""`python -m bench --suite gpu|cpu|smoke [--only NAME] [--out DIR]`: runs a suite and
measures eager PyTorch, Inductor and coil in one process and one run.  (`--suite
models`, real `transformers` models, has its own options: bench/models.py.)

Per workload and variant: correctness against eager, median time, bytes moved
against the copy rate, kernel launches, peak memory; then cold and warm compile
times in fresh processes (bench.compile_times).  A variant that fails is recorded
with its message; it never stops the run."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import check, counting, memory, timing
from bench.compile_times import CompileJob, allow_children, cold_and_warm, kill_children
from bench.report import Writer, markdown
from bench.suites import Suite, get_suite
from bench.timing import Timing
from bench.variants import Capture, first_call, make_callable
from bench.workloads import Instance, Workload

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Config:
    suite: str
    only: tuple[str, ...]
    out: Path
    target: str
    compile_times: bool
    jobs: int
    budget_s: float | None
    compile_timeout_s: float
    name: str | None
    overlap: bool
    threads: int | None
    rounds: int | None


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="smoke", choices=("gpu", "cpu", "smoke", "models", "dynamic"),
                   help="models: real transformers models, with its own options (python -m bench --suite models -h); "
                        "dynamic: shapes that change between calls (python -m bench --suite dynamic -h)")
    p.add_argument("--only", action="append", default=[], help="workload name (repeatable, or comma-separated)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--target", default="auto",
                   help="coil's target; auto: the suite's device (triton on CUDA; cpp on CPU, else reference)")
    p.add_argument("--no-compile-times", dest="compile_times", action="store_false",
                   help="skip the cold/warm compile timings in fresh processes")
    p.add_argument("--jobs", type=int, default=0,
                   help="compile-timing processes at once (0: CUDA: cpus//3 in 1..6; CPU: 1)")
    p.add_argument("--overlap", action="store_true",
                   help="run the compile timings alongside the in-process measurements (faster, noisier "
                        "times); by default they run after them")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting work after this many seconds (default: gpu 450, else none)")
    p.add_argument("--compile-timeout-s", type=float, default=420.0, help="limit for one compile-timing process")
    p.add_argument("--name", default=None, help="result file name (default: the device, e.g. h200, cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for every variant (torch.set_num_threads, coil's num_threads); "
                        "default: torch's default")
    p.add_argument("--rounds", type=int, default=None,
                   help="timing rounds: every variant is timed once per round, interleaved, and the median "
                        "round counts (default: CUDA 5, CPU 3, the smoke suite 1)")
    a = p.parse_args(argv)
    if a.rounds is not None and a.rounds < 1:
        p.error("--rounds must be at least 1")
    only = tuple(n for item in a.only for n in item.split(",") if n)
    budget = a.budget_s if a.budget_s is not None else (450.0 if a.suite == "gpu" else None)
    return Config(a.suite, only, a.out, a.target, a.compile_times, a.jobs, budget, a.compile_timeout_s, a.name,
                  a.overlap, a.threads, a.rounds)


def _suite_of(argv: Sequence[str]) -> str | None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--suite")
    suite: str | None = p.parse_known_args(list(argv))[0].suite
    return suite


def main(argv: Sequence[str] | None = None) -> int:
    suite = _suite_of(sys.argv[1:] if argv is None else argv)
    if suite == "models":
        from bench.models import main as models_main

        return models_main(argv)
    if suite == "dynamic":
        from bench.dynamic import main as dynamic_main

        return dynamic_main(argv)
    try:
        results = run(parse_args(argv))
    except BaseException:
        kill_children()  # Ctrl-C or SIGTERM: no compile-timing child outlives the run
        raise
    print(markdown(results))
    return 0


# ---- setting up -------------------------------------------------------------------


def device_file_name(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cuda"


def cpp_available() -> str | None:
    """None when coil's C++ backend imports and builds; else why not."""
    try:
        import coil.backends.cpp.codegen  # noqa: F401
        from coil.backends.kernel_gen import backend_for

        backend_for("cpp")
    except Exception as e:  # noqa: BLE001 - any failure means: not usable
        return f"{type(e).__name__}: {e}"
    return None


def resolve_target(requested: str, device: torch.device) -> tuple[str, list[str]]:
    if requested != "auto":
        return requested, []
    if device.type == "cuda":
        return "triton", []
    why = cpp_available()
    if why is None:
        return "cpp", []
    return "reference", [f"coil ran with target `reference`: the cpp backend is not usable yet ({why[:200]})"]


@contextlib.contextmanager
def fresh_caches() -> Iterator[None]:
    """In-process compiles start from empty Inductor and coil caches, so no earlier
    run's cache hides a compile (the environment is restored afterwards)."""
    names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COIL_CACHE_DIR")
    saved = {n: os.environ.get(n) for n in names}
    with tempfile.TemporaryDirectory(prefix="bench-inprocess-") as root:
        for n in names:
            os.environ[n] = os.path.join(root, n.lower())
        try:
            yield
        finally:
            for n, v in saved.items():
                if v is None:
                    os.environ.pop(n, None)
                else:
                    os.environ[n] = v


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch.set_num_threads for the run (Inductor's C++ kernels take the count at
    compile time, coil's and eager's from OpenMP); restored afterwards."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def new_results(cfg: Config, suite: Suite, workloads: Sequence[Workload], device: torch.device,
                target: str, notes: list[str]) -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cpus)"
    return {
        "suite": suite.name, "device": device.type, "device_name": name, "torch": torch.__version__,
        "triton": triton_version, "python": platform.python_version(), "coil_target": target, "notes": notes,
        "started": datetime.datetime.now().isoformat(timespec="seconds"), "budget_s": cfg.budget_s,
        "load_average_start": os.getloadavg(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(cfg).items()},
        "workloads": [
            {"name": wl.name, "description": wl.description, "rtol": wl.rtol, "atol": wl.atol,
             "variants": {v: {"status": "pending"} for v in suite.variants}}
            for wl in workloads
        ],
    }


def select(suite: Suite, only: tuple[str, ...]) -> tuple[Workload, ...]:
    if not only:
        return suite.workloads
    known = {wl.name for wl in suite.workloads}
    unknown = set(only) - known
    if unknown:
        raise SystemExit(f"suite {suite.name!r} has no workload {sorted(unknown)}; known: {sorted(known)}")
    return tuple(wl for wl in suite.workloads if wl.name in only)


# ---- one variant, in this process -------------------------------------------------


def _error(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:400]


def _launches(variant: str, call: Callable[[], Any], cap: Capture, device: torch.device, rec: dict[str, Any]) -> None:
    if variant == "coil":
        rec["planned_launches"] = counting.coil_launches(cap.coil_graphs)
        rec["plan_peak_bytes"] = counting.coil_plan_peak(cap.coil_graphs)
    if variant == "inductor":
        rec["kernels_generated"] = cap.inductor_kernels_generated
    if device.type == "cuda":
        rec["launches"], rec["launch_method"] = counting.cuda_launches(call), "profiler: device events per call"
    elif variant == "coil":
        rec["launches"], rec["launch_method"] = rec["planned_launches"], "wrapper KernelCall + ExternCall lines"
    elif variant == "inductor":
        rec["launches"] = counting.inductor_launches(cap.inductor_code)
        rec["launch_method"] = "kernel + extern calls in output code"
    else:
        ops = counting.eager_cpu_ops(call)
        rec["launches"], rec["launch_method"], rec["ops"] = sum(ops.values()), "profiler: top-level aten ops", dict(ops)


def prepare_variant(variant: str, wl: Workload, inst: Instance, want: list[torch.Tensor], device: torch.device,
                    target: str, threads: int | None, rec: dict[str, Any]) -> Callable[[], Any]:
    """Compile `variant` and fill `rec` with what needs no timing: the first call,
    its correctness, the launches and the peak memory.  Returns the call to time."""
    f = make_callable(variant, inst.fn, target, threads)

    def call() -> Any:
        return inst.step(f, inst.inputs)

    cap = Capture()
    timing.sync(device)
    t0 = time.perf_counter()
    out = first_call(variant, call, cap)
    timing.sync(device)
    rec["first_call_s"] = time.perf_counter() - t0
    mismatch = check.compare(out, want, wl.rtol, wl.atol)
    rec["max_abs_err"] = check.max_abs_error(out, want)
    if mismatch:
        rec.update(status="mismatch", mismatch=f"{variant} on {wl.name}: {mismatch}")
    del out
    _launches(variant, call, cap, device, rec)
    rec["peak_bytes"] = memory.peak_bytes(call, device)
    rec["peak_method"] = "cuda max_memory_allocated" if device.type == "cuda" else "profiler: CPU allocator"
    return call


def timed_rounds(calls: dict[str, Callable[[], Any]], device: torch.device, quick: bool, rounds: int,
                 deadline: float, wall: bool = False, pace: timing.Pace = timing.DEFAULT_PACE
                 ) -> dict[str, list[Timing]]:
    """Time every variant once per round, round after round, each round starting one
    variant later than the last: drift in clocks, temperature or the machine's load
    then falls on all of them alike instead of on whichever ran last.  A round
    is not started past the deadline (the first always runs).  `wall`: on CUDA each
    timing takes the back-to-back wall time too (timing.back_to_back_s); `pace`:
    how long each CUDA timing takes."""
    names = list(calls)
    got: dict[str, list[Timing]] = {n: [] for n in names}
    for r in range(rounds):
        if r and time.monotonic() > deadline:
            break
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            if device.type == "cpu":
                load = os.getloadavg()[0]
            try:
                got[name].append(timing.measure(calls[name], device, quick, wall, pace))
            except Exception as e:  # noqa: BLE001 - the caller drops this variant and times the rest again
                raise VariantFailed(name, e) from e
            if device.type == "cpu":
                got[name][-1] = dataclasses.replace(got[name][-1], load=load)
    return got


class VariantFailed(Exception):
    def __init__(self, variant: str, error: BaseException) -> None:
        super().__init__(variant)
        self.variant, self.error = variant, error


def record_times(rec: dict[str, Any], times: list[Timing], min_bytes: int, copy_rate: float) -> None:
    """The median over rounds of each round's median, every round's time, and the
    bytes per second and fraction of the copy rate that the median gives."""
    rec["time_s"] = statistics.median(t.median_s for t in times)
    rec["time_rounds_s"] = [t.median_s for t in times]
    mins = [t.min_s for t in times if t.min_s is not None]
    if mins:
        rec["time_min_s"] = min(mins)
    loads = [t.load for t in times if t.load is not None]
    if loads:
        rec["load_average"] = max(loads)
    rec["gb_per_s"] = min_bytes / rec["time_s"] / 1e9
    rec["copy_fraction"] = min_bytes / rec["time_s"] / copy_rate


def measure_workload(wl: Workload, entry: dict[str, Any], device: torch.device, target: str, copy_rate: float,
                     quick: bool, threads: int | None, rounds: int, writer: Writer, deadline: float) -> None:
    """Compile and check every variant, keeping each compiled function (Dynamo keys
    its cache by backend, so Inductor's and coil's entries for one function live
    side by side); time them in interleaved rounds; check each once more after."""
    variants = entry["variants"]
    if time.monotonic() > deadline:
        for variant, rec in variants.items():
            rec.update(status="skipped", error=f"{variant} on {wl.name}: time budget spent")
        return
    try:
        inst = wl.build(device)
        want = check.snapshot(inst.step(inst.fn, inst.inputs))
    except Exception as e:  # noqa: BLE001 - recorded, never fatal
        for rec in variants.values():
            rec.update(status="error", error=f"eager reference on {wl.name}: {_error(e)}")
        return
    min_bytes = check.io_bytes(inst.inputs, inst.extra_reads, want)
    entry["min_bytes"] = min_bytes
    if device.type == "cpu":  # the working set may sit in cache: compare with a copy of the same size
        copy_rate = timing.copy_rate_bytes_per_s(device, quick, min_bytes)
    torch._dynamo.reset()
    calls: dict[str, Callable[[], Any]] = {}
    try:
        for variant, rec in variants.items():
            if time.monotonic() > deadline:
                rec.update(status="skipped", error=f"{variant} on {wl.name}: time budget spent")
                continue
            try:
                calls[variant] = prepare_variant(variant, wl, inst, want, device, target, threads, rec)
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                rec.update(status="error", error=f"{variant} on {wl.name}: {_error(e)}")
        while calls:
            try:
                times = timed_rounds(calls, device, quick, rounds, deadline)
                break
            except VariantFailed as e:
                variants[e.variant].update(status="error", error=f"{e.variant} on {wl.name}: {_error(e.error)}")
                del calls[e.variant]
        else:
            times = {}
        for variant, call in calls.items():
            rec = variants[variant]
            record_times(rec, times[variant], min_bytes, copy_rate)
            try:
                late = check.compare(call(), want, wl.rtol, wl.atol)
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                rec.update(status="error", error=f"{variant} on {wl.name}, after timing: {_error(e)}")
                continue
            if rec.get("status") != "mismatch":
                rec["status"] = "mismatch" if late else ("ref" if variant == "eager" else "ok")
                if late:
                    rec["mismatch"] = f"{variant} on {wl.name}, after timing: {late}"
        for variant, rec in variants.items():
            print(f"[bench] {wl.name:20s} {variant:9s} {rec.get('status'):9s} {timing_text(rec)}", file=sys.stderr,
                  flush=True)
    finally:
        calls.clear()
        torch._dynamo.reset()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        writer.write()
    if device.type == "cpu":
        same_size_copy(entry, device, quick, min_bytes, copy_rate)
        writer.write()


def same_size_copy(entry: dict[str, Any], device: torch.device, quick: bool, min_bytes: int, before: float) -> None:
    """CPU: the copy rate for a copy of the workload's byte count, measured before and
    after its variants; only interference makes a copy slower, so the faster one is
    kept and the variants' fractions follow it."""
    entry["copy_bytes_per_s"] = max(before, timing.copy_rate_bytes_per_s(device, quick, min_bytes))
    for rec in entry["variants"].values():
        if rec.get("time_s"):
            rec["copy_fraction"] = min_bytes / rec["time_s"] / entry["copy_bytes_per_s"]


def timing_text(rec: dict[str, Any]) -> str:
    t = rec.get("time_s")
    return f"{t * 1e3:.3f} ms" if t else rec.get("error", "")[:120]


# ---- compile timings ----------------------------------------------------------------


def compile_jobs(cfg: Config, suite: Suite, workloads: Sequence[Workload], target: str) -> list[tuple[Workload, CompileJob]]:
    """Slow compiles first, so the longest jobs start at once."""
    ordered = sorted(workloads, key=lambda wl: "slow_compile" not in wl.tags)
    return [(wl, CompileJob(cfg.suite, wl.name, v, target, cfg.threads)) for wl in ordered for v in suite.compile_variants
            if v in suite.variants]


def start_compile_timings(cfg: Config, suite: Suite, workloads: Sequence[Workload], target: str, results: dict[str, Any],
                          writer: Writer, deadline: float, jobs: int) -> tuple[ThreadPoolExecutor, list[Future[None]]]:
    by_name = {e["name"]: e for e in results["workloads"]}
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="compile-times")

    def one(wl: Workload, job: CompileJob) -> None:
        got = cold_and_warm(job, cfg.compile_timeout_s, deadline, cold_only=suite.quick)
        with writer.lock:
            rec = by_name[wl.name]["variants"][job.variant]
            rec["cold_compile_s"] = got.get("cold_s")
            rec["warm_compile_s"] = got.get("warm_s")
            if "prime_s" in got:
                rec["cold_cache_on_compile_s"] = got["prime_s"]
            if "error" in got:
                rec["compile_error"] = f"{job.variant} on {wl.name}: {got['error']}"
            writer.write()
        print(f"[bench] {wl.name:20s} {job.variant:9s} compile {got}", file=sys.stderr, flush=True)

    return pool, [pool.submit(one, wl, job) for wl, job in compile_jobs(cfg, suite, workloads, target)]


def default_jobs(device: torch.device) -> int:
    return max(1, min(6, (os.cpu_count() or 1) // 3)) if device.type == "cuda" else 1


# ---- the run -------------------------------------------------------------------------


def run(cfg: Config) -> dict[str, Any]:
    allow_children()
    suite = get_suite(cfg.suite)
    device = torch.device(suite.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"suite {suite.name!r} needs a CUDA device; none is available")
    workloads = select(suite, cfg.only)
    target, notes = resolve_target(cfg.target, device)
    if device.type == "cpu":
        notes = [*notes, ("CPU: % copy compares with a copy of the same number of bytes, timed the same way "
                          "(a working set may sit in cache); the load average (JSON: load_average) shows whether "
                          "other processes shared the machine")]
    start = time.monotonic()
    deadline = start + (cfg.budget_s if cfg.budget_s is not None else 1e9)
    results = new_results(cfg, suite, workloads, device, target, notes)
    name = cfg.name or device_file_name(device) + ("" if suite.name != "smoke" else "-smoke") + (
        "-" + "-".join(cfg.only) if cfg.only else "")
    writer = Writer(cfg.out, name, results)
    with fresh_caches(), torch_threads(cfg.threads):
        results["threads"] = torch.get_num_threads()
        results["rounds"] = rounds = cfg.rounds or (5 if device.type == "cuda" else 1 if suite.quick else 3)
        results["copy_bytes_per_s"] = timing.copy_rate_bytes_per_s(device, suite.quick)
        writer.write()
        jobs = cfg.jobs or default_jobs(device)
        results["compile_jobs"] = jobs
        pool: ThreadPoolExecutor | None = None
        futures: list[Future[None]] = []
        if cfg.compile_times and suite.compile_times and cfg.overlap:
            pool, futures = start_compile_timings(cfg, suite, workloads, target, results, writer, deadline, jobs)
        for wl, entry in zip(workloads, results["workloads"]):
            measure_workload(wl, entry, device, target, results["copy_bytes_per_s"], suite.quick, cfg.threads,
                             rounds, writer, deadline)
        if cfg.compile_times and suite.compile_times and pool is None:
            pool, futures = start_compile_timings(cfg, suite, workloads, target, results, writer, deadline, jobs)
        try:
            for fut in futures:
                fut.result()
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
    results["elapsed_s"] = time.monotonic() - start
    results["load_average_end"] = os.getloadavg()
    writer.write()
    results["files"] = [str(writer.md_path), str(writer.json_path)]
    return results
