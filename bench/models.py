"""`python -m bench --suite models`: real `transformers` models (bench/hf_models.py,
built from configs with random weights, nothing downloaded) in inference and for one
training step, through eager PyTorch, Inductor and coil in one process and one run.

Each model and step (`infer`, `train`) is one case.  A case builds the model once,
runs eager and a float64 copy for the reference, then compiles a copy of the model
per variant: Inductor and coil in torch.compile's default mode and, on CUDA, in
`mode="reduce-overhead"` (CUDA graphs; the CPU has none, so that mode is skipped
there).  Every compiled variant's first step is checked against eager the way
bench/hf_models.py checks (allclose, else RMSE against float64 within 2x eager's,
3x for bfloat16); then every variant is timed in interleaved rounds (bench.harness's
timed_rounds), its kernels counted and its peak memory taken, and it is checked once
more.  A variant that fails is a record with its status and message; it never stops
the run.

The training step: gradients set to None, forward with labels, the model's own loss,
backward.  No optimizer step (it would run eagerly and the same for every variant).

The results are a list of records, one a model, size, step, compile mode and
variant, written to `<out>/<device>-models.json` and `.md` after every case (see
bench/README.md)."""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import counting, memory, timing
from bench.harness import DEFAULT_OUT, VariantFailed, device_file_name, fresh_caches, resolve_target, timed_rounds
from bench.harness import torch_threads
from bench.hf_models import (ALL_MODELS, CHECK_STEPS, MODES, RMSE_MULTIPLIER, RMSE_MULTIPLIER_BF16, SIZES, Counts,
                             Expected, Size, counting as coil_counting, expected, judge, make_case)
from bench.hf_models import _loss as model_loss
from bench.models_report import Writer, record_key
from bench.measured import measured
from bench.variants import Capture, first_call, make_callable

