"""plan_memory : FusedSchedule -> MemoryPlan

1. removed: buffers written by a kernel and read only inside it (never outputs)
   stay in registers and are never allocated.
2. last_usage: the seed's reverse walk, seeded with the outputs (and the bases they
   alias), names mapped through mutation_real_name.  A collective's buffers (what it
   reads and writes, ir.buffers.in_flight_buffers) are used by its last wait too:
   they are in flight until then, so none is freed, reused or taken in place
   before the wait; a collective the graph never waits on keeps them to the end.
3. frees after each step's last use; graph inputs too (`del argN_1`).
4. reuse: a new buffer takes the storage of a freed one of the same byte size,
   dtype and device (`bufB = bufA; del bufA  # reuse`).  In place
   (Options.inplace_buffers): a kernel's output takes the storage of an input
   whose last reader it is (a buffer of coil's, a fresh extern result, or a graph
   input its caller donated), when every read of that input in the kernel comes
   before the output is written and hits the element it writes (`inplace_source`),
   as Inductor's in-place buffers do; no storage is allocated for it.
5. write-back: an extern `copy_` into a graph input (what AOTAutograd leaves for a
   graph's writes into its inputs: BatchNorm's running statistics) from a buffer
   of coil's that holds exactly the input's layout: the kernel computing that
   buffer writes it straight into the input's storage, in place (`write_backs`),
   and the copy step is elided, as Inductor's kernels store into mutated inputs.
   Only where the input is read by nothing after that kernel, and inside it only
   by the buffer itself at the element it writes.
6. peak: a step-by-step replay of every allocation and free.
With `reorder_for_peak_memory`, the same plan is made for several topological
orders (original, least-peak-memory-first, BFS, DFS) and the lowest peak is kept.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from typing import Callable, Mapping, Sequence

import sympy

from coil.ir.buffers import (AliasBuffer, BufferGraph, ComputedBuffer, ExternBuffer, InputBuffer, MultiOutputBuffer,
                             collectives, copy_operands, freed_nbytes, ordered_externs, storage_nbytes)
from coil.ir.expr import IndirectLoad, Load, read_names, walk
from coil.ir.layout import Layout
from coil.ir.fused import ExternStep, FusedKernel, FusedSchedule, Step
from coil.ir.memory import MemoryPlan, Order, PlannedStep, collective_spans, in_flight_at
from coil.ir.schedule import ScheduleGraph, WeakDep, used_or_aliased_buffer_names, viewed_storages
from coil.ir.shapes import Size, norm
from coil.options import Options
from coil.passes.kernel_model import load_position, node_role, store_position, var_map

log = logging.getLogger("coil.trace")


def removed_buffers(s: FusedSchedule) -> frozenset[str]:
    """Buffers a kernel writes and only that kernel reads."""
    g = s.graph
    outputs = set(o for o in g.outputs if o is not None) | _alias_bases(g.graph, g.outputs)
    readers: dict[str, set[str]] = {}
    for n in g.nodes:
        for d in n.read_writes.reads:
            if not isinstance(d, WeakDep):
                readers.setdefault(d.name, set()).add(n.name)
    out: set[str] = set()
    for k in s.kernels:
        inside = set(k.nodes)
        for name in k.nodes:
            r = readers.get(name, set())
            if name not in outputs and r and r <= inside:
                out.add(name)
    return frozenset(out)


def _alias_bases(g: BufferGraph, names: Sequence[str | None]) -> set[str]:
    """The storages the values of `names` may lie in (viewed_storages): an
    output's bases, and the arguments of an extern whose returned pieces are
    outputs (the rows of aten.split_with_sizes at symbolic sizes), which no later
    buffer may reuse."""
    out: set[str] = set()
    for n in names:
        if n is not None:
            out |= viewed_storages(g, n)
    return out


def step_used(step: Step, g: ScheduleGraph) -> frozenset[str]:
    out: set[str] = set()
    for n in step.nodes:
        out |= used_or_aliased_buffer_names(g.node(n), g.graph)
    return frozenset(out)


def _storage_bytes(g: BufferGraph, name: str) -> int:
    return g.sizes.shapes.hint(storage_nbytes(g, name))  # symbolic sizes: bytes at the hints (the peak is an estimate)


def _freed_bytes(g: BufferGraph, name: str) -> int:
    return g.sizes.shapes.hint(freed_nbytes(g, name))  # an input the caller holds gives back none


def _owns_storage(g: BufferGraph, name: str) -> bool:
    return isinstance(g.get(name), ComputedBuffer)


# extern ops whose result is a fresh tensor of its own (never a view of an argument):
# a kernel may write over it in place once it is dead
FRESH_EXTERNS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
                           "aten.convolution.default"})


def _storage_owner(g: BufferGraph, name: str) -> bool:
    """Buffers whose storage is theirs alone: coil's, fresh extern results, and
    graph inputs their caller donated (Options.donated_inputs)."""
    b = g.get(name)
    return (isinstance(b, ComputedBuffer) or (isinstance(b, ExternBuffer) and b.kernel in FRESH_EXTERNS
                                              and not b.mutated)
            or (isinstance(b, InputBuffer) and b.donated))


def inplace_source(kernel: FusedKernel, new: str, dying: frozenset[str], g: BufferGraph,
                   taken: set[str]) -> str | None:
    """The buffer whose storage the kernel's output `new` may take in place: one
    whose last reader is this kernel (`dying`), with new's byte size, dtype and
    device, at storage offset 0, that every node of the kernel reads only directly
    (no indirect read) and only at the element new writes at the same kernel
    position (kernel_model's xindex / rindex), and that no node after new reads.
    The renderers compute a stage's nodes in kernel order (Triton issues a scope's
    loads first), so every element is read before new writes it.  In a kernel with
    reductions new must also depend on every reduction and have no reader in the
    kernel: it then runs in the last stage, after every loop that reads the old
    buffer.  None when there is none."""
    b = g.get(new)
    if not isinstance(b, ComputedBuffer) or b.is_reduction or b.layout.offset != 0:
        return None
    nodes = [(n, nb) for n in kernel.nodes if isinstance(nb := g.get(n), ComputedBuffer)]
    at = [n for n, _ in nodes].index(new)
    reads = [[e for e in walk(nb.body) if isinstance(e, (Load, IndirectLoad))] for _, nb in nodes]
    candidates = sorted({e.name for rs in reads[:at + 1] for e in rs if isinstance(e, Load)} & dying - taken)
    if not candidates:
        return None
    if any(nb.is_reduction for _, nb in nodes) and not _last_stage(kernel, new, nodes):
        return None  # (a pointwise kernel may hold a reduction of one element: its loop is a stage too)
    writes = store_position(b, kernel.group)
    views = {e.name for rs in reads for e in rs if isinstance(g.get(e.name), AliasBuffer)}
    for old in candidates:
        olay = g.layout(old)
        if (not _storage_owner(g, old) or olay.offset != 0
                or (olay.nbytes, olay.dtype, olay.device) != (b.layout.nbytes, b.layout.dtype, b.layout.device)):
            continue
        if any(_views(g, v, old) for v in views):
            continue  # read through a view, at elements not checked here
        if (all(_reads_only_at(nb, [e for e in rs if e.name == old], olay, writes, kernel.group)
                for (_, nb), rs in zip(nodes[:at + 1], reads))
                and not any(e.name == old for rs in reads[at + 1:] for e in rs)):
            return old
    return None


def _reads_only_at(b: ComputedBuffer, reads: Sequence[Load | IndirectLoad], olay: Layout, at: sympy.Expr,
                   group: tuple[int, int]) -> bool:
    """Whether b's `reads` of one buffer (of layout `olay`) are all direct, at
    storage element `at` (kernel coordinates)."""
    if not reads:
        return True
    if any(isinstance(e, IndirectLoad) for e in reads) or node_role(b, group) is None:
        return False
    m = var_map(b, group)
    return all(sympy.expand(load_position(e, olay, m, group) - at) == 0 for e in reads if isinstance(e, Load))


def _last_stage(kernel: FusedKernel, new: str, nodes: Sequence[tuple[str, ComputedBuffer]]) -> bool:
    """In a kernel with reductions: `new` depends on every reduction of the kernel
    (so it runs after all of their loops) and no node of the kernel reads it."""
    if any(new in read_names(nb.body) for n, nb in nodes if n != new):
        return False
    seen = _deps_inside(new, dict(nodes))
    return all(n in seen for n, nb in nodes if nb.is_reduction)


def _deps_inside(name: str, inside: Mapping[str, ComputedBuffer]) -> set[str]:
    """The nodes of a kernel (`inside`) that `name` reads, directly or through others of them."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for d in read_names(inside[todo.pop()].body):
            if d in inside and d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def _views(g: BufferGraph, name: str, base: str) -> bool:
    """Whether `name` is a view (an alias, through any chain of aliases) of `base`."""
    b = g.get(name)
    while isinstance(b, AliasBuffer):
        if b.base == base:
            return True
        b = g.get(b.base)
    return False


