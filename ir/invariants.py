"""Invariants of the back half of the chain, one function each.  Each raises
`InvariantError` naming the step and the buffer; users run them on the output of
their own passes.  They re-derive what they check from the IR below the pass (the
read_writes, the wrapper lines), so a pass cannot pass them by being consistent
with itself.

    check_schedule_topological(s)   the fused schedule is acyclic and its order topological
    check_lifetimes(w)              every buffer used at a step is live there: allocated
                                    (or an input) before, freed only after; no double free,
                                    no use after free
    check_reuse(w)                  a reused storage is dead before its new owner is born
    check_peak(w)                   the plan's peak equals a line-by-line replay
    check_kernel_params(w)          each kernel's arguments are exactly its read_writes
                                    minus the buffers kept in registers
    check_indirect_reads(w)         a buffer a kernel reads through an IndirectLoad is
                                    written by an earlier step, never by that kernel,
                                    and never kept in registers (removed)
    check_combos(w)                 each combo launches kernels of the program that no call
                                    launches alone, each in one combo, none writing a
                                    storage another reads or writes (followed through the
                                    reuses and views), their programs laid end to end
    check_views_as_base(w)          a view bound to its base's tensor (as_base) is not
                                    returned, keeps its base's dtype and pointer, and
                                    whatever reads it other than a kernel (an extern, a
                                    Reuse) finds the layout it was planned with
    check_all(w)                    all of the above
"""

from __future__ import annotations

import sympy

