"""The seed's tables for one compiled graph, as text, and the buffer-lifetime chart.

`coil explain`, `coil demo` and `Options.debug_dir` print these:

    realize            FX node -> IR node, realized or inlined, and why
    read_writes        per scheduler node: the names it reads and writes, with deps
    fusion decisions   every pair `fuse` considered: direction, verdict, score, reason
    last_usage, frees  per step of the chosen order, with allocations and live bytes
    reuse              which buffer took whose storage
    peak               bytes, MiB, the order strategy chosen and the candidates
    externs            (explain) the aten calls kept whole that split fusion: all
                       but matmul, convolution and attention

Every function here reads an IR and returns text (or writes one file); none changes
what it is given.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Callable, Sequence

import attrs
from typing_extensions import assert_never

from coil.ir.buffers import AliasBuffer, BufferGraph, ExternBuffer, InputBuffer
from coil.ir.fused import ExternStep, FusedKernel, FusedSchedule, NopStep, Step
from coil.ir.memory import MemoryPlan
from coil.ir.module import CompiledModule
from coil.ir.printer import printer_of, realize_table, show
from coil.ir.schedule import ScheduleGraph
from coil.passes.pipeline import Run, StageHook

MIB = 1 << 20


# ---- small formatting helpers --------------------------------------------------------------


def fmt_bytes(n: Any) -> str:
    """Bytes in the unit a person reads fastest: 256 B, 96.2 KiB, 1.25 MiB; a
    symbolic size as its expression (4*s0*s1 B)."""
    if not isinstance(n, (int, float)):
        return f"{n} B"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            digits = 2 if value < 10 else 1 if value < 100 else 0
            text = f"{value:.{digits}f}"
            return f"{text.rstrip('0').rstrip('.') if '.' in text else text} {unit}"
    raise AssertionError("unreachable")


def fmt_mib(n: int) -> str:
    """MiB with three decimals, or in scientific notation for tiny graphs."""
    mib = n / MIB
    return f"{mib:.3f} MiB" if mib >= 0.001 or n == 0 else f"{mib:.2e} MiB"


def table(rows: Sequence[Sequence[str]], indent: str = "") -> str:
    """Left-aligned columns; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def natural_key(name: str) -> tuple[Any, ...]:
    """buf2 before buf10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def names(xs: Sequence[str] | frozenset[str] | set[str]) -> str:
    return "{" + ", ".join(sorted(xs, key=natural_key)) + "}"


def section(title: str, body: str) -> str:
    """A heading line and its body, as every report section prints."""
    return f"== {title} ==\n{body}\n"


# ---- steps and their labels ----------------------------------------------------------------


def extern_kernel(plan: MemoryPlan, name: str) -> str:
    """The aten op an extern step calls, shortened: `aten.mm.default` -> `mm`."""
    b = plan.get(name)
    return aten_op_name(b.kernel) if isinstance(b, ExternBuffer) else "extern"


def step_label(plan: MemoryPlan, step: Step) -> str:
    """One line naming a step, as the wrapper shows it."""
    match step:
        case FusedKernel():
            return step.name
        case ExternStep():
            return f"extern {extern_kernel(plan, step.name)} -> {step.name}"
        case NopStep():
            return f"nop {step.name}"
        case _:
            assert_never(step)


def short_kernel_name(name: str, limit: int = 26) -> str:
    """`triton_per_fused_add_amax_div_exp_mul_relu_sub_sum_0` -> `per_fused_add_amax…_0`:
    the backend prefix is in the chart's title, so the kind and the first ops suffice."""
    head, sep, rest = name.partition("_fused_")
    if not sep:
        return name if len(name) <= limit else name[: limit - 1] + "…"
    kind = head.rsplit("_", 1)[-1] if "_" in head else head
    ops, _, index = rest.rpartition("_")
    label = f"{kind}_fused_{ops}_{index}"
    if len(label) <= limit:
        return label
    room = limit - len(f"{kind}_fused_…_{index}")
    return f"{kind}_fused_{ops[:max(room, 3)].rstrip('_')}…_{index}"


def short_step_label(plan: MemoryPlan, step: Step) -> str:
    match step:
        case FusedKernel():
            return short_kernel_name(step.name)
        case ExternStep():
            return f"{extern_kernel(plan, step.name)} -> {step.name}"
        case NopStep():
            return f"view {step.name}"
        case _:
            assert_never(step)


# ---- the seed's tables ---------------------------------------------------------------------


def realize_report(g: BufferGraph) -> str:
    """The realize table (FX node, IR node, realized, buffer, rule)."""
    return realize_table(g)


