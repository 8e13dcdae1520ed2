"""Device probe: L2 eviction priorities on streaming kernels.  For each workload,
coil's kernels as compiled and with stores marked evict_last (outputs stay in L2
longest), loads marked evict_first (inputs read once leave first), or both; timed
two ways in interleaved rounds: do_bench (L2 flushed before every call) and
back-to-back calls with no flush, where a dirty line kept in L2 by one call must
still be written back during the next, so only a real gain survives.  Then the
producer with an eager consumer reading its output after it, to see whether the
consumer finds the kept lines in L2."""
import os, re, sys
sys.path.insert(0, os.getcwd())
import torch
from bench import workloads as W
from bench.probes.common import compile_coil, timed_rounds, variant

ROUNDS = int(os.environ.get("ROUNDS", "5"))
dev = torch.device("cuda")


def b2b_us(fn, calls=20, reps=5):
    """Median per-call time of `calls` back-to-back calls, no L2 flush between."""
    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        per.append(s.elapsed_time(e) * 1e3 / calls)
    return sorted(per)[len(per) // 2]


def policies(src):
    st = re.sub(r"(tl\.store\([^\n]*)\)\n", r"\1, eviction_policy='evict_last')\n", src)
    ld = re.sub(r"(tl\.load\([^\n]*other=0)\)", r"\1, eviction_policy='evict_first')", src)
    both = re.sub(r"(tl\.load\([^\n]*other=0)\)", r"\1, eviction_policy='evict_first')", st)
    assert st != src and ld != src
    return {"st last": st, "ld first": ld, "ld first st last": both}


def main():
    cases = [
        W.silu_mul(32768, 8192, torch.bfloat16),
        W.gelu_bias_residual(32768, 4096, torch.bfloat16),
        W.seed(32768, 4096, torch.float32),
        W.add_transpose(8192, torch.float32),
        W.rms_norm(32768, 4096, torch.bfloat16),
    ]
    for wl in cases:
        inst = wl.build(dev)
        args = inst.inputs
        ref = inst.fn(*args)
        ind = torch.compile(inst.fn)
        ind(*args)
        c = compile_coil(inst)
        fns = {"inductor": lambda: ind(*args), "coil": lambda: c(*args)[0]}
        for k, s in policies(c.module.source).items():
            v = variant(c, s)
            fns[k] = lambda v=v: v(*args)[0]
        for k, f in fns.items():
            got = f()
            torch.testing.assert_close(got if isinstance(got, torch.Tensor) else got[0], ref, rtol=2e-2, atol=2e-2)
        timed_rounds(f"{wl.name} do_bench", fns, ROUNDS)
        times = {k: [] for k in fns}
        for _ in range(ROUNDS):
            for k, f in fns.items():
                times[k].append(b2b_us(f))
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        print(f"== {wl.name} back-to-back")
        for k in fns:
            print(f"  {k:30s} median {med[k]:8.2f} us  ratio {med[k] / med['inductor']:.4f}", flush=True)
        consumer = {f"{k} + sum": (lambda f=f: f().sum(dtype=torch.float32)) for k, f in fns.items()}
        timed_rounds(f"{wl.name} then out.sum() (do_bench)", consumer, ROUNDS, base="inductor + sum")
        torch._dynamo.reset()
        del inst, args, ref, fns, consumer, c
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
