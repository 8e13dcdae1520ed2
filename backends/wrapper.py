"""Renders a WrapperProgram as Python: output_code.py's `call(args)`, which unpacks
the inputs, clears `args`, allocates, launches, deletes and returns, plus a
benchmark main so the file runs on its own."""

from __future__ import annotations

import re
from typing import Any, Sequence

import sympy
import torch

from coil.backends.common import KernelBackend
from coil.ir.buffers import ComputedBuffer, ExternBuffer
from coil.ir.layout import Layout
from coil.ir.lowered import MapArg, PyTuple, Subgraph, TensorRef, extern_subgraphs, returns_alias
from coil.ir.module import KernelSource
from coil.ir.shapes import UNBACKED_PREFIX, Size, gt, norm, py_size
from coil.ir.wrapper import (
    Alloc,
    Bind,
    ExternCall,
    Free,
    FreeKind,
    KernelCall,
    MultiOutputLine,
    ReinterpretView,
    Return,
    Reuse,
    WrapperProgram,
    indexed_by_layout,
)
from coil.options import Options


def py_value(v: Any) -> str:
    """A Python literal for an extern argument."""
    if isinstance(v, TensorRef):
        return v.name
    if isinstance(v, PyTuple):
        return "(" + ", ".join(py_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, tuple):
        return "[" + ", ".join(py_value(x) for x in v) + "]"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, (torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return f"float({str(v)!r})"
    if isinstance(v, sympy.Expr):  # a size: `call` has bound its symbols
        return py_size(norm(v))
    if isinstance(v, sympy.core.relational.Relational):  # a condition on sizes (what _assert_scalar checks)
        return f"({py_size(norm(v.lhs))} {v.rel_op} {py_size(norm(v.rhs))})"
    if isinstance(v, MapArg):
        return "{" + ", ".join(f"{k!r}: {py_value(x)}" for k, x in v.items) + "}"
    if isinstance(v, Subgraph):  # a module-level name (subgraph_bindings), bound as the module loads
        return subgraph_symbol(v.name)
    if isinstance(v, torch._ops.OpOverload):  # the op a higher-order op calls (auto_functionalized's)
        return f"torch.ops.{v}"
    return repr(v)


def subgraph_symbol(name: str) -> str:
    """The module-level name output_code.py calls a higher-order op's subgraph by."""
    return "subgraph_" + re.sub(r"\W", "_", name)


def subgraph_bindings(program: WrapperProgram) -> list[str]:
    """Each subgraph's module-level name, None in the text: load_module binds it to
    the compiled subgraph, or to the FX graph (see passes/higher_order.py)."""
    subs = {s.name: s for ln in program.lines if isinstance(ln, ExternCall)
            for s in extern_subgraphs((ln.args, tuple(v for _, v in ln.kwargs)))}
    return [f"{subgraph_symbol(s.name)} = None  # {'compiled by coil' if s.compiled else 'its FX graph, in eager'}, "
            "bound when the module loads" for s in subs.values()]


def owns_storage(program: WrapperProgram, name: str) -> bool:
    """Only storage coil owns may be poisoned: a view's storage is its base's (maybe
    a caller's input); an extern's result is its own unless the op returns an alias
    of an argument or a tuple."""
    b = program.get(name)
    if isinstance(b, ComputedBuffer):
        return True
    return isinstance(b, ExternBuffer) and b.layout is not None and not returns_alias(b.kernel)


# matmuls: aten makes their result with at::empty of its size (contiguous), on every
# device, so a planned contiguous layout holds without a check (a microsecond a call)
CONTIGUOUS_RESULTS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default",
                                "aten.baddbmm.default"})


def _ensure_layout(program: WrapperProgram, name: str, indexed: frozenset[str]) -> list[str]:
    """After an extern: hold its result to the layout coil planned for it (a no-op
    unless the aten kernel disagrees with its meta function).  Kernels and views
    index it by size, strides and dtype; anything else needs its dtype only."""
    b = program.get(name)
    if b.layout is None or (isinstance(b, ExternBuffer) and b.mutated):
        return []
    if isinstance(b, ExternBuffer) and b.kernel in CONTIGUOUS_RESULTS and b.layout.is_contiguous():
        return []  # aten allocates these results contiguous, in the inputs' dtype: nothing to check
    dtype = b.layout.dtype
    if name not in indexed:
        return [f"    if isinstance({name}, torch.Tensor) and {name}.dtype != {dtype}: {name} = {name}.to({dtype})"]
    # the usual case, the layout planned, costs a few attribute reads; ensure_layout sorts out the rest
    size, stride = (sizes_text(t) for t in (b.layout.size, b.layout.stride))
    return [f"    if not (isinstance({name}, torch.Tensor) and {name}.stride() == {stride} and {name}.dtype == {dtype} "
            f"and {name}.shape == {size}):",
            f"        {name} = ensure_layout({name}, {layout_args(b.layout)}, {dtype}, {name!r})"]


