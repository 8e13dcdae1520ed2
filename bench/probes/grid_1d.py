"""Device probe: coil's x + y.t() (f32 8192x8192) ran 0.1-0.3 % behind a
hand-written kernel with the same 64x64 tile on 8 warps, whose SASS (compiled here
for sm_90) differs only in how a program finds its tile: coil's reads two grid axes,
the hand-written one divides one (and coil's takes 48 registers a thread against
46, the same 5 programs an SM).  This times, through Dynamo as the bench calls them
and in interleaved rounds: Inductor, coil, coil's module with a 1-D grid, the
hand-written kernel; the same for silu(g) * u (bf16 32768x8192), coil against
Inductor; and the host time per call of each.  Inductor's output code goes to $OUT."""
import os
import re
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench import workloads as W  # noqa: E402
from bench.probes.common import OUT, host_us, timed_rounds, variant  # noqa: E402
from bench.probes.transpose_raster import add_t  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "9"))
dev = torch.device("cuda")

ONE_AXIS = """    pid = tl.program_id(0)
    yoffset = (pid // tl.cdiv(xnumel, XBLOCK)) * YBLOCK
    yindex = yoffset + tl.arange(0, YBLOCK)[:, None]
    ymask = tl.full([YBLOCK, 1], True, tl.int1)
    xoffset = (pid % tl.cdiv(xnumel, XBLOCK)) * XBLOCK
"""


def one_axis(source: str) -> str:
    """coil's tiled kernel with its tile found from one grid axis, rows of tiles
    first (the order the 2-D grid runs them in)."""
    source = re.sub(r"    yoffset = tl.program_id\(1\) \* YBLOCK\n(.*\n)(.*\n)    xoffset = tl.program_id\(0\) \* XBLOCK\n",
                    ONE_AXIS, source)
    return re.sub(r"\[grid2\((\d+), (\d+), (\d+), (\d+)\)\]",
                  lambda m: f"[(({m[1]} + {m[3]} - 1) // {m[3]} * (({m[2]} + {m[4]} - 1) // {m[4]}),)]", source)


def compiled_pair(inst):
    from torch._inductor.utils import run_and_get_code

    ind = torch.compile(inst.fn)
    _, code = run_and_get_code(ind, *inst.inputs)
    coil_fn = torch.compile(inst.fn, backend="coil")
    coil_fn(*inst.inputs)
    return ind, coil_fn, code


def main():
    inst = W.add_transpose(8192, torch.float32).build(dev)
    x, y = inst.inputs
    ref = inst.fn(x, y)
    ind, coil_fn, code = compiled_pair(inst)
    open(os.path.join(OUT, "inductor_add_t.py"), "w").write("\n\n".join(code))
    from bench.probes.common import compile_coil

    c = compile_coil(inst)
    src1 = one_axis(c.module.source)
    assert src1 != c.module.source, "the 1-D edit matched nothing"
    open(os.path.join(OUT, "coil_add_t_1d.py"), "w").write(src1)
    v1 = variant(c, src1)
    out = torch.empty_like(x)
    fns = {
        "inductor": lambda: ind(x, y),
        "coil": lambda: coil_fn(x, y),
        "coil module": lambda: c(x, y)[0],
        "coil module, 1-D grid": lambda: v1(x, y)[0],
        "hand 64x64/8": lambda: add_t[(16384,)](x, y, out, N=8192, YB=64, XB=64, ORDER=0, GROUP=1, num_warps=8),
    }
    for k, f in fns.items():
        out.zero_()
        got = f()
        torch.testing.assert_close(got if isinstance(got, torch.Tensor) else out, ref)
    timed_rounds("x + y.t() f32 8192x8192", fns, ROUNDS)
    for k in ("inductor", "coil", "coil module"):
        print(f"  host {k:12s} {host_us(fns[k]):6.1f} us/call", flush=True)
    torch._dynamo.reset()
    del x, y, out, inst, ref, c, v1
    torch.cuda.empty_cache()

    inst = W.silu_mul(32768, 8192, torch.bfloat16).build(dev)
    ind, coil_fn, code = compiled_pair(inst)
    open(os.path.join(OUT, "inductor_silu.py"), "w").write("\n\n".join(code))
    ref = inst.fn(*inst.inputs)
    fns = {"inductor": lambda: ind(*inst.inputs), "coil": lambda: coil_fn(*inst.inputs)}
    for f in fns.values():
        torch.testing.assert_close(f(), ref, rtol=2e-2, atol=2e-2)
    timed_rounds("silu(g) * u bf16 32768x8192", fns, ROUNDS)
    for k in fns:
        print(f"  host {k:12s} {host_us(fns[k]):6.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
