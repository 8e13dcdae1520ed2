"""CppHandler: one C++ statement per distinct subtree of a body.

The handler works in one *scope* of a kernel (the body of one loop, or the code
that runs once per xindex).  Bodies reach it already rewritten into the kernel's
loop variables (`ix0, ir0, ...`), so equal subtrees of different nodes are equal
values and one memo gives CSE across every node of the scope.

A load of a buffer the kernel itself writes never touches memory: fuse
guarantees it reads the element the producer computes at the same position, so
the value comes from a register (a reduction's or outer node's result) or from
evaluating the producer's body right here (an inner node).
"""

from __future__ import annotations

import itertools
from typing import Any
import math
from collections.abc import Mapping

import attrs
import sympy
import torch

from coil.backends.common import IndexPrinter
from coil.backends.cpp import prelude
from coil.errors import CoilError
from coil.passes.schedule.nest import loop_index
from coil.ir.expr import (
    CHECK_ERROR_CODES,
    Cast,
    Check,
    Constant,
    Expr,
    IndexExpr,
    IndirectLoad,
    Load,
    Op,
    evaluate,
    indsym,
    zero,
)
from coil.ir.indexing import simplify_index
from coil.ir.layout import Layout

# max / min of sizes: the prelude's (it includes no <algorithm>)
cpp_index = IndexPrinter(floordiv="/", mod="%", maximum="coil_max<int64_t>", minimum="coil_min<int64_t>",
                         truncating=True)


def _sz(size: Any) -> str:
    """A check's size: a literal, or a parenthesized expression of size arguments."""
    return str(size) if isinstance(size, int) else f"({cpp_index(size)})"


@attrs.define
class KernelContext:
    """What every scope of one kernel shares."""

    ptrs: Mapping[str, str]  # buffer name -> parameter (in_ptr0, out_ptr0, ...)
    layouts: Mapping[str, Layout]
    ranges: Mapping[sympy.Symbol, int]  # loop variable -> trip count
    names: itertools.count[int] = attrs.field(factory=itertools.count)
    # (buffer, printed offset) -> element of a staged tile that holds it (tiled kernels)
    staged: dict[tuple[str, str], str] = attrs.field(factory=dict)

    def fresh(self, prefix: str = "tmp") -> str:
        return f"{prefix}{next(self.names)}"

    def offset(self, name: str, index: tuple[sympy.Expr, ...]) -> str:
        """C++ element offset of a logical index, relative to the tensor's data_ptr()
        (which already includes the layout's storage offset)."""
        lay = self.layouts[name]
        return cpp_index(loop_index(lay.offset_of(index) - lay.offset, dict(self.ranges)))


@attrs.frozen
class InnerValue:
    """An inner producer: recomputed from its body wherever a scope needs it."""

    body: Expr
    dtype: torch.dtype  # the buffer's dtype: what a load of it would give


def register_value(value: str, body: Expr | torch.dtype, buffer_dtype: torch.dtype) -> str:
    """A computed value (of `body`, or of a value of that dtype) as a load of the
    stored buffer would give it back: half types are rounded, unless the body
    ends in the Cast that already rounded it."""
    if isinstance(body, torch.dtype):
        dtype, rounded = body, False
    else:
        dtype, rounded = body.dtype, isinstance(body, Cast)
    if dtype == buffer_dtype and (buffer_dtype not in prelude.HALF_TYPES or rounded):
        return value
    return prelude.round_value(buffer_dtype, value)


def float_literal(value: float, dtype: torch.dtype) -> str:
    ctype = prelude.compute_type(dtype)
    if math.isnan(value):
        return f"{ctype}(__builtin_nan(\"\"))"
    if math.isinf(value):
        return f"{'-' if value < 0 else ''}{ctype}(__builtin_inf())"
    if dtype == torch.float64:
        return repr(float(value))
    # the value a tensor of `dtype` holds (half constants are rounded), as a float literal
    rounded = float(torch.tensor(float(value), dtype=dtype).item())
    return f"{rounded!r}f" if math.isfinite(rounded) else float_literal(rounded, torch.float32)


def int_literal(value: int, dtype: torch.dtype) -> str:
    ctype = prelude.compute_type(dtype)
    if value == -(2**63):
        return "INT64_MIN"
    return f"static_cast<{ctype}>({int(value)}LL)"


