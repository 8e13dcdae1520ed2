"""Device probe: where a warm compile's time goes, coil against Inductor.  For each
model named on the command line (bench/hf_models.py names; default distilbert,
t5), at $SIZE (default `small`; `cpu` on a machine without CUDA) in $MODE (train,
the default, or infer): a first process compiles each compiler's variant cold into
fresh caches, then a second process compiles it again, warm, from those caches.
Each process prints its first call (compile and one step) split at the points
both compilers pass through: the backend call Dynamo makes (Inductor's
compile_fx, coil_backend: AOTAutograd and the graphs' compiles inside), and
within coil's, AOTAutograd's tracing against coil's compile_graph (graph-cache
load or the passes) and load_module (the kernels' loading: Triton's JITFunction
path for every kernel, through precompile).  With PROFILE=1 the warm process
prints a cProfile of the first call by cumulative time; with PROFILE_OUT=DIR too it
writes the whole profile to DIR/{model}-{mode}-{variant}.prof instead.  VARIANTS=coil (or
inductor) runs one compiler only; COMPILE_MODE=reduce-overhead compiles in that mode
(the default: default).  Run from the repository root."""
import os
import subprocess
import sys
import tempfile

CODE = r'''
import os, sys, time, cProfile, pstats
sys.path.insert(0, os.getcwd())
import torch
import torch._dynamo.output_graph as og
from torch._dynamo.utils import counters
from bench.hf_models import SIZES, CHECK_STEPS, make_case
from bench.models import compile_model

name, variant, size, mode, label = sys.argv[1:6]
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
model, inputs = make_case(name, mode, device, size=SIZES[size], dtype=dtype)
spent = {"backend": 0.0, "compile_graph": 0.0, "load_module": 0.0, "inside": 0.0}
depth = [0]

def clock(obj, attr, key):
    real = getattr(obj, attr)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t
    setattr(obj, attr, timed)

real_backend = og.OutputGraph._call_user_compiler
def backend(*a, **k):
    t = time.perf_counter()
    depth[0] += 1
    try:
        return real_backend(*a, **k)
    finally:
        depth[0] -= 1
        spent["backend"] += time.perf_counter() - t
og.OutputGraph._call_user_compiler = backend
if variant == "coil":
    import coil
    import coil.backends.runtime as rt
    import coil.backends.dynamo as dyn
    real_compile = coil.compile_graph
    # compile_graph's own time, less the load_module inside it
    clock(rt, "load_module", "load_module")
    def compile_graph(*a, **k):
        t = time.perf_counter()
        inner = spent["load_module"]
        try:
            return real_compile(*a, **k)
        finally:
            took = time.perf_counter() - t
            spent["compile_graph"] += took - (spent["load_module"] - inner)
            if depth[0]:  # the forward's, inside the backend call; the backward compiles at the first backward
                spent["inside"] += took
    coil.compile_graph = compile_graph
target = "triton" if device == "cuda" else "cpp"
f = compile_model(variant, os.environ.get("COMPILE_MODE", "default"), model, target, None)
prof = cProfile.Profile() if os.environ.get("PROFILE") and label == "warm" else None
if device == "cuda":
    torch.cuda.synchronize()
t0 = time.perf_counter()
if prof:
    prof.enable()
CHECK_STEPS[mode](f, inputs)
if device == "cuda":
    torch.cuda.synchronize()
if prof:
    prof.disable()
total = time.perf_counter() - t0
parts = f"backend {spent['backend']:.2f} s"
if variant == "coil":
    aot = spent["backend"] - spent["inside"]
    parts += (f" (AOTAutograd and the rest {aot:.2f}); every graph's compile_graph {spent['compile_graph']:.2f}, "
              f"load_module {spent['load_module']:.2f} (the backward's at the first backward, outside the backend); "
              f"graphs loaded through AOTAutograd's cache: {counters['coil']['aot_cache_hits']}")
print(f"{name:12s} {mode} {variant:8s} {label}: first call {total:.2f} s; {parts}; "
      f"outside the backend {total - spent['backend']:.2f} s", flush=True)
if prof and os.environ.get("PROFILE_OUT"):  # the whole profile, for pstats elsewhere
    prof.dump_stats(os.path.join(os.environ["PROFILE_OUT"], f"{name}-{mode}-{variant}.prof"))
elif prof:
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
'''


def main() -> None:
    names = sys.argv[1:] or ["distilbert", "t5"]
    size = os.environ.get("SIZE", "small")
    mode = os.environ.get("MODE", "train")
    for name in names:
        for variant in os.environ.get("VARIANTS", "inductor,coil").split(","):
            root = tempfile.mkdtemp(prefix="warm-compile-")
            env = dict(os.environ, **{n: os.path.join(root, n.lower()) for n in
                                      ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "COIL_CACHE_DIR")})
            for label in ("cold", "warm"):
                subprocess.run([sys.executable, "-c", CODE, name, variant, size, mode, label], env=env, check=False)


if __name__ == "__main__":
    main()
