"""Device probe: host time per call of a tiny two-kernel graph with its Launchers bound
(Triton's C launcher called directly) and unbound (Triton's JITFunction path every
call), in one process (run from the repository root on a CUDA machine)."""
import os, sys, time, torch
sys.path.insert(0, os.getcwd())
from triton import knobs
from coil.backends.triton.runtime import Launcher
from bench import workloads as W
from bench.probes.common import compile_coil, host_us
dev = torch.device("cuda")
print("hooks", knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
def cpu_us(fn):
    return host_us(fn, 300)
inst = W.cross_entropy(16, 320, torch.bfloat16).build(dev)
c = compile_coil(inst)
ls = [v for v in c.namespace.values() if isinstance(v, Launcher)]
c(*inst.inputs)
saved = [(f.run, f.bind) for f in ls]
print("launchers", len(ls), [f.rule for f in ls])
for rnd in range(2):
    for f, (run, bind) in zip(ls, saved): f.run, f.bind = run, bind
    a = cpu_us(lambda: c(*inst.inputs))
    for f in ls: f.run, f.bind = None, False
    for f in ls: f.keyed.enabled = False  # Triton's own path, not the keyed one
    b = cpu_us(lambda: c(*inst.inputs))
    for f in ls: f.keyed.enabled = True
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