COMPILE_MODES = ("default", "reduce-overhead")
# (variant, compile mode) in the order they are compiled; eager has no compile
# mode and is recorded once, as "default"
VARIANTS: tuple[tuple[str, str], ...] = (
    ("eager", "default"), ("inductor", "default"), ("coil", "default"),
    ("inductor", "reduce-overhead"), ("coil", "reduce-overhead"),
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Config:
    sizes: tuple[str, ...]
    only: tuple[str, ...]
    modes: tuple[str, ...]
    compile_modes: tuple[str, ...]
    variants: tuple[str, ...]
    device: str
    dtype: str
    target: str
    rounds: int
    budget_s: float | None
    threads: int | None
    out: Path
    name: str | None
    merge: bool
    resume: bool
    # compile every case in this many processes at once before the timed run (warm_up)
    warm_jobs: int = 0
    # warm up and then measure this many cases at a time (0: all of them first)
    warm_chunk: int = 0


def _names(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(n for item in items for n in item.split(",") if n)


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(prog="python -m bench --suite models", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="models", choices=("models",))
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda when there is one")
    p.add_argument("--size", default=None, choices=(*SIZES, "both"),
                   help="model sizes (bench/hf_models.py SIZES); both: small and large (default: CUDA both, CPU cpu)")
    p.add_argument("--only", action="append", default=[], help="model names (repeatable, or comma-separated): "
                   + ",".join(ALL_MODELS))
    p.add_argument("--mode", action="append", default=[], help="infer, train (default both)")
    p.add_argument("--compile-mode", action="append", default=[],
                   help="default, reduce-overhead (default: both on CUDA; the CPU runs default only)")
    p.add_argument("--variants", action="append", default=[],
                   help="eager, inductor, coil (default all; eager is always run, as the reference)")
    p.add_argument("--dtype", default=None, choices=tuple(DTYPES), help="default: CUDA bfloat16, CPU float32")
    p.add_argument("--target", default="auto", help="coil's target (auto: triton on CUDA, cpp on the CPU)")
    p.add_argument("--rounds", type=int, default=None, help="timing rounds, interleaved (default: CUDA 9 short ones, CPU 3)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new case, and no new variant's compile, after this many seconds (a case "
                        "started is timed in all its rounds)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every variant (as the other suites)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--name", default=None, help="result file name (default: <device>-models)")
    p.add_argument("--merge", action="store_true",
                   help="keep the records of the existing result file that this run does not measure again "
                        "(to run the suite in parts)")
    p.add_argument("--resume", action="store_true",
                   help="--merge, and skip the cases the existing file holds measured already by this coil (the same "
                        "coil_source; not skipped, not left pending by a killed run): repeat one command with "
                        "--budget-s until all is done, and every row comes from one version of coil")
    p.add_argument("--warm-jobs", type=int, default=0,
                   help="first compile every case in this many processes at once, into the run's caches, so "
                        "that the timed run's compiles hit them (its first call is then warm; each variant's "
                        "cold first call, taken under the warm-up's parallel load, is `cold_first_call_s`)")
    p.add_argument("--warm-chunk", type=int, default=0,
                   help="with --warm-jobs: warm up this many cases, measure them, then the next ones (so that a run "
                        "that --budget-s stops early has not compiled cases it never measures; default 0: every "
                        "case first)")
    a = p.parse_args(argv)
    if a.warm_jobs < 0 or a.warm_chunk < 0:
        p.error("--warm-jobs and --warm-chunk must be at least 0")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    size = a.size or ("both" if device == "cuda" else "cpu")
    sizes = ("small", "large") if size == "both" else (size,)
    only = _names(a.only)
    unknown = set(only) - set(ALL_MODELS)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; known: {', '.join(ALL_MODELS)}")
    modes = _names(a.mode) or MODES
    if set(modes) - set(MODES):
        p.error(f"--mode takes {', '.join(MODES)}")
    compile_modes = _names(a.compile_mode) or COMPILE_MODES
    if set(compile_modes) - set(COMPILE_MODES):
        p.error(f"--compile-mode takes {', '.join(COMPILE_MODES)}")
    variants = _names(a.variants) or ("eager", "inductor", "coil")
    if set(variants) - {"eager", "inductor", "coil"}:
        p.error("--variants takes eager, inductor, coil")
    if a.rounds is not None and a.rounds < 1:
        p.error("--rounds must be at least 1")
    rounds = a.rounds or (9 if device == "cuda" else 3)
    dtype = a.dtype or ("bfloat16" if device == "cuda" else "float32")
    return Config(sizes, only, modes, compile_modes, ("eager", *(v for v in variants if v != "eager")), device, dtype, a.target, rounds, a.budget_s, a.threads, a.out,
                  a.name, a.merge or a.resume, a.resume, a.warm_jobs, a.warm_chunk)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    writer = run(cfg)
    print(writer.markdown())
    return 0


# ---- compiling and calling one variant ------------------------------------------------


def compile_model(variant: str, compile_mode: str, model: torch.nn.Module, target: str,
                  threads: int | None) -> Callable[..., Any]:
    """eager: the model; default mode: bench.variants.make_callable (coil with its
    target and thread count); reduce-overhead: torch.compile's mode, the same for
    both compilers (torch.compile takes a mode or options, not both, so coil picks
    its target itself: triton for CUDA tensors)."""
    if compile_mode == "default" or variant == "eager":
        return make_callable(variant, model, target, threads)
    if variant == "inductor":
        return torch.compile(model, mode=compile_mode)
    return torch.compile(model, backend="coil", mode=compile_mode)


def _mark_step() -> None:
    """A new step for Inductor's CUDA graph trees: the last step's outputs may be
    overwritten (nothing here keeps them)."""
    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
    if mark is not None:
        mark()


def step_call(f: Callable[..., Any], model: torch.nn.Module, inputs: dict[str, torch.Tensor], mode: str,
              cuda_graphs: bool) -> Callable[[], Any]:
    """The timed call: inference under no_grad, or a training step (gradients set
    to None, forward with labels, the model's loss, backward)."""
    params = list(model.parameters())

    def infer() -> Any:
        if cuda_graphs:
            _mark_step()
        with torch.no_grad():
            return f(**inputs)

    def train() -> Any:
        if cuda_graphs:
            _mark_step()
        for p in params:
            p.grad = None
        loss = model_loss(f(**inputs))
        loss.backward()
        return loss.detach()

    return infer if mode == "infer" else train


def check_call(f: Callable[..., Any], inputs: dict[str, torch.Tensor], mode: str, cuda_graphs: bool
               ) -> dict[str, Any]:
    """One checked step: what bench/hf_models.py compares (outputs; or the loss,
    every gradient and buffer after a training step)."""
    if cuda_graphs:
        _mark_step()
    return CHECK_STEPS[mode](f, inputs)


# ---- one case -----------------------------------------------------------------------


def _error(e: BaseException) -> str:
    """The error on one line; where it wraps another (Dynamo's TorchRuntimeError
    around the op's own error, whose message comes after a long list of fake
    tensors), the start of it and the innermost cause."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    got = text.find("): got ")  # Dynamo's fake-tensor failure: the op's own error follows its arguments
    if got > 240:
        return text[:240] + " ... " + text[got + 3:got + 403]
    root = e
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    if root is not e:
        return text[:240] + " ... caused by " + " ".join(f"{type(root).__name__}: {root}".split())[:400]
    return text[:500]


def _mib(b: float | None) -> float | None:
    return None if b is None else round(b / 2**20, 2)


class _Laps:
    """A stopwatch for where a case's device time goes: `lap(name)` records under
    `name` the seconds since the last lap (or the start)."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into, self.mark = into, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = round(now - self.mark, 2)
        self.mark = now


@dataclass
class Case:
    """One model at one size and step, and where its records go."""

    name: str
    size: Size
    mode: str
    records: dict[tuple[str, str], dict[str, Any]]


def _status(rec: dict[str, Any], status: str, message: str | None = None) -> None:
    rec["status"] = status
    if message:
        rec["error" if status in ("error", "skipped") else "mismatch"] = message


@dataclass(frozen=True)
class Prepared:
    call: Callable[[], Any]  # the timed step
    check: Callable[[], dict[str, Any]]  # the checked step, on the same compiled model


def prepare(variant: str, compile_mode: str, case: Case, model: torch.nn.Module, inputs: dict[str, torch.Tensor],
            want: Expected, device: torch.device, target: str, cfg: Config, rec: dict[str, Any]) -> Prepared:
    """Compile a copy of the model, run and check its first step, warm it up,
    count its kernels and take its peak memory."""
    laps = _Laps(rec.setdefault("phases_s", {}))
    own = copy.deepcopy(model)  # its own parameters: a training step writes .grad, BatchNorm its statistics
    laps.lap("copy")
    f = compile_model(variant, compile_mode, own, target, cfg.threads)
    graphs = compile_mode == "reduce-overhead"
    cap, counts = Capture(), Counts()
    timing.sync(device)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught, coil_counting(counts):
        warnings.simplefilter("always")
        got = first_call(variant, lambda: check_call(f, inputs, case.mode, graphs), cap)
        timing.sync(device)
    rec["first_call_s"] = round(time.perf_counter() - t0, 3)
    rec["warnings"] = sorted({" ".join(str(w.message).split())[:200] for w in caught})[:5]
    rec["dynamo_graphs"], rec["graph_breaks"] = counts.dynamo_graphs, counts.graph_breaks
    if variant == "coil":
        rec["coil_graphs"] = counts.compiled + counts.cached
        rec["coil_graphs_cached"] = counts.cached
        rec["eager_fallbacks"] = len(counts.eager_fallbacks)
    if variant == "eager":
        _status(rec, "ref")
    else:
        multiplier = RMSE_MULTIPLIER_BF16 if DTYPES[cfg.dtype] == torch.bfloat16 else RMSE_MULTIPLIER
        verdict = judge(got, want, multiplier)
        rec["max_abs_err"] = verdict.max_abs
        rec["rmse_ratio"] = verdict.rmse_ratio
        if not verdict.passed:
            _status(rec, "mismatch", f"{variant} ({compile_mode}) on {case.name} {case.mode}: {verdict.reason}")
        elif variant == "coil" and counts.eager_fallbacks:
            _status(rec, "fallback", f"coil ran {len(counts.eager_fallbacks)} graph(s) eagerly: "
                    + " ".join(counts.eager_fallbacks[0].split())[:300])
        else:
            _status(rec, "ok")
    del got
    call = step_call(f, own, inputs, case.mode, graphs)
    laps = _Laps(rec["phases_s"])  # the compile and first step are first_call_s
    warm = memory.cuda_peak_over(lambda: [call() for _ in range(3)]) if device.type == "cuda" else None
    if warm is None:
        for _ in range(2):
            call()
    else:
        rec["peak_warmup_mib"] = _mib(warm)
    laps.lap("warm")
    _kernels(variant, call, cap, device, rec)
    laps.lap("kernels")
    rec["peak_mib"] = _mib(memory.peak_bytes(call, device))
    laps.lap("peak")
    return Prepared(call, lambda: check_call(f, inputs, case.mode, graphs))


def _kernels(variant: str, call: Callable[[], Any], cap: Capture, device: torch.device, rec: dict[str, Any]) -> None:
    """Kernels per call: on CUDA every variant from the profiler (with their summed
    time and CUDA graph launches); on the CPU as bench/harness.py counts them."""
    if variant == "coil":
        rec["planned_kernels"] = counting.coil_launches(cap.coil_graphs)
        rec["plan_peak_mib"] = _mib(counting.coil_plan_peak(cap.coil_graphs))
    if variant == "inductor":
        rec["kernels_generated"] = cap.inductor_kernels_generated
    if device.type == "cuda":
        prof = counting.cuda_profile(call)
        rec["kernels"], rec["kernel_method"] = prof.launches, "profiler: device events per call"
        rec["gpu_kernel_ms"] = round(prof.kernel_s * 1e3, 4)
        rec["cuda_graph_launches"] = prof.graph_launches
    elif variant == "coil":
        rec["kernels"], rec["kernel_method"] = rec["planned_kernels"], "wrapper KernelCall + ExternCall lines"
    elif variant == "inductor":
        rec["kernels"] = counting.inductor_launches(cap.inductor_code)
        rec["kernel_method"] = "kernel + extern calls in output code"
    else:
        ops = counting.eager_cpu_ops(call)
        rec["kernels"], rec["kernel_method"] = sum(ops.values()), "profiler: top-level aten ops"


def _compiles() -> list[Any]:
    """Dynamo's record of each frame it compiled (its recompile reason among them),
    as far back as it keeps them; [] where this torch has none."""
    import torch._dynamo.utils

    get = getattr(torch._dynamo.utils, "get_compilation_metrics", None)
    try:
        return list(get()) if get is not None else []
    except Exception:  # noqa: BLE001 - a diagnosis only: never a variant's error
        return []


def _call_before_timing(call: Callable[[], Any], device: torch.device, rec: dict[str, Any]) -> None:
    """One synchronised call of a prepared variant after every variant of the case is
    prepared, before the timed rounds: its seconds (`before_timing_s`) and the frames
    Dynamo compiled in it, with why (`before_timing_compiles`).  On the GPU the first
    timing of each default-mode variant took about that variant's first call again
    (session 47: T5's training step, coil 5.7 s, Inductor 2.3 s; session 48's H200
    records alike), where eager's and the reduce-overhead variants' did not; this call
    takes that cost out of the first round and says what it was."""
    kept = _compiles()  # alive while the call runs, so no new record takes one of their ids
    before = {id(m) for m in kept}
    timing.sync(device)
    t0 = time.perf_counter()
    call()
    timing.sync(device)
    rec["before_timing_s"] = round(time.perf_counter() - t0, 3)
    new = [m for m in _compiles() if id(m) not in before]
    rec["before_timing_compiles"] = [
        " ".join(f"{getattr(m, 'co_name', '?')}: {getattr(m, 'recompile_reason', None) or 'a first compile'}"
                 .split())[:300] for m in new[:5]]


def _late_check(call_check: Callable[[], dict[str, Any]], want: Expected, cfg: Config) -> str | None:
    """The check once more after timing, buffers left out (BatchNorm's running
    statistics moved with every timed step; gradients did not, as no optimizer ran)."""
    got = call_check()
    keep = {k: v for k, v in want.eager.items() if not k.startswith("buffer ")}
    multiplier = RMSE_MULTIPLIER_BF16 if DTYPES[cfg.dtype] == torch.bfloat16 else RMSE_MULTIPLIER
    verdict = judge({k: v for k, v in got.items() if k in keep}, Expected(keep, want.reference, want.fp64_error),
                    multiplier)
    return None if verdict.passed else verdict.reason


def measure_case(case: Case, cfg: Config, device: torch.device, target: str, deadline: float,
                 writer: Writer, cold: dict[tuple[str, str, str, str, str], float | str] | None = None) -> None:
    recs = case.records
    for (variant, cmode), rec in recs.items():  # what the warm-up's compile took (warm_up)
        got = (cold or {}).get((case.name, case.size.name, case.mode, cmode, variant))
        if isinstance(got, float):
            rec["cold_first_call_s"] = got
        elif got is not None:
            rec["warm_up_error"] = got
    if time.monotonic() > deadline:
        for rec in recs.values():
            _status(rec, "skipped", "time budget spent")
        return
    dtype = DTYPES[cfg.dtype]
    calls: dict[str, Callable[[], Any]] = {}
    checks: dict[str, Callable[[], dict[str, Any]]] = {}
    keys: dict[str, tuple[str, str]] = {}
    # where the case's device time went (bench/README.md: phases_s), to plan runs by
    spent: dict[str, float] = {}
    laps = _Laps(spent)
    try:
        model, inputs = make_case(case.name, case.mode, str(device), size=case.size, dtype=dtype)
        laps.lap("build")
        want = expected(model, inputs, case.mode)
        laps.lap("reference")
    except Exception as e:  # noqa: BLE001 - recorded, never fatal
        for rec in recs.values():
            _status(rec, "error", f"eager reference: {_error(e)}")
        _cleanup(device)
        writer.write()
        return
    torch._dynamo.reset()
    try:
        for (variant, cmode), rec in recs.items():
            key = variant if cmode == "default" else f"{variant}/{cmode}"
            if time.monotonic() > deadline:
                _status(rec, "skipped", "time budget spent")
                continue
            try:
                prepared = prepare(variant, cmode, case, model, inputs, want, device, target, cfg, rec)
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                _status(rec, "error", f"{variant} ({cmode}): {_error(e)}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            keys[key] = (variant, cmode)
            calls[key], checks[key] = prepared.call, prepared.check
        laps.lap("prepare")
        for key in list(calls):
            try:
                _call_before_timing(calls[key], device, recs[keys[key]])
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                _status(recs[keys[key]], "error", f"{key} before timing: {_error(e)}")
                del calls[key]
        laps.lap("before_timing")
        while calls:
            try:
                # a case once started is timed in all its rounds: the budget decides which cases
                # start (one cut to a round was one sample of a host that moves by up to 2x)
                times = timed_rounds(calls, device, False, cfg.rounds, math.inf, wall=True, pace=timing.SHORT_PACE)
                break
            except VariantFailed as e:
                _status(recs[keys[e.variant]], "error", f"{e.variant} while timed: {_error(e.error)}")
                del calls[e.variant]
        else:
            times = {}
        laps.lap("timing")
        for key in calls:
            rec = recs[keys[key]]
            ms = [t.median_s * 1e3 for t in times[key]]
            rec["ms"] = round(statistics.median(ms), 4)
            rec["ms_rounds"] = [round(x, 4) for x in ms]
            walls = [t.wall_s * 1e3 for t in times[key] if t.wall_s is not None]
            if walls:  # CUDA: steps back to back, the loop's steady state (timing.back_to_back_s)
                rec["wall_ms"] = round(statistics.median(walls), 4)
                rec["wall_ms_rounds"] = [round(x, 4) for x in walls]
            took = [t.spent_s for t in times[key] if t.spent_s is not None]
            if took:  # CUDA: how long each round's timing of this variant took (plans runs by)
                rec["timing_s_rounds"] = [round(x, 3) for x in took]
            mins = [t.min_s for t in times[key] if t.min_s is not None]
            if mins:
                rec["ms_min"] = round(min(mins) * 1e3, 4)
            loads = [t.load for t in times[key] if t.load is not None]
            if loads:
                rec["load_average"] = round(max(loads), 2)
            if rec["status"] == "ref":
                continue
            try:
                late = _late_check(checks[key], want, cfg)
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                _status(rec, "error", f"{key} after timing: {_error(e)}")
                continue
            if late and rec["status"] == "ok":
                _status(rec, "mismatch", f"{key} on {case.name} {case.mode}, after timing: {late}")
        laps.lap("late_check")
    finally:
        calls.clear()
        checks.clear()
        laps = _Laps(spent)
        _cleanup(device)
        laps.lap("cleanup")
        for rec in recs.values():
            rec["case_phases_s"] = dict(spent)
        writer.write()
    for (variant, cmode), rec in recs.items():
        shown = f"{rec['ms']:.3f} ms" if rec.get("ms") is not None else (rec.get("error") or "")[:120]
        print(f"[models] {case.size.name:5s} {case.name:16s} {case.mode:5s} {variant:8s} {cmode:15s} "
              f"{rec['status']:8s} {shown}", file=sys.stderr, flush=True)


# ---- compiling ahead, in parallel ------------------------------------------------------


def warm_jobs(cases: Sequence[Case]) -> list[tuple[str, Size, str, tuple[tuple[str, str], ...]]]:
    """The warm-up's jobs: one a case and compiler, with that compiler's (variant,
    compile mode) pairs in the order they are compiled (default first), so that a
    case's two compilers compile side by side and its compile modes one after the
    other."""
    groups: dict[tuple[int, str], list[tuple[str, str]]] = {}
    for i, c in enumerate(cases):
        for k in c.records:
            if k[0] != "eager":
                groups.setdefault((i, k[0]), []).append(k)
    return [(cases[i].name, cases[i].size, cases[i].mode, tuple(plans)) for (i, _), plans in groups.items()]


def warm_up(cases: Sequence[Case], cfg: Config, target: str, deadline: float
            ) -> dict[tuple[str, str, str, str, str], float | str]:
    """With --warm-jobs N: compile every case's compiled variants in N processes at
    once (a fresh process a case and compiler, spawned, so no Dynamo state is
    shared), each running one checked step, into the caches the run set up
    (fresh_caches: Inductor's FX graph and AOTAutograd caches, Triton's, coil's
    graph cache).  The timed run then compiles the same graphs again and finds them
    cached, so its compiles cost tracing and loading only: most of the suite's
    device time was cold compiles, one at a time.  One job compiles one compiler's
    compile modes one after the other (reduce-overhead compiles the default mode's
    graphs, so it finds them cached: two processes compiling them side by side
    would each compile them cold).  Returns each (model, size, mode, compile mode,
    variant)'s cold first call in seconds (compile + run, under the others' load),
    the first compile mode of each job only, or "error: ..."; nothing is timed
    here."""
    jobs = warm_jobs(cases)
    out: dict[tuple[str, str, str, str, str], float | str] = {}
    if cfg.warm_jobs < 1 or not jobs:
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    t0 = time.monotonic()
    print(f"[models] warm-up: {len(jobs)} compiles in {min(cfg.warm_jobs, len(jobs))} processes", file=sys.stderr,
          flush=True)
    pool = ProcessPoolExecutor(min(cfg.warm_jobs, len(jobs)), mp_context=multiprocessing.get_context("spawn"),
                               max_tasks_per_child=1)
    try:
        futures = {pool.submit(_warm_case, job, cfg, target): job for job in jobs}
        for fut in as_completed(futures):
            name, size, mode, plans = futures[fut]
            try:
                got = fut.result()
            except Exception as e:  # noqa: BLE001 - a worker that died: its case compiles cold in the run
                got = {p: f"error: {_error(e)}" for p in plans}
            for (variant, cmode), r in got.items():
                out[(name, size.name, mode, cmode, variant)] = r
            shown = ", ".join(f"{v}/{c} {r if isinstance(r, str) else f'{r:.1f} s'}"[:80] for (v, c), r in got.items())
            print(f"[models] warm-up {size.name:5s} {name:16s} {mode:5s} {shown}", file=sys.stderr, flush=True)
            if time.monotonic() > deadline:
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    print(f"[models] warm-up done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def _warm_case(job: tuple[str, Size, str, tuple[tuple[str, str], ...]], cfg: Config, target: str
               ) -> dict[tuple[str, str], float | str]:
    """In a warm-up process: build the case's model, then compile each variant of
    the job on its own copy and run one checked step (the run's first call does
    the same).  The first variant's first call is cold; a later one's found the
    first one's graphs cached and is not returned, but its error is."""
    name, size, mode, plans = job
    device = torch.device(cfg.device)
    out: dict[tuple[str, str], float | str] = {}
    with torch_threads(cfg.threads), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, inputs = make_case(name, mode, str(device), size=size, dtype=DTYPES[cfg.dtype])
        for variant, cmode in plans:
            torch._dynamo.reset()
            try:
                f = compile_model(variant, cmode, copy.deepcopy(model), target, cfg.threads)
                timing.sync(device)
                t0 = time.perf_counter()
                check_call(f, inputs, mode, cmode == "reduce-overhead")
                timing.sync(device)
                if (variant, cmode) == plans[0]:
                    out[(variant, cmode)] = round(time.perf_counter() - t0, 3)
            except Exception as e:  # noqa: BLE001 - recorded; the run compiles it again and reports
                out[(variant, cmode)] = f"error: {_error(e)}"
            f = None
            _cleanup(device)
    return out


def _cleanup(device: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- the run ------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for mod in ("triton", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = "none"
    return out


def coil_source() -> str:
    """The version of coil's source a record was measured with: the graph cache's
    hash of coil's files, cut to 12 hex digits (the device gets a `git archive`,
    with no commit to read)."""
    from coil.graph_cache import coil_source_hash

    return coil_source_hash()[:12]


def run(cfg: Config) -> Writer:
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    target, notes = resolve_target(cfg.target, device)
    compile_modes = cfg.compile_modes
    if device.type != "cuda" and "reduce-overhead" in compile_modes:
        compile_modes = tuple(m for m in compile_modes if m != "reduce-overhead")
        notes.append("reduce-overhead skipped: it asks for CUDA graphs, which the CPU does not have; "
                     "the CPU runs the default compile mode only")
    notes.append("train: gradients set to None, forward with labels (the model's own loss), backward; "
                 "no optimizer step")
    names = cfg.only or tuple(ALL_MODELS)
    start = time.monotonic()
    deadline = start + (cfg.budget_s if cfg.budget_s is not None else math.inf)
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cpus)")
    tiny = cfg.sizes == ("tiny",)
    file_name = cfg.name or (device_file_name(device) + "-models" + ("-tiny" if tiny else "")
                             + ("-" + "-".join(cfg.only) if cfg.only and not cfg.merge else ""))
    with fresh_caches(), torch_threads(cfg.threads):
        run_info = {
            "device": device.type, "device_name": device_name, **_versions(), "coil_target": target,
            "dtype": cfg.dtype, "threads": torch.get_num_threads(), "rounds": cfg.rounds,
            **({"rep_ms": timing.SHORT_PACE.rep_ms, "min_calls": timing.SHORT_PACE.min_calls,
                "wall_target_s": timing.SHORT_PACE.wall_s} if device.type == "cuda" else {}),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "coil_source": coil_source(),
        }
        writer = Writer(cfg.out, file_name, run_info, notes, compile_modes, merge=cfg.merge)
        # --resume skips what this coil measured already: a record of another source is measured again
        done = {record_key(r) for r in writer.kept if measured(r) and r.get("coil_source") == run_info["coil_source"]}
        cases: list[Case] = []
        for size_name in cfg.sizes:
            size = SIZES[size_name]
            for name in names:
                for mode in cfg.modes:
                    planned = [(v, c) for v, c in VARIANTS
                               if v in cfg.variants and (v == "eager" or c in compile_modes)]
                    if cfg.resume and all((name, size_name, mode, c, v) in done for v, c in planned):
                        continue
                    recs = {(v, c): writer.new_record(model=name, size=size_name, mode=mode, compile_mode=c,
                                                      variant=v, batch=size.batch, seq=size.seq, hidden=size.hidden,
                                                      layers=size.layers)
                            for v, c in planned}
                    cases.append(Case(name, size, mode, recs))
        print(f"[models] {len(cases)} cases to run", file=sys.stderr, flush=True)
        writer.write()
        load0 = os.getloadavg()
        chunk = cfg.warm_chunk or max(len(cases), 1)
        warm_s = 0.0
        for at in range(0, len(cases), chunk):
            part = cases[at:at + chunk]
            t0 = time.monotonic()
            # a chunk past the budget is not warmed: its cases are only marked skipped
            cold = warm_up(part, cfg, target, deadline) if time.monotonic() < deadline else {}
            warm_s += time.monotonic() - t0
            writer.run_info["warm_up_s"] = round(warm_s, 1)
            for case in part:
                measure_case(case, cfg, device, target, deadline, writer, cold)
        writer.finish(time.monotonic() - start, load0, os.getloadavg())
    return writer
