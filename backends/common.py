"""Pieces every kernel backend shares: printing sympy index expressions in a target
language, and the KernelBackend protocol kernel_gen dispatches on."""

from __future__ import annotations

import re
from typing import Callable, Protocol, Sequence

import sympy

from coil.ir.indexing import FloorDiv, ModularIndexing
from coil.ir.shapes import is_size_symbol
from coil.ir.module import KernelSource
from coil.ir.wrapper import KernelCall, WrapperProgram
from coil.options import Options


def repeated_kernels(kernels: Sequence[KernelSource], function: str, comment: str) -> dict[str, str]:
    """The kernel functions whose source repeats an earlier kernel's, comment lines
    and the functions' own names aside (each layer of a model normalises, projects
    and adds alike), each mapped to the earlier function in its place: a module
    defines one and names the others after it, so it is compiled once.  `function`:
    the pattern whose one group is a function a source defines; `comment`: what
    starts a comment line."""
    first: dict[str, tuple[str, ...]] = {}
    out: dict[str, str] = {}
    for k in kernels:
        names = tuple(re.findall(function, k.source, re.M))
        text = k.source
        for i, n in enumerate(names):
            text = re.sub(rf"\b{re.escape(n)}\b", f"_kernel{i}", text)
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(comment))
        earlier = first.setdefault(text, names)
        if earlier != names:
            out.update(zip(names, earlier))
    return out


def _one_group(text: str) -> bool:
    """Whether `text` is one parenthesized group, "(a / b)", not "(a)*(b)"."""
    if not text.startswith("("):
        return False
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i == len(text) - 1
    return False


def _floor_needed(a: sympy.Expr) -> bool:
    """Whether `a // b` or `a % b` must be printed with floor semantics where the
    target's / and % truncate: `a` is an expression of sizes alone (no loop
    variable) that sympy cannot show to be at least 0 (`-s0 % 128`, a length
    padded to a multiple: `s0 + (-s0 % 128)`).  An index over loop variables
    that may be negative is so only in lanes its mask turns off (the index
    rules keep every split remainder at least 0: ir/indexing.py), and keeps the
    plain operators."""
    return a.is_nonnegative is not True and bool(a.free_symbols) and all(is_size_symbol(s) for s in a.free_symbols)


class IndexPrinter:
    """Prints an index expression; `floordiv` and `mod` spell integer division and
    remainder in the target language (operands are nonnegative; with `truncating`,
    a numerator of sizes that may be negative gets the floor's meaning from them:
    _floor_needed)."""

    def __init__(self, floordiv: str = "//", mod: str = "%", symbol: Callable[[sympy.Symbol], str] | None = None,
                 maximum: str = "max", minimum: str = "min", truncating: bool = False) -> None:
        self.floordiv = floordiv
        self.mod = mod
        self.truncating = truncating  # the target's / and % round toward zero (C, Triton)
        self.maximum, self.minimum = maximum, minimum  # of sizes: max(1, u0), a stride of a size that may be 0
        self.symbol = symbol or (lambda s: s.name)

    def __call__(self, e: sympy.Expr) -> str:
        return self.p(sympy.sympify(e))

    def operand(self, e: sympy.Expr) -> str:
        """A divisor or modulus: a symbolic product in parentheses (a / (32*s0)),
        since / and % bind as tightly as *."""
        text = self.p(e)
        return text if e.is_Integer or e.is_Symbol or _one_group(text) else f"({text})"

    def p(self, e: sympy.Expr) -> str:
        if e.is_Integer:
            return str(int(e))
        if isinstance(e, sympy.Symbol):
            return self.symbol(e)
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=lambda a: (a.is_Integer, sympy.default_sort_key(a)))
            out = self.p(terms[0])
            for t in terms[1:]:
                c, rest = t.as_coeff_Mul()
                if c.is_Integer and int(c) < 0:
                    out += " - " + self.p(-t)
                else:
                    out += " + " + self.p(t)
            return "(" + out + ")"
        if isinstance(e, sympy.Mul):
            c, rest = e.as_coeff_Mul()
            factors = sympy.Mul.make_args(rest)
            parts = [self.p(f) for f in factors]
            if c != 1:
                parts.insert(0, self.p(c) if int(c) >= 0 else f"({int(c)})")
            return "*".join(parts)
        if isinstance(e, FloorDiv):
            a, b = e.args
            if self.truncating and _floor_needed(a):  # (a - a mod b) / b, exact
                return f"(({self.p(a)} - {self._floor_mod(self.p(a), self.operand(b))}) {self.floordiv} {self.operand(b)})"
            return f"({self.p(a)} {self.floordiv} {self.operand(b)})"
        if isinstance(e, ModularIndexing):
            a, b, c = e.args
            if self.truncating and _floor_needed(a):
                inner = self.p(a) if b == 1 else self.p(FloorDiv(a, b))
                return self._floor_mod(inner, self.operand(c))
            inner = self.p(a) if b == 1 else f"({self.p(a)} {self.floordiv} {self.operand(b)})"
            return f"({inner} {self.mod} {self.operand(c)})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            fn = self.maximum if isinstance(e, sympy.Max) else self.minimum
            out = self.p(e.args[0])
            for a in e.args[1:]:
                out = f"{fn}({out}, {self.p(a)})"
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + "*".join([self.p(e.base)] * int(e.exp)) + ")"
        raise ValueError(f"cannot print index {e}")

    def _floor_mod(self, a: str, m: str) -> str:
        """a mod m, at least 0 for a positive m, from a remainder that truncates."""
        return f"((({a} {self.mod} {m}) + {m}) {self.mod} {m})"


class KernelBackend(Protocol):
    """What kernel_gen needs from a target."""

    language: str

    def header(self, options: Options) -> list[str]:
        """Imports and set-up lines at the top of output_code.py."""
        ...

    def kernels(self, program: WrapperProgram, options: Options) -> tuple[KernelSource, ...]:
        """One source per fused kernel."""
        ...

    def definitions(self, kernels: Sequence[KernelSource], options: Options,
                    program: WrapperProgram) -> list[str]:
        """How the kernel sources appear in output_code.py."""
        ...

    def call(self, line: KernelCall, program: WrapperProgram, options: Options) -> list[str]:
        """The wrapper line(s) that launch one kernel."""
        ...

    # optional: prologue(program, options) -> list[str], lines at the top of `call`
    # (inside the device guard), and device_guard(program) -> str | None, a `with`
    # line around the rest of `call`
