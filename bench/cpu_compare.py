"""coil's C++ target against Inductor (torch.compile's default backend, whose CPU
code is C++ too) and eager PyTorch, on this machine, in one run.

For each workload (float32):
- runtime: median wall clock of warmed-up calls, the three interleaved in rounds
  so a noisy neighbour slows all of them alike;
- the coil / Inductor runtime ratio (below 1: coil is faster);
- cold compile: the first call (trace + compile + run) in a fresh subprocess with
  every cache off: Inductor with TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 and a fresh
  TORCHINDUCTOR_CACHE_DIR, coil with a fresh COIL_CACHE_DIR;
- all of it with torch's default thread count and again with one thread: on a
  machine shared with other jobs the one-thread numbers are the stable ones.

coil runs through `torch.compile(fn, backend="coil", options={"target": "cpp"})`
when coil's Dynamo backend is importable, else through make_fx + coil.compile_graph
(the results say which).  Writes bench/results/cpu-compare.md and .json.

    python bench/cpu_compare.py [--only NAME ...] [--rounds N] [--no-cold] [--threads 0 1]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


# ---- workloads -------------------------------------------------------------------------------------


def seed(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return ((a + b) * c.relu()).sum(dim=-1)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w, b)


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def gelu_bias_residual(x: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b) + r


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target)


def add_transposed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y.t()


@dataclass(frozen=True)
class Workload:
    name: str
    fn: Callable[..., Any]
    shapes: str
    make: Callable[[torch.Generator], tuple[torch.Tensor, ...]]


def _randn(*shape: int) -> Callable[[torch.Generator], torch.Tensor]:
    return lambda g: torch.randn(*shape, generator=g)


WORKLOADS = (
    Workload("seed ((a+b)*relu(c)).sum(-1)", seed, "3 x (4096, 1024)",
             lambda g: tuple(torch.randn(4096, 1024, generator=g) for _ in range(3))),
    Workload("softmax(x, -1)", softmax, "(4096, 1024)", lambda g: (torch.randn(4096, 1024, generator=g),)),
    Workload("layer_norm", layer_norm, "(4096, 1024), w, b (1024,)",
             lambda g: (torch.randn(4096, 1024, generator=g), torch.randn(1024, generator=g),
                        torch.randn(1024, generator=g))),
    Workload("RMSNorm", rms_norm, "(4096, 1024), w (1024,)",
             lambda g: (torch.randn(4096, 1024, generator=g), torch.randn(1024, generator=g))),
    Workload("gelu(x + b) + r", gelu_bias_residual, "(4096, 1024), b (1024,), r",
             lambda g: (torch.randn(4096, 1024, generator=g), torch.randn(1024, generator=g),
                        torch.randn(4096, 1024, generator=g))),
    Workload("cross_entropy", cross_entropy, "logits (1024, 8000), int64 targets",
             lambda g: (torch.randn(1024, 8000, generator=g), torch.randint(0, 8000, (1024,), generator=g))),
    Workload("x + y.t()", add_transposed, "(2048, 2048) + (2048, 2048).t()",
             lambda g: (torch.randn(2048, 2048, generator=g), torch.randn(2048, 2048, generator=g))),
)


def workload(name: str) -> Workload:
    for w in WORKLOADS:
        if w.name == name:
            return w
    raise SystemExit(f"no workload {name!r}; known: {[w.name for w in WORKLOADS]}")


# ---- compiling ------------------------------------------------------------------------------------


def has_coil_dynamo() -> bool:
    try:
        from coil.backends import dynamo  # noqa: F401
    except ImportError:
        return False
    return True


def coil_compiled(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """coil's cpp target, through torch.compile when coil's Dynamo backend exists."""
    import coil

    if has_coil_dynamo():
        return torch.compile(fn, backend="coil", options={"target": "cpp"})
    from coil.passes.lowerings import DECOMPOSITIONS
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, decomposition_table=DECOMPOSITIONS)(*inputs)
    compiled = coil.compile_graph(gm, list(inputs), coil.Options(target="cpp"))
    return lambda *args: compiled(*args)


def compiled_for(backend: str, fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    if backend == "eager":
        return fn
    if backend == "inductor":
        return torch.compile(fn)
    return coil_compiled(fn, inputs)


BACKENDS = ("eager", "inductor", "coil")


# ---- measuring ------------------------------------------------------------------------------------


def time_calls(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    return (time.perf_counter() - t0) / calls


def calls_per_sample(fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> int:
    """Enough calls for a ~20 ms sample, so timer resolution does not matter."""
    one = max(time_calls(fn, inputs, 3), 1e-6)
    return max(1, min(200, int(0.02 / one)))


def runtimes(w: Workload, rounds: int) -> dict[str, tuple[float, float]]:
    """(median, best) seconds per call of each backend, measured in interleaved
    rounds: on a shared machine the median says what a user sees, the best what
    the code does when no other process takes a core."""
    inputs = w.make(torch.Generator().manual_seed(0))
    fns = {b: compiled_for(b, w.fn, inputs) for b in BACKENDS}
    expected = w.fn(*inputs)
    for b, fn in fns.items():
        for _ in range(3):  # compile and warm up
            out = fn(*inputs)
        got = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=f"{w.name}: {b} disagrees with eager")
    calls = {b: calls_per_sample(fn, inputs) for b, fn in fns.items()}
    samples: dict[str, list[float]] = {b: [] for b in fns}
    for _ in range(rounds):
        for b, fn in fns.items():
            samples[b].append(time_calls(fn, inputs, calls[b]))
    return {b: (statistics.median(s), min(s)) for b, s in samples.items()}


def cold_compile(w: Workload, backend: str, threads: int) -> float:
    """First-call seconds in a fresh process with every compile cache off."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if backend == "inductor":
            env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
        else:
            env["COIL_CACHE_DIR"] = os.path.join(tmp, "coil")
        cmd = [sys.executable, os.path.abspath(__file__), "--cold-child", backend, "--only", w.name,
               "--threads", str(threads)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"cold compile of {w.name} with {backend} failed:\n{proc.stderr[-3000:]}")
        return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def cold_child(backend: str, name: str) -> None:
    """In the fresh process: time the first call, which traces and compiles."""
    w = workload(name)
    inputs = w.make(torch.Generator().manual_seed(0))
    # imports are not compile time, for either backend
    importlib.import_module("coil")
    importlib.import_module("torch._inductor.compile_fx")

    t0 = time.perf_counter()
    compiled_for(backend, w.fn, inputs)(*inputs)
    print(json.dumps({"seconds": time.perf_counter() - t0}))


