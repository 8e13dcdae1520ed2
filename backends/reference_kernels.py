"""The `reference` target: each kernel is a Python function that evaluates its
nodes' bodies with torch ops, whole tensors at a time, and stores only the buffers
that are not kept in registers (those live in local temporaries)."""

from __future__ import annotations

from typing import Sequence

import sympy

from coil.backends.common import IndexPrinter
from coil.backends.wrapper import layout_args, sizes_text
from coil.ir.shapes import py_size
from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import Cast, Check, Constant, IndexExpr, IndirectLoad, Load, Op, evaluate, indsym, rsyms, xsyms
from coil.ir.fused import FusedKernel
from coil.ir.layout import Layout
from coil.ir.module import KernelSource, SourceLanguage
from coil.ir.wrapper import KernelCall, WrapperProgram
from coil.options import Options
from coil.options import Options
from coil.passes.kernel_model import kernel_buffers, kernel_layouts

pyindex = IndexPrinter()


class PythonHandler:
    """Emits one line of torch code per distinct subtree."""

    def __init__(self, ptr: dict[str, str], layouts: dict[str, Layout]) -> None:
        self.ptr = ptr
        self.layouts = layouts
        self.lines: list[str] = []

    def _emit(self, rhs: str) -> str:
        name = f"tmp{len(self.lines)}"
        self.lines.append(f"{name} = {rhs}")
        return name

    def load(self, node: Load, mask: str | None) -> str:
        lay = self.layouts[node.name]
        off = pyindex(lay.offset_of(node.index))
        return self._emit(f"_rt.load({self.ptr[node.name]}, {py_size(lay.storage_size())}, {py_size(lay.offset)}, {off}, {mask})")

    def indirect_load(self, node: IndirectLoad, values: tuple[str, ...], mask: str | None) -> str:
        lay = self.layouts[node.name]
        bind = {indsym(k): sympy.Symbol(v, integer=True) for k, v in enumerate(values)}  # positions (Checks)
        off = pyindex(lay.offset_of(node.index).xreplace(bind))
        return self._emit(f"_rt.load({self.ptr[node.name]}, {py_size(lay.storage_size())}, {py_size(lay.offset)}, {off}, {mask})")

    def constant(self, node: Constant) -> str:
        v = node.value
        lit = f"float({str(v)!r})" if isinstance(v, float) and (v != v or abs(v) == float("inf")) else repr(v)
        return self._emit(f"_rt.const({lit}, {node.dtype}, _dev)")

    def index_expr(self, node: IndexExpr) -> str:
        return self._emit(f"_rt.index({pyindex(node.expr)}, {node.dtype}, _dev)")

    def op(self, node: Op, args: tuple[str, ...]) -> str:
        return self._emit(f"_rt.op({node.name!r}, {node.dtype}, {', '.join(args)})")

    def cast(self, node: Cast, arg: str) -> str:
        return self._emit(f"{arg}.to({node.dtype})")

    def check(self, node: Check, arg: str) -> str:
        if not node.checked and not node.may_be_negative:
            return arg if node.kind == "divisor" else self._emit(f"{arg}.to(torch.int64)")
        return self._emit(f"_rt.run_check({arg}, {node.error!r}, {node.size}, {node.dim}, {node.wrap}, {node.checked})")


_INIT = {"sum": 0, "prod": 1, "any": False, "all": True, "welford_m2": float("nan"), "max": None, "min": None,
         "argmax": None, "argmin": None}


def kernel_source(k: FusedKernel, program: WrapperProgram) -> KernelSource:
    g = program.schedule_graph
    params = program.spec(k.name).params
    ptr = {p.name: p.arg for p in params}
    layouts = kernel_layouts(g)
    lines = [f"def {k.name}({', '.join([p.arg for p in params] + list(program.spec(k.name).symbols))}):"]
    first = next((p.arg for p in params), None)
    lines.append(f"    _dev = {first}.device" if first else "    _dev = torch.device('cpu')")
    for b in kernel_buffers(k, g):
        lines += ["    " + ln for ln in _node_lines(b, ptr, layouts)]
        if b.name not in ptr:  # kept in registers: a local temporary
            ptr[b.name] = b.name
    return KernelSource(k.name, "\n".join(lines), SourceLanguage.PYTHON)


def _node_lines(b: ComputedBuffer, ptr: dict[str, str], layouts: dict[str, Layout]) -> list[str]:
    shape = (*b.ranges, *b.reduction_ranges)
    out = [f"# {b.name}: {b.reduction_type or 'pointwise'} from {', '.join(b.origins)}"]
    for i, s in enumerate((*xsyms(len(b.ranges)), *rsyms(len(b.reduction_ranges)))):
        out.append(f"{s} = _rt.iota({py_size(shape[i])}, {i}, {len(shape)}, _dev)")
    h = PythonHandler(ptr, layouts)
    result = evaluate(b.body, h)
    out += [ln.replace("tmp", f"{b.name}_t") for ln in h.lines]
    res = result.replace("tmp", f"{b.name}_t")
    init = _INIT.get(b.reduction_type or "sum")
    init_lit = "float('nan')" if init != init else repr(init)
    out.append(f"{b.name}_v = _rt.finish({res}, {sizes_text(shape)}, {b.reduction_type!r}, {len(b.reduction_ranges)}, "
               f"{init_lit})")
    if b.name in ptr:
        out.append(f"_rt.store({ptr[b.name]}, {b.name}_v)")
    else:
        lay = b.layout
        out.append(f"{b.name} = torch.empty_strided({layout_args(lay)}, dtype={lay.dtype}, device=_dev)")
        out.append(f"_rt.store({b.name}, {b.name}_v)")
    return out


class ReferenceBackend:
    language = "python"

    def header(self, options: Options) -> list[str]:
        return ["from coil.backends import reference_rt as _rt"]

    def kernels(self, program: WrapperProgram, options: Options) -> tuple[KernelSource, ...]:
        return tuple(kernel_source(k, program) for k in program.kernels)

    def definitions(self, kernels: Sequence[KernelSource], options: Options,
                    program: WrapperProgram) -> list[str]:
        out: list[str] = []
        for k in kernels:
            out += ["", k.source, ""]
        return out

    def call(self, line: KernelCall, program: WrapperProgram, options: Options) -> list[str]:
        return [f"{line.kernel}({', '.join(line.args + line.sizes)})"]