def sizes_text(values: Sequence[Size]) -> str:
    """A tuple of sizes as Python: literals, and expressions of the size symbols
    `call` has bound."""
    return f"({', '.join(map(py_size, values))}{',' if len(values) == 1 else ''})"


def layout_args(lay: Layout) -> str:
    return f"{sizes_text(lay.size)}, {sizes_text(lay.stride)}"


def render_call(program: WrapperProgram, backend: KernelBackend, options: Options) -> list[str]:
    """The body of `call(args)`."""
    out = ["def call(args):"]
    ins = program.inputs
    if ins:
        out.append(f"    {', '.join(ins)}{',' if len(ins) == 1 else ''} = args")
    out.append("    args.clear()")
    body = _call_body(program, backend, options)
    # optional backend hooks: lines at the top of call, and a `with` line (a device
    # guard) around the rest of it
    prologue = getattr(backend, "prologue", None)
    if prologue is not None:
        body = ["    " + ln for ln in prologue(program, options)] + body
    guard = getattr(backend, "device_guard", None)
    head = guard(program) if guard is not None else None
    if head is None:
        return out + body
    return out + [f"    {head}"] + ["    " + ln for ln in body]


def _call_body(program: WrapperProgram, backend: KernelBackend, options: Options) -> list[str]:
    """call's lines after `args.clear()`, each indented one level."""
    out: list[str] = []
    indexed = indexed_by_layout(program.lines)
    # optional backend hook: the CUDA device current while `call` runs (its device guard's)
    guard_device = getattr(backend, "guard_device", None)
    cuda_guard = guard_device(program) if guard_device is not None else None
    static_offset: dict[str, int] = {}  # storage offsets of coil's own views, known now
    borrowed: set[str] = set()  # buffers in storage coil does not own (an input reused in place)
    # an extern's result whose sizes bind data-dependent symbols (u0 = buf1.size()[0]) is held to its
    # layout after the last of those binds, which its layout reads (a SymInt input's `u` binds as a value)
    ensure_after = {ln.source: ln.symbol for ln in program.lines
                     if isinstance(ln, Bind) and ln.symbol.startswith(UNBACKED_PREFIX) and ln.what != "value"}
    shapes = program.sizes.shapes
    for ln in program.lines:
        match ln:
            case Bind():
                out.append(f"    {ln.symbol} = {ln.text()}")
                fact = shapes.fact(sympy.Symbol(ln.symbol, integer=True, nonnegative=True)) \
                    if ln.symbol.startswith(UNBACKED_PREFIX) else None
                if fact is not None:  # a size of an extern's result: the range coil's proofs took, checked here
                    if fact.lower > 0 or fact.upper is not None:
                        test = f"{fact.lower} <= {ln.symbol}" + (f" <= {fact.upper}" if fact.upper is not None else "")
                        out.append(f"    if not {test}: raise RuntimeError(f'{ln.symbol} = {{{ln.symbol}}}, outside "
                                   f"the range {fact.lower}..{fact.upper if fact.upper is not None else 'oo'} "
                                   "coil compiled for')")
                    if ensure_after.get(ln.source) == ln.symbol:
                        out += _ensure_layout(program, ln.source, indexed)
            case Alloc():
                if ln.layout.device == cuda_guard:  # torch's allocation without the dispatcher, on the guard's device
                    out.append(f"    {ln.name} = empty_strided_cuda({layout_args(ln.layout)}, {ln.layout.dtype})")
                elif ln.layout.device == "cpu":
                    out.append(f"    {ln.name} = empty_strided_cpu({layout_args(ln.layout)}, {ln.layout.dtype})")
                else:
                    out.append(f"    {ln.name} = empty_strided({layout_args(ln.layout)}, dtype={ln.layout.dtype}, device={ln.layout.device!r})")
            case Reuse():
                if not owns_storage(program, ln.old) or ln.old in borrowed:
                    borrowed.add(ln.new)  # an input's storage (written in place) is never poisoned
                old = program.layout(ln.old)
                # in place, the kernel after this line still reads old: its name stays until then
                drop, why = ("", "in place") if ln.inplace else (f"; del {ln.old}", "reuse")
                if (old.size, old.stride) == (ln.layout.size, ln.layout.stride) or ln.as_base:
                    only = ", as its base" if ln.as_base else ""  # old's tensor (wrap.views_as_base)
                    out.append(f"    {ln.new} = {ln.old}{drop}  # {why}{only}")
                else:
                    out.append(f"    {ln.new} = reinterpret_view({ln.old}, {layout_args(ln.layout)}, 0){drop}  # {why}")
            case ReinterpretView():
                # reinterpret_view takes the offset from the base's own: known now where coil
                # allocated the base (0, or the view's), read at run time otherwise (base_offset)
                delta = py_size(norm(ln.layout.offset - static_offset.get(ln.base, 0) if ln.base_offset is None
                                     else ln.delta()))
                if ln.base_offset is None:
                    static_offset[ln.name] = ln.layout.offset
                if ln.as_base:  # the base's tensor (wrap.views_as_base)
                    out.append(f"    {ln.name} = {ln.base}  # as its base")
                elif ln.as_view:  # as_strided: the caller gets a view of its base, as eager's (wrap.returned_views)
                    out.append(f"    {ln.name} = reinterpret_tensor({ln.base}, {layout_args(ln.layout)}, "
                               f"{ln.base}.storage_offset() + {delta})")
                else:
                    out.append(f"    {ln.name} = reinterpret_view({ln.base}, {layout_args(ln.layout)}, {delta})")
            case KernelCall():
                calls = backend.call(ln, program, options)
                n = program.spec(ln.kernel).group[0]
                if not gt(n, 0):  # data-dependent rows (u0), maybe none: then nothing is launched
                    calls = [f"if {py_size(n)} > 0:", *("    " + s for s in calls)]
                out += ["    " + s for s in calls]
            case ExternCall():
                args = [py_value(a) for a in ln.args] + [f"{k}={py_value(v)}" for k, v in ln.kwargs]
                out.append(f"    {ln.name} = {extern_symbol(ln.kernel)}({', '.join(args)})")
                if ln.name not in ensure_after:
                    out += _ensure_layout(program, ln.name, indexed)
            case MultiOutputLine():
                out.append(f"    {ln.name} = {ln.extern}{''.join(f'[{i!r}]' for i in ln.index)}")
                if ln.name not in ensure_after:
                    out += _ensure_layout(program, ln.name, indexed)
            case Free():
                if ln.kind is FreeKind.BUFFER and options.sanitize and owns_storage(program, ln.name) \
                        and ln.name not in borrowed:
                    out.append(f"    poison({ln.name}); del {ln.name}")
                else:
                    out.append(f"    del {ln.name}")
            case Return():
                sizes = program.sizes
                names = [n if n is not None else py_size(v) if (v := sizes.output(i)) is not None else "None"
                         for i, n in enumerate(ln.names)]
                out.append(f"    return ({', '.join(names)}{',' if len(names) == 1 else ''})")
    return out


