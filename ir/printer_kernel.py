"""The KernelProgram as text: per kernel its space, loop nest (on a target that
runs nests) and streamed stores, parameters, tails, the checks it asserts on the
device, where each load from memory lies and the tails that mask it, nodes (with
their bodies in kernel coordinates), stages (with the loads each scope issues
first), row scratch arrays and what each r-loop computes once
per row, launches, and a looped kernel's persistent variant with the bound under
which a call launches it instead (its spec indented below the looped one's).  Every line that describes a kernel or a node starts with
its name, so a verifier's error can point at it.  A subtree of the nest's bodies
prints as its temporary in the first body that has it (`buf1.t3 (exp)`)."""

from __future__ import annotations

import math

import torch

from coil.ir.expr import Cast, Check, Constant, Expr, IndexExpr, IndirectLoad, Load, Op, dtype_name, walk
from coil.ir.kernel import (
    Body,
    Flat,
    Hoisted,
    KernelLaunch,
    KernelNode,
    KernelProgram,
    KernelSpec,
    Loop,
    LoopNest,
    Outer,
    Read,
    Rows,
    ScratchArray,
    Space,
    Split,
    Stage,
    Tiled,
    WIDE_SUFFIX,
)
from coil.ir.printer import body_lines


def show_space(space: Space) -> str:
    match space:
        case Flat():
            return f"flat {space.numel}" + (f" (rnumel {space.rnumel})" if space.rnumel != 1 else "")
        case Tiled():
            order = ", transposed: xindex along the rows" if space.transposed else ""
            axis = "; programs on grid axis 0 alone (row blocks may pass axis 1's limit)" if space.one_axis else ""
            return (f"tiled {space.rows} rows x {space.cols} cols "
                    f"(yindex {space.ynumel} x xindex {space.xnumel}{order}){axis}")
        case Rows():
            how = "looped" if space.looped else "persistent"
            lanes = f", {space.lanes} columns at a time (vector lanes)" if space.lanes else ""
            return f"rows {space.xnumel} x {space.rnumel}, {how}" + (", down the columns" if space.columns else "") + lanes
        case Split() if space.even:
            return (f"split {space.xnumel} row(s) x {space.rnumel} among {space.parts} threads, the outer r loop "
                    f"dealt out evenly (at most {space.chunk} elements each)")
        case Split():
            what = "columns" if space.columns else "row(s)"
            ws = ", ".join(f"{n}:{dtype_name(dt)}" for n, dt in space.workspaces)
            before = f"; prelude {', '.join(space.prelude)}" if space.prelude else ""
            return (f"split {space.xnumel} {what} x {space.rnumel} into {space.parts} parts of {space.chunk}, "
                    f"{space.xblock} a program; workspaces [{ws}]{before}")
    raise TypeError(f"no space {space!r}")


_SIGNS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def comparison_text(c: Expr) -> str:
    """A comparison of index expressions and constants as one infix line
    (`2*ix1 - 1 >= 0`); anything else as its body's lines."""
    if isinstance(c, Op) and c.name in _SIGNS and len(c.args) == 2 and all(
            isinstance(a, (IndexExpr, Constant)) for a in c.args):
        a, b = (str(x.expr) if isinstance(x, IndexExpr) else repr(x.value) for x in c.args)  # type: ignore[union-attr]
        return f"({a} {_SIGNS[c.name]} {b})"
    return " ".join(ln.strip() for ln in body_lines(c, ""))


