"""wrap : KernelProgram -> WrapperProgram

One line per allocation, reuse, view, call and free, in plan order, then Return;
a kernel's call passes its spec's parameters.  Inputs are freed with FreeLine
(`del argN_1`), buffers with FreeIfNotReusedLine (nothing is emitted when a later
Reuse takes the storage).  Last, on a target that launches several kernels at once
(Options.combo_launches, passes/combine.py), neighbouring independent pointwise
kernels become one combo."""

from __future__ import annotations

from typing import Sequence

import attrs
import sympy

from coil.errors import CoilError
from coil.ir.buffers import AliasBuffer, BufferGraph, ComputedBuffer, ExternBuffer, MultiOutputBuffer
from coil.ir.fused import ExternStep, FusedKernel, NopStep
from coil.ir.kernel import KernelProgram
from coil.ir.layout import Layout
from coil.ir.lowered import extern_tensor_names, returns_alias
from coil.ir.wrapper import (
    Alloc,
    Bind,
    ExternCall,
    Free,
    FreeKind,
    KernelCall,
    Line,
    MultiOutputLine,
    ReinterpretView,
    Return,
    Reuse,
    WrapperProgram,
    indexed_by_layout,
)
from coil.ir.shapes import free_size_symbols, is_unbacked_symbol
from coil.options import Options
from coil.passes.combine import combine_launches


def wrap(program: KernelProgram, options: Options) -> WrapperProgram:
    """Render the kernel program's plan as wrapper lines."""
    plan = program.plan
    bg = program.buffer_graph
    inputs = {i.name for i in bg.inputs}
    reused = {old for ps in plan.steps for _, old in ps.reuses}
    as_view = returned_views(program)
    # an extern's result that is the tensor it wrote into (index_add_) is dropped with
    # the storage's owner, which the plan frees: else its name would keep the storage
    aliases: dict[str, list[str]] = {}
    for alias, owner in program.schedule_graph.mutation_real_name:
        aliases.setdefault(owner, []).append(alias)
    # a tuple-valued extern's name (convolution_backward's) holds every result it
    # returned: it is dropped once its last result is bound to a name of its own (and
    # not where the plan frees it), else a result the plan frees would live on in the
    # tuple, to the graph's end where one of its results is returned
    pieces: dict[str, int] = {}
    for piece in bg.buffers:
        if isinstance(piece, MultiOutputBuffer):
            pieces[piece.extern] = pieces.get(piece.extern, 0) + 1
    tuples = frozenset(pieces)
    bound: set[str] = set()
    lines: list[Line] = []
    for ps in plan.steps:
        step = ps.step
        for new, old in ps.reuses:
            lines.append(Reuse(new, old, bg.layout(new), new in ps.inplace))
        for name in ps.allocs:
            lines.append(Alloc(name, bg.layout(name)))
        match step:
            case FusedKernel():
                spec = program.spec(step.name)
                lines.append(KernelCall(step.name, tuple(p.name for p in spec.params), spec.symbols))
            case ExternStep() if ps.elided:
                pass  # a copy_ whose source a kernel wrote into its input in place
            case ExternStep():
                b = bg.get(step.name)
                assert isinstance(b, ExternBuffer)
                lines.append(ExternCall(b.name, b.kernel, b.args, b.kwargs, b.mutated))
                bound.add(b.name)
            case NopStep():
                b = bg.get(step.name)
                if isinstance(b, AliasBuffer):
                    base = bg.get(b.base)
                    # a buffer coil allocates starts its storage; any other base is placed by its maker
                    placed = None if isinstance(base, ComputedBuffer) else bg.layout(b.base).offset
                    lines.append(ReinterpretView(b.name, b.base, b.layout, placed, b.name in as_view))
                elif isinstance(b, MultiOutputBuffer):
                    lines.append(MultiOutputLine(b.name, b.extern, b.index))
                    pieces[b.extern] -= 1
                    if not pieces[b.extern]:
                        lines.append(Free(b.extern, FreeKind.NAME))
        taken = {old for _, old in ps.inplace_pairs}
        for f in ps.frees:
            if f in tuples:
                continue  # dropped after its last result's line
            if f in taken:
                lines.append(Free(f, FreeKind.NAME))
            elif f in inputs:
                lines.append(Free(f, FreeKind.INPUT))
            elif f not in reused:
                lines.append(Free(f, FreeKind.BUFFER))
            lines.extend(Free(a, FreeKind.NAME) for a in aliases.get(f, ()) if a in bound)
    lines.append(Return(bg.outputs))
    if as_base := views_as_base(lines, program, options):
        lines = [attrs.evolve(ln, as_base=True)
                 if isinstance(ln, ReinterpretView) and ln.name in as_base
                 or isinstance(ln, Reuse) and ln.new in as_base else ln for ln in lines]
    sizes = bg.sizes
    if not sizes:
        out = WrapperProgram(tuple(i.name for i in bg.inputs), tuple(lines), program)
        combos = options.traits().combos
        if combos is not None and options.combo_launches and not options.autotune:
            out = combine_launches(out, combos)  # static sizes only: a combo's grid is fixed
        return out
    names = sizes.order + tuple(i.name for i in bg.inputs if i.name not in sizes.order)  # constants last
    return WrapperProgram(names, (*binds(bg), *bind_unbacked(lines, program)), program)


