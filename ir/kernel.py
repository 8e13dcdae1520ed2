"""KernelProgram: every scheduling decision a fused kernel needs, as a value.

vs MemoryPlan: + one KernelSpec per fused kernel: its iteration space (flat,
tiled y by x, rows held whole or looped, down the columns of what it reads, split
into parts), its parameters and the buffers it stores, its nodes in kernel
coordinates, its stages (the outer body, and reduction loops with their
accumulators), its tails and its launches with the rule that chose each; - nothing
(the plan is kept whole, `plan`, and what wrap and the backends read of it is at
the top level).

Grammar::

    KernelProgram ::= (plan: MemoryPlan, specs: KernelSpec*)
    KernelSpec ::= (name, kind, group, device, space: Space, params: Param*,
                    nodes: KernelNode*, stages: Stage*, wide_index,
                    tails: Tails | None, launches: KernelLaunch*, nest: LoopNest | None,
                    streams: Streams | None, scratch: ScratchArray*, hoisted: Hoisted*,
                    asserts: CheckKind*, reads: Read*, symbols, choice: Choice | None,
                    wide: WideIndex | None)
    WideIndex ::= (offsets: Size*)           int32 where every offset < 2**31, else the
                                             int64 twin (KernelSpec.wide_twin)
    Choice ::= (persistent: KernelSpec, rnumel, rblock, why)
                                             a looped kernel's persistent variant, which
                                             a call launches instead where rnumel <= rblock
    Read ::= (load: Load | IndirectLoad, offset, tails)
                                             a load from memory: its offset from the
                                             start of its buffer's view, in kernel
                                             coordinates, and the tails masking it
    Space ::= Flat(numel, rnumel)            xindex over numel; reductions over <= 1
                                             element fold to their value or identity
            | Tiled(rows, cols, transposed, one_axis)
                                             yindex [YBLOCK] x xindex [XBLOCK]
            | Rows(xnumel, rnumel, looped, columns, lanes)
                                             xindex over rows, rindex along each row:
                                             held whole (persistent) or looped in
                                             RBLOCK steps; columns: a kernel row is a
                                             column in memory (lanes: a block of that
                                             many columns runs together on a nest)
            | Combo(members, starts)         only a WrapperProgram's combos: several
                                             pointwise kernels' programs in one launch
            | Split(xnumel, rnumel, parts, chunk, xblock, columns, workspaces, even, prelude)
                                             each row (a block of xblock rows) reduced
                                             in `parts` chunks by as many programs,
                                             then combined (even: the nest's outer r
                                             loop dealt out evenly among threads;
                                             prelude: the per-row nodes each program
                                             computes before its loop)
    LoopNest ::= (xsizes, rsizes, block, tile: NestTile | None, parallel: Parallel | None,
                  nodes: NestNode*, ..., cuts, guards: Op*, versions)
                                             guards: comparisons of outer loop variables
                                             that mask loads; the innermost loop runs in
                                             one version for each of their values the
                                             loops reach (versions)
    NestNode ::= (name, body, store)
    NestTile ::= (u, v, side, staged: StagedRead*)
    StagedRead ::= (buffer, offset, stride)
    Parallel ::= (loops, iterations, chunk)
    Streams ::= (buffers, chunk)             stored buffers written by streaming stores
    ScratchArray ::= (expr, slot, first, last)
                                             a subtree's values along the row, stored
                                             in r-loop `first`, read up to loop `last`
    Hoisted ::= (level, hoisted: Expr*, reciprocals: Op*)
                                             what r-loop `level` computes once per row
    KernelNode ::= (name, role, body, dtype, reduction_type, store, origins, deps)
    Stage ::= Body(nodes, loads: Load*)      one scope, nodes in kernel order
            | Outer(level, nodes, loads: Load*)
                                             per-row nodes before loop `level`
                                             (after the last loop: level = loops)
            | Loop(level, nodes, computes, accumulators, loads: Load*)
    Accumulator ::= (node, reduction_type, update, partner, second_pass, dtype)
    KernelLaunch ::= (function, grid, sizes, config: LaunchConfig, rule, why, fixed)
                                             fixed: why its config is neither autotuned
                                             nor compiled ahead ("": it is both)
    CheckKind ::= "index" | "divisor"         a kind of run-time check spelled as a
                                             device assert

A target whose traits issue loads first gets, on each Body and Loop stage, the
loads from memory that scope issues before anything else, in that order
(`loads`, passes/schedule/loads.py: a tiled kernel's in tiling.py's load_order;
a loop's without those an outer stage before it computed already; in a split
reduction, each Outer stage after its loop: its combine issues them before it
loads the partial results, so their latency overlaps the combine's), and every
load from memory with its offset and tails (`reads`), which its renderer spells
as a pointer plus that offset, masked by those tails; and, where
its checks are device asserts, the kinds of check the kernel asserts (`asserts`,
passes/schedule/launch.py: device_asserts): an index on any device, a divisor
only where eager checks it (not on CUDA).  A kernel with any launches with its
asserts compiled in.

Bodies are the nodes' bodies over the kernel's index symbols (xindex, rindex; a
tiled kernel's yindex, xindex), as the nodes of the FusedKernel compute them; the
expression language is unchanged.  A Loop's `nodes` are the inner and reduction
nodes of its level (each node sits in exactly one stage); its `computes` are what
each step evaluates, in kernel order: the loop's reductions and stored inner
nodes, and the inner nodes they read, recomputed from their bodies rather than kept
across loops.  A target whose traits leave a decision to its renderer (no launch
heuristics: the C++ and reference targets) gets `tails` None and no launches.

A target whose traits ask for loop nests (the C++ target) gets each kernel's
`nest`: xindex and rindex as nests of loops (passes/schedule/nest.py: index
expressions in the loop variables ix0, ix1, ... and ir0, ...), its nodes' bodies
and stores in those variables, a pointwise kernel's tiles or blocks, and the
loops its threads share (passes/schedule/threads.py); other targets get None.
On such a nest the traits may also ask for the decisions on what a kernel keeps
and where it writes: a memory-bound pointwise kernel's large outputs written by
streaming stores (`streams`, passes/schedule/streams.py), a reduction's row
scratch arrays and what each r-loop computes once per row, divisions by such
values made multiplications by a reciprocal (`scratch`, `hoisted`,
passes/schedule/rows.py).  Their expressions are subtrees of the nest's bodies.
A target whose traits ask for a run-time choice (multi_kernel: Triton) gets, on
a looped reduction over a symbolic row whose hint fits one tile but whose range
does not, a persistent variant of the same nodes, parameters and size arguments
(`choice`): its tail masked on rindex < rnumel, its launch the persistent rule's
at the hints (RBLOCK the hint's row rounded up to a power of two) and, as tiers,
at rows of twice that RBLOCK and more, up to the persistent limit; the wrapper
launches the first that fits the row, and the looped kernel past the last, once a
call (Inductor's multi-kernel, decided by the bounds instead of by timing both).  On such a target a symbolic kernel whose offsets fit int32 at
the hints but may pass it in the ranges has int32 index math and an int64 twin
(`wide`, KernelSpec.wide_twin): the wrapper launches the twin where an offset
reaches 2**31, as Inductor's 32-bit indexing guards would recompile.
"""

