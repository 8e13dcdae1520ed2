"""`python -m bench --suite dynamic`: shapes that change from call to call (issue 17),
through coil with dynamic shapes, coil compiling every shape anew, Inductor with
dynamic shapes, and eager PyTorch, in one process.

Two workloads:

- batches: the eight row workloads of the cpu/gpu suites (seed, softmax, layer_norm,
  rms_norm, gelu_bias_residual, cross_entropy, silu_mul, add_transpose), each called
  at a series of batch sizes.  None of them has a batch dimension of its own: the
  leading dimension (the rows; x's rows and y's columns in x + y.t()) is the batch
  size times a fixed number of rows an item, so the largest batch, 64, is the cpu
  (gpu) suite's size;
- decoder: a GPT-2 (transformers, from a config with random weights, nothing
  downloaded) generating greedily without a KV cache: from a one-token prompt, each
  step runs the model on the whole sequence, takes the argmax of the last
  position's logits and appends it, so the sequence grows one token a step.

Variants: `eager`; `coil-dynamic` (torch.compile(fn, backend="coil", dynamic=True));
`coil-static` (dynamic=False: one compile per shape); `inductor-dynamic`
(torch.compile(fn, dynamic=True)).  Each variant starts from a fresh Dynamo
(torch._dynamo.reset, counters cleared) and its own empty Inductor, Triton and coil
cache folders, warmed by one compile of an unrelated function (so start-up costs
paid once a process, such as imports and coil's precompiled prelude, fall outside
the counts); Dynamo's recompile limit is raised so a static variant compiles every
shape instead of falling back to eager.  Per shape (batch size or step) the record
has the Dynamo graphs compiled, coil's compiled and eager-run graphs (from
torch._dynamo.utils.counters["coil"]), the first call's time, the steady time and the
first call's excess over it (`compile_s`), Dynamo's own compile timer and the check
against eager.  See bench/README.md for the files."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import check, counting, timing
from bench import workloads as w
from bench.harness import DEFAULT_OUT, device_file_name, resolve_target, torch_threads
from bench.report import _atomic

VARIANTS: tuple[str, ...] = ("eager", "coil-dynamic", "coil-static", "inductor-dynamic")
BATCH_WORKLOADS: tuple[str, ...] = ("seed", "softmax", "layer_norm", "rms_norm", "gelu_bias_residual",
                                    "cross_entropy", "silu_mul", "add_transpose")
DECODER = "decoder"
OK = ("ok", "ref")
CPU_BATCHES = (1, 2, 3, 5, 8, 13, 16, 21, 32, 47, 64)

f32, bf16 = torch.float32, torch.bfloat16


@dataclass(frozen=True)
class Size:
    """How big: the batch workloads' rows an item and columns, the batch sizes, the
    decoder's shape and steps, and how long each steady timing runs."""

    name: str
    batches: tuple[int, ...]
    rows: int  # rows an item, row workloads
    cols: int
    ce_rows: int  # cross_entropy: rows an item, classes
    classes: int
    silu_cols: int
    at_rows: int  # add_transpose: x is (batch * at_rows, at_n), y (at_n, batch * at_rows)
    at_n: int
    dtype: torch.dtype  # row workloads but seed and add_transpose (f32 always, as in the suites)
    hidden: int
    layers: int
    heads: int
    vocab: int
    steps: int
    prompt: int
    time_s: float  # CPU: steady timing per shape (cpu_timing's total)
    rounds: int  # decoder: warm generations after the cold one


SIZES: dict[str, Size] = {
    "tiny": Size("tiny", (1, 2, 3), 2, 64, 2, 100, 64, 2, 64, f32, 64, 2, 2, 512, 3, 1, 0.01, 1),
    "cpu": Size("cpu", CPU_BATCHES, 64, 1024, 16, 8000, 1024, 32, 2048, f32, 256, 2, 4, 8000, 128, 1, 0.25, 3),
    "gpu": Size("gpu", tuple(range(1, 65)), 512, 4096, 256, 32000, 8192, 128, 8192, bf16, 1024, 4, 16, 32000, 128,
                1, 0.0, 3),
}


@dataclass(frozen=True)
class Config:
    device: str
    size: Size
    only: tuple[str, ...]
    variants: tuple[str, ...]
    target: str
    threads: int | None
    budget_s: float | None
    out: Path
    name: str | None
    argv: tuple[str, ...] = ()


