"""WrapperProgram: the lines of the `call(args)` function, before rendering.

vs KernelProgram: + one line per allocation, reuse, view, call, free and return;
- the per-step sets (now lines).  The kernel program stays whole, with its plan
(`plan`) and kernel specs (`specs`, `spec(name)`) at the top level.

Grammar::

    WrapperProgram ::= (inputs: name*, lines: Line*, kernel_program: KernelProgram,
                        combos: KernelSpec*)
                                                 combos: kernels of Combo space, each
                                                 launching several of the program's
                                                 pointwise kernels at once; a KernelCall
                                                 names one as it names a spec
    Line ::= Alloc(name, layout)                 bufN = empty_strided(...)
           | Reuse(new, old, layout, inplace, as_base)
                                                 bufB = bufA; del bufA  # reuse
                                                 | bufB = bufA  # in place
           | ReinterpretView(name, base, layout, base_offset, as_view, as_base)
                                                 bufN = reinterpret_tensor(base, ...)
                                                 | bufN = view(base, ...)
                                                 | bufN = base  (as_base)
           | KernelCall(kernel, args)            kernel(args..., sizes)
           | ExternCall(name, kernel, args, kwargs)
           | MultiOutputLine(name, extern, index) bufN = bufM[i]
           | Free(name, kind)                    kind: input (FreeLine)
                                                 | buffer (FreeIfNotReusedLine)
                                                 | name (its storage taken in place)
           | Return(names)
"""

from __future__ import annotations

import enum
from typing import Any, Union

import attrs

from coil.ir._delegate import ExtendsKernelProgram, PlanKernels
from coil.ir.kernel import Combo, KernelProgram, KernelSpec
from coil.ir.layout import Layout


@attrs.frozen
class Alloc:
    name: str
    layout: Layout


@attrs.frozen
class Reuse:
    """`new` takes `old`'s storage.  In place (`inplace`): old dies at the kernel
    call that follows, which reads it while writing new over it, element by element
    (plan_memory.inplace_source); old's name is dropped after that call (a Free of
    kind NAME), its storage lives on in new."""

    new: str
    old: str
    layout: Layout
    inplace: bool = False
    # new is bound to old's tensor, not made a view of it in new's shape: only coil's
    # kernels read new, by its pointer, which is old's (passes/wrap.py, views_as_base)
    as_base: bool = False


@attrs.frozen
class ReinterpretView:
    """A view of `base`'s storage.  `base_offset` is None where coil allocated the
    base (its storage offset is 0, known now); else (a graph input, an extern's
    result) it is the base's storage offset at compile time, and the view sits at
    `base.storage_offset() + layout.offset - base_offset`: the same graph may be
    called with an input at another offset in its storage (q, k, v of one tensor),
    or an extern may return a tensor its meta function placed elsewhere."""

    name: str
    base: str
    layout: Layout
    base_offset: int | None = None
    # made a view of its base (as_strided: autograd's view link, the base's version
    # counter), not a tensor over its storage, because it is returned and the caller
    # can reach that storage another way (passes/wrap.py, returned_views)
    as_view: bool = False
    # bound to its base's tensor, no view made: only coil's kernels read it (by its
    # pointer, which is the base's), or the base's tensor has its layout already
    # (passes/wrap.py, views_as_base)
    as_base: bool = False

    def delta(self) -> int:
        """The view's offset from its base's own (base_offset given)."""
        return self.layout.offset - (self.base_offset or 0)


@attrs.frozen
class KernelCall:
    kernel: str
    args: tuple[str, ...]  # buffer names, in the kernel's parameter order
    sizes: tuple[str, ...] = ()  # then the size symbols it takes (KernelSpec.symbols)


@attrs.frozen
class Bind:
    """A size symbol read from the call's arguments, once a call, before anything
    else: the SymInt input `source` itself (dim -1), or a size or stride of the
    tensor input `source`."""

    symbol: str
    source: str
    what: str = "value"  # value | size | stride
    dim: int = -1

    def text(self) -> str:
        if self.what == "value":
            return self.source
        return f"{self.source}.{self.what}()[{self.dim}]"


@attrs.frozen
class ExternCall:
    name: str
    kernel: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    mutated: tuple[str, ...] = ()


@attrs.frozen
class MultiOutputLine:
    name: str
    extern: str
    index: tuple[int | str, ...]  # a str: a key of a dict result


class FreeKind(enum.StrEnum):
    """Inductor's two free lines: a graph input's (FreeLine: `del argN_1`) and a
    buffer's (FreeIfNotReusedLine: nothing when a later Reuse takes its storage)."""

    INPUT = "input"
    BUFFER = "buffer"
    # only the name: its storage was taken in place (Reuse.inplace), or is another's
    # (an extern's result that is the tensor it wrote into, dropped with that tensor;
    # a tuple-valued extern's result, dropped once each of its results has a name)
    NAME = "name"


@attrs.frozen
class Free:
    name: str
    kind: FreeKind = attrs.field(converter=FreeKind)


@attrs.frozen
class Return:
    names: tuple[str | None, ...]


Line = Union[Bind, Alloc, Reuse, ReinterpretView, KernelCall, ExternCall, MultiOutputLine, Free, Return]


@attrs.frozen
class WrapperProgram(ExtendsKernelProgram, PlanKernels):
    inputs: tuple[str, ...]  # the names `call` unpacks from its args (buffer_graph.inputs: their buffers)
    lines: tuple[Line, ...]
    kernel_program: KernelProgram  # the link to the earlier accessors (ir/_delegate.py)
    # launches of several of the program's pointwise kernels at once (passes/combine.py):
    # their KernelCalls name these instead of their members
    combos: tuple[KernelSpec, ...] = ()

    def spec(self, name: str) -> KernelSpec:
        """A kernel a KernelCall may name: a combo, or a spec of the kernel program."""
        for k in self.combos:
            if k.name == name:
                return k
        return self.kernel_program.spec(name)

    def combo_of(self, member: str) -> KernelSpec | None:
        """The combo that launches the kernel program's spec `member`, if any."""
        return next((k for k in self.combos if isinstance(k.space, Combo) and member in k.space.members), None)


def indexed_by_layout(lines: Any) -> frozenset[str]:
    """Names whose compile-time layout matters at run time: read by a coil kernel
    (which indexes storage by that layout) or viewed through a ReinterpretView.
    Everything else (a tensor passed from extern to extern, or returned) keeps the
    strides its aten kernel gave it, as in eager; an extern's result in this set is
    held to its planned layout after the call (backends/wrapper.py, _ensure_layout)."""
    out: set[str] = set()
    for ln in lines:
        if isinstance(ln, KernelCall):
            out.update(ln.args)
        elif isinstance(ln, ReinterpretView):
            out.add(ln.base)
    return frozenset(out)