from __future__ import annotations

import enum
from typing import Any, Collection, Union

import attrs
import sympy
import torch

from coil.ir._delegate import ExtendsMemoryPlan, PlanKernels
from coil.ir.expr import Expr, IndirectLoad, Load
from coil.ir.fused import KernelKind, Step
from coil.ir.memory import MemoryPlan
from coil.ir.shapes import Size, py_size

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)
YINDEX = sympy.Symbol("yindex", integer=True, nonnegative=True)  # rows of a 2-D tiled kernel


def tails_of(symbols: Collection[sympy.Basic]) -> str:
    """The axes whose tails mask a lane that uses `symbols` ("y", "x", "r" in that
    order): a lane is valid exactly where every symbol it uses is in range."""
    return "".join(a for a, s in (("y", YINDEX), ("x", XINDEX), ("r", RINDEX)) if s in symbols)


def group_ranges(group: tuple[Any, Any]) -> dict[sympy.Symbol, Any]:
    """xindex and rindex over a kernel's group, at least 1 each (a symbolic size
    as it is: where a data-dependent one is 0, the loop runs over nothing)."""
    return {XINDEX: max(group[0], 1) if isinstance(group[0], int) else group[0],
            RINDEX: max(group[1], 1) if isinstance(group[1], int) else group[1]}