def read_writes_report(g: ScheduleGraph) -> str:
    """Per scheduler node: reads = {...}, writes = {...}, then each dep."""
    out: list[str] = []
    for n in g.nodes:
        rw = n.read_writes
        out.append(f"{n.name}  ({n.kind}, group {n.group}, ops {', '.join(n.ops) or '-'})")
        out.append(f"  reads  = {names({d.name for d in rw.reads})}")
        out.append(f"  writes = {names({d.name for d in rw.writes})}")
        out += [f"    read  {d.show()}" for d in rw.sorted_reads()]
        out += [f"    write {d.show()}" for d in rw.sorted_writes()]
    return "\n".join(out) if out else "(no scheduler nodes)"


def fusion_report(s: FusedSchedule) -> str:
    """Every fusion decision, then the steps it produced."""
    rows = [("round", "direction", "pair", "verdict", "score", "reason")]
    for d in s.fusion_log:
        rows.append((str(d.round), d.direction, f"{d.node1} + {d.node2}", d.verdict, str(d.score), d.reason))
    log = table(rows) if len(rows) > 1 else "(no pair was considered: nothing to fuse)"
    steps = [("step", "kind", "nodes"), *(_step_row(st) for st in s.steps)]
    return log + "\n\nresulting steps:\n" + table(steps, indent="  ")


def overlap_report(s: FusedSchedule) -> str:
    """The overlap stage's moves (passes/overlap.py): each collective's issue and
    wait, the step it moved from and to, what bound it, and the bytes in flight."""
    rows = [("node", "role", "from step", "to step", "bound", "bytes in flight")]
    rows += [(d.node, str(d.role), str(d.before), str(d.after), d.bound, str(d.in_flight_bytes)) for d in s.overlap_log]
    return table(rows) if len(rows) > 1 else "(no collective moved: none in the graph, or overlap_bytes_limit is 0)"


def _step_row(st: Step) -> tuple[str, str, str]:
    match st:
        case FusedKernel():
            return (st.name, st.kind, ", ".join(st.nodes))
        case ExternStep():
            return (f"extern {st.name}", "extern", st.name)
        case NopStep():
            return (f"nop {st.name}", "nop", st.name)
        case _:
            assert_never(st)


def last_usage_report(plan: MemoryPlan) -> str:
    """Per step of the chosen order: allocations, reuses, last_usage, frees, live bytes."""
    rows = [("#", "step", "alloc", "reuse", "last_usage", "free", "live")]
    for i, ps in enumerate(plan.steps):
        rows.append((
            str(i),
            step_label(plan, ps.step),
            ", ".join(ps.allocs) or "-",
            ", ".join(f"{new}<-{old}" for new, old in ps.reuses) or "-",
            names(ps.last_usage),
            ", ".join(ps.frees) or "-",
            fmt_bytes(ps.live_bytes),
        ))
    removed = names(plan.removed) if plan.removed else "none"
    return table(rows) + f"\n\nkernel-internal buffers (kept in registers, never allocated): {removed}"


def reuse_report(plan: MemoryPlan) -> str:
    """Each reuse: the new buffer, the freed buffer whose storage it takes, and when
    (in place: at the kernel that reads the old one for the last time)."""
    bg = plan.buffer_graph
    lines = []
    for i, ps in enumerate(plan.steps):
        for new, old in ps.reuses:
            size = fmt_bytes(bg.layout(new).nbytes)
            how = "  # in place" if new in ps.inplace else f"; del {old}  # reuse"
            lines.append(f"step {i} ({step_label(plan, ps.step)}): {new} = {old}{how}, saves {size}")
    return "\n".join(lines) if lines else "no reuse: no freed buffer had the size, dtype and device of a new one"


def peak_step(plan: MemoryPlan) -> int | None:
    """The step with the most live bytes (the first, on ties); None without steps."""
    if not plan.steps:
        return None
    return max(range(len(plan.steps)), key=lambda i: (plan.steps[i].live_bytes, -i))


def peak_report(plan: MemoryPlan) -> str:
    at = peak_step(plan)
    where = "before any step (inputs only)" if at is None else f"at step {at} ({step_label(plan, plan.steps[at].step)})"
    cands = ", ".join(f"{n}={b} B" for n, b in plan.candidates) or "-"
    if plan.shapes:  # symbolic sizes: the peak is an expression, the figures at the hints
        from coil.passes.plan_memory import peak_expression

        at_hints = ", ".join(f"{f.symbol}={f.hint}" for f in plan.shapes.facts)
        where = f"{where}; peak {peak_expression(plan)} bytes, at the hints ({at_hints})"
    return (
        f"peak {plan.peak_bytes} bytes ({fmt_mib(plan.peak_bytes)}) {where}\n"
        f"order strategy: {plan.strategy}; candidates: {cands}"
    )


