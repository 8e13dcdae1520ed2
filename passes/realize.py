"""realize : LoweredGraph -> BufferGraph

The seed's closure inlining, as substitution.  Walking the nodes in order, each
node either becomes a buffer (bufN, in registration order) or stays inline: its
body is substituted into every reader's body at the reader's index.  The rule that
realized a buffer is stored on it:

    output            a graph output
    reduction         a reduction that has a reader
    extern_input      read by an Extern (it needs a real tensor)
    reuse             several readers and more than one nontrivial read (a read of
                      something BROADCAST_READ times smaller than the node, a mean
                      or a bias, is trivial where the target's trait says so,
                      TargetTraits.reuse_broadcasts_trivial; a reader that only reads it at
                      data-dependent positions, directly or through pointwise
                      nodes that are read so, does not count: it recomputes a
                      few elements, as cross_entropy's gather does; a
                      slice counts as the share it reads, so readers of disjoint
                      slices, RoPE's halves or q, k and v, count once together);
                      unless Options.realize_reuse is off (Inductor recomputes
                      such nodes on a GPU)
    reads_threshold   several readers and more reads than realize_reads_threshold
    opcount_threshold several readers and more ops than realize_opcount_threshold
    acc_reads_threshold  the inlined body reads more buffers than realize_acc_reads_threshold
    index_ops_threshold  a view reading it inlined would read at an index of more sympy ops
                      than realize_index_ops_threshold: a reshape of a padded reshape over
                      symbolic sizes, where `(T + i*(2T - 1) + j) // 2T` over nested floor
                      divisions does not simplify and each reshape nests it again
                      (Wav2Vec2-Conformer's relative shift: a C++ line of 2.7 MB an element);
                      realized, the view reads a buffer and its index stays affine
    broadcast         its body holds a transcendental (an op of streams.OP_COST at least
                      BROADCAST_COST: a sin, an exp; not a square root or a division)
                      and a pointwise reader runs over at least BROADCAST_READ times
                      its elements: inlined, the reader would compute it again for
                      every element it reads it at (a rotary table's sin and cos, read
                      by every head and batch row: ModernBERT's backward computed six
                      of them for each element of its query-key-value gradient, 83 µs
                      a layer on the H100 against Inductor's 39).  Not a node of
                      fewer than BROADCAST_MIN elements (AdamW's bias corrections,
                      one number a parameter: a kernel each would cost more), nor a row's
                      statistic (it reads a reduction, whose kernel computes it once a
                      row); unless Options.realize_reuse is off
    mutation          a later op mutates something it reads while a reader still needs it
    lifetime          its readers run more than LIFETIME_SPAN nodes later, and the
                      buffers that die at it (it is the last to read them) hold at
                      least twice its bytes and at least 1/LIFETIME_SHARE of the
                      graph's inputs: inlined, its reader would hold them until
                      then; realized where it stands, they are freed at once (T5's
                      tied embedding: the decoder's float32 embedding gradient,
                      narrowed and added to the lm_head's, was read only by the
                      final sum, 250 MiB held across the encoder's backward);
                      unless Options.realize_lifetime is off
    extern / data_dependent / multi_output   always buffers (no body to inline)
    output_view / extern_input_view           strided views of a buffer: an alias, no copy

A node realized only to spare its readers (reuse and the three thresholds) whose
value is a lossless widening (a bfloat16 value as float32) is stored narrow: the
buffer holds the cast's argument, its readers widen what they load, and the
node's row says so.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from fractions import Fraction
from typing import Any, Mapping, Sequence, Union

import attrs
import sympy
import torch

from coil.errors import CoilError
from coil.ir.buffers import (
    AliasBuffer,
    Buffer,
    BufferGraph,
    ComputedBuffer,
    ExternBuffer,
    InputBuffer,
    MultiOutputBuffer,
    RealizeRow,
    Rule,
)
from coil.ir.expr import (
    Cast,
    Expr,
    IndexExpr,
    IndirectLoad,
    Load,
    Op,
    count_ops,
    indirect_loads,
    loads,
    masked_value,
    read_names,
    rewrite,
    rsyms,
    substitute_symbols,
    under_mask,
    walk,
    xsyms,
)
from coil.ir.bounds import load_in_bounds, prove_checks
from coil.ir.indexing import numel, ranges_of, simplify_index
from coil.ir.layout import Layout
from coil.ir.lowered import (
    Extern,
    Input,
    LNode,
    LoweredGraph,
    MapArg,
    MultiOutput,
    Pointwise,
    Reduction,
    TensorRef,
    View,
    extern_tensor_names,
)
from coil.ir.shapes import EMPTY, ShapeInfo, Size, free_size_symbols, is_size_symbol, is_static, is_unbacked_symbol, norm
from coil.options import Options
from coil.passes.collectives import pair_collectives
from coil.passes.schedule.streams import OP_COST

log = logging.getLogger("coil.trace")

# realize's reuse rule counts a read as nontrivial only when what it reads has more
# than 1/BROADCAST_READ of the node's elements
BROADCAST_READ = 16
# the broadcast rule: a node whose body holds an op costing at least this (streams.OP_COST: a
# transcendental, not a square root or a division), read by a pointwise node over
# BROADCAST_READ times its elements, is realized
BROADCAST_COST = 8
# ... and holds at least this many elements: a few numbers (AdamW's bias corrections,
# `1 - beta ** step`, one per parameter) cost a kernel of their own more than their ops
BROADCAST_MIN = 256
# the lifetime rule: a node whose readers come more than LIFETIME_SPAN nodes later
# (in the lowered graph's order) and whose dying inputs hold at least twice its bytes,
# and at least 1/LIFETIME_SHARE of the graph's input bytes, is realized where it stands
LIFETIME_SPAN = 32
LIFETIME_SHARE = 16
# the rules that realize a node only to spare its readers recomputing it: such a
# node whose value is a lossless widening of a narrower float (bfloat16 -> float32)
# is stored narrow, and its readers widen what they load
HEURISTIC_RULES = frozenset({Rule.REUSE, Rule.READS_THRESHOLD, Rule.OPCOUNT_THRESHOLD, Rule.ACC_READS_THRESHOLD,
                             Rule.BROADCAST})
_WIDER = {torch.bfloat16: (torch.float32, torch.float64), torch.float16: (torch.float32, torch.float64),
          torch.float32: (torch.float64,)}

DATA_DEPENDENT = frozenset(
    {"nonzero", "unique", "_unique2", "bincount", "searchsorted", "index_put", "index_put_",
     "scatter", "scatter_add", "scatter_reduce", "gather", "index", "index_select",
     "masked_select", "repeat_interleave", "embedding", "embedding_dense_backward"}
)


@attrs.frozen
class _Realized:
    name: str  # buffer or input name


@attrs.frozen
class _Inline:
    body: Expr  # over x0..x{n-1} of `ranges`, loads resolved to buffers
    ranges: tuple[int, ...]
    origins: frozenset[str]
    ops: tuple[str, ...]


_Entry = Union[_Realized, _Inline]


def _reads_of(node: LNode) -> list[str]:
    match node:
        case Input():
            return []
        case Pointwise() | Reduction():
            return read_names(node.body)
        case View():
            return [node.base]
        case Extern():
            return list(dict.fromkeys(extern_tensor_names((node.args, tuple(v for _, v in node.kwargs)))))
        case MultiOutput():
            return [node.extern]
    raise CoilError(f"unknown node {type(node).__name__}", stage="realize")


def _effective_readers(g: LoweredGraph) -> dict[str, list[str]]:
    """Readers of each node, looking through Views to the nodes that read them."""
    direct: dict[str, list[str]] = defaultdict(list)
    for n in g.nodes:
        for r in _reads_of(n):
            direct[r].append(n.name)
    memo: dict[str, list[str]] = {}

    def eff(name: str) -> list[str]:
        if name in memo:
            return memo[name]
        out: list[str] = []
        for r in direct.get(name, []):
            if isinstance(g.node(r), View):
                # an output view reads its base when it is materialized at the end
                out.extend(eff(r) + ([r] if r in g.outputs else []))
            else:
                out.append(r)
        memo[name] = list(dict.fromkeys(out))
        return memo[name]

    return {n.name: eff(n.name) for n in g.nodes}


def index_ops(body: Expr) -> int:
    """The most sympy ops in one read's index in `body` (the index_ops_threshold rule)."""
    return max((sum(sympy.count_ops(i) for i in e.index) for e in walk(body) if isinstance(e, (Load, IndirectLoad))),
               default=0)