class Role(str, enum.Enum):
    """How a node runs in its kernel (passes/kernel_model.py: node_role)."""

    REDUCTION = "reduction"  # one value per row, reduced over rindex
    OUTER = "outer"  # one value per row (xindex)
    INNER = "inner"  # one value per (xindex, rindex)
    TILED = "tiled"  # one value per (yindex, xindex) of a tiled pointwise kernel


class Update(str, enum.Enum):
    """How a looped reduction's accumulator takes each step's values."""

    LANES = "lanes"  # per-lane partial results, reduced across lanes after the loop
    ROW_MAX = "row_max"  # a max whose online sums share its running row max: no lanes of its own
    ONLINE_SUM = "online_sum"  # a sum of exp(v - max v), rescaled whenever the row max grows


class LaunchRule(str, enum.Enum):
    """Which rule of the launch heuristics chose a launch's config."""

    POINTWISE = "pointwise"
    TILED = "tiled"
    PERSISTENT = "persistent"
    CHAINED = "chained"  # a persistent kernel of many chained row reductions: one row a program
    WARP_ROWS = "warp_rows"  # many persistent rows of a few hundred elements: one row a program on one warp
    LOOPED = "looped"
    FEW_ROWS = "few_rows"  # a few long rows: wide steps, many warps
    UNALIGNED = "unaligned"  # long rows whose starts are not 16 bytes apart: more warps issue the loads
    COLUMNS = "columns"  # looped down the columns: a block of neighbouring columns a program
    SPLIT = "split"  # partial results of a row's chunks
    COMBINE = "combine"  # the partial results merged, a row (a block of columns) a program
    COMBO = "combo"  # several pointwise kernels' programs in one launch (Combo)


class ParamRole(enum.StrEnum):
    """Whether a kernel parameter is read (in_ptrN) or written (out_ptrN)."""

    IN = "in"
    OUT = "out"


@attrs.frozen
class Param:
    name: str  # buffer name
    role: ParamRole = attrs.field(converter=ParamRole)
    arg: str  # in_ptr0, out_ptr0


@attrs.frozen
class KernelNode:
    name: str
    role: Role
    body: Expr  # over the kernel's index symbols
    dtype: torch.dtype  # its buffer's: the value is cast to it, as a store and reload would
    reduction_type: str | None
    store: sympy.Expr | None  # where it is stored, from the start of its buffer's view; None: registers only
    origins: tuple[str, ...]
    deps: tuple[str, ...]  # the nodes of this kernel it reads

    @property
    def is_root(self) -> bool:
        """What a loop that holds it exists for: a reduction, or a node it stores
        (the others are only recomputed where they are read)."""
        return self.role is Role.REDUCTION or self.store is not None


@attrs.frozen
class Flat:
    numel: int
    rnumel: int  # 0 or 1: a reduction over no element takes its identity, over one its value


@attrs.frozen
class Tiled:
    """A pointwise kernel's flat range split into `rows` x `cols` (flat = row * cols
    + col) and laid on the tile's two axes: yindex (YBLOCK, grid axis 1) and xindex
    (XBLOCK, grid axis 0, whose programs start one after another).  Plain: xindex
    runs along the columns; transposed: along the rows, so programs start in the
    order a column-major output is written.  Sizes may be symbolic; where the row
    blocks (ynumel's) may outnumber what grid axis 1 takes, for some size, all
    the tile's programs go on axis 0 (`one_axis`): program p is row block p //
    cdiv(xnumel, XBLOCK), column block p % cdiv(xnumel, XBLOCK), in the order the
    2-D grid runs them."""

    rows: Any  # Size: an int, or an expression of the size symbols
    cols: Any
    transposed: bool = False
    one_axis: bool = False

    @property
    def ynumel(self) -> Any:
        return self.rows if not self.transposed else self.cols

    @property
    def xnumel(self) -> Any:
        return self.cols if not self.transposed else self.rows

    @property
    def ranges(self) -> dict[sympy.Symbol, Any]:
        return {YINDEX: self.ynumel, XINDEX: self.xnumel}

    def flat(self) -> sympy.Expr:
        return YINDEX * self.cols + XINDEX if not self.transposed else XINDEX * self.cols + YINDEX