def write_backs(g: ScheduleGraph, removed: frozenset[str]) -> dict[str, tuple[str, str]]:
    """Candidates for writing in place, by source buffer: src -> (input, copy
    extern), for each extern `copy_(input, src)` whose input is a graph input with
    no view, src a pointwise buffer of coil's with the input's layout (offset 0),
    neither of them an output, and whose own result nothing reads."""
    bg = g.graph
    outputs = {o for o in bg.outputs if o is not None} | _alias_bases(bg, list(bg.outputs))
    readers: dict[str, set[str]] = {}
    for n in g.nodes:
        for d in n.read_writes.reads:
            if not isinstance(d, WeakDep):
                readers.setdefault(d.name, set()).add(n.name)
    viewed = {b.base for b in bg.buffers if isinstance(b, AliasBuffer)}
    inputs = {i.name for i in bg.inputs}
    mutations: dict[str, int] = {}
    externs = [b for b in bg.buffers if isinstance(b, ExternBuffer)]
    for b in externs:
        for m in b.mutated:
            mutations[m] = mutations.get(m, 0) + 1
    out: dict[str, tuple[str, str]] = {}
    for b in externs:
        if (pair := copy_operands(b)) is None:
            continue
        dst, src = pair
        sb = bg.get(src)
        if (dst not in inputs or mutations[dst] > 1 or dst in viewed or dst in outputs or b.mutated != (dst,)
                or b.name in readers or b.name in outputs or not isinstance(sb, ComputedBuffer) or sb.is_reduction
                or src in removed or src in outputs or src in viewed or src in out):
            continue
        if sb.layout == bg.layout(dst) and sb.layout.offset == 0:
            out[src] = (dst, b.name)
    return out