def view_layout(index: tuple[sympy.Expr, ...], size: tuple[Size, ...], base: Layout,
             shapes: ShapeInfo = EMPTY) -> Layout | None:
    """The layout of a view when its storage offset is affine in the view's index.
    With symbolic sizes a stride or offset may be an expression of the size
    symbols (a slice of a padded row: `s1 - Mod(s1, 16) + 16`), where its ranges
    prove it nonnegative."""
    xs = xsyms(len(size))
    off = simplify_index(base.offset_of(index), ranges_of(xs, size))
    poly = off.as_poly(*xs) if xs else None
    if xs and (poly is None or poly.total_degree() > 1):
        return None
    strides: list[Size] = []
    for x, s in zip(xs, size):
        c = off.coeff(x)
        if c.is_Integer and int(c) < 0:
            return None  # as_strided cannot express a negative stride: copy instead
        if not c.is_Integer:
            if s == 1:
                strides.append(0)
                continue
            c = sympy.factor_terms(c)  # s1*(s1 - Mod(s1, 8) + 8), as the sizes multiply, not expanded
            if not _size_expr(c, shapes):
                return None
            strides.append(norm(c))
            continue
        strides.append(int(c))
    const = off.subs({x: 0 for x in xs})
    if const.is_Integer:
        if int(const) < 0:
            return None
        return Layout(size, tuple(strides), base.dtype, base.device, int(const))
    if not _size_expr(const, shapes):
        return None
    return Layout(size, tuple(strides), base.dtype, base.device, norm(const))


def _size_expr(e: sympy.Expr, shapes: ShapeInfo) -> bool:
    """An expression of size symbols alone, provably nonnegative (its bounds as
    written: a product of positive factors, s1*(s1 - Mod(s1, 8) + 8), is one,
    where its expansion's terms bound nothing)."""
    if not e.free_symbols or not all(is_size_symbol(s) for s in e.free_symbols):
        return False
    lo = shapes.lower(e)
    if (lo is not None and lo >= 0) or shapes.known_le(0, e):
        return True
    # an expanded product bounds nothing as written (s0**3 - s0**2, the offset of the
    # last of a split's pieces); factored, it is a product of factors bounded below
    lo = shapes.lower(sympy.factor(e))
    return lo is not None and lo >= 0