# ---- reporting -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "load_average_1min": round(load, 2)}


def markdown(tables: dict[int, list[dict[str, Any]]], meta: dict[str, Any]) -> str:
    via = ("torch.compile(fn, backend=\"coil\", options={\"target\": \"cpp\"})" if meta["coil_via_dynamo"]
           else "make_fx + coil.compile_graph (coil's Dynamo backend was not importable)")
    m = meta["machine"]
    lines = [
        "# coil C++ target vs Inductor vs eager (CPU, float32)",
        "",
        (f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}; 1-min load average "
         f"{m['load_average_1min']} at the start, {meta['load_average_1min_at_end']} at the end "
         "(other jobs share this machine: a parallel region whose thread loses its core waits a "
         "scheduler tick, so with every core in use the medians are noisy; the one-thread table is the stable one)."),
        (f"coil ran through {via}.  Runtime: median (best) of {meta['rounds']} interleaved rounds of "
         "warmed-up calls, in ms; the ratio columns divide coil's by Inductor's.  Cold compile: the first call "
         "in a fresh process with caches off (Inductor: TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 + fresh "
         "TORCHINDUCTOR_CACHE_DIR; coil: fresh COIL_CACHE_DIR)."),
    ]
    for threads, rows in tables.items():
        lines += [
            "",
            f"## {threads} thread{'s' if threads != 1 else ''} (torch and OpenMP)",
            "",
            ("| workload | shapes | eager ms | Inductor ms | coil ms | coil / Inductor median | (best) "
             "| cold compile Inductor s | cold compile coil s | coil / Inductor compile |"),
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            cold_i, cold_c = r.get("cold_inductor_s"), r.get("cold_coil_s")
            cold = f"{cold_i:.2f} | {cold_c:.2f} | {cold_c / cold_i:.2f}" if cold_i and cold_c else "- | - | -"
            times = " | ".join(f"{r[f'{b}_ms']:.3f} ({r[f'{b}_best_ms']:.3f})" for b in BACKENDS)
            lines.append(f"| {r['workload']} | {r['shapes']} | {times} | {r['ratio']:.2f} | {r['ratio_best']:.2f} "
                         f"| {cold} |")
    return "\n".join(lines) + "\n"


def measure(chosen: Sequence[Workload], rounds: int, threads: int, cold: bool) -> list[dict[str, Any]]:
    """One table: every workload with `threads` threads (0: torch's default)."""
    default = torch.get_num_threads()
    # coil's kernels share torch's OpenMP runtime, so this sets their team size too;
    # Inductor bakes the count into its kernels, hence the fresh Dynamo caches
    torch.set_num_threads(threads or default)
    torch._dynamo.reset()
    rows = []
    for w in chosen:
        t = runtimes(w, rounds)
        row: dict[str, Any] = {"workload": w.name, "shapes": w.shapes, "threads": torch.get_num_threads()}
        for b in BACKENDS:
            row[f"{b}_ms"], row[f"{b}_best_ms"] = t[b][0] * 1e3, t[b][1] * 1e3
        row["ratio"] = t["coil"][0] / t["inductor"][0]
        row["ratio_best"] = t["coil"][1] / t["inductor"][1]
        if cold:
            row["cold_inductor_s"] = cold_compile(w, "inductor", threads)
            row["cold_coil_s"] = cold_compile(w, "coil", threads)
        rows.append(row)
        print(json.dumps(row), flush=True)
    torch.set_num_threads(default)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="workload names")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold compile subprocesses")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--threads", type=int, nargs="+", default=[0, 1],
                    help="thread counts to measure, one table each (0: torch's default); "
                         "cold compiles run with the first")
    ap.add_argument("--cold-child", choices=("inductor", "coil"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cold_child:
        if args.threads[0] > 0:
            torch.set_num_threads(args.threads[0])
        cold_child(args.cold_child, args.only[0])
        return
    chosen = [workload(n) for n in args.only] if args.only else list(WORKLOADS)
    meta: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "coil_via_dynamo": has_coil_dynamo()}
    tables: dict[int, list[dict[str, Any]]] = {}
    for i, threads in enumerate(args.threads):
        rows = measure(chosen, args.rounds, threads, cold=i == 0 and not args.no_cold)
        tables[rows[0]["threads"] if rows else threads] = rows
    meta["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu-compare.json"), "w") as f:
        json.dump({"meta": meta, "tables": {str(k): v for k, v in tables.items()}}, f, indent=2)
    with open(os.path.join(args.out, "cpu-compare.md"), "w") as f:
        f.write(markdown(tables, meta))
    print(markdown(tables, meta))


if __name__ == "__main__":
    main()
