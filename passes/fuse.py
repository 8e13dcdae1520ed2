"""fuse : ScheduleGraph -> FusedSchedule

Inductor's greedy fixpoint.  Each round collects candidate pairs of groups:
vertical (a producer and a consumer of one of its buffers) and horizontal (two
groups reading the same buffer, neighbours in order only, so a buffer with many
readers costs a linear number of pairs).  Each pair is checked by `can_fuse`
(legality), ranked by `score_fusion_memory` (bytes of the buffers the two share),
and refused when `will_fusion_create_cycle`.  Rounds repeat until nothing fuses or
`fusion_rounds` is reached.  Every pair considered goes into the fusion log.

Beyond Inductor: independent tiny pointwise groups (at most TINY_NUMEL elements,
reading nothing a node of the graph computes: BatchNorm's step counts, one per
layer) are horizontal candidates too, neighbours among those of one size; they
share no bytes, so they rank last, and fused they save a launch each.  Not in a
graph with collectives, whose kernels keep their places around them.
"""

from __future__ import annotations

import heapq
import logging
from typing import Iterable

import attrs

from coil.ir.buffers import ComputedBuffer, Rule, collectives, ordered_externs
from coil.ir.fused import (
    Direction,
    ExternStep,
    FusedKernel,
    FusedSchedule,
    FusionDecision,
    KernelKind,
    NopStep,
    Step,
    Verdict,
)
from coil.ir.kernel import Role
from coil.ir.schedule import NodeKind, ScheduleGraph, WeakDep
from coil.ir.shapes import EMPTY, ShapeInfo, Size, gt, is_static, le, same_size
from coil.options import Options, TargetTraits
from coil.passes.kernel_model import (
    kernel_layouts,
    node_role,
    reads_down_columns,
    reduces,
    reads_in_registers,
    splits_rows,
)

log = logging.getLogger("coil.trace")

TINY_NUMEL = 64  # a pointwise group this small is worth a kernel of its own only for its launch
# the fewest bytes a horizontal fusion may hold across Extern steps before it is refused (_Fuser.hoists)
HOIST_BYTES = 32 << 20


@attrs.frozen
class Group:
    """A candidate kernel: scheduler nodes that will run as one."""

    nodes: tuple[str, ...]  # in original (topological) order
    group: tuple[int, int]
    first: int  # position of its first node
    last: int  # position of its last node

    @property
    def name(self) -> str:
        return self.nodes[0]


def _merged_group(a: tuple[Size, Size], b: tuple[Size, Size]) -> tuple[Size, Size] | None:
    """The group two groups run in together, None when they cannot; symbolic groups
    only where their sizes are equal for every size (never by their hints)."""
    if is_static(a) and is_static(b):
        if a[1] > 1 and b[1] > 1:  # type: ignore[operator]
            return a if a == b else None
        if a[1] > 1:  # type: ignore[operator]
            return a if b[0] in (a[0], a[0] * a[1]) else None
        if b[1] > 1:  # type: ignore[operator]
            return b if a[0] in (b[0], b[0] * b[1]) else None
        return a if a[0] == b[0] else None
    # a reduction unless its rows are provably at most one element (u0 may be 0, 1 or more)
    ra, rb = not le(a[1], 1), not le(b[1], 1)
    if not ra and not same_size(a[1], 1) or not rb and not same_size(b[1], 1):
        return None  # a reduction over at most one element that is not one
    if ra and rb:
        return a if same_size(a[0], b[0]) and same_size(a[1], b[1]) else None
    if ra:
        return a if same_size(b[0], a[0]) or same_size(b[0], a[0] * a[1]) else None
    if rb:
        return b if same_size(a[0], b[0]) or same_size(a[0], b[0] * b[1]) else None
    return a if same_size(a[0], b[0]) else None


