"""Combo launches: neighbouring calls of static pointwise kernels, none of which
touches what another writes, launched as one kernel (Inductor's combo and foreach
kernels: a compiled optimizer step updates each parameter in a kernel of its
own; launched together, the host pays for one launch instead of one a parameter).

wrap calls `combine_launches` last, on a target whose traits have `combos`
(Triton's), where Options.combo_launches is on and the graph's sizes are static.
The decision is a value: each combo is a KernelSpec of space Combo in
WrapperProgram.combos, naming its members and the first program of each, and
the KernelCall that launches it names the combo.

A run of calls becomes one combo where:
- each member is a static pointwise kernel of one flat launch (no choice, no int64
  twin, no device asserts);
- no member writes a storage another member of the run reads or writes, storage
  followed through the run's reuses and views (they run at the same time);
- between them lie only allocations, reuses, views and frees: the frees move after
  the combo's call, everything else keeps its place before it;
- the run keeps the traits' limits on members and pointer arguments;
- the program keeps its invariants with the run combined (check_lifetimes,
  check_reuse, check_peak: moving frees later must not raise the planned peak);
  a run that would break one stays as separate calls."""

from __future__ import annotations

from typing import Sequence

import attrs

from coil.ir.invariants import InvariantError, check_lifetimes, check_peak, check_reuse
from coil.ir.kernel import (
    Combo,
    Flat,
    KernelKind,
    KernelLaunch,
    KernelSpec,
    LaunchConfig,
    LaunchRule,
    Param,
    ParamRole,
    Tails,
)
from coil.ir.wrapper import Alloc, Free, KernelCall, Line, ReinterpretView, Reuse, WrapperProgram
from coil.options import ComboTraits

COMBO_PREFIX = "triton_combo"


def combinable(k: KernelSpec) -> bool:
    """Whether a kernel may be a combo's member: static, pointwise, one flat launch
    of its own programs along grid axis 0."""
    if k.kind != KernelKind.POINTWISE or not isinstance(k.space, Flat) or k.space.numel == 0:
        return False
    if k.symbols or k.choice is not None or k.wide is not None or k.wide_index or k.asserts:
        return False
    if len(k.launches) != 1:
        return False
    ln = k.launches[0]
    return ln.rule is LaunchRule.POINTWISE and ln.grid[1:] == (1, 1) and len(ln.sizes) == 1


def storage_roots(lines: Sequence[Line]) -> dict[str, str]:
    """Each name a reuse or view binds -> the name whose storage it is (followed to
    the first: a reuse of a view of an input is the input's storage)."""
    root: dict[str, str] = {}
    for ln in lines:
        if isinstance(ln, Reuse):
            root[ln.new] = root.get(ln.old, ln.old)
        elif isinstance(ln, ReinterpretView):
            root[ln.name] = root.get(ln.base, ln.base)
    return root


def conflicts(members: Sequence[KernelSpec], root: dict[str, str]) -> str | None:
    """Why these kernels may not run at the same time: one writes a storage another
    reads or writes; None where none does."""
    touched: dict[str, str] = {}  # storage -> the first member touching it
    written: dict[str, str] = {}
    for k in members:
        mine_w = {root.get(p.name, p.name) for p in k.params if p.role is ParamRole.OUT}
        mine = {root.get(p.name, p.name) for p in k.params}
        for s in sorted(mine_w):
            if s in touched:
                return f"{k.name} writes {s}, which {touched[s]} touches"
        for s in sorted(mine):
            if s in written:
                return f"{k.name} touches {s}, which {written[s]} writes"
        for s in mine:
            touched.setdefault(s, k.name)
        for s in mine_w:
            written.setdefault(s, k.name)
    return None