def returned_views(program: KernelProgram) -> frozenset[str]:
    """The returned views the wrapper makes as views of their base (as_strided)
    rather than as tensors over its storage (Inductor's reinterpret_tensor): those
    whose storage the caller can reach another way, a graph input (also through a
    buffer that took a donated input's storage), an extern's result that aliases
    one of its arguments, or a buffer or view that is returned too.  Such a view
    keeps eager's link to its base and shares its version counter, so autograd sees
    an in-place write into the base before the backward reads the view.  Any other
    view (a forward's saved activation over a buffer only it reaches) is a tensor
    over the storage: half as_strided's cost, and AOTAutograd saves it without a
    detach (it detaches every saved view)."""
    bg = program.buffer_graph
    returned = {n for n in bg.outputs if n is not None}
    took = {new: old for ps in program.plan.steps for new, old in ps.reuses}  # storage handed on
    inputs = {i.name for i in bg.inputs}

    def reachable(name: str) -> bool:
        """Whether the storage under `name` is one the caller can reach."""
        seen: set[str] = set()
        n: str | None = name
        while n is not None and n not in seen:
            seen.add(n)
            if n in inputs or (n != name and n in returned):
                return True
            b = bg.get(n)
            if isinstance(b, AliasBuffer):
                n = b.base
            elif isinstance(b, MultiOutputBuffer):
                parent = bg.get(b.extern)
                return isinstance(parent, ExternBuffer) and (bool(parent.mutated) or returns_alias(parent.kernel))
            elif isinstance(b, ExternBuffer):  # its result, or an argument it mutates
                return bool(b.mutated) or returns_alias(b.kernel)
            else:
                n = took.get(n)
        return False

    return frozenset(n for n in returned if isinstance(bg.get(n), AliasBuffer) and reachable(n))


def views_as_base(lines: Sequence[Line], program: KernelProgram, options: Options) -> frozenset[str]:
    """The views the wrapper binds to their base's tensor instead of making them
    (`bufN = base`), each for one of two reasons:
    - only coil's kernels read it, on a target whose kernels take each tensor by its
      data pointer (TargetTraits.pointer_arguments): a ReinterpretView over coil's own
      storage at its base's offset, or a buffer that takes a dead one's storage under
      another shape (Reuse), in its base's dtype, that no extern reads, no later view
      makes a view of (as_view), no Reuse takes and the graph does not return: the
      kernels get the same pointer;
    - its base's tensor has its layout already (size, strides, offset and dtype; as
      happens after a view of the first kind: an NHWC buffer written in place, then
      viewed as the channels-last NCHW tensor a convolution takes), and it is not
      returned.
    A ResNet inference call made 52 views and MobileNetV2's 84, about a microsecond
    each on the H200's host, where Inductor's made 2 (bench/probes/model_host.py)."""
    bg = program.buffer_graph
    returned = {n for n in bg.outputs if n is not None}
    kernels_only: set[str] = set()
    if options.traits().pointer_arguments:
        static: dict[str, object] = {}  # the storage offset of each view over coil's storage, as rendered
        read: set[str] = set(returned)  # names read as tensors, not by pointer
        for ln in lines:
            match ln:
                case ReinterpretView() if ln.as_view:
                    read.add(ln.base)
                case ReinterpretView() if ln.base_offset is None:
                    static[ln.name] = ln.layout.offset
                    if ln.layout.offset == static.get(ln.base, 0) and ln.layout.dtype == bg.layout(ln.base).dtype:
                        kernels_only.add(ln.name)
                case Reuse():
                    read.add(ln.old)
                    old = bg.layout(ln.old)
                    if ln.layout.dtype == old.dtype and (ln.layout.size, ln.layout.stride) != (old.size, old.stride):
                        kernels_only.add(ln.new)
                case ExternCall():
                    read.update(extern_tensor_names((ln.args, tuple(v for _, v in ln.kwargs))))
                    read.update(ln.mutated)
                case MultiOutputLine():
                    read.add(ln.extern)
        kernels_only -= read
    # an extern's result that kernels index or views view has its planned layout on every call
    indexed = indexed_by_layout(lines)
    # the layout of the tensor each name is bound to at run time, where it is known
    held: dict[str, Layout] = {}
    out = set(kernels_only)
    for ln in lines:
        match ln:
            case Alloc():
                held[ln.name] = attrs.evolve(ln.layout, offset=0)
            case ExternCall() if ln.name in indexed and not ln.mutated and not returns_alias(ln.kernel):
                if (lay := bg.layout(ln.name)) is not None:  # a fresh tensor of aten's, at offset 0
                    held[ln.name] = attrs.evolve(lay, offset=0)
            case Reuse() if ln.old in held:
                old = bg.layout(ln.old)
                same = (ln.layout.size, ln.layout.stride) == (old.size, old.stride)
                held[ln.new] = held[ln.old] if same or ln.new in out else attrs.evolve(
                    ln.layout, offset=held[ln.old].offset)
            case ReinterpretView() if ln.base_offset is None and not ln.as_view and ln.base in held:
                if ln.name not in out and ln.name not in returned and held[ln.base] == ln.layout:
                    out.add(ln.name)
                held[ln.name] = held[ln.base] if ln.name in out else ln.layout
    return frozenset(out)


