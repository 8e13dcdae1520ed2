"""Device probe: Wav2Vec2's first GroupNorm (one group a channel: 4096 rows of 16383
bf16 elements, odd, so no row starts 16-byte aligned) with its GELU, the kernel that
took 371 µs in coil against Inductor's 253 on the H200.  coil's kernel against its
own launch configs (RBLOCK x num_warps), against Welford's update with the count's
reciprocal taken once an iteration (a scalar in the unmasked loop, where every lane
has seen the same number of elements) in place of a division an element, and
against Inductor (whose autotuned config is printed).  Run from the repository
root on a CUDA machine."""
import os
import re
import sys

sys.path.insert(0, os.getcwd())
import attrs  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.probes.common import against_variants, inductor_configs  # noqa: E402

CONFIG = re.compile(r"\{'XBLOCK': 1, 'RBLOCK': \d+, 'num_warps': \d+\}")  # a Launcher's (CUDA)
KWARGS = re.compile(r"XBLOCK=1, RBLOCK=\d+, num_warps=\d+")  # Triton's own launch
# the unmasked loop's Welford mean update: tmpC = _accM + tmpD / tmpW
MEAN_UPDATE = re.compile(r"(tmp\d+) = (_acc\d+) \+ (tmp\d+) / (tmp\d+)\n")


def with_rconfig(rblock: int, warps: int):
    def edit(source: str) -> str:
        source = CONFIG.sub(f"{{'XBLOCK': 1, 'RBLOCK': {rblock}, 'num_warps': {warps}}}", source)
        return KWARGS.sub(f"XBLOCK=1, RBLOCK={rblock}, num_warps={warps}", source)
    return edit


def scalar_reciprocal(source: str) -> str:
    """In the first (unmasked) loop only: the count after this element is the
    iteration number + 1 on every lane."""
    head, sep, rest = source.partition("    for roffset in range(0, ")
    loop, sep2, tail = rest.partition("    if ")
    loop = MEAN_UPDATE.sub(lambda m: f"{m[1]} = {m[2]} + {m[3]} * (1.0 / (roffset // RBLOCK + 1.0))\n", loop, count=1)
    return head + sep + loop + sep2 + tail


@attrs.frozen
class Inst:
    fn: object
    inputs: tuple


def main():
    gn = torch.nn.GroupNorm(512, 512).to("cuda", torch.bfloat16)

    def fn(x):
        return F.gelu(gn(x))

    x = torch.randn(8, 512, 16383, device="cuda", dtype=torch.bfloat16)
    edits = {f"coil R{r} w{w}": with_rconfig(r, w) for r in (1024, 2048, 4096) for w in (2, 4, 8, 16)}
    edits["coil welford-rcp (R1024 w2)"] = scalar_reciprocal
    for r, w in ((2048, 8), (4096, 16), (2048, 16)):
        edits[f"coil welford-rcp R{r} w{w}"] = lambda s, r=r, w=w: with_rconfig(r, w)(scalar_reciprocal(s))
    with torch.no_grad():
        c = against_variants("group_norm+gelu [8, 512, 16383] bf16", Inst(fn, (x,)), edits, rounds=5)
    print("coil's launch:", [ln for ln in c.module.source.splitlines() if "Launcher(" in ln])
    print("Inductor's configs:", inductor_configs())


if __name__ == "__main__":
    main()
