"""Device probe: silu*mul and gelu with coil's committed kernels against text
variants (launch configs, the cast at the store, Inductor's form of the math) and
Inductor, interleaved rounds; then a 256-step chain (graph_2000's kernels): compile
time, GPU time and host time per call for two fusion-size limits."""
import os, re, sys, time
sys.path.insert(0, os.getcwd())
import torch
from bench import workloads as W
from bench.probes.common import against_variants, bench_us, compile_coil, host_us, with_config

dev = torch.device("cuda")
ROUNDS = int(os.environ.get("ROUNDS", "9"))


def cfg(xb, w):
    return lambda src: with_config(src, "pointwise", (xb, w))


def store_f32(src):  # the store casts, as in Inductor's kernel
    return re.sub(r"(tmp\d+) = _coil_to_bf16\((tmp\d+)\)", r"\1 = \2", src)


def inductor_math(src):
    return re.sub(r"tl\.sigmoid\((tmp\d+)\)", r"(1.0 / (1.0 + libdevice.exp(-\1)))", src)


def run(name, w, variants):
    against_variants(name, w.build(dev), variants, ROUNDS)


t0 = time.time()
run("silu", W.silu_mul(32768, 8192, torch.bfloat16), {
    "512/2": cfg(512, 2), "1024/2": cfg(1024, 2), "256/1": cfg(256, 1),
    "store casts": store_f32, "inductor math": inductor_math,
})
run("gelu", W.gelu_bias_residual(32768, 4096, torch.bfloat16), {"512/2": cfg(512, 2), "1024/2": cfg(1024, 2)})
print(f"pointwise {time.time() - t0:.0f} s", flush=True)

W.CHAIN_STEPS = 256
inst = W.chain(1024, 1024).build(dev)
ref = inst.fn(*inst.inputs)
for mfs in (64, 128):
    t1 = time.perf_counter()
    c = compile_coil(inst, max_fusion_size=mfs)
    c(*inst.inputs)
    torch.cuda.synchronize()
    comp = time.perf_counter() - t1
    torch.testing.assert_close(c(*inst.inputs)[0], ref, rtol=1e-3, atol=1e-3)
    f = lambda: c(*inst.inputs)
    kernels = c.module.source.count("@triton.jit\ndef triton_")
    print(f"chain256 max_fusion_size {mfs}: {kernels} kernels, compile+first call {comp:.1f} s, do_bench {bench_us(f):.1f} us, "
          f"host enqueue {host_us(f, 300):.1f} us/call", flush=True)
ind = torch.compile(inst.fn)
t1 = time.perf_counter()
ind(*inst.inputs)
print(f"chain256 inductor: compile {time.perf_counter() - t1:.1f} s, do_bench {bench_us(lambda: ind(*inst.inputs)):.1f} us")
print(f"probe {time.time() - t0:.0f} s")
