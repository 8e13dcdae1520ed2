"""Device probe: where silu*mul's last 0.1 % against Inductor comes from.  Inductor's
kernel (its source, compiled here with plain triton.jit) and coil's, launched the
same way into the same preallocated outputs, against both compiled functions; a
num_stages=1 launch and .cg loads as variants; PTX of both kernels to $OUT."""
import importlib.util, os, re, sys
sys.path.insert(0, os.getcwd())
import torch
from torch._inductor.utils import run_and_get_code
from bench import workloads as W
from bench.probes.common import OUT, compile_coil, timed_rounds, variant

dev = torch.device("cuda")
ROUNDS = int(os.environ.get("ROUNDS", "7"))


inst = W.silu_mul(32768, 8192, torch.bfloat16).build(dev)
g, u = inst.inputs
n = g.numel()
ref = inst.fn(g, u)
ind = torch.compile(inst.fn)
_, codes = run_and_get_code(ind, g, u)
m = re.search(r"async_compile\.triton\('(\w+)', '''(.*?)''', device_str", codes[0], re.S)
name, ksrc = m.group(1), m.group(2)
ksrc = re.sub(r"@triton_heuristics\.\w+\(.*?\n\)\n@triton\.jit", "@triton.jit", ksrc, flags=re.S)
path = os.path.join("/tmp", "inductor_silu_kernel.py")
open(path, "w").write(ksrc)
spec = importlib.util.spec_from_file_location("inductor_silu_kernel", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ik = getattr(mod, name)

c = compile_coil(inst)
ck = c.namespace["triton_poi_fused_mul_silu_0"].kernel
cg_src = re.sub(r"tl\.load\(([^\n]*other=0)\)", r"tl.load(\1, cache_modifier='.cg')", c.module.source)
assert cg_src != c.module.source
cgv = variant(c, cg_src)
out1, out2 = torch.empty_like(g), torch.empty_like(g)
grid = (n // 1024,)


def launch(k, out, **kw):
    return lambda: k[grid](g, u, out, n, XBLOCK=1024, num_warps=4, **kw)


fns = {
    "inductor fn": lambda: ind(g, u),
    "coil fn": lambda: c(g, u),
    "inductor kernel -> out1": launch(ik, out1, num_stages=1),
    "coil kernel -> out1": launch(ck, out1),
    "coil kernel stages=1 -> out1": launch(ck, out1, num_stages=1),
    "inductor kernel -> out2": launch(ik, out2, num_stages=1),
    "coil kernel -> out2": launch(ck, out2),
    "coil fn, .cg loads": lambda: cgv(g, u),
}
for k, f in fns.items():
    r = f()
    got = r[0] if isinstance(r, tuple) else (r if isinstance(r, torch.Tensor) else (out1 if "out1" in k else out2))
    torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
for k, kern in (("inductor", ik), ("coil", ck)):
    try:
        for cache in kern.device_caches.values():
            for compiled in cache[0].values():
                open(os.path.join(OUT, f"silu_{k}_{compiled.metadata.num_stages}.ptx"), "w").write(compiled.asm["ptx"])
    except Exception as e:  # the cache's layout is Triton's own
        print("no PTX:", e)
timed_rounds("silu", fns, ROUNDS, base="inductor fn")
print("addresses", hex(g.data_ptr()), hex(u.data_ptr()), hex(out1.data_ptr()), hex(out2.data_ptr()),
      hex(ind(g, u).data_ptr()), hex(c(g, u)[0].data_ptr()))