def _writes_back(kernel: FusedKernel, src: str, dst: str, g: BufferGraph) -> bool:
    """Whether the kernel may store `src` straight into `dst`'s storage: no other
    node of the kernel reads dst, and src reads it only directly, at the element it
    writes (so each element is read before it is written, by the same program).  In
    a kernel with reductions src must follow one of them: a node before every
    reduction runs in each program of a split reduction's first launch (several a
    row), one after them in its combine (one a row)."""
    b = g.get(src)
    assert isinstance(b, ComputedBuffer)
    nodes = [(n, nb) for n in kernel.nodes if isinstance(nb := g.get(n), ComputedBuffer)]
    for n, nb in nodes:
        if n != src and dst in read_names(nb.body):
            return False
    inside = dict(nodes)
    if any(nb.is_reduction for _, nb in nodes) and not any(inside[d].is_reduction for d in _deps_inside(src, inside)):
        return False
    loads = [e for e in walk(b.body) if isinstance(e, (Load, IndirectLoad)) and e.name == dst]
    return _reads_only_at(b, loads, g.layout(dst), store_position(b, kernel.group), kernel.group)


def _write_back_at(order: Sequence[Step], g: ScheduleGraph, candidates: Mapping[str, tuple[str, str]]
                   ) -> dict[int, list[tuple[str, str]]]:
    """For one order: step index -> the (src, input) pairs its kernel writes back,
    those whose input no step after the kernel reads (but the elided copy)."""
    if not candidates:
        return {}
    at = {n: i for i, st in enumerate(order) for n in st.nodes}
    readers: dict[str, list[int]] = {}
    for n in g.nodes:
        for d in n.read_writes.reads:
            if not isinstance(d, WeakDep):
                readers.setdefault(d.name, []).append(at[n.name])
    out: dict[int, list[tuple[str, str]]] = {}
    for src, (dst, copy) in candidates.items():
        i = at[src]
        step = order[i]
        if (isinstance(step, FusedKernel) and all(j <= i or order[j].nodes == (copy,) for j in readers.get(dst, []))
                and _writes_back(step, src, dst, g.graph)):
            out.setdefault(i, []).append((src, dst))
    return out