def _names(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(n for item in items for n in item.split(",") if n)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(prog="python -m bench --suite dynamic", description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="dynamic", choices=("dynamic",))
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda when there is one")
    p.add_argument("--size", default=None, choices=tuple(SIZES),
                   help="tiny (the test), cpu, gpu (default: the device's)")
    p.add_argument("--only", action="append", default=[],
                   help="workloads (repeatable, or comma-separated): " + ",".join((*BATCH_WORKLOADS, DECODER)))
    p.add_argument("--variants", action="append", default=[],
                   help=", ".join(VARIANTS) + " (default all; eager always runs: it is the reference)")
    p.add_argument("--batches", default=None, help="batch sizes, comma-separated (default: the size's)")
    p.add_argument("--steps", type=int, default=None, help="decoder steps (default: the size's; 128 but tiny)")
    p.add_argument("--rounds", type=int, default=None, help="decoder: warm generations timed after the cold one")
    p.add_argument("--target", default="auto", help="coil's target (auto: triton on CUDA, cpp on the CPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every variant (as the other suites)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no new workload and variant after this many seconds (the rest is `skipped`)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--name", default=None, help="result file name (default: <device>-dynamic)")
    a = p.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    size = SIZES[a.size or ("gpu" if device == "cuda" else "cpu")]
    if a.batches:
        size = dataclasses.replace(size, batches=_ints(a.batches))
    if a.steps is not None:
        size = dataclasses.replace(size, steps=a.steps)
    if a.rounds is not None:
        size = dataclasses.replace(size, rounds=a.rounds)
    if min(size.batches) < 1 or size.steps < 1 or size.rounds < 1:
        p.error("batch sizes, --steps and --rounds must be at least 1")
    only = _names(a.only)
    unknown = set(only) - {*BATCH_WORKLOADS, DECODER}
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; known: {', '.join((*BATCH_WORKLOADS, DECODER))}")
    variants = _names(a.variants) or VARIANTS
    if set(variants) - set(VARIANTS):
        p.error(f"--variants takes {', '.join(VARIANTS)}")
    variants = ("eager", *(v for v in VARIANTS if v in variants and v != "eager"))
    return Config(device, size, only, variants, a.target, a.threads, a.budget_s, a.out, a.name,
                  tuple(sys.argv[1:] if argv is None else argv))


def main(argv: Sequence[str] | None = None) -> int:
    writer = run(parse_args(argv))
    print(writer.markdown())
    return 0


# ---- the workloads ---------------------------------------------------------------------


def _add_transpose(rows: int, n: int) -> w.Workload:
    """x + y.t() with x (rows, n) and y (n, rows): the suites' square case with its
    leading dimension (y's trailing one) free."""

    def build(device: torch.device) -> w.Instance:
        g = w._gen(device)
        return w.Instance(w.add_transpose_fn, (w._randn((rows, n), f32, device, g), w._randn((n, rows), f32, device, g)))

    return w.Workload("add_transpose", f"x + y.t() f32 {rows}x{n}", build, 1e-3, 1e-4)


def batch_workload(name: str, size: Size, batch: int) -> w.Workload:
    """The named workload at `batch` items: batch * (rows an item) rows."""
    r, c, dt = batch * size.rows, size.cols, size.dtype
    makers: dict[str, Callable[[], w.Workload]] = {
        "seed": lambda: w.seed(r, c, f32),
        "softmax": lambda: w.softmax(r, c, dt),
        "layer_norm": lambda: w.layer_norm(r, c, dt),
        "rms_norm": lambda: w.rms_norm(r, c, dt),
        "gelu_bias_residual": lambda: w.gelu_bias_residual(r, c, dt),
        "cross_entropy": lambda: w.cross_entropy(batch * size.ce_rows, size.classes, dt),
        "silu_mul": lambda: w.silu_mul(r, size.silu_cols, dt),
        "add_transpose": lambda: _add_transpose(batch * size.at_rows, size.at_n),
    }
    return makers[name]()


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "seed": w.seed_fn, "softmax": w.softmax_fn, "layer_norm": w.layer_norm_fn, "rms_norm": w.rms_norm_fn,
    "gelu_bias_residual": w.gelu_bias_residual_fn, "cross_entropy": w.cross_entropy_fn, "silu_mul": w.silu_mul_fn,
    "add_transpose": w.add_transpose_fn,
}


def rows_per_item(name: str, size: Size) -> int:
    return {"cross_entropy": size.ce_rows, "add_transpose": size.at_rows}.get(name, size.rows)


def build_decoder(size: Size, device: torch.device) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=size.vocab, n_positions=max(64, size.prompt + size.steps), n_embd=size.hidden,
                     n_layer=size.layers, n_head=size.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    dtype = bf16 if device.type == "cuda" else f32
    model: torch.nn.Module = GPT2LMHeadModel(cfg)
    return model.to(device=device, dtype=dtype).eval()


def decoder_description(size: Size, model: torch.nn.Module) -> str:
    attn = getattr(getattr(model, "config", None), "_attn_implementation", "?")
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return (f"GPT-2 (transformers, random weights) hidden {size.hidden}, {size.layers} layers, {size.heads} heads, "
            f"vocabulary {size.vocab}, {dtype}, attention {attn}; batch 1, prompt {size.prompt} token(s), "
            f"{size.steps} greedy steps without KV cache (sequence {size.prompt} to {size.prompt + size.steps - 1})")


# ---- compiling, counting, caches -------------------------------------------------------