class _Fuser:
    def __init__(self, g: ScheduleGraph, options: Options) -> None:
        self.g = g
        self.o = options
        self.pos = {n.name: i for i, n in enumerate(g.nodes)}
        self.bufs = {b.name: b for b in g.graph.buffers if isinstance(b, ComputedBuffer)}
        self.outputs = frozenset(n for n in g.graph.outputs if n is not None)
        self.groups: dict[str, Group] = {}
        self.group_of: dict[str, str] = {}
        self.log: list[FusionDecision] = []
        self._registers: dict[tuple[str, str, tuple[int, int]], bool] = {}
        self._columns: dict[tuple[tuple[str, ...], tuple[Size, Size]], bool] = {}
        self.layouts = kernel_layouts(g)
        # dependency edges between scheduler nodes (producer -> consumers)
        self.consumers: dict[str, set[str]] = {n.name: set() for n in g.nodes}
        self.producers: dict[str, set[str]] = {n.name: set() for n in g.nodes}
        for n in g.nodes:
            for d in n.read_writes.reads:
                if d.name in self.consumers and d.name != n.name:
                    self.consumers[d.name].add(n.name)
                    self.producers[n.name].add(d.name)
        # and between externs that keep the graph's order (random draws, collectives): a
        # kernel fused across two of them (PhiMoE's router: its second exponential noise
        # feeding a kernel that feeds the first rand_like) would have no place in the order
        for chain in ordered_externs(g.graph):
            at = [n for n in chain if n in self.consumers]
            for before, after in zip(at, at[1:]):
                self.consumers[before].add(after)
                self.producers[after].add(before)
        self.readers_of: dict[str, list[str]] = {}
        for n in g.nodes:
            for d in n.read_writes.sorted_reads():
                if not isinstance(d, WeakDep):
                    self.readers_of.setdefault(d.name, []).append(n.name)
        for n in g.nodes:
            if n.kind in (NodeKind.POINTWISE, NodeKind.REDUCTION):
                grp = Group((n.name,), n.group, self.pos[n.name], self.pos[n.name])
                self.groups[n.name] = grp
                self.group_of[n.name] = n.name

    # ---- the three predicates ------------------------------------------------------------

    def can_fuse(self, a: Group, b: Group) -> str | None:
        """None when legal, else the rule that forbids it."""
        if len(a.nodes) + len(b.nodes) > self.o.fusion_limit():
            return f"size: {len(a.nodes) + len(b.nodes)} nodes > max_fusion_size {self.o.fusion_limit()}"
        da = {self.bufs[n].layout.device for n in a.nodes}
        db = {self.bufs[n].layout.device for n in b.nodes}
        if da != db:
            return "device: different devices"
        grp = _merged_group(a.group, b.group)
        if grp is None:
            return f"ranges: groups {a.group} and {b.group} are incompatible"
        members = sorted(a.nodes + b.nodes, key=self.pos.__getitem__)
        for n in members:
            if node_role(self.bufs[n], grp) is None:
                return f"ranges: {n} does not fit group {grp}"
        inside = set(members)
        for c in members:
            for p in self.producers[c]:
                if p in inside and not self.in_registers(c, p, grp):
                    return f"index: {c} reads {p} at another position than {p} writes it"
                if p in inside and self.bufs[p].rule is Rule.LIFETIME and (p in a.nodes) != (c in a.nodes):
                    return (f"lifetime: {p} was realized to free what it reads early (realize's lifetime rule); "
                            f"fused with its reader {c}, it would run as late")
        splits = self.o.traits().splits
        if (splits is not None and self.o.split_second_pass > 0 and gt(grp[1], 1)
                and splits_rows(grp, splits, self.o.split_second_pass)):
            for c in members:
                if node_role(self.bufs[c], grp) is Role.OUTER:
                    continue  # computed once a row, after the row is reduced
                for p in self.producers[c]:
                    if p in inside and self.bufs[p].is_reduction:
                        return (f"split: {c} reads {p} for each element of {grp[0]} row(s) of {grp[1]}; "
                                f"fused, that second pass would run one program a row")
        return self.columns_rule(a, b, members, grp)

    def columns_rule(self, a: Group, b: Group, members: list[str], grp: tuple[Size, Size]) -> str | None:
        """A reduction kernel that reads down columns (reads_down_columns: a block of
        neighbouring columns a program) is not fused with nodes whose reads run along
        its rows: the kernel would read one column a program, a strided element of
        every sector it fetches (ConvNeXt's layer-scale gradient, a column sum,
        fused so with an unrelated product of the same gradient: 93 µs a launch on
        an H100).  Inductor's tiling_prevents_reduction_fusion.  The flat-index
        model is Triton's; a target whose column rule counts stores (the C++
        target's loop nests) decides in its nests."""
        columns = self.o.traits().columns
        if columns.stores_count or not reduces(grp, self.g.shapes):
            return None
        alone = [g for g in (a, b) if reduces(g.group, self.g.shapes) and self.down_columns(g.nodes, g.group)]
        # a node walked in a reduction's order (ComputedBuffer.inner_order) walks its
        # columns: in a kernel that runs rows, one a program, its reads and its store
        # would stride (ConvNeXt's LayerNorm gradient beside its weight's, whose
        # reduction also reads an NCHW input along the rows: 156 µs against 50 + 40)
        ordered = [n for n in members if self.bufs[n].inner_order and node_role(self.bufs[n], grp) is Role.INNER]
        if not (alone or ordered) or self.down_columns(tuple(members), grp):
            return None
        if alone:
            other = b if alone[0] is a else a
            return (f"columns: {alone[0].name} reads down columns, and fused with {other.name} the kernel "
                    f"would not (one column a program)")
        return f"columns: {ordered[0]} walks the reduction's columns, and the kernel would not read down them"

    def down_columns(self, nodes: tuple[str, ...], grp: tuple[Size, Size]) -> bool:
        """reads_down_columns of these nodes in this group, remembered."""
        key = (nodes, grp)
        hit = self._columns.get(key)
        if hit is None:
            hit = self._columns[key] = reads_down_columns([self.bufs[n] for n in nodes], self.layouts, grp,
                                                          self.o.traits().columns, self.g.shapes)
        return hit

    def in_registers(self, consumer: str, producer: str, grp: tuple[int, int]) -> bool:
        """reads_in_registers, remembered: groups grow one merge at a time, so the
        same pairs come back every round (sympy simplification dominates otherwise)."""
        key = (consumer, producer, grp)
        hit = self._registers.get(key)
        if hit is None:
            hit = self._registers[key] = reads_in_registers(self.bufs[consumer], self.bufs[producer], grp)
        return hit

    def score_fusion_memory(self, a: Group, b: Group) -> int:
        """Bytes of the buffers both groups touch (saved when fused)."""
        def touched(grp: Group) -> set[str]:
            out: set[str] = set()
            for n in grp.nodes:
                node = self.g.node(n)
                out |= {d.name for d in (*node.read_writes.reads, *node.read_writes.writes) if not isinstance(d, WeakDep)}
            return out

        common = touched(a) & touched(b)
        hint = self.g.shapes.hint  # symbolic sizes: a score at the hints (it only ranks candidates)
        return sum(hint(self.g.graph.layout(n).nbytes) for n in common if self.g.graph.get(n).layout is not None)

    def hoists(self, a: Group, b: Group, saved: int) -> str | None:
        """Why a horizontal pair is refused for memory, else None.  Fused, the later
        group's kernel runs where the earlier one's does, once its own inputs are
        ready: what it writes is then allocated before the Extern steps between the
        two and held across them.  Refused where that moves it past an Extern and it
        writes at least HOIST_BYTES, more than the fusion saves (the bytes both
        read).  A long grouped conv1d by taps (lowerings/conv_taps.py) is such a
        graph: each chunk's columns (64 MiB) are read by that chunk's bmm alone, and
        fused into one kernel the 16 chunks' columns of Wav2Vec2's large positional
        convolution were all held at once (peak 1101 MiB against Inductor's 386, on
        an H100).  Inductor asks the same question of a horizontal fusion
        (`can_fusion_increase_peak_memory`), with its own estimate.  HOIST_BYTES
        leaves the models suite's other graphs as they were: at 8 MiB the rule
        also refused 8 pairs in Phi's large backward (8 MiB held, 64 KiB saved)
        and one in BART's (16 MiB, 8 MiB), unmeasured on a GPU."""
        first, second = (a, b) if a.first <= b.first else (b, a)
        members = set(a.nodes) | set(b.nodes)
        ready = max((self.pos[p] for n in second.nodes for p in self.producers[n] if p not in members), default=-1)
        passed = [n.name for n in self.g.nodes[max(first.last, ready) + 1:second.first] if n.kind is NodeKind.EXTERN]
        if not passed:
            return None
        hint = self.g.shapes.hint
        held = sum(hint(self.bufs[n].layout.nbytes) for n in second.nodes
                   if n in self.outputs or any(c not in members for c in self.consumers[n]))
        if held < HOIST_BYTES or held <= saved:
            return None
        return (f"memory: fused, {second.name}'s {held} bytes would be written before {len(passed)} Extern "
                f"step(s) ({passed[0]}...) and held across them, for {saved} bytes saved")

    def will_fusion_create_cycle(self, a: Group, b: Group, prune: bool = True) -> bool:
        """True when a path leaves one group through an outside group and comes back
        into the other: merging would make that path a cycle.  The walk moves group
        by group (a fused group is one node of the graph).  With `prune`, groups that
        start after both a and b are not entered: cheap, and a round that slips a
        cycle through anyway is undone and redone without pruning (see `fuse`)."""
        members = set(a.nodes) | set(b.nodes)
        hi = max(a.last, b.last)
        stack = [c for n in members for c in self.consumers[n] if c not in members]
        seen: set[str] = set()
        while stack:
            x = stack.pop()
            key = self.group_of.get(x, x)
            if key in seen:
                continue
            seen.add(key)
            grp = self.groups.get(key)
            nodes = grp.nodes if grp is not None else (x,)
            if prune and (grp.first if grp is not None else self.pos[x]) > hi:
                continue
            for n in nodes:
                for c in self.consumers[n]:
                    if c in members:
                        return True
                    stack.append(c)
        return False

    def is_acyclic(self) -> bool:
        """Kahn's algorithm over the current groups (one unit per group)."""
        unit = {n.name: self.group_of.get(n.name, n.name) for n in self.g.nodes}
        indeg: dict[str, int] = {u: 0 for u in set(unit.values())}
        succ: dict[str, set[str]] = {u: set() for u in indeg}
        for n, prods in self.producers.items():
            for p in prods:
                a, b = unit[p], unit[n]
                if a != b and b not in succ[a]:
                    succ[a].add(b)
                    indeg[b] += 1
        ready = [u for u, d in indeg.items() if d == 0]
        done = 0
        while ready:
            u = ready.pop()
            done += 1
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        return done == len(indeg)

    # ---- rounds -------------------------------------------------------------------------------

    def candidates(self) -> Iterable[tuple[str, str, Direction]]:
        seen: set[tuple[str, str]] = set()
        for gname, grp in self.groups.items():
            for n in grp.nodes:
                for c in self.consumers[n]:
                    other = self.group_of.get(c)
                    if other is not None and other != gname:
                        key = (gname, other)
                        if key not in seen:
                            seen.add(key)
                            yield gname, other, Direction.VERTICAL
        for name, readers in self.readers_of.items():
            gs = list(dict.fromkeys(self.group_of[r] for r in readers if r in self.group_of))
            for x, y in zip(gs, gs[1:]):
                key = (x, y) if self.groups[x].first <= self.groups[y].first else (y, x)
                if key not in seen and (key[1], key[0]) not in seen:
                    seen.add(key)
                    yield key[0], key[1], Direction.HORIZONTAL
        if collectives(self.g.graph):
            return  # the program's order and the overlap stage place kernels around collectives
        tiny: dict[tuple[Size, Size], list[Group]] = {}
        for grp in sorted(self.groups.values(), key=lambda g: g.first):
            if self._independent_tiny(grp):
                tiny.setdefault(grp.group, []).append(grp)
        for same in tiny.values():
            for gx, gy in zip(same, same[1:]):
                if (gx.name, gy.name) not in seen:
                    seen.add((gx.name, gy.name))
                    yield gx.name, gy.name, Direction.HORIZONTAL

    def _independent_tiny(self, grp: Group) -> bool:
        """A pointwise group of at most TINY_NUMEL elements whose nodes read nothing
        another node computes: moved anywhere, it delays nothing and holds no memory."""
        return (is_static(grp.group) and grp.group[1] == 1 and grp.group[0] <= TINY_NUMEL  # type: ignore[operator]
                and not any(self.producers[n] for n in grp.nodes))

    def run_round(self, rnd: int, prune: bool = True) -> int:
        ranked: list[tuple[int, int, str, str, Direction]] = []
        for a, b, direction in self.candidates():
            ga, gb = self.groups[a], self.groups[b]
            score = self.score_fusion_memory(ga, gb)
            heapq.heappush(ranked, (-score, min(ga.first, gb.first), a, b, direction))
        fused = 0
        touched: set[str] = set()
        while ranked:
            neg, _, a, b, direction = heapq.heappop(ranked)
            if a in touched or b in touched:
                continue  # reconsidered next round with the merged groups
            ga, gb = self.groups[a], self.groups[b]
            why = self.can_fuse(ga, gb)
            if why is not None:
                self.log.append(FusionDecision(rnd, a, b, direction, Verdict.ILLEGAL, why, -neg))
                continue
            if self.will_fusion_create_cycle(ga, gb, prune):
                self.log.append(FusionDecision(rnd, a, b, direction, Verdict.REFUSED, "cycle", -neg))
                continue
            held = self.hoists(ga, gb, -neg) if direction is Direction.HORIZONTAL else None
            if held is not None:
                self.log.append(FusionDecision(rnd, a, b, direction, Verdict.REFUSED, held, -neg))
                continue
            self.merge(ga, gb)
            touched |= {a, b}
            fused += 1
            saves = f"saves {-neg} bytes" if neg else "saves a launch (independent tiny kernels)"
            self.log.append(FusionDecision(rnd, a, b, direction, Verdict.FUSED, saves, -neg))
            log.debug("fuse %s + %s (%s, score %d)", a, b, direction, -neg)
        return fused

    def merge(self, a: Group, b: Group) -> None:
        grp = _merged_group(a.group, b.group)
        assert grp is not None
        nodes = tuple(sorted(a.nodes + b.nodes, key=self.pos.__getitem__))
        new = Group(nodes, grp, min(a.first, b.first), max(a.last, b.last))
        del self.groups[a.name]
        del self.groups[b.name]
        self.groups[new.name] = new
        for n in nodes:
            self.group_of[n] = new.name

    # ---- final order ----------------------------------------------------------------------------

    def steps(self) -> tuple[Step, ...]:
        """Topological order of the steps, earliest original position first."""
        unit_of: dict[str, str] = {}
        units: dict[str, tuple[str, ...]] = {}
        for n in self.g.nodes:
            gname = self.group_of.get(n.name)
            key = gname if gname is not None else n.name
            unit_of[n.name] = key
            if key not in units:
                units[key] = self.groups[gname].nodes if gname is not None else (n.name,)
        indeg = {k: 0 for k in units}
        succ: dict[str, set[str]] = {k: set() for k in units}
        for n in self.g.nodes:
            for p in self.producers[n.name]:
                a, b = unit_of[p], unit_of[n.name]
                if a != b and b not in succ[a]:
                    succ[a].add(b)
                    indeg[b] += 1
        ready = [(self.pos[units[k][0]], k) for k, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            _, k = heapq.heappop(ready)
            order.append(k)
            for s in succ[k]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, (self.pos[units[s][0]], s))
        if len(order) != len(units):
            raise RuntimeError("fusion produced a cycle")  # will_fusion_create_cycle failed
        return tuple(self._step(units[k]) for k in order)

    def _step(self, nodes: tuple[str, ...]) -> Step:
        node = self.g.node(nodes[0])
        if node.kind is NodeKind.EXTERN:
            return ExternStep(node.name)
        if node.kind is NodeKind.NOP:
            return NopStep(node.name)
        grp = self.groups[self.group_of[nodes[0]]]
        kind = _kind(grp.group, self.o, self.g.shapes)
        traits = self.o.traits()
        column_min = traits.column_loop_min
        if kind is KernelKind.PERSISTENT and column_min is not None and not le(grp.group[1], column_min - 1):
            if self.down_columns(nodes, grp.group):
                kind = KernelKind.REDUCTION  # looped, a block of columns a program (kernel_model.reads_down_columns)
        return FusedKernel("", nodes, kind, grp.group)