# Externs kept on purpose: the vendor kernels of matrix products, convolutions and
# attention (decompositions.py's _KEEP_EXTERN and their backward kernels).
_MATMUL_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul",
                         "linear", "int_mm", "scaled_mm", "addmm_activation"})
_CONVOLUTION = re.compile(r"convolution|^conv(\dd|_transpose\dd|_tbc|_depthwise)|^slow_conv|^thnn_conv")


def aten_op_name(kernel: str) -> str:
    """`aten.constant_pad_nd.default` -> `constant_pad_nd`; another namespace's
    kernel (prims, a custom op) keeps its full name."""
    parts = kernel.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else kernel


def is_vendor_extern(kernel: str) -> bool:
    """Whether an extern calls a matmul, convolution or attention kernel: those stay
    externs by design; any other one is an op coil has no lowering for."""
    name = aten_op_name(kernel).lstrip("_")
    return name in _MATMUL_OPS or bool(_CONVOLUTION.search(name)) or "attention" in name


def fusion_splitting_externs(g: BufferGraph) -> tuple[ExternBuffer, ...]:
    """The externs that are not matmul, convolution or attention, in graph order."""
    return tuple(b for b in g.buffers if isinstance(b, ExternBuffer) and not is_vendor_extern(b.kernel))


def extern_report(g: BufferGraph) -> str:
    """A table of the externs that split fusion: an aten call kept whole writes its
    inputs out and reads its result back, and no kernel fuses across it."""
    rows = [("extern", "aten op", "origin")]
    rows += [(b.name, b.kernel, ", ".join(b.origins)) for b in fusion_splitting_externs(g)]
    if len(rows) == 1:
        return "none: every op but matmul, convolution and attention was lowered to kernels"
    return table(rows)


def full_report(bg: BufferGraph, plan: MemoryPlan) -> str:
    """Every table of the seed, in pipeline order."""
    s = plan.schedule
    return "\n".join([
        section("realize: which FX nodes became buffers, and why", realize_report(bg)),
        section("read_writes (extract_deps)", read_writes_report(s.graph)),
        section("fusion decisions (fuse)", fusion_report(s)),
        *([section("communication overlap (overlap)", overlap_report(s))] if s.overlap_log else []),
        section("last_usage and frees per step (plan_memory)", last_usage_report(plan)),
        section("reuse decisions", reuse_report(plan)),
        section("peak memory", peak_report(plan)),
    ])


# ---- lifetimes -----------------------------------------------------------------------------


@attrs.frozen
class Lifetime:
    """One buffer's life: born before step `born` runs (-1: a graph input, alive at
    `call(args)`), dies after step `freed` (None: returned or alive to the end)."""

    name: str
    kind: str  # input | buffer | output | view
    born: int
    freed: int | None
    nbytes: int
    layout: str
    reuses: str | None  # the freed buffer whose storage it takes


def _short_layout(bg: BufferGraph, name: str) -> str:
    lay = bg.get(name).layout
    if lay is None:
        return "tuple"
    dt = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
          "int32": "i32", "bool": "b8"}
    d = str(lay.dtype).removeprefix("torch.")
    return f"{dt.get(d, d)}[{','.join(map(str, lay.size))}]"


def returned_storage(bg: BufferGraph) -> frozenset[str]:
    """The outputs and every buffer an output views: all live to the end."""
    out: set[str] = set()
    todo = [o for o in bg.outputs if o is not None]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        b = bg.get(name)
        if isinstance(b, AliasBuffer):
            todo.append(b.base)
    return frozenset(out)


def lifetimes(plan: MemoryPlan) -> tuple[Lifetime, ...]:
    """Every buffer that holds storage or names a view, inputs first, then by birth;
    symbolic sizes in bytes at their hints, as the plan's live bytes are."""
    bg = plan.buffer_graph
    outputs = returned_storage(bg)
    born: dict[str, int] = {i.name: -1 for i in bg.inputs}
    reused: dict[str, str] = {}
    freed: dict[str, int] = {}
    for i, ps in enumerate(plan.steps):
        for n in ps.step.nodes:
            if n not in plan.removed:
                born.setdefault(n, i)
        for new, old in ps.reuses:
            reused[new] = old
        for f in ps.frees:
            freed.setdefault(f, i)
    out = []
    for name, b in born.items():
        buf = bg.get(name)
        kind = ("input" if isinstance(buf, InputBuffer) else "view" if isinstance(buf, AliasBuffer)
                else "output" if name in outputs else "buffer")
        nbytes = 0 if kind == "view" or buf.layout is None else plan.shapes.hint(buf.layout.nbytes)  # at the hints
        end = None if name in outputs else freed.get(name)
        out.append(Lifetime(name, kind, b, end, nbytes, _short_layout(bg, name), reused.get(name)))
    return tuple(out)


