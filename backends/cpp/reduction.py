"""Reduction kernels: per xindex, a sequence of

    stage 0 (outer nodes) | r-loop 0 | stage 1 | r-loop 1 | ... | stage K

A reduction runs in the r-loop after everything it reads is known and its result
is a register from the next stage on (welford_m2 takes two r-loops: the row mean,
then the sum of squared deviations from it).  An inner node is stored in the
r-loop where its inputs are ready and recomputed from its body in any later
r-loop that reads it, so nothing the kernel writes is read back from memory;
in rows mode a costly value a later r-loop needs again is kept in a row-sized
scratch array instead (the spec's `scratch`), and what an r-loop reads that is
fixed for the row is computed once per row, divisions by it multiplying by its
reciprocal (the spec's `hoisted`, spelt by RowHandler).  passes/schedule/rows.py
makes those decisions, walking the bodies in this emitter's order.

Three layouts of the same schedule, as the spec's space says
(passes/schedule/threads.py chooses):
- rows (Rows): `omp parallel for` over xindex; each r-loop is `omp simd` with a
  `reduction(...)` clause (the row is contiguous, as in softmax(x, -1));
- split (Split, even): fewer rows than threads but long rows (x.sum()): each
  r-loop is cut into the split's parts, run by different threads into per-part
  accumulators, combined in order;
- columns (Rows with lanes): the rows are strided and the xindex dim is
  contiguous (x.sum(0)): a block of `lanes` xindex values runs together, each
  stage and r-loop ends in an `omp simd` loop over the lanes, and registers are
  arrays with one slot per lane.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch

from coil.backends.cpp import prelude
from coil.backends.cpp.handler import (
    CppHandler,
    InnerValue,
    KernelContext,
    cpp_index,
    float_literal,
    int_literal,
    register_value,
)
from coil.backends.cpp.plan import (
    KernelPlan,
    Loop,
    LoopCheck,
    checked_loop,
    cpp_size,
    dim_bound,
    emit_node,
    parallel_pragma,
    render_loops,
    store_line,
)
from coil.ir.expr import Cast, Check, Expr, IndexExpr, IndirectLoad, Load, Op, walk
from coil.ir.kernel import Hoisted, Outer, Rows, ScratchArray, Split
from coil.ir.kernel import Loop as LoopStage
from coil.ir.shapes import Size
from coil.options import Options
from coil.passes.schedule.nest import NodeIndexing

_ARG_REDUCTIONS = frozenset({"argmax", "argmin"})


# ---- when each node runs ------------------------------------------------------------------------


@attrs.frozen
class Phases:
    """`at`: the stage (outer nodes) or r-loop (inner nodes, reductions) where a
    node's inputs are ready; `done`: the stage from which a reduction's result is
    a register; `loops`: how many r-loops the kernel runs."""

    at: dict[str, int]
    done: dict[str, int]
    loops: int


def phases(plan: KernelPlan) -> Phases:
    """The r-loops as schedule_kernels laid them out (the spec's Outer and Loop
    stages; welford_m2 takes two r-loops, the two_pass_welford trait's)."""
    at: dict[str, int] = {}
    done: dict[str, int] = {}
    ends = [0]
    for st in plan.spec.stages:
        assert isinstance(st, (Outer, LoopStage)), f"{plan.kernel.name}: a reduction kernel's rows loop on the C++ target"
        at.update(dict.fromkeys(st.nodes, st.level))
        if isinstance(st, LoopStage):
            for a in st.accumulators:
                done[a.node] = st.level + (2 if a.second_pass else 1)
            ends += [st.level + 1 for n in st.nodes if n in plan.stored and plan.spec.node(n).role == "inner"]
    return Phases(at, done, max([*done.values(), *ends]))


# ---- accumulators ----------------------------------------------------------------------------------


@attrs.frozen
class Accumulator:
    """The C++ state of one reduction while an r-loop runs.  `acc` (and `acc_i`
    for argmax / argmin) are how the loop body names it: a variable, or in column
    mode an array slot `acc0[xl]`."""

    node: NodeIndexing
    name: str  # the C++ variable (or array)
    second_pass: bool  # welford_m2's sum of squared deviations
    lane: str = ""  # "[xl]" in column mode
    # float max / min as a plain max (one vmaxps per vector: a short dependency
    # chain) plus a separate "saw a NaN" flag, instead of a NaN-propagating max
    nan_flag: bool = False

    @property
    def kind(self) -> str:
        return self.node.buf.reduction_type or "sum"

    @property
    def dtype(self) -> torch.dtype:
        return self.node.body.dtype

    @property
    def ctype(self) -> str:
        return prelude.compute_type(self.dtype)

    @property
    def acc(self) -> str:
        return self.name + self.lane

    @property
    def acc_i(self) -> str:
        return f"{self.name}_i{self.lane}"

    @property
    def nan(self) -> str:
        return f"{self.name}_nan"

    @property
    def is_arg(self) -> bool:
        return self.kind in _ARG_REDUCTIONS


def identity(kind: str, dtype: torch.dtype) -> str:
    ctype = prelude.compute_type(dtype)
    if dtype == torch.bool:
        return {"any": "false", "all": "true", "max": "false", "min": "true", "argmax": "false",
                "argmin": "true", "sum": "false", "prod": "true"}[kind]
    if dtype.is_floating_point:
        lowest, highest = float_literal(-math.inf, dtype), float_literal(math.inf, dtype)
    else:
        info = torch.iinfo(dtype)
        lowest, highest = int_literal(info.min, dtype), int_literal(info.max, dtype)
    return {"sum": f"{ctype}(0)", "welford_m2": f"{ctype}(0)", "prod": f"{ctype}(1)", "max": lowest,
            "argmax": lowest, "min": highest, "argmin": highest, "any": "false", "all": "true"}[kind]


def simd_clause(a: Accumulator) -> str | None:
    """The `reduction(...)` clause that lets `omp simd` split the accumulator per
    vector lane; None for argmax / argmin (their loops stay scalar)."""
    kind, var = a.kind, a.acc
    if kind in ("sum", "welford_m2"):
        return f"reduction(+:{var})"
    if kind == "prod":
        return f"reduction(*:{var})"
    if kind == "any" or (kind == "max" and a.dtype == torch.bool):
        return f"reduction(||:{var})"
    if kind == "all" or (kind == "min" and a.dtype == torch.bool):
        return f"reduction(&&:{var})"
    if kind in ("max", "min") and a.nan_flag:
        return f"reduction({kind}:{var}) reduction(|:{a.nan})"
    if kind in ("max", "min"):
        return f"reduction(coil_nan{kind}:{var})" if a.dtype.is_floating_point else f"reduction({kind}:{var})"
    return None


def update(a: Accumulator, v: str, index: str, mean: str | None) -> str:
    """Fold value `v` (at flat rindex `index`) into the accumulator."""
    acc, T = a.acc, a.ctype
    match a.kind:
        case "sum":
            return f"{acc} += {v};"
        case "prod":
            return f"{acc} *= {v};"
        case "welford_m2" if mean is None:
            return f"{acc} += {v};"
        case "welford_m2":
            return f"{{ const {T} d = {v} - {mean}; {acc} += d * d; }}"
        case "max" | "min" if a.dtype == torch.bool:
            return f"{acc} = {acc} {'||' if a.kind == 'max' else '&&'} {v};"
        case "max" | "min" if a.nan_flag:
            cmp = ">" if a.kind == "max" else "<"
            return f"{acc} = {acc} {cmp} {v} ? {acc} : {v}; {a.nan} |= ({v} != {v});"
        case "max" | "min":
            return f"{acc} = coil_{a.kind}<{T}>({acc}, {v});"
        case "any":
            return f"{acc} = {acc} || {v};"
        case "all":
            return f"{acc} = {acc} && {v};"
        case "argmax" | "argmin":
            cmp = ">" if a.kind == "argmax" else "<"
            # NaN beats every number and the first NaN stays; ties keep the first index
            better = f"{v} {cmp} {acc} || ({v} != {v} && {acc} == {acc})"
            return f"if ({better}) {{ {acc} = {v}; {a.acc_i} = {index}; }}"
    raise AssertionError(a.kind)


def pairwise(a: Accumulator) -> bool:
    """Whether a split's parts of this accumulator fold pairwise (a float sum)."""
    return a.kind in ("sum", "welford_m2") and a.dtype.is_floating_point


def combine(a: Accumulator, part: str, part_index: str) -> str:
    """Fold one chunk's partial result into the accumulator (split mode)."""
    if a.kind == "welford_m2":
        return f"{a.acc} += {part};"
    return update(a, part, part_index, None)


# ---- the emitter -------------------------------------------------------------------------------------


@attrs.frozen
class Lanes:
    """Column mode: the innermost x dim runs in blocks of `width` lanes."""

    var: str  # the innermost x loop variable (ixK), defined per lane
    block: str  # the block loop variable
    width: int
    bound: str  # the innermost x dim's trip count

    def header(self) -> str:
        return f"const int64_t {self.var} = {self.block} * {self.width} + xl;"

    def loop(self, body: Sequence[str]) -> list[str]:
        """`body` once per lane of the block, vectorized across lanes."""
        return render_loops([Loop("xl", "0", "xw", "omp simd")], [self.header(), *body])


# Divisors whose reciprocal is a normal number (a * (1 / b) is then within an ulp
# or two of a / b): the smallest normal and a quarter of the largest power of two.
_RECIPROCAL_RANGE = {
    "float": ("1.17549435e-38f", "8.50705917e+37f"),
    "double": ("2.2250738585072014e-308", "4.49423283715579e+307"),
}


class RowHandler(CppHandler):
    """An r-loop's handler in rows mode.

    What the spec hoists for the loop (Hoisted: the subtrees that do not vary
    along the row, and everything below them) is computed once per row, before
    the loop, by the `row` handler.  Each division the spec lists multiplies by
    its divisor's reciprocal, computed once per row as eager's softmax does,
    instead of dividing every element.  A divisor outside _RECIPROCAL_RANGE
    (zero, subnormal, huge, inf, NaN) still divides: the choice is loop-invariant,
    so the compiler unswitches the loop on it."""

    def __init__(self, ctx: KernelContext, registers: dict[str, str], inner: Mapping[str, InnerValue],
                 lines: list[str], row: CppHandler, hoisted: Hoisted | None) -> None:
        super().__init__(ctx, registers, inner, lines)
        self.row = row  # a handler whose lines run once per row, before the loop
        roots = hoisted.hoisted if hoisted is not None else ()
        self.hoisted: frozenset[Expr] = frozenset().union(*(walk(e) for e in roots))
        self.divisions: frozenset[Expr] = frozenset(hoisted.reciprocals if hoisted is not None else ())
        self.reciprocals: dict[Expr, str] = {}

    def fixed(self, node: Expr) -> bool:
        """Computed once per row, by the row handler."""
        return node in self.hoisted

    def load(self, node: Load, mask: str | None) -> str:
        return self.row.value(node) if self.fixed(node) else super().load(node, mask)

    def indirect_load(self, node: IndirectLoad, values: tuple[str, ...], mask: str | None) -> str:
        return self.row.value(node) if self.fixed(node) else super().indirect_load(node, values, mask)

    def check(self, node: Check, arg: str) -> str:
        return self.row.value(node) if self.fixed(node) else super().check(node, arg)

    def index_expr(self, node: IndexExpr) -> str:
        return self.row.value(node) if self.fixed(node) else super().index_expr(node)

    def cast(self, node: Cast, arg: str) -> str:
        return self.row.value(node) if self.fixed(node) else super().cast(node, arg)

    def op(self, node: Op, args: tuple[str, ...]) -> str:
        if self.fixed(node):
            return self.row.value(node)
        if node not in self.divisions:
            return super().op(node, args)
        T = prelude.compute_type(node.dtype)
        den = node.args[-1]
        a = f"static_cast<{T}>({args[0]})"
        b = f"static_cast<{T}>({self.row.value(den)})"
        if den not in self.reciprocals:
            r = self.reciprocals[den] = self.ctx.fresh("rcp")
            lo, hi = _RECIPROCAL_RANGE[T]
            # whether the reciprocal is used is a number of T, not a bool: a bool selecting
            # between a * r and a / b stopped GCC 12 from vectorizing a loop that also calls
            # exp (softmax over rows of 32000 without row scratch, one thread: 10.1 ms
            # against eager's 1.3; `no vectype` for the loop's loads)
            self.row.lines += [f"const {T} {r} = {T}(1) / {b};",
                               f"const {T} {r}_ok = coil_fabs({b}) >= {lo} && coil_fabs({b}) <= {hi} ? {T}(1) : {T}(0);"]
        r = self.reciprocals[den]
        return self.emit(node.dtype, f"({r}_ok != {T}(0) ? {a} * {r} : {a} / {b})")


def sums_in_double(a: Accumulator) -> bool:
    """Whether this accumulator's blocks and a split's parts are summed in double,
    rounded to float once (ReductionEmitter.in_blocks says why): a float sum, or a
    variance's float sum of squares."""
    return a.kind in ("sum", "welford_m2") and a.ctype == "float"


class ReductionEmitter:
    """Builds the code run once per xindex (or per block of lanes)."""

    def __init__(self, plan: KernelPlan, ctx: KernelContext, options: Options, lanes: Lanes | None,
                 split: bool) -> None:
        self.plan = plan
        self.ctx = ctx
        self.options = options
        self.lanes = lanes
        self.split = split
        self.ph = phases(plan)
        self.lines: list[str] = []
        self.registers: dict[str, str] = {}  # reductions' and outer nodes' values, by buffer
        self.stage_memo: dict[Expr, str] = {}  # rows mode: values computed once per xindex
        self.inner = {nd.buf.name: InnerValue(nd.body, nd.buf.layout.dtype) for nd in plan.nodes if nd.role == "inner"}
        self.means: dict[str, str] = {}  # welford_m2 node -> its row mean
        self.rnumel = math.prod(d.size for d in plan.nest.rdims)
        self.scratch = plan.spec.scratch  # row scratch arrays (rows mode)
        self.hoisted = {h.level: h for h in plan.spec.hoisted}  # what each r-loop runs once per row

    def run(self) -> list[str]:
        if self.lanes is not None:
            w = self.lanes
            self.lines.append(f"const int64_t xw = coil_min_index({w.width}, {w.bound} - {w.block} * {w.width});")
        for s in range(self.ph.loops + 1):
            self.stage(s)
            if s < self.ph.loops:
                self.r_loop(s)
        return self.lines

    def handler(self, lines: list[str], loop: int | None = None) -> CppHandler:
        """A scope's handler: it sees every register so far; what it adds (inner
        producers it recomputes) stays in its own copy.  The handler of r-loop
        `loop` (rows mode) puts per-row values before the loop."""
        if self.lanes is not None:
            return CppHandler(self.ctx, dict(self.registers), self.inner, lines)
        h = CppHandler(self.ctx, dict(self.registers), self.inner, lines)
        if loop is not None:
            h = RowHandler(self.ctx, h.registers, self.inner, lines, self.handler(self.lines), self.hoisted.get(loop))
        h.memo.update(self.stage_memo)
        return h

    def keep(self, name: str, value: str, ctype: str, body: list[str]) -> None:
        """Make `value` the register of buffer `name` for every later scope."""
        if self.lanes is None:
            self.registers[name] = value
            return
        array = self.ctx.fresh(f"{name}_a")
        self.lines.append(f"{ctype} {array}[{self.lanes.width}];")
        body.append(f"{array}[xl] = {value};")
        self.registers[name] = f"{array}[xl]"

    # ---- stages --------------------------------------------------------------------------------------

    def stage(self, s: int) -> None:
        nodes = [nd for nd in self.plan.nodes if nd.role == "outer" and self.ph.at[nd.buf.name] == s]
        if not nodes:
            return
        body: list[str] = []
        h = self.handler(body)
        for nd in nodes:
            emit_node(self.plan, self.ctx, h, nd)
            self.keep(nd.buf.name, h.registers[nd.buf.name], prelude.compute_type(nd.buf.layout.dtype), body)
        if self.lanes is None:
            self.stage_memo.update(h.memo)
            self.lines += body
        else:
            self.lines += self.lanes.loop(body)

    # ---- r-loops -------------------------------------------------------------------------------------

    def active(self, loop: int) -> list[Accumulator]:
        """The reductions that accumulate in r-loop `loop`."""
        lane = "[xl]" if self.lanes is not None else ""
        out = []
        for nd in self.plan.nodes:
            if nd.role != "reduction":
                continue
            start = self.ph.at[nd.buf.name]
            second = start + 1 == loop and nd.buf.reduction_type == "welford_m2"
            if start == loop or second:
                flag = (self.lanes is None and not self.split and nd.body.dtype.is_floating_point
                        and nd.buf.reduction_type in ("max", "min"))
                out.append(Accumulator(nd, self.ctx.fresh("acc"), second, lane, flag))
        return out

    def r_loop(self, loop: int) -> None:
        accs = self.active(loop)
        self.declare(accs)
        body: list[str] = []
        h = self.handler(body, loop)
        checks: list[LoopCheck] = []
        if self.lanes is None:  # the r-loop (a split's part of it) is the `omp simd` loop
            h.loop_checks = checks
        rindex = cpp_index(self.plan.nest.rflat)
        h.memo.update({a.expr: element(a, rindex) for a in self.scratch if a.first < loop <= a.last})
        for a in accs:
            v = h.value(a.node.body)
            body.append(update(a, v, rindex, self.means.get(a.node.buf.name) if a.second_pass else None))
        for nd in self.plan.nodes:
            if nd.role == "inner" and nd.buf.name in self.plan.stored and self.ph.at[nd.buf.name] == loop:
                emit_node(self.plan, self.ctx, h, nd)
        if isinstance(h, RowHandler):  # what it hoisted is defined for the rest of the row
            self.stage_memo.update(h.row.memo)
        self.lines += [declare(a, self.rnumel) for a in declared_in(self.scratch, loop)]
        body += [f"{element(a, rindex)} = {h.memo[a.expr]};" for a in self.scratch if a.first == loop]
        loops = [Loop(str(d.sym), "0", dim_bound(self.plan.nest, i, True)) for i, d in enumerate(self.plan.nest.rdims)]
        if self.lanes is not None:
            self.lines += self.lane_loops(loops, body, accs)
            self.finish(accs)
            return
        clauses = [simd_clause(a) for a in accs]
        if all(c is not None for c in clauses):
            loops[-1] = attrs.evolve(loops[-1], pragma=" ".join(["omp simd", *(c for c in clauses if c)]))
        if self.split:
            self.lines += self.split_loop(loops, body, accs, checks)
        else:
            self.lines += self.row_loops(loops, body, accs, checks)
        self.finish(accs)

    def lane_loops(self, loops: list[Loop], body: list[str], accs: Sequence[Accumulator]) -> list[str]:
        """Column mode's r loops, each step an `omp simd` loop over the lanes; with
        the nest's `rblock`, the outermost in blocks (`in_blocks`: a column's float
        sum then rounds as a row's does in inner_loop)."""
        assert self.lanes is not None
        lanes, block = self.lanes, self.plan.loops.rblock
        if not block or not any(pairwise(a) for a in accs) or any(a.is_arg for a in accs):
            return render_loops(loops, lanes.loop(body))
        return self.in_blocks(loops[0], lambda part: render_loops([part, *loops[1:]], lanes.loop(body)), accs, block)

    def row_loops(self, loops: list[Loop], body: list[str], accs: Sequence[Accumulator], checks: list[LoopCheck]
                  ) -> list[str]:
        """A row's r loops around `body`; over several r loops, with the nest's
        `rblock`, the outermost in blocks of that many steps (`in_blocks`), else
        the innermost as inner_loop makes it."""
        block = self.plan.loops.rblock
        if len(loops) > 1 and block and all(simd_clause(a) is not None for a in accs) \
                and any(pairwise(a) for a in accs):
            return self.in_blocks(loops[0], lambda part: render_loops([part, *loops[1:-1]],
                                                                      checked_loop(loops[-1], body, checks)),
                                  accs, block, wide=True)
        return render_loops(loops[:-1], self.inner_loop(loops[-1], body, accs, checks))

    def inner_loop(self, loop: Loop, body: list[str], accs: Sequence[Accumulator], checks: list[LoopCheck]
                   ) -> list[str]:
        """The innermost r loop around `body`, its checks as reductions; with the
        nest's `rblock` (one r loop, accumulators that simd splits) in blocks
        (`in_blocks`: a float sum's error grows with the block, not the row)."""
        block = self.plan.loops.rblock
        if not block or len(self.plan.nest.rdims) != 1 or any(simd_clause(a) is None for a in accs) \
                or not any(pairwise(a) for a in accs):
            return checked_loop(loop, body, checks)
        return self.in_blocks(loop, lambda part: checked_loop(part, body, checks), accs, block)

    def in_blocks(self, loop: Loop, render: Callable[[Loop], list[str]], accs: Sequence[Accumulator],
                  block: int, wide: bool = False) -> list[str]:
        """`loop` in blocks of `block` steps, `render` making each block's loops from
        the block's part of it: each block runs into accumulators of its own (lane
        arrays in column mode) that shadow the row's, kept in `<acc>_k` and folded
        into the row's after the block.  On a row, a float sum's blocks are folded
        in double, rounded to float once: folded in float, x.sum() of 2^16 values of
        0.1 was 6.7e-7 off, relative, where eager's cascade is 1.5e-7 (now 1.5e-7).
        With `wide` (a row over several r loops) the blocks themselves also sum in
        double: there each block adds its inner runs' partials into one scalar,
        one after another, and over many equal values (the fuzzer's clamped
        constants) every rounding went the same way (14300 values: 1.7e-6 off,
        relative, where eager's cascade is 5e-8)."""
        start, end = f"{loop.var}_b", f"{loop.var}_e"
        lanes = self.lanes
        doubled = {a.name for a in accs if lanes is None and sums_in_double(a)}
        before: list[str] = [f"double {n}_w = 0;" for n in sorted(doubled)]
        after: list[str] = [f"{n} += static_cast<float>({n}_w);" for n in sorted(doubled)]
        if lanes is None:
            ctype = {a.name: "double" if wide and a.name in doubled else a.ctype for a in accs}
            held = [f"{ctype[a.name]} {a.name}_k;" for a in accs]
            fresh = [f"{ctype[a.name]} {a.name} = {identity(a.kind, a.dtype)};" for a in accs]
            keep = [f"{a.name}_k = {a.name};" for a in accs]
            fold = [f"{a.name}_w += {a.name}_k;" if a.name in doubled else combine(a, f"{a.name}_k", "0")
                    for a in accs]
        else:
            held = [f"{a.ctype} {a.name}_k[{lanes.width}];" for a in accs]
            fresh = [f"{a.ctype} {a.name}[{lanes.width}];" for a in accs]
            fresh += lanes.loop([f"{a.acc} = {identity(a.kind, a.dtype)};" for a in accs])
            keep = lanes.loop([f"{a.name}_k[xl] = {a.acc};" for a in accs])
            fold = lanes.loop([combine(a, f"{a.name}_k[xl]", "0") for a in accs])
        scope = [*fresh, *render(attrs.evolve(loop, lo=start, hi=end)), *keep]
        lines = [f"const int64_t {end} = {start} + {block} < ({loop.hi}) ? {start} + {block} : ({loop.hi});",
                 *held, "{", *("  " + ln for ln in scope), "}", *fold]
        return [*before, *render_loops([Loop(start, loop.lo, loop.hi, step=block)], lines), *after]

    def declare(self, accs: Sequence[Accumulator]) -> None:
        if self.lanes is None:
            for a in accs:
                self.lines.append(f"{a.ctype} {a.name} = {identity(a.kind, a.dtype)};")
                if a.is_arg:
                    self.lines.append(f"int64_t {a.name}_i = 0;")
                if a.nan_flag:
                    self.lines.append(f"int {a.nan} = 0;")  # an int: `omp simd` will not vectorize a bool ||
            return
        init: list[str] = []
        for a in accs:
            self.lines.append(f"{a.ctype} {a.name}[{self.lanes.width}];")
            init.append(f"{a.acc} = {identity(a.kind, a.dtype)};")
            if a.is_arg:
                self.lines.append(f"int64_t {a.name}_i[{self.lanes.width}];")
                init.append(f"{a.acc_i} = 0;")
        if init:
            self.lines += self.lanes.loop(init)

    def split_loop(self, loops: list[Loop], body: list[str], accs: Sequence[Accumulator],
                   checks: list[LoopCheck]) -> list[str]:
        """The r-loop cut into the split's parts of its outermost dim that threads
        run in parallel, each into its own accumulators (which shadow the outer
        ones, so the loop body is unchanged), its innermost loop `omp simd` as a
        row's is; the partials are then combined in part order, which keeps
        argmax's first index on ties.  Over several r loops a float sum's parts sum
        and fold in double, rounded to float once (in_blocks says why)."""
        space, par = self.plan.spec.space, self.plan.loops.parallel
        assert isinstance(space, Split) and par is not None
        chunks = space.parts
        inner = cpp_size(math.prod(d.size for d in self.plan.nest.rdims[1:]))
        lo, hi = f"(c * ({loops[0].hi})) / {chunks}", f"((c + 1) * ({loops[0].hi})) / {chunks}"
        out: list[str] = []
        chunk: list[str] = []
        merge: list[str] = []
        ctype = {a.name: "double" if len(loops) > 1 and sums_in_double(a) else a.ctype for a in accs}
        parts = {a.name: "double" if sums_in_double(a) else a.ctype for a in accs}
        for a in accs:
            out.append(f"{parts[a.name]} {a.name}_p[{chunks}];")
            chunk.append(f"{ctype[a.name]} {a.name} = {identity(a.kind, a.dtype)};")
            if a.is_arg:
                out.append(f"int64_t {a.name}_pi[{chunks}];")
                chunk.append(f"int64_t {a.name}_i = ({lo}) * {inner};")
            if not pairwise(a):
                merge.append(combine(a, f"{a.name}_p[c]", f"{a.name}_pi[c]"))
        parted = [attrs.evolve(loops[0], lo=lo, hi=hi), *loops[1:]]
        chunk += self.row_loops(parted, body, accs, checks)
        chunk += [f"{a.name}_p[c] = {a.name};" for a in accs]
        chunk += [f"{a.name}_pi[c] = {a.name}_i;" for a in accs if a.is_arg]
        out += render_loops([Loop("c", "0", str(chunks), parallel_pragma(par, self.options))], chunk)
        summed = [a for a in accs if pairwise(a)]
        if summed:  # float sums fold their parts pairwise: the last adds are few and of like sizes
            fold = [f"{a.name}_p[c] += {a.name}_p[c + s];" for a in summed]
            out += [
                f"for (int64_t s = 1; s < {chunks}; s *= 2) {{",
                f"  for (int64_t c = 0; c + s < {chunks}; c += 2 * s) {{",
                *("    " + ln for ln in fold), "  }", "}"]
            out += [f"{a.acc} += {a.name}_p[0];" if parts[a.name] == a.ctype
                    else f"{a.acc} += static_cast<{a.ctype}>({a.name}_p[0]);" for a in summed]
        if merge:  # a second pass over the row (no accumulators) has nothing to merge
            out += render_loops([Loop("c", "0", str(chunks))], merge)
        return out

    def finish(self, accs: Sequence[Accumulator]) -> None:
        """After the r-loop: each finished reduction's result as a register, stored
        unless plan_memory removed it; welford's first pass gives the row mean."""
        body: list[str] = []
        for a in accs:
            nd = a.node
            if a.kind == "welford_m2" and not a.second_pass:
                mean = self.ctx.fresh("mean")

                count = max(self.rnumel, 1) if isinstance(self.rnumel, int) else cpp_size(self.rnumel)
                body.append(f"const {a.ctype} {mean} = {a.acc} / {a.ctype}({count});")
                self.keep_mean(nd.buf.name, mean, a.ctype, body)
                continue
            result, rdtype = a.acc, a.dtype
            if a.is_arg:
                result, rdtype = a.acc_i, torch.int64
            elif a.nan_flag:
                result = f"({a.nan} ? {float_literal(math.nan, rdtype)} : {a.acc})"
            elif a.kind == "welford_m2" and self.rnumel == 0:
                result = float_literal(math.nan, rdtype)  # the variance of nothing
            var = self.ctx.fresh("red")
            ctype = prelude.compute_type(nd.buf.layout.dtype)
            body.append(f"const {ctype} {var} = {register_value(result, rdtype, nd.buf.layout.dtype)};")
            self.keep(nd.buf.name, var, ctype, body)
            if nd.buf.name in self.plan.stored:
                body.append(store_line(self.plan, self.ctx, nd, result))
        if self.lanes is None:
            self.lines += body
        elif body:
            self.lines += self.lanes.loop(body)

    def keep_mean(self, name: str, mean: str, ctype: str, body: list[str]) -> None:
        if self.lanes is None:
            self.means[name] = mean
            return
        array = self.ctx.fresh("mean_a")
        self.lines.append(f"{ctype} {array}[{self.lanes.width}];")
        body.append(f"{array}[xl] = {mean};")
        self.means[name] = f"{array}[xl]"


# ---- the layout ----------------------------------------------------------------------------------


def declared_in(scratch: Sequence[ScratchArray], loop: int) -> list[ScratchArray]:
    """The first array of each slot whose first value is stored in r-loop `loop`."""
    seen: set[int] = set()
    out = []
    for a in scratch:
        if a.slot not in seen and a.first == loop:
            out.append(a)
        seen.add(a.slot)
    return out


def declare(a: ScratchArray, rnumel: Size) -> str:
    """A scratch array's declaration: on the stack where the row's length is a
    number, else a pointer into the thread's buffer of that slot
    (coil_row_scratch, grown to the longest row met)."""
    ctype = prelude.compute_type(a.expr.dtype)
    if isinstance(rnumel, int):
        return f"alignas(64) {ctype} row{a.slot}[{max(rnumel, 1)}];"
    return (f"{ctype}* __restrict__ row{a.slot} = static_cast<{ctype}*>(coil_row_scratch<{a.slot}>"
            f"(({cpp_size(rnumel)}) * (int64_t)sizeof({ctype})));")


def element(a: ScratchArray, rindex: str) -> str:
    return f"row{a.slot}[{rindex}]"


def reduction_body(plan: KernelPlan, ctx: KernelContext, options: Options) -> list[str]:
    """The x loops around the code run per xindex (a block of lanes); the spec's
    space says rows, columns or split, its nest which loops run in parallel."""
    nest, space, par = plan.nest, plan.spec.space, plan.loops.parallel
    loops = [Loop(str(d.sym), "0", dim_bound(nest, i, False)) for i, d in enumerate(nest.xdims)]
    lanes = None
    if isinstance(space, Rows) and space.lanes:
        last = loops[-1]
        lanes = Lanes(last.var, f"{last.var}_b", space.lanes, last.hi)
        loops[-1] = Loop(lanes.block, "0", f"({last.hi} + {lanes.width - 1}) / {lanes.width}")
    split = isinstance(space, Split)
    per_x = ReductionEmitter(plan, ctx, options, lanes, split).run()
    if not split and par is not None:
        loops[0] = attrs.evolve(loops[0], pragma=parallel_pragma(par, options))
    return render_loops(loops, per_x)