def _kind(group: tuple[Size, Size], o: Options, shapes: ShapeInfo = EMPTY) -> KernelKind:
    """Pointwise only where a row is provably at most one element (a
    data-dependent row of u0 elements may be 0, 1 or more: it is reduced);
    persistent (a whole row in registers) only where every row provably fits; a
    symbolic row of unbounded length is looped, which is right for every length."""
    if le(group[1], 1):
        return KernelKind.POINTWISE
    return KernelKind.PERSISTENT if shapes.known_le(group[1], o.persistent_limit()) else KernelKind.REDUCTION


def kernel_name(kind: KernelKind, ops: Iterable[str], k: int, traits: TargetTraits) -> str:
    names = sorted(set(ops))
    if len(names) > 8:
        names = names[:8]
    prefix = traits.prefixes[tuple(KernelKind).index(kind)]  # in KernelKind's order
    return f"{prefix}_fused_{'_'.join(names)}_{k}"


def fuse(g: ScheduleGraph, options: Options) -> FusedSchedule:
    """Group scheduler nodes into kernels; log every decision."""
    f = _Fuser(g, options)
    for rnd in range(options.fusion_rounds):
        saved = (dict(f.groups), dict(f.group_of), len(f.log))
        fused = f.run_round(rnd)
        if not f.is_acyclic():  # the pruned cycle check missed a path: redo exactly
            f.groups, f.group_of = dict(saved[0]), dict(saved[1])
            del f.log[saved[2]:]
            fused = f.run_round(rnd, prune=False)
        if fused == 0:
            break
    steps = f.steps()
    named: list[Step] = []
    k = 0
    for s in steps:
        if isinstance(s, FusedKernel):
            ops = [op for n in s.nodes for op in g.node(n).ops]
            s = attrs.evolve(s, name=kernel_name(s.kind, ops, k, options.traits()))
            k += 1
        named.append(s)
    return FusedSchedule(tuple(named), g, tuple(f.log))