def _full_readers(g: LoweredGraph) -> dict[str, Fraction]:
    """For each node, how many of its elements its readers would compute, were it
    inlined into them, over its size: each reader that reads it at every position
    counts 1; readers that read it only through an IndirectLoad do not count, nor
    do pointwise nodes and views (not outputs) that only such readers read.  A
    view counts as its own readers, times the share of its base it covers where
    that is less than all (static sizes): the two halves of rotate_half, or q, k
    and v sliced from one tensor, read it once over, and inlining it into them
    computes no element more than realizing it would."""
    direct: dict[str, list[str]] = defaultdict(list)
    only_indirect: set[tuple[str, str]] = set()
    for n in g.nodes:
        for r in _reads_of(n):
            direct[r].append(n.name)
        if isinstance(n, (Pointwise, Reduction)):
            plain = {ld.name for ld in loads(n.body)}
            only_indirect |= {(ld.name, n.name) for ld in indirect_loads(n.body) if ld.name not in plain}
    outputs = set(o for o in g.outputs if o is not None)
    full: dict[str, Fraction] = {}
    for n in reversed(g.nodes):
        count = Fraction(0)
        for r in direct.get(n.name, []):
            if (n.name, r) in only_indirect:
                continue
            reader = g.node(r)
            if isinstance(reader, View):
                count += (full[r] + (r in outputs)) * _share(reader, n)
            elif isinstance(reader, Pointwise) and r not in outputs and full[r] == 0 and direct.get(r):
                continue  # read only at data-dependent positions itself
            else:
                count += 1
        full[n.name] = count
    return full


def _share(view: View, base: LNode) -> Fraction:
    """The part of `base` a view of it covers: its size over the base's where both
    are static and the view's is smaller (a slice, a select), else 1 (an expand
    or a reshape covers all of it)."""
    mine, whole = numel(view.size), numel(base.size)
    if not is_static((mine, whole)) or int(whole) == 0:
        return Fraction(1)
    return min(Fraction(int(mine), int(whole)), Fraction(1))


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} bytes"


def _widened(body: Expr, dtype: torch.dtype) -> bool:
    """`body` is a cast to `dtype` that loses nothing (a float made wider)."""
    return isinstance(body, Cast) and body.dtype == dtype and dtype in _WIDER.get(body.arg.dtype, ())


