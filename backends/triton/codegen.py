"""The `triton` target: one @triton.jit kernel per fused kernel, defined at module
level in output_code.py (Triton reads the source from that file), launched by the
wrapper with a grid and block sizes chosen from the static sizes.

    triton_poi_fused_add_0[grid(4096, 1024)](arg0_1, buf0, 4096, XBLOCK=1024, num_warps=4)

A reduction of one long row launches as two kernels, partial results then their
combination (split.py).  Kernels on CUDA tensors launch under `torch.cuda.device(...)`; kernels on CPU
tensors need the Triton interpreter (TRITON_INTERPRET=1), which the call checks.

A kernel with run-time checks (handler.py: tl.device_assert) launches on CUDA with
`debug=True` (Triton compiles device asserts only then) and `sanitize_overflow=False`
(which debug would otherwise turn on: asserts on every int32 overflow, where eager
wraps), as Inductor launches its kernels with indirect indexing; a failed check is
then a device-side assert, as in eager.  On CPU tensors the launch runs under
`interpreter_checks`, which turns the interpreter's asserts on and raises eager's
error for a failed check.
"""

from __future__ import annotations

import dataclasses
import re
from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from coil.backends.triton.helpers import helpers_for
from coil.backends.triton.kernel import down_columns, kernel_source, row_reductions
from coil.backends.triton.split import Split, launched_names, split_launch, split_of, split_source
from coil.backends.triton.tiling import Tile, tiling
from coil.backends.triton.runtime import Launch, LaunchConfig, cdiv, heuristic_config
from coil.backends.wrapper import owns_storage
from coil.ir.bounds import runtime_checks
from coil.ir.buffers import ExternBuffer
from coil.ir.expr import check_error
from coil.ir.fused import FusedKernel
from coil.ir.lowered import resolve_kernel
from coil.ir.module import KernelSource
from coil.ir.wrapper import ExternCall, KernelCall, MultiOutputLine, ReinterpretView, WrapperProgram
from coil.options import Options
from coil.passes.kernel_model import kernel_buffers

# launch options of a CUDA kernel whose device asserts must exist
CHECKED_LAUNCH = {"debug": True, "sanitize_overflow": False}


def _kernel(program: WrapperProgram, name: str) -> FusedKernel:
    for k in program.kernels:
        if k.name == name:
            return k
    raise KeyError(name)


def kernel_device(program: WrapperProgram, k: FusedKernel) -> str:
    return program.layout(k.nodes[0]).device


def asserts(k: FusedKernel, program: WrapperProgram) -> bool:
    """Whether k's source has device asserts: a run-time check of an index (on
    CUDA) or of any value (interpreted, on CPU tensors; handler.check)."""
    cuda = kernel_device(program, k).startswith("cuda")
    bodies = (b.body for b in kernel_buffers(k, program.schedule_graph))
    return any(c.kind == "index" or not cuda for body in bodies for c in runtime_checks(body))


_CHECK_MESSAGE = re.compile(r"coil check: error=(\w+) dim=(-?\d+) size=(\d+)")


@contextmanager
def interpreter_checks() -> Iterator[None]:
    """Around an interpreted launch of a kernel with device asserts (CPU tensors).
    Triton's interpreter runs tl.device_assert only when its options have debug on,
    which a launch cannot ask for: they are turned on for the launch (overflow
    sanitizing off), and an assert that fails becomes eager's error for the check
    its message names (without the bad value, which the message cannot carry).  A
    Triton whose interpreter keeps no such options leaves the asserts off: the
    clamp after each still keeps reads in bounds."""
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    saved = getattr(builder, "options", None)
    if builder is None or not dataclasses.is_dataclass(saved) or not hasattr(saved, "debug"):
        yield
        return
    fields = {"debug": True, **({"sanitize_overflow": False} if hasattr(saved, "sanitize_overflow") else {})}
    builder.options = dataclasses.replace(saved, **fields)  # type: ignore[type-var]
    try:
        yield
    except Exception as e:
        m = _CHECK_MESSAGE.search(str(e))
        if m is None:
            raise
        raise check_error(m.group(1), None, int(m.group(3)), int(m.group(2))) from e
    finally:
        builder.options = saved


