"""TritonHandler: the OpsHandler that turns a loop body into Triton source lines.

Each distinct subtree becomes one `tmpN = ...` line (the memo passed to `evaluate`
is the CSE table).  A value's Triton dtype always equals its IR dtype: constants are
typed (`tl.full`), ops whose Triton result type could differ are cast, and torch's
semantics are spelled out where Triton's differ (integer floor division and
remainder, NaN-propagating maximum, bool arithmetic, half-to-even rounding).

Loads of a buffer written earlier in the same kernel come from `registers` (fuse
guarantees the positions match); every other load reads memory at the offset and
under the tails the spec's Read gives it (KernelSpec.reads), from the tensor the
wrapper passes (which already points at the layout's offset).  An indirect load's
offset names its values (int64 positions, from their Checks) by indsym(k).

A Check that runs becomes `tl.device_assert` (lanes past the tails excluded) and
then a clamp, so no lane reads outside its buffer even where asserts are compiled
out; a divisor check only where the spec asserts divisors (KernelSpec.asserts:
not on CUDA, where eager does not check integer division either).  On CUDA the
kernel must be compiled with debug on for the assert to exist (codegen.py launches
such kernels with `debug=True, sanitize_overflow=False`).  Under the interpreter
(CPU tensors) codegen.interpreter_checks turns the asserts on and makes a failed
one eager's error, divisors included.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import sympy
import torch

from coil.backends.common import IndexPrinter
from coil.errors import CoilError
from coil.ir.expr import Cast, Check, Constant, Expr, IndexExpr, IndirectLoad, Load, Op, indsym
from coil.ir.indexing import simplify_index
from coil.ir.kernel import RINDEX, XINDEX, YINDEX, Read, tails_of
from coil.ir.shapes import is_size_symbol
from coil.passes.schedule.loads import value_symbols

TL_DTYPES: dict[torch.dtype, str] = {
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.int8: "tl.int8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.uint8: "tl.uint8",
    torch.bool: "tl.int1",
}


def tl_dtype(dt: torch.dtype) -> str:
    if dt not in TL_DTYPES:
        raise CoilError(f"triton target: no Triton type for {dt}")
    return TL_DTYPES[dt]


def literal(value: bool | int | float) -> str:
    """A Python literal Triton's frontend accepts (inf and nan spelled as calls)."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return repr(int(value))


def _symbol(s: sympy.Symbol) -> str:
    if s in (XINDEX, RINDEX, YINDEX) or is_size_symbol(s):  # a size symbol is a kernel argument
        return s.name
    raise CoilError(f"triton target: loop symbol {s} left in a kernel index")


print_index = IndexPrinter("//", "%", _symbol, "tl.maximum", "tl.minimum", truncating=True)  # Triton's // and % truncate


def tail_mask(tails: str) -> str | None:
    """The mask of the tails (ir/kernel.py: tails_of): ymask, yxmask, xmask,
    xrmask, rmask."""
    return f"{tails}mask" if tails else None


def _with_mask(tail: str | None, mask: str | None) -> str | None:
    """A load's lanes: those in range of the block (`tail`) where its own mask holds."""
    if mask is None or tail is None:
        return mask or tail
    return f"{tail} & {mask}"


