"""`coil explain FILE.py:FN [--target T] [--out DIR]`: the seed's tables for a user's
function (realize and why, read_writes, fusion decisions, last_usage, frees, reuse,
peak), the externs that split fusion (aten calls kept whole other than matmul,
convolution and attention) and the buffer-lifetime chart, written to
DIR/lifetimes.png.

FILE.py defines FN and its example inputs: `FN_inputs` or `example_inputs`, each a
tuple/list of tensors or a function returning one.  The function is traced with
make_fx; the pipeline runs through `wrap` (kernel source is `coil demo`'s and
debug_dir's business).  The KernelProgram follows, each kernel's space, stages,
accumulators and launches (its nodes one a line); on the triton target a last table
gives each launch's grid and config and the rule that chose them (split, tiled,
chained reductions...)."""

from __future__ import annotations

import argparse
import os
import sys

from coil import default_pipeline
from coil.cli.common import USAGE_ERROR, describe_inputs, fx_listing, ir_of, load_function, run_stages, trace
from coil.errors import CoilError
from coil.ir.buffers import BufferGraph
from coil.ir.kernel import KernelProgram
from coil.ir.memory import MemoryPlan
from coil.ir.printer import show
from coil.ir.printer_kernel import show_kernel_program
from coil.ir.wrapper import WrapperProgram
from coil.options import TARGETS, Options
from coil.passes.pipeline import resolve_target
from coil.report import extern_report, full_report, lifetime_chart, section, table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="FILE.py:FN", help="the file and the function in it to explain")
    parser.add_argument("--target", choices=TARGETS, default="auto",
                        help="kernel target whose names the tables use (default: auto)")
    parser.add_argument("--out", default="coil_explain", metavar="DIR",
                        help="where lifetimes.png goes (default: ./coil_explain/)")


def launch_table(program: WrapperProgram) -> str:
    from coil.backends.triton.codegen import launch_decisions

    rows = launch_decisions(program)
    return table([("kernel", "kind", "launch", "why"), *rows]) if rows else "no kernel launches"


def run(args: argparse.Namespace) -> int:
    try:
        fn, inputs = load_function(args.spec)
        gm = trace(fn, inputs)
    except CoilError as e:
        print(f"coil explain: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    options = Options.from_env().replace(target=args.target)
    try:
        stages = run_stages(default_pipeline(), gm, inputs, options, until="wrap")
    except CoilError as e:
        print(f"coil explain: compile failed: {e}", file=sys.stderr)
        return 1
    bg, plan = ir_of(stages, BufferGraph), ir_of(stages, MemoryPlan)
    name = getattr(fn, "__name__", args.spec)
    print(f"coil explain {args.spec}: {name}({describe_inputs(inputs)})\n")
    print(section("FX graph (make_fx)", fx_listing(gm)))
    print(full_report(bg, plan))
    print(section("externs that split fusion (not matmul, convolution or attention)", extern_report(bg)))
    kernels = ir_of(stages, KernelProgram)
    print(section("kernels (schedule_kernels): space, stages, accumulators, launches and why",
                  show_kernel_program(kernels, bodies=False)))
    program = ir_of(stages, WrapperProgram)
    print(section("wrapper (wrap): allocations, calls, dels", show(program)))
    if resolve_target(options, inputs).target == "triton":
        body = launch_table(program)
        if options.autotune:
            body += "\n(autotune is on: on CUDA each kernel but a split one launches the fastest of a few configs instead)"
        print(section("launches (schedule_kernels, as triton launches them): grid, config and why", body))
    os.makedirs(args.out, exist_ok=True)
    path = lifetime_chart(plan, os.path.join(args.out, "lifetimes.png"), title=f"{name}: buffer lifetimes")
    print(f"lifetime chart: {path}")
    return 0