@attrs.frozen
class LoopCheck:
    """A run-time check made inside an `omp simd` loop without a branch.

    coil_check_index fails through a call on its cold path, and a loop with a call
    in it does not vectorise: T5's softmax, whose position bias gathers from a table
    at a checked bucket every element, took 300 us a row block instead of 105.  In
    a vector loop the check is instead a reduction: the smallest and largest index
    seen (`lo`, `hi`; a divisor check: `hi` is a flag that some divisor was 0), while
    the value used is the position where it is in range and 0 elsewhere, as a
    failed check gives.  After the loop `report` fails with the largest index out of
    range (else the smallest): a value eager would also reject, though eager names
    the first it meets."""

    kind: str  # "index" | "divisor"
    hi: str
    lo: str
    size: int
    wrap: bool
    code: int
    dim: int

    def declare(self) -> list[str]:
        if self.kind == "divisor":
            return [f"int {self.hi} = 0;"]
        return [f"int64_t {self.hi} = INT64_MIN;", f"int64_t {self.lo} = INT64_MAX;"]

    def clause(self) -> str:
        if self.kind == "divisor":
            return f"reduction(|:{self.hi})"
        return f"reduction(max:{self.hi}) reduction(min:{self.lo})"

    def report(self) -> list[str]:
        if self.kind == "divisor":
            return [f"if ({self.hi}) coil_fail({self.code}, 0, 0, 0);"]
        size = _sz(self.size)
        lowest = (-self.size if isinstance(self.size, int) else f"-{size}") if self.wrap else 0
        return [f"if ({self.hi} >= {size}) coil_fail({self.code}, {self.hi}, {size}, {self.dim});",
                f"else if ({self.lo} < {lowest}) coil_fail({self.code}, {self.lo}, {size}, {self.dim});"]


