"""Device probe: the three streaming workloads (gelu, silu*mul, x + y.t()) and a
short graph_2000 chain, coil's kernel against variants of it (launch configs,
eviction hints) and Inductor, timed in interleaved rounds; Inductor's code is
written to $OUT (or /tmp) for reading."""
import os, re, sys, time
import attrs, torch, triton, triton.testing
from torch.fx.experimental.proxy_tensor import make_fx
from torch._inductor.utils import run_and_get_code
sys.path.insert(0, os.getcwd())
import coil
from coil.backends.runtime import load_module
from bench import workloads as W

dev = torch.device("cuda")
out_dir = os.environ.get("OUT", "/tmp")
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def t(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3


def coil_fn(inst):
    gm = make_fx(inst.fn)(*inst.inputs)
    return coil.compile_graph(gm, list(inst.inputs), coil.Options(target="triton", graph_cache=False))


def hints(src):
    """evict_first on loads of a full-size index, evict_last on the others; .cs stores"""
    def load(m):
        body = m.group(1)
        pol = "evict_first" if re.match(r"in_ptr\d+ \+ (xindex|\(xindex \+ \d+\*yindex\)|\(\d+\*xindex \+ yindex\))", body) else "evict_last"
        return f"tl.load({body}, eviction_policy='{pol}')"
    src = re.sub(r"tl\.load\(([^\n]*other=0)\)", load, src)
    return re.sub(r"tl\.store\(([^\n]*)\)\n", r"tl.store(\1, cache_modifier='.cs')\n", src)


def config(src, kind, cfg):
    if kind == "pointwise":
        xb, w = cfg
        src = re.sub(r"\[grid\((\d+), \d+\)\]", rf"[grid(\1, {xb})]", src)
        return re.sub(r"XBLOCK=\d+, num_warps=\d+", f"XBLOCK={xb}, num_warps={w}", src)
    if kind == "tiled":
        yb, xb, w = cfg
        src = re.sub(r"\[grid2\((\d+), (\d+), \d+, \d+\)\]", rf"[grid2(\1, \2, {yb}, {xb})]", src)
        return re.sub(r"YBLOCK=\d+, XBLOCK=\d+, num_warps=\d+", f"YBLOCK={yb}, XBLOCK={xb}, num_warps={w}", src)
    xb, w = cfg  # persistent
    src = re.sub(r"\[grid\((\d+), \d+\)\]", rf"[grid(\1, {xb})]", src)
    return re.sub(r"XBLOCK=\d+, RBLOCK=(\d+), num_warps=\d+", rf"XBLOCK={xb}, RBLOCK=\1, num_warps={w}", src)


def variant(c, src):
    return load_module(attrs.evolve(c.module, source=src))


def run(name, w, kind, cfgs, check=True):
    inst = w.build(dev)
    ref = inst.fn(*inst.inputs)
    ind = torch.compile(inst.fn)
    _, codes = run_and_get_code(ind, *inst.inputs)
    with open(os.path.join(out_dir, f"inductor_{name}.py"), "w") as f:
        f.write("\n\n# ----\n".join(codes))
    c = coil_fn(inst)
    base = c.module.source
    fns = {"inductor": lambda: ind(*inst.inputs), "coil": lambda: c(*inst.inputs)}
    for cfg in cfgs:
        for h in (False, True):
            src = config(base, kind, cfg)
            if h:
                src = hints(src)
            v = variant(c, src)
            got = v(*inst.inputs)[0]
            if check:
                torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
            fns[f"{cfg}{'+h' if h else ''}"] = (lambda v=v: v(*inst.inputs))
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(t(f))
    ind_t = sorted(times["inductor"])[len(times["inductor"]) // 2]
    print(f"== {name}: {w.description}", flush=True)
    for k, v in times.items():
        m = sorted(v)[len(v) // 2]
        print(f"  {k:22s} median {m:8.1f} us  ratio {m / ind_t:.4f}  rounds {' '.join(f'{x:.1f}' for x in v)}", flush=True)
    del inst, ref, c, fns
    torch.cuda.empty_cache()


sel = sys.argv[1:] or ["gelu", "silu", "xyt", "chain"]
t0 = time.time()
if "gelu" in sel:
    run("gelu", W.gelu_bias_residual(32768, 4096, torch.bfloat16), "pointwise", ((1024, 4), (2048, 4), (2048, 8), (4096, 8)))
if "silu" in sel:
    run("silu", W.silu_mul(32768, 8192, torch.bfloat16), "pointwise", ((1024, 4), (2048, 4), (2048, 8), (4096, 8)))
if "xyt" in sel:
    run("xyt", W.add_transpose(8192, torch.float32), "tiled", ((64, 64, 8), (64, 64, 4), (32, 128, 4), (128, 64, 8)))
if "chain" in sel:
    W.CHAIN_STEPS = 64
    run("chain64", W.chain(1024, 1024), "persistent", ((4, 4), (1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (8, 8)), check=False)
print(f"probe {time.time() - t0:.0f} s")
