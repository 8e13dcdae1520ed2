"""Loop nests, for a target whose traits ask for them (TargetTraits.nests: the C++
target): which loops run xindex and rindex.

kernel_model says a kernel iterates a flat `xindex` over numel and a flat `rindex`
over rnumel.  A flat loop would make every load compute `xindex / 128 % 64`, which
stops vectorization, so such a target iterates a nest instead:

1. refine: each node's ranges cut the flat index at their suffix products; the
   common refinement of all cuts gives loop dims (`ix0, ix1, ...`, `ir0, ...`) such
   that every node's own index symbols are sums of loop variables;
2. substitute: xindex = sum(ix_i * stride_i), rindex likewise, into each node's
   `var_map`, simplified with the loop ranges, then into its body;
3. merge: adjacent dims that every index expression uses as one (coefficient of the
   outer = coefficient of the inner * inner size) become one loop, so a contiguous
   (4096, 1024) kernel is a single loop of 4M iterations.

`kernel_nest` makes the nest and gives the nodes in its loop variables, which
the policy reads (passes/schedule/threads.py) and schedule_kernels records in
the spec for the renderer (ir/kernel.py: LoopNest).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import attrs
import sympy

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import Expr, IndexExpr, IndirectLoad, Load, rsyms, substitute_symbols, walk, xsyms
from coil.ir.indexing import FloorDiv, ModularIndexing, contiguous_strides, simplify_index
from coil.ir.layout import Layout
from coil.ir.shapes import EMPTY, ShapeInfo, Size, gt, is_size_symbol, is_static, le, norm, same_size
from coil.passes.kernel_model import RINDEX, XINDEX, node_role, unflatten_walked, var_map, walk_dims, walked_ranges


def loop_symbol(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


@attrs.frozen
class Dim:
    sym: sympy.Symbol
    size: Size


@attrs.frozen
class Nest:
    xdims: tuple[Dim, ...]
    rdims: tuple[Dim, ...]

    @classmethod
    def of_sizes(cls, xsizes: Sequence[int], rsizes: Sequence[int]) -> Nest:
        return cls(tuple(Dim(loop_symbol("ix", i), s) for i, s in enumerate(xsizes)),
                   tuple(Dim(loop_symbol("ir", i), s) for i, s in enumerate(rsizes)))

    @property
    def ranges(self) -> dict[sympy.Symbol, int]:
        return {d.sym: d.size for d in (*self.xdims, *self.rdims)}

    @property
    def xflat(self) -> sympy.Expr:
        return _flat(self.xdims)

    @property
    def rflat(self) -> sympy.Expr:
        return _flat(self.rdims)


def _flat(dims: Sequence[Dim]) -> sympy.Expr:
    strides = contiguous_strides([d.size for d in dims])
    return sympy.expand(sum((d.sym * s for d, s in zip(dims, strides)), sympy.Integer(0)))


# ---- 1. refinement -------------------------------------------------------------------------


def _suffix_products(size: Sequence[Size]) -> list[Size]:
    out: list[Size] = [1]
    acc: Size = 1
    for s in reversed(size):
        acc = acc * int(s) if isinstance(s, int) and isinstance(acc, int) else norm(sympy.expand(acc * s))
        out.append(acc)
    return out


def _quotient(a: Size, b: Size) -> Size | None:
    """a / b where b divides a for every size (a polynomial of integer
    coefficients), else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b and a % b == 0 else None
    q = sympy.cancel(sympy.sympify(a) / sympy.sympify(b))
    if sympy.fraction(q)[1] != 1:
        return None
    if q.is_number:
        return int(q) if q.is_Integer else None
    if not q.is_polynomial() or not all(c.is_Integer for c in sympy.Poly(q, *sorted(q.free_symbols, key=str)).coeffs()):
        return None
    return norm(sympy.expand(q))


def _refine_symbolic(total: Size, cuts: Iterable[Size], shapes: ShapeInfo) -> tuple[Size, ...]:
    """refine where sizes are symbolic: the chain is taken in the order of the
    hints, and each link must divide the next for every size."""
    chain: list[Size] = [1]
    for c in sorted(set(cuts) | {total}, key=lambda v: (shapes.hint(v), str(v))):
        if not gt(c, 1) or (isinstance(c, int) and isinstance(total, int) and c > total):
            continue
        if _quotient(c, chain[-1]) is not None and _quotient(total, c) is not None and c != chain[-1]:
            chain.append(c)
    if chain[-1] != total and _quotient(total, chain[-1]) is not None:
        chain.append(total)
    dims = tuple(q for i in reversed(range(len(chain) - 1)) if (q := _quotient(chain[i + 1], chain[i])) is not None)
    return dims or (total,)  # no chain of exact divisors (min(s0, s1)): one dim of the whole size