class CppHandler:
    """Emits `const T tmpN = ...;` lines into `lines`; returns the C++ expression
    naming each value.  With `loop_checks` a list, the scope is the body of an
    `omp simd` loop and its run-time checks are made as reductions (LoopCheck)."""

    def __init__(self, ctx: KernelContext, registers: dict[str, str], inner: Mapping[str, InnerValue],
                 lines: list[str], loop_checks: list[LoopCheck] | None = None) -> None:
        self.ctx = ctx
        self.registers = registers
        self.inner = inner
        self.lines = lines
        self.memo: dict[Expr, str] = {}
        self.loop_checks = loop_checks

    def value(self, expr: Expr) -> str:
        return evaluate(expr, self, self.memo)

    def emit(self, dtype: torch.dtype, rhs: str) -> str:
        name = self.ctx.fresh()
        self.lines.append(f"const {prelude.compute_type(dtype)} {name} = {rhs};")
        return name

    # ---- leaves ----------------------------------------------------------------------------

    def load(self, node: Load, mask: str | None) -> str:
        if node.name in self.registers or node.name in self.inner:
            return self.masked(node.dtype, mask, self.computed(node.name))
        if node.name not in self.ctx.ptrs:
            raise CoilError(f"kernel reads {node.name}, which is neither a parameter nor computed in it",
                            stage="kernel_gen")
        lay = self.ctx.layouts[node.name]
        offset = self.ctx.offset(node.name, node.index)
        ref = self.ctx.staged.get((node.name, offset), f"{self.ctx.ptrs[node.name]}[{offset}]")
        return self.emit(node.dtype, self.masked(node.dtype, mask, prelude.load_value(lay.dtype, ref)))

    def computed(self, name: str) -> str:
        """The value of a buffer this kernel computes, at the scope's position."""
        if name in self.registers:
            return self.registers[name]
        producer = self.inner[name]
        raw = self.value(producer.body)
        v = register_value(raw, producer.body, producer.dtype)
        if v != raw:
            v = self.emit(producer.dtype, v)
        self.registers[name] = v
        return v

    def masked(self, dtype: torch.dtype, mask: str | None, value: str) -> str:
        """`value` where `mask` holds, else 0; C++'s ?: evaluates only the arm it
        takes, so a masked read touches no memory where its mask is false (and
        GCC's vectoriser turns it into a masked vector load)."""
        if mask is None:
            return value
        return f"({mask} ? {value} : {self.constant(zero(dtype))})"

    def indirect_load(self, node: IndirectLoad, values: tuple[str, ...], mask: str | None) -> str:
        """`ptr[offset]` where the offset uses the values: positions, from their Checks."""
        if node.name not in self.ctx.ptrs:
            raise CoilError(f"kernel reads {node.name} indirectly, but it is not a parameter", stage="kernel_gen")
        bind = {indsym(k): sympy.Symbol(v, integer=True, nonnegative=True) for k, v in enumerate(values)}
        lay = self.ctx.layouts[node.name]
        offset = cpp_index(simplify_index(lay.offset_of(node.index) - lay.offset, self.ctx.ranges).xreplace(bind))
        value = prelude.load_value(lay.dtype, f"{self.ctx.ptrs[node.name]}[{offset}]")
        return self.emit(node.dtype, self.masked(node.dtype, mask, value))

    def check(self, node: Check, arg: str) -> str:
        """A checked value goes through coil_check_index / coil_check_divisor (the
        prelude's error channel); a proven one is only converted (and wrapped)."""
        code = CHECK_ERROR_CODES[node.error]
        if node.checked and self.loop_checks is not None:
            return self.loop_check(node, arg, code)
        if node.kind == "divisor":
            if not node.checked:
                return arg
            return self.emit(node.dtype, f"coil_check_divisor<{prelude.compute_type(node.dtype)}>({arg}, {code})")
        v = f"static_cast<int64_t>({arg})"
        if node.checked:
            wrap = "true" if node.wrap else "false"
            return self.emit(torch.int64, f"coil_check_index({v}, {_sz(node.size)}, {wrap}, {code}, {node.dim})")
        if node.may_be_negative:
            v = self.emit(torch.int64, v)
            return self.emit(torch.int64, f"({v} < 0 ? {v} + {_sz(node.size)} : {v})")
        return self.emit(torch.int64, v)

    def loop_check(self, node: Check, arg: str, code: int) -> str:
        assert self.loop_checks is not None
        hi, lo = self.ctx.fresh("chk"), self.ctx.fresh("chk")
        self.loop_checks.append(LoopCheck(node.kind, hi, lo, node.size, node.wrap, code, node.dim))
        if node.kind == "divisor":
            T = prelude.compute_type(node.dtype)
            self.lines.append(f"{hi} |= ({arg} == 0);")
            return self.emit(node.dtype, f"({arg} == 0 ? {T}(1) : {arg})")
        v = self.emit(torch.int64, f"static_cast<int64_t>({arg})")
        self.lines.append(f"{hi} = {v} > {hi} ? {v} : {hi}; {lo} = {v} < {lo} ? {v} : {lo};")
        if node.wrap:
            v = self.emit(torch.int64, f"({v} < 0 ? {v} + {_sz(node.size)} : {v})")
        bound = f"{node.size}ULL" if isinstance(node.size, int) else f"static_cast<uint64_t>({_sz(node.size)})"
        return self.emit(torch.int64, f"(static_cast<uint64_t>({v}) < {bound} ? {v} : INT64_C(0))")

    def constant(self, node: Constant) -> str:
        v = node.value
        if node.dtype == torch.bool:
            return "true" if v else "false"
        if node.dtype.is_floating_point:
            return float_literal(float(v), node.dtype)
        return int_literal(int(v), node.dtype)

    def index_expr(self, node: IndexExpr) -> str:
        idx = cpp_index(loop_index(node.expr, dict(self.ctx.ranges)))
        return self.emit(node.dtype, f"static_cast<{prelude.compute_type(node.dtype)}>({idx})")

    # ---- inner nodes -----------------------------------------------------------------------

    def op(self, node: Op, args: tuple[str, ...]) -> str:
        return self.emit(node.dtype, op_expr(node, args))

    def cast(self, node: Cast, arg: str) -> str:
        return self.emit(node.dtype, cast_expr(node.arg.dtype, node.dtype, arg))


def cast_expr(src: torch.dtype, dst: torch.dtype, a: str) -> str:
    if dst == torch.bool:
        return f"({a} != 0)"
    if dst in prelude.HALF_TYPES:
        return a if src == dst else prelude.round_value(dst, f"static_cast<float>({a})")
    return f"static_cast<{prelude.compute_type(dst)}>({a})"


_UNARY_FP = {
    "sqrt": "coil_sqrt({a})", "exp": "coil_exp({a})", "exp2": "coil_exp2({a})", "expm1": "coil_expm1({a})",
    "log": "coil_log({a})", "log1p": "coil_log1p({a})", "log2": "coil_log2({a})", "sin": "coil_sin({a})",
    "cos": "coil_cos({a})", "tan": "coil_tan({a})", "tanh": "coil_tanh({a})", "erf": "coil_erf({a})",
    "floor": "coil_floor({a})", "ceil": "coil_ceil({a})", "trunc": "coil_trunc({a})",
    "round": "coil_nearbyint({a})", "abs": "coil_fabs({a})",
    "rsqrt": "({T}(1) / coil_sqrt({a}))", "reciprocal": "({T}(1) / {a})",
    "sigmoid": "({T}(1) / ({T}(1) + coil_exp(-{a})))",
}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}