from coil.errors import CoilError
from coil.ir.buffers import BufferGraph, ComputedBuffer, freed_nbytes, storage_nbytes
from coil.ir.expr import indirect_loads
from coil.ir.fused import FusedSchedule
from coil.ir.kernel import Combo
from coil.ir.lowered import extern_tensor_names
from coil.ir.schedule import WeakDep
from coil.ir.shapes import Size, norm
from coil.ir.wrapper import (
    Alloc,
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


class InvariantError(CoilError):
    """A broken back-half invariant."""


def check_schedule_topological(s: FusedSchedule) -> None:
    owner: dict[str, int] = {}
    for i, step in enumerate(s.steps):
        for n in step.nodes:
            if n in owner:
                raise InvariantError(f"{n} appears in steps {owner[n]} and {i}")
            owner[n] = i
    missing = {n.name for n in s.graph.nodes} - set(owner)
    if missing:
        raise InvariantError(f"scheduler nodes in no step: {sorted(missing)}")
    for i, step in enumerate(s.steps):
        for n in step.nodes:
            for d in s.graph.node(n).read_writes.reads:
                j = owner.get(d.name)
                if j is not None and j > i:
                    raise InvariantError(f"step {i} ({n}) reads {d.name}, produced later at step {j}: not topological")
                if j == i and d.name != n and step.nodes.index(d.name) > step.nodes.index(n):
                    raise InvariantError(f"inside step {i}, {n} reads {d.name} which runs after it")


def _line_uses(ln: object) -> list[str]:
    match ln:
        case KernelCall():
            return list(ln.args)
        case ExternCall():
            return extern_tensor_names((ln.args, tuple(v for _, v in ln.kwargs)))
        case MultiOutputLine():
            return [ln.extern]
        case ReinterpretView():
            return [ln.base]
        case Reuse():
            return [ln.old]
        case Return():
            return [n for n in ln.names if n is not None]
    return []


def _line_defines(ln: object) -> list[str]:
    match ln:
        case Alloc():
            return [ln.name]
        case Reuse():
            return [ln.new]
        case ReinterpretView() | ExternCall() | MultiOutputLine():
            return [ln.name]
    return []


def check_lifetimes(w: WrapperProgram) -> None:
    live = set(w.inputs)
    freed: set[str] = set()
    base_of: dict[str, str] = {}  # a view's storage owner (a tuple's elements own theirs)
    for k, ln in enumerate(w.lines):
        for used in _line_uses(ln):
            n: str | None = used
            while n is not None:  # reading a view reads its base's storage
                if n in freed:
                    via = "" if n == used else f" (through {used})"
                    raise InvariantError(f"line {k}: {n} used after its free{via}")
                if n not in live:
                    raise InvariantError(f"line {k}: {n} used before it is allocated")
                n = base_of.get(n)
        if isinstance(ln, ReinterpretView):
            base_of[ln.name] = ln.base
        if isinstance(ln, Reuse) and not ln.inplace:  # in place: old's name goes at its Free
            live.discard(ln.old)
            freed.add(ln.old)
        for n in _line_defines(ln):
            if n in live:
                raise InvariantError(f"line {k}: {n} allocated twice")
            live.add(n)
        if isinstance(ln, Free):
            if ln.name in freed:
                raise InvariantError(f"line {k}: {ln.name} freed twice")
            if ln.name not in live:
                raise InvariantError(f"line {k}: {ln.name} freed but never allocated")
            live.discard(ln.name)
            freed.add(ln.name)
    outputs = {n for n in w.schedule_graph.outputs if n is not None}
    if outputs & freed:
        raise InvariantError(f"outputs freed before return: {sorted(outputs & freed)}")


def check_reuse(w: WrapperProgram) -> None:
    """The old owner's last use is before the Reuse line and it is never used after;
    in place, its last use is the kernel call right after, which writes the new one,
    and its name is dropped (a Free of kind NAME), never its storage.  A graph input
    is taken only in place, and only where its caller donated it or where the plan
    writes a buffer back into it (an elided copy_ into the input)."""
    bg = w.buffer_graph
    backs = set(w.plan.write_backs)
    for k, ln in enumerate(w.lines):
        if not isinstance(ln, Reuse):
            continue
        old, new = bg.layout(ln.old), bg.layout(ln.new)
        if (old.nbytes, old.dtype, old.device) != (new.nbytes, new.dtype, new.device):
            raise InvariantError(f"line {k}: {ln.new} reuses {ln.old} of another size, dtype or device")
        if ln.old in {i.name for i in bg.inputs
                      if not (ln.inplace and (i.donated or (ln.new, i.name) in backs))}:
            raise InvariantError(f"line {k}: {ln.new} reuses graph input {ln.old}"
                                 + ("" if ln.inplace else " (only a donated input may be taken, and only in place)"))
        later = list(enumerate(w.lines[k + 1 :], k + 1))
        if ln.inplace:  # the step's other reuses and allocations may come first, then its kernel
            at = next((j for j, x in later if not isinstance(x, (Reuse, Alloc))), None)
            nxt = w.lines[at] if at is not None else None
            # a write-back's kernel may compute its value without reading the old one
            needs = {ln.new} if (ln.new, ln.old) in backs else {ln.old, ln.new}
            if not (isinstance(nxt, KernelCall) and needs <= set(nxt.args)):
                raise InvariantError(f"line {k}: {ln.new} takes {ln.old}'s storage in place, but the next call "
                                     f"is not the kernel that reads {ln.old} and writes {ln.new}")
            later = [(j, x) for j, x in later if at is not None and j > at]
            if not any(isinstance(f, Free) and f.name == ln.old and f.kind is FreeKind.NAME for _, f in later):
                raise InvariantError(f"line {k}: {ln.old}, taken in place by {ln.new}, is not dropped by name")
        for j, after in later:
            if ln.old in _line_uses(after):
                raise InvariantError(f"line {k}: {ln.new} takes {ln.old}'s storage but {ln.old} is used later")
            if isinstance(after, Free) and after.name == ln.old and after.kind is not FreeKind.NAME:
                raise InvariantError(f"line {j}: {ln.old} freed, but {ln.new} took its storage")


def replay_peak_expr(w: WrapperProgram) -> Size:
    """The bytes alive at the wrapper line that peaks at the hints: an int for a
    static graph, an expression of the size symbols for a symbolic one (which the
    hints pick the line of; another size may peak elsewhere)."""
    bg = w.buffer_graph
    hint = bg.sizes.shapes.hint
    live: Size = sum((i.layout.nbytes for i in bg.inputs), 0)
    peak = live
    for ln in w.lines:
        if isinstance(ln, (Alloc, ExternCall, MultiOutputLine)):
            live = norm(live + storage_nbytes(bg, ln.name))
        if isinstance(ln, Free) and ln.kind is not FreeKind.NAME:
            live = norm(live - freed_nbytes(bg, ln.name))
        if hint(live) > hint(peak):
            peak = live
    return peak if isinstance(peak, int) else norm(sympy.expand(peak))


def replay_peak(w: WrapperProgram) -> int:
    """Peak bytes of the wrapper's allocations and frees, at the hints."""
    return w.buffer_graph.sizes.shapes.hint(replay_peak_expr(w))


def check_peak(w: WrapperProgram) -> None:
    got = replay_peak(w)
    if got != w.plan.peak_bytes:
        raise InvariantError(f"peak estimate {w.plan.peak_bytes} bytes, replay of the wrapper gives {got}")


def check_kernel_params(w: WrapperProgram) -> None:
    g = w.schedule_graph
    kernels = {k.name: k for k in w.kernels}
    combos = {c.name: c.space.members for c in w.combos if isinstance(c.space, Combo)}
    for ln in w.lines:
        if not isinstance(ln, KernelCall):
            continue
        want: set[str] = set()
        for name in combos.get(ln.kernel, (ln.kernel,)):  # a combo's: its members'
            for n in kernels[name].nodes:
                rw = g.node(n).read_writes
                want |= {d.name for d in (*rw.reads, *rw.writes) if not isinstance(d, WeakDep)}
        want -= w.plan.removed
        if set(ln.args) != want or len(ln.args) != len(set(ln.args)):
            raise InvariantError(f"{ln.kernel}: arguments {sorted(ln.args)} != read_writes minus removed {sorted(want)}")


def check_combos(w: WrapperProgram) -> None:
    g = w.schedule_graph
    kernels = {k.name: k for k in w.kernels}
    called = [ln.kernel for ln in w.lines if isinstance(ln, KernelCall)]
    owner: dict[str, str] = {}
    storage: dict[str, str] = {}  # a name a reuse or view binds -> the name owning its storage
    for ln in w.lines:
        if isinstance(ln, Reuse):
            storage[ln.new] = storage.get(ln.old, ln.old)
        elif isinstance(ln, ReinterpretView):
            storage[ln.name] = storage.get(ln.base, ln.base)
    for c in w.combos:
        if not isinstance(c.space, Combo):
            raise InvariantError(f"{c.name}: a combo of space {type(c.space).__name__}")
        if called.count(c.name) != 1:
            raise InvariantError(f"{c.name}: a combo called {called.count(c.name)} times")
        end = 0
        touched: dict[str, str] = {}
        written: dict[str, str] = {}
        for m, start in zip(c.space.members, c.space.starts, strict=True):
            if m not in kernels:
                raise InvariantError(f"{c.name}: member {m} is no kernel of the program")
            if m in owner or m in called:
                raise InvariantError(f"{c.name}: member {m} is launched also by {owner.get(m, 'its own call')}")
            owner[m] = c.name
            k = w.spec(m)
            if k.choice is not None or k.wide is not None or k.symbols:
                raise InvariantError(f"{c.name}: member {m} chooses its kernel by call (a persistent variant, an "
                                     "int64 twin, symbolic sizes): a combo runs one fixed kernel a member")
            if len(k.launches) != 1 or k.launches[0].grid[1:] != (1, 1) or start != end:
                raise InvariantError(f"{c.name}: member {m} starts at program {start}, not where the one "
                                     f"before ends ({end}), or has no one flat launch")
            end += k.launches[0].grid[0]
            names: set[str] = set()
            writes: set[str] = set()
            for n in kernels[m].nodes:
                rw = g.node(n).read_writes
                names |= {d.name for d in (*rw.reads, *rw.writes) if not isinstance(d, WeakDep)}
                writes |= {d.name for d in rw.writes if not isinstance(d, WeakDep)}
            roots = {storage.get(n, n) for n in names - w.plan.removed}
            wroots = {storage.get(n, n) for n in writes - w.plan.removed}
            for r in sorted(roots):
                if r in written or (r in wroots and r in touched):
                    raise InvariantError(f"{c.name}: {m} and {written.get(r) or touched[r]} both touch {r}, "
                                         "which one of them writes, at the same time")
            for r in roots:
                touched.setdefault(r, m)
            for r in wroots:
                written.setdefault(r, m)
        if c.launches[0].grid != (end, 1, 1):
            raise InvariantError(f"{c.name}: launches {c.launches[0].grid[0]} programs, its members {end}")


def check_indirect_reads(w: WrapperProgram) -> None:
    """Re-derived from the bodies: an indirect read may touch any element, so the
    whole buffer must exist in memory before the kernel that reads it starts."""
    bg = w.buffer_graph
    for k in w.kernels:
        for n in k.nodes:
            b = bg.get(n)
            if not isinstance(b, ComputedBuffer):
                continue
            for ld in indirect_loads(b.body):
                if ld.name in k.nodes:
                    raise InvariantError(f"{k.name}: {n} reads {ld.name} indirectly, but the same kernel writes it")
                if ld.name in w.plan.removed:
                    raise InvariantError(f"{k.name}: {n} reads {ld.name} indirectly, but {ld.name} is kept in registers")


def check_views_as_base(w: WrapperProgram) -> None:
    bg = w.buffer_graph
    # the storage offset of each name's tensor as the wrapper makes it: a view's own over
    # coil's storage, 0 for what coil allocates
    placed = {ln.name: ln.layout.offset for ln in w.lines if isinstance(ln, ReinterpretView) and ln.base_offset is None}
    root: dict[str, str] = {}  # an as_base name -> the name whose tensor it is
    for k, ln in enumerate(w.lines):
        if isinstance(ln, (ReinterpretView, Reuse)) and ln.as_base:
            name, base = (ln.name, ln.base) if isinstance(ln, ReinterpretView) else (ln.new, ln.old)
            if isinstance(ln, ReinterpretView) and (ln.as_view or ln.base_offset is not None):
                raise InvariantError(f"line {k}: {name} is bound to its base {base}, which coil did not place")
            if ln.layout.dtype != bg.layout(base).dtype:
                raise InvariantError(f"line {k}: {name} is bound to its base {base} of another dtype")
            if isinstance(ln, ReinterpretView) and ln.layout.offset != placed.get(base, 0):
                raise InvariantError(f"line {k}: {name} is bound to its base {base} at another offset")
            root[name] = root.get(base, base)
        elif isinstance(ln, (ExternCall, MultiOutputLine, Reuse)):
            for used in _line_uses(ln):
                if used in root and bg.layout(used) != bg.layout(root[used]):
                    raise InvariantError(f"line {k}: {used} is read as a tensor, bound to {root[used]}'s "
                                         "of another layout")
    returned = {n for n in bg.outputs if n is not None} & set(root)
    if returned:
        raise InvariantError(f"returned names bound to their base's tensor: {sorted(returned)}")


def check_all(w: WrapperProgram) -> None:
    check_schedule_topological(w.schedule)
    check_lifetimes(w)
    check_reuse(w)
    check_peak(w)
    check_kernel_params(w)
    check_combos(w)
    check_indirect_reads(w)
    check_views_as_base(w)