def compile_variant(variant: str, fn: Callable[..., Any], target: str, threads: int | None) -> Callable[..., Any]:
    if variant == "eager":
        return fn
    backend, dyn = variant.split("-")
    if backend == "coil":
        options: dict[str, Any] = {"target": target}
        if threads:
            options["num_threads"] = threads
        return torch.compile(fn, backend="coil", dynamic=dyn == "dynamic", options=options)
    return torch.compile(fn, dynamic=dyn == "dynamic")


class _CacheLog(logging.Handler):
    """Counts coil's "loaded from the graph cache" lines (a Dynamo graph served by
    the graph cache's link: no compile, and no counters["coil"] entry)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.cached = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.cached += "loaded from the graph cache" in record.getMessage()


@contextlib.contextmanager
def coil_cache_log() -> Iterator[_CacheLog]:
    logger = logging.getLogger("coil")
    handler, level = _CacheLog(), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.DEBUG:
        logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@dataclass(frozen=True)
class Counts:
    graphs: int
    graph_breaks: int
    coil_compiled: int
    coil_eager: int
    coil_cached: int
    dynamo_s: float  # Dynamo's timer of its frame compiles (the backend's compile inside)

    def minus(self, o: Counts) -> Counts:
        return Counts(self.graphs - o.graphs, self.graph_breaks - o.graph_breaks,
                      self.coil_compiled - o.coil_compiled, self.coil_eager - o.coil_eager,
                      self.coil_cached - o.coil_cached, self.dynamo_s - o.dynamo_s)


def counts_now(log: _CacheLog) -> Counts:
    from torch._dynamo.utils import compilation_time_metrics, counters

    return Counts(int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values())),
                  int(counters["coil"]["compiled"]), int(counters["coil"]["eager"]), log.cached,
                  float(sum(compilation_time_metrics.get("_compile.compile_inner", []))))


def _warm_fn(x: torch.Tensor) -> torch.Tensor:
    return (x * 2.0).relu().sum(-1)


class Caches:
    """One folder of empty Inductor, Triton and coil caches per variant for the whole
    run (no variant reads what another compiled); the first use of each is warmed by
    compiling an unrelated function at two shapes, then Dynamo is reset."""

    NAMES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COIL_CACHE_DIR")

    def __init__(self, root: str) -> None:
        self.root = root
        self.warmed: set[str] = set()

    @contextlib.contextmanager
    def use(self, variant: str, device: torch.device, target: str, threads: int | None) -> Iterator[None]:
        saved = {n: os.environ.get(n) for n in self.NAMES}
        for n in self.NAMES:
            os.environ[n] = os.path.join(self.root, variant, n.lower())
        try:
            if variant != "eager" and variant not in self.warmed:
                torch._dynamo.reset()
                f = compile_variant(variant, _warm_fn, target, threads)
                for shape in ((3, 5), (6, 7)):
                    f(torch.randn(shape, device=device))
                self.warmed.add(variant)
            torch._dynamo.reset()
            yield
        finally:
            torch._dynamo.reset()
            for n, v in saved.items():
                if v is None:
                    os.environ.pop(n, None)
                else:
                    os.environ[n] = v


@contextlib.contextmanager
def recompile_limit(n: int) -> Iterator[None]:
    """Dynamo stops compiling a frame after `recompile_limit` recompiles (8) and runs
    it eagerly; a static variant must compile every shape, so the limits go up."""
    cfg = torch._dynamo.config
    names = [x for x in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                         "accumulated_cache_size_limit") if hasattr(cfg, x)]
    saved = {x: getattr(cfg, x) for x in names}
    for x in names:
        setattr(cfg, x, max(int(saved[x]), n))
    try:
        yield
    finally:
        for x, v in saved.items():
            setattr(cfg, x, v)


# ---- measuring ------------------------------------------------------------------------


def steady(call: Callable[[], Any], device: torch.device, total_s: float) -> tuple[float, float | None]:
    """Median (and on the CPU least) seconds a call, warmed up: bench.timing's timers,
    shorter (every variant is timed at every shape)."""
    if device.type == "cuda":
        return timing.cuda_median_s(call, warmup_ms=5, rep_ms=25), None
    t = timing.cpu_timing(call, sample_s=min(0.02, total_s / 3), total_s=total_s, min_samples=3, max_samples=21)
    return t.median_s, t.min_s


def first_call(call: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    timing.sync(device)
    t0 = time.perf_counter()
    out = call()
    timing.sync(device)
    return out, time.perf_counter() - t0


def _error(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:400]


def _counts_fields(c: Counts) -> dict[str, Any]:
    return {"compiles": c.graphs, "graph_breaks": c.graph_breaks, "coil_compiled": c.coil_compiled,
            "coil_eager": c.coil_eager, "coil_cached": c.coil_cached, "dynamo_compile_s": round(c.dynamo_s, 4)}


def measure_batches(name: str, variant: str, cfg: Config, device: torch.device, target: str,
                    log: _CacheLog, writer: Writer) -> None:
    """One variant of one batch workload: at each batch size in turn, eager's output
    (the reference), the first call (compiles when the shape is new to the variant),
    the check, the steady time, and the check once more."""
    size = cfg.size
    from torch._dynamo.utils import counters

    counters.clear()
    fn = FUNCTIONS[name]
    f = compile_variant(variant, fn, target, cfg.threads)
    for batch in size.batches:
        wl = batch_workload(name, size, batch)
        rec = writer.new(workload=name, variant=variant, size=batch, rows=batch * rows_per_item(name, size))
        try:
            inst = wl.build(device)
            with torch.no_grad():
                want = check.snapshot(fn(*inst.inputs))
                before = counts_now(log)
                out, first = first_call(lambda: f(*inst.inputs), device)
                got = counts_now(log).minus(before)
                bad = check.compare(out, want, wl.rtol, wl.atol)
                del out
                med, least = steady(lambda: f(*inst.inputs), device, size.time_s)
                gpu = counting.cuda_profile(lambda: f(*inst.inputs), GPU_REPS) if device.type == "cuda" else None
                late = check.compare(f(*inst.inputs), want, wl.rtol, wl.atol)
        except Exception as e:  # noqa: BLE001 - recorded, never fatal
            rec.update(status="error", error=f"{variant} on {name} at batch {batch}: {_error(e)}")
            writer.write()
            continue
        rec.update(_counts_fields(got), status=("ref" if variant == "eager" else "ok"), ms=med * 1e3,
                   first_call_ms=first * 1e3, compile_s=None if variant == "eager" else max(0.0, first - med))
        if least is not None:
            rec["ms_min"] = least * 1e3
        if gpu is not None:  # the kernels alone: what the host's speed does not change
            rec.update(gpu_ms=gpu.kernel_s * 1e3, kernels=gpu.launches)
        if device.type == "cpu":
            rec["load_average"] = os.getloadavg()[0]
        if bad or late:
            rec.update(status="mismatch", mismatch=f"{variant} on {name} at batch {batch}: {bad or late}")
        del inst, want
        writer.write()
    largest = batch_workload(name, size, size.batches[-1]).description
    writer.descriptions[name] = (f"{largest} at batch {size.batches[-1]}; the leading dimension is the batch size "
                                 f"times {rows_per_item(name, size)}")
    print(f"[dynamic] {name:20s} {variant:17s} " + writer.summary_text(name, variant), file=sys.stderr, flush=True)


def _generate(f: Callable[..., Any], prompt: torch.Tensor, steps: int, device: torch.device,
              on_step: Callable[[int, torch.Tensor, float], None] | None = None) -> tuple[torch.Tensor, list[float]]:
    """Greedy generation without a KV cache: each step runs the model on the whole
    sequence, takes the argmax of the last position and appends it.  Returns the
    tokens and each step's seconds (model call, argmax and append)."""
    ids, times = prompt, []
    with torch.no_grad():
        for step in range(steps):
            timing.sync(device)
            t0 = time.perf_counter()
            logits = f(input_ids=ids, use_cache=False).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
            timing.sync(device)
            times.append(time.perf_counter() - t0)
            if on_step is not None:
                on_step(step, logits, times[-1])
    return ids, times


