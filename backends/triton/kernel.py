"""One fused kernel as a @triton.jit function, following passes/kernel_model.py.

Shapes by kernel kind:

    pointwise   xindex [XBLOCK]; every node is outer (reductions over <= 1 element
                fold to their value or identity)
    tiled       a pointwise kernel some of whose accesses run along the other axis
                (x + y.t()): the iteration space as rows x columns, yindex
                [YBLOCK, 1] by xindex [1, XBLOCK] on a 2-D grid, so every load
                and store is coalesced along its own contiguous axis (Triton
                picks a layout per access and converts between them)
    persistent  xindex [XBLOCK, 1], rindex [1, RBLOCK] = the whole row; inner nodes
                and reduction inputs are [XBLOCK, RBLOCK] tiles, reduction results
                and outer nodes [XBLOCK, 1]; one scope, nodes in kernel order
    reduction   the row in `for roffset in range(0, rnumel, RBLOCK)` steps.  A node
                runs in the first loop after every reduction it depends on is
                finished (`loop_levels`); per-row values (outer nodes, reduction
                results) live between loops, inner values are recomputed from their
                bodies in each loop that needs them rather than kept across loops.
                A sum of exp(v - max v) over the row (softmax, log-softmax,
                cross_entropy) runs in its max's own loop as an online softmax
                (`online_sums`): each step rescales the lanes' sums to the row's
                running max, which is also the max node's value, so the row is
                read once for both.  A loop whose length RBLOCK may not divide
                runs its full steps unmasked and the partial last step after
                them, masked (`_LoopStep`)

A reduction kernel with one long row (a full sum, a loss's mean) is emitted by
split.py instead, as partial results over many programs and their combination.

Every scope issues its loads from memory first (`hoist_loads`); a mask is a
constant True where no launch config can leave a tail (`no_tails`).

A node's value goes to `registers` (cast to its buffer's dtype, as a store and
reload would give) for the nodes after it; it is stored only when its buffer is a
kernel parameter (plan.removed buffers never are).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import attrs
import sympy
import torch

from coil.backends.triton import reductions
from coil.backends.triton.handler import Emitter, TritonHandler, convert, print_index, tl_dtype
from coil.backends.triton.runtime import candidate_configs, heuristic_config
from coil.backends.triton.tiling import Tile, contiguous_axis, store_offset, tiled_map, tiling
from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import (
    Cast,
    Expr,
    Load,
    Op,
    evaluate,
    loads,
    masked_value,
    read_names,
    rewrite,
    substitute_symbols,
    xsyms,
)
from coil.ir.fused import FusedKernel
from coil.ir.indexing import simplify_index
from coil.ir.layout import Layout
from coil.ir.module import KernelSource
from coil.ir.wrapper import WrapperProgram
from coil.passes.kernel_model import (
    RINDEX,
    XINDEX,
    YINDEX,
    Param,
    kernel_buffers,
    kernel_layouts,
    kernel_params,
    kernel_ranges,
    node_role,
    reads_down_columns,
    store_position,
    var_map,
)

INT32_LIMIT = 2**31
@attrs.frozen
class KernelContext:
    """What codegen needs to know about one kernel, computed once."""

    kernel: FusedKernel
    nodes: tuple[ComputedBuffer, ...]
    roles: Mapping[str, str]  # node -> reduction | outer | inner
    bodies: Mapping[str, Expr]  # node -> body over xindex / rindex
    params: tuple[Param, ...]
    ptr: Mapping[str, str]  # buffer -> in_ptrN / out_ptrN
    layouts: Mapping[str, Layout]
    ranges: Mapping[sympy.Symbol, int]
    int64: bool  # index math in int64: some offset or the iteration space reaches 2**31
    tile: Tile | None = None  # tiled kernels: the flat range on (yindex, xindex)
    columns: bool = False  # a looped reduction down the columns of what it reads

    @property
    def config_kind(self) -> str:
        """The kind runtime.heuristic_config picks this kernel's launch by."""
        return "tiled" if self.tile is not None else "columns" if self.columns else self.kernel.kind

    @property
    def store_axis(self) -> str:
        """A tiled kernel's first store's contiguous axis (x when none is)."""
        tile = self.tile
        assert tile is not None
        stored = {p.name for p in self.params if p.role != "in"}
        return next((contiguous_axis(store_offset(b, tile)) or "x" for b in self.nodes if b.name in stored), "x")

    @property
    def rnumel(self) -> int:
        return self.kernel.group[1]

    def deps(self, b: ComputedBuffer) -> list[str]:
        """Nodes of this kernel whose values b reads."""
        inside = {n.name for n in self.nodes}
        return [n for n in read_names(b.body) if n in inside and n != b.name]