def combo_spec(name: str, members: Sequence[KernelSpec]) -> KernelSpec:
    """The combo of `members`, in launch order: its pointers are the members' (each
    buffer once a role), reads then writes; one launch of all their programs, at
    the most warps any member takes."""
    starts: list[int] = []
    total = 0
    for k in members:
        starts.append(total)
        total += k.launches[0].grid[0]
    reads = dict.fromkeys(p.name for k in members for p in k.params if p.role is ParamRole.IN)
    writes = dict.fromkeys(p.name for k in members for p in k.params if p.role is ParamRole.OUT)
    params = (*(Param(n, ParamRole.IN, f"in_ptr{i}") for i, n in enumerate(reads)),
              *(Param(n, ParamRole.OUT, f"out_ptr{i}") for i, n in enumerate(writes)))
    warps = max(k.launches[0].config.num_warps for k in members)
    xblock = max(k.launches[0].config.xblock for k in members)
    parts = ", ".join(f"{k.name} [{s}, {s + k.launches[0].grid[0]})" for k, s in zip(members, starts))
    why = (f"{len(members)} independent pointwise kernels in one launch, each program running one of a "
           f"member's own: {parts}; num_warps the most a member takes")
    # not `fixed`: precompiling takes it (autotuning never meets a combo: wrap makes none under it)
    launch = KernelLaunch(name, (total, 1, 1), (total,), LaunchConfig(xblock, 0, warps), LaunchRule.COMBO, why)
    numel = sum(k.group[0] for k in members)
    return KernelSpec(name, KernelKind.POINTWISE, (numel, 1), members[0].device,
                      Combo(tuple(k.name for k in members), tuple(starts)), params, (), (), False,
                      Tails(False, False), (launch,))


def _runs(w: WrapperProgram, traits: ComboTraits) -> list[list[int]]:
    """Candidate runs: line indices of neighbouring calls of combinable kernels on
    one device, apart from one another, within the traits' limits."""
    root = storage_roots(w.lines)
    runs: list[list[int]] = []
    cur: list[int] = []

    def close() -> None:
        if len(cur) > 1:
            runs.append(list(cur))
        cur.clear()

    for i, ln in enumerate(w.lines):
        if isinstance(ln, (Alloc, Reuse, ReinterpretView, Free)):
            continue
        if not isinstance(ln, KernelCall) or not combinable(k := w.spec(ln.kernel)):
            close()
            continue
        if cur:
            members = [w.spec(w.lines[j].kernel) for j in cur] + [k]  # type: ignore[union-attr]
            pointers = {(p.name, p.role) for m in members for p in m.params}
            if (len(members) > traits.max_members or len(pointers) > traits.max_pointers
                    or k.device != members[0].device or conflicts(members, root) is not None):
                close()
        cur.append(i)
    close()
    return runs


def _combined(lines: Sequence[Line], run: list[int], call: KernelCall) -> list[Line]:
    """The lines with the run's calls replaced by `call`, the combo's: the lines
    between them keep their order before it, their frees move after it."""
    first, last = run[0], run[-1]
    between = [ln for j, ln in enumerate(lines[first:last + 1], first) if j not in run]
    kept = [ln for ln in between if not isinstance(ln, Free)]
    frees = [ln for ln in between if isinstance(ln, Free)]
    return [*lines[:first], *kept, call, *frees, *lines[last + 1:]]


def _trial(w: WrapperProgram, at: list[int], name: str) -> WrapperProgram | None:
    """`w` with the calls at lines `at` combined into `name`, or None where the
    program would break an invariant so."""
    spec = combo_spec(name, [w.spec(w.lines[j].kernel) for j in at])  # type: ignore[union-attr]
    lines = _combined(w.lines, at, KernelCall(name, tuple(p.name for p in spec.params)))
    trial = attrs.evolve(w, lines=tuple(lines), combos=(*w.combos, spec))
    try:
        check_lifetimes(trial)
        check_reuse(trial)
        check_peak(trial)
    except InvariantError:
        return None
    return trial


def combine_launches(w: WrapperProgram, traits: ComboTraits) -> WrapperProgram:
    """`w` with each run of independent static pointwise kernel calls launched as
    one combo, where the program keeps its invariants so (module docstring): of a
    run that would not, the longest stretch from its first call that does, then
    from the call after that stretch."""
    out = w
    offset = 0  # lines removed by the combos made so far
    for run in _runs(w, traits):
        start = 0
        while start < len(run) - 1:
            for end in range(len(run), start + 1, -1):  # the longest stretch first
                at = [j - offset for j in run[start:end]]
                if (trial := _trial(out, at, f"{COMBO_PREFIX}_{len(out.combos)}")) is not None:
                    out = trial
                    offset += end - start - 1
                    start = end
                    break
            else:
                start += 1
    return out