def extern_symbol(kernel: str) -> str:
    """The module-level name output_code.py calls an extern by ("aten.mm.default":
    aten_mm_default), bound once to the operator (runtime.aten_op)."""
    return re.sub(r"\W", "_", kernel)


def extern_bindings(program: WrapperProgram) -> list[str]:
    kernels = sorted({ln.kernel for ln in program.lines if isinstance(ln, ExternCall)})
    return [f"{extern_symbol(k)} = aten_op(torch.ops.{k})" for k in kernels]


def render_main(program: WrapperProgram) -> list[str]:
    bg = program.buffer_graph
    lines = [
        "",
        "def get_args():",
        "    from coil.backends.runtime import rand_strided",
        "    return [",
    ]
    hint = bg.sizes.shapes.hint
    by_name = {i.name: i for i in bg.inputs}
    size_in = dict(bg.sizes.inputs)
    for name in program.inputs:  # the call's arguments, sizes at the hints
        if name in size_in:
            lines.append(f"        {hint(size_in[name])},")
            continue
        if name not in by_name:  # an input the graph passes on untouched (a nested int)
            lines.append("        None,")
            continue
        lay = by_name[name].layout
        at = Layout(bg.sizes.shapes.hints(lay.size), bg.sizes.shapes.hints(lay.stride), lay.dtype, lay.device,
                    hint(lay.offset))
        lines.append(f"        rand_strided({layout_args(at)}, dtype={lay.dtype}, device={lay.device!r}, offset={at.offset}),")
    lines += [
        "    ]",
        "",
        "",
        "def benchmark_compiled_module(times=10, repeat=10):",
        "    from coil.backends.runtime import benchmark",
        "    return benchmark(lambda: call(get_args()), times=times, repeat=repeat)",
        "",
        "",
        'if __name__ == "__main__":',
        "    print(f'{benchmark_compiled_module() * 1e3:.3f} ms per call')",
    ]
    return lines


def render_module(program: WrapperProgram, backend: KernelBackend, kernels: tuple[KernelSource, ...],
                  options: Options) -> str:
    head = [
        f"# output_code.py written by coil (target={options.target})",
        "import torch",
        "from coil.backends.runtime import aten_op, empty_strided, empty_strided_cpu, empty_strided_cuda, ensure_dtype, ensure_layout, poison, reinterpret_tensor, reinterpret_view",
        "",
    ]
    head += backend.header(options)
    body = backend.definitions(kernels, options, program)
    bindings = extern_bindings(program)
    if bindings:
        body += ["", "# the externs, called through their operators", *bindings]
    subgraphs = subgraph_bindings(program)
    if subgraphs:
        body += ["", "# the higher-order ops' subgraphs", *subgraphs]
    return "\n".join(head + [""] + body + [""] + render_call(program, backend, options) + render_main(program)) + "\n"