def launch_kind(k: FusedKernel, program: WrapperProgram, tile: Tile | None) -> str:
    """pointwise | tiled | persistent | reduction | columns: how the runtime
    launches k (`tile`: its tiling, from `tiling`)."""
    if tile is not None:
        return "tiled"
    return "columns" if down_columns(k, program) else k.kind


def launch_of(line: KernelCall, program: WrapperProgram) -> tuple[str, list[int], LaunchConfig] | Split | None:
    """How a launch line's kernel runs: (grid, size arguments, config) for one launch
    on the heuristic config, its Split for a split reduction (split.py launches
    those), None when there is nothing to compute."""
    k = _kernel(program, line.kernel)
    xnumel, rnumel = k.group
    if xnumel == 0:
        return None
    tile = tiling(k, program)
    kind = launch_kind(k, program, tile)
    if tile is not None:
        ny, nx = tile.ynumel, tile.xnumel
        cfg = heuristic_config(kind, ny, nx)
        return f"grid2({ny}, {nx}, {cfg.yblock}, {cfg.xblock})", [ny, nx], cfg
    split = split_of(k, program)
    if split is not None:
        return split
    cfg = heuristic_config(kind, xnumel, rnumel, row_reductions(k, program))
    return f"grid({xnumel}, {cfg.xblock})", [xnumel] + ([] if k.kind == "pointwise" else [rnumel]), cfg


def launches(line: KernelCall, program: WrapperProgram) -> tuple[list[str], list[Launch], list[str]] | None:
    """A launch line's kernel launches, with the lines before them (workspaces) and
    after them (their frees); None when there is nothing to compute.  A kernel with
    device asserts launches on CUDA with CHECKED_LAUNCH."""
    k = _kernel(program, line.kernel)
    plan = launch_of(line, program)
    if plan is None:
        return None
    if isinstance(plan, Split):
        before, out, after = split_launch(k, plan, list(line.args), kernel_device(program, k))
    else:
        grid_text, sizes, cfg = plan
        if cfg.yblock:
            ny, nx = sizes
            g = (cdiv(nx, cfg.xblock), cdiv(ny, cfg.yblock), 1)
        else:
            g = (cdiv(sizes[0], cfg.xblock), 1, 1)
        meta = (*cfg.meta().items(), ("num_warps", cfg.num_warps))
        before, out, after = [], [Launch(k.name, g, grid_text, tuple(line.args), tuple(sizes), meta)], []
    if asserts(k, program) and kernel_device(program, k).startswith("cuda"):
        out = [ln.with_meta(CHECKED_LAUNCH) for ln in out]
    return before, out, after


def aligned_by_allocation(program: WrapperProgram) -> tuple[frozenset[str], frozenset[str]]:
    """(inputs, unknown): the graph inputs whose storage the kernels launch on
    (directly or through views), whose 16-byte alignment the call checks; and the
    kernel arguments whose alignment is not fixed ahead (an alias an extern
    returns).  Everything else a kernel takes was allocated by coil or returned
    fresh by an aten kernel: aligned on every call alike."""
    graph = program.buffer_graph
    inputs = set(program.inputs)
    base: dict[str, str] = {}
    fresh: dict[str, bool] = {}
    for ln in program.lines:
        if isinstance(ln, ReinterpretView):
            base[ln.name] = base.get(ln.base, ln.base)
        elif isinstance(ln, ExternCall):
            fresh[ln.name] = owns_storage(program, ln.name)
        elif isinstance(ln, MultiOutputLine):
            parent = graph.get(ln.extern)
            returns = resolve_kernel(parent.kernel)._schema.returns if isinstance(parent, ExternBuffer) else ()
            fresh[ln.name] = not any(r.alias_info is not None for r in returns)
    read: set[str] = set()
    unknown: set[str] = set()
    for ln in program.lines:
        if isinstance(ln, KernelCall):
            for a in ln.args:
                root = base.get(a, a)
                if root in inputs:
                    read.add(root)
                elif not fresh.get(root, True):
                    unknown.add(a)
    return frozenset(read), frozenset(unknown)