@attrs.frozen
class Rows:
    xnumel: int
    rnumel: int
    looped: bool  # False: the whole row is one tile (persistent)
    columns: bool = False  # looped down the columns of what it reads, a block of columns a program
    lanes: int = 0  # on a loop nest: the columns run together, one vector lane each (0: no nest's)


@attrs.frozen
class Split:
    xnumel: int
    rnumel: Any  # Size: an int, or an expression of the size symbols
    parts: int  # programs of the first stage per row (per block of columns)
    # elements each reduces: an int, or (a symbolic row) RBLOCK * FloorDiv(r + parts*RBLOCK - 1,
    # parts*RBLOCK), judged at the hint (passes/schedule/split.py)
    chunk: Any
    xblock: int  # rows a program: 1, or a block of columns in memory
    columns: bool
    workspaces: tuple[tuple[str, torch.dtype], ...]  # (reduction node, dtype) of each partial result stored
    # the nest's outer r loop dealt out among `parts` threads, part c taking its steps
    # [c * size / parts, (c + 1) * size / parts); `chunk` is then the most elements a part
    # reduces, and the partial results stay in the kernel
    even: bool = False
    # per-row nodes every program of the first launch computes before its loop, not
    # storing them (the combine does): what the loop reads of them, and what they share
    # with it, is then computed once a program instead of every step
    prelude: tuple[str, ...] = ()

    def row_blocks(self) -> int:
        return -(-self.xnumel // self.xblock)


@attrs.frozen
class Combo:
    """Several static pointwise kernels, none touching what another writes, in one
    launch (WrapperProgram.combos; never a KernelProgram's space): program p runs
    member i, where starts[i] <= p < starts[i + 1] (the last member's end is the
    launch's grid), as program p - starts[i] of that member's own launch, with
    that member's XBLOCK."""

    members: tuple[str, ...]  # the member kernels, specs of the kernel program
    starts: tuple[int, ...]  # the first program of each


Space = Union[Flat, Tiled, Rows, Split, Combo]


@attrs.frozen
class StagedRead:
    """A read that a tile transposes into a local buffer first: its offset in the
    nest's loop variables and its stride along the innermost loop."""

    buffer: str
    offset: sympy.Expr
    stride: Any  # Size: an int, or an expression of the size symbols (s1)


@attrs.frozen
class NestTile:
    """Loops u and v (v the innermost) of a pointwise kernel's nest in side x side
    tiles; each staged read walks memory along u."""

    u: int
    v: int
    side: int
    staged: tuple[StagedRead, ...]


@attrs.frozen
class Parallel:
    """The outermost `loops` loops run on threads, collapsed into one range of
    `iterations`, handed out in dynamic chunks of `chunk` iterations (a split
    reduction's: its parts loop)."""

    loops: int
    iterations: int
    chunk: int


@attrs.frozen
class NestNode:
    """A node in the nest's loop variables: its body, and where it stores (from
    the start of its buffer's view; None: registers only)."""

    name: str
    body: Expr
    store: sympy.Expr | None


@attrs.frozen
class LoopNest:
    """xindex as nested loops of `xsizes`, rindex of `rsizes` (outermost first;
    loop i's variable ixi, iri), and the kernel's nodes in those variables, in
    kernel order.  A pointwise kernel's innermost loop may run in blocks of
    `block` elements or, with an outer loop, in tiles; a reduction's r loop in
    blocks of `rblock`."""

    xsizes: tuple[int, ...]
    rsizes: tuple[int, ...]
    block: int = 0  # 0: the innermost loop is not cut
    tile: NestTile | None = None
    parallel: Parallel | None = None  # None: one thread
    nodes: tuple[NestNode, ...] = ()
    # a pointwise nest's lane tables (passes/schedule/lanes.py): subtrees of its nodes'
    # bodies that read the innermost loop's variable alone, each computed once per
    # call into a table that long and read from it
    tables: tuple[Expr, ...] = ()
    # a pointwise nest's invariants (passes/schedule/lanes.py): subtrees of its nodes'
    # bodies that read no loop variable (an Adam step's bias corrections of its 0-d
    # step count), each computed once per call, before the loops
    invariants: tuple[Expr, ...] = ()
    # a pointwise nest's innermost loop cut at these points, one loop a piece, in each
    # of which the comparisons of that loop's variable are constants, so its masks and
    # selects fold away (passes/schedule/pieces.py)
    cuts: tuple[int, ...] = ()
    # comparisons of the outer loop variables alone that mask loads of a pointwise
    # nest: computed once before its innermost loop, which runs in one version for
    # each of their values, in which they are constants, so its masked loads are
    # plain loads or none and the loop vectorizes (passes/schedule/pieces.py: guards)
    guards: tuple[Expr, ...] = ()
    # the guards' values the outer loops reach, one version of the innermost loop each
    # (the first: every guard holds, where the loops reach that), in the order the
    # renderer tests them; the last is taken where none of the others is
    versions: tuple[tuple[bool, ...], ...] = ()
    # a reduction's r loop run in blocks of this many elements (a split's part, in
    # blocks of its own; on a column nest, of this many steps of its outermost r loop),
    # each block summed into fresh accumulators that are then folded into the row's: a
    # float sum's rounding error then grows with the block and the number of blocks, not
    # with the whole row (eager's sums cascade); 0: one loop
    rblock: int = 0


@attrs.frozen
class Streams:
    """Stored buffers of a pointwise kernel on a loop nest written with
    non-temporal stores: each chunk of `chunk` elements (a tiled nest: a whole
    tile) is computed into a local buffer, then streamed out to memory."""

    buffers: tuple[str, ...]
    chunk: int


@attrs.frozen
class ScratchArray:
    """`expr` (a subtree of the nest's bodies that varies along the row) computed
    in r-loop `first` and stored into a row-sized array, which the r-loops after
    it up to `last` read instead of computing it again.  Arrays are numbered by
    `slot`: a later value may take the slot of one no loop reads any more."""

    expr: Expr
    slot: int
    first: int
    last: int


@attrs.frozen
class Hoisted:
    """What r-loop `level` computes once per row, before the loop: `hoisted`, the
    largest subtrees it evaluates that do not vary along the row (everything
    below them too); `reciprocals`, its divisions (truediv nodes) by such a
    value, which multiply by the divisor's reciprocal, computed once per row."""

    level: int
    hoisted: tuple[Expr, ...]
    reciprocals: tuple[Expr, ...] = ()


@attrs.frozen
class Accumulator:
    node: str
    reduction_type: str
    update: Update
    partner: str | None = None  # ONLINE_SUM: its max; ROW_MAX: its first online sum
    second_pass: bool = False  # it reads the row again in the next loop (a two-pass welford_m2's deviations)
    dtype: torch.dtype | None = None  # ROW_MAX: the dtype its running row max is kept in (half values widen)


@attrs.frozen
class Body:
    nodes: tuple[str, ...]
    loads: tuple[Load, ...] = ()  # loads from memory issued first, in this order


@attrs.frozen
class Outer:
    level: int
    nodes: tuple[str, ...]
    loads: tuple[Load, ...] = ()  # a split's combine: loads from memory issued first, in this order


@attrs.frozen
class Loop:
    level: int
    nodes: tuple[str, ...]
    computes: tuple[str, ...]  # empty: nothing stored or reduced here (its nodes are recomputed later)
    accumulators: tuple[Accumulator, ...]
    loads: tuple[Load, ...] = ()  # loads from memory each step issues first, in this order


Stage = Union[Body, Outer, Loop]


@attrs.frozen
class LaunchConfig:
    xblock: int
    rblock: int  # 0 for pointwise kernels
    num_warps: int
    yblock: int = 0  # tiled kernels only

    def meta(self) -> dict[str, int]:
        out = {"YBLOCK": self.yblock} if self.yblock else {}
        out["XBLOCK"] = self.xblock
        if self.rblock:
            out["RBLOCK"] = self.rblock
        return out

    def as_kwargs(self) -> str:
        parts = [f"{k}={v}" for k, v in self.meta().items()] + [f"num_warps={self.num_warps}"]
        return ", ".join(parts)


@attrs.frozen
class Read:
    """A load from memory in kernel coordinates: its offset from the start of its
    buffer's view (the pointer the kernel is given; an indirect load's over its
    values' indsym(k) too) and the axes whose tails mask it (tails_of the symbols
    it uses: an indirect load's values' too)."""

    load: Load | IndirectLoad
    offset: sympy.Expr
    tails: str


@attrs.frozen
class KernelLaunch:
    function: str  # the kernel, or its combine function
    grid: tuple[int, int, int]
    sizes: tuple[int, ...]  # the size arguments after the pointers
    config: LaunchConfig
    rule: LaunchRule
    why: str
    fixed: str = ""  # why autotuning and ahead-of-time compiling leave it alone; "": they take it


@attrs.frozen
class Tails:
    """Whether some launch config (the heuristic's or one autotuning tries; of a
    symbolic kernel, those it launches with) may leave a partial block: where
    not, that mask is a constant True."""

    outer: bool  # xnumel (tiled: ynumel; split: the rows a program)
    inner: bool  # rnumel (tiled: xnumel)


@attrs.frozen
class KernelSpec:
    name: str
    kind: KernelKind = attrs.field(converter=KernelKind)  # the FusedKernel's
    group: tuple[int, int]
    device: str
    space: Space
    params: tuple[Param, ...]  # reads from outside (in_ptrN), then writes (out_ptrN)
    nodes: tuple[KernelNode, ...]
    stages: tuple[Stage, ...]
    wide_index: bool  # index math in int64: some offset or the iteration space reaches 2**31
    tails: Tails | None
    launches: tuple[KernelLaunch, ...]  # none: nothing to compute, or left to the renderer
    nest: LoopNest | None = None  # on a target whose traits ask for loop nests
    streams: Streams | None = None  # on a nest, where its traits ask for streaming stores
    scratch: tuple[ScratchArray, ...] = ()  # row scratch arrays, in the order they are first stored
    hoisted: tuple[Hoisted, ...] = ()  # per r-loop (by level), what runs once per row
    asserts: tuple[str, ...] = ()  # the kinds of run-time check ("index", "divisor") spelled as device asserts
    reads: tuple[Read, ...] = ()  # its bodies' loads from memory, each once, in first-read order
    symbols: tuple[str, ...] = ()  # the size symbols it takes as arguments after its pointers (symbolic sizes)
    choice: Choice | None = None  # a persistent variant a call launches instead where its row fits
    wide: WideIndex | None = None  # int32 index math where its offsets fit, else its int64 twin

    def node(self, name: str) -> KernelNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def ranges(self) -> dict[sympy.Symbol, int]:
        """The kernel's index symbols and their ranges (at least 1 each), which
        index expressions are simplified over."""
        return self.space.ranges if isinstance(self.space, Tiled) else group_ranges(self.group)

    @property
    def ptr(self) -> dict[str, str]:
        """Buffer -> its pointer argument (in_ptrN / out_ptrN)."""
        return {p.name: p.arg for p in self.params}

    @property
    def variants(self) -> tuple["KernelSpec", ...]:
        """The kernel and, where it has a choice, its persistent variant; where its
        index width is chosen by call, then its int64 twin's: every kernel this
        spec compiles to."""
        own = (self,) if self.choice is None else (self, self.choice.persistent)
        return own if self.wide is None else (*own, *self.wide_twin().variants)

    def wide_twin(self) -> "KernelSpec":
        """The same kernel (and persistent variant) with int64 index math, named
        with WIDE_SUFFIX: what a call launches where the offsets pass int32."""
        assert self.wide is not None, f"{self.name} has no int64 twin"
        return _wide(self)

    @property
    def config_kind(self) -> str:
        """The kind the launch heuristics (and autotuning) pick this kernel's configs by:
        pointwise | tiled | persistent | reduction | columns."""
        match self.space:
            case Tiled():
                return "tiled"
            case Rows(columns=True) | Split(columns=True):
                return "columns"
        return str(self.kind)  # a plain str, as the others: autotuning's key prints it with repr

    @property
    def reductions(self) -> int:
        return sum(1 for n in self.nodes if n.reduction_type)


@attrs.frozen
class Choice:
    """A looped kernel's persistent variant and when a call launches it instead:
    where the row, `rnumel` (the kernel's, a size of its symbols), fits one of
    the variant's launches, rnumel <= `rblock` (the last one's bound); the looped
    kernel where it does not.  The variant's own launch is configured at the
    hint's row; `tiers` are further launches of the same kernel at longer rows
    (RBLOCK doubled up to the persistent limit), each taken where the row passes
    the launches before it and fits its RBLOCK.  All compute the same nodes into
    the same parameters from the same size arguments."""

    persistent: KernelSpec
    rnumel: Size
    rblock: int
    why: str
    tiers: tuple[KernelLaunch, ...] = ()

    @property
    def launches(self) -> tuple[KernelLaunch, ...]:
        """The persistent variant's launches, by rising RBLOCK: its own, then the tiers."""
        return (*self.persistent.launches, *self.tiers)

    def bounds(self) -> tuple[int, ...]:
        """The longest row each launch takes: its RBLOCK, the last one's `rblock`."""
        return (*(ln.config.rblock for ln in self.launches[:-1]), self.rblock)

    def tests(self) -> tuple[str, ...]:
        """Each launch's condition as the wrapper spells it (after the ones before)."""
        return tuple(f"{py_size(self.rnumel)} <= {b}" for b in self.bounds())

    def test(self) -> str:
        """The condition as the wrapper spells it, over the symbols `call` bound."""
        return f"{py_size(self.rnumel)} <= {self.rblock}"


# the name of a kernel's int64 twin: its own name and this
WIDE_SUFFIX = "_i64"


@attrs.frozen
class WideIndex:
    """A symbolic kernel whose offsets fit int32 at the hints, but whose ranges
    let them pass it: its index math is int32 where every one of `offsets` (the
    largest offset of each parameter's storage and of its iteration space, those
    its ranges do not bound below 2**31) is below 2**31, and a call launches its
    int64 twin (KernelSpec.wide_twin) where one is not."""

    offsets: tuple[Size, ...]

    def test(self) -> str:
        """The condition for the int32 kernel, over the symbols `call` bound."""
        return " and ".join(f"{py_size(e)} < {2**31}" for e in self.offsets)

    def show(self) -> str:
        return " and ".join(f"{e} < 2**31" for e in self.offsets)


def _wide(k: KernelSpec) -> KernelSpec:
    launches = tuple(attrs.evolve(ln, function=ln.function + WIDE_SUFFIX) for ln in k.launches)
    c = k.choice
    choice = None if c is None else attrs.evolve(c, persistent=_wide(c.persistent), tiers=tuple(
        attrs.evolve(ln, function=ln.function + WIDE_SUFFIX) for ln in c.tiers))
    return attrs.evolve(k, name=k.name + WIDE_SUFFIX, wide_index=True, wide=None, launches=launches, choice=choice)


@attrs.frozen
class KernelProgram(ExtendsMemoryPlan, PlanKernels):
    plan: MemoryPlan  # the link to the earlier accessors (ir/_delegate.py)
    specs: tuple[KernelSpec, ...]  # one per fused kernel, in plan order

    def spec(self, name: str) -> KernelSpec:
        for k in self.specs:
            if k.name == name:
                return k
        raise KeyError(name)

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(ps.step for ps in self.plan.steps)

    @property
    def removed(self) -> frozenset[str]:
        return self.plan.removed