def show_nest(nest: LoopNest, indent: str, bodies: bool = True) -> list[str]:
    """The loop sizes (outermost first), how a pointwise kernel cuts its innermost
    loop, which loops run on threads, and (with `bodies`) each node in the loop
    variables."""
    rs = f", r loops {list(nest.rsizes)}" if nest.rsizes else ""
    out = [f"{indent}nest: x loops {list(nest.xsizes)}{rs}"]
    if nest.block:
        out.append(f"{indent}  innermost x loop in blocks of {nest.block}")
    if nest.rblock:
        what = "r loop" if len(nest.rsizes) == 1 else "outermost r loop"
        out.append(f"{indent}  {what} in blocks of {nest.rblock}, each summed apart, then folded in")
    if nest.tile is not None:
        t = nest.tile
        reads = ", ".join(f"{r.buffer} at {r.offset} (stride {r.stride})" for r in t.staged)
        out.append(f"{indent}  x loops {t.u} and {t.v} in {t.side}x{t.side} tiles, staging {reads}")
    for k, table in enumerate(nest.tables):
        out.append(f"{indent}  lane table {k}: " + " ".join(ln.strip() for ln in body_lines(table, "")))
    for k, value in enumerate(nest.invariants):
        out.append(f"{indent}  invariant {k}, once per call: " + " ".join(ln.strip() for ln in body_lines(value, "")))
    if nest.cuts:
        bounds = (0, *nest.cuts, nest.xsizes[-1])
        spans = ", ".join(f"[{a}, {b})" for a, b in zip(bounds, bounds[1:]))
        out.append(f"{indent}  innermost x loop in pieces {spans}, its comparisons constant in each")
    if nest.guards:
        shown = ", ".join(comparison_text(g) for g in nest.guards)
        out.append(f"{indent}  innermost x loop in {len(nest.versions)} versions (of {2 ** len(nest.guards)}), one for "
                   f"each value the loops reach of the outer loops' {shown}")
    par = nest.parallel
    if par is None:
        out.append(f"{indent}  one thread")
    else:
        loops = "the outer loop" if par.loops == 1 else f"{par.loops} loops collapsed"
        out.append(f"{indent}  parallel: {loops}, {par.iterations} iterations in dynamic chunks of {par.chunk}")
    if bodies:
        for n in nest.nodes:
            out.append(f"{indent}  {n.name}: " + (f"store={n.store}" if n.store is not None else "registers"))
            out += body_lines(n.body, indent + "    ")
    return out


def subtree(nest: LoopNest | None, e: Expr) -> str:
    """`e` as the temporary that names it in the first of the nest's bodies that
    has it (show_expr's numbering), with its op or the buffer it loads."""
    match e:
        case Load() | IndirectLoad():
            what = f"load {e.name}"
        case Op():
            what = e.name
        case Cast():
            what = f"cast to {dtype_name(e.dtype)}"
        case IndexExpr():
            what = f"index {e.expr}"
        case Check():
            what = "check"
        case Constant():
            return repr(e.value)
    for n in nest.nodes if nest is not None else ():
        temps = [x for x in walk(n.body) if not isinstance(x, Constant)]
        if e in temps:
            return f"{n.name}.t{temps.index(e)} ({what})"
    return f"? ({what}, in no body)"


def show_scratch(a: ScratchArray, nest: LoopNest | None, indent: str) -> str:
    rnumel = math.prod(nest.rsizes) if nest is not None else 0
    return (f"{indent}scratch row{a.slot}: {dtype_name(a.expr.dtype)}[{rnumel}] holds {subtree(nest, a.expr)}, "
            f"stored in loop {a.first}, read up to loop {a.last}")


def show_hoisted(h: Hoisted, nest: LoopNest | None, indent: str) -> str:
    line = f"{indent}loop {h.level} hoists, once per row: " + (", ".join(subtree(nest, e) for e in h.hoisted)
                                                                or "nothing")
    if h.reciprocals:
        line += "; divides by reciprocals: " + ", ".join(subtree(nest, e) for e in h.reciprocals)
    return line


def _dtype(dt: torch.dtype) -> str:
    return dtype_name(dt)


def show_node(n: KernelNode, indent: str) -> list[str]:
    what = n.reduction_type or "pointwise"
    store = f" store={n.store}" if n.store is not None else " registers"
    reads = f" reads [{', '.join(n.deps)}]" if n.deps else ""
    head = f"{indent}{n.name}: {n.role.value} {what} {_dtype(n.dtype)}{store}{reads} from [{', '.join(n.origins)}]"
    return [head, *body_lines(n.body, indent + "  ")]


def show_loads(lds: tuple[Load, ...]) -> str:
    """`; loads first a_1[xindex, rindex], ...`: the loads a scope issues first."""
    if not lds:
        return ""
    return "; loads first " + ", ".join(f"{ld.name}[{', '.join(map(str, ld.index))}]"
                                        + (" masked" if ld.mask is not None else "") for ld in lds)


