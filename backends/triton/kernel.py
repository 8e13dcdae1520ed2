"""One fused kernel as a @triton.jit function: the KernelSpec that schedule_kernels
made (ir/kernel.py), spelled in Triton.  Every decision (space, stages, online
softmax, tails, launch, the loads each scope issues first, the checks asserted)
is read from the spec; this module only writes it out.

Shapes by space:

    flat        xindex [XBLOCK]; reductions over <= 1 element fold to their value
                or identity
    tiled       yindex [YBLOCK, 1] by xindex [1, XBLOCK] on a 2-D grid, so every
                load and store is coalesced along its own contiguous axis (Triton
                picks a layout per access and converts between them); a tile on
                one axis (Tiled.one_axis) takes both block numbers from program
                p: p // cdiv(xnumel, XBLOCK) and p % cdiv(xnumel, XBLOCK)
    persistent  xindex [XBLOCK, 1], rindex [1, RBLOCK] = the whole row; inner nodes
                and reduction inputs are [XBLOCK, RBLOCK] tiles, reduction results
                and outer nodes [XBLOCK, 1]; one scope, nodes in kernel order
    looped      the row in `for roffset in range(0, rnumel, RBLOCK)` steps, one
                loop per Loop stage: outer stages run between them, each loop
                evaluates its `computes` (an online sum rescaled to its max's
                running row max, `reductions.online_*`).  A loop whose length
                RBLOCK may not divide runs its full steps unmasked and the partial
                last step after them, masked (`LoopStep`)

A split reduction is written by split.py instead, as partial results over many
programs and their combination.

A scope issues first the loads its stage lists (`loads`), in that order; a mask
is a constant True where the spec says no launch config leaves a tail.  A node's value
goes to `registers` (cast to its buffer's dtype, as a store and reload would give)
for the nodes after it; it is stored where the spec gives it a store position.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs
import sympy
import torch

from coil.backends.triton import reductions
from coil.backends.triton.handler import Emitter, TritonHandler, convert, print_index, tl_dtype
from coil.ir.expr import Expr, evaluate
from coil.ir.kernel import (
    RINDEX,
    XINDEX,
    YINDEX,
    Body,
    Combo,
    Flat,
    KernelNode,
    KernelSpec,
    Loop,
    Outer,
    Read,
    Role,
    Rows,
    Tails,
    Tiled,
    Update,
)
from coil.ir.module import KernelSource
from coil.ir.shapes import py_size
from coil.passes.schedule.split import result_dtype


@attrs.frozen
class KernelContext:
    """A spec and its reads by load (where each lies in memory, its tails)."""

    spec: KernelSpec
    reads: Mapping[Expr, Read]
    part: bool = False  # a combo's member: its program id is an argument (kernel_source)

    @classmethod
    def of(cls, spec: KernelSpec, part: bool = False) -> "KernelContext":
        return cls(spec, {r.load: r for r in spec.reads}, part)

    @property
    def tails(self) -> Tails:
        assert self.spec.tails is not None, f"{self.spec.name}: the triton target plans every launch's tails"
        return self.spec.tails


# ---- pieces every kind shares ----------------------------------------------------------------


def size_operand(v: Any) -> Any:
    """A size as an operand of the kernel's Python: a number or a symbol as it is, an
    expression whole, in parentheses (`- r % RBLOCK` binds tighter than its `+`)."""
    return v if isinstance(v, int) or v.is_Symbol else f"({py_size(v)})"


def signature(spec: KernelSpec, name: str = "", workspaces: int = 0, part: bool = False) -> str:
    """Pointers (in, then out, then a split's workspaces), the sizes, then the
    block constexprs; a combo's member takes its program id after its sizes."""
    args = [p.arg for p in spec.params] + [f"ws_ptr{i}" for i in range(workspaces)]
    symbols = list(spec.symbols)  # symbolic sizes: after the numels, before the blocks
    if isinstance(spec.space, Tiled):
        args += ["ynumel", "xnumel", *symbols, "YBLOCK: tl.constexpr", "XBLOCK: tl.constexpr"]
    elif isinstance(spec.space, Combo):  # its programs; each member's XBLOCK is its own (combo_source)
        args += ["programs", "XBLOCK: tl.constexpr"]
    elif spec.kind == "pointwise":
        args += ["xnumel", *symbols, *(["pid"] if part else []), "XBLOCK: tl.constexpr"]
    else:
        args += ["xnumel", "rnumel", *symbols, "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"]
    return f"def {name or spec.name}({', '.join(args)}):"


def mask(out: Emitter, name: str, test: str, shape: str, always: bool) -> None:
    out.emit(f"{name} = tl.full({shape}, True, tl.int1)" if always else f"{name} = {test}")


def prologue(ctx: KernelContext, out: Emitter) -> None:
    tails = ctx.tails
    if isinstance(ctx.spec.space, Tiled):  # yindex on grid axis 1, xindex on axis 0
        wide = ".to(tl.int64)" if ctx.spec.wide_index else ""
        ypid, xpid = f"tl.program_id(1){wide}", f"tl.program_id(0){wide}"
        if ctx.spec.space.one_axis:  # both on axis 0: the column blocks of a row block, then the next
            out.emit(f"pid = tl.program_id(0){wide}")
            out.emit("xblocks = tl.cdiv(xnumel, XBLOCK)")
            ypid, xpid = "(pid // xblocks)", "(pid % xblocks)"
        out.emit(f"yoffset = {ypid} * YBLOCK")
        out.emit("yindex = yoffset + tl.arange(0, YBLOCK)[:, None]")
        mask(out, "ymask", "yindex < ynumel", "[YBLOCK, 1]", not tails.outer)
        out.emit(f"xoffset = {xpid} * XBLOCK")
        out.emit("xindex = xoffset + tl.arange(0, XBLOCK)[None, :]")
        mask(out, "xmask", "xindex < xnumel", "[1, XBLOCK]", not tails.inner)
        out.emit("yxmask = ymask & xmask")
        return
    pid = "tl.program_id(0).to(tl.int64)" if ctx.spec.wide_index else "tl.program_id(0)"
    if ctx.part:  # a combo's member (never int64 index math): the combo hands it its program
        assert isinstance(ctx.spec.space, Flat) and not ctx.spec.wide_index, ctx.spec.name
        pid = "pid"
    out.emit(f"xoffset = {pid} * XBLOCK")
    if isinstance(ctx.spec.space, Flat):
        out.emit("xindex = xoffset + tl.arange(0, XBLOCK)")
        mask(out, "xmask", "xindex < xnumel", "[XBLOCK]", not tails.outer)
        return
    out.emit("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
    mask(out, "xmask", "xindex < xnumel", "[XBLOCK, 1]", not tails.outer)
    arange = "tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if ctx.spec.wide_index else "")
    if not looped(ctx.spec):
        out.emit(f"rindex = {arange}")
        row_masks(out, not tails.inner)
    else:
        out.emit(f"rbase = {arange}")


def row_masks(out: Emitter, no_tail: bool = False) -> None:
    mask(out, "rmask", "rindex < rnumel", "[1, RBLOCK]", no_tail)
    out.emit("xrmask = xmask & rmask")


def _broadcast(index: str, expr: sympy.Expr, need: tuple[sympy.Symbol, ...]) -> str:
    """A store pointer must have the value's full shape even when its offset does
    not use every symbol (a 0-d output, a one-row kernel)."""
    for s in need:
        if s not in expr.free_symbols:
            index = f"{index} + 0 * {s.name}"
    return index


def finish_node(ctx: KernelContext, out: Emitter, n: KernelNode, value: str, dtype: torch.dtype,
                registers: dict[str, str], store: bool = True) -> None:
    """Make n's value visible to later nodes and store it if it leaves the kernel
    (and `store`)."""
    reg = value if dtype == n.dtype else out.assign(convert(value, dtype, n.dtype))
    registers[n.name] = reg
    if n.store is None or not store:
        return
    if n.role is Role.TILED:
        need: tuple[sympy.Symbol, ...] = (YINDEX, XINDEX)
        lanes = "yxmask"
    else:
        need = (XINDEX, RINDEX) if n.role is Role.INNER else (XINDEX,)
        lanes = "xrmask" if n.role is Role.INNER else "xmask"
    index = _broadcast(print_index(n.store), n.store, need)
    out.emit(f"tl.store({ctx.spec.ptr[n.name]} + {index}, {reg}, {lanes})")


def comment(n: KernelNode) -> str:
    what = n.reduction_type if n.reduction_type else "pointwise"
    return f"# {n.name}: {n.role.value} {what} from {', '.join(n.origins) or '?'}"


def handler(ctx: KernelContext, out: Emitter, registers: Mapping[str, str]) -> TritonHandler:
    return TritonHandler(out, ctx.spec.ptr, ctx.reads, registers, ctx.spec.ranges, "divisor" in ctx.spec.asserts)


def issue_loads(ctx: KernelContext, out: Emitter, st: Body | Loop | Outer, registers: Mapping[str, str],
                memo: dict[Expr, str]) -> None:
    """The loads the spec has the scope issue first, in its order."""
    h = handler(ctx, out, registers)
    for ld in st.loads:
        evaluate(ld, h, memo)


def node_value(ctx: KernelContext, out: Emitter, n: KernelNode, registers: Mapping[str, str],
               memo: dict[Expr, str]) -> str:
    return evaluate(n.body, handler(ctx, out, registers), memo)


# ---- one scope: flat, tiled and persistent kernels ------------------------------------------------


def emit_single_scope(ctx: KernelContext, out: Emitter) -> None:
    """Nodes in kernel order with one CSE table: every value stays in registers."""
    registers: dict[str, str] = {}
    memo: dict[Expr, str] = {}
    sums: dict[str, str] = {}  # row sums by value tile (reductions.persistent)
    (body,) = ctx.spec.stages
    assert isinstance(body, Body)
    issue_loads(ctx, out, body, registers, memo)
    for n in ctx.spec.nodes:
        out.emit(comment(n))
        if n.role is not Role.REDUCTION:
            finish_node(ctx, out, n, node_value(ctx, out, n, registers, memo), n.body.dtype, registers)
            continue
        rt = reduction_type(n)
        if isinstance(ctx.spec.space, Flat):
            v = None if ctx.spec.space.rnumel == 0 else node_value(ctx, out, n, registers, memo)
            value = reductions.trivial(out, rt, v, n.body.dtype)
        else:
            value = reductions.persistent(out, rt, node_value(ctx, out, n, registers, memo), n.body.dtype, sums)
        finish_node(ctx, out, n, value, result_dtype(rt, n.body.dtype), registers)


# ---- looped reductions -------------------------------------------------------------------------


def emit_looped(ctx: KernelContext, out: Emitter) -> None:
    registers: dict[str, str] = {}  # per-row values, visible in every later loop
    memo: dict[Expr, str] = {}
    for st in ctx.spec.stages:
        if isinstance(st, Outer):
            emit_outer(ctx, out, st.nodes, registers, memo)
        elif isinstance(st, Loop):
            _emit_loop(ctx, out, st, registers, memo)


def emit_outer(ctx: KernelContext, out: Emitter, names: tuple[str, ...], registers: dict[str, str],
               memo: dict[Expr, str], store: bool = True) -> None:
    """Per-row nodes, in order (`store`: stored, where they leave the kernel)."""
    for name in names:
        n = ctx.spec.node(name)
        out.emit(comment(n))
        finish_node(ctx, out, n, node_value(ctx, out, n, registers, memo), n.body.dtype, registers, store)


def loop_roots(ctx: KernelContext, loop: Loop) -> list[KernelNode]:
    """What a loop exists for: its reductions and the inner nodes it stores."""
    return [n for n in map(ctx.spec.node, loop.nodes) if n.is_root]


def _emit_loop(ctx: KernelContext, out: Emitter, loop: Loop, registers: dict[str, str],
               memo: dict[Expr, str]) -> None:
    if not loop.computes:
        return
    sums = {a.node: a.partner for a in loop.accumulators if a.update is Update.ONLINE_SUM and a.partner}
    # a max with online sums keeps no accumulator of its own: its value is the row max they share
    kept = {a.node: a.dtype for a in loop.accumulators if a.dtype is not None}
    wide = {m: kept[m] for m in sums.values()}
    row_max = {m: out.assign(f'tl.full([XBLOCK, 1], float("-inf"), {tl_dtype(dt)})', "_rowmax")
               for m, dt in wide.items()}
    index_dt = torch.int64 if ctx.spec.wide_index else torch.int32
    accs = {a.node: reductions.looped_init(out, a.reduction_type, ctx.spec.node(a.node).body.dtype, index_dt)
            for a in loop.accumulators if a.update is not Update.ROW_MAX}
    out.emit(f"# loop {loop.level}: {', '.join(n.name for n in loop_roots(ctx, loop))}"
             + "".join(f"; {n} online with {m}" for n, m in sums.items()))
    step = LoopStep(ctx, out, loop, sums, accs, row_max, wide)
    # literal bounds: Triton 3.6's interpreter cannot range() to a kernel argument; a symbolic
    # one (u0 + 1) whole, in parentheses: `- r % RBLOCK` binds tighter than its `+`
    rnumel = ctx.spec.group[1]
    r = size_operand(rnumel)
    if not ctx.tails.inner:
        out.emit(f"for roffset in range(0, {r}, RBLOCK):")
        step.emit(registers, memo, masked=False)
    else:  # the steps RBLOCK fills run unmasked; the partial last one after them
        out.emit(f"for roffset in range(0, {r} - {r} % RBLOCK, RBLOCK):")
        step.emit(registers, memo, masked=False)
        out.emit(f"if {r} % RBLOCK != 0:")
        out.indent += 1
        out.emit(f"roffset = {r} - {r} % RBLOCK")
        out.indent -= 1
        step.emit(registers, memo, masked=True)
    for a in loop.accumulators:
        n = ctx.spec.node(a.node)
        if a.node in row_max:
            finish_node(ctx, out, n, row_max[a.node], wide[a.node], registers)
            continue
        if a.update is Update.ONLINE_SUM:
            value = out.assign(f"tl.sum({accs[a.node][0]}, 1)[:, None]")
        else:
            value = reductions.looped_final(out, a.reduction_type, accs[a.node], n.body.dtype)
        finish_node(ctx, out, n, value, result_dtype(a.reduction_type, n.body.dtype), registers)


@attrs.frozen
class LoopStep:
    """The body of one reduction loop, emitted once per kind of step: unmasked for
    the steps that RBLOCK fills, masked for a partial last one."""

    ctx: KernelContext
    out: Emitter
    loop: Loop
    sums: Mapping[str, str]  # online sum -> its max
    accs: Mapping[str, tuple[str, ...]]
    row_max: Mapping[str, str]  # a max with online sums -> its running row max
    wide: Mapping[str, torch.dtype] = attrs.field(factory=dict)  # ... and the dtype it is kept in

    def emit(self, registers: Mapping[str, str], memo: Mapping[Expr, str], masked: bool) -> None:
        ctx, out = self.ctx, self.out
        out.indent += 1
        out.emit("rindex = roffset + rbase")
        row_masks(out, not masked)
        inner_regs = dict(registers)
        inner_memo = dict(memo)  # per-row values computed before the loop stay valid inside
        computes = [ctx.spec.node(n) for n in self.loop.computes]
        issue_loads(ctx, out, self.loop, inner_regs, inner_memo)
        tiles: dict[str, str] = {}  # a max's value tile, which its online sums rebase
        steps: dict[str, tuple[str, str, str]] = {}  # a max -> (new row max, its finite form, rescale)
        for n in computes:
            out.emit(comment(n))
            if n.name in self.sums:
                m = self.sums[n.name]
                _, safe, scale = steps[m]
                reductions.online_sum_update(out, self.accs[n.name][0], safe, scale, tiles[m])
                continue
            value = node_value(ctx, out, n, inner_regs, inner_memo)
            if n.name in self.row_max:
                if n.body.dtype != self.wide[n.name]:  # half values: the running max is float32
                    value = out.assign(f"{value}.to({tl_dtype(self.wide[n.name])})")
                tiles[n.name] = value
                steps[n.name] = reductions.online_row_max(out, self.row_max[n.name], value)
            elif n.role is Role.REDUCTION:
                reductions.looped_update(out, reduction_type(n), self.accs[n.name], value, n.body.dtype)
            else:  # stored by the loop it sits in; in a later loop only recomputed
                finish_node(ctx, out, n, value, n.body.dtype, inner_regs, store=n.name in self.loop.nodes)
        for m, (new_max, _, _) in steps.items():
            out.emit(f"{self.row_max[m]} = {new_max}")
        out.indent -= 1


def looped(spec: KernelSpec) -> bool:
    """Whether the kernel's rows run in RBLOCK steps (else one scope)."""
    return isinstance(spec.space, Rows) and spec.space.looped


def reduction_type(n: KernelNode) -> str:
    assert n.reduction_type is not None
    return n.reduction_type


# ---- the whole kernel ----------------------------------------------------------------------------


def kernel_source(spec: KernelSpec, part: bool = False) -> KernelSource:
    """The kernel's @triton.jit function; `part`: as a combo's member, a function the
    combo calls with the program id it is to run (combo_source)."""
    if spec.group[0] == 0:  # every buffer is empty: the wrapper does not launch it
        return KernelSource(spec.name, f"@triton.jit\n{signature(spec)}\n    pass  # xnumel = 0", "triton")
    ctx = KernelContext.of(spec, part)
    out = Emitter()
    prologue(ctx, out)
    if looped(spec):
        emit_looped(ctx, out)
    else:
        emit_single_scope(ctx, out)
    head = ["@triton.jit", signature(spec, part=part)]
    return KernelSource(spec.name, "\n".join(head + out.lines), "triton")


def combo_source(combo: KernelSpec, members: Sequence[KernelSpec]) -> KernelSource:
    """A combo's kernel: each program calls the member whose programs it falls in
    (Combo.starts), with the member's pointers among the combo's, its size, its
    own program id and its XBLOCK."""
    space = combo.space
    assert isinstance(space, Combo) and tuple(m.name for m in members) == space.members
    arg = {(p.name, p.role): p.arg for p in combo.params}
    out = Emitter()
    out.emit("pid = tl.program_id(0)")
    for i, (m, start) in enumerate(zip(members, space.starts)):
        ln = m.launches[0]
        end = start + ln.grid[0]
        args = [arg[(p.name, p.role)] for p in m.params] + [str(ln.sizes[0])]
        args += [f"pid - {start}" if start else "pid", str(ln.config.xblock)]
        test = "if" if i == 0 else "elif"
        out.emit(f"{test} pid < {end}:" if i < len(members) - 1 else "else:")
        out.emit(f"    {m.name}({', '.join(args)})")
    head = ["@triton.jit", signature(combo)]
    return KernelSource(combo.name, "\n".join(head + out.lines), "triton")
