"""A split reduction (ir/kernel.py: Split; the policy is passes/schedule/split.py)
as two @triton.jit functions under one KernelSource:

    name          a (PARTS, row blocks) grid; program (p, x) computes the spec's
                  prelude, reduces elements [p * CHUNK, (p+1) * CHUNK) of row x
                  (of a block of XBLOCK columns) and stores each reduction's
                  partial results at workspace[x * PARTS + p]
    name_combine  one program a row (a block of columns): loads its PARTS partials
                  of every reduction, and the per-row values read after them
                  (Outer.loads), before any arithmetic; combines them, then
                  computes the per-row nodes that follow and stores the outputs

The wrapper allocates the small workspaces (one per partial result the spec
lists) and launches both kernels (codegen.py).
"""

from __future__ import annotations

import torch

from coil.backends.triton import reductions
from coil.backends.triton.handler import Emitter
from coil.backends.triton.kernel import (
    KernelContext,
    LoopStep,
    emit_outer,
    finish_node,
    issue_loads,
    loop_roots,
    mask,
    reduction_type,
    signature,
    size_operand,
)
from coil.ir.expr import Expr
from coil.ir.kernel import KernelSpec, Loop, Outer, Role, Split
from coil.ir.module import KernelSource
from coil.passes.schedule.launch import combine_name
from coil.passes.schedule.split import result_dtype


def _scope(ctx: KernelContext, axis: int, xblock: int) -> Emitter:
    """A body to emit into: XBLOCK rows per program (one, or a block of columns),
    on grid axis `axis`; a partial block only where the spec's tails say."""
    out = Emitter()
    pid = f"tl.program_id({axis})" + (".to(tl.int64)" if ctx.spec.wide_index else "")
    out.emit(f"xindex = {pid}{' * XBLOCK' if xblock != 1 else ''} + tl.arange(0, XBLOCK)[:, None]")
    mask(out, "xmask", "xindex < xnumel", "[XBLOCK, 1]", not ctx.tails.outer)
    return out


def _outer(ctx: KernelContext, out: Emitter, level: int, registers: dict[str, str], memo: dict[Expr, str]) -> None:
    for st in ctx.spec.stages:
        if isinstance(st, Outer) and st.level == level:
            emit_outer(ctx, out, st.nodes, registers, memo)


def _loop(ctx: KernelContext) -> Loop:
    (loop,) = (st for st in ctx.spec.stages if isinstance(st, Loop))
    return loop


def _partials(ctx: KernelContext, split: Split) -> list[str]:
    out = _scope(ctx, 1, split.xblock)
    registers: dict[str, str] = {}
    memo: dict[Expr, str] = {}
    out.emit("rbase = tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if ctx.spec.wide_index else ""))
    pid = "tl.program_id(0).to(tl.int64)" if ctx.spec.wide_index else "tl.program_id(0)"
    # a symbolic row's chunk (split.py: whole steps of RBLOCK) is computed from the sizes
    chunk = size_operand(split.chunk)
    out.emit(f"rstart = {pid} * {chunk}")
    emit_outer(ctx, out, split.prelude, registers, memo, store=False)  # stored once, by the combine
    loop = _loop(ctx)
    roots = sorted(loop_roots(ctx, loop), key=lambda n: n.role is not Role.REDUCTION)  # reductions first
    index_dt = torch.int64 if ctx.spec.wide_index else torch.int32
    accs = {a.node: reductions.looped_init(out, a.reduction_type, ctx.spec.node(a.node).body.dtype, index_dt)
            for a in loop.accumulators}
    out.emit(f"# this program's {split.chunk} elements of the row: {', '.join(n.name for n in roots)}")
    out.emit(f"for rstep in range(0, {chunk}, RBLOCK):")
    out.indent += 1
    out.emit("roffset = rstart + rstep")
    out.indent -= 1
    LoopStep(ctx, out, loop, {}, accs, {}).emit(registers, memo, masked=ctx.tails.inner)
    i = 0
    for a in loop.accumulators:
        for value in reductions.split_partials(out, a.reduction_type, accs[a.node], ctx.spec.node(a.node).body.dtype):
            out.emit(f"tl.store(ws_ptr{i} + {split.parts} * xindex + tl.program_id(0), {value}, xmask)")
            i += 1
    return out.lines


def _combine(ctx: KernelContext, split: Split) -> list[str]:
    out = _scope(ctx, 0, split.xblock)
    registers: dict[str, str] = {}
    memo: dict[Expr, str] = {}
    out.emit("pindex = tl.arange(0, RBLOCK)[None, :]")
    out.emit(f"pmask = (pindex < {split.parts}) & xmask")
    _outer(ctx, out, 0, registers, memo)
    for st in ctx.spec.stages:  # the per-row loads of what follows the combine, issued first
        if isinstance(st, Outer) and st.level > 0:
            issue_loads(ctx, out, st, registers, memo)
    i = 0
    tiles: dict[str, list[str]] = {}  # every reduction's partial results, all loaded before any combines
    for a in _loop(ctx).accumulators:
        n = ctx.spec.node(a.node)
        tiles[n.name] = []
        for other in reductions.split_identities(reduction_type(n), n.body.dtype):
            tiles[n.name].append(out.assign(f"tl.load(ws_ptr{i} + {split.parts} * xindex + pindex, pmask, "
                                            f"other={other})"))
            i += 1
    for a in _loop(ctx).accumulators:
        n = ctx.spec.node(a.node)
        rt, dt = reduction_type(n), n.body.dtype
        out.emit(f"# {n.name}: {rt} of {split.parts} partial results")
        value = reductions.split_combine(out, rt, tiles[n.name], dt)
        finish_node(ctx, out, n, value, result_dtype(rt, dt), registers)
    _outer(ctx, out, 1, registers, memo)
    return out.lines


def split_source(spec: KernelSpec) -> KernelSource:
    split = spec.space
    assert isinstance(split, Split)
    ctx = KernelContext.of(spec)
    ws = len(split.workspaces)
    first = ["@triton.jit", signature(spec, spec.name, ws), *_partials(ctx, split)]
    second = ["@triton.jit", signature(spec, combine_name(spec.name), ws), *_combine(ctx, split)]
    return KernelSource(spec.name, "\n".join(first + ["", ""] + second), "triton")