class Emitter:
    """Lines of one kernel, with fresh temporary names."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 1
        self._count = 0

    def name(self, prefix: str = "tmp") -> str:
        n = f"{prefix}{self._count}"
        self._count += 1
        return n

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def assign(self, rhs: str, prefix: str = "tmp") -> str:
        n = self.name(prefix)
        self.emit(f"{n} = {rhs}")
        return n


class TritonHandler:
    """Evaluates kernel-coordinate bodies (loop symbols already replaced by
    expressions of xindex / rindex) to Triton variables."""

    def __init__(self, out: Emitter, ptr: Mapping[str, str], reads: Mapping[Expr, Read],
                 registers: Mapping[str, str], ranges: Mapping[sympy.Symbol, int], divisors: bool = False) -> None:
        self.out = out
        self.ptr = ptr
        self.reads = reads
        self.registers = registers
        self.ranges = ranges
        self.divisors = divisors  # divisor checks are asserted (the spec's asserts: not on CUDA)

    # ---- leaves -------------------------------------------------------------------------

    def load(self, node: Load, mask: str | None) -> str:
        if node.name in self.registers:
            reg = self.registers[node.name]
            return reg if mask is None else self.out.assign(f"tl.where({mask}, {reg}, 0)")
        if node not in self.reads:
            raise CoilError(f"triton target: {node.name} is neither a kernel argument nor computed in the kernel")
        rd = self.reads[node]
        where = f"{self.ptr[node.name]} + {print_index(rd.offset)}"
        lanes = _with_mask(tail_mask(rd.tails), mask)
        if lanes is None:
            # a one-element block, never a scalar: scalars of int1 do not broadcast
            # in the interpreter, and blocks keep every value's rank the same
            return self.out.assign(f"tl.load({where} + tl.zeros([1], tl.int32))")
        if not sympy.sympify(rd.offset).free_symbols:
            # one element (an expanded input's) read under a mask: the pointer takes the
            # mask's shape, as Triton loads no scalar pointer through a block mask
            where += f" + tl.zeros_like({lanes}).to(tl.int32)"
        return self.out.assign(f"tl.load({where}, {lanes}, other=0)")

    def indirect_load(self, node: IndirectLoad, values: tuple[str, ...], mask: str | None) -> str:
        if node not in self.reads:
            raise CoilError(f"triton target: {node.name} is read indirectly but is not a kernel argument")
        bind = {indsym(k): sympy.Symbol(v, integer=True, nonnegative=True) for k, v in enumerate(values)}
        rd = self.reads[node]
        names = {s.name for s in bind.values()}
        printer = IndexPrinter("//", "%", lambda s: s.name if s.name in names else _symbol(s), truncating=True)
        tail = tail_mask(rd.tails)
        at = rd.offset.xreplace(bind)
        # a value the offset does not use (a stride-0 dim) still gives the pointer its shape
        shape = "".join(f" + 0 * {v}" for v in bind.values() if v not in at.free_symbols)
        where = f"{self.ptr[node.name]} + {printer(at)}{shape}"
        lanes = _with_mask(tail, mask)
        if lanes is None:
            return self.out.assign(f"tl.load({where})")
        return self.out.assign(f"tl.load({where}, {lanes}, other=0)")

    def check(self, node: Check, arg: str) -> str:
        """An index as an int64 position (wrapped, asserted, clamped); a divisor
        asserted nonzero and replaced by 1 where it is 0 (CPU only)."""
        if node.kind == "divisor":
            if not node.checked or not self.divisors:
                return arg
            self._assert(f"{arg} != 0", node)
            return self.out.assign(f"tl.where({arg} == 0, {self.typed(1, node.dtype)}, {arg})")
        v = self.out.assign(f"{arg}.to(tl.int64)")
        if node.may_be_negative:
            v = self.out.assign(f"tl.where({v} < 0, {v} + {node.size}, {v})")
        if not node.checked:
            return v
        ok = self.out.assign(f"({v} >= 0) & ({v} < {node.size})")
        self._assert(ok, node)
        return self.out.assign(f"tl.where({ok}, {v}, 0)")

    def _assert(self, cond: str, node: Check) -> None:
        """tl.device_assert of `cond` on the lanes the checked value is defined on;
        the message names the check, for codegen.interpreter_checks to read."""
        mask = tail_mask(tails_of(value_symbols((node.arg,))))
        if mask is not None:
            cond = f"({cond}) | ({mask} == 0)"
        self.out.emit(f'tl.device_assert({cond}, "{check_message(node)}")')

    def constant(self, node: Constant) -> str:
        return self.typed(node.value, node.dtype)

    def index_expr(self, node: IndexExpr) -> str:
        e = simplify_index(node.expr, self.ranges)
        if not e.free_symbols:
            return self.out.assign(f"tl.full([1], {int(e)}, {tl_dtype(node.dtype)})")
        if all(is_size_symbol(s) for s in e.free_symbols):
            # a value of sizes alone is a block of one, as a constant is: Triton's interpreter
            # fails `|` of a scalar's bool and a block's (sdpa's scale, sym_float(s0) ** 0.5)
            return self.out.assign(f"tl.full([1], {print_index(e)}, {tl_dtype(node.dtype)})")
        return self.out.assign(f"({print_index(e)}).to({tl_dtype(node.dtype)})")

    def cast(self, node: Cast, arg: str) -> str:
        return self.out.assign(convert(arg, node.arg.dtype, node.dtype))

    # ---- ops ------------------------------------------------------------------------------

    def op(self, node: Op, args: tuple[str, ...]) -> str:
        fn = _OPS.get(node.name)
        if fn is None:
            raise CoilError(f"triton target: no lowering for op {node.name}")
        return fn(self, node, args)

    def typed(self, value: bool | int | float, dt: torch.dtype) -> str:
        if dt in (torch.float16, torch.bfloat16):
            value = float(torch.tensor(value, dtype=dt))  # round here: tl.full truncates bf16
        if dt == torch.bfloat16:  # exact; Triton 3.6's interpreter has no bf16 tl.full
            return self.out.assign(f"tl.full([1], {literal(value)}, tl.float32).to(tl.bfloat16)")
        return self.out.assign(f"tl.full([1], {literal(value)}, {tl_dtype(dt)})")


def check_message(node: Check) -> str:
    """The device assert's message for a failed check: what codegen's
    interpreter_checks parses back into eager's error."""
    return f"coil check: error={node.error} dim={node.dim} size={node.size}"


