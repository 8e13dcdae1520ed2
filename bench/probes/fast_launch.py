"""Device probe: host time per call of a tiny two-kernel graph with fast_launch on and
off, in one process (run from the repository root on a CUDA machine)."""
import os, sys, time, torch
from torch.fx.experimental.proxy_tensor import make_fx
sys.path.insert(0, os.getcwd())
import coil
from triton import knobs
from coil.backends.triton.runtime import fast_launch
from bench import workloads as W
dev = torch.device("cuda")
print("hooks", knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
def cpu_us(fn, n=300):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    el = time.perf_counter() - t0
    torch.cuda.synchronize()
    return el / n * 1e6
inst = W.cross_entropy(16, 320, torch.bfloat16).build(dev)
gm = make_fx(inst.fn)(*inst.inputs)
c = coil.compile_graph(gm, list(inst.inputs), coil.Options(target="triton"))
ls = [v for v in c.namespace.values() if isinstance(v, fast_launch)]
print("launchers", len(ls), [f.enabled for f in ls])
for rnd in range(2):
    for f in ls: f.enabled = True
    a = cpu_us(lambda: c(*inst.inputs))
    print("entries", [len(f.compiled) for f in ls])
    for f in ls: f.enabled = False
    b = cpu_us(lambda: c(*inst.inputs))
    print(f"round {rnd}: fast {a:.1f} us/call, triton path {b:.1f} us/call, eager {cpu_us(lambda: inst.fn(*inst.inputs)):.1f}", flush=True)
f = ls[0]
args = inst.inputs
t0 = time.perf_counter()
for _ in range(1000): key = tuple((x.dtype, x.data_ptr() % 16 == 0) if hasattr(x, "data_ptr") else x for x in args)
print(f"key {(time.perf_counter()-t0):.1f} ms/1000")
from triton.runtime import driver
t0 = time.perf_counter()
for _ in range(1000): s = driver.active.get_current_stream(driver.active.get_current_device())
print(f"stream {(time.perf_counter()-t0):.1f} ms/1000")
