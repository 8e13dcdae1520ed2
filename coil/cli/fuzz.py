"""`coil fuzz [--examples N] [--seed S] [--target T]`: draw random aten graphs (the
property tests' generator, coil.properties.graphs) and compare coil with eager
PyTorch on each.

One line per example; for each mismatch or crash, a reproducer (the inputs'
shapes, strides and dtypes, and the FX graph's code); then, unless --no-shrink,
the first failure of each kind shrunk by hypothesis to a small graph, as a
runnable script;
finally "N examples, K mismatches".  Exits 1 when any example failed.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from coil.options import TARGETS, Options

if TYPE_CHECKING:  # coil.properties imports hypothesis: only `coil fuzz` itself needs it
    from coil.properties.fuzzing import Failure
    from coil.properties.strategies import DrawnGraph

# the generator's DEFAULT_DTYPES by name, so `coil --help` needs no hypothesis
# (tests/test_newcomer.py holds the two equal)
DTYPE_NAMES = {name: getattr(torch, name) for name in ("float32", "float64", "float16", "bfloat16", "int32", "int64")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--examples", type=int, default=100, help="graphs to draw (default: 100)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed: one seed, one sequence of graphs")
    parser.add_argument("--target", choices=TARGETS, default="reference",
                        help="reference (default), cpp, triton, or auto (triton on CUDA, else cpp)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the inputs live")
    parser.add_argument("--max-nodes", type=int, default=8, help="instructions per graph (default: 8)")
    parser.add_argument("--max-inputs", type=int, default=3, help="inputs per graph (default: 3)")
    parser.add_argument("--max-rank", type=int, default=3, help="dims per input (default: 3)")
    parser.add_argument("--max-dim", type=int, default=6,
                        help="size of a dim (default: 6; larger sizes reach looped reductions and block edges)")
    parser.add_argument("--dtypes", default=",".join(DTYPE_NAMES),
                        help=f"comma-separated input dtypes (default: {','.join(DTYPE_NAMES)})")
    parser.add_argument("--sanitize", action="store_true", help="poison every freed buffer (Options.sanitize)")
    parser.add_argument("--no-shrink", dest="shrink", action="store_false",
                        help="do not minimize the first failure of each kind")
    parser.add_argument("--quiet", action="store_true", help="a progress count instead of one line per example")


def _dtypes(spec: str) -> tuple[torch.dtype, ...]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in DTYPE_NAMES]
    if unknown or not names:
        raise SystemExit(f"coil fuzz: unknown dtypes {unknown}; choose from {', '.join(DTYPE_NAMES)}")
    return tuple(DTYPE_NAMES[n] for n in names)


def _summary(drawn: DrawnGraph) -> str:
    nodes = sum(1 for n in drawn.gm.graph.nodes if n.op == "call_function")
    shapes = " ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in drawn.inputs)
    return f"{nodes:2d} nodes  {shapes}  [{' '.join(drawn.instructions)}]"


def print_failure(failure: Failure, title: str) -> None:
    print(f"--- {title}: {failure.kind}")
    print(failure.message.rstrip())
    print("inputs:")
    print("  " + failure.drawn.describe().replace("\n", "\n  "))
    print("graph:")
    print("  " + failure.drawn.code.strip().replace("\n", "\n  "))
    print("---")


def _printer(quiet: bool, total: int) -> Callable[[int, DrawnGraph, Failure | None], None]:
    def on_example(i: int, drawn: DrawnGraph, failure: Failure | None) -> None:
        if failure is not None:
            print(f"{i:4d} {failure.kind.upper():9s}{_summary(drawn)}")
            print_failure(failure, f"example {i}")
        elif quiet:
            if i % 10 == 0 or i == total:
                print(f"{i}/{total} examples", flush=True)
        else:
            print(f"{i:4d} ok       {_summary(drawn)}", flush=True)

    return on_example


def run(args: argparse.Namespace) -> int:
    try:
        from coil.properties.fuzzing import FuzzRun, fuzz, shrink
        from coil.properties.strategies import graphs
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "hypothesis":
            raise
        raise SystemExit("coil fuzz: needs hypothesis, which is missing here: pip install hypothesis") from e
    if args.target == "triton" and args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton runs CPU tensors in its interpreter
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("coil fuzz: --device cuda, but CUDA is not available")
    strategy = graphs(max_nodes=args.max_nodes, max_inputs=args.max_inputs, max_rank=args.max_rank,
                      max_dim=args.max_dim, dtypes=_dtypes(args.dtypes), device=args.device)
    env = Options.from_env()
    options = env.replace(target=args.target, sanitize=args.sanitize or env.sanitize)
    result: FuzzRun = fuzz(strategy, options, args.examples, args.seed, _printer(args.quiet, args.examples))
    if args.shrink:
        for signature in dict.fromkeys(f.signature for f in result.failures):
            small = shrink(strategy, options, args.examples, args.seed, signature)
            if small is not None:
                print_failure(small, "smallest failing graph (shrunk)")
                print(small.drawn.reproducer(options))
    print(f"{result.examples} examples, {len(result.failures)} mismatches")
    return 1 if result.failures else 0
