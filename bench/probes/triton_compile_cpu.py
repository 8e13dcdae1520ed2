"""Probe: how long Triton takes to compile a real model's coil kernels for the H200
(sm_90), on this machine, without a GPU: each kernel launch's function with its
argument types, constexprs and warps, through triton.compile for a CUDA target, one
thread per core as runtime.precompile does.  Once with every kernel its own
function (as before codegen.shared_kernels) and once with the kernels whose source
repeats another's compiled as that one, each run in a fresh Triton cache.  For each
model named on the command line (bench/hf_models.py names; default llama), in
$MODE (train, the default, or infer), at $SIZE (default small) in bf16."""
import os
import sys
import tempfile
import time
import types
import warnings
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
os.environ["TRITON_INTERPRET"] = "0"
import torch  # noqa: E402

import coil  # noqa: E402
from bench.probes.common import aot_graphs  # noqa: E402
from coil.backends.triton.codegen import shared_kernels  # noqa: E402
from coil.ir.wrapper import KernelCall  # noqa: E402

TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
         torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1", torch.float64: "fp64"}


def compile_jobs(compiled, share: bool) -> list:
    """(function, signature, constexprs, warps) of each distinct launch."""
    module = compiled.module
    ns = types.ModuleType("probe_kernels")
    path = os.path.join(tempfile.mkdtemp(), "probe_kernels.py")
    with open(path, "w") as fh:
        fh.write(module.source)
    ns.__file__ = path
    exec(compile(module.source, path, "exec"), ns.__dict__)
    shared = shared_kernels(module.kernels)
    if not share:  # every kernel its own function again, defined from its own source
        for k in module.kernels:
            if k.name in shared:
                own = os.path.join(tempfile.mkdtemp(), f"{k.name}.py")
                with open(own, "w") as fh:
                    fh.write(k.source)
                exec(compile(k.source, own, "exec"), ns.__dict__)
        shared = {}
    program = module.program
    jobs = {}
    for ln in program.lines:
        if not isinstance(ln, KernelCall):
            continue
        k = program.spec(ln.kernel)
        for launch in k.launches:
            fn = getattr(ns, shared.get(launch.function, launch.function))
            names = fn.arg_names
            dtypes = [program.layout(a).dtype for a in ln.args]
            meta = launch.config.meta()
            ws = [dt for _, dt in getattr(k.space, "workspaces", ())]  # a split's partial results
            sig = {}
            for i, n in enumerate(names):
                if i < len(dtypes):
                    sig[n] = "*" + TYPES[dtypes[i]]
                elif n.startswith("ws_ptr"):
                    sig[n] = "*" + TYPES[ws[int(n[len("ws_ptr"):])]]
                elif n in meta:
                    sig[n] = "constexpr"
                else:
                    sig[n] = "i64" if k.wide_index else "i32"
            key = (id(fn), tuple(sig.items()), tuple(meta.items()), launch.config.num_warps)
            jobs[key] = (fn, sig, dict(meta), launch.config.num_warps)
    return list(jobs.values())


def run(jobs: list) -> float:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    triton.knobs.cache.dir = tempfile.mkdtemp()
    target = GPUTarget("cuda", 90, 32)

    def one(job):
        fn, sig, meta, warps = job
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=meta), target=target,
                       options={"num_warps": warps})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        list(pool.map(one, jobs))
    return time.perf_counter() - t0


def main() -> None:
    warnings.filterwarnings("ignore")
    mode, size = os.environ.get("MODE", "train"), os.environ.get("SIZE", "small")
    for name in sys.argv[1:] or ["llama"]:
        compiled = [coil.compile_graph(gm, inputs, coil.Options(target="triton", graph_cache=False))
                    for gm, inputs in aot_graphs(name, mode, size, torch.bfloat16)]
        for share in (False, True):
            jobs = [j for c in compiled for j in compile_jobs(c, share)]
            print(f"{name:12s} {mode} {size}: {'shared' if share else 'one function a kernel'}: "
                  f"{len(jobs)} compiles for sm_90 in {run(jobs):.1f} s", flush=True)


if __name__ == "__main__":
    main()