def kernel_context(k: FusedKernel, program: WrapperProgram) -> KernelContext:
    g = program.schedule_graph
    nodes = kernel_buffers(k, g)
    params = kernel_params(k, g, program.plan.removed)
    layouts = kernel_layouts(g)
    roles: dict[str, str] = {}
    bodies: dict[str, Expr] = {}
    largest = max([layouts[p.name].storage_size() for p in params] + [k.group[0] * max(k.group[1], 1)])
    tile = tiling(k, program)
    if tile is not None:
        for b in nodes:
            roles[b.name] = "tiled"
            bodies[b.name] = substitute_symbols(b.body, tiled_map(b, tile))
        return KernelContext(k, nodes, roles, bodies, params, {p.name: p.arg for p in params}, layouts,
                             tile.ranges, largest >= INT32_LIMIT, tile)
    for b in nodes:
        role = node_role(b, k.group)
        assert role is not None, f"{b.name} does not fit {k.name}'s group {k.group}"
        roles[b.name] = role
        m = var_map(b, k.group)
        if k.kind == "pointwise":  # reductions over <= 1 element: r* = 0
            m = {s: e.xreplace({RINDEX: sympy.Integer(0)}) for s, e in m.items()}
        bodies[b.name] = substitute_symbols(b.body, m)
    columns = k.kind == "reduction" and reads_down_columns(nodes, layouts, k.group)
    return KernelContext(k, nodes, roles, bodies, params, {p.name: p.arg for p in params}, layouts,
                         kernel_ranges(k.group), largest >= INT32_LIMIT, None, columns)


# ---- pieces every kind shares ----------------------------------------------------------------


def signature(ctx: KernelContext) -> str:
    if ctx.tile is not None:
        args = [p.arg for p in ctx.params] + ["ynumel", "xnumel", "YBLOCK: tl.constexpr", "XBLOCK: tl.constexpr"]
        return f"def {ctx.kernel.name}({', '.join(args)}):"
    return signature_of(ctx.kernel, ctx.params)


def signature_of(k: FusedKernel, params: tuple[Param, ...]) -> str:
    """Pointers (in, then out), the sizes, then the block constexprs."""
    args = [p.arg for p in params] + ["xnumel"]
    if k.kind != "pointwise":
        args.append("rnumel")
    args.append("XBLOCK: tl.constexpr")
    if k.kind != "pointwise":
        args.append("RBLOCK: tl.constexpr")
    return f"def {k.name}({', '.join(args)}):"


def count_reductions(nodes: Iterable[ComputedBuffer]) -> int:
    """How many of a kernel's nodes are reductions (a long chain of them changes
    the persistent launch config: runtime.CHAIN_REDUCTIONS)."""
    return sum(1 for b in nodes if b.reduction_type)


def row_reductions(k: FusedKernel, program: WrapperProgram) -> int:
    return count_reductions(kernel_buffers(k, program.schedule_graph))


def down_columns(k: FusedKernel, program: WrapperProgram) -> bool:
    """Whether k is a looped reduction down the columns of what it reads."""
    g = program.schedule_graph
    return k.kind == "reduction" and reads_down_columns(kernel_buffers(k, g), kernel_layouts(g), k.group)


def no_tails(ctx: KernelContext) -> tuple[bool, bool]:
    """(outer, inner): whether every block size a launch may use (the heuristic's
    and autotuning's, all powers of two) divides that size, so the range has no
    tail and its mask is a constant True (Triton then drops the masking).  Outer:
    xnumel (tiled: ynumel); inner: rnumel (tiled: xnumel)."""
    if ctx.tile is not None:
        ny, nx = ctx.tile.ynumel, ctx.tile.xnumel
        cfgs = (heuristic_config("tiled", ny, nx), *candidate_configs("tiled", ny, nx))
        return (all(ny % c.yblock == 0 for c in cfgs), all(nx % c.xblock == 0 for c in cfgs))
    n, r = ctx.kernel.group
    kind = ctx.config_kind
    chained = count_reductions(ctx.nodes)
    cfgs = (heuristic_config(kind, n, r, chained), *candidate_configs(kind, n, r, chained))
    return (all(n % c.xblock == 0 for c in cfgs), kind != "pointwise" and all(r % c.rblock == 0 for c in cfgs))