def precompile_specs(program: WrapperProgram) -> list[str]:
    """One `(kernel, argument dtypes and sizes, launch meta, device)` line per plain
    launch, for runtime.precompile."""
    graph = program.buffer_graph
    out = []
    for ln in program.lines:
        if not isinstance(ln, KernelCall):
            continue
        plan = launch_of(ln, program)
        if not isinstance(plan, tuple):
            continue
        _, sizes, cfg = plan
        k = _kernel(program, ln.kernel)
        args = [str(graph.layout(a).dtype) for a in ln.args] + [str(n) for n in sizes]
        meta = ", ".join(f"{key!r}: {v}" for key, v in (*cfg.meta().items(), ("num_warps", cfg.num_warps)))
        if asserts(k, program):
            meta += "".join(f", {key!r}: {v}" for key, v in CHECKED_LAUNCH.items())
        out.append(f"    ({k.name}, ({', '.join(args)},), {{{meta}}}, {kernel_device(program, k)!r}),")
    return out


def launch_decisions(program: WrapperProgram) -> list[tuple[str, str, str, str]]:
    """(kernel, kind, launch, why) for every kernel launch of the program: the grid
    and config the wrapper will print, and the rule that chose them."""
    from coil.backends.triton.runtime import CHAIN_REDUCTIONS
    from coil.backends.triton.split import SPLIT_MAX_ROWS, SPLIT_MIN, combine_name

    out = []
    for ln in program.lines:
        if not isinstance(ln, KernelCall):
            continue
        k = _kernel(program, ln.kernel)
        xnumel, rnumel = k.group
        plan = launch_of(ln, program)
        if plan is None:
            out.append((k.name, k.kind, "-", "nothing to compute: no launch"))
            continue
        if isinstance(plan, Split):
            split = plan
            blocks = split.row_blocks(xnumel)
            if split.xblock > 1:
                why = (f"{xnumel} columns reduced down {rnumel} rows: {split.parts} programs a block of "
                       f"{split.xblock} columns each reduce {split.chunk} rows into workspaces")
                merge = f"one program a block of {split.xblock} columns merges its partials in a fixed order"
            else:
                why = (f"{xnumel} row(s) (<= {SPLIT_MAX_ROWS}) of {rnumel} (>= {SPLIT_MIN}): {split.parts} "
                       f"programs a row each reduce {split.chunk} elements into workspaces")
                merge = "one program a row merges its partials in a fixed order"
            out.append((k.name, "split", f"({split.parts}, {blocks}) XBLOCK={split.xblock}, RBLOCK={split.rblock}, "
                        f"num_warps={split.num_warps}", why))
            out.append((combine_name(k.name), "combine", f"({blocks},) XBLOCK={split.xblock}, "
                        f"RBLOCK={split.combine_rblock}, num_warps={split.combine_warps}", merge))
            continue
        grid_text, _, cfg = plan
        launch = f"{grid_text} {cfg.as_kwargs()}"
        tile = tiling(k, program)
        kind = launch_kind(k, program, tile)
        if tile is not None:
            why = (f"a transposed read: {cfg.yblock}x{cfg.xblock} tiles, each access along its contiguous axis; "
                   + ("programs start down the columns, as the output is written" if tile.transposed
                      else "programs start along the rows"))
        elif k.kind == "pointwise":
            why = f"{cfg.xblock} elements a program, {cfg.xblock / (32 * cfg.num_warps):g} a thread"
        elif k.kind == "persistent":
            chained = row_reductions(k, program)
            if chained >= CHAIN_REDUCTIONS:
                why = (f"{chained} chained row reductions (>= {CHAIN_REDUCTIONS}): one row a program, "
                       f"{cfg.num_warps} warp(s), so each reduction stays within few warps")
            else:
                why = f"rows of {rnumel} held in registers, {cfg.xblock} row(s) a program"
        elif kind == "columns":
            why = (f"reduced down the columns of what it reads: {cfg.xblock} neighbouring columns a program, "
                   f"{cfg.rblock} rows a step")
        else:
            why = f"rows of {rnumel} looped in steps of {cfg.rblock}, {cfg.xblock} row(s) a program"
        out.append((k.name, kind, launch, why))
    return out