def refine(total: Size, cuts: Iterable[Size], shapes: ShapeInfo = EMPTY) -> tuple[Size, ...]:
    """Dim sizes (outermost first) of the finest nest whose boundaries are cuts
    that divide one another and `total`; a cut that breaks the chain is dropped."""
    cuts = list(cuts)
    if not is_static((total, *cuts)):
        return _refine_symbolic(total, cuts, shapes)
    if total <= 1:  # type: ignore[operator]
        return (total,)
    chain = [1]
    for c in sorted(set(cuts) | {total}):
        if 1 < c <= total and c % chain[-1] == 0 and total % c == 0:
            chain.append(c)
    return tuple(chain[i + 1] // chain[i] for i in reversed(range(len(chain) - 1)))


def initial_nest(bufs: Sequence[ComputedBuffer], group: tuple[Size, Size], shapes: ShapeInfo = EMPTY) -> Nest:
    n, r = group
    xcuts: set[Size] = set()
    rcuts: set[Size] = set()
    for b in bufs:
        role = node_role(b, group)
        if role == "inner":
            for p in _suffix_products(b.ranges):
                if (q := _quotient(p, r)) is not None:
                    xcuts.add(q)
                elif _quotient(r, p) is not None:
                    rcuts.add(p)
        else:
            xcuts.update(_suffix_products(walked_ranges(b, group)))
            if role == "reduction":
                rcuts.update(_suffix_products(b.reduction_ranges))
    has_r = not le(r, 1) or any(b.is_reduction for b in bufs)
    return Nest.of_sizes(refine(n, xcuts, shapes), refine(r, rcuts, shapes) if has_r else ())


# ---- index simplification -----------------------------------------------------------------


def loop_index(e: sympy.Expr, ranges: dict[sympy.Symbol, int]) -> sympy.Expr:
    """simplify_index (which takes (1024*i + j) // 131072 to i // 128 for j < 1024),
    then ((a // b) // c) % n as (a // (b*c)) % n, so digits in one form merge back
    (_merge_digits) and no division by a constant stays in an inner loop."""
    e = simplify_index(e, ranges)
    if not e.has(ModularIndexing):
        return e
    out = e.replace(lambda n: isinstance(n, ModularIndexing) and isinstance(n.args[0], FloorDiv)
                    and n.args[0].args[1].is_Integer,
                    lambda n: ModularIndexing(n.args[0].args[0], n.args[0].args[1] * n.args[1], n.args[2]))
    return e if out == e else simplify_index(out, ranges)


# ---- 2. substitution -------------------------------------------------------------------------


@attrs.frozen
class NodeIndexing:
    """One node of the kernel in the nest's loop variables."""

    buf: ComputedBuffer
    role: str
    body: Expr
    store: sympy.Expr | None  # storage offset (relative to data_ptr) of the element it writes; None: not stored


def _empty_var_map(b: ComputedBuffer, group: tuple[int, int]) -> dict[sympy.Symbol, sympy.Expr]:
    """var_map for a kernel with an empty loop: its bodies never run, so the
    symbols of the empty loop are 0 (var_map's simplification would divide by the
    zero size)."""
    m: dict[sympy.Symbol, sympy.Expr] = {s: sympy.Integer(0) for s in rsyms(len(b.reduction_ranges))}
    xs = xsyms(len(b.ranges))
    if group[0] == 0:
        return m | {s: sympy.Integer(0) for s in xs}
    return m | dict(zip(xs, unflatten_walked(XINDEX, b.ranges, walk_dims(b, group))))


def node_indexing(b: ComputedBuffer, group: tuple[int, int], nest: Nest) -> NodeIndexing:
    role = node_role(b, group)
    assert role is not None, f"{b.name} does not fit group {group}"
    to_loops = {XINDEX: nest.xflat, RINDEX: nest.rflat}
    ranges = nest.ranges
    vm = _empty_var_map(b, group) if 0 in group else var_map(b, group)
    m = {s: loop_index(e.xreplace(to_loops), ranges) for s, e in vm.items()}
    store = b.layout.offset_of(xsyms(len(b.ranges))).xreplace(m) - b.layout.offset
    return NodeIndexing(b, role, substitute_symbols(b.body, m), loop_index(store, ranges))


def index_expressions(nodes: Sequence[NodeIndexing], layouts: dict[str, Layout], inside: set[str],
                      ranges: dict[sympy.Symbol, int], stored: set[str]) -> list[sympy.Expr]:
    """Every index the kernel computes: load offsets from memory, store offsets and
    index values (IndexExpr), in loop variables."""
    out: list[sympy.Expr] = []
    for nd in nodes:
        if nd.buf.name in stored and nd.store is not None:
            out.append(nd.store)
        for e in walk(nd.body):
            if isinstance(e, (Load, IndirectLoad)) and e.name not in inside:
                lay = layouts[e.name]
                out.append(loop_index(lay.offset_of(e.index) - lay.offset, ranges))
            elif isinstance(e, IndexExpr):
                out.append(loop_index(e.expr, ranges))
    return out


# ---- 3. merging -------------------------------------------------------------------------------


def affine_coeffs(e: sympy.Expr, syms: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, int] | None:
    """Integer coefficients of `syms` when `e` is affine in them (they appear only
    as `c * sym` terms); None when one hides in a FloorDiv / ModularIndexing."""
    out = {s: 0 for s in syms}
    wanted = set(syms)
    for term in sympy.Add.make_args(sympy.expand(e)):
        present = term.free_symbols & wanted
        if not present:
            continue
        c, rest = term.as_coeff_Mul()
        if len(present) != 1 or rest not in wanted or not c.is_Integer:
            return None
        out[rest] += int(c)
    return out


def size_coeffs(e: sympy.Expr, syms: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, Size] | None:
    """affine_coeffs where a coefficient may be a product of size symbols (a
    stride s1: `ix1*s1`): each an int or an expression of the sizes."""
    out: dict[sympy.Symbol, Size] = {s: 0 for s in syms}
    wanted = set(syms)
    for term in sympy.Add.make_args(sympy.expand(e)):
        present = term.free_symbols & wanted
        if not present:
            continue
        if len(present) != 1:
            return None
        sym = next(iter(present))
        factors = sympy.Mul.make_args(term)
        if factors.count(sym) != 1:
            return None
        c = sympy.Mul(*[f for f in factors if f != sym])
        if not (c.is_Integer or (c.free_symbols and all(is_size_symbol(x) for x in c.free_symbols)
                                 and c.is_polynomial(*c.free_symbols))):
            return None
        out[sym] = norm(out[sym] + c)
    return out


def _mergeable(outer: Dim, inner: Dim, exprs: Sequence[sympy.Expr]) -> bool:
    """Whether every expression steps `outer` by `inner`'s size times its step of
    `inner`: the two loops are one.  Steps and sizes may be symbolic (a channels-last
    tensor's rows of s0 channels, `ir1*s0 + ir2`)."""
    for e in exprs:
        c = size_coeffs(e, (outer.sym, inner.sym))
        if c is None or not same_size(c[outer.sym], norm(c[inner.sym] * inner.size)):
            return False
    return True


def _merge_dims(dims: tuple[Dim, ...], exprs: Sequence[sympy.Expr]) -> tuple[Size, ...] | None:
    """Sizes after merging every mergeable adjacent pair, or None if none is."""
    if len(dims) < 2:
        return None
    sizes = [dims[0].size]
    merged = False
    for outer, inner in itertools.pairwise(dims):
        if _mergeable(outer, inner, exprs):
            sizes[-1] = norm(sizes[-1] * inner.size)
            merged = True
        else:
            sizes.append(inner.size)
    return tuple(sizes) if merged else None


def merged_nest(nest: Nest, exprs: Sequence[sympy.Expr]) -> Nest | None:
    xs = _merge_dims(nest.xdims, exprs)
    rs = _merge_dims(nest.rdims, exprs)
    if xs is None and rs is None:
        return None
    return Nest.of_sizes(xs or [d.size for d in nest.xdims], rs or [d.size for d in nest.rdims])


# ---- the kernel's nest ---------------------------------------------------------------------------


def nest_nodes(bufs: Sequence[ComputedBuffer], group: tuple[int, int], nest: Nest) -> tuple[NodeIndexing, ...]:
    """Every node of the kernel in the nest's loop variables, in kernel order."""
    return tuple(node_indexing(b, group, nest) for b in bufs)


def kernel_nest(bufs: Sequence[ComputedBuffer], group: tuple[int, int], layouts: dict[str, Layout],
                stored: set[str], shapes: ShapeInfo = EMPTY) -> tuple[Nest, tuple[NodeIndexing, ...]]:
    """The nest of a kernel (refined, then merged until no adjacent dims merge)
    and its nodes in the nest's loop variables; `stored`: the buffers it writes."""
    nest = initial_nest(bufs, group, shapes)
    inside = {b.name for b in bufs}
    while True:
        nodes = nest_nodes(bufs, group, nest)
        merged = merged_nest(nest, index_expressions(nodes, layouts, inside, nest.ranges, stored))
        if merged is None:
            return nest, nodes
        nest = merged
