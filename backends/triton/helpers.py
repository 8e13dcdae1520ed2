"""Triton device functions that generated kernels call, as source text.

They are emitted into output_code.py next to the kernels that use them (not
imported): a jit function's callees must be decorated under the same interpreter
setting as the kernel, and the file stays runnable on its own.  Each one is built
from `tl` core ops only (no libdevice: the interpreter has none, and both Triton
releases coil supports have these).

Kernels that run on a GPU get faster definitions of a few helpers under the same
names (`NATIVE`): the hardware's round-to-nearest-even conversion to bfloat16
(the interpreter truncates, hence the bit arithmetic of the portable one) and
libdevice's tanh, expm1 and log1p instead of the exp/log formulas, and
NaN-propagating row max / min that are one reduction each (`tl.reduce` with
max.NaN / min.NaN) instead of two.
"""

from __future__ import annotations

import re
from typing import Iterable

HELPERS: dict[str, str] = {
    "_coil_expm1": '''
@triton.jit
def _coil_expm1(x):
    # Kahan: (e^x - 1) * x / log(e^x) cancels the rounding error of e^x near 0
    u = tl.exp(x)
    um1 = u - 1.0
    r = tl.where(u == 1.0, x, um1 * x / tl.log(u))
    r = tl.where(um1 == -1.0, -1.0, r)
    return tl.where(u == float("inf"), u, r)
''',
    "_coil_log1p": '''
@triton.jit
def _coil_log1p(x):
    # Kahan: log(1 + x) * x / ((1 + x) - 1) cancels the rounding error of 1 + x
    u = x + 1.0
    r = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))
    return tl.where(u == float("inf"), u, r)
''',
    "_coil_tanh": '''
@triton.jit
def _coil_tanh(x):
    # tanh|x| = -expm1(-2|x|) / (2 + expm1(-2|x|)): no cancellation near 0
    e = _coil_expm1(-2.0 * tl.abs(x))
    t = -e / (2.0 + e)
    return tl.where(x < 0, -t, t)
''',
    "_coil_round": '''
@triton.jit
def _coil_round(x):
    # half to even, as torch.round; x - floor(x) is exact, x + 0.5 is not
    f = tl.floor(x)
    d = x - f
    r = tl.where(d > 0.5, f + 1.0, f)
    return tl.where((d == 0.5) & (f % 2.0 != 0.0), f + 1.0, r)
''',
    "_coil_floordiv_float": '''
@triton.jit
def _coil_floordiv_float(a, b):
    # torch's div_floor for floating types: exact through fmod, not floor(a / b)
    mod = a % b
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, 0.0 * (a / b), fl)
    return tl.where(b == 0, a / b, fl)
''',
    "_coil_pow": '''
@triton.jit
def _coil_pow(a, b):
    # |a| ** b through exp2/log2, then the sign or nan a negative base gives
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    # (a negative base to a fraction is nan, but -inf's is +inf or +0, as C's pow)
    r = tl.where(a < 0, tl.where(b_int | (a == float("-inf")), tl.where(odd, -r, r), float("nan")), r)
    return tl.where((b == 0) | (a == 1), 1.0, r)
''',
    "_coil_ipow": '''
@triton.jit
def _coil_ipow(a, b):
    # square and multiply over the exponent's bits; wraps like torch's integer pow
    result = tl.zeros_like(a) + 1
    base = a
    e = tl.where(b < 0, 0, b)
    for _ in tl.static_range(64):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    # negative exponents: 1 ** b = 1, (-1) ** b = +-1, anything else truncates to 0
    neg = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) != 0, -1, 1), 0))
    return tl.where(b < 0, neg, result).to(a.dtype)
''',
    "_coil_to_bf16": '''
@triton.jit
def _coil_to_bf16(x):
    # float32 -> bfloat16 rounding to nearest even by hand, as c10 does: the
    # interpreter's .to(tl.bfloat16) truncates
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    r = tl.where(x != x, float("nan"), bits.to(tl.float32, bitcast=True))
    return r.to(tl.bfloat16)
''',
    "_coil_prod_combine": '''
@triton.jit
def _coil_prod_combine(a, b):
    return a * b
''',
}

# NaN-aware row max / min: portably two tl reductions (the interpreter runs them far
# faster than tl.reduce with a combine function), natively one max.NaN / min.NaN reduce
for _fn, _elementwise in (("max", "maximum"), ("min", "minimum")):
    HELPERS[f"_coil_row_{_fn}_nan"] = f'''
@triton.jit
def _coil_row_{_fn}_nan(x):
    # {_fn} along axis 1, NaN where the row has one
    m = tl.{_fn}(x, 1)
    return tl.where(tl.max((x != x).to(tl.int8), 1) > 0, float("nan"), m)
'''
    HELPERS[f"_coil_{_fn}_nan_combine"] = f'''
@triton.jit
def _coil_{_fn}_nan_combine(a, b):
    return tl.{_elementwise}(a, b, propagate_nan=tl.PropagateNan.ALL)
'''

# GPU definitions (compiled Triton; libdevice is imported by output_code.py)
NATIVE: dict[str, str] = {
    "_coil_to_bf16": '''
@triton.jit
def _coil_to_bf16(x):
    return x.to(tl.bfloat16)  # cvt.rn: round to nearest even
''',
    "_coil_tanh": '''
@triton.jit
def _coil_tanh(x):
    return libdevice.tanh(x)
''',
    "_coil_expm1": '''
@triton.jit
def _coil_expm1(x):
    return libdevice.expm1(x)
''',
    "_coil_log1p": '''
@triton.jit
def _coil_log1p(x):
    return libdevice.log1p(x)
''',
}
for _fn in ("max", "min"):
    NATIVE[f"_coil_row_{_fn}_nan"] = f'''
@triton.jit
def _coil_row_{_fn}_nan(x):
    return tl.reduce(x, 1, _coil_{_fn}_nan_combine)  # one {_fn}.NaN per element
'''

# helpers that call other helpers (portable, native definitions)
_NEEDS = {"_coil_tanh": ("_coil_expm1",)}
_NEEDS_NATIVE = {"_coil_row_max_nan": ("_coil_max_nan_combine",), "_coil_row_min_nan": ("_coil_min_nan_combine",)}

_CALL = re.compile(r"\b(_coil_[a-z0-9_]+)\b")


def helpers_for(sources: Iterable[str], native: bool = False) -> list[str]:
    """Definitions of the helpers the sources mention, callees first; `native`:
    the GPU definitions where there are some."""
    used: list[str] = []

    def add(name: str) -> None:
        for dep in (_NEEDS_NATIVE if native and name in NATIVE else _NEEDS).get(name, ()):
            add(dep)
        if name not in used:
            used.append(name)

    for src in sources:
        for name in _CALL.findall(src):
            if name in HELPERS:
                add(name)
    return [(NATIVE[n] if native and n in NATIVE else HELPERS[n]).strip("\n") for n in used]
