"""Where each node of a row kernel runs: the stages of a kernel, the loop each node
belongs to (`loop_levels`), what each reduction loop recomputes, and which sums
run online in their max's loop.

A looped reduction reads its rows in RBLOCK steps.  A node runs in the first loop
after every reduction it depends on is finished; per-row values (outer nodes,
reduction results) live between loops, inner values are recomputed from their
bodies in each loop that needs them rather than kept across loops (a loop's
`computes`).  A sum of exp(v - max v) over the row (softmax, log-softmax,
cross_entropy) runs in its max's own loop as an online softmax where the target
has it (`online_sums`): each step rescales the lanes' sums to the row's running
max, which is also the max node's value, so the row is read once for both.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from coil.ir.expr import Cast, Expr, Load, Op, masked_value, rewrite
from coil.ir.kernel import Accumulator, Body, KernelNode, Loop, Outer, Role, Stage, Update


def expanded(nodes: Sequence[KernelNode], body: Expr) -> Expr:
    """`body` with the inner nodes of this kernel it reads replaced by their own
    (expanded) bodies, cast to their buffers' dtypes as a store would."""
    inner = {n.name: n for n in nodes if n.role is Role.INNER}

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.name in inner:
            n = inner[e.name]
            sub = expanded(nodes, n.body)
            sub = sub if sub.dtype == n.dtype else Cast(sub, n.dtype)
            return sub if e.mask is None else masked_value(sub, e.mask)
        return None

    return rewrite(body, fn)


def online_sums(nodes: Sequence[KernelNode]) -> dict[str, str]:
    """Sum reductions of exp(v - m), m the max reduction of the same v in this
    kernel: sum node -> max node.  Floating v only."""
    maxes = {n.name: n for n in nodes if n.reduction_type == "max" and n.body.dtype.is_floating_point}
    out: dict[str, str] = {}
    for b in nodes:
        if b.reduction_type != "sum" or not maxes:
            continue
        e = expanded(nodes, b.body)
        if not (isinstance(e, Op) and e.name == "exp" and isinstance(e.args[0], Op) and e.args[0].name == "sub"):
            continue
        v, m = e.args[0].args
        if (isinstance(m, Load) and m.name in maxes and m.dtype == e.dtype == v.dtype
                and expanded(nodes, maxes[m.name].body) == v):
            out[b.name] = m.name
    return out


def loop_levels(nodes: Sequence[KernelNode], online: Mapping[str, str], two_pass_welford: bool) -> dict[str, int]:
    """For inner and reduction nodes, the loop they run in; for outer nodes, the
    loop before which they run.  A node comes after every loop whose reduction it
    reads (directly, or through the inner nodes it recomputes; a two-pass
    welford_m2 finishes a loop later); an online sum runs in its max's loop."""
    by_name = {n.name: n for n in nodes}
    level: dict[str, int] = {}
    for b in nodes:
        if b.name in online:
            level[b.name] = level[online[b.name]]
            continue
        level[b.name] = max((level[d] + _passes(by_name[d], two_pass_welford) for d in b.deps), default=0)
    return level


def _passes(n: KernelNode, two_pass_welford: bool) -> int:
    """The loops a node's value takes before a reader can use it."""
    if n.role is not Role.REDUCTION:
        return 0
    return 2 if two_pass_welford and n.reduction_type == "welford_m2" else 1


def needed(nodes: Sequence[KernelNode], roots: Sequence[str], online: Mapping[str, str]) -> set[str]:
    """Roots plus the inner nodes they read, transitively (recomputed in the loop);
    an online sum reads its max's value instead of its own body."""
    by_name = {n.name: n for n in nodes}
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in online:
            stack.append(online[n])
            continue
        stack += [d for d in by_name[n].deps if by_name[d].role is Role.INNER]
    return seen


def looped_stages(nodes: Sequence[KernelNode], online: Mapping[str, str],
                  two_pass_welford: bool = False) -> tuple[Stage, ...]:
    """Outer 0, Loop 0, Outer 1, Loop 1, ..., Outer n (the empty ones left out).  A
    loop computes its reductions and the inner nodes it stores, and the inner nodes
    they read; a max with online sums keeps no lane accumulator of its own (its
    value is the running row max they share); a two-pass welford_m2 also takes the
    loop after its own."""
    level = loop_levels(nodes, online, two_pass_welford)
    looped = [level[n.name] + max(_passes(n, two_pass_welford), 1) - 1 for n in nodes if n.role is not Role.OUTER]
    loops = max(looped) + 1 if looped else 0
    stages: list[Stage] = []
    for k in range(loops + 1):
        outer = tuple(n.name for n in nodes if n.role is Role.OUTER and level[n.name] == k)
        if outer:
            stages.append(Outer(k, outer))
        if k == loops:
            break
        here = [n for n in nodes if n.role is not Role.OUTER and level[n.name] == k]
        if not here:
            continue
        roots = [n.name for n in here if n.is_root]
        computes = needed(nodes, roots, online) if roots else set()
        reds = [n for n in here if n.role is Role.REDUCTION]
        stages.append(Loop(k, tuple(n.name for n in here), tuple(n.name for n in nodes if n.name in computes),
                           _accumulators(reds, online, two_pass_welford)))
    return tuple(stages)


def _accumulators(reds: Sequence[KernelNode], online: Mapping[str, str],
                  two_pass_welford: bool) -> tuple[Accumulator, ...]:
    sums = {n.name: online[n.name] for n in reds if n.name in online}
    first_sum = {m: s for s, m in reversed(sums.items())}
    out = []
    for n in reds:
        rt = n.reduction_type
        assert rt is not None
        if n.name in sums:
            out.append(Accumulator(n.name, rt, Update.ONLINE_SUM, sums[n.name]))
        elif n.name in first_sum:
            out.append(Accumulator(n.name, rt, Update.ROW_MAX, first_sum[n.name], dtype=row_max_dtype(n.body.dtype)))
        else:
            out.append(Accumulator(n.name, rt, Update.LANES, second_pass=_passes(n, two_pass_welford) == 2))
    return tuple(out)


def row_max_dtype(dt: torch.dtype) -> torch.dtype:
    """The dtype an online softmax's running row max is kept in: float64 for
    float64 values, else float32 (half values widen, as the sums it rescales are
    float32)."""
    return torch.float64 if dt == torch.float64 else torch.float32


def single_scope(nodes: Sequence[KernelNode]) -> tuple[Stage, ...]:
    """A pointwise, tiled or persistent kernel: one scope, every value in registers."""
    return (Body(tuple(n.name for n in nodes)),)


def has_bool_extreme(nodes: Sequence[KernelNode]) -> bool:
    """A max or min of bools (their partial results would be int1 tiles, which
    Triton's tl.max does not take)."""
    return any(n.body.dtype == torch.bool and n.reduction_type in ("max", "min") for n in nodes)
