"""`coil demo [--target T] [--size N M]`: compile the seed's function

    fn(a, b, c) = ((a + b) * c.relu()).sum(dim=-1)

on three float32 tensors and show every stage: the stage trace, each IR as printed,
the realize table, the read_writes, output_code.py (wrapper and kernels); then run
it and check the result against eager PyTorch (both against a float64 reference)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import logging
import os
import sys
from typing import Any, Iterator

import torch

from coil import default_pipeline
from coil.cli.common import describe_inputs, fx_listing, ir_of, run_stages, trace
from coil.errors import CoilError
from coil.ir.buffers import BufferGraph
from coil.ir.fused import FusedSchedule
from coil.ir.memory import MemoryPlan
from coil.ir.module import CompiledModule
from coil.ir.printer import show
from coil.ir.schedule import ScheduleGraph
from coil.options import TARGETS, Options
from coil.report import fusion_report, last_usage_report, peak_report, read_writes_report, realize_report, section


def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The seed's function."""
    return ((a + b) * c.relu()).sum(dim=-1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=TARGETS, default="auto",
                        help="auto (default): triton with CUDA, else cpp; or triton, cpp, reference")
    parser.add_argument("--size", nargs=2, type=int, default=(64, 128), metavar=("N", "M"),
                        help="shape of the three inputs (default: 64 128)")


def choose_target(requested: str, cuda: bool) -> str:
    """`auto` resolves as the pipeline would for the demo's inputs."""
    if requested != "auto":
        return requested
    return "triton" if cuda else "cpp"


def available_target(target: str) -> tuple[str, str | None]:
    """The target to use and, when it had to change, why.  Only a backend that cannot
    be imported falls back to the reference target; any other failure is a failure."""
    from coil.backends.kernel_gen import BACKENDS

    try:
        importlib.import_module(BACKENDS[target][0])
    except ImportError as e:
        return "reference", f"the {target} backend cannot be imported ({type(e).__name__}: {e})"
    return target, None


@contextlib.contextmanager
def captured_trace() -> Iterator[list[str]]:
    """The `coil.trace` lines of one compile, kept in a list.  The demo prints the
    trace as its own section, so it listens to the logger itself rather than
    through Options.trace's stderr handler (which would print every line twice)."""
    lines: list[str] = []
    logger = logging.getLogger("coil.trace")

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, level = Keep(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def show_stages(stages: dict[str, Any]) -> None:
    """Each stage's printed IR, with the seed's tables where they belong."""
    for i, (name, ir) in enumerate(stages.items()):
        if isinstance(ir, CompiledModule):
            print(section(f"{i + 1}. {name} -> CompiledModule: output_code.py (target {ir.target})", ir.source))
            continue
        print(section(f"{i + 1}. {name} -> {type(ir).__name__}", show(ir)))
        if isinstance(ir, BufferGraph):
            print(section("realize table", realize_report(ir)))
        if isinstance(ir, ScheduleGraph):
            print(section("read_writes", read_writes_report(ir)))
        if isinstance(ir, FusedSchedule):
            print(section("fusion decisions", fusion_report(ir)))
        if isinstance(ir, MemoryPlan):
            print(section("last_usage, frees and peak", last_usage_report(ir) + "\n\n" + peak_report(ir)))


def within_eager_error(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor) -> tuple[bool, float, float]:
    """Whether coil's result is as close to the exact one (computed in float64) as
    eager's is: at most 4x eager's largest error, plus assert_close's tolerances for
    the dtype.  Comparing coil with eager directly fails on long reductions, where
    both round differently (a sum of 1024 terms adds in another order) yet neither
    is wrong.  Returns (ok, coil's error, eager's error)."""
    exact = exact.to(torch.float64)
    err_eager = float((eager.to(torch.float64) - exact).abs().max()) if exact.numel() else 0.0
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return False, float("inf"), err_eager
    err = (got.to(torch.float64) - exact).abs()
    rtol, atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                  torch.float64: (1e-7, 1e-7)}.get(eager.dtype, (1.3e-6, 1e-5))
    bound = 4 * err_eager + atol + rtol * exact.abs()
    same = (got == eager) | (torch.isnan(got) & torch.isnan(eager))  # infinities and NaNs where eager has them
    ok = bool(((err <= bound) | same).all())
    return ok, float(err.max()) if err.numel() else 0.0, err_eager


def check_against_eager(module: CompiledModule, inputs: tuple[torch.Tensor, ...], cache_dir: str | None = None) -> bool:
    from coil.backends.runtime import load_module

    compiled = load_module(module, cache_dir)
    # the wrapper's call(args) frees its inputs; hand it clones so eager sees the originals
    (got,) = compiled(*(t.clone() for t in inputs))
    ok, err, err_eager = within_eager_error(got, fn(*inputs), fn(*(t.double() for t in inputs)))
    versus = f"largest error against float64: coil {err:.3g}, eager {err_eager:.3g}"
    if not ok:
        print(f"result DIFFERS from eager ({versus})")
        return False
    print(f"result matches eager ({versus})")
    return True


def run(args: argparse.Namespace) -> int:
    cuda = torch.cuda.is_available()
    if args.target == "triton" and not cuda:
        # the Triton interpreter runs kernels on CPU tensors; it reads this once, at import
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("note: triton was imported before TRITON_INTERPRET=1 could be set; kernels may fail on CPU")
        os.environ["TRITON_INTERPRET"] = "1"
    target, why = available_target(choose_target(args.target, cuda))
    if why:
        print(f"note: {why}; falling back to --target reference\n")
    device = "cuda" if cuda and target == "triton" else "cpu"
    torch.manual_seed(0)
    inputs = tuple(torch.randn(*args.size, device=device) for _ in range(3))

    print(f"coil demo: the seed's function on {describe_inputs(inputs)}, target {target}\n")
    print(section("source", inspect.getsource(fn).rstrip()))
    gm = trace(fn, inputs)
    print(section("FX graph (make_fx)", fx_listing(gm)))
    options = Options.from_env().replace(target=target, trace=False)
    try:
        with captured_trace() as lines:
            stages = run_stages(default_pipeline(), gm, inputs, options)
    except CoilError as e:
        print(f"coil demo: compile failed: {e}", file=sys.stderr)
        return 1
    print(section("stage trace (coil.trace)", "\n".join(f"[coil] {ln}" for ln in lines)))
    show_stages(stages)
    return 0 if check_against_eager(ir_of(stages, CompiledModule), inputs, options.cache_dir) else 1