def op_expr(node: Op, args: tuple[str, ...]) -> str:
    """The C++ expression for one Op, with torch's semantics for its dtypes."""
    name = node.name
    out = node.dtype
    T = prelude.compute_type(out)
    arg_dt = node.args[0].dtype
    fp = out.is_floating_point
    a = args[0]
    if len(args) == 1:
        return _unary(name, a, T, arg_dt, fp)
    if name == "where":
        return f"({a} ? {args[1]} : {args[2]})"
    return _binary(name, a, args[1], T, fp)


def _unary(name: str, a: str, T: str, arg_dt: torch.dtype, fp: bool) -> str:
    arg_fp = arg_dt.is_floating_point
    match name:
        case "neg":  # of a negative constant: `--1.0f` would be a decrement
            return f"(-({a}))" if a.startswith("-") else f"(-{a})"
        case "isnan":
            return f"({a} != {a})" if arg_fp else "false"
        case "isinf":
            ct = prelude.compute_type(arg_dt)
            return f"(coil_fabs({a}) == {ct}(__builtin_inf()))" if arg_fp else "false"
        case "logical_not":
            return f"({a} == 0)"
        case "bitwise_not":
            return f"(!{a})" if arg_dt == torch.bool else f"static_cast<{T}>(~{a})"
        case "relu":
            return a if arg_dt == torch.bool else f"({a} < 0 ? {T}(0) : {a})"
        case "sign":
            return a if arg_dt == torch.bool else f"static_cast<{T}>(({T}(0) < {a}) - ({a} < {T}(0)))"
        case "abs" if not fp:
            return a if arg_dt == torch.bool else f"static_cast<{T}>({a} < 0 ? -{a} : {a})"
        case "floor" | "ceil" | "trunc" | "round" if not arg_fp:
            return a
    if name in _UNARY_FP:
        src = a if arg_fp or not fp else f"static_cast<{T}>({a})"
        return _UNARY_FP[name].format(a=src, T=T)
    raise CoilError(f"cpp: no unary op {name}", stage="kernel_gen")


def _binary(name: str, a: str, b: str, T: str, fp: bool) -> str:
    if name in _COMPARE:
        return f"({a} {_COMPARE[name]} {b})"
    if name in _ARITH:
        return f"({a} {_ARITH[name]} {b})"
    if name in _BITWISE:
        return f"({a} {_BITWISE[name]} {b})"
    match name:
        # & and |, not && and ||: both are computed temporaries already, and a
        # short circuit is a branch that keeps GCC from vectorising the masked
        # loads such a condition guards (a pad's in-region test)
        case "logical_and":
            return f"(({a} != 0) & ({b} != 0))"
        case "logical_or":
            return f"(({a} != 0) | ({b} != 0))"
        case "logical_xor":
            return f"(({a} != 0) != ({b} != 0))"
        case "maximum":
            return f"coil_max<{T}>({a}, {b})"
        case "minimum":
            return f"coil_min<{T}>({a}, {b})"
        case "truediv":
            return f"(static_cast<{T}>({a}) / static_cast<{T}>({b}))" if fp else f"({a} / {b})"
    if fp:
        match name:
            case "floordiv":
                return f"coil_floordiv_fp<{T}>({a}, {b})"
            case "truncdiv":
                return f"coil_trunc(static_cast<{T}>({a}) / static_cast<{T}>({b}))"
            case "fmod":
                return f"coil_fmod(static_cast<{T}>({a}), static_cast<{T}>({b}))"
            case "remainder":
                return f"coil_remainder_fp<{T}>({a}, {b})"
            case "pow":
                return f"coil_pow(static_cast<{T}>({a}), static_cast<{T}>({b}))"
    else:
        match name:
            case "floordiv":
                return f"coil_floordiv_int<{T}>({a}, {b})"
            case "truncdiv":
                return f"coil_truncdiv_int<{T}>({a}, {b})"
            case "fmod":
                return f"coil_fmod_int<{T}>({a}, {b})"
            case "remainder":
                return f"coil_remainder_int<{T}>({a}, {b})"
            case "pow":
                return f"coil_ipow<{T}>({a}, {b})"
    raise CoilError(f"cpp: no binary op {name}", stage="kernel_gen")
