"""Device probe: the order of a tiled kernel's loads, and the tile's orientation.
Triton computes in the layout of the last load and converts the earlier ones to
it, so x + y.t() with x's load first converts x to y's layout and the sum back for
the store (two shared-memory round trips a tile), and with y's load first converts
y alone (one).  This times coil's module against the same module with its first
two loads swapped, and Inductor, for x + y.t() and y.t() + x (f32 8192x8192; the
second's output is column-major, so coil lays its tile transposed), in
interleaved rounds.  First run (y's load first in coil): x + y.t() 192.0 µs
against 190.6 with x's first; y.t() + x, on a plain tile, 197.4 against 196.5, and
Inductor 190.4."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from bench import workloads as W
from bench.probes.common import compile_coil, timed_rounds, variant

ROUNDS = int(os.environ.get("ROUNDS", "5"))
dev = torch.device("cuda")


def main():
    for name, fn in (("x + y.t()", W.add_transpose_fn), ("y.t() + x", lambda x, y: y.t() + x)):
        inst = W.add_transpose(8192, torch.float32).build(dev)
        inst = type(inst)(fn, inst.inputs)
        x, y = inst.inputs
        ref = fn(x, y)
        ind = torch.compile(fn)
        ind(x, y)
        c = compile_coil(inst)
        src = c.module.source
        lines = src.splitlines()
        loads = [l for l in lines if "tl.load(" in l]
        # swap the two load statements' right-hand sides and names together: same values, other order
        i0, i1 = lines.index(loads[0]), lines.index(loads[1])
        lines[i0], lines[i1] = loads[1], loads[0]
        old = variant(c, "\n".join(lines) + "\n")
        fns = {"inductor": lambda: ind(x, y), "coil": lambda: c(x, y)[0], "coil, old load order": lambda: old(x, y)[0]}
        for k, f in fns.items():
            torch.testing.assert_close(f(), ref)
        print(name, "loads now:", [l.strip()[:70] for l in loads], flush=True)
        timed_rounds(name, fns, ROUNDS)
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