def _mask(out: Emitter, name: str, test: str, shape: str, always: bool) -> None:
    out.emit(f"{name} = tl.full({shape}, True, tl.int1)" if always else f"{name} = {test}")


def prologue(ctx: KernelContext, out: Emitter) -> None:
    outer, inner = no_tails(ctx)
    if ctx.tile is not None:  # yindex on grid axis 1, xindex on axis 0
        wide = ".to(tl.int64)" if ctx.int64 else ""
        out.emit(f"yoffset = tl.program_id(1){wide} * YBLOCK")
        out.emit("yindex = yoffset + tl.arange(0, YBLOCK)[:, None]")
        _mask(out, "ymask", "yindex < ynumel", "[YBLOCK, 1]", outer)
        out.emit(f"xoffset = tl.program_id(0){wide} * XBLOCK")
        out.emit("xindex = xoffset + tl.arange(0, XBLOCK)[None, :]")
        _mask(out, "xmask", "xindex < xnumel", "[1, XBLOCK]", inner)
        out.emit("yxmask = ymask & xmask")
        return
    pid = "tl.program_id(0).to(tl.int64)" if ctx.int64 else "tl.program_id(0)"
    out.emit(f"xoffset = {pid} * XBLOCK")
    if ctx.kernel.kind == "pointwise":
        out.emit("xindex = xoffset + tl.arange(0, XBLOCK)")
        _mask(out, "xmask", "xindex < xnumel", "[XBLOCK]", outer)
        return
    out.emit("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
    _mask(out, "xmask", "xindex < xnumel", "[XBLOCK, 1]", outer)
    arange = "tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if ctx.int64 else "")
    if ctx.kernel.kind == "persistent":
        out.emit(f"rindex = {arange}")
        _row_masks(out, inner)
    else:
        out.emit(f"rbase = {arange}")


def _row_masks(out: Emitter, no_tail: bool = False) -> None:
    _mask(out, "rmask", "rindex < rnumel", "[1, RBLOCK]", no_tail)
    out.emit("xrmask = xmask & rmask")


def _broadcast(index: str, expr: sympy.Expr, need: tuple[sympy.Symbol, ...]) -> str:
    """A store pointer must have the value's full shape even when its offset does
    not use every symbol (a 0-d output, a one-row kernel)."""
    for s in need:
        if s not in expr.free_symbols:
            index = f"{index} + 0 * {s.name}"
    return index


def finish_node(ctx: KernelContext, out: Emitter, b: ComputedBuffer, value: str, dtype: torch.dtype,
                registers: dict[str, str], store: bool = True) -> None:
    """Make b's value visible to later nodes and store it if it leaves the kernel
    (and `store`)."""
    reg = value if dtype == b.layout.dtype else out.assign(convert(value, dtype, b.layout.dtype))
    registers[b.name] = reg
    if b.name not in ctx.ptr or not store:
        return
    role = ctx.roles[b.name]
    if role == "tiled":
        assert ctx.tile is not None
        pos = sympy.expand(store_offset(b, ctx.tile) - b.layout.offset)
        need: tuple[sympy.Symbol, ...] = (YINDEX, XINDEX)
        mask = "yxmask"
    else:
        pos = sympy.expand(store_position(b, ctx.kernel.group) - b.layout.offset)
        need = (XINDEX, RINDEX) if role == "inner" else (XINDEX,)
        mask = "xrmask" if role == "inner" else "xmask"
    index = _broadcast(print_index(pos), pos, need)
    out.emit(f"tl.store({ctx.ptr[b.name]} + {index}, {reg}, {mask})")


def _comment(b: ComputedBuffer, role: str) -> str:
    what = b.reduction_type if b.reduction_type else "pointwise"
    return f"# {b.name}: {role} {what} from {', '.join(b.origins) or '?'}"


def _handler(ctx: KernelContext, out: Emitter, registers: Mapping[str, str]) -> TritonHandler:
    cuda = ctx.layouts[ctx.nodes[0].name].device.startswith("cuda")
    return TritonHandler(out, ctx.ptr, ctx.layouts, registers, ctx.ranges, cuda)


# ---- pointwise and persistent: one scope ------------------------------------------------------


def hoist_loads(ctx: KernelContext, out: Emitter, nodes: list[ComputedBuffer], registers: Mapping[str, str],
                memo: dict[Expr, str]) -> None:
    """Issue the scope's loads from memory first, as Inductor does, so their
    latency overlaps the arithmetic that follows (loads of values this kernel
    computes come from registers and stay where they are)."""
    inside = {b.name for b in ctx.nodes}
    h = _handler(ctx, out, registers)
    found = [ld for b in nodes for ld in loads(ctx.bodies[b.name]) if ld.name not in inside and ld.name not in registers]
    if ctx.tile is not None:
        found.sort(key=_tile_load_order(ctx))
    for ld in found:
        evaluate(ld, h, memo)


def _tile_load_order(ctx: KernelContext) -> Callable[[Load], int]:
    """A tiled kernel's loads, those contiguous along its store's axis first and
    those along the other axis last.  Triton computes in the layout of the last
    load and converts the earlier ones to it, so x + y.t() in this order converts x
    to y's layout and the sum back for its store: two shared-memory round trips a
    tile against one the other way round.  Yet on the H200 this order ran faster
    in both runs of bench/probes/tile_load_order.py (f32 8192x8192): x + y.t() 190.6
    against 192.0 µs, then 192.2 against 192.8; y.t() + x 196.5 against 197.4 on a
    plain tile, then 192.1 against 192.7 on a transposed one.  So it is kept."""
    axis = ctx.store_axis

    def key(ld: Load) -> int:
        along = contiguous_axis(ctx.layouts[ld.name].offset_of(ld.index))
        return 1 if along is None else (0 if along == axis else 2)

    return key


def emit_single_scope(ctx: KernelContext, out: Emitter) -> None:
    """Nodes in kernel order with one CSE table: every value stays in registers."""
    registers: dict[str, str] = {}
    memo: dict[Expr, str] = {}
    hoist_loads(ctx, out, list(ctx.nodes), registers, memo)
    for b in ctx.nodes:
        role = ctx.roles[b.name]
        out.emit(_comment(b, role))
        h = _handler(ctx, out, registers)
        body = ctx.bodies[b.name]
        if role != "reduction":
            finish_node(ctx, out, b, evaluate(body, h, memo), body.dtype, registers)
            continue
        rt = b.reduction_type
        assert rt is not None
        if ctx.kernel.kind == "pointwise":
            v = None if ctx.rnumel == 0 else evaluate(body, h, memo)
            value = reductions.trivial(out, rt, v, body.dtype)
        else:
            value = reductions.persistent(out, rt, evaluate(body, h, memo), body.dtype)
        finish_node(ctx, out, b, value, reductions.result_dtype(rt, body.dtype), registers)


# ---- looped reductions -------------------------------------------------------------------------


def _expanded(ctx: KernelContext, body: Expr) -> Expr:
    """`body` with the inner nodes of this kernel it reads replaced by their own
    (expanded) bodies, cast to their buffers' dtypes as a store would."""
    inner = {b.name: b for b in ctx.nodes if ctx.roles[b.name] == "inner"}

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.name in inner:
            b = inner[e.name]
            sub = _expanded(ctx, ctx.bodies[b.name])
            sub = sub if sub.dtype == b.layout.dtype else Cast(sub, b.layout.dtype)
            return sub if e.mask is None else masked_value(sub, e.mask)
        return None

    return rewrite(body, fn)


def online_sums(ctx: KernelContext) -> dict[str, str]:
    """Sum reductions of exp(v - m), m the max reduction of the same v in this
    kernel: sum node -> max node.  Floating v only."""
    if ctx.kernel.kind != "reduction":
        return {}
    maxes = {b.name: b for b in ctx.nodes if b.reduction_type == "max" and ctx.bodies[b.name].dtype.is_floating_point}
    out: dict[str, str] = {}
    for b in ctx.nodes:
        if b.reduction_type != "sum" or not maxes:
            continue
        e = _expanded(ctx, ctx.bodies[b.name])
        if not (isinstance(e, Op) and e.name == "exp" and isinstance(e.args[0], Op) and e.args[0].name == "sub"):
            continue
        v, m = e.args[0].args
        if (isinstance(m, Load) and m.name in maxes and m.dtype == e.dtype == v.dtype
                and _expanded(ctx, ctx.bodies[m.name]) == v):
            out[b.name] = m.name
    return out


def loop_levels(ctx: KernelContext, online: Mapping[str, str] | None = None) -> dict[str, int]:
    """For inner and reduction nodes, the loop they run in; for outer nodes, the
    loop before which they run.  A node comes after every loop whose reduction it
    reads (directly, or through the inner nodes it recomputes); an online sum runs
    in its max's loop."""
    online = online or {}
    level: dict[str, int] = {}
    for b in ctx.nodes:
        if b.name in online:
            level[b.name] = level[online[b.name]]
            continue
        level[b.name] = max(
            (level[d] + (1 if ctx.roles[d] == "reduction" else 0) for d in ctx.deps(b)), default=0
        )
    return level


def _needed(ctx: KernelContext, roots: list[ComputedBuffer], online: Mapping[str, str]) -> set[str]:
    """Roots plus the inner nodes they read, transitively (recomputed in the loop);
    an online sum reads its max's value instead of its own body."""
    by_name = {b.name: b for b in ctx.nodes}
    seen: set[str] = set()
    stack = [b.name for b in roots]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in online:
            stack.append(online[n])
            continue
        stack += [d for d in ctx.deps(by_name[n]) if ctx.roles[d] == "inner"]
    return seen


def emit_looped(ctx: KernelContext, out: Emitter) -> None:
    online = online_sums(ctx)
    level = loop_levels(ctx, online)
    looped = [level[b.name] for b in ctx.nodes if ctx.roles[b.name] != "outer"]
    nloops = max(looped) + 1 if looped else 0
    registers: dict[str, str] = {}  # per-row values, visible in every later loop
    memo: dict[Expr, str] = {}
    for k in range(nloops + 1):
        for b in ctx.nodes:
            if ctx.roles[b.name] == "outer" and level[b.name] == k:
                out.emit(_comment(b, "outer"))
                body = ctx.bodies[b.name]
                finish_node(ctx, out, b, evaluate(body, _handler(ctx, out, registers), memo), body.dtype, registers)
        if k < nloops:
            _emit_loop(ctx, out, k, level, registers, memo, online)


def _emit_loop(ctx: KernelContext, out: Emitter, k: int, level: Mapping[str, int],
               registers: dict[str, str], memo: dict[Expr, str], online: Mapping[str, str]) -> None:
    roots = [b for b in ctx.nodes if level[b.name] == k and (
        ctx.roles[b.name] == "reduction" or (ctx.roles[b.name] == "inner" and b.name in ctx.ptr))]
    if not roots:
        return
    needed = _needed(ctx, roots, online)
    reds = [b for b in roots if ctx.roles[b.name] == "reduction"]
    sums = {b.name: online[b.name] for b in reds if b.name in online}  # online sum -> its max
    # a max with online sums keeps no accumulator of its own: its value is the row max they share
    wide = {m: torch.float64 if ctx.bodies[m].dtype == torch.float64 else torch.float32 for m in sums.values()}
    row_max = {m: out.assign(f'tl.full([XBLOCK, 1], float("-inf"), {tl_dtype(dt)})', "_rowmax")
               for m, dt in wide.items()}
    index_dt = torch.int64 if ctx.int64 else torch.int32
    accs = {b.name: reductions.looped_init(out, _rt(b), ctx.bodies[b.name].dtype, index_dt)
            for b in reds if b.name not in row_max}
    out.emit(f"# loop {k}: {', '.join(b.name for b in roots)}"
             + "".join(f"; {n} online with {m}" for n, m in sums.items()))
    step = _LoopStep(ctx, out, k, level, needed, sums, accs, row_max)
    # literal bounds: Triton 3.6's interpreter cannot range() to a kernel argument
    r = ctx.rnumel
    if no_tails(ctx)[1]:
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
    for b in reds:
        body = ctx.bodies[b.name]
        if b.name in row_max:
            finish_node(ctx, out, b, row_max[b.name], wide[b.name], registers)
            continue
        if b.name in sums:
            value = out.assign(f"tl.sum({accs[b.name][0]}, 1)[:, None]")
        else:
            value = reductions.looped_final(out, _rt(b), accs[b.name], body.dtype)
        finish_node(ctx, out, b, value, reductions.result_dtype(_rt(b), body.dtype), registers)


@attrs.frozen
class _LoopStep:
    """The body of one reduction loop, emitted once per kind of step: unmasked for
    the steps that RBLOCK fills, masked for a partial last one."""

    ctx: KernelContext
    out: Emitter
    k: int  # the loop's level
    level: Mapping[str, int]
    needed: set[str]
    sums: Mapping[str, str]  # online sum -> its max
    accs: Mapping[str, tuple[str, ...]]
    row_max: Mapping[str, str]  # a max with online sums -> its running row max

    def emit(self, registers: Mapping[str, str], memo: Mapping[Expr, str], masked: bool) -> None:
        ctx, out = self.ctx, self.out
        out.indent += 1
        out.emit("rindex = roffset + rbase")
        _row_masks(out, not masked)
        inner_regs = dict(registers)
        inner_memo = dict(memo)  # per-row values computed before the loop stay valid inside
        hoist_loads(ctx, out, [b for b in ctx.nodes if b.name in self.needed and b.name not in self.sums],
                    inner_regs, inner_memo)
        tiles: dict[str, str] = {}  # a max's value tile, which its online sums rebase
        steps: dict[str, tuple[str, str, str]] = {}  # a max -> (new row max, its finite form, rescale)
        for b in ctx.nodes:
            if b.name not in self.needed:
                continue
            role = ctx.roles[b.name]
            out.emit(_comment(b, role))
            if b.name in self.sums:
                m = self.sums[b.name]
                _, safe, scale = steps[m]
                reductions.online_sum_update(out, self.accs[b.name][0], safe, scale, tiles[m])
                continue
            body = ctx.bodies[b.name]
            value = evaluate(body, _handler(ctx, out, inner_regs), inner_memo)
            if b.name in self.row_max:
                if body.dtype in (torch.float16, torch.bfloat16):  # the running max is float32
                    value = out.assign(f"{value}.to(tl.float32)")
                tiles[b.name] = value
                steps[b.name] = reductions.online_row_max(out, self.row_max[b.name], value)
            elif role == "reduction":
                reductions.looped_update(out, _rt(b), self.accs[b.name], value, body.dtype)
            elif self.level[b.name] == self.k:
                finish_node(ctx, out, b, value, body.dtype, inner_regs)
            else:  # an earlier loop stored it; here it is only recomputed
                inner_regs[b.name] = value if body.dtype == b.layout.dtype else out.assign(
                    convert(value, body.dtype, b.layout.dtype))
        for m, (new_max, _, _) in steps.items():
            out.emit(f"{self.row_max[m]} = {new_max}")
        out.indent -= 1


def _rt(b: ComputedBuffer) -> str:
    assert b.reduction_type is not None
    return b.reduction_type


# ---- the whole kernel ----------------------------------------------------------------------------


def drop_round_trips(body: Expr) -> Expr:
    """float32 -> float16/bfloat16 -> float32 inside a body is the float32 value
    itself (no rounding between fused ops, as Inductor computes them)."""

    def fn(e: Expr) -> Expr | None:
        if (isinstance(e, Cast) and e.dtype == torch.float32 and isinstance(e.arg, Cast)
                and e.arg.dtype in (torch.float16, torch.bfloat16) and e.arg.arg.dtype == torch.float32):
            return e.arg.arg
        return None

    return rewrite(body, fn)


def codegen_context(k: FusedKernel, program: WrapperProgram, emulate_precision_casts: bool) -> KernelContext:
    ctx = kernel_context(k, program)
    if not emulate_precision_casts:
        ctx = attrs.evolve(ctx, bodies={n: drop_round_trips(b) for n, b in ctx.bodies.items()})
    return ctx


def kernel_source(k: FusedKernel, program: WrapperProgram, emulate_precision_casts: bool = True) -> KernelSource:
    if k.group[0] == 0:  # every buffer is empty: the wrapper does not launch it
        sig = signature_of(k, kernel_params(k, program.schedule_graph, program.plan.removed))
        return KernelSource(k.name, f"@triton.jit\n{sig}\n    pass  # xnumel = 0", "triton")
    ctx = codegen_context(k, program, emulate_precision_casts)
    out = Emitter()
    prologue(ctx, out)
    if k.kind == "reduction":
        emit_looped(ctx, out)
    else:
        emit_single_scope(ctx, out)
    head = ["@triton.jit", signature(ctx)]
    return KernelSource(k.name, "\n".join(head + out.lines), "triton")
