"""Printers for the back half of the chain: FusedSchedule, MemoryPlan,
WrapperProgram, CompiledModule (listed in coil.ir.registry)."""

from __future__ import annotations

from coil.ir.fused import ExternStep, FusedKernel, FusedSchedule, NopStep
from coil.ir.memory import MemoryPlan
from coil.ir.kernel import Combo
from coil.ir.module import CompiledModule
from coil.ir.printer import fmt_arg
from coil.ir.wrapper import (
    Alloc,
    Bind,
    ExternCall,
    Free,
    FreeKind,
    KernelCall,
    MultiOutputLine,
    ReinterpretView,
    Return,
    Reuse,
    WrapperProgram,
)


def _names(xs: object) -> str:
    return "[" + ", ".join(sorted(xs)) + "]"  # type: ignore[call-overload]


def step_label(step: object) -> str:
    match step:
        case FusedKernel():
            return f"{step.name} {step.kind} group={step.group} nodes=[{', '.join(step.nodes)}]"
        case ExternStep():
            return f"extern {step.name}"
        case NopStep():
            return f"nop {step.name}"
    return repr(step)


def show_fused(s: FusedSchedule) -> str:
    out = ["FusedSchedule"]
    out += ["  " + step_label(st) for st in s.steps]
    if s.fusion_log:
        out.append("  fusion log:")
        for d in s.fusion_log:
            out.append(f"    round {d.round} {d.direction} {d.node1} + {d.node2}: {d.verdict} ({d.reason})")
    if s.overlap_log:
        out.append("  overlap log:")
        out += [f"    {d.show()}" for d in s.overlap_log]
    return "\n".join(out)


def show_plan(p: MemoryPlan) -> str:
    cands = ", ".join(f"{n}={b}" for n, b in p.candidates)
    out = [f"MemoryPlan order={p.strategy} peak_bytes={p.peak_bytes}" + (f" (candidates: {cands})" if cands else "")]
    out.append(f"  removed (kept in registers): {_names(p.removed)}")
    for i, ps in enumerate(p.steps):
        out.append(f"  step {i}: {step_label(ps.step)}" + ("  (elided: its source was written into the input in place)"
                                                        if ps.elided else ""))
        if ps.allocs:
            out.append(f"    alloc {', '.join(ps.allocs)}")
        for new, old in ps.reuses:
            out.append(f"    reuse {new} = {old}{' in place' if new in ps.inplace else ''}")
        out.append(f"    last_usage {_names(ps.last_usage)}  live_bytes={ps.live_bytes}")
        if ps.in_flight:
            out.append(f"    in_flight {', '.join(ps.in_flight)}")
        if ps.frees:
            out.append(f"    free {', '.join(ps.frees)}")
    return "\n".join(out)


def show_wrapper(w: WrapperProgram) -> str:
    out = [f"WrapperProgram({', '.join(w.inputs)})", *(f"  # {ln}" for ln in w.sizes.show())]
    for ln in w.lines:
        match ln:
            case Alloc():
                out.append(f"  {ln.name} = alloc {ln.layout.show()}")
            case Reuse():
                only = ", as its base" if ln.as_base else ""
                out.append(f"  {ln.new} = {ln.old}  # in place{only}" if ln.inplace
                           else f"  {ln.new} = {ln.old}; del {ln.old}  # reuse{only}")
            case ReinterpretView() if ln.as_base:
                out.append(f"  {ln.name} = {ln.base}  # as its base: {ln.layout.show()}")
            case ReinterpretView():
                at = "" if ln.base_offset is None else f" at {ln.base}+{ln.delta()}"
                made = "view" if ln.as_view else "reinterpret_tensor"
                out.append(f"  {ln.name} = {made}({ln.base}{at}) {ln.layout.show()}")
            case Bind():
                out.append(f"  {ln.symbol} = {ln.text()}")
            case KernelCall():
                args = ", ".join(ln.args + ln.sizes)
                spec = w.spec(ln.kernel)
                choice = spec.choice
                if isinstance(spec.space, Combo):  # one launch of its members' programs
                    parts = ", ".join(f"{m} [{a}, {b})" for m, a, b in
                                      zip(spec.space.members, spec.space.starts,
                                          (*spec.space.starts[1:], spec.launches[0].grid[0])))
                    calls = [f"  {ln.kernel}({args})  # combo: {parts}, num_warps={spec.launches[0].config.num_warps}"]
                elif choice is None:
                    calls = [f"  {ln.kernel}({args})"]
                else:  # the persistent variant where the row fits it (KernelSpec.choice)
                    calls = [f"  if {choice.test()}: {choice.persistent.name}({args})", f"  else: {ln.kernel}({args})"]
                if spec.wide is not None:  # int32 where the offsets fit (KernelSpec.wide), else the int64 twin
                    calls = [f"  if {spec.wide.test()}:", *("  " + c for c in calls),
                             f"  else: {spec.wide_twin().name}{' (or its persistent variant)' if choice else ''}({args})"]
                out += calls
            case ExternCall():
                args = ", ".join([fmt_arg(a) for a in ln.args] + [f"{k}={fmt_arg(v)}" for k, v in ln.kwargs])
                out.append(f"  {ln.name} = {ln.kernel}({args})")
            case MultiOutputLine():
                out.append(f"  {ln.name} = {ln.extern}{list(ln.index)}")
            case Free():
                kind = {FreeKind.INPUT: "FreeLine", FreeKind.BUFFER: "FreeIfNotReusedLine",
                        FreeKind.NAME: "the name only"}[ln.kind]
                out.append(f"  del {ln.name}  # {kind}")
            case Return():
                out.append(f"  return ({', '.join(str(n) for n in ln.names)},)")
    return "\n".join(out)


def show_module(m: CompiledModule) -> str:
    return m.source
