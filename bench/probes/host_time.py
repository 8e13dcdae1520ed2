"""Device probe: cross_entropy and softmax called directly and through dynamo under
do_bench, per-kernel profiler times, and host time per call of a tiny graph (run
from the repository root on a CUDA machine)."""
import os, sys, torch, triton, triton.testing
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, os.getcwd())
from bench import workloads as W
from bench.probes.common import compile_coil, host_us as cpu_us
dev = torch.device("cuda")
def t(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3
def per_kernel(fn):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(20): fn()
        torch.cuda.synchronize()
    for e in p.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            print(f"   {e.key[:60]:60s} n={e.count} avg {e.device_time_total / e.count:.1f} us")
for name, w in (("ce", W.cross_entropy(16384, 32000, torch.bfloat16)), ("softmax", W.softmax(32768, 4096, torch.bfloat16))):
    inst = w.build(dev)
    c = compile_coil(inst)
    dyn = torch.compile(inst.fn, backend="coil", options={"target": "triton"})
    dyn(*inst.inputs)
    print(f"{name}: direct {t(lambda: c(*inst.inputs)):.1f} us, dynamo {t(lambda: dyn(*inst.inputs)):.1f} us, direct {t(lambda: c(*inst.inputs)):.1f}, dynamo {t(lambda: dyn(*inst.inputs)):.1f}", flush=True)
    per_kernel(lambda: dyn(*inst.inputs))
    torch._dynamo.reset()
    ind = torch.compile(inst.fn); ind(*inst.inputs)
    print(f"{name}: inductor {t(lambda: ind(*inst.inputs)):.1f}")
    del inst, c, dyn, ind
    torch._dynamo.reset()
# CPU overhead per call on tiny inputs (GPU work negligible)
inst = W.cross_entropy(16, 320, torch.bfloat16).build(dev)
c = compile_coil(inst)
dyn = torch.compile(inst.fn, backend="coil", options={"target": "triton"}); dyn(*inst.inputs)
print(f"tiny ce cpu/call: coil direct {cpu_us(lambda: c(*inst.inputs)):.1f} us, coil dynamo {cpu_us(lambda: dyn(*inst.inputs)):.1f} us")
torch._dynamo.reset()
ind = torch.compile(inst.fn); ind(*inst.inputs)
print(f"tiny ce cpu/call: inductor {cpu_us(lambda: ind(*inst.inputs)):.1f} us, eager {cpu_us(lambda: inst.fn(*inst.inputs)):.1f} us")
print(c.source[c.source.find("def call("):][:1500])