def plan_order(order: Sequence[Step], s: FusedSchedule, removed: frozenset[str], inplace: bool = False,
               candidates: Mapping[str, tuple[str, str]] | None = None) -> tuple[tuple[PlannedStep, ...], int]:
    """One order's plan; `candidates` are write_backs(s.graph, removed), the same for
    every order (computed here when not given)."""
    g = s.graph
    bg = g.graph
    real = g.mutation_names()
    outputs = set(o for o in bg.outputs if o is not None)
    future: set[str] = {real.get(o, o) for o in outputs} | _alias_bases(bg, list(outputs))
    spans = collective_spans(bg, [st.nodes for st in order])
    held: dict[int, set[str]] = {}  # step -> the buffers of the collectives it completes
    for sp in spans:
        held.setdefault(sp.wait, set()).update(real.get(n, n) for n in sp.buffers)
    future |= held.pop(len(order), set())  # never waited in this graph: in flight past its end
    last_usage: list[frozenset[str]] = []
    for i, step in reversed(list(enumerate(order))):
        used = ({real.get(n, n) for n in step_used(step, g)} | held.get(i, set())) - removed
        lu = frozenset(used - future)
        future |= used
        last_usage.append(lu)
    last_usage.reverse()

    # allocations, reuses, frees
    pool: dict[tuple[int, str, str], list[str]] = {}
    input_names = {i.name for i in bg.inputs}
    planned: list[_Planned] = []
    reused: set[str] = set()
    if not inplace:
        candidates = {}
    elif candidates is None:
        candidates = write_backs(g, removed)
    back = _write_back_at(order, g, candidates)
    into_inputs = {src for pairs in back.values() for src, _ in pairs}  # their storage is an input's
    elided = {candidates[src][1] for src in into_inputs}
    for i, pairs in back.items():  # the input dies at the kernel writing it (its copy is elided)
        last_usage[i] |= {dst for _, dst in pairs}
        for j in range(i + 1, len(order)):
            last_usage[j] -= {dst for _, dst in pairs}
    for i, (step, lu) in enumerate(zip(order, last_usage)):
        allocs: list[str] = []
        reuses: list[tuple[str, str]] = []
        in_place: list[str] = []
        writing = dict(back.get(i, []))
        if isinstance(step, FusedKernel):
            for n in step.nodes:
                if n in removed:
                    continue
                if n in writing:
                    reuses.append((n, writing[n]))
                    reused.add(writing[n])
                    in_place.append(n)
                    continue
                # a buffer written back lives in an input's storage: never taken again
                src = inplace_source(step, n, lu, bg, reused | into_inputs) if inplace else None
                if src is not None:
                    reuses.append((n, src))
                    reused.add(src)
                    in_place.append(n)
                    continue
                lay = bg.layout(n)
                key = (lay.nbytes, str(lay.dtype), lay.device)
                if pool.get(key):
                    old = pool[key].pop(0)
                    reuses.append((n, old))
                    reused.add(old)
                else:
                    allocs.append(n)
        # an elided copy's own result is never made
        frees = sorted(lu - elided, key=lambda x: (x not in input_names, len(x), x))
        taken = {old for n, old in reuses if n in in_place}
        for f in frees:
            if f not in input_names and f not in taken and f not in into_inputs and _owns_storage(bg, f):
                lay = bg.layout(f)
                pool.setdefault((lay.nbytes, str(lay.dtype), lay.device), []).append(f)
        planned.append((step, lu, allocs, reuses, frees, in_place, step.nodes[0] in elided
                        and isinstance(step, ExternStep)))

    _release_holds_at_peak(planned, bg, reused)
    lives = _replay(planned, bg, reused)
    result = tuple(PlannedStep(step, lu, tuple(allocs), tuple(reuses), tuple(frees), live, tuple(in_place),
                               in_flight_at(spans, i), skip)
                   for i, ((step, lu, allocs, reuses, frees, in_place, skip), live) in enumerate(zip(planned, lives)))
    return result, max([sum(bg.sizes.shapes.hint(i.layout.nbytes) for i in bg.inputs), *lives])


