"""Device probe: the launch config of a persistent row normalisation.  LayerNorm after
a residual add (BERT, BART, DistilBERT) and RMSNorm (Llama), bf16, at the models
suite's rows (2048 rows of 512 at the small size, of 2048 at the large; ViT's 1576
rows of 512): Inductor, coil as it launches, and coil's kernel relaunched with
other (XBLOCK, warps), the grid following XBLOCK.  Inductor on CUDA launches rows
of 256-1024 on one warp, 1024 // RBLOCK rows a program (its persistent_reduction
heuristic: a reduction within one warp needs no shared memory or barrier); coil's
heuristic gave 8 rows of 512 on 4 warps.  Run from the repository root on a CUDA
machine; ROUNDS (default 3) interleaved rounds."""
import os
import re
import sys
import types

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.probes.common import compile_coil, timed_rounds, variant  # noqa: E402

CONFIGS = ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (8, 2), (4, 4), (8, 4), (8, 8))
LAUNCH = re.compile(r"Launcher\((\w+), \((\d+), 1, 1\), \((\d+), (\d+)\), \{'XBLOCK': (\d+), 'RBLOCK': (\d+), "
                    r"'num_warps': (\d+)\}\)")


def add_layer_norm(x, r, w, b):
    return torch.nn.functional.layer_norm(x + r, (x.shape[-1],), w, b, 1e-5)


def rms_norm(x, r, w, b):
    h = (x + r).float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(torch.bfloat16)


def relaunched(source: str, xblock: int, num_warps: int) -> str:
    def sub(m: re.Match) -> str:
        rows = int(m.group(3))
        return (f"Launcher({m.group(1)}, ({-(-rows // xblock)}, 1, 1), ({m.group(3)}, {m.group(4)}), "
                f"{{'XBLOCK': {xblock}, 'RBLOCK': {m.group(6)}, 'num_warps': {num_warps}}})")
    return LAUNCH.sub(sub, source)


def main():
    rounds = int(os.environ.get("ROUNDS", "3"))
    for fn in (add_layer_norm, rms_norm):
        for rows, width in ((2048, 512), (1576, 512), (2048, 2048)):
            torch._dynamo.reset()
            dev = torch.device("cuda")
            x, r = (torch.randn(rows, width, device=dev, dtype=torch.bfloat16) for _ in range(2))
            w, b = (torch.randn(width, device=dev, dtype=torch.bfloat16) for _ in range(2))
            inst = types.SimpleNamespace(fn=fn, inputs=[x, r, w, b])
            ref = fn(*inst.inputs)
            ind = torch.compile(fn)
            ind(*inst.inputs)
            c = compile_coil(inst)
            m = LAUNCH.search(c.module.source)
            if m is None:
                print(f"== {fn.__name__} {rows}x{width}: no persistent launch in coil's module", flush=True)
                continue
            print(f"   coil launches {m.group(0)}", flush=True)
            fns = {"inductor": lambda: ind(*inst.inputs), "coil": lambda: c(*inst.inputs)}
            for xb, nw in CONFIGS:
                v = variant(c, relaunched(c.module.source, xb, nw))
                torch.testing.assert_close(v(*inst.inputs)[0], ref, rtol=2e-2, atol=2e-2)
                fns[f"XBLOCK {xb}, {nw} warp(s)"] = lambda v=v: v(*inst.inputs)
            timed_rounds(f"{fn.__name__} {rows}x{width}", fns, rounds)


if __name__ == "__main__":
    main()