def truth(arg: str, src: torch.dtype | None) -> str:
    """Whether `arg` is nonzero.  A bfloat16 is compared as float32: the Triton
    interpreter compares a bfloat16 with a constant by its bits (-0.0 != 0 gave
    True there, and x < 0 False for every x); a GPU compares values, and the
    conversion is one instruction."""
    return f"{arg}.to(tl.float32) != 0" if src == torch.bfloat16 else f"{arg} != 0"


def convert(arg: str, src: torch.dtype, dst: torch.dtype) -> str:
    """`arg` of dtype src as dst, with torch's conversion rules."""
    if src == dst:
        return arg
    if dst == torch.bool:
        return truth(arg, src)
    if dst in (torch.float16, torch.bfloat16) and src != torch.float32:
        # as c10 does: through float (the interpreter converts other sources wrongly)
        arg = f"{arg}.to(tl.float32)"
    if dst == torch.bfloat16:
        return f"_coil_to_bf16({arg})"
    return f"{arg}.to({tl_dtype(dst)})"


# ---- op table -------------------------------------------------------------------------------
# Each entry: (handler, node, evaluated args) -> the result's variable name.

OpFn = Callable[["TritonHandler", Op, tuple[str, ...]], str]


def _same(h: TritonHandler, node: Op, args: tuple[str, ...]) -> list[str]:
    """Arguments cast to the result dtype (lowering promotes already; this keeps
    Triton's own promotion out of the picture if it ever did not)."""
    return [h.out.assign(convert(a, e.dtype, node.dtype)) if e.dtype != node.dtype else a
            for a, e in zip(args, node.args)]