_Planned = tuple[Step, frozenset[str], list[str], list[tuple[str, str]], list[str], list[str], bool]


def peak_expression(plan: MemoryPlan) -> Size:
    """The plan's peak as an expression of the size symbols: the bytes alive at the
    step that peaks at the hints, each buffer's storage size as it is (an int for a
    static graph, equal to peak_bytes; at the hints it is peak_bytes)."""
    bg = plan.buffer_graph

    reused = {old for ps in plan.steps for _, old in ps.reuses}
    live: Size = sum((i.layout.nbytes for i in bg.inputs), 0)
    best, best_hint = live, bg.sizes.shapes.hint(live)
    for ps in plan.steps:
        step = ps.step
        for n in (*ps.allocs, *([step.name] if isinstance(step, ExternStep) else []),
                  *(n for n in step.nodes if isinstance(bg.get(n), MultiOutputBuffer))):
            live = norm(live + storage_nbytes(bg, n))
        if bg.sizes.shapes.hint(live) > best_hint:
            best, best_hint = live, bg.sizes.shapes.hint(live)
        for f in ps.frees:
            if f not in reused:
                live = norm(live - freed_nbytes(bg, f))
    return best if isinstance(best, int) else norm(sympy.expand(best))


def _replay(planned: Sequence[_Planned], bg: BufferGraph, reused: set[str]) -> list[int]:
    """Bytes alive while each step runs."""
    live = sum(bg.sizes.shapes.hint(i.layout.nbytes) for i in bg.inputs)
    out = []
    for step, _, allocs, _, frees, _, elided in planned:
        for n in allocs:
            live += _storage_bytes(bg, n)
        if isinstance(step, ExternStep) and not elided:
            live += _storage_bytes(bg, step.name)
        for n in step.nodes:
            if isinstance(bg.get(n), MultiOutputBuffer):
                live += _storage_bytes(bg, n)
        out.append(live)
        for f in frees:
            if f not in reused:  # a reused buffer's storage lives on in its new owner
                live -= _freed_bytes(bg, f)
    return out


# a dead buffer of at least 1/LARGE_HOLD of the most bytes the plan itself holds at
# once (inputs left out) is freed when it dies rather than held across more than
# LONG_HOLD steps for a later reuse: the plan does not see the
# workspace extern calls take (cuDNN's attention backward, cuBLAS), so a step the
# plan puts below the peak may be the peak at run time, and a large hold across it
# raises it (Llama at the large size: the logits' gradient, 125 MiB, held through the
# whole backward for the embedding's gradient put the attention backward of its last
# layer 80 MiB above Inductor's peak); the reuse saved one allocator call
LARGE_HOLD = 16
LONG_HOLD = 8  # ... and held across more than this many steps


