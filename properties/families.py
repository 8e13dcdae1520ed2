"""The instruction families `graphs()` draws from.  An instruction is one drawn
choice (an op and its operands) that adds one aten call to the graph, plus the
guards its domain needs.  Tables list the ops; each list starts with its simplest
entry, because hypothesis shrinks a `sampled_from` toward the first element.

    pointwise   UNARY (neg ... erf, gelu, decomposed activations), BINARY (add ...
                comparisons, bitwise, logical, atan2), where, clamp, lerp, addcmul, pow
    reduction   sum mean amax amin prod var argmax argmin max.dim any all softmax
                log_softmax logsumexp cumsum sort
    view        permute transpose slice expand unsqueeze squeeze select reshape
                unfold diagonal
    other       cast (_to_copy), arange / full, cat, mm, gather / index.Tensor
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import hypothesis.strategies as st
import torch
from coil.properties.builder import GraphBuilder, Value, broadcastable, is_float, is_int

aten = torch.ops.aten

Family = Callable[[st.DrawFn, GraphBuilder, "Config"], None]

# Dyadic scalars are exact in every float dtype and in the int dtypes, so no result
# depends on where (in which dtype) a backend rounds the scalar.
INT_SCALARS = (2, -1, 3)
SCALARS = (2, -1, 0.5, 3, -1.5, 0.25)


@attrs.frozen
class Config:
    """What `graphs()` was asked for; fixed for one draw."""

    max_rank: int
    max_dim: int
    dtypes: tuple[torch.dtype, ...]
    device: str


# ---- operand kinds ----------------------------------------------------------------------


def number(v: Value) -> bool:
    return v.dtype != torch.bool


def floating(v: Value) -> bool:
    return is_float(v.dtype)


def integral(v: Value) -> bool:
    return v.dtype == torch.bool or is_int(v.dtype)


def anything(v: Value) -> bool:
    return True


KINDS: dict[str, Callable[[Value], bool]] = {
    "number": number, "float": floating, "integral": integral, "any": anything,
}


def pick(draw: st.DrawFn, b: GraphBuilder, pred: Callable[[Value], bool]) -> Value | None:
    cands = b.candidates(pred)
    if not cands:
        return None
    return cands[draw(st.integers(0, len(cands) - 1))]


def pick_operand(draw: st.DrawFn, b: GraphBuilder, kind: str, exact: bool) -> Value | None:
    ok = KINDS[kind]
    return pick(draw, b, lambda v: ok(v) and (v.exact or not exact))


def guard(b: GraphBuilder, v: Value, domain: str, limit: float) -> Value:
    """Put `v` in the op's domain: any | positive | nonzero | above_minus_one | nonnegative."""
    match domain:
        case "any":
            return b.bounded(v, limit)
        case "positive":
            return b.positive(v, limit=limit)
        case "nonzero":
            return b.nonzero(v, limit=limit)
        case "above_minus_one":
            v = b.bounded(v, limit)
            return v if v.min_value() >= -0.5 else b.call(aten.abs.default, (v,), exact=v.exact)
        case "nonnegative":
            v = b.bounded(v, limit)
            return v if v.min_value() >= 0 else b.call(aten.abs.default, (v,), exact=v.exact)
    raise ValueError(f"unknown domain {domain!r}")


def exact_if(operands: Sequence[Value], keeps_exact: bool) -> Callable[[torch.dtype], bool]:
    """Exact operands give an exact result when the op is exact (max, neg, ...) or
    its result is an integer (integer arithmetic has no rounding)."""
    ok = all(o.exact for o in operands)
    return lambda out: ok and (keeps_exact or not is_float(out))


# ---- unary pointwise --------------------------------------------------------------------


@attrs.frozen
class Unary:
    op: Any
    domain: str = "any"
    limit: float = 1.0e3
    kind: str = "number"  # which operands the op takes
    exact_in: bool = False  # discontinuous: reads exact values only
    keeps_exact: bool = False