class TritonBackend:
    language = "triton"

    def header(self, options: Options) -> list[str]:
        return [
            "import triton",
            "import triton.language as tl",
            "from triton.language.extra import libdevice",
            "from coil.backends.triton.runtime import Launcher, autotuned, fast_launch, grid, grid2, interpreted, precompile, raw_stream",
            "from coil.backends.triton.codegen import interpreter_checks",
        ]

    def kernels(self, program: WrapperProgram, options: Options) -> tuple[KernelSource, ...]:
        out = []
        for k in program.kernels:
            split = split_of(k, program)
            out.append(kernel_source(k, program, options.emulate_precision_casts) if split is None
                       else split_source(k, program, split, options.emulate_precision_casts))
        return tuple(out)

    def definitions(self, kernels: Sequence[KernelSource], options: Options,
                    program: WrapperProgram) -> list[str]:
        out: list[str] = []
        native = any(kernel_device(program, k).startswith("cuda") for k in program.kernels)
        for text in helpers_for((k.source for k in kernels), native) + [k.source for k in kernels]:
            out += ["", text, ""]
        if native and not options.autotune:  # bound launches: Triton's binding runs once (runtime.Launcher)
            guard = _guard_device(program)
            _, unknown = aligned_by_allocation(program)
            out.append("")
            for ln in program.lines:
                if not isinstance(ln, KernelCall) or (planned := launches(ln, program)) is None:
                    continue
                device = kernel_device(program, _kernel(program, ln.kernel))
                bind = device == guard and not unknown.intersection(ln.args)
                out += [launch.definition(bind) for launch in planned[1]]
            specs = precompile_specs(program) if options.precompile else []
            if specs:  # compiled now, several at a time, instead of one by one at their first launch
                out += ["", "precompile([", *specs, "])"]
        if options.autotune:
            # the launch lines stay as they are; on CUDA the wrapper times a few
            # configs at the first call and launches the winner instead
            cache = f", cache_dir={options.cache_dir!r}" if options.cache_dir else ""
            for src in kernels:
                if len(launched_names(src)) > 1:  # a split reduction: two fixed launches (split.py)
                    continue
                k = _kernel(program, src.name)
                out.append(f"{k.name} = autotuned({k.name}, {launch_kind(k, program, tiling(k, program))!r}{cache})")
        return out

    def call(self, line: KernelCall, program: WrapperProgram, options: Options) -> list[str]:
        k = _kernel(program, line.kernel)
        planned = launches(line, program)
        if planned is None:
            return [f"pass  # {k.name}: nothing to compute (xnumel = 0)"]
        before, out, after = planned
        if kernel_device(program, k).startswith("cuda"):
            if options.autotune:
                return [*before, *(ln.line() for ln in out), *after]
            return [*before, *(ln.bound_line("stream0") for ln in out), *after]
        body = [ln.line() for ln in out]
        if asserts(k, program):
            body = ["with interpreter_checks():", *("    " + ln for ln in body)]
        return [*before, *body, *after]

    def prologue(self, program: WrapperProgram, options: Options) -> list[str]:
        """The lines at the top of `call`, inside the device guard: on CUDA the
        current stream that the bound launches take, or None when a graph input
        they launch on is not 16-byte aligned (then they launch through Triton's
        path, which specializes on alignment)."""
        guard = _guard_device(program)
        if guard is None:
            return []
        graph = program.buffer_graph
        inputs, _ = aligned_by_allocation(program)
        # a CPU scalar tensor a CUDA kernel reads (x * torch.tensor(2.0)) goes to the device first
        moved = [f"{n} = {n}.to({guard!r})" for n in sorted(inputs, key=program.inputs.index)
                 if not graph.layout(n).device.startswith("cuda")]
        if options.autotune:
            return moved
        index = torch.device(guard).index or 0
        if not inputs:
            return [*moved, f"stream0 = raw_stream({index})"]
        ptrs = " | ".join(f"{n}.data_ptr()" for n in sorted(inputs, key=program.inputs.index))
        return [*moved, f"stream0 = None if ({ptrs}) & 15 else raw_stream({index})"]

    def guard_device(self, program: WrapperProgram) -> str | None:
        """The CUDA device current while `call` runs (device_guard's), if any."""
        return _guard_device(program)

    def device_guard(self, program: WrapperProgram) -> str | None:
        """The `with` line the wrapper puts around the body of `call`."""
        if not program.kernels:
            return None
        cuda = _guard_device(program)
        if cuda is not None:
            return f"with torch.cuda.device({cuda!r}):"
        return "with interpreted():"


def _guard_device(program: WrapperProgram) -> str | None:
    """The CUDA device of the call's device guard: its first CUDA kernel's."""
    return next((d for d in (kernel_device(program, k) for k in program.kernels)
                 if d.startswith("cuda")), None)
