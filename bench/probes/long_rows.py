"""Device probe: second passes over a few long rows (x - x.mean(), layer_norm of one
row, a full logsumexp and softmax), coil with Options.split_second_pass at 16384
(the reductions split over many programs, the pass its own kernel) and at 0 (one
fused kernel, one program a row), against Inductor, in interleaved rounds.  Its
H200 figures set the option's default (2^18)."""
import os, sys, time
from types import SimpleNamespace
sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
from bench.probes.common import compile_coil, timed_rounds

dev = torch.device("cuda")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
FNS = {
    "x - x.mean()": lambda a: a - a.mean(),
    "layer_norm(1 row)": lambda a: F.layer_norm(a, (a.shape[-1],)),
    "logsumexp": lambda a: a.logsumexp(-1),
    "softmax": lambda a: a.softmax(-1),
}
t0 = time.time()
for n in (1 << 16, 1 << 20, 1 << 24):
    x = torch.randn(1, n, device=dev)
    for name, fn in FNS.items():
        inst = SimpleNamespace(fn=fn, inputs=(x,))
        ref = fn(x)
        split, whole = compile_coil(inst, split_second_pass=1 << 14), compile_coil(inst, split_second_pass=0)
        ind = torch.compile(fn)
        for f in (split, whole):
            torch.testing.assert_close(f(x)[0], ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ind(x), ref, rtol=1e-4, atol=1e-5)
        timed_rounds(f"{name}, 1x{n} f32", {"inductor": lambda: ind(x), "coil split": lambda: split(x),
                                              "coil one kernel": lambda: whole(x)}, ROUNDS)
        torch._dynamo.reset()
print(f"probe {time.time() - t0:.0f} s")
