"""Device probe: coil's own gelu and silu*mul kernels against variants of their
text (evict_last on broadcast loads, tanh/sigmoid forms) and Inductor, interleaved;
PTX of coil's kernels to $OUT; a cProfile of the host side of a 256-step chain
(graph_2000's kernels) called directly."""
import cProfile, os, pstats, re, sys, time
sys.path.insert(0, os.getcwd())
import torch
from coil.backends.triton.runtime import fast_launch
from bench import workloads as W
from bench.probes.common import OUT, against_variants, compile_coil

dev = torch.device("cuda")
ROUNDS = int(os.environ.get("ROUNDS", "7"))


def ptx_of_coil(c, name):
    for v in c.namespace.values():
        if isinstance(v, fast_launch):
            for ck, _ in v.compiled.values():
                open(os.path.join(OUT, f"{name}_coil.ptx"), "w").write(ck.asm["ptx"])
                return


def evict_last_broadcast(src):
    return re.sub(r"tl\.load\((in_ptr\d+ \+ \([^\n]*%[^\n]*), other=0\)", r"tl.load(\1, other=0, eviction_policy='evict_last')", src)


def tanh_as_sigmoid(src):
    return re.sub(r"_coil_tanh\((tmp\d+)\)", r"(2.0 * tl.sigmoid(2.0 * \1) - 1.0)", src)


def sigmoid_as_div(src):
    return re.sub(r"tl\.sigmoid\((tmp\d+)\)", r"(1.0 / (1.0 + tl.exp(-\1)))", src)


def run(name, w, variants):
    c = against_variants(name, w.build(dev), variants, ROUNDS)
    ptx_of_coil(c, name)


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
