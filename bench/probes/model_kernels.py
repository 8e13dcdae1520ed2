"""Device probe: a real model's step kernel by kernel, Inductor against coil.  For
each model named on the command line (bench/hf_models.py names; default llama) and
the mode in $MODE (train, the default, or infer), at the models suite's size in
$SIZE (small, the default, or large) in bf16, compiled in $COMPILE_MODE (default, or reduce-overhead for both):
each compiler's kernels by total GPU time a step (the profiler), and a table of the
kernel families (matmul, attention, Triton pointwise/reduction, other) so the gap
shows by family.  Both compilers' generated sources are written to
$OUT/<model>-<mode>-<compiler>-<n>.py and every kernel's row to
$OUT/<model>-<mode>-<compiler>-kernels.txt, so the slow kernels can be read
afterwards.  $VARIANTS (default inductor,coil) picks the compilers.  Run from the
repository root on a CUDA machine."""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402
from bench.probes.common import OUT, kernels_per_step  # noqa: E402
from bench.variants import Capture, first_call, make_callable  # noqa: E402


def family(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "cutlass", "sm90", "xmma", "cublas", "matmul")):
        return "matmul"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if n.startswith("triton") or n.startswith("coil") or "_kernel" in n:
        return "triton"
    return "other"


def main():
    mode = os.environ.get("MODE", "train")
    size = SIZES[os.environ.get("SIZE", "small")]
    for name in sys.argv[1:] or ["llama"]:
        fams = {}
        for v in os.environ.get("VARIANTS", "inductor,coil").split(","):
            torch._dynamo.reset()
            model, inputs = make_case(name, mode, "cuda", size=size, dtype=torch.bfloat16)
            graphs = os.environ.get("COMPILE_MODE", "default") == "reduce-overhead"
            if graphs:
                f = compile_model(v, "reduce-overhead", model, "triton", None)
            else:
                f = make_callable(v, model, "triton")
            step = step_call(f, model, inputs, mode, graphs)
            cap = Capture()
            first_call(v, step, cap)
            sources = cap.inductor_code if v == "inductor" else [g.source for g in cap.coil_graphs if g is not None]
            for i, s in enumerate(sources):
                with open(os.path.join(OUT, f"{name}-{mode}-{v}-{i}.py"), "w") as fh:
                    fh.write(s)
            rows = kernels_per_step(step)
            with open(os.path.join(OUT, f"{name}-{mode}-{v}-kernels.txt"), "w") as fh:
                fh.writelines(f"{us:10.2f} {n:4d} {k}\n" for k, n, us in rows)
            total = sum(r[2] for r in rows)
            print(f"== {name} {mode} {v}: kernels {total:.0f} us a step, {sum(r[1] for r in rows)} launches",
                  flush=True)
            for k, n, us in rows[:40]:
                print(f"   {us:8.1f} us  x{n:<3d} {k[:110]}", flush=True)
            fam = {}
            for k, n, us in rows:
                c, t = fam.get(family(k), (0, 0.0))
                fam[family(k)] = (c + n, t + us)
            fams[v] = fam
        if len(fams) < 2:
            continue
        print(f"== {name} {mode} by family: launches and us, inductor / coil", flush=True)
        for k in sorted(set(fams["inductor"]) | set(fams["coil"])):
            a, b = fams["inductor"].get(k, (0, 0.0)), fams["coil"].get(k, (0, 0.0))
            print(f"   {k:10s} {a[0]:4d} / {b[0]:4d}   {a[1]:8.1f} / {b[1]:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
