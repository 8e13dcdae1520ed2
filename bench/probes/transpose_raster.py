"""Device probe: x + y.t() (f32 8192x8192) runs at the copy rate, where silu*mul,
with the same 2:1 mix of reads and writes, reaches 103 % of it; is the transposed
read's DRAM pattern the gap?  A hand-written tiled kernel on a 1-D grid, over tile
shapes and three orders of the tiles: along output rows (coil's 2-D grid today),
down output columns, and grouped (GROUP tile-rows at a time, down then across, as a
matmul's L2 swizzle), against Inductor (and the config its autotuner picked) and
coil, in interleaved rounds.  N from the environment, so it checks itself under
TRITON_INTERPRET=1."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch, triton, triton.language as tl
from bench import workloads as W
from bench.probes.common import inductor_and_coil, inductor_configs, timed_rounds

ROUNDS = int(os.environ.get("ROUNDS", "5"))
N = int(os.environ.get("N", "8192"))
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@triton.jit
def add_t(x, y, o, N: tl.constexpr, YB: tl.constexpr, XB: tl.constexpr, ORDER: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    tiles_x: tl.constexpr = N // XB
    tiles_y: tl.constexpr = N // YB
    if ORDER == 0:  # along output rows
        ty, tx = pid // tiles_x, pid % tiles_x
    elif ORDER == 1:  # down output columns
        tx, ty = pid // tiles_y, pid % tiles_y
    else:  # GROUP tile-rows at a time, down the group's column, then across
        per_group: tl.constexpr = GROUP * tiles_x
        g = pid // per_group
        r = pid % per_group
        ty, tx = g * GROUP + r % GROUP, r // GROUP
    yi = ty * YB + tl.arange(0, YB)[:, None]
    xi = tx * XB + tl.arange(0, XB)[None, :]
    a = tl.load(x + yi * N + xi)
    b = tl.load(y + xi * N + yi)
    tl.store(o + yi * N + xi, a + b)


def main():
    inst = W.add_transpose(N, torch.float32).build(dev)
    x, y = inst.inputs
    ref = inst.fn(x, y)
    out = torch.empty_like(x)
    fns = {}
    if dev.type == "cuda":
        fns.update(inductor_and_coil(inst))
        print("inductor picked", inductor_configs(), flush=True)
    shapes = ((64, 64, 8), (64, 64, 4), (32, 32, 4), (128, 64, 8), (64, 128, 8), (128, 128, 8), (32, 128, 4))
    for yb, xb, w in shapes:
        if N % yb or N % xb:
            continue
        for order, group in ((0, 1), (1, 1), (2, 8), (2, 32)):
            if order == 2 and (N // yb) % group:
                continue
            grid = (N // yb * (N // xb),)
            fns[f"{yb}x{xb}/{w} order {order} g{group}"] = (
                lambda yb=yb, xb=xb, w=w, order=order, group=group, grid=grid:
                add_t[grid](x, y, out, N=N, YB=yb, XB=xb, ORDER=order, GROUP=group, num_warps=w))
    for k, f in fns.items():
        out.zero_()
        got = f()
        torch.testing.assert_close(got if isinstance(got, torch.Tensor) else out, ref)
    print("variants checked:", len(fns), flush=True)
    if dev.type == "cuda":
        timed_rounds(f"x + y.t() f32 {N}x{N}", fns, ROUNDS)


if __name__ == "__main__":
    main()