UNARY: tuple[Unary, ...] = (
    Unary(aten.neg.default, keeps_exact=True),
    Unary(aten.abs.default, keeps_exact=True),
    Unary(aten.relu.default, keeps_exact=True),
    Unary(aten.exp.default, limit=5.0),
    Unary(aten.exp2.default, limit=5.0),
    Unary(aten.expm1.default, limit=5.0),
    Unary(aten.log.default, "positive"),
    Unary(aten.log2.default, "positive"),
    Unary(aten.log1p.default, "above_minus_one"),
    Unary(aten.sqrt.default, "positive"),
    Unary(aten.rsqrt.default, "positive"),
    Unary(aten.reciprocal.default, "nonzero"),
    Unary(aten.sin.default, limit=100.0),
    Unary(aten.cos.default, limit=100.0),
    Unary(aten.tan.default, limit=1.2),
    Unary(aten.tanh.default),
    Unary(aten.sigmoid.default),
    Unary(aten.erf.default),
    Unary(aten.floor.default, exact_in=True, keeps_exact=True),
    Unary(aten.ceil.default, exact_in=True, keeps_exact=True),
    Unary(aten.trunc.default, exact_in=True, keeps_exact=True),
    Unary(aten.round.default, exact_in=True, keeps_exact=True),
    Unary(aten.sign.default, exact_in=True, keeps_exact=True),
    Unary(aten.bitwise_not.default, kind="integral", keeps_exact=True),
    Unary(aten.logical_not.default, kind="any", exact_in=True, keeps_exact=True),
    Unary(aten.gelu.default, kind="float"),
    Unary(aten.silu.default, kind="float"),
    # no lowering of their own: they reach coil through the decomposition table
    Unary(aten.leaky_relu.default, kind="float"),
    Unary(aten.hardtanh.default, kind="float"),
    Unary(aten.elu.default, kind="float"),
    Unary(aten.softplus.default, kind="float", limit=15.0),
    Unary(aten.hardswish.default, kind="float"),
)