class _Realizer:
    """Holds the walk's state for one `realize` call (created and dropped inside it)."""

    def __init__(self, g: LoweredGraph, options: Options) -> None:
        self.g = g
        self.o = options
        self.shapes = g.sizes.shapes  # the size symbols' facts: hints for heuristics, proofs for meaning
        self.env: dict[str, _Entry] = {}
        self.inputs: list[InputBuffer] = []
        self.buffers: list[Buffer] = []
        self.buffer_named: dict[str, Buffer] = {}
        self.layouts: dict[str, Layout] = {}
        self.rows: dict[str, RealizeRow] = {}
        self.inlined_into: dict[str, list[str]] = defaultdict(list)
        self.readers = _effective_readers(g)
        self.full_readers = _full_readers(g)
        self.pos = {n.name: i for i, n in enumerate(g.nodes)}
        self.outputs = set(o for o in g.outputs if o is not None)
        # outputs whose strides coil chooses (Options.free_output_strides): a view of
        # a computed node among them is handed out as an alias of that node, realized
        self.free_outputs = {g.outputs[i] for i in options.free_output_strides
                             if i < len(g.outputs) and g.outputs[i] is not None}
        self.out_stride = {o: st for o, st in zip(g.outputs, g.output_strides) if o is not None and st is not None}
        self.mutations = [(self.pos[n.name], m) for n in g.nodes if isinstance(n, Extern) for m in n.mutated]
        self.input_bytes = sum(self.shapes.hint(n.layout.nbytes) for n in g.nodes if isinstance(n, Input))
        # the lifetime rule's evidence, by node: (buffers freed, their bytes, nodes to the first reader)
        self.lifetimes: dict[str, tuple[tuple[str, ...], int, int]] = {}

    # ---- resolution of loads ------------------------------------------------------------

    def resolve(self, body: Expr, consumer: str, ranges: tuple[Size, ...] = (),
                red: tuple[Size, ...] = ()) -> tuple[Expr, frozenset[str], tuple[str, ...]]:
        """Replace each load of an unrealized node by its body; collect origins.
        `ranges`, `red`: the consumer's, for the loads an inlined body may read
        unmasked (`_inside`)."""
        origins: set[str] = set()
        ops: list[str] = []
        # the consumer's loops where all are static (else None: no load is proven inside)
        loops = {**ranges_of(xsyms(len(ranges)), ranges), **ranges_of(rsyms(len(red)), red)}
        static_loops = loops if loops and is_static(tuple(loops.values())) else None

        def fn(e: Expr) -> Expr | None:
            if isinstance(e, Op):
                return _merge_masked_where(e)
            if not isinstance(e, (Load, IndirectLoad)):
                return None
            entry = self.env.get(e.name)
            if entry is None:
                raise CoilError(f"load of {e.name} before it is defined", stage="realize")
            if isinstance(entry, _Realized):
                return None if entry.name == e.name else attrs.evolve(e, name=entry.name)
            origins.update(entry.origins)
            ops.extend(entry.ops)
            self.inlined_into[e.name].append(consumer)
            # an indirect read inlines too: the producer's body at an index that
            # uses the reader's values (its loads become indirect ones)
            bound = (e.values, e.sizes) if isinstance(e, IndirectLoad) else ((), ())
            inlined = substitute_symbols(entry.body, dict(zip(xsyms(len(entry.ranges)), e.index)), bound)
            # a masked read inlines under its mask: the body's loads and checks
            # act only where it holds, and the value is 0 elsewhere, as the load's
            if e.mask is None:
                return inlined
            return masked_value(under_mask(inlined, e.mask, lambda ld: self._inside(ld, static_loops)), e.mask)

        out = rewrite(body, fn)
        return out, frozenset(origins), tuple(ops)

    def _inside(self, ld: Load, loops: Mapping[sympy.Symbol, Size] | None) -> bool:
        """Whether `ld` reads inside its buffer for every value of the consumer's
        static loops (bounds.load_in_bounds; static sizes only)."""
        lay = self.layouts.get(ld.name)
        return loops is not None and lay is not None and is_static(lay.size) and load_in_bounds(ld, lay.size, loops)

    # ---- registration ---------------------------------------------------------------------

    def register(self, make: Any, lnode_name: str, rule: Rule, fx: str, kind: str) -> str:
        name = f"buf{len(self.buffers)}"
        buf = make(name)
        self.buffers.append(buf)
        self.buffer_named[name] = buf
        if buf.layout is not None:
            self.layouts[name] = buf.layout
        self.env[lnode_name] = _Realized(name)
        self.rows[lnode_name] = RealizeRow(fx, kind, True, name, rule)
        log.debug("realize %s (%s) -> %s, rule %s", lnode_name, kind, name, rule)
        log.debug("register_buffer %s (%s)", name, type(buf).__name__)
        return name

    def computed(self, lnode_name: str, fx: str, kind: str, body: Expr, ranges: tuple[int, ...],
                 red: tuple[int, ...], rtype: str | None, dtype: torch.dtype, device: str, rule: Rule,
                 origins: frozenset[str], ops: tuple[str, ...]) -> str:
        rng = {**ranges_of(xsyms(len(ranges)), ranges), **ranges_of(rsyms(len(red)), red)}
        body = _simplify_body(body, rng)
        stride = self.out_stride.get(lnode_name) if rule is Rule.OUTPUT else None
        if stride is not None and _dense(tuple(ranges), stride):
            layout = Layout(ranges, stride, dtype, device)  # the strides the graph promises
        else:
            layout = Layout.contiguous(ranges, dtype, device)
        all_origins = tuple(sorted(origins | {fx}))
        all_ops = tuple(dict.fromkeys((*ops, self.g.node(lnode_name).op)))  # type: ignore[union-attr]
        return self.register(
            lambda name: ComputedBuffer(name, layout, ranges, red, rtype, body, rule, all_origins, all_ops),
            lnode_name, rule, fx, kind,
        )

    # ---- the rules ---------------------------------------------------------------------------

    def multi_reader_rule(self, name: str, body: Expr) -> Rule | None:
        readers = self.readers.get(name, [])
        if len(readers) + (name in self.outputs) <= 1:
            return None
        distinct = {(e.name, e.index, getattr(e, "values", ())) for e in walk(body) if isinstance(e, (Load, IndirectLoad))}
        # a read of something BROADCAST_READ times smaller than the node (a BatchNorm's
        # mean, a bias, a row's statistics) costs next to nothing to repeat in each reader
        # (where the target's trait says so: TargetTraits.reuse_broadcasts_trivial)
        node = self.g.node(name)
        least = self.shapes.hint(numel(node.ranges)) if self.o.traits().reuse_broadcasts_trivial else 0  # type: ignore[union-attr]
        nontrivial = {(n, i, v) for n, i, v in distinct
                      if (m := self.shapes.hint(numel(self.layouts[n].size if n in self.layouts else ()))) > 1
                      and m * BROADCAST_READ > least}
        if count_ops(body) > self.o.realize_opcount_threshold:
            return Rule.OPCOUNT_THRESHOLD
        if len(distinct) > self.o.realize_reads_threshold:
            return Rule.READS_THRESHOLD
        if (self.o.realizes_reused() and len(nontrivial) > 1
                and self.full_readers[name] + (name in self.outputs) > 1):
            return Rule.REUSE
        return None

    def broadcast_rule(self, node: Pointwise, body: Expr) -> Rule | None:
        """Rule.BROADCAST when the body is costly and a reader repeats it over at least
        BROADCAST_READ times its elements (the module docstring)."""
        if not self.o.realizes_reused() or not any(isinstance(e, Op) and OP_COST.get(e.name, 1) >= BROADCAST_COST
                                                   for e in walk(body)):
            return None
        # a row's statistic (a log of a sum, a reciprocal of a norm) is computed once a row
        # where its reduction's kernel takes it in: no repeat to spare
        if any(isinstance(b := self.buffer_named.get(n), ComputedBuffer) and b.reduction_type is not None
               for n in read_names(body)):
            return None
        own = self.shapes.hint(numel(node.ranges))
        if own < BROADCAST_MIN:
            return None
        for r in self.readers.get(node.name, []):
            reader = self.g.node(r)
            if isinstance(reader, Pointwise) and self.shapes.hint(numel(reader.ranges)) >= BROADCAST_READ * own:
                return Rule.BROADCAST
        return None

    def mutation_rule(self, node: LNode, body: Expr) -> Rule | None:
        here = self.pos[node.name]
        reads = set(read_names(body))
        for at, mutated in self.mutations:
            if at <= here:
                continue
            target = self.env.get(mutated)
            tname = target.name if isinstance(target, _Realized) else mutated
            if tname in reads and any(self.pos[r] > at for r in self.readers.get(node.name, [])):
                return Rule.MUTATION
        return None

    def realize_rule(self, node: Union[Pointwise, View], body: Expr) -> Rule | None:
        readers = self.readers.get(node.name, [])
        if node.name in self.outputs and not isinstance(node, View):
            return Rule.OUTPUT
        if any(isinstance(self.g.node(r), Extern) for r in readers) and not isinstance(node, View):
            return Rule.EXTERN_INPUT
        if any(r in self.free_outputs and isinstance(self.g.node(r), View) for r in readers) \
                and not isinstance(node, View):
            # a channels-last node whose (N, C, H, W) view is saved for the backward
            return Rule.FREE_OUTPUT_BASE
        if not readers:
            return None
        rule = (self.multi_reader_rule(node.name, body) or self.broadcast_rule(node, body)
                if not isinstance(node, View) else None)
        if rule:
            return rule
        if len(read_names(body)) > self.o.realize_acc_reads_threshold:
            return Rule.ACC_READS_THRESHOLD
        return self.mutation_rule(node, body) or (self.lifetime_rule(node) if not isinstance(node, View) else None)

    def lifetime_rule(self, node: Pointwise | View) -> Rule | None:
        """Rule.LIFETIME when the node's readers run far later and inlining it would
        hold the larger buffers that die at it until then (the module docstring)."""
        if not self.o.realize_lifetime:
            return None
        here = self.pos[node.name]
        readers = self.readers.get(node.name, [])
        span = min((self.pos[r] for r in readers), default=here) - here
        if span <= LIFETIME_SPAN:
            return None
        dying = self.dying_at(node)
        freed = sum(b for _, b in dying)
        own = self.shapes.hint(numel(node.ranges)) * node.dtype.itemsize
        if freed < 2 * own or freed * LIFETIME_SHARE < self.input_bytes:
            return None
        self.lifetimes[node.name] = (tuple(n for n, _ in dying), freed, span)
        return Rule.LIFETIME

    def dying_at(self, node: Pointwise | View) -> list[tuple[str, int]]:
        """The realized nodes (not inputs, not outputs) that `node` reads, directly or
        through inlined nodes, and whose every reader has run by `node` (it is their
        last reader): (buffer, bytes), in order of first read."""
        here = self.pos[node.name]
        memo: dict[str, bool] = {}

        def consumed(r: str) -> bool:  # remembered: inlined readers can share readers (diamonds)
            if r not in memo:
                entry = self.env.get(r)
                memo[r] = r == node.name or (
                    self.pos[r] <= here and r not in self.outputs
                    and (not isinstance(entry, _Inline) or all(consumed(x) for x in self.readers.get(r, []))))
            return memo[r]

        out: dict[str, int] = {}
        seen: set[str] = set()
        todo = list(_reads_of(node))
        while todo:
            x = todo.pop(0)
            if x in seen:
                continue
            seen.add(x)
            entry = self.env.get(x)
            if isinstance(entry, _Inline):
                todo.extend(_reads_of(self.g.node(x)))
            elif (isinstance(entry, _Realized) and entry.name in self.layouts and x not in self.outputs
                  and not isinstance(self.g.node(x), Input) and all(consumed(r) for r in self.readers.get(x, []))):
                out.setdefault(entry.name, self.shapes.hint(self.layouts[entry.name].nbytes))
        return list(out.items())

    # ---- per node kind ---------------------------------------------------------------------

    def visit(self, n: LNode) -> None:
        match n:
            case Input():
                self.inputs.append(InputBuffer(n.name, n.layout, n.value, n.token, n.donated))
                self.layouts[n.name] = n.layout
                self.env[n.name] = _Realized(n.name)
                self.rows[n.name] = RealizeRow(n.name, "Input", True, n.name, Rule.GRAPH_INPUT)
            case Pointwise():
                body, origins, ops = self.resolve(n.body, n.name, n.ranges)
                if not self.readers.get(n.name) and n.name not in self.outputs:
                    self.rows[n.name] = RealizeRow(n.origin, "Pointwise", False, None, Rule.DEAD)
                    return
                rule = self.realize_rule(n, body)
                if rule is None:
                    self.env[n.name] = _Inline(body, n.ranges, origins | {n.origin}, (*ops, n.op))
                    self.rows[n.name] = RealizeRow(n.origin, "Pointwise", False, None, Rule.INLINED)
                elif rule in HEURISTIC_RULES and _widened(body, n.dtype):
                    self.narrow(n, body, rule, origins, ops)
                else:
                    self.computed(n.name, n.origin, "Pointwise", body, n.ranges, (), None, n.dtype, n.device, rule, origins, ops)
                    if rule is Rule.LIFETIME:
                        freed, nbytes, span = self.lifetimes[n.name]
                        self.rows[n.name] = attrs.evolve(
                            self.rows[n.name], rule=f"{rule}; frees {', '.join(freed)} ({_mib(nbytes)}) "
                                                    f"{span} nodes before its first reader")
            case Reduction():
                body, origins, ops = self.resolve(n.body, n.name, n.ranges, n.reduction_ranges)
                if not self.readers.get(n.name) and n.name not in self.outputs:
                    self.rows[n.name] = RealizeRow(n.origin, "Reduction", False, None, Rule.DEAD)
                    return
                rule = Rule.OUTPUT if n.name in self.outputs else Rule.REDUCTION
                self.computed(n.name, n.origin, "Reduction", body, n.ranges, n.reduction_ranges,
                              n.reduction_type, n.dtype, n.device, rule, origins, ops)
            case View():
                if not self.readers.get(n.name) and n.name not in self.outputs:
                    # a dead view makes its base dead too (readers look through views): skip it
                    self.rows[n.name] = RealizeRow(n.origin, "View", False, None, Rule.DEAD)
                    return
                body, origins, ops = self.resolve(Load(n.base, n.index, n.dtype), n.name, n.ranges)
                if isinstance(self.env.get(n.base), _Inline) and index_ops(body) > self.o.realize_index_ops_threshold:
                    # its base realized, the view reads a buffer at its own index
                    self.materialize(n.base, Rule.INDEX_OPS_THRESHOLD)
                    body, origins, ops = self.resolve(Load(n.base, n.index, n.dtype), n.name, n.ranges)
                self.env[n.name] = _Inline(body, n.ranges, origins | {n.origin}, (*ops, n.op))
                self.rows[n.name] = RealizeRow(n.origin, "View", False, None, Rule.INDEX_REMAP)
            case Extern():
                self.visit_extern(n)
            case MultiOutput():
                ext = self.env[n.extern]
                assert isinstance(ext, _Realized)
                self.register(
                    lambda name: MultiOutputBuffer(name, ext.name, n.index, n.layout, Rule.MULTI_OUTPUT,
                                                   (n.origin,), (n.op,)),
                    n.name, Rule.MULTI_OUTPUT, n.origin, "MultiOutput",
                )

    def narrow(self, n: Pointwise, body: Expr, rule: Rule, origins: frozenset[str], ops: tuple[str, ...]) -> None:
        """A widening cast's argument as the buffer, in its own dtype; the node stays
        inline as the cast of a load of it (the readers widen)."""
        assert isinstance(body, Cast)
        inner = body.arg
        name = self.computed(n.name, n.origin, "Pointwise", inner, n.ranges, (), None, inner.dtype, n.device, rule,
                             origins, ops)
        self.env[n.name] = _Inline(Cast(Load(name, xsyms(len(n.ranges)), inner.dtype), n.dtype), n.ranges,
                                   frozenset(), ())
        self.rows[n.name] = attrs.evolve(self.rows[n.name],
                                         rule=f"{rule}; stored as {inner.dtype}, its readers widen it to {n.dtype}")

    def visit_extern(self, n: Extern) -> None:
        items = [m.name for m in self.g.nodes if isinstance(m, MultiOutput) and m.extern == n.name] if n.sized_by_data else []
        readers = [r for m in (n.name, *items) for r in self.readers.get(m, [])]
        # traced with data-dependent sizes (u0, bound by `call` from the result) its size is right
        # for every call; traced with the sizes of one call's data it is not
        layouts = [n.layout] + [m.layout for m in self.g.nodes if isinstance(m, MultiOutput) and m.name in items]
        unbacked = any(is_unbacked_symbol(s) for lay in layouts if lay is not None for s in free_size_symbols(lay.size))
        if n.sized_by_data and readers and not unbacked:
            raise CoilError(
                f"the size of {n.op}'s result depends on the values of its inputs (traced as "
                f"{list(n.layout.size) if n.layout else 'a tuple'}), and {readers[0]} reads it: coil compiles static "
                "shapes only, so this graph cannot be compiled (torch.compile breaks the graph before such ops, "
                "or traces them with unbacked sizes, which coil binds)", stage="realize", node=n.origin)

        def arg(a: Any) -> Any:
            if isinstance(a, TensorRef):
                return TensorRef(self.materialize(a.name, Rule.EXTERN_INPUT))
            if isinstance(a, tuple):  # a PyTuple stays one
                return type(a)(arg(x) for x in a)
            if isinstance(a, MapArg):
                return MapArg(tuple((k, arg(v)) for k, v in a.items))
            return a

        args = arg(n.args)
        kwargs = tuple((k, arg(v)) for k, v in n.kwargs)
        mutated = tuple(self.materialize(m, Rule.EXTERN_INPUT) for m in n.mutated)
        rule = Rule.DATA_DEPENDENT if n.op in DATA_DEPENDENT else Rule.EXTERN
        self.register(
            lambda name: ExternBuffer(name, n.kernel, args, kwargs, n.layout, rule, (n.origin,), (n.op,), mutated,
                                      scalar=n.scalar),
            n.name, rule, n.origin, "Extern",
        )

    def output_in_strides(self, buf: str, lnode: str, stride: tuple[int, ...] | None) -> str:
        """Hold an output to the strides the FX graph promised (as Inductor does):
        a buffer laid out otherwise is copied into them (rule output_stride)."""
        lay = self.layouts.get(buf)
        if stride is None or lay is None or not _dense(lay.size, stride):
            return buf
        if all(s == 1 or a == b for s, a, b in zip(lay.size, lay.stride, stride)):
            return buf
        if isinstance(self.g.node(lnode), Input) or buf in {i.name for i in self.inputs}:
            return buf  # an input returned as is keeps the caller's strides
        node = self.g.node(lnode)
        name = f"buf{len(self.buffers)}"
        body = Load(buf, xsyms(len(lay.size)), lay.dtype)
        layout = Layout(lay.size, stride, lay.dtype, lay.device)
        self.buffers.append(ComputedBuffer(name, layout, lay.size, (), None, body, Rule.OUTPUT_STRIDE,
                                           (getattr(node, "origin", lnode),), (getattr(node, "op", "copy"),)))
        self.layouts[name] = layout
        log.debug("realize %s -> %s, rule output_stride", lnode, name)
        return name

    def materialize(self, name: str, rule: Rule) -> str:
        """A real tensor for `name`: itself, an alias of a buffer, or a copy."""
        entry = self.env[name]
        if isinstance(entry, _Realized):
            return entry.name
        node = self.g.node(name)
        body = entry.body
        if isinstance(body, Load) and body.mask is None and body.name in self.layouts:
            rng = ranges_of(xsyms(len(entry.ranges)), entry.ranges)
            idx = tuple(simplify_index(i, rng) for i in body.index)
            layout = view_layout(idx, entry.ranges, self.layouts[body.name], self.shapes)
            if layout == self.layouts[body.name]:
                return body.name  # an identity view (alias, detach): the tensor itself
            if layout is not None:
                # an alias of an alias names the storage's owner: the layout is
                # already relative to it, and lifetimes extend the owner's
                base = next((b.base for b in self.buffers if isinstance(b, AliasBuffer) and b.name == body.name),
                            body.name)
                view = Rule(f"{rule}_view")  # output_view, extern_input_view
                return self.register(
                    lambda nm: AliasBuffer(nm, base, layout, view, tuple(sorted(entry.origins)), entry.ops),
                    name, view, getattr(node, "origin", name), "View",
                )
        dtype = body.dtype
        device = getattr(node, "device", "cpu")
        return self.computed(name, getattr(node, "origin", name), type(node).__name__, body, entry.ranges, (), None,
                             dtype, device, rule, entry.origins, entry.ops)

    def run(self) -> BufferGraph:
        for n in self.g.nodes:
            self.visit(n)
        strides = self.g.output_strides or (None,) * len(self.g.outputs)
        outputs = tuple(
            None if o is None else self.output_in_strides(self.materialize(o, Rule.OUTPUT), o, st)
            for o, st in zip(self.g.outputs, strides)
        )
        rows = tuple(self._final_rows())
        buffers = inner_orders(self.buffers) if self.o.orders_inner_nodes() else tuple(self.buffers)
        buffers = walk_orders(buffers) if self.o.walks_memory_order() else buffers
        return pair_collectives(BufferGraph(tuple(self.inputs), buffers, outputs, rows, self.g.sizes))

    def _buffers_holding(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """The buffers an inlined node's compute ended up in (through inline chains)."""
        entry = self.env.get(name)
        if isinstance(entry, _Realized) and entry.name != name:
            return {entry.name}
        out: set[str] = set()
        for c in self.inlined_into.get(name, []):
            if c not in seen:
                out |= self._buffers_holding(c, seen | {name})
        return out

    def _final_rows(self) -> list[RealizeRow]:
        out = []
        for n in self.g.nodes:
            row = self.rows.get(n.name)
            if row is None:
                continue
            if not row.realized and row.rule in (Rule.INLINED, Rule.INDEX_REMAP):
                targets = sorted(self._buffers_holding(n.name), key=lambda b: (len(b), b))
                if targets:
                    row = attrs.evolve(row, rule=f"{row.rule} into {', '.join(targets)}")
            out.append(row)
        return out


def _merge_masked_where(e: Op) -> Expr | None:
    """where(c, where(c, a, 0), b) -> where(c, a, b), also through a cast of the
    inner where: the 0 an inlined masked load gives where its mask c is false
    is never chosen when the reader selects on that same c (cat, pad and the
    scatters do)."""
    if e.name != "where":
        return None
    cond, a, b = e.args
    inner = a.arg if isinstance(a, Cast) else a
    if not (isinstance(inner, Op) and inner.name == "where" and inner.args[0] == cond):
        return None
    kept = inner.args[1] if inner is a else Cast(inner.args[1], a.dtype)
    return Op("where", (cond, kept, b), e.dtype)


def _dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """A permutation of a contiguous layout: no gaps, no overlap."""
    if all(isinstance(v, int) for v in (*size, *stride)):
        dims = sorted((st, s) for s, st in zip(size, stride) if s != 1)
        expect = 1
        for st, s in dims:
            if st != expect:
                return False
            expect *= s
        return True
    # symbolic: chain the dims from stride 1 up, each stride the product so far
    rest = [(sympy.expand(st), s) for s, st in zip(size, stride) if s != 1]
    acc: sympy.Expr = sympy.Integer(1)
    while rest:
        k = next((i for i, (st, _) in enumerate(rest) if sympy.expand(st - acc) == 0), None)
        if k is None:
            return False
        acc = sympy.expand(acc * rest.pop(k)[1])
    return True


def _simplify_body(body: Expr, rng: dict[sympy.Symbol, int]) -> Expr:
    def fn(e: Expr) -> Expr | None:
        if isinstance(e, (Load, IndirectLoad)):
            idx = tuple(simplify_index(i, rng) for i in e.index)
            return None if idx == e.index else attrs.evolve(e, index=idx)
        if isinstance(e, IndexExpr):
            s = simplify_index(e.expr, rng)
            return None if s == e.expr else IndexExpr(s, e.dtype)
        return None

    return prove_checks(rewrite(body, fn), rng)  # the run-time checks its value ranges make needless


def inner_orders(buffers: Sequence[Buffer]) -> tuple[Buffer, ...]:
    """Each pointwise buffer that is no reduction's second pass (`_rows_of`) and
    that the reductions reading it all read with its dims permuted, one loop an
    index, gets that permutation as its inner_order: inside their kernel it then computes each element at the
    position they read it (kernel_model's inner role), so fuse can put it there.
    BatchNorm's backward: the ReLU gradient (n, h, w, c), realized for its two
    readers, is summed per channel (x = c, r = (n, h, w)); without the order it is
    a kernel of its own that writes the gradient and the reduction reads it back."""
    # a node that reads a reduction's result at its own leading dims is that
    # reduction's second pass over its rows, and belongs in its kernel in its own
    # order (T5's softmax gradient, which a sum over the batch also reads: ordered for
    # the sum, it left the softmax's kernel, a kernel more a layer)
    reductions = {b.name: b for b in buffers if isinstance(b, ComputedBuffer) and b.is_reduction}
    pointwise = {b.name: b for b in buffers if isinstance(b, ComputedBuffer) and not b.is_reduction
                 and not any(_rows_of(ld, reductions.get(ld.name)) for ld in loads(b.body))}
    wanted: dict[str, set[tuple[int, ...] | None]] = defaultdict(set)
    for r in buffers:
        if not isinstance(r, ComputedBuffer) or not r.is_reduction:
            continue
        walk = [(s, n) for s, n in zip((*xsyms(len(r.ranges)), *rsyms(len(r.reduction_ranges))),
                                        (*r.ranges, *r.reduction_ranges)) if n != 1]
        for ld in loads(r.body):
            if ld.name in pointwise:
                wanted[ld.name].add(_permuted(ld.index, pointwise[ld.name].ranges, walk))
    # a buffer read whole by one so ordered (at its own index, as BatchNorm's
    # recomputed output by the ReLU gradient) walks the same order, or the two
    # could share no kernel: readers come after what they read
    for b in reversed(buffers):
        order = _one(wanted.get(b.name, set()))
        if not isinstance(b, ComputedBuffer) or order is None:
            continue
        for ld in loads(b.body):
            q = pointwise.get(ld.name)
            if q is not None and q.ranges == b.ranges and tuple(ld.index) == xsyms(len(b.ranges)):
                wanted[q.name].add(order)
    out: list[Buffer] = []
    for b in buffers:
        order = _one(wanted.get(b.name, set()))
        if order is not None and order != tuple(range(len(order))):
            b = attrs.evolve(b, inner_order=order)  # type: ignore[arg-type]
        out.append(b)
    return tuple(out)


def walk_orders(buffers: Sequence[Buffer]) -> tuple[Buffer, ...]:
    """Each pointwise buffer laid out densely in an order other than its logical
    one (a channels-last output, the transpose a pointwise op keeps from its input)
    gets that memory order as its walk_order: a pointwise kernel then walks it
    along memory (kernel_model.walk_dims), so its store, and the loads of inputs
    laid out as it is, step by one element.  Walked in its logical order, a
    channels-last (8, 64, 56, 56) float32 relu(x * 2 + b) on the C++ target's
    nest ran its innermost loop 64 elements a step, 842 us a call on one thread
    against Inductor's 209; Triton's lanes stored 256 bytes apart."""
    from coil.passes.layout import dense_order  # layout imports realize

    out: list[Buffer] = []
    for b in buffers:
        if isinstance(b, ComputedBuffer) and not b.is_reduction and b.layout.static:
            size = tuple(int(v) for v in b.layout.size)
            order = dense_order(size, tuple(int(v) for v in b.layout.stride))
            own = tuple(d for d in range(len(size)) if size[d] != 1)
            if order is not None and tuple(d for d in order if size[d] != 1) != own:
                b = attrs.evolve(b, walk_order=order)
        out.append(b)
    return tuple(out)


def _rows_of(ld: Load, r: ComputedBuffer | None) -> bool:
    """A read of reduction `r` (if one) at the reader's leading loops, one a row: the
    reader is that reduction's second pass."""
    if r is None:
        return False
    kept = [e for e, n in zip(ld.index, r.ranges) if n != 1]
    return bool(kept) and tuple(kept) == xsyms(len(kept))


def _one(orders: set[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """The order all of a buffer's readers ask, None when they differ or none asks."""
    return next(iter(orders)) if len(orders) == 1 else None


def _permuted(index: Sequence[Any], ranges: Sequence[Size], walk: Sequence[tuple[sympy.Symbol, Size]]
              ) -> tuple[int, ...] | None:
    """The order of a buffer's dims (of `ranges`) that a reader walks, reading it at
    `index` while its own loops (`walk`, outermost first, size-1 loops left out)
    run: each dim of more than one element read at a loop's symbol of its size,
    every loop used once; dims of one element go last.  None when the read is not
    such a permutation."""
    at: dict[sympy.Symbol, int] = {}
    for d, (e, n) in enumerate(zip(index, ranges)):
        if n == 1:
            continue
        if not isinstance(e, sympy.Symbol) or e in at:
            return None
        at[e] = d
    if len(at) != len(walk) or any(s not in at or ranges[at[s]] != n for s, n in walk):
        return None
    return (*(at[s] for s, _ in walk), *(d for d, n in enumerate(ranges) if n == 1))


def realize(g: LoweredGraph, options: Options) -> BufferGraph:
    """Name the buffers that must exist; inline everything else into its readers."""
    return _Realizer(g, options).run()