def lifetime_chart(plan: MemoryPlan, path: str, title: str | None = None) -> str:
    """Write the buffer-lifetime chart (PNG) to `path`; returns `path`."""
    from coil.report_chart import draw_lifetimes

    draw_lifetimes(plan, lifetimes(plan), path, title)
    return path


# ---- debug_dir -----------------------------------------------------------------------------


def _write(directory: str, filename: str, text: str) -> None:
    with open(os.path.join(directory, filename), "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def _extras_buffers(ir: BufferGraph, directory: str) -> None:
    _write(directory, "realize_table.txt", realize_report(ir))


def _extras_schedule(ir: ScheduleGraph, directory: str) -> None:
    _write(directory, "read_writes.txt", read_writes_report(ir))


def _extras_fused(ir: FusedSchedule, directory: str) -> None:
    _write(directory, "fusion_log.txt", fusion_report(ir))
    if ir.overlap_log:
        _write(directory, "overlap_log.txt", overlap_report(ir))


def _extras_plan(ir: MemoryPlan, directory: str) -> None:
    _write(directory, "memory_plan.txt", "\n".join([
        section("last_usage and frees per step", last_usage_report(ir)),
        section("reuse decisions", reuse_report(ir)),
        section("peak memory", peak_report(ir)),
    ]))
    lifetime_chart(ir, os.path.join(directory, "lifetimes.png"))


def _extras_module(ir: CompiledModule, directory: str) -> None:
    _write(directory, "output_code.py", ir.source)


# What each language adds to debug_dir beyond its printed IR; keyed by type so a
# renamed or inserted stage still gets the files of the language it returns.
DEBUG_EXTRAS: dict[type, Callable[[Any, str], None]] = {
    BufferGraph: _extras_buffers,
    ScheduleGraph: _extras_schedule,
    FusedSchedule: _extras_fused,
    MemoryPlan: _extras_plan,
    CompiledModule: _extras_module,
}


def new_graph_dir(debug_dir: str, kind: str = "graph") -> str:
    """A new folder `<debug_dir>/<n>_<kind>` for one compiled graph's files: n counts
    up from one more than the largest number there, so no graph overwrites
    another's (an inference graph and a training step's forward and backward, or
    graphs of earlier runs), even with two processes writing at once."""
    os.makedirs(debug_dir, exist_ok=True)
    taken = [int(m.group(1)) for e in os.listdir(debug_dir) if (m := re.match(r"(\d+)_", e))]
    n = max(taken, default=-1) + 1
    while True:
        path = os.path.join(debug_dir, f"{n}_{kind}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            n += 1


def write_debug_dir(index: int, stage: str, ir: Any, directory: str) -> None:
    """Options.debug_dir (one graph's folder in it, new_graph_dir): the printed IR
    of stage `index` (`NN_stage.txt`), plus the language's extra files
    (realize_table.txt, read_writes.txt, fusion_log.txt, memory_plan.txt,
    lifetimes.png, output_code.py)."""
    os.makedirs(directory, exist_ok=True)
    show_ir = printer_of(ir)
    text = repr(ir) if show_ir is None else show_ir(ir)  # a user's stage may return a language coil cannot print
    _write(directory, f"{index:02d}_{stage}.txt", text)
    extra = DEBUG_EXTRAS.get(type(ir))
    if extra is not None:
        extra(ir, directory)


def debug_dir_observer(run: Run) -> StageHook | None:
    """Options.debug_dir as a pipeline observer: a new folder for the run's graph
    (named by its kind) holding the aten graph coil was handed (`graph.txt`,
    written first, so a graph that fails to lower still shows what it was), then
    each stage's files in it."""
    if not run.options.debug_dir:
        return None
    directory = new_graph_dir(run.options.debug_dir, run.kind)
    _write(directory, "graph.txt", run.gm.print_readable(print_output=False, include_stride=True, include_device=True))
    return functools.partial(write_debug_dir, directory=directory)