def _own_bytes(bg: BufferGraph, lives: Sequence[int], died: Mapping[str, int]) -> list[int]:
    """Bytes alive while each step runs, less the graph's inputs alive then (those
    the caller holds, parameters above all, throughout; a donated one until its name
    is dropped)."""
    gone = [0] * (len(lives) + 1)  # donated input bytes whose name is dropped after the step before
    for i in bg.inputs:
        if i.name in died and i.donated:
            gone[died[i.name] + 1] += bg.sizes.shapes.hint(i.layout.nbytes)
    held = sum(bg.sizes.shapes.hint(i.layout.nbytes) for i in bg.inputs)
    out = []
    for k, live in enumerate(lives):
        held -= gone[k]
        out.append(live - held)
    return out


def _release_holds_at_peak(planned: list[_Planned], bg: BufferGraph, reused: set[str]) -> None:
    """A dead buffer kept for a later reuse holds its storage until then: where
    that hold spans the step of the peak, it is freed when it dies and the later
    buffer allocated instead.  Releasing a hold lowers the bytes alive between the
    two steps and changes them nowhere else, so this repeats until no hold spans a
    step of the peak: the peak is then the one without any holds, and every reuse
    that does not raise it stays.  A long hold of a large buffer (LARGE_HOLD,
    LONG_HOLD) is released too."""
    died = {f: i for i, p in enumerate(planned) for f in p[4]}
    lives = _replay(planned, bg, reused)
    if not lives:
        return
    large = max(_own_bytes(bg, lives, died)) // LARGE_HOLD  # releasing holds never raises it
    while True:
        top = [i for i, v in enumerate(lives) if v == max(lives)]
        spans = [(j, new, old) for j, p in enumerate(planned) for new, old in p[3]
                 if new not in p[5] and (any(died[old] < i < j for i in top)
                                         or (j - died[old] > LONG_HOLD and _storage_bytes(bg, old) >= large))]
        if not spans:
            return
        for j, new, old in spans:
            planned[j][3].remove((new, old))
            planned[j][2].append(new)
            reused.discard(old)
            log.debug("plan_memory: %s dies before the peak; freed then, %s allocated later instead of reusing it",
                      old, new)
        lives = _replay(planned, bg, reused)


# ---- topological orders ------------------------------------------------------------------


def _step_graph(steps: Sequence[Step], g: ScheduleGraph) -> tuple[dict[int, set[int]], dict[int, int]]:
    """Data edges, a chain through the collectives in their given order (every
    rank must issue the same collectives in the same order, and the costs that pick
    an order may differ between ranks: uneven shards have other sizes), and a chain
    through the externs that draw random numbers, in the graph's order (each draw
    moves the generator: a dropout moved before another takes the other's mask)."""
    owner = {n: i for i, s in enumerate(steps) for n in s.nodes}
    succ: dict[int, set[int]] = {i: set() for i in range(len(steps))}
    indeg = {i: 0 for i in range(len(steps))}
    edges = [(owner[d.name], i) for i, s in enumerate(steps) for n in s.nodes for d in g.node(n).read_writes.reads
             if d.name in owner]
    for chain in ordered_externs(g.graph):
        at = [owner[n] for n in chain if n in owner]
        edges += list(zip(at, at[1:]))
    for j, i in edges:
        if j != i and i not in succ[j]:
            succ[j].add(i)
            indeg[i] += 1
    return succ, indeg


def _kahn(steps: Sequence[Step], g: ScheduleGraph, pick: Order) -> list[Step]:
    """Topological order: `bfs` takes the oldest ready step, `dfs` the newest."""
    succ, indeg = _step_graph(steps, g)
    indeg = dict(indeg)
    ready: deque[int] = deque(sorted(i for i, d in indeg.items() if d == 0))
    order: list[int] = []
    while ready:
        i = ready.popleft() if pick is Order.BFS else ready.pop()
        order.append(i)
        ready.extend(sorted(j for j in succ[i] if _dec(indeg, j)))
    return _whole([steps[i] for i in order], steps)


