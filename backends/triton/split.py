"""Split reductions: a reduction of a few long rows (a full sum, a loss's mean,
per-sample norms of a small batch) spread over many programs, then combined.

One program per row is how every other reduction kernel runs; for a kernel with
one long row that leaves one SM doing the work (a latency-bound gather per
element, as cross_entropy's final mean has, took 20 us that way on an H200 for
16,384 rows).  A kernel of at most SPLIT_MAX_ROWS rows of at least SPLIT_MIN
elements is emitted as two @triton.jit functions under one KernelSource:

    name          a (PARTS, rows) grid; program (p, x) reduces elements
                  [p * CHUNK, (p+1) * CHUNK) of row x and stores each reduction's
                  partial results at workspace[x * PARTS + p]
    name_combine  one program per row: loads the row's PARTS partials of every
                  reduction, combines them, then computes the per-row nodes that
                  follow and stores the outputs

A reduction down the columns of what it reads (x.sum(0) of a row-major x:
kernel_model.reads_down_columns) splits the same way, over blocks of XBLOCK
neighbouring columns instead of single rows, when its rows are long and its column
blocks too few to fill the GPU: program (p, c) reduces rows [p * CHUNK, (p+1) *
CHUNK) of columns [c * XBLOCK, (c+1) * XBLOCK), each step a coalesced XBLOCK x
RBLOCK tile, and the combine takes a block of columns a program.

The wrapper allocates the small workspaces (PARTS elements each: one per
reduction, three for Welford's mean / M2 / count, two for argmax's value and
index; `reductions.split_partials`) and launches both kernels; the order of the
additions is fixed, so results do not vary from run to run.  Only single-loop
kernels split: no online softmax, no row-wide value after a reduction (those need
the reduced value back in every program), no max/min of bools.
"""

from __future__ import annotations

import attrs
import torch

from coil.backends.triton import reductions
from coil.backends.triton.handler import Emitter
from coil.backends.triton.kernel import (
    KernelContext,
    _comment,
    _handler,
    _LoopStep,
    _mask,
    _needed,
    _rt,
    codegen_context,
    finish_node,
    loop_levels,
    online_sums,
    signature_of,
)
from coil.backends.triton.runtime import Launch, _warps, cdiv, next_power_of_2
from coil.ir.expr import Expr, evaluate
from coil.ir.fused import FusedKernel
from coil.ir.module import KernelSource
from coil.ir.wrapper import WrapperProgram
from coil.options import TRITON_SPLITS
from coil.passes.kernel_model import splits_rows

SPLIT_MIN, SPLIT_MAX_ROWS = TRITON_SPLITS.row_min, TRITON_SPLITS.max_rows  # tests import them here

# a row at least SPLIT_MIN long is split (below it one program is quick enough), in
# kernels of at most SPLIT_MAX_ROWS rows (more rows already give every SM programs):
# both in passes/kernel_model.py, whose fuse rules know them too
# programs of the first stage, all rows together: about PROGRAMS, each reducing at
# least MIN_CHUNK elements of its row, at most MAX_PARTS per row
PROGRAMS = 1024
MIN_CHUNK = 256
MAX_PARTS = 1024
# column splits: columns at least COLUMN_SPLIT_MIN rows long, in blocks of
# COLUMN_XBLOCK, COLUMN_RBLOCK rows a step, at least MIN_COLUMN_CHUNK rows a program.
# H200, ViT's training step: its LayerNorm weight gradients (1576 rows x 512 columns,
# below the 2048 this was) ran on 16 programs, 13 µs each, where Inductor's split
# pair takes about 3
COLUMN_SPLIT_MIN = 1024
COLUMN_XBLOCK = 32
COLUMN_RBLOCK = 64
MIN_COLUMN_CHUNK = 128
MAX_COLUMN_PARTS = 256


@attrs.frozen
class Split:
    parts: int  # programs of the first stage per row
    chunk: int  # elements each reduces: a multiple of rblock
    rblock: int
    num_warps: int
    workspaces: tuple[tuple[str, torch.dtype], ...]  # (reduction node, dtype) of each partial stored
    xblock: int = 1  # rows a program (kernel rows: columns in memory, for a column split)

    def row_blocks(self, rows: int) -> int:
        return cdiv(rows, self.xblock)

    @property
    def combine_rblock(self) -> int:
        return next_power_of_2(self.parts)

    @property
    def combine_warps(self) -> int:
        return _warps(self.xblock * self.combine_rblock)