def measure_decoder(model: torch.nn.Module, variant: str, cfg: Config, device: torch.device, target: str,
                    log: _CacheLog, writer: Writer, reference: dict[str, Any]) -> None:
    """One variant of the decoder: a cold generation (each step's first call at its
    sequence length, with its compile counts and a check of the last logits against
    eager's), then `rounds` warm generations; a step's time is the median over them."""
    size = cfg.size
    from torch._dynamo.utils import counters

    counters.clear()
    f = compile_variant(variant, model, target, cfg.threads)
    prompt = torch.ones((1, size.prompt), dtype=torch.int64, device=device)
    tol = (5e-2, 2e-2) if next(model.parameters()).dtype == bf16 else (1e-3, 1e-4)
    recs: list[dict[str, Any]] = []
    cold: list[tuple[Counts, str | None]] = []
    last = [counts_now(log)]

    def on_step(step: int, logits: torch.Tensor, _: float) -> None:
        now = counts_now(log)
        got = now.minus(last[0])
        last[0] = now
        if variant == "eager":
            reference.setdefault("logits", []).append(logits.detach().clone())
            cold.append((got, None))
        else:
            cold.append((got, check.compare(logits, [reference["logits"][step]], *tol)))

    try:
        ids, cold_times = _generate(f, prompt, size.steps, device, on_step)
        warm = [_generate(f, prompt, size.steps, device)[1] for _ in range(size.rounds)]
    except Exception as e:  # noqa: BLE001 - recorded, never fatal
        writer.new(workload=DECODER, variant=variant, step=None, status="error",
                   error=f"{variant} on the decoder: {_error(e)}")
        writer.write()
        return
    if variant == "eager":
        reference["tokens"] = ids.clone()
    # the first step whose appended token differs from eager's (it and the steps after
    # it ran on other sequences than eager's); None when all agree
    diverged = None
    if not torch.equal(ids, reference["tokens"]):
        differs = (ids != reference["tokens"]).nonzero() if ids.shape == reference["tokens"].shape else None
        diverged = 0 if differs is None or not len(differs) else int(differs[0, 1]) - size.prompt
    for step in range(size.steps):
        med = statistics.median(r[step] for r in warm)
        got, bad = cold[step]
        rec = writer.new(workload=DECODER, variant=variant, step=step + 1, seq=size.prompt + step,
                         status="ref" if variant == "eager" else "ok", ms=med * 1e3,
                         first_call_ms=cold_times[step] * 1e3,
                         compile_s=None if variant == "eager" else max(0.0, cold_times[step] - med),
                         **_counts_fields(got))
        if bad:
            rec.update(status="mismatch", mismatch=f"{variant} on the decoder at step {step + 1}: {bad}")
        elif diverged is not None and step >= diverged:
            rec.update(status="mismatch", mismatch=f"{variant} on the decoder: the token of step {diverged + 1} "
                                                   "differs from eager's, and so do the sequences after it")
        recs.append(rec)
    if device.type == "cpu":
        for rec in recs:
            rec["load_average"] = os.getloadavg()[0]
    writer.summary_extra[(DECODER, variant)] = {"cold_total_s": sum(cold_times),
                                                "warm_total_ms": 1e3 * sum(statistics.median(r[i] for r in warm)
                                                                           for i in range(size.steps))}
    writer.write()
    print(f"[dynamic] {DECODER:20s} {variant:17s} " + writer.summary_text(DECODER, variant), file=sys.stderr,
          flush=True)


