"""`show(ir) -> str`: every IR language as text a person can read.  Shared
subtrees of a body print once, as numbered temporaries.  This module prints the
front half of the chain (printer_back the rest); which function prints which
language is the table in coil.ir.registry."""

from __future__ import annotations

from typing import Any, Callable

import torch

from coil.ir.buffers import AliasBuffer, BufferGraph, ComputedBuffer, ExternBuffer, MultiOutputBuffer
from coil.ir.expr import Expr, dtype_name, result_name, show_expr
from coil.ir.lowered import Extern, Input, LoweredGraph, MapArg, MultiOutput, PyTuple, Pointwise, Reduction, TensorRef, View
from coil.ir.schedule import ScheduleGraph


def printer_of(ir: Any) -> Callable[[Any], str] | None:
    """The printer of ir's language, or None when coil knows no such language."""
    from coil.ir.registry import PRINTERS  # imported here: the table imports this module's printers

    return PRINTERS.get(type(ir))


def show(ir: Any) -> str:
    """Print any IR language (LoweredGraph ... CompiledModule)."""
    fn = printer_of(ir)
    if fn is None:
        raise TypeError(f"no printer for {type(ir).__name__}")
    return fn(ir)


def body_lines(body: Expr, indent: str = "    ") -> list[str]:
    lines = show_expr(body)
    return [indent + ln for ln in lines] + [indent + f"return {result_name(body)}"]


def fmt_arg(a: Any) -> str:
    if isinstance(a, TensorRef):
        return a.name
    if isinstance(a, PyTuple):
        return "(" + ", ".join(fmt_arg(x) for x in a) + ("," if len(a) == 1 else "") + ")"
    if isinstance(a, tuple):
        return "[" + ", ".join(fmt_arg(x) for x in a) + "]"
    if isinstance(a, MapArg):
        return "{" + ", ".join(f"{k!r}: {fmt_arg(v)}" for k, v in a.items) + "}"
    if isinstance(a, torch._ops.OpOverload):  # the op a higher-order op calls
        return str(a)
    return repr(a)


def fmt_size(size: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in size) + "]"


def show_lowered(g: LoweredGraph) -> str:
    out = ["LoweredGraph"]
    for n in g.nodes:
        match n:
            case Input():
                kind = "Constant" if n.value is not None else "Token" if n.token else "Input"
                out.append(f"  {n.name} = {kind}({n.layout.show()}{', donated' if n.donated else ''})")
            case Pointwise():
                out.append(f"  {n.name} = Pointwise[{dtype_name(n.dtype)}{fmt_size(n.ranges)}] from {n.origin} ({n.op}):")
                out += body_lines(n.body)
            case Reduction():
                out.append(
                    f"  {n.name} = Reduction[{n.reduction_type}, {dtype_name(n.dtype)}{fmt_size(n.ranges)}"
                    f" over {fmt_size(n.reduction_ranges)}] from {n.origin} ({n.op}):"
                )
                out += body_lines(n.body)
            case View():
                idx = ", ".join(str(i) for i in n.index)
                out.append(f"  {n.name} = View[{dtype_name(n.dtype)}{fmt_size(n.ranges)}] of {n.base}[{idx}] from {n.origin} ({n.op})")
            case Extern():
                args = ", ".join([fmt_arg(a) for a in n.args] + [f"{k}={fmt_arg(v)}" for k, v in n.kwargs])
                lay = n.layout.show() if n.layout else f"the size {n.scalar}" if n.scalar is not None else "tuple"
                mut = f" mutates {list(n.mutated)}" if n.mutated else ""
                sized = " sized_by_data" if n.sized_by_data else ""
                eager = (" eager strides [" + ", ".join("-" if st is None else str(list(st)) for st in n.arg_strides)
                         + "]" if n.arg_strides else "")
                out.append(f"  {n.name} = Extern {n.kernel}({args}) -> {lay}{mut}{sized}{eager} from {n.origin}")
            case MultiOutput():
                out.append(f"  {n.name} = MultiOutput {n.extern}{list(n.index)} -> {n.layout.show()}")
    out.append(f"  return ({', '.join(str(o) for o in g.outputs)},)")
    return "\n".join(out)


def show_buffers(g: BufferGraph) -> str:
    out = ["BufferGraph"]
    for i in g.inputs:
        out.append(f"  {i.name}: InputBuffer {i.layout.show()}{' constant' if i.value is not None else ' token' if i.token else ''}{' donated' if i.donated else ''}")
    for b in g.buffers:
        origins = ", ".join(b.origins)
        match b:
            case ComputedBuffer():
                red = f", {b.reduction_type} over {fmt_size(b.reduction_ranges)}" if b.is_reduction else ""
                order = f"  inner order {list(b.inner_order)}" if b.inner_order else ""
                order += f"  walk order {list(b.walk_order)}" if b.walk_order else ""
                out.append(f"  {b.name}: ComputedBuffer {b.layout.show()}{red}  rule={b.rule}{order}  origins=[{origins}]")
                out += body_lines(b.body)
            case ExternBuffer():
                args = ", ".join([fmt_arg(a) for a in b.args] + [f"{k}={fmt_arg(v)}" for k, v in b.kwargs])
                lay = b.layout.show() if b.layout else f"the size {b.scalar}" if b.scalar is not None else "tuple"
                coll = f"  {b.collective.show()}" if b.collective is not None else ""
                out.append(f"  {b.name}: ExternBuffer {b.kernel}({args}) -> {lay}  rule={b.rule}  origins=[{origins}]{coll}")
            case MultiOutputBuffer():
                out.append(f"  {b.name}: MultiOutputBuffer {b.extern}{list(b.index)} {b.layout.show()}  rule={b.rule}")
            case AliasBuffer():
                out.append(f"  {b.name}: AliasBuffer of {b.base} {b.layout.show()}  rule={b.rule}  origins=[{origins}]")
    out.append(f"  return ({', '.join(str(o) for o in g.outputs)},)")
    return "\n".join(out)


def show_schedule(g: ScheduleGraph) -> str:
    out = ["ScheduleGraph"]
    for n in g.nodes:
        out.append(f"  {n.name}: SchedulerNode {n.kind} group={n.group} ops=[{', '.join(n.ops)}]")
        for d in n.read_writes.sorted_reads():
            out.append(f"    read  {d.show()}")
        for d in n.read_writes.sorted_writes():
            out.append(f"    write {d.show()}")
    if g.mutation_real_name:
        out.append("  mutation_real_name: " + ", ".join(f"{a}->{b}" for a, b in g.mutation_real_name))
    return "\n".join(out)


def realize_table(g: BufferGraph) -> str:
    """The seed's table: FX node, IR node, realized?, why."""
    rows = [("FX node", "IR node", "realized", "buffer", "rule")]
    for r in g.realize_table:
        rows.append((r.fx_node, r.ir_node, "yes" if r.realized else "no", r.buffer or "-", r.rule))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
