"""Probe: the launches combo kernels save in real models (passes/combine.py,
Options.combo_launches).  For each model named on the command line
(bench/hf_models.py names; default all of them), in $MODE (infer, the default, or
train: forward and backward), the graphs AOTAutograd hands a backend at the `cpu`
size, planned by coil for the triton target up to its wrapper, with combos off
and on: the kernel launches of each, and the combos' members.  Runs on the CPU
(no kernel is compiled or run).

    python3 bench/probes/combo_census.py [model ...]      (MODE=train for training)"""
import os
import sys
import warnings

sys.path.insert(0, os.getcwd())

import coil  # noqa: E402
from bench.hf_models import ALL_MODELS  # noqa: E402
from bench.probes.common import aot_graphs  # noqa: E402
from coil.ir.kernel import Combo  # noqa: E402
from coil.ir.wrapper import KernelCall, WrapperProgram  # noqa: E402


def launches(name: str, mode: str) -> tuple[int, int, list[int]]:
    """(launches without combos, with them, the members of each combo) over the
    model's graphs."""
    off = on = 0
    members: list[int] = []
    for gm, ins in aot_graphs(name, mode):
        for combos in (False, True):
            opts = coil.Options(target="triton", combo_launches=combos, graph_cache=False)
            w = coil.default_pipeline().run(gm, ins, until="wrap", options=opts)
            assert isinstance(w, WrapperProgram)
            n = sum(1 for ln in w.lines if isinstance(ln, KernelCall))
            if combos:
                on += n
                members += [len(c.space.members) for c in w.combos if isinstance(c.space, Combo)]
            else:
                off += n
    return off, on, members


def main() -> None:
    warnings.filterwarnings("ignore")
    mode = os.environ.get("MODE", "infer")
    print(f"| model ({mode}) | launches | with combos | combos | members |")
    print("|---|--:|--:|--:|---|")
    total_off = total_on = 0
    for name in sys.argv[1:] or list(ALL_MODELS):
        off, on, members = launches(name, mode)
        total_off, total_on = total_off + off, total_on + on
        print(f"| {name} | {off} | {on} | {len(members)} | {', '.join(map(str, members)) or '-'} |", flush=True)
    print(f"| all | {total_off} | {total_on} | | |")


if __name__ == "__main__":
    main()