# ---- the records and the tables ---------------------------------------------------------


def geomean(xs: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _num(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


class Writer:
    """This run's records, written to `<out>/<name>.json` (a list of records: one per
    workload, variant and shape, then one summary per workload and variant) and
    `<name>.md` after every workload and variant."""

    def __init__(self, out: Path, name: str, run_info: dict[str, Any], notes: list[str]) -> None:
        self.out, self.name, self.run_info, self.notes = out, name, run_info, notes
        self.records: list[dict[str, Any]] = []
        self.descriptions: dict[str, str] = {}
        self.summary_extra: dict[tuple[str, str], dict[str, Any]] = {}
        self.skipped: list[tuple[str, str, str]] = []
        out.mkdir(parents=True, exist_ok=True)

    @property
    def json_path(self) -> Path:
        return self.out / f"{self.name}.json"

    @property
    def md_path(self) -> Path:
        return self.out / f"{self.name}.md"

    def new(self, **fields: Any) -> dict[str, Any]:
        rec: dict[str, Any] = {"workload": fields.pop("workload"), "variant": fields.pop("variant"),
                               "size": None, "step": None, "ms": None, "compiles": None, "coil_compiled": None,
                               "coil_eager": None, "compile_s": None, "status": "pending"}
        rec.update(fields)
        rec.update({k: self.run_info[k] for k in ("device", "size_preset", "torch", "coil_target", "threads",
                                                   "started")})
        self.records.append(rec)
        return rec

    def shapes(self, workload: str, variant: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["workload"] == workload and r["variant"] == variant
                and not r.get("summary")]

    def summary(self, workload: str, variant: str) -> dict[str, Any]:
        """The totals of one workload and variant: compiles and compile seconds summed
        over the shapes; time: the geomean over batch sizes of ms (batches), the
        mean step's ms (decoder); ×eager the geomean over the shapes of ms / eager's
        ms (shapes where both passed)."""
        recs = self.shapes(workload, variant)
        done = [r for r in recs if r.get("ms") is not None]
        passed = [r for r in done if r["status"] in OK]
        bad = [r for r in recs if r["status"] not in OK]

        def total(field: str) -> float | None:
            vals = [r[field] for r in done if r.get(field) is not None]
            return sum(vals) if vals else None

        out: dict[str, Any] = {
            "workload": workload, "variant": variant, "summary": True, "size": None, "step": None,
            "shapes": len(done), "shapes_passed": len(passed),
            "status": (bad[0]["status"] if bad else ("ref" if variant == "eager" else "ok")) if recs else "pending",
            "compiles": total("compiles"), "graph_breaks": total("graph_breaks"),
            "coil_compiled": total("coil_compiled"), "coil_eager": total("coil_eager"),
            "coil_cached": total("coil_cached"), "compile_s": total("compile_s"),
            "dynamo_compile_s": total("dynamo_compile_s"),
            "first_calls_s": (total("first_call_ms") or 0.0) / 1e3 if done else None,
            "x_eager": self.ratio(workload, variant, "eager"),
        }
        if workload == DECODER:
            out["ms"] = statistics.mean(r["ms"] for r in done) if done else None
            out.update(self.summary_extra.get((workload, variant), {}))
        else:
            out["ms"] = geomean([r["ms"] for r in done])
            gpu = [r["gpu_ms"] for r in done if r.get("gpu_ms")]
            out["gpu_ms"] = geomean(gpu) if gpu and len(gpu) == len(done) else None
        errors = [r.get("error") or r.get("mismatch") for r in bad if r.get("error") or r.get("mismatch")]
        if errors:
            out["problem"] = errors[0]
        return out

    def ratio(self, workload: str, a: str, b: str, field: str = "ms") -> float | None:
        """a / b: time, the geomean over the shapes where both passed (batches) or the
        ratio of the warm generations' total (decoder); compile seconds, of the totals."""
        if field == "compile_s":
            sa, sb = self.summary(workload, a), self.summary(workload, b)
            if sa["shapes"] and sb["shapes"] and sa.get("compile_s") and sb.get("compile_s"):
                return float(sa["compile_s"]) / float(sb["compile_s"])
            return None
        key = "step" if workload == DECODER else "size"
        ra = {r[key]: r[field] for r in self.shapes(workload, a) if r["status"] in OK and r.get(field)}
        rb = {r[key]: r[field] for r in self.shapes(workload, b) if r["status"] in OK and r.get(field)}
        common = sorted(set(ra) & set(rb))
        if not common:
            return None
        if workload == DECODER:
            return sum(ra[k] for k in common) / sum(rb[k] for k in common)
        return geomean([ra[k] / rb[k] for k in common])

    def workloads(self) -> list[str]:
        seen: list[str] = []
        for r in self.records:
            if r["workload"] not in seen:
                seen.append(r["workload"])
        return seen

    def variants(self, workload: str) -> list[str]:
        have = {r["variant"] for r in self.records if r["workload"] == workload}
        return [v for v in VARIANTS if v in have]

    def summaries(self) -> list[dict[str, Any]]:
        out = []
        for wl in self.workloads():
            for v in self.variants(wl):
                s = self.summary(wl, v)
                s.update({k: self.run_info[k] for k in ("device", "size_preset", "torch", "coil_target", "threads",
                                                         "started")})
                if v == "coil-dynamic":
                    s["dynamic_over_static"] = self.ratio(wl, "coil-dynamic", "coil-static")
                    s["dynamic_over_inductor"] = self.ratio(wl, "coil-dynamic", "inductor-dynamic")
                    s["gpu_dynamic_over_static"] = self.ratio(wl, "coil-dynamic", "coil-static", "gpu_ms")
                    s["gpu_dynamic_over_inductor"] = self.ratio(wl, "coil-dynamic", "inductor-dynamic", "gpu_ms")
                    s["compile_s_dynamic_over_static"] = self.ratio(wl, "coil-dynamic", "coil-static", "compile_s")
                    s["compile_s_dynamic_over_inductor"] = self.ratio(wl, "coil-dynamic", "inductor-dynamic",
                                                                      "compile_s")
                out.append(s)
        return out

    def summary_text(self, workload: str, variant: str) -> str:
        s = self.summary(workload, variant)
        return (f"{s['status']:8s} graphs {s['compiles']} coil {s['coil_compiled']}/{s['coil_eager']} "
                f"compile {_num(s['compile_s'], '.2f')} s time {_num(s['ms'], '.4g')} ms "
                f"x eager {_num(s['x_eager'], '.2f')}")

    def write(self) -> None:
        _atomic(self.json_path, json.dumps([*self.records, *self.summaries()], indent=1, default=str) + "\n")
        _atomic(self.md_path, self.markdown())

    def markdown(self) -> str:
        info = self.run_info
        load = info.get("load_average_start")
        end = info.get("load_average_end")
        head = [
            f"# coil benchmarks: {info['device_name']} (dynamic suite, size {info['size_preset']})", "",
            (f"torch {info['torch']}, transformers {info['transformers']}, Python {info['python']}; coil target "
             f"`{info['coil_target']}`; threads {info['threads']}"
             + (f"; load average {load[0]:.1f} at the start" if load else "")
             + (f", {end[0]:.1f} at the end" if end else "")
             + f"; {info['started']}" + (f", {info['elapsed_s']:.0f} s" if info.get("elapsed_s") else "") + "."),
            "", f"Command: `{info['command']}`", "",
        ]
        head += [f"- {n}" for n in self.notes] + [""]
        notes: list[str] = []
        lines = ["## Per workload and variant", "",
                 "| workload | variant | check | Dynamo graphs | coil compiled / eager | compile s | Dynamo compile s "
                 "| time ms | ×eager |",
                 "|---|---|---|--:|--:|--:|--:|--:|--:|"]
        for wl in self.workloads():
            for i, v in enumerate(self.variants(wl)):
                s = self.summary(wl, v)
                checkcell = str(s["status"])
                if s.get("problem"):
                    notes.append(str(s["problem"]))
                    checkcell += f" [{len(notes)}]"
                if s["shapes_passed"] != s["shapes"] or not s["shapes"]:
                    checkcell += f" ({s['shapes_passed']}/{s['shapes']} shapes)"
                coil = (f"{s['coil_compiled']} / {s['coil_eager']}" if v.startswith("coil")
                        and s["coil_compiled"] is not None else "")
                if v.startswith("coil") and s.get("coil_cached"):
                    coil += f" (+{s['coil_cached']} cached)"
                cells = [f"**{wl}**" if i == 0 else "", v, checkcell, _num(s["compiles"], "d"), coil,
                         "" if v == "eager" else _num(s["compile_s"], ".2f"),
                         "" if v == "eager" else _num(s["dynamo_compile_s"], ".2f"), _ms(s["ms"]),
                         _num(s["x_eager"], ".2f")]
                lines.append("| " + " | ".join(cells) + " |")
        gpu = any(r.get("gpu_ms") for r in self.records)
        lines += ["", "## Dynamic coil against static coil and dynamic Inductor", "",
                  "| workload | time dyn coil / static coil | time dyn coil / dyn Inductor | compile s dyn coil / "
                  "static coil | compile s dyn coil / dyn Inductor |"
                  + (" GPU kernels dyn coil / static coil | GPU kernels dyn coil / dyn Inductor |" if gpu else ""),
                  "|---|--:|--:|--:|--:|" + ("--:|--:|" if gpu else "")]
        per: dict[str, list[float]] = {}
        # (the variant dynamic coil is compared with, the field) of each column
        columns = [(b, f) for f in ("ms", "compile_s", *(("gpu_ms",) if gpu else ()))
                   for b in ("coil-static", "inductor-dynamic")]
        for wl in self.workloads():
            row = [self.ratio(wl, "coil-dynamic", b, f) for b, f in columns]
            for j, x in enumerate(row):
                if x is not None and wl != DECODER:
                    per.setdefault(str(j), []).append(x)
            lines.append(f"| **{wl}** | " + " | ".join(_num(x, ".2f") for x in row) + " |")
        if per:
            lines.append("| geomean, batch workloads | " + " | ".join(
                _num(geomean(per.get(str(j), [])), ".2f") + (f" ({len(per[str(j)])})" if per.get(str(j)) else "")
                for j in range(len(columns))) + " |")
        lines += self._per_shape()
        if self.descriptions:
            lines += ["", "Workloads:", ""] + [f"- **{k}**: {d}" for k, d in self.descriptions.items()]
        if notes:
            lines += ["", "Notes:", ""] + [f"{i}. {n}" for i, n in enumerate(notes, 1)]
        return "\n".join(head + lines) + "\n"

    def _per_shape(self) -> list[str]:
        cols = list(VARIANTS)
        batch = [wl for wl in self.workloads() if wl != DECODER]
        lines: list[str] = []
        if batch:
            lines += ["", "## Batch workloads: ms a call at each batch size (steady state; first call in parentheses "
                      "where it compiled)", "",
                      "| workload | batch | rows | " + " | ".join(cols) + " |", "|---|--:|--:|" + "--:|" * len(cols)]
            for wl in batch:
                sizes = sorted({r["size"] for r in self.records if r["workload"] == wl and r["size"] is not None})
                for k, b in enumerate(sizes):
                    recs = {r["variant"]: r for r in self.records if r["workload"] == wl and r["size"] == b}
                    rows = next((r.get("rows") for r in recs.values() if r.get("rows")), "")
                    lines.append(f"| {'**' + wl + '**' if k == 0 else ''} | {b} | {rows} | "
                                 + " | ".join(_cell(recs.get(v)) for v in cols) + " |")
        if DECODER in self.workloads():
            steps = sorted({r["step"] for r in self.records if r["workload"] == DECODER and r["step"] is not None})
            shown = [s for s in steps if s & (s - 1) == 0 or s == steps[-1]]
            lines += ["", "## Decoder: ms a step at selected steps (warm; the cold step in parentheses where it "
                      "compiled)", "", "| step | sequence | " + " | ".join(cols) + " |", "|--:|--:|" + "--:|" * len(cols)]
            for s in shown:
                recs = {r["variant"]: r for r in self.records if r["workload"] == DECODER and r["step"] == s}
                seq = next((r.get("seq") for r in recs.values()), "")
                lines.append(f"| {s} | {seq} | " + " | ".join(_cell(recs.get(v)) for v in cols) + " |")
            totals = []
            for v in cols:
                extra = self.summary_extra.get((DECODER, v))
                totals.append("" if not extra else f"{_dur(extra['warm_total_ms'] / 1e3)} (cold {_dur(extra['cold_total_s'])})")
            lines.append("| **all** | | " + " | ".join(totals) + " |")
        return lines


def _dur(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def _ms(ms: float | None) -> str:
    return "-" if ms is None else (f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}")


def _cell(rec: dict[str, Any] | None) -> str:
    if not rec or rec.get("ms") is None:
        return "" if not rec else str(rec.get("status"))
    text = _ms(rec["ms"])
    if rec.get("compiles") or rec.get("coil_compiled"):
        text += f" ({_dur(rec['first_call_ms'] / 1e3)})"
    if rec.get("status") not in OK:
        text += f" {rec.get('status')}"
    return text


# ---- the run ------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    from bench.models import _versions as versions  # the models suite's, the same fields

    return versions()


GPU_REPS = 10  # calls under torch.profiler for a shape's GPU kernel time (CUDA)

NOTES = [
    "Each variant runs from a fresh Dynamo (torch._dynamo.reset(), counters cleared) with its own empty Inductor, "
    "Triton and coil cache folders; the first use of each folder is warmed by compiling an unrelated function at two "
    "shapes, so one-off start-up (imports, coil's precompiled prelude header, Inductor's first C++ build) is not "
    "counted. Variants run one after another (not interleaved: each needs its own Dynamo state); eager first.",
    "Dynamo graphs: torch._dynamo.utils.counters['stats']['unique_graphs'] (frame compiles, recompiles included); "
    "coil compiled / eager: counters['coil']['compiled'] and ['eager'] (a graph coil left to run eagerly counts "
    "under eager); Dynamo's recompile limit is raised above the number of shapes, so a static "
    "variant compiles every shape.",
    "compile s: the sum over shapes of (first call at a shape - the steady time at that shape), clipped at 0: "
    "everything a new shape costs, Dynamo's tracing and guards included. Dynamo compile s: Dynamo's own timer of "
    "its frame compiles (`_compile.compile_inner`), the backend's compile inside it.",
    "time ms: batch workloads, the geometric mean over batch sizes of the steady time a call; decoder, the mean "
    "step (model on the whole sequence, argmax, append) over the warm generations. ×eager: the geomean over "
    "shapes of the variant's time / eager's. Ratios count only shapes where both sides matched eager (each call "
    "is checked against eager's output at its shape, after the first call and after the timing; the decoder: each "
    "step's last logits and the generated tokens).",
    "GPU kernels (CUDA, batch workloads): the summed duration of the device's events (kernels, memsets, copies) "
    f"a call, from torch.profiler over {GPU_REPS} calls after the timing (bench/counting.py); their ratios are the "
    "geomean over shapes, as the times'. Where a call's host work outlasts its kernels (small batches), its time "
    "follows the host and moves with the machine's load; the GPU kernels do not.",
]


def run(cfg: Config) -> Writer:
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    target, notes = resolve_target(cfg.target, device)
    size = cfg.size
    names = cfg.only or (*BATCH_WORKLOADS, DECODER)
    start = time.monotonic()
    deadline = start + (cfg.budget_s if cfg.budget_s is not None else math.inf)
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cpus)")
    file_name = cfg.name or (device_file_name(device) + "-dynamic" + ("" if size.name in ("cpu", "gpu") else
                                                                      f"-{size.name}")
                             + ("-" + "-".join(cfg.only) if cfg.only else ""))
    timer = ("CUDA: triton.testing.do_bench (5 ms warm-up, 25 ms of repeats, median), torch.cuda.synchronize around "
             "first calls and decoder steps" if device.type == "cuda" else
             f"CPU: warmed-up wall clock, loops of calls, median of 3 to 21 samples over ~{size.time_s} s a shape")
    batches = ("all of 1..64" if size.batches == tuple(range(1, 65)) else ", ".join(map(str, size.batches)))
    notes = [*notes, *NOTES, f"Timer: {timer}; batch sizes {batches}; decoder: {size.rounds} warm generation(s) "
                             f"after the cold one, a step's time the median over them."]
    if DECODER in names:
        try:
            import transformers  # noqa: F401
        except ImportError:
            names = tuple(n for n in names if n != DECODER)
            notes.append("decoder skipped: transformers is not installed")
    with torch_threads(cfg.threads), tempfile.TemporaryDirectory(prefix="bench-dynamic-") as root, \
            recompile_limit(max(len(size.batches), size.steps) + 16), coil_cache_log() as log:
        run_info = {"suite": "dynamic", "device": device.type, "device_name": device_name, **_versions(),
                    "coil_target": target, "threads": torch.get_num_threads(), "size_preset": size.name,
                    "started": datetime.datetime.now().isoformat(timespec="seconds"),
                    "load_average_start": os.getloadavg(),
                    "command": "python -m bench " + " ".join(cfg.argv)}
        writer = Writer(cfg.out, file_name, run_info, notes)
        caches = Caches(root)
        writer.write()
        for name in names:
            model = build_decoder(size, device) if name == DECODER else None
            if model is not None:
                writer.descriptions[DECODER] = decoder_description(size, model)
            reference: dict[str, Any] = {}
            for variant in cfg.variants:
                if time.monotonic() > deadline:
                    writer.new(workload=name, variant=variant, status="skipped", error="time budget spent")
                    writer.write()
                    continue
                with caches.use(variant, device, target, cfg.threads):
                    if model is None:
                        measure_batches(name, variant, cfg, device, target, log, writer)
                    else:
                        measure_decoder(model, variant, cfg, device, target, log, writer, reference)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            del model, reference
        run_info["elapsed_s"] = time.monotonic() - start
        run_info["load_average_end"] = os.getloadavg()
        writer.write()
    return writer
