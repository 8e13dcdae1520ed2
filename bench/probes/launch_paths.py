"""Device probe: which path each of coil's Triton launches takes in a real model's
step, and where the host's time goes, by whose code it is.  For each model named on
the command line (bench/hf_models.py names; default t5 vit gpt2), at the models
suite's `small` size in bf16 and in $MODE (train, the default, or infer):

- coil's launches in one step, by path: bound (one call of Triton's compiled
  launcher), or through Triton's JITFunction (`_slow`), and of those how many were
  sent there because the call's stream was None (a graph input not 16-byte aligned)
  and how many by their Launcher's rule (not bound: an extern's alias, ...);
- which graph inputs were not aligned, by graph;
- host time a step (enqueue only) for Inductor and coil, and a cProfile of 20 steps
  of each grouped by whose code the time is spent in (the generated wrapper, coil's
  runtime, Triton, Inductor's runtime, Dynamo, AOTAutograd, autograd, the model,
  torch's C functions).

Run from the repository root on a CUDA machine: `MODE=train python3
bench/probes/launch_paths.py t5 vit`; TOP=N adds the N functions with
the most own time a step to each profile."""
from __future__ import annotations

import collections
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402
from bench.probes.common import host_us  # noqa: E402
from bench.variants import Capture, record_coil_graphs  # noqa: E402
from coil.backends.triton import runtime as rt  # noqa: E402

GROUPS = (  # (label, a piece of the file name); the first match wins
    ("wrapper (output_code)", "coil-"), ("wrapper (output_code)", "output_code"),
    ("coil runtime", "/coil/"), ("coil runtime", "/backends/"),
    ("triton", "/triton/"),
    ("inductor runtime", "_inductor"),
    ("dynamo", "_dynamo"),
    ("aot_autograd", "_functorch"),
    ("autograd", "autograd"),
    ("transformers (model)", "transformers"),
    ("torch other", "/torch/"),
)


def group_of(filename: str) -> str:
    if filename.startswith("~") or filename == "<built-in>":
        return "C functions"
    for label, piece in GROUPS:
        if piece in filename:
            return label
    return "other: " + filename.rsplit("/", 1)[-1][:40]


def grouped_profile(call, steps: int = 20, top: int = 0) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Own time a step by group, the largest first, and the `top` functions with
    the most own time a step (each named by group, file, line and function)."""
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        call()
    pr.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(pr).stats  # type: ignore[attr-defined]
    by: collections.Counter[str] = collections.Counter()
    fns: collections.Counter[str] = collections.Counter()
    for (filename, line, fn), (_cc, nc, tt, _ct, _callers) in stats.items():
        by[group_of(filename)] += tt / steps * 1e6
        fns[f"[{group_of(filename)}] {os.path.basename(filename)}:{line} {fn} ({nc // steps} calls)"] += tt / steps * 1e6
    return by.most_common(14), fns.most_common(top)


def launch_paths(call) -> dict[str, collections.Counter[str]]:
    """One step of `call` with coil's launchers counted by path."""
    counts: dict[str, collections.Counter[str]] = {"bound": collections.Counter(), "slow": collections.Counter()}
    real = {cls: (cls.__call__, cls._slow) for cls in (rt.Launcher, rt.SizedLauncher)}

    def counted(cls):
        call_, slow_ = real[cls]

        def enter(self, stream, *rest):
            counts["bound"]["all launches"] += 1
            return call_(self, stream, *rest)

        def slow(self, stream, *rest):
            why = "stream None (an input not aligned)" if stream is None else self.rule
            counts["slow"][why[:110]] += 1
            return slow_(self, stream, *rest)

        return enter, slow

    for cls in real:
        cls.__call__, cls._slow = counted(cls)  # type: ignore[method-assign]
    try:
        call()
        torch.cuda.synchronize()
    finally:
        for cls, (c, s) in real.items():
            cls.__call__, cls._slow = c, s  # type: ignore[method-assign]
    return counts


def unaligned_inputs(graphs, seen: list[list[int]]) -> list[str]:
    out = []
    for n, (g, ptrs) in enumerate(zip(graphs, seen)):
        # the call's arguments are the inputs, then the graph's tensor constants
        bad = [g.input_names[i] if i < len(g.input_names) else f"constant {i - len(g.input_names)}"
               for i, p in enumerate(ptrs) if p is not None and p % 16]
        if bad:
            out.append(f"graph {n}: {len(bad)} of {len(ptrs)} inputs not 16-byte aligned: {bad[:8]}")
    return out


def main() -> None:
    names = sys.argv[1:] or ["t5", "vit", "gpt2"]
    mode = os.environ.get("MODE", "train")
    for name in names:
        calls = {}
        graphs: list = []
        for v in ("inductor", "coil"):
            torch._dynamo.reset()
            model, inputs = make_case(name, mode, "cuda", size=SIZES["small"], dtype=torch.bfloat16)
            f = compile_model(v, "default", model, "triton", None)
            call = step_call(f, model, inputs, mode, False)
            cap = Capture()
            with record_coil_graphs(cap):
                call()
            for _ in range(3):
                call()
            calls[v] = call
            if v == "coil":
                graphs = [g for g in cap.coil_graphs if g is not None]
        print(f"== {name} {mode}: coil compiled {len(graphs)} graphs", flush=True)
        # the inputs each graph is called with, by wrapping its call for one step
        seen: list[list[int]] = [[] for _ in graphs]
        originals = []
        for n, g in enumerate(graphs):
            originals.append(g._call)

            def spy(args, _n=n, _real=g._call):
                seen[_n] = [a.data_ptr() if isinstance(a, torch.Tensor) and a.is_cuda else None for a in args]
                return _real(args)

            g._call = spy
        counts = launch_paths(calls["coil"])
        for g, o in zip(graphs, originals):
            g._call = o
        print(f"   launches a step: {counts['bound']['all launches']}, through Triton's JITFunction: "
              f"{sum(counts['slow'].values())}", flush=True)
        for why, n in counts["slow"].most_common(6):
            print(f"     {n:4d}  {why}", flush=True)
        for line in unaligned_inputs(graphs, seen):
            print("   " + line, flush=True)
        rules = collections.Counter(getattr(obj, "rule", "?")[:90] for g in graphs for obj in g.namespace.values()
                                    if isinstance(obj, (rt.Launcher, rt.SizedLauncher)))
        for rule, n in rules.most_common(5):
            print(f"   launchers {n:4d}: {rule}", flush=True)
        for _ in range(2):
            print("   host us a step: " + ", ".join(f"{v} {host_us(c, 50):.0f}" for v, c in calls.items()), flush=True)
        for v, c in calls.items():
            print(f"   cProfile of {v}, own time a step (us, profiled):", flush=True)
            groups, fns = grouped_profile(c, top=int(os.environ.get("TOP", "0")))
            for label, us in groups:
                print(f"     {us:9.1f}  {label}", flush=True)
            for label, us in fns:
                print(f"       {us:9.1f}  {label}", flush=True)


if __name__ == "__main__":
    main()
