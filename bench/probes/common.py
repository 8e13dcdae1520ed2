"""What the device probes share: triton's do_bench in microseconds, coil compiled
straight from a workload, Inductor's and coil's compiled calls side by side and the
configs Inductor's autotuner picked, a variant of a compiled module from edited source, edits
of output_code.py's launch configs, interleaved timing rounds, host time per call.
Probes run from the repository root on a CUDA machine."""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.getcwd())

import attrs  # noqa: E402
import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import coil  # noqa: E402
from coil.backends.runtime import load_module  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")  # where a probe writes files (the device tool's $OUT)


def bench_us(fn: Callable[[], Any]) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3


def compile_coil(inst: Any, **options: Any) -> Any:
    """coil's CompiledFn for a bench workload instance (graph cache off)."""
    gm = make_fx(inst.fn)(*inst.inputs)
    return coil.compile_graph(gm, list(inst.inputs), coil.Options(target="triton", graph_cache=False, **options))


def inductor_configs() -> list[tuple[str, list[str]]]:
    """The config each live Inductor autotuner launched with, by kernel name."""
    import gc

    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    out = []
    for o in gc.get_objects():
        try:
            if isinstance(o, CachingAutotuner):
                out.append((o.fn.__name__, [str(launcher.config) for launcher in o.launchers]))
        except ReferenceError:  # a dead weak proxy
            pass
    return out


def inductor_and_coil(inst: Any) -> dict[str, Callable[[], Any]]:
    """A workload instance compiled by Inductor and by coil, each called once, as
    calls of the instance's inputs giving the first output."""
    ind = torch.compile(inst.fn)
    ind(*inst.inputs)
    c = compile_coil(inst)
    return {"inductor": lambda: ind(*inst.inputs), "coil": lambda: c(*inst.inputs)[0]}


def workload_steps(suite: str, name: str, variants: tuple[str, ...]) -> dict[str, Callable[[], Any]]:
    """A bench workload's step (its call, or forward+backward) compiled by each
    variant on CUDA, each called once.  Dynamo is reset once: it keeps one cache
    entry per backend, so the compiled steps stay callable side by side."""
    from bench.suites import find_workload
    from bench.variants import make_callable

    wl = find_workload(suite, name)
    steps: dict[str, Callable[[], Any]] = {}
    torch._dynamo.reset()
    for v in variants:
        inst = wl.build(torch.device("cuda"))
        f = make_callable(v, inst.fn, "triton")
        steps[v] = lambda f=f, inst=inst: inst.step(f, inst.inputs)
        steps[v]()
    return steps


def variant(compiled: Any, source: str) -> Any:
    """The same compiled module with its output_code.py replaced by `source`."""
    return load_module(attrs.evolve(compiled.module, source=source))


def with_config(source: str, kind: str, cfg: tuple[int, ...]) -> str:
    """Every launch line of one kind rewritten to another config: pointwise and
    persistent (XBLOCK, warps), tiled (YBLOCK, XBLOCK, warps)."""
    if kind == "tiled":
        yb, xb, w = cfg
        source = re.sub(r"\[grid2\((\d+), (\d+), \d+, \d+\)\]", rf"[grid2(\1, \2, {yb}, {xb})]", source)
        return re.sub(r"YBLOCK=\d+, XBLOCK=\d+, num_warps=\d+", f"YBLOCK={yb}, XBLOCK={xb}, num_warps={w}", source)
    xb, w = cfg
    source = re.sub(r"\[grid\((\d+), \d+\)\]", rf"[grid(\1, {xb})]", source)
    if kind == "persistent":
        return re.sub(r"XBLOCK=\d+, RBLOCK=(\d+), num_warps=\d+", rf"XBLOCK={xb}, RBLOCK=\1, num_warps={w}", source)
    return re.sub(r"XBLOCK=\d+, num_warps=\d+", f"XBLOCK={xb}, num_warps={w}", source)


def timed_rounds(name: str, fns: dict[str, Callable[[], Any]], rounds: int, base: str = "inductor") -> dict[str, float]:
    """Time every function once per round, round after round (so drift hits all
    alike); print each one's median, its ratio to `base` and its spread."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(bench_us(f))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"== {name}", flush=True)
    for k, v in times.items():
        print(f"  {k:30s} median {med[k]:8.2f} us  ratio {med[k] / med[base]:.4f}  min {min(v):.2f} max {max(v):.2f}",
              flush=True)
    return med


def host_us(fn: Callable[[], Any], n: int = 200) -> float:
    """Host time per call: how long enqueueing takes, the GPU left to catch up."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    per_call = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return per_call


def against_variants(name: str, inst: Any, edits: dict[str, Callable[[str], str]], rounds: int,
                     rtol: float = 2e-2, atol: float = 2e-2) -> Any:
    """Inductor, coil, and coil's module with each edit of its source applied, all
    checked against eager and then timed in interleaved rounds; an edit that changes
    nothing is reported and skipped.  Returns coil's compiled function."""
    ref = inst.fn(*inst.inputs)
    ind = torch.compile(inst.fn)
    ind(*inst.inputs)
    c = compile_coil(inst)
    torch.testing.assert_close(c(*inst.inputs)[0], ref, rtol=rtol, atol=atol)
    fns = {"inductor": lambda: ind(*inst.inputs), "coil": lambda: c(*inst.inputs)}
    for label, edit in edits.items():
        source = edit(c.module.source)
        if source == c.module.source:
            print(f"  {label}: nothing to change in coil's kernel", flush=True)
            continue
        v = variant(c, source)
        torch.testing.assert_close(v(*inst.inputs)[0], ref, rtol=rtol, atol=atol)
        fns[label] = lambda v=v: v(*inst.inputs)
    timed_rounds(name, fns, rounds)
    torch._dynamo.reset()
    return c


def kernels_per_step(step: Callable[[], Any], steps: int = 10) -> list[tuple[str, int, float]]:
    """(kernel, launches a step, µs a step) of every CUDA kernel `step` runs, by
    total time, from the profiler over `steps` steps after three warm-up ones."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [(e.key, e.count // steps, e.device_time_total / steps) for e in p.key_averages()
            if e.device_type.name == "CUDA" and e.count]
    rows.sort(key=lambda r: -r[2])
    return rows


def aot_graphs(name: str, mode: str, size: str = "cpu", dtype: torch.dtype = torch.float32
               ) -> list[tuple[torch.fx.GraphModule, list[Any]]]:
    """The graphs AOTAutograd hands a backend for a bench/hf_models.py model at
    `size` in `dtype` on the CPU (forward and backward in `train`, the inference
    graphs in `infer`), each with its example inputs; nothing compiled (the CPU
    probes)."""
    from torch._dynamo.backends.common import aot_autograd

    from bench.hf_models import SIZES, make_case

    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def capture(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        graphs.append((gm, list(inputs)))
        return gm.forward

    model, inputs = make_case(name, mode, "cpu", size=SIZES[size], dtype=dtype)
    f = torch.compile(model, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture))
    if mode == "train":
        f(**inputs).loss.backward()
    else:
        with torch.no_grad():
            f(**inputs)
    torch._dynamo.reset()
    return graphs