def binds(bg: BufferGraph) -> tuple[Bind, ...]:
    """Where `call` reads each symbol it knows on entry (GraphSizes.entry_symbols):
    a SymInt input that is the symbol, else the first tensor input with a size
    (then a stride) that is the symbol."""
    out: dict[str, Bind] = {}
    for name, v in bg.sizes.inputs:
        if isinstance(v, sympy.Symbol):
            out.setdefault(v.name, Bind(v.name, name))
    for what in ("size", "stride"):
        for i in bg.inputs:
            if i.value is not None:
                continue
            for d, v in enumerate(i.layout.size if what == "size" else i.layout.stride):
                if isinstance(v, sympy.Symbol):
                    out.setdefault(v.name, Bind(v.name, i.name, what, d))
    entry = bg.sizes.entry_symbols()
    missing = [str(s) for s in entry if s.name not in out]
    if missing:
        raise CoilError(f"size symbols {missing} are no input's size, stride or value: the wrapper cannot read them",
                        stage="wrap")
    return tuple(out[s.name] for s in entry)


def bind_unbacked(lines: list[Line], program: KernelProgram) -> list[Line]:
    """The lines with a Bind of each data-dependent size symbol (`u0`) right after
    the line that makes the tensor whose size it is (`u0 = buf3.size()[0]` after
    the ExternCall or MultiOutputLine of buf3), so that `call` knows it before any
    line uses it; a line that uses a symbol no earlier line bound fails the graph."""
    bg = program.buffer_graph
    unbacked = {s for s in bg.sizes.shapes.symbols if is_unbacked_symbol(s)}
    if not unbacked:
        return lines
    bound: set[sympy.Symbol] = set(bg.sizes.entry_symbols())  # a SymInt input's, bound on entry
    out: list[Line] = []
    for ln in lines:
        used = _symbols_used_by(ln, program) & unbacked
        if used - bound:
            raise CoilError(f"{ln} uses the data-dependent sizes {sorted(map(str, used - bound))} before any "
                            "line binds them", stage="wrap")
        out.append(ln)
        if isinstance(ln, (ExternCall, MultiOutputLine)):
            b = bg.get(ln.name)
            lay = b.layout
            for d, v in enumerate(lay.size if lay is not None else ()):
                if isinstance(v, sympy.Symbol) and v in unbacked and v not in bound:
                    bound.add(v)
                    out.append(Bind(v.name, ln.name, "size", d))
            if isinstance(b, ExternBuffer) and b.scalar in unbacked and b.scalar not in bound:
                bound.add(b.scalar)  # `.item()`: the number the extern returned (`u0 = buf3`)
                out.append(Bind(b.scalar.name, ln.name, "value"))
    return out


def _symbols_used_by(ln: Line, program: KernelProgram) -> set[sympy.Symbol]:
    """The size symbols a wrapper line reads: in the layouts it allocates or views,
    a kernel's group, launches and size arguments, an extern's arguments, a
    returned size."""
    match ln:
        case Alloc() | Reuse() | ReinterpretView():
            lay = ln.layout
            return set(free_size_symbols((*lay.size, *lay.stride, lay.offset)))
        case KernelCall():
            spec = program.spec(ln.kernel)
            grids = [v for k in spec.variants for launch in k.launches for v in (*launch.grid, *launch.sizes)]
            named = {s for s in program.buffer_graph.sizes.shapes.symbols if s.name in ln.sizes}
            return set(free_size_symbols((*spec.group, *grids))) | named
        case ExternCall():
            found: set[sympy.Symbol] = set()
            for a in (*ln.args, *(v for _, v in ln.kwargs)):
                for leaf in _leaves(a):
                    if isinstance(leaf, sympy.Basic):
                        found |= {s for s in leaf.free_symbols if isinstance(s, sympy.Symbol)}
            return found
        case Return():
            return set(free_size_symbols(v for _, v in program.buffer_graph.sizes.outputs))
    return set()


def _leaves(a: object) -> list[object]:
    if isinstance(a, (tuple, list)):
        return [x for v in a for x in _leaves(v)]
    return [a]