def split_of(k: FusedKernel, program: WrapperProgram) -> Split | None:
    """The split of k, or None when k runs as one kernel."""
    if k.kind != "reduction":
        return None
    ctx = codegen_context(k, program, True)
    if not ctx.columns and not splits_rows(k.group, TRITON_SPLITS):
        return None
    return _split_of_context(ctx)


def _split_of_context(ctx: KernelContext) -> Split | None:
    reds = [b for b in ctx.nodes if ctx.roles[b.name] == "reduction"]
    if online_sums(ctx) or not reds:
        return None
    level = loop_levels(ctx)
    if any(level[b.name] != 0 for b in ctx.nodes if ctx.roles[b.name] != "outer"):
        return None
    if any(ctx.bodies[b.name].dtype == torch.bool and _rt(b) in ("max", "min") for b in reds):
        return None  # a bool max's partials would be int1 tiles, which tl.max does not take
    rows, rnumel = ctx.kernel.group
    workspaces = tuple((b.name, dt) for b in reds for dt in reductions.split_dtypes(_rt(b), ctx.bodies[b.name].dtype))
    if ctx.columns:
        xblock = min(COLUMN_XBLOCK, next_power_of_2(rows))
        rblock = COLUMN_XBLOCK * COLUMN_RBLOCK // xblock  # narrow blocks take more rows a step
        # at most MAX_COLUMN_PARTS partials a column: the combine holds XBLOCK x parts of them
        per_block = min(MAX_COLUMN_PARTS, PROGRAMS // cdiv(rows, xblock))
        if per_block < 2 or rnumel < COLUMN_SPLIT_MIN:
            return None  # enough column blocks to fill the GPU, or short columns: one loop a block
        chunk = max(rblock, MIN_COLUMN_CHUNK, next_power_of_2(cdiv(rnumel, per_block)))
        return Split(cdiv(rnumel, chunk), chunk, rblock, _warps(xblock * rblock), workspaces, xblock)
    per_row = max(1, min(MAX_PARTS, PROGRAMS // rows))
    chunk = max(MIN_CHUNK, next_power_of_2(cdiv(rnumel, per_row)))
    rblock = min(chunk, 2048)
    return Split(cdiv(rnumel, chunk), chunk, rblock, _warps(rblock), workspaces)


def _signature(ctx: KernelContext, split: Split, name: str) -> str:
    sig = signature_of(ctx.kernel, ctx.params)
    ws = ", ".join(f"ws_ptr{i}" for i in range(len(split.workspaces)))
    return sig.replace(f"def {ctx.kernel.name}(", f"def {name}(").replace(", xnumel,", f", {ws}, xnumel,")


def _row_scope(out: Emitter, ctx: KernelContext, axis: int, xblock: int) -> None:
    """XBLOCK rows per program (one, or a block of columns), on grid axis `axis`."""
    pid = f"tl.program_id({axis})" + (".to(tl.int64)" if ctx.int64 else "")
    if xblock == 1:
        out.emit(f"xindex = {pid} + tl.arange(0, XBLOCK)[:, None]")
        out.emit("xmask = tl.full([XBLOCK, 1], True, tl.int1)")
        return
    out.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
    _mask(out, "xmask", "xindex < xnumel", "[XBLOCK, 1]", ctx.kernel.group[0] % xblock == 0)


def _outer(ctx: KernelContext, out: Emitter, level: int, levels: dict[str, int], registers: dict[str, str],
           memo: dict[Expr, str], store: bool) -> None:
    for b in ctx.nodes:
        if ctx.roles[b.name] == "outer" and levels[b.name] == level:
            out.emit(_comment(b, "outer"))
            body = ctx.bodies[b.name]
            finish_node(ctx, out, b, evaluate(body, _handler(ctx, out, registers), memo), body.dtype, registers,
                        store)


def _scope(ctx: KernelContext, row_axis: int,
           xblock: int) -> tuple[Emitter, dict[str, int], dict[str, str], dict[Expr, str]]:
    """A body to emit into (XBLOCK rows per program, on grid axis `row_axis`), the
    nodes' loop levels, and empty tables of per-row registers and of CSE."""
    out = Emitter()
    out.indent = 1
    _row_scope(out, ctx, row_axis, xblock)
    return out, loop_levels(ctx), {}, {}


def _partials(ctx: KernelContext, split: Split) -> list[str]:
    out, levels, registers, memo = _scope(ctx, 1, split.xblock)
    out.emit("rbase = tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if ctx.int64 else ""))
    pid = "tl.program_id(0).to(tl.int64)" if ctx.int64 else "tl.program_id(0)"
    out.emit(f"rstart = {pid} * {split.chunk}")
    _outer(ctx, out, 0, levels, registers, memo, store=False)  # stored once, by the combine
    reds = [b for b in ctx.nodes if ctx.roles[b.name] == "reduction"]
    roots = reds + [b for b in ctx.nodes if ctx.roles[b.name] == "inner" and b.name in ctx.ptr]
    index_dt = torch.int64 if ctx.int64 else torch.int32
    accs = {b.name: reductions.looped_init(out, _rt(b), ctx.bodies[b.name].dtype, index_dt) for b in reds}
    out.emit(f"# this program's {split.chunk} elements of the row: {', '.join(b.name for b in roots)}")
    out.emit(f"for rstep in range(0, {split.chunk}, RBLOCK):")
    out.indent += 1
    out.emit("roffset = rstart + rstep")
    out.indent -= 1
    _LoopStep(ctx, out, 0, levels, _needed(ctx, roots, {}), {}, accs, {}).emit(registers, memo, masked=True)
    i = 0
    for b in reds:
        for value in reductions.split_partials(out, _rt(b), accs[b.name], ctx.bodies[b.name].dtype):
            out.emit(f"tl.store(ws_ptr{i} + {split.parts} * xindex + tl.program_id(0), {value}, xmask)")
            i += 1
    return out.lines


def _combine(ctx: KernelContext, split: Split) -> list[str]:
    out, levels, registers, memo = _scope(ctx, 0, split.xblock)
    out.emit("pindex = tl.arange(0, RBLOCK)[None, :]")
    out.emit(f"pmask = (pindex < {split.parts}) & xmask")
    _outer(ctx, out, 0, levels, registers, memo, store=True)
    i = 0
    for b in (b for b in ctx.nodes if ctx.roles[b.name] == "reduction"):
        rt, dt = _rt(b), ctx.bodies[b.name].dtype
        out.emit(f"# {b.name}: {rt} of {split.parts} partial results")
        tiles = []
        for other in reductions.split_identities(rt, dt):
            tiles.append(out.assign(f"tl.load(ws_ptr{i} + {split.parts} * xindex + pindex, pmask, other={other})"))
            i += 1
        value = reductions.split_combine(out, rt, tiles, dt)
        finish_node(ctx, out, b, value, reductions.result_dtype(rt, dt), registers)
    _outer(ctx, out, 1, levels, registers, memo, store=True)
    return out.lines


def combine_name(kernel: str) -> str:
    return f"{kernel}_combine"


def launched_names(src: KernelSource) -> list[str]:
    """The @triton.jit functions of a kernel's source that the wrapper launches."""
    second = combine_name(src.name)
    return [src.name, second] if f"def {second}(" in src.source else [src.name]


def split_source(k: FusedKernel, program: WrapperProgram, split: Split,
                 emulate_precision_casts: bool = True) -> KernelSource:
    ctx = codegen_context(k, program, emulate_precision_casts)
    first = ["@triton.jit", _signature(ctx, split, k.name), *_partials(ctx, split)]
    second = ["@triton.jit", _signature(ctx, split, combine_name(k.name)), *_combine(ctx, split)]
    return KernelSource(k.name, "\n".join(first + ["", ""] + second), "triton")


def split_launch(k: FusedKernel, split: Split, args: list[str], device: str
                 ) -> tuple[list[str], list[Launch], list[str]]:
    """The wrapper's lines: workspaces (before), both launches, then the
    workspaces freed (after)."""
    ws = [f"ws{k.name.rsplit('_', 1)[-1]}_{i}" for i in range(len(split.workspaces))]
    rows, rnumel = k.group
    blocks = split.row_blocks(rows)
    before = [f"{w} = empty_strided(({rows * split.parts},), (1,), dtype={dt}, device={device!r})"
              for w, (_, dt) in zip(ws, split.workspaces)]
    tensors, sizes = (*args, *ws), (rows, rnumel)
    launches = [
        Launch(k.name, (split.parts, blocks, 1), f"({split.parts}, {blocks})", tensors, sizes,
               (("XBLOCK", split.xblock), ("RBLOCK", split.rblock), ("num_warps", split.num_warps))),
        Launch(combine_name(k.name), (blocks, 1, 1), f"({blocks},)", tensors, sizes,
               (("XBLOCK", split.xblock), ("RBLOCK", split.combine_rblock), ("num_warps", split.combine_warps))),
    ]
    return before, launches, [f"del {', '.join(ws)}"]