def _whole(order: list[Step], steps: Sequence[Step]) -> list[Step]:
    """`order`, checked to hold every step: a step left out (on a cycle of the
    step graph, which fuse's order rules out) would be a plan of a smaller peak,
    and chosen, with the rest of the program missing."""
    if len(order) != len(steps):
        present = set(order)
        left = [s.nodes[0] for s in steps if s not in present]
        raise RuntimeError(f"plan_memory: the steps of {left[:4]} lie on a cycle of data and order edges")
    return order


def _dec(indeg: dict[int, int], j: int) -> bool:
    indeg[j] -= 1
    return indeg[j] == 0


def _lpmf(steps: Sequence[Step], s: FusedSchedule, removed: frozenset[str]) -> list[Step]:
    """Least peak memory first: among ready steps, run the one whose allocations
    minus the buffers it lets die is smallest."""
    g = s.graph
    bg = g.graph
    remaining: dict[str, int] = {}
    used = [step_used(st, g) - removed for st in steps]
    for u in used:
        for n in u:
            remaining[n] = remaining.get(n, 0) + 1
    outputs = set(o for o in bg.outputs if o is not None)

    def cost(i: int) -> int:
        alloc = sum(_storage_bytes(bg, n) for n in steps[i].nodes if n not in removed)
        freed = sum(_freed_bytes(bg, n) for n in used[i] if remaining.get(n) == 1 and n not in outputs)
        return alloc - freed

    order = _kahn_with_update(steps, g, cost, used, remaining)
    return order


def _kahn_with_update(steps: Sequence[Step], g: ScheduleGraph, cost: Callable[[int], int],
                      used: Sequence[frozenset[str]], remaining: dict[str, int]) -> list[Step]:
    succ, indeg = _step_graph(steps, g)
    indeg = dict(indeg)
    ready = [i for i, d in indeg.items() if d == 0]
    heap = [(cost(i), i) for i in ready]
    heapq.heapify(heap)
    order: list[int] = []
    done: set[int] = set()
    while heap:
        c, i = heapq.heappop(heap)
        if i in done:
            continue
        if c != cost(i):  # stale: costs change as buffers die
            heapq.heappush(heap, (cost(i), i))
            continue
        done.add(i)
        order.append(i)
        for n in used[i]:
            remaining[n] -= 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (cost(j), j))
    return _whole([steps[i] for i in order], steps)


def plan_memory(s: FusedSchedule, options: Options) -> MemoryPlan:
    """Lifetimes, frees, reuse and the peak estimate (best of several orders)."""
    removed = removed_buffers(s)
    candidates: list[tuple[Order, Sequence[Step]]] = [(Order.ORIGINAL, s.steps)]
    # the overlap stage orders a graph with collectives: DFS would put each wait right after its issue
    owned_by_overlap = options.overlap_bytes_limit > 0 and bool(collectives(s.buffer_graph))
    if options.reorder_for_peak_memory and len(s.steps) > 2 and not owned_by_overlap:
        candidates += [
            (Order.LPMF, _lpmf(s.steps, s, removed)),
            (Order.BFS, _kahn(s.steps, s.graph, Order.BFS)),
            (Order.DFS, _kahn(s.steps, s.graph, Order.DFS)),
        ]
    best: tuple[Order, tuple[PlannedStep, ...], int] | None = None
    peaks: list[tuple[Order, int]] = []
    backs = write_backs(s.graph, removed) if options.inplace_buffers else {}
    for name, order in candidates:
        steps, peak = plan_order(order, s, removed, options.inplace_buffers, backs)
        peaks.append((name, peak))
        if best is None or peak < best[2]:
            best = (name, steps, peak)
    assert best is not None
    name, steps, peak = best
    for ps in steps:
        if ps.last_usage:
            log.debug("last_usage %s: %s", ps.step.nodes[0] if not isinstance(ps.step, FusedKernel) else ps.step.name,
                      sorted(ps.last_usage))
        for f in ps.frees:
            log.debug("free %s", f)
    log.debug("peak %d bytes with order %s (candidates %s)", peak, name, [(str(n), b) for n, b in peaks])
    return MemoryPlan(steps, s, removed, peak, name, tuple(peaks))