def _binop(sym: str, bool_sym: str | None = None) -> OpFn:
    def fn(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
        a, b = _same(h, node, args)
        s = bool_sym if node.dtype == torch.bool and bool_sym else sym
        return h.out.assign(f"{a} {s} {b}")

    return fn


def _text(fmt: str) -> OpFn:
    """The op spelled from its arguments as they are (`fmt` of their names)."""

    def fn(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
        return h.out.assign(fmt.format(*args))

    return fn


def _unary_call(call: str, ints_identity: bool = False) -> OpFn:
    def fn(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
        (a,) = _same(h, node, args)
        if ints_identity and not node.dtype.is_floating_point:
            return a
        return h.out.assign(call.format(a=a))

    return fn


def _floordiv(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    a, b = _same(h, node, args)
    if node.dtype.is_floating_point:
        return h.out.assign(f"_coil_floordiv_float({a}, {b})")
    # Triton's // truncates (C); torch floors
    q = h.out.assign(f"{a} // {b}")
    return h.out.assign(f"tl.where(({a} % {b} != 0) & (({a} < 0) != ({b} < 0)), {q} - 1, {q})")


def _truncdiv(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    a, b = _same(h, node, args)
    if node.dtype.is_floating_point:
        # correctly rounded: an exact integer quotient must not come out just below it
        div = f"tl.div_rn({a}, {b})" if node.dtype == torch.float32 else f"{a} / {b}"
        q = h.out.assign(div)
        return h.out.assign(f"tl.where({q} < 0, tl.ceil({q}), tl.floor({q}))")
    return h.out.assign(f"{a} // {b}")


def _remainder(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    a, b = _same(h, node, args)
    r = h.out.assign(f"{a} % {b}")
    return h.out.assign(f"tl.where(({r} != 0) & (({r} < 0) != ({b} < 0)), {r} + {b}, {r})")


def _pow(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    a, b = _same(h, node, args)
    helper = "_coil_pow" if node.dtype.is_floating_point else "_coil_ipow"
    return h.out.assign(f"{helper}({a}, {b})")


def _minmax(greater: bool) -> OpFn:
    def fn(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
        a, b = _same(h, node, args)
        if node.dtype == torch.bool:
            return h.out.assign(f"{a} | {b}" if greater else f"{a} & {b}")
        if node.dtype.is_floating_point:
            cmp = ">" if greater else "<"
            return h.out.assign(f"tl.where(({a} {cmp} {b}) | ({a} != {a}), {a}, {b})")
        return h.out.assign(f"tl.{'maximum' if greater else 'minimum'}({a}, {b})")

    return fn


def _as_bool(h: TritonHandler, e: object, a: str) -> str:
    dtype = getattr(e, "dtype", None)
    return a if dtype == torch.bool else h.out.assign(truth(a, dtype))


def _logical(sym: str) -> OpFn:
    def fn(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
        a, b = (_as_bool(h, e, x) for e, x in zip(node.args, args))
        return h.out.assign(f"{a} {sym} {b}")

    return fn


def _bitwise_not(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    (a,) = _same(h, node, args)
    return h.out.assign(f"{a} == 0" if node.dtype == torch.bool else f"~{a}")


def _abs(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    (a,) = _same(h, node, args)
    return a if node.dtype == torch.bool else h.out.assign(f"tl.abs({a})")


def _reciprocal(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    (a,) = _same(h, node, args)
    return h.out.assign(f"{h.typed(1.0, node.dtype)} / {a}")


def _relu(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    (a,) = _same(h, node, args)
    if node.dtype == torch.bool:
        return a
    # where, not maximum: relu(nan) is nan
    return h.out.assign(f"tl.where({a} < 0, {h.typed(0, node.dtype)}, {a})")


def _sign(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    (a,) = _same(h, node, args)
    if node.dtype == torch.bool:
        return a
    zero, dt = h.typed(0, node.dtype), tl_dtype(node.dtype)
    return h.out.assign(f"({zero} < {a}).to({dt}) - ({a} < {zero}).to({dt})")


def _trunc(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    (a,) = _same(h, node, args)
    if not node.dtype.is_floating_point:
        return a
    return h.out.assign(f"tl.where({a} < 0, tl.ceil({a}), tl.floor({a}))")


def _round(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    (a,) = _same(h, node, args)
    return a if not node.dtype.is_floating_point else h.out.assign(f"_coil_round({a})")


def _isinf(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    a = args[0]
    if not node.args[0].dtype.is_floating_point:
        return h.out.assign(f"{a} != {a}")  # an all-false mask of a's shape
    return h.out.assign(f"tl.abs({a}) == float(\"inf\")")


def _where(h: TritonHandler, node: Op, args: tuple[str, ...]) -> str:
    c = _as_bool(h, node.args[0], args[0])
    a, b = (convert(x, e.dtype, node.dtype) for x, e in zip(args[1:], node.args[1:]))
    return h.out.assign(f"tl.where({c}, {a}, {b})")


_OPS: dict[str, OpFn] = {
    "add": _binop("+", "|"),
    "sub": _binop("-"),
    "mul": _binop("*", "&"),
    "truediv": _binop("/"),
    "floordiv": _floordiv,
    "truncdiv": _truncdiv,
    "fmod": _binop("%"),  # C remainder for ints, fmod for floats
    "remainder": _remainder,
    "pow": _pow,
    "maximum": _minmax(True),
    "minimum": _minmax(False),
    "eq": _text("{0} == {1}"),
    "ne": _text("{0} != {1}"),
    "lt": _text("{0} < {1}"),
    "le": _text("{0} <= {1}"),
    "gt": _text("{0} > {1}"),
    "ge": _text("{0} >= {1}"),
    "logical_and": _logical("&"),
    "logical_or": _logical("|"),
    "logical_xor": _logical("^"),
    "bitwise_and": _binop("&"),
    "bitwise_or": _binop("|"),
    "bitwise_xor": _binop("^"),
    "logical_not": _text("{0} == 0"),
    "bitwise_not": _bitwise_not,
    "neg": _unary_call("-{a}"),
    "abs": _abs,
    "reciprocal": _reciprocal,
    "sqrt": _unary_call("tl.sqrt({a})"),
    "rsqrt": _unary_call("tl.rsqrt({a})"),
    "exp": _unary_call("tl.exp({a})"),
    "exp2": _unary_call("tl.exp2({a})"),
    "expm1": _unary_call("_coil_expm1({a})"),
    "log": _unary_call("tl.log({a})"),
    "log1p": _unary_call("_coil_log1p({a})"),
    "log2": _unary_call("tl.log2({a})"),
    "sin": _unary_call("tl.sin({a})"),
    "cos": _unary_call("tl.cos({a})"),
    "tan": _unary_call("tl.sin({a}) / tl.cos({a})"),
    "tanh": _unary_call("_coil_tanh({a})"),
    "sigmoid": _unary_call("tl.sigmoid({a})"),
    "erf": _unary_call("tl.erf({a})"),
    "relu": _relu,
    "sign": _sign,
    "floor": _unary_call("tl.floor({a})", ints_identity=True),
    "ceil": _unary_call("tl.ceil({a})", ints_identity=True),
    "round": _round,
    "trunc": _trunc,
    "isnan": _text("{0} != {0}"),  # never true for ints and bools
    "isinf": _isinf,
    "where": _where,
}
