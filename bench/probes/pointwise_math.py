"""Device probe: coil's own gelu and silu*mul kernels against variants of their
text (evict_last on broadcast loads, tanh/sigmoid forms) and Inductor, interleaved;
PTX of coil's and Inductor's kernels to $OUT; a cProfile of the host side of a
256-step chain (graph_2000's kernels) called directly."""
import cProfile, gc, os, pstats, re, sys, time
import attrs, torch, triton, triton.testing
from torch.fx.experimental.proxy_tensor import make_fx
sys.path.insert(0, os.getcwd())
import coil
from coil.backends.runtime import load_module
from coil.backends.triton.runtime import fast_launch
from bench import workloads as W

dev = torch.device("cuda")
OUT = os.environ.get("OUT", "/tmp")
ROUNDS = int(os.environ.get("ROUNDS", "7"))


def t(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3


def compile_coil(inst, **kw):
    gm = make_fx(inst.fn)(*inst.inputs)
    return coil.compile_graph(gm, list(inst.inputs), coil.Options(target="triton", graph_cache=False, **kw))


def ptx_of_coil(c, name):
    for v in c.namespace.values():
        if isinstance(v, fast_launch):
            for ck, _ in v.compiled.values():
                open(os.path.join(OUT, f"{name}_coil.ptx"), "w").write(ck.asm["ptx"])
                return


def ptx_of_inductor(name):
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    for o in gc.get_objects():
        try:
            if isinstance(o, CachingAutotuner) and o.launchers:
                b = getattr(o.launchers[0], "bin", None)
                if b is not None:
                    open(os.path.join(OUT, f"{name}_inductor.ptx"), "w").write(b.asm["ptx"])
                    return
        except ReferenceError:
            pass


def evict_last_broadcast(src):
    return re.sub(r"tl\.load\((in_ptr\d+ \+ \([^\n]*%[^\n]*), other=0\)", r"tl.load(\1, other=0, eviction_policy='evict_last')", src)


def tanh_as_sigmoid(src):
    return re.sub(r"_coil_tanh\((tmp\d+)\)", r"(2.0 * tl.sigmoid(2.0 * \1) - 1.0)", src)


def sigmoid_as_div(src):
    return re.sub(r"tl\.sigmoid\((tmp\d+)\)", r"(1.0 / (1.0 + tl.exp(-\1)))", src)


def run(name, w, variants):
    inst = w.build(dev)
    ref = inst.fn(*inst.inputs)
    ind = torch.compile(inst.fn)
    ind(*inst.inputs)
    ptx_of_inductor(name)
    c = compile_coil(inst)
    c(*inst.inputs); c(*inst.inputs)
    ptx_of_coil(c, name)
    fns = {"inductor": lambda: ind(*inst.inputs), "coil": lambda: c(*inst.inputs)}
    for vname, patch in variants.items():
        src = patch(c.module.source)
        assert src != c.module.source, vname
        v = load_module(attrs.evolve(c.module, source=src))
        torch.testing.assert_close(v(*inst.inputs)[0], ref, rtol=2e-2, atol=2e-2)
        fns[vname] = lambda v=v: v(*inst.inputs)
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(t(f))
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    print(f"== {name}", flush=True)
    for k, v in times.items():
        print(f"  {k:34s} median {med[k]:8.1f} us  ratio {med[k] / med['inductor']:.4f}  min {min(v):.1f} max {max(v):.1f}", flush=True)
    torch._dynamo.reset()


t0 = time.time()
run("gelu", W.gelu_bias_residual(32768, 4096, torch.bfloat16), {
    "evict_last bias": evict_last_broadcast,
    "tanh as sigmoid": tanh_as_sigmoid,
    "both": lambda s: tanh_as_sigmoid(evict_last_broadcast(s)),
})
run("silu", W.silu_mul(32768, 8192, torch.bfloat16), {"sigmoid as 1/(1+exp)": sigmoid_as_div})
print(f"pointwise {time.time() - t0:.0f} s", flush=True)

W.CHAIN_STEPS = 256
inst = W.chain(1024, 1024).build(dev)
c = compile_coil(inst)
for _ in range(3):
    c(*inst.inputs)
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    c(*inst.inputs)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
print(f"probe {time.time() - t0:.0f} s")
