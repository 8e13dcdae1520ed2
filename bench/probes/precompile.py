"""Device probe: graph_2000's cold compile (32 Triton kernels) with Options.precompile
off and on, each in a fresh process with empty Triton and coil caches: tracing,
compile_graph (which now compiles the kernels when precompile is on) and the first call."""
import os, subprocess, sys, tempfile

CODE = '''
import os, sys, time, torch
sys.path.insert(0, os.getcwd())
t0 = time.perf_counter()
import coil
from torch.fx.experimental.proxy_tensor import make_fx
from bench import workloads as W
inst = W.chain(1024, 1024).build(torch.device("cuda"))
gm = make_fx(inst.fn)(*inst.inputs)
t1 = time.perf_counter()
c = coil.compile_graph(gm, list(inst.inputs), coil.Options(target="triton", graph_cache=False, precompile=PRE))
t2 = time.perf_counter()
out = c(*inst.inputs)
torch.cuda.synchronize()
t3 = time.perf_counter()
torch.testing.assert_close(out[0], inst.fn(*inst.inputs), rtol=1e-3, atol=1e-3)
print(f"precompile=PRE on {len(os.sched_getaffinity(0))} cores: import+trace {t1 - t0:.1f} s, "
      f"compile_graph {t2 - t1:.1f} s, first call {t3 - t2:.1f} s; compile to first result {t3 - t1:.1f} s", flush=True)
'''
for pre in (False, True):
    env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(), COIL_CACHE_DIR=tempfile.mkdtemp())
    subprocess.run([sys.executable, "-c", CODE.replace("PRE", str(pre))], env=env, check=False)
