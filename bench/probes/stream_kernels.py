"""Device probe: hand-written silu*mul and gelu kernels (one block per program, and
grid-stride loops over a full-occupancy grid) against Inductor, interleaved rounds;
prints the config Inductor's autotuner picked.  Then a 256-step chain (graph_2000's
kernels) through coil: GPU time and host time per call, for two persistent configs."""
import os, sys, time
sys.path.insert(0, os.getcwd())
import torch, triton, triton.language as tl
from bench import workloads as W
from bench.probes.common import bench_us as t, compile_coil, host_us, inductor_configs, timed_rounds, variant, with_config

dev = torch.device("cuda")
ROUNDS = int(os.environ.get("ROUNDS", "7"))
SMS = torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def silu_plain(g, u, o, XBLOCK: tl.constexpr):
    idx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    a = tl.load(g + idx).to(tl.float32)
    b = tl.load(u + idx).to(tl.float32)
    tl.store(o + idx, (a * tl.sigmoid(a) * b).to(tl.bfloat16))


@triton.jit
def silu_stride(g, u, o, nblocks, XBLOCK: tl.constexpr, NPROG: tl.constexpr):
    for blk in range(tl.program_id(0), nblocks, NPROG):
        idx = blk * XBLOCK + tl.arange(0, XBLOCK)
        a = tl.load(g + idx).to(tl.float32)
        b = tl.load(u + idx).to(tl.float32)
        tl.store(o + idx, (a * tl.sigmoid(a) * b).to(tl.bfloat16))


@triton.jit
def gelu_plain(x, bias, r, o, XBLOCK: tl.constexpr, N: tl.constexpr):
    idx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    v = tl.load(x + idx).to(tl.float32) + tl.load(bias + idx % N).to(tl.float32)
    y = 0.5 * v * (1.0 + tl.extra.cuda.libdevice.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
    tl.store(o + idx, (y + tl.load(r + idx).to(tl.float32)).to(tl.bfloat16))


@triton.jit
def gelu_stride(x, bias, r, o, nblocks, XBLOCK: tl.constexpr, N: tl.constexpr, NPROG: tl.constexpr):
    for blk in range(tl.program_id(0), nblocks, NPROG):
        idx = blk * XBLOCK + tl.arange(0, XBLOCK)
        v = tl.load(x + idx).to(tl.float32) + tl.load(bias + idx % N).to(tl.float32)
        y = 0.5 * v * (1.0 + tl.extra.cuda.libdevice.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
        tl.store(o + idx, (y + tl.load(r + idx).to(tl.float32)).to(tl.bfloat16))


def compare(name, inst, fns):
    ref = inst.fn(*inst.inputs)
    ind = torch.compile(inst.fn)
    ind(*inst.inputs)
    fns = {"inductor": lambda: ind(*inst.inputs), **fns}
    for k, f in fns.items():
        got = f()
        torch.testing.assert_close(got if isinstance(got, torch.Tensor) else got[0], ref, rtol=2e-2, atol=2e-2)
    timed_rounds(f"{name}: inductor picked {inductor_configs()}", fns, ROUNDS)
    torch._dynamo.reset()


def stream_variants(n, launch_plain, launch_stride):
    fns = {}
    for xb, w in ((1024, 4), (512, 4), (1024, 8)):
        fns[f"plain {xb}/{w}"] = lambda xb=xb, w=w: launch_plain(xb, w)
    for xb, w, per_sm in ((1024, 4, 16), (1024, 4, 8), (1024, 4, 32), (2048, 8, 8), (512, 4, 32)):
        fns[f"stride {xb}/{w} x{per_sm}/SM"] = lambda xb=xb, w=w, p=per_sm: launch_stride(xb, w, SMS * p)
    return fns


t0 = time.time()
inst = W.silu_mul(32768, 8192, torch.bfloat16).build(dev)
g, u = inst.inputs
n = g.numel()
o = torch.empty_like(g)


def sp(xb, w):
    silu_plain[(n // xb,)](g, u, o, XBLOCK=xb, num_warps=w)
    return o


def ss(xb, w, p):
    silu_stride[(p,)](g, u, o, n // xb, XBLOCK=xb, NPROG=p, num_warps=w)
    return o


compare("silu", inst, stream_variants(n, sp, ss))
del inst, g, u, o
inst = W.gelu_bias_residual(32768, 4096, torch.bfloat16).build(dev)
x, b, r = inst.inputs
n = x.numel()
o = torch.empty_like(x)


def gp(xb, w):
    gelu_plain[(n // xb,)](x, b, r, o, XBLOCK=xb, N=4096, num_warps=w)
    return o


def gs(xb, w, p):
    gelu_stride[(p,)](x, b, r, o, n // xb, XBLOCK=xb, N=4096, NPROG=p, num_warps=w)
    return o


compare("gelu", inst, stream_variants(n, gp, gs))
del inst, x, b, r, o
torch.cuda.empty_cache()
print(f"stream probes {time.time() - t0:.0f} s", flush=True)

# graph_2000's kernels: a 256-step chain, 8 kernels
W.CHAIN_STEPS = 256
inst = W.chain(1024, 1024).build(dev)
for mfs in (64, 128):
    c = compile_coil(inst, max_fusion_size=mfs)
    for xb, w in ((4, 4), (1, 1)):
        v = variant(c, with_config(c.module.source, "persistent", (xb, w)))
        f = lambda: v(*inst.inputs)
        kernels = v.source.count("@triton.jit\ndef triton_")
        print(f"chain256 max_fusion_size {mfs} ({kernels} kernels) {xb}/{w}: do_bench {t(f):.1f} us, "
              f"host enqueue {host_us(f):.1f} us/call", flush=True)
ind = torch.compile(inst.fn)
ind(*inst.inputs)
print(f"chain256 inductor: do_bench {t(lambda: ind(*inst.inputs)):.1f} us; {inductor_configs()[:2]}")
print(f"probe {time.time() - t0:.0f} s")