def unary(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    spec = draw(st.sampled_from(UNARY))
    x = pick_operand(draw, b, spec.kind, spec.exact_in)
    if x is None:
        return
    x = guard(b, x, spec.domain, spec.limit)
    b.call(spec.op, (x,), exact=exact_if((x,), spec.keeps_exact))


# ---- binary pointwise -------------------------------------------------------------------


@attrs.frozen
class Binary:
    op: Any  # the Tensor-Tensor overload
    scalar_op: Any = None  # the overload that takes a Python scalar `other`, if any
    kind: str = "number"
    domain_b: str = "any"
    limit: float = 1.0e3
    exact_in: bool = False
    keeps_exact: bool = False
    int_scalars_only: bool = False


BINARY: tuple[Binary, ...] = (
    Binary(aten.add.Tensor, aten.add.Tensor),
    Binary(aten.sub.Tensor, aten.sub.Tensor),
    Binary(aten.mul.Tensor, aten.mul.Tensor, limit=30.0),
    Binary(aten.div.Tensor, aten.div.Tensor, domain_b="nonzero", limit=100.0),
    Binary(aten.maximum.default, keeps_exact=True),
    Binary(aten.minimum.default, keeps_exact=True),
    Binary(aten.rsub.Tensor, aten.rsub.Scalar),
    Binary(aten.fmod.Tensor, aten.fmod.Scalar, domain_b="nonzero", exact_in=True),
    Binary(aten.remainder.Tensor, aten.remainder.Scalar, domain_b="nonzero", exact_in=True),
    Binary(aten.floor_divide.default, aten.floor_divide.Scalar, domain_b="nonzero", exact_in=True,
           int_scalars_only=True),
    Binary(aten.eq.Tensor, aten.eq.Scalar, exact_in=True),
    Binary(aten.ne.Tensor, aten.ne.Scalar, exact_in=True),
    Binary(aten.lt.Tensor, aten.lt.Scalar, exact_in=True),
    Binary(aten.le.Tensor, aten.le.Scalar, exact_in=True),
    Binary(aten.gt.Tensor, aten.gt.Scalar, exact_in=True),
    Binary(aten.ge.Tensor, aten.ge.Scalar, exact_in=True),
    Binary(aten.logical_and.default, kind="any", exact_in=True),
    Binary(aten.logical_or.default, kind="any", exact_in=True),
    Binary(aten.logical_xor.default, kind="any", exact_in=True),
    Binary(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, kind="integral", int_scalars_only=True),
    Binary(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, kind="integral", int_scalars_only=True),
    Binary(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, kind="integral", int_scalars_only=True),
    # not lowered: an Extern call in the middle of fused code
    Binary(aten.atan2.default, kind="float", exact_in=True),
)


def _partner(draw: st.DrawFn, b: GraphBuilder, a: Value, kind: str, exact: bool,
             same_class: bool = False) -> Value:
    """A tensor operand that broadcasts with `a` (`a` itself at worst)."""
    ok = KINDS[kind]
    cls = integral(a)
    found = pick(draw, b, lambda v: ok(v) and (v.exact or not exact) and broadcastable(a.shape, v.shape)
                 and (not same_class or integral(v) == cls))
    return a if found is None else found


def binary(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    spec = draw(st.sampled_from(BINARY))
    a = pick_operand(draw, b, spec.kind, spec.exact_in)
    if a is None:
        return
    a = b.bounded(a, spec.limit)
    if spec.scalar_op is not None and draw(st.booleans()):
        ints_only = spec.int_scalars_only or spec.kind == "integral"
        other: Any = draw(st.sampled_from(INT_SCALARS if ints_only else SCALARS))
        op = spec.scalar_op
        operands: tuple[Value, ...] = (a,)
    else:
        other = _partner(draw, b, a, spec.kind, spec.exact_in, same_class=spec.kind == "integral")
        other = guard(b, other, spec.domain_b, spec.limit)
        op = spec.op
        operands = (a, other)
    b.call(op, (a, other), exact=exact_if(operands, spec.keeps_exact))


def pow_(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    """pow needs its own domains: a positive base for fractional or negative
    exponents, non-negative integer exponents for integer bases."""
    base = pick_operand(draw, b, "number", exact=False)
    if base is None:
        return
    if draw(st.booleans()):
        e = draw(st.sampled_from((2, 3, 0.5, -1, -2, 1.5, 0)))
        if is_int(base.dtype) and (e < 0 or isinstance(e, float)):
            e = 2
        base = b.bounded(base, 10.0) if isinstance(e, int) and e >= 0 else b.positive(base, limit=10.0)
        b.call(aten.pow.Tensor_Scalar, (base, e), exact=exact_if((base,), False))
        return
    e_val = _partner(draw, b, base, "number", exact=False)
    if is_int(base.dtype) and is_int(e_val.dtype):
        e_val = guard(b, e_val, "nonnegative", 3.0)
        base = b.bounded(base, 10.0)
    else:
        e_val = b.bounded(e_val, 2.0)
        base = b.positive(base, limit=10.0)
    b.call(aten.pow.Tensor_Tensor, (base, e_val), exact=exact_if((base, e_val), False))


# ---- ternary pointwise ------------------------------------------------------------------


def _condition(draw: st.DrawFn, b: GraphBuilder) -> Value | None:
    """A bool value: an existing one, or a comparison of an exact value with 0."""
    cond = pick(draw, b, lambda v: v.dtype == torch.bool) if draw(st.booleans()) else None
    if cond is not None:
        return cond
    x = pick_operand(draw, b, "number", exact=True)
    if x is None:
        return None
    return b.call(draw(st.sampled_from((aten.gt.Scalar, aten.le.Scalar))), (x, 0), exact=True)


def _branch(draw: st.DrawFn, b: GraphBuilder, shapes: Sequence[tuple[int, ...]], default: Value) -> Any:
    """One branch of a where: a scalar, or a number value that broadcasts with
    `shapes` (`default` when there is none)."""
    if draw(st.booleans()):
        return draw(st.sampled_from(SCALARS))
    v = pick(draw, b, lambda v: number(v) and broadcastable(v.shape, *shapes))
    return default if v is None else b.bounded(v, 1.0e3)


def where(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    cond = _condition(draw, b)
    if cond is None:
        return
    x = _branch(draw, b, [cond.shape], cond)
    y = _branch(draw, b, [cond.shape] + ([x.shape] if isinstance(x, Value) else []), cond)
    tensors = [v for v in (x, y) if isinstance(v, Value)]
    op = {(True, True): aten.where.self, (True, False): aten.where.ScalarOther,
          (False, True): aten.where.ScalarSelf, (False, False): aten.where.Scalar}[
        (isinstance(x, Value), isinstance(y, Value))]
    b.call(op, (cond, x, y), exact=exact_if([cond, *tensors], True))


def clamp(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    x = pick_operand(draw, b, "number", exact=False)
    if x is None:
        return
    x = b.bounded(x, 1.0e3)
    if draw(st.booleans()):
        lo = draw(st.sampled_from((-1, -0.5, None)))
        hi = draw(st.sampled_from((2, 0.5, None) if lo is not None else (2, 0.5)))
        b.call(aten.clamp.default, (x, lo, hi), exact=exact_if((x,), True))
    else:
        lo_t = _partner(draw, b, x, "number", exact=False)
        hi_t = _partner(draw, b, lo_t, "number", exact=False)
        if not broadcastable(x.shape, lo_t.shape, hi_t.shape):
            hi_t = lo_t
        lo_t, hi_t = b.bounded(lo_t, 1.0e3), b.bounded(hi_t, 1.0e3)
        b.call(aten.clamp.Tensor, (x, lo_t, hi_t), exact=exact_if((x, lo_t, hi_t), True))


def lerp_addcmul(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    """Ternary ops that coil decomposes: lerp(a, b, 0.25), addcmul(a, b, c, value=0.5)."""
    a = pick_operand(draw, b, "float", exact=False)
    if a is None:
        return
    a = b.bounded(a, 30.0)
    p = b.bounded(_partner(draw, b, a, "float", exact=False), 30.0)
    if draw(st.booleans()):
        # lerp does not promote: its end takes the start's dtype
        p = p if p.dtype == a.dtype else a
        b.call(aten.lerp.Scalar, (a, p, 0.25))
        return
    q = b.bounded(_partner(draw, b, p, "float", exact=False), 30.0)
    if not broadcastable(a.shape, p.shape, q.shape):
        q = p
    b.call(aten.addcmul.default, (a, p, q), {"value": 0.5})


# ---- reductions ---------------------------------------------------------------------------


def _dims(draw: st.DrawFn, x: Value, single: bool = False) -> list[int]:
    """Dims to reduce over, some written negative (a 0-d tensor takes dim 0 or -1)."""
    n = max(x.ndim, 1)
    if single:
        dims = [draw(st.integers(0, n - 1))]
    else:
        dims = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    return [d - n if draw(st.booleans()) else d for d in dims]


def _count(x: Value, dims: Sequence[int]) -> int:
    if x.ndim == 0:
        return 1
    return math.prod(x.shape[d % x.ndim] for d in dims)


def reduction(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    kind = draw(st.sampled_from(REDUCTIONS))
    REDUCTION_FNS[kind](draw, b)


def _sum(draw: st.DrawFn, b: GraphBuilder) -> None:
    x = pick_operand(draw, b, "any", exact=False)
    if x is None:
        return
    if draw(st.booleans()):
        x = b.bounded(x, 1.0e3 / max(x.numel(), 1))
        b.call(aten.sum.default, (x,), exact=exact_if((x,), False))
    else:
        dims, keep = _dims(draw, x), draw(st.booleans())
        x = b.bounded(x, 1.0e3 / _count(x, dims))
        b.call(aten.sum.dim_IntList, (x, dims, keep), exact=exact_if((x,), False))


def _mean_var(draw: st.DrawFn, b: GraphBuilder) -> None:
    x = pick_operand(draw, b, "float", exact=False)
    if x is None:
        return
    dims, keep = _dims(draw, x), draw(st.booleans())
    if draw(st.booleans()):
        b.call(aten.mean.dim, (b.bounded(x, 1.0e3), dims, keep))
        return
    # correction 1 over a single element divides 0 by 0
    correction = 1 if _count(x, dims) > 1 and draw(st.booleans()) else 0
    b.call(aten.var.correction, (b.bounded(x, 100.0), dims), {"correction": correction, "keepdim": keep})


def _amax_amin(draw: st.DrawFn, b: GraphBuilder) -> None:
    x = pick_operand(draw, b, "number", exact=False)
    if x is None:
        return
    op = draw(st.sampled_from((aten.amax.default, aten.amin.default)))
    b.call(op, (x, _dims(draw, x), draw(st.booleans())), exact=x.exact)


def _prod(draw: st.DrawFn, b: GraphBuilder) -> None:
    """A product of n values bounded by 256^(1/n) stays below 256."""
    x = pick_operand(draw, b, "number", exact=False)
    if x is None:
        return
    dim = _dims(draw, x, single=True)[0]
    n = _count(x, [dim])
    limit = 256.0 ** (1.0 / n)
    x = b.bounded(x, max(1.0, math.floor(limit)) if is_int(x.dtype) else limit)
    b.call(aten.prod.dim_int, (x, dim, draw(st.booleans())), exact=exact_if((x,), False))


def _arg(draw: st.DrawFn, b: GraphBuilder) -> None:
    """argmax/argmin and max.dim/min.dim: indices, so exact operands only."""
    x = pick_operand(draw, b, "number", exact=True)
    if x is None:
        return
    dim = _dims(draw, x, single=True)[0]
    keep = draw(st.booleans())
    match draw(st.sampled_from(("argmax", "argmin", "max.dim", "min.dim", "argmax_all"))):
        case "argmax":
            b.call(aten.argmax.default, (x, dim, keep), exact=True)
        case "argmin":
            b.call(aten.argmin.default, (x, dim, keep), exact=True)
        case "max.dim":
            b.call_multi(aten.max.dim, (x, dim, keep), None, (True, True))
        case "min.dim":
            b.call_multi(aten.min.dim, (x, dim, keep), None, (True, True))
        case _:
            b.call(aten.argmax.default, (x,), exact=True)


def _any_all(draw: st.DrawFn, b: GraphBuilder) -> None:
    x = pick_operand(draw, b, "any", exact=True)
    if x is None:
        return
    op = draw(st.sampled_from((aten.any.dim, aten.all.dim)))
    b.call(op, (x, _dims(draw, x, single=True)[0], draw(st.booleans())), exact=True)


def _softmax(draw: st.DrawFn, b: GraphBuilder) -> None:
    """softmax, log_softmax, logsumexp: coil sees their decompositions."""
    x = pick_operand(draw, b, "float", exact=False)
    if x is None:
        return
    x = b.bounded(x, 1.0e3)
    match draw(st.sampled_from(("softmax", "log_softmax", "logsumexp"))):
        case "softmax":
            b.call(aten._softmax.default, (x, _dims(draw, x, single=True)[0], False))
        case "log_softmax":
            b.call(aten._log_softmax.default, (x, _dims(draw, x, single=True)[0], False))
        case _:
            b.call(aten.logsumexp.default, (x, _dims(draw, x), draw(st.booleans())))


def _cumsum_sort(draw: st.DrawFn, b: GraphBuilder) -> None:
    """cumsum (a masked sum Reduction up to 512 elements a row, else an Extern) and
    sort, an Extern with two outputs (MultiOutput)."""
    x = pick_operand(draw, b, "number", exact=draw(st.booleans()))
    if x is None:
        return
    dim = _dims(draw, x, single=True)[0]
    if x.exact and draw(st.booleans()):
        b.call_multi(aten.sort.default, (x, dim, draw(st.booleans())), None, (True, True))
        return
    x = b.bounded(x, 1.0e3 / max(_count(x, [dim]), 1))
    b.call(aten.cumsum.default, (x, dim), exact=exact_if((x,), False))


REDUCTION_FNS: dict[str, Callable[[st.DrawFn, GraphBuilder], None]] = {
    "sum": _sum,
    "mean_var": _mean_var,
    "amax_amin": _amax_amin,
    "prod": _prod,
    "arg": _arg,
    "any_all": _any_all,
    "softmax": _softmax,
    "cumsum_sort": _cumsum_sort,
}
REDUCTIONS = tuple(REDUCTION_FNS)


# ---- views ----------------------------------------------------------------------------------


def view(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    x = pick(draw, b, lambda v: True)
    if x is None:
        return
    kinds = [k for k, (applies, _) in VIEWS.items() if applies(x, cfg)]
    if not kinds:
        return
    _, emit = VIEWS[draw(st.sampled_from(kinds))]
    emit(draw, b, x, cfg)


def _view_of(b: GraphBuilder, op: Any, x: Value, *args: Any) -> Value:
    return b.call(op, (x, *args), exact=x.exact)


def _permute(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    _view_of(b, aten.permute.default, x, list(draw(st.permutations(range(x.ndim)))))


def _transpose(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    d0, d1 = draw(st.integers(0, x.ndim - 1)), draw(st.integers(-x.ndim, x.ndim - 1))
    _view_of(b, aten.transpose.int, x, d0, d1)


def _slice(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    dim = draw(st.sampled_from([d for d in range(x.ndim) if x.shape[d] >= 2]))
    n = x.shape[dim]
    step = draw(st.integers(1, 3))
    start = draw(st.integers(-n, n - 1))
    end = draw(st.one_of(st.none(), st.integers(-n + 1, n + 2)))
    if len(range(*slice(start, end, step).indices(n))) == 0:
        start, end = 0, None  # keep every view non-empty
    _view_of(b, aten.slice.Tensor, x, dim, start, end, step)


def _expand(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    lead = 1 if x.ndim < cfg.max_rank and draw(st.booleans()) else 0
    sizes: list[int] = [draw(st.integers(1, cfg.max_dim)) for _ in range(lead)]
    for s in x.shape:
        sizes.append(draw(st.integers(1, cfg.max_dim)) if s == 1 else (-1 if draw(st.booleans()) else s))
    _view_of(b, aten.expand.default, x, sizes)


def _unsqueeze(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    _view_of(b, aten.unsqueeze.default, x, draw(st.integers(-x.ndim - 1, x.ndim)))


def _squeeze(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    """squeeze.dim of a dim that is not 1 is a no-op view: drawn on purpose."""
    _view_of(b, aten.squeeze.dim, x, draw(st.integers(-x.ndim, x.ndim - 1)))


def _select(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    dim = draw(st.integers(0, x.ndim - 1))
    _view_of(b, aten.select.int, x, dim, draw(st.integers(-x.shape[dim], x.shape[dim] - 1)))


def _split(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    """aten.split into pieces of `k` rows (the last shorter): views of x, each a
    value of its own that later ops read or the graph returns.  At a symbolic dim
    coil keeps the split as an Extern whose pieces alias its argument, whose
    storage must outlive every piece."""
    dim = draw(st.sampled_from([d for d in range(x.ndim) if x.shape[d] >= 2]))
    n = x.shape[dim]
    k = draw(st.integers(1, n - 1))
    b.call_multi(aten.split.Tensor, (x, k, dim), None, (x.exact,) * len(range(0, n, k)))


def _reshape_target(draw: st.DrawFn, x: Value, cfg: Config) -> list[int]:
    """A shape of the same numel: merge two adjacent dims, split one, or flatten."""
    shape = list(x.shape)
    choices = ["flatten"]
    if x.ndim >= 2:
        choices.append("merge")
    splittable = [d for d, s in enumerate(shape) if _factor(s) is not None]
    if splittable and x.ndim < cfg.max_rank:
        choices.append("split")
    match draw(st.sampled_from(choices)):
        case "merge":
            d = draw(st.integers(0, x.ndim - 2))
            return shape[:d] + [shape[d] * shape[d + 1]] + shape[d + 2 :]
        case "split":
            d = draw(st.sampled_from(splittable))
            f = _factor(shape[d])
            assert f is not None
            return shape[:d] + [f, shape[d] // f] + shape[d + 1 :]
    return [-1] if draw(st.booleans()) else [x.numel()]


def _factor(n: int) -> int | None:
    for f in (2, 3, 5):
        if n % f == 0 and n > f:
            return f
    return None


def _reshape(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    """As make_fx writes a reshape: `view` when the strides allow it, else a
    contiguous clone and `_unsafe_view`."""
    target = _reshape_target(draw, x, cfg)
    try:
        x.tensor.view(target)
    except RuntimeError:
        c = b.call(aten.clone.default, (x,), {"memory_format": torch.contiguous_format}, exact=x.exact)
        _view_of(b, aten._unsafe_view.default, c, target)
        return
    _view_of(b, aten.view.default, x, target)


def _unfold(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    dim = draw(st.integers(0, x.ndim - 1))
    size = draw(st.integers(1, x.shape[dim]))
    _view_of(b, aten.unfold.default, x, dim, size, draw(st.integers(1, 2)))


def _diagonal(draw: st.DrawFn, b: GraphBuilder, x: Value, cfg: Config) -> None:
    d1, d2 = draw(st.sampled_from([(i, j) for i in range(x.ndim) for j in range(x.ndim) if i != j]))
    # an offset that leaves at least one element on the diagonal
    offset = draw(st.integers(-(x.shape[d1] - 1), x.shape[d2] - 1))
    _view_of(b, aten.diagonal.default, x, offset, d1, d2)


VIEWS: dict[str, tuple[Callable[[Value, Config], bool], Callable[[st.DrawFn, GraphBuilder, Value, Config], None]]] = {
    "permute": (lambda x, c: x.ndim >= 2, _permute),
    "transpose": (lambda x, c: x.ndim >= 2, _transpose),
    "slice": (lambda x, c: any(s >= 2 for s in x.shape), _slice),
    "expand": (lambda x, c: 1 in x.shape or x.ndim < c.max_rank, _expand),
    "unsqueeze": (lambda x, c: x.ndim < c.max_rank, _unsqueeze),
    "squeeze": (lambda x, c: x.ndim >= 1, _squeeze),
    "select": (lambda x, c: x.ndim >= 1, _select),
    "reshape": (lambda x, c: x.numel() > 0, _reshape),
    "unfold": (lambda x, c: 1 <= x.ndim < c.max_rank, _unfold),
    "diagonal": (lambda x, c: x.ndim >= 2, _diagonal),
    "split": (lambda x, c: any(s >= 2 for s in x.shape), _split),
}


# ---- casts, creation, concat, matmul ------------------------------------------------------


def cast(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    """_to_copy to another dtype; float -> integer truncates, so exact operands only."""
    target = draw(st.sampled_from(cfg.dtypes + (torch.bool,)))
    needs_exact = not is_float(target)
    x = pick(draw, b, lambda v: v.exact or not needs_exact)
    if x is None:
        return
    x = b.bounded(x, 1.0e3)
    b.call(aten._to_copy.default, (x,), {"dtype": target}, exact=x.exact)


def creation(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    """A new leaf shaped like an existing value's last dim (arange) or whole (full)."""
    like = pick(draw, b, lambda v: True)
    dtype = draw(st.sampled_from(cfg.dtypes))
    if like is None:
        return
    device = torch.device(cfg.device)
    if draw(st.booleans()) and like.ndim >= 1:
        b.call(aten.arange.default, (like.shape[-1],), {"dtype": dtype, "device": device, "pin_memory": False},
               exact=True)
        return
    value = draw(st.sampled_from(INT_SCALARS if is_int(dtype) else SCALARS))
    b.call(aten.full.default, (list(like.shape), value), {"dtype": dtype, "device": device, "pin_memory": False},
           exact=True)


def concat(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    """aten.cat (a Pointwise that picks its input by index) of two values that agree
    everywhere but along `dim`."""
    a = pick(draw, b, lambda v: v.ndim >= 1)
    if a is None:
        return
    dim = draw(st.integers(0, a.ndim - 1))

    def fits(v: Value) -> bool:
        return v.ndim == a.ndim and all(s == t for i, (s, t) in enumerate(zip(v.shape, a.shape)) if i != dim)

    other = pick(draw, b, fits)
    parts = [a, a if other is None else other]
    b.call(aten.cat.default, (parts, dim), exact=exact_if(parts, True))


def matmul(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    """aten.mm (an Extern) of a 2-d float value and a partner (k, n), else its transpose."""
    a = pick(draw, b, lambda v: v.ndim == 2 and v.dtype in (torch.float32, torch.float64))
    if a is None:
        return
    a = b.bounded(a, 30.0)
    k = a.shape[1]
    other = pick(draw, b, lambda v: v.ndim == 2 and v.dtype == a.dtype and v.shape[0] == k)
    if other is None:
        other = b.call(aten.permute.default, (a, [1, 0]), exact=a.exact)
    b.call(aten.mm.default, (a, b.bounded(other, 30.0)))


def indirect(draw: st.DrawFn, b: GraphBuilder, cfg: Config) -> None:
    """gather, or index.Tensor along one dim, of a value at positions computed in
    the graph: an exact integer value of the index's shape (else an arange), times
    3, modulo the indexed size; index.Tensor may shift them below 0 (it wraps)."""
    x = pick(draw, b, lambda v: v.ndim >= 1)
    if x is None:
        return
    dim = draw(st.integers(0, x.ndim - 1))
    n = x.shape[dim]
    gather = draw(st.booleans())
    shape = x.shape if gather else (draw(st.integers(1, cfg.max_dim)),)
    src = pick(draw, b, lambda v: v.exact and is_int(v.dtype) and v.shape == shape)
    if src is None:
        kw = {"dtype": torch.int64, "device": torch.device(cfg.device), "pin_memory": False}
        src = b.call(aten.arange.default, (shape[-1],), kw, exact=True)
        if len(shape) > 1:
            src = b.call(aten.expand.default, (src, list(shape)), exact=True)
    src = b.bounded(src, 1.0e3)
    idx = b.call(aten.remainder.Scalar, (b.call(aten.mul.Tensor, (src, 3), exact=True), n), exact=True)
    if idx.dtype != torch.int64:
        idx = b.call(aten._to_copy.default, (idx,), {"dtype": torch.int64}, exact=True)
    if gather:
        b.call(aten.gather.default, (x, dim, idx), exact=x.exact)
        return
    if draw(st.booleans()):
        idx = b.call(aten.sub.Tensor, (idx, n), exact=True)
    b.call(aten.index.Tensor, (x, [None] * dim + [idx]), exact=x.exact)


POINTWISE: tuple[Family, ...] = (unary, binary, where, clamp, pow_, lerp_addcmul)
OTHER: tuple[Family, ...] = (cast, creation, concat, matmul, indirect)
