"""Device probe: silu*mul and gelu with coil's committed kernels against text
variants (launch configs, the cast at the store, Inductor's form of the math) and
Inductor, interleaved rounds; then a 256-step chain (graph_2000's kernels): compile
time, GPU time and host time per call for two fusion-size limits."""
import os, re, sys, time
import attrs, torch, triton, triton.testing
from torch.fx.experimental.proxy_tensor import make_fx
sys.path.insert(0, os.getcwd())
import coil
from coil.backends.runtime import load_module
from bench import workloads as W

dev = torch.device("cuda")
ROUNDS = int(os.environ.get("ROUNDS", "9"))


def t(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3


def compile_coil(inst, **kw):
    gm = make_fx(inst.fn)(*inst.inputs)
    return coil.compile_graph(gm, list(inst.inputs), coil.Options(target="triton", graph_cache=False, **kw))


def cfg(xb, w):
    def patch(src):
        src = re.sub(r"\[grid\((\d+), \d+\)\]", rf"[grid(\1, {xb})]", src)
        return re.sub(r"XBLOCK=\d+, num_warps=\d+", f"XBLOCK={xb}, num_warps={w}", src)
    return patch


def store_f32(src):  # the store casts, as in Inductor's kernel
    return re.sub(r"(tmp\d+) = _coil_to_bf16\((tmp\d+)\)", r"\1 = \2", src)


def inductor_math(src):
    return re.sub(r"tl\.sigmoid\((tmp\d+)\)", r"(1.0 / (1.0 + libdevice.exp(-\1)))", src)


def run(name, w, variants):
    inst = w.build(dev)
    ref = inst.fn(*inst.inputs)
    ind = torch.compile(inst.fn)
    ind(*inst.inputs)
    c = compile_coil(inst)
    fns = {"inductor": lambda: ind(*inst.inputs), "coil": lambda: c(*inst.inputs)}
    for vname, patch in variants.items():
        src = patch(c.module.source)
        assert src != c.module.source, vname
        v = load_module(attrs.evolve(c.module, source=src))
        torch.testing.assert_close(v(*inst.inputs)[0], ref, rtol=2e-2, atol=2e-2)
        fns[vname] = lambda v=v: v(*inst.inputs)
    torch.testing.assert_close(c(*inst.inputs)[0], ref, rtol=2e-2, atol=2e-2)
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(t(f))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"== {name}", flush=True)
    for k, v in times.items():
        print(f"  {k:24s} median {med[k]:8.1f} us  ratio {med[k] / med['inductor']:.4f}  min {min(v):.1f} max {max(v):.1f}", flush=True)
    torch._dynamo.reset()


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
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for _ in range(300):
        f()
    host = (time.perf_counter() - t1) / 300 * 1e6
    torch.cuda.synchronize()
    kernels = c.module.source.count("@triton.jit\ndef triton_")
    print(f"chain256 max_fusion_size {mfs}: {kernels} kernels, compile+first call {comp:.1f} s, do_bench {t(f):.1f} us, "
          f"host enqueue {host:.1f} us/call", flush=True)
ind = torch.compile(inst.fn)
t1 = time.perf_counter()
ind(*inst.inputs)
print(f"chain256 inductor: compile {time.perf_counter() - t1:.1f} s, do_bench {t(lambda: ind(*inst.inputs)):.1f} us")
print(f"probe {time.time() - t0:.0f} s")
