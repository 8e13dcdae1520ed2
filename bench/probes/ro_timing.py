"""Device probe: one reduce-overhead training step timed three ways, Inductor and
coil side by side, to tell the host's share from the GPU's.  The models suite
times with triton's do_bench (an L2 flush before each call, CUDA events around
it, no sync between calls), where GPT-2's step in `mode="reduce-overhead"` gave
coil/Inductor 1.21 twice (2026-12-02 and 12-03) while `model_host.py`'s
back-to-back loop gave coil the faster step (1811 against 1944 µs) and coil's
GPU kernels take less time (1.40 against 1.50 ms).  For each model named on the
command line (default gpt2), at the suite's small size in bf16, this prints per
step: do_bench (the suite's `ms`), the back-to-back wall time (the suite's
`wall_ms`: steps back to back, one sync), the host's enqueue time, and one step
alone (synchronised before, CUDA events around it: host and GPU in series); then
coil's CUDA-graph decisions; with PROFILE=1 also where each one's host time goes
(cProfile).  Run from the repository root on a CUDA machine:
`python3 bench/probes/ro_timing.py gpt2` (with BREAKS=1 first the graph breaks
of each model's step and why; after the timings, six steps holding the last loss
as a training loop does, and coil's CUDA-graph decisions)."""
from __future__ import annotations

import gc
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import triton.testing  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402
from bench.probes.common import host_us  # noqa: E402
from bench.timing import back_to_back_s  # noqa: E402


def synced_events_us(fn, n: int = 30) -> float:
    """Each step alone: sync, events around it, sync (no overlap with the last)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return sorted(times)[len(times) // 2]


def graphed_wrappers() -> list:
    """coil's live CUDA-graph wrappers.  isinstance on a dead weak proxy among the
    heap's objects raises ReferenceError: such objects are skipped."""
    from coil.backends.cudagraphs import CudaGraphed

    found = []
    for o in gc.get_objects():
        try:
            if isinstance(o, CudaGraphed):
                found.append(o)
        except ReferenceError:
            continue
    return found


def main() -> None:
    names = sys.argv[1:] or ["gpt2"]
    cuda = torch.device("cuda")
    for name in names:
        before = {id(o) for o in graphed_wrappers()}  # an earlier model's
        calls = {}
        for v in ("inductor", "coil"):
            model, inputs = make_case(name, "train", "cuda", size=SIZES["small"], dtype=torch.bfloat16)
            f = compile_model(v, "reduce-overhead", model, "triton", None)
            call = step_call(f, model, inputs, "train", True)
            for _ in range(5):
                call()
            calls[v] = call
        coil_graphed = [o for o in graphed_wrappers() if id(o) not in before]
        print(f"== {name} train reduce-overhead (us a step)", flush=True)
        for _ in range(2):
            for v, c in calls.items():
                flush = triton.testing.do_bench(c, warmup=25, rep=100, return_mode="median") * 1e3
                print(f"  {v:9s} do_bench {flush:8.1f}  back-to-back {back_to_back_s(c, cuda, 0.2) * 1e6:8.1f}  "
                      f"host {host_us(c, 50):8.1f}  one step alone {synced_events_us(c):8.1f}", flush=True)
        if os.environ.get("PROFILE"):
            host_profile(calls)
        held = None
        for _ in range(6):  # a training loop keeps the last step's loss while the next one runs
            held = calls["coil"]()
        del held
        for g in coil_graphed:
            print(f"  coil {g.kind}: {len(g.recordings)} recordings, off: {g.off}; {g.decisions}", flush=True)


def host_profile(calls: dict, steps: int = 50) -> None:
    """Where each variant's host time goes: cProfile over `steps` steps, the
    functions with the most time of their own."""
    import cProfile
    import pstats

    for v, c in calls.items():
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(steps):
            c()
        torch.cuda.synchronize()
        prof.disable()
        print(f"  -- {v}: host profile over {steps} steps (tottime, per step)", flush=True)
        st = pstats.Stats(prof)
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:25]
        for (file, line, fn), (_cc, nc, tt, ct, _callers) in rows:
            print(f"    {tt / steps * 1e6:8.1f} us own {ct / steps * 1e6:8.1f} us total {nc // steps:5d} calls  "
                  f"{fn} {os.path.basename(file)}:{line}", flush=True)


def break_reasons(name: str) -> None:
    """Where Dynamo breaks the model's training step into several graphs, and why."""
    import torch._dynamo as dynamo

    from bench.models import model_loss

    model, inputs = make_case(name, "train", "cuda", size=SIZES["small"], dtype=torch.bfloat16)
    dynamo.reset()
    expl = dynamo.explain(lambda **kw: model_loss(model(**kw)))(**inputs)
    print(f"== {name}: {expl.graph_count} graphs, {expl.graph_break_count} breaks", flush=True)
    for b in expl.break_reasons[:8]:
        where = str(b.user_stack[-1]).strip().splitlines()[0][:160] if b.user_stack else "?"
        print(f"  {b.reason.strip().splitlines()[0][:200]}  at {where}", flush=True)
    dynamo.reset()


if __name__ == "__main__":
    if os.environ.get("BREAKS"):
        for n in sys.argv[1:]:
            break_reasons(n)
    main()