def show_read(r: Read) -> str:
    """`a_1 at rindex + 10000*xindex (xr)`: a load from memory's offset and tails."""
    how = (" indirect" if isinstance(r.load, IndirectLoad) else "") + (" masked" if r.load.mask is not None else "")
    return f"{r.load.name} at {r.offset}{how} ({r.tails or 'unmasked'})"


def show_stage(st: Stage, indent: str) -> list[str]:
    match st:
        case Body():
            return [f"{indent}body: {', '.join(st.nodes)}{show_loads(st.loads)}"]
        case Outer():
            return [f"{indent}outer {st.level}: {', '.join(st.nodes)}{show_loads(st.loads)}"]
        case Loop():
            computes = ", ".join(st.computes) if st.computes else "nothing (recomputed where read)"
            out = [f"{indent}loop {st.level}: {', '.join(st.nodes)}; computes {computes}{show_loads(st.loads)}"]
            for a in st.accumulators:
                partner = f" with {a.partner}" if a.partner else ""
                again = f", second pass in loop {st.level + 1}" if a.second_pass else ""
                kept = f", kept in {_dtype(a.dtype)}" if a.dtype is not None else ""
                out.append(f"{indent}  {a.node}: {a.reduction_type} accumulator, {a.update.value}{partner}{again}{kept}")
            return out
    raise TypeError(f"no stage {st!r}")


def show_launch(ln: KernelLaunch, indent: str) -> str:
    grid = ", ".join(map(str, ln.grid))
    return (f"{indent}{ln.function}[({grid})] sizes={list(ln.sizes)} {ln.config.as_kwargs()}  "
            f"rule={ln.rule.value}: {ln.why}" + (f"; fixed: {ln.fixed}" if ln.fixed else ""))


def show_spec(k: KernelSpec, bodies: bool = True) -> list[str]:
    out = [f"  {k.name}: {k.kind} group={k.group} {k.device}"]
    out.append(f"    space: {show_space(k.space)}")
    if k.nest is not None:
        out += show_nest(k.nest, "    ", bodies)
    if k.streams is not None:
        out.append(f"    streams: {', '.join(k.streams.buffers)} (non-temporal stores, staged "
                   f"{k.streams.chunk} elements at a time)")
    out.append("    params: " + (", ".join(f"{p.arg}={p.name}" for p in k.params) or "none"))
    tails = "" if k.tails is None else (f"; tails: outer {'yes' if k.tails.outer else 'no'}, "
                                         f"inner {'yes' if k.tails.inner else 'no'}")
    width = "int64" if k.wide_index else "int32"
    if k.wide is not None:
        width += f" where {k.wide.show()}, else int64 ({k.name}{WIDE_SUFFIX})"
    out.append(f"    index: {width}{tails}")
    if k.asserts:
        out.append(f"    asserts: {', '.join(k.asserts)} (device asserts: the launch compiles them in)")
    if k.reads:
        out.append("    reads: " + ", ".join(show_read(r) for r in k.reads))
    out.append("    nodes:")
    for n in k.nodes:
        out += show_node(n, "      ") if bodies else show_node(n, "      ")[:1]
    out.append("    stages:")
    for st in k.stages:
        out += show_stage(st, "      ")
    out += [show_scratch(a, k.nest, "    ") for a in k.scratch]
    out += [show_hoisted(h, k.nest, "    ") for h in k.hoisted]
    if k.launches:
        out.append("    launches:")
        out += [show_launch(ln, "      ") for ln in k.launches]
    elif k.group[0] == 0:
        out.append("    launches: none (nothing to compute)")
    else:
        out.append("    launches: chosen by the target's renderer")
    if k.choice is not None:
        c = k.choice
        out.append(f"    choice: {c.persistent.name} where {c.rnumel} <= {c.rblock}, else {k.name}: {c.why}")
        if c.tiers:
            out.append("    tiers:")
            out += [show_launch(ln, "      ") for ln in c.tiers]
        # the variant's nodes are the looped kernel's: one line each
        out += ["    " + ln for ln in show_spec(c.persistent, bodies=False)]
    return out


def show_kernel_program(p: KernelProgram, bodies: bool = True) -> str:
    """The whole program; without `bodies`, each node on one line (coil explain)."""
    out = [f"KernelProgram ({len(p.specs)} kernel{'s' if len(p.specs) != 1 else ''})"]
    for k in p.specs:
        out += show_spec(k, bodies)
    return "\n".join(out)
