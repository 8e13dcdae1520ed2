"""Device probe: the three streaming workloads (gelu, silu*mul, x + y.t()) and a
64-step graph_2000 chain, coil's kernel against launch-config and eviction-hint
variants and Inductor, in interleaved rounds; Inductor's code goes to $OUT."""
import os, re, sys, time
sys.path.insert(0, os.getcwd())
import torch
from torch._inductor.utils import run_and_get_code
from bench import workloads as W
from bench.probes.common import OUT, compile_coil, timed_rounds, variant, with_config

dev = torch.device("cuda")
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def hints(src):
    """evict_first on loads of a full-size index, evict_last on the others; .cs stores"""
    def load(m):
        body = m.group(1)
        pol = "evict_first" if re.match(r"in_ptr\d+ \+ (xindex|\(xindex \+ \d+\*yindex\)|\(\d+\*xindex \+ yindex\))", body) else "evict_last"
        return f"tl.load({body}, eviction_policy='{pol}')"
    src = re.sub(r"tl\.load\(([^\n]*other=0)\)", load, src)
    return re.sub(r"tl\.store\(([^\n]*)\)\n", r"tl.store(\1, cache_modifier='.cs')\n", src)


def run(name, w, kind, cfgs, check=True):
    inst = w.build(dev)
    ref = inst.fn(*inst.inputs)
    ind = torch.compile(inst.fn)
    _, codes = run_and_get_code(ind, *inst.inputs)
    with open(os.path.join(OUT, f"inductor_{name}.py"), "w") as f:
        f.write("\n\n# ----\n".join(codes))
    c = compile_coil(inst)
    fns = {"inductor": lambda: ind(*inst.inputs), "coil": lambda: c(*inst.inputs)}
    for cfg in cfgs:
        for h in (False, True):
            src = with_config(c.module.source, kind, cfg)
            v = variant(c, hints(src) if h else src)
            if check:
                torch.testing.assert_close(v(*inst.inputs)[0], ref, rtol=2e-2, atol=2e-2)
            fns[f"{cfg}{'+h' if h else ''}"] = (lambda v=v: v(*inst.inputs))
    timed_rounds(f"{name}: {w.description}", fns, ROUNDS)
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
