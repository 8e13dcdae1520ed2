"""A reusable table of op test cases, and `check_case`, which runs one case through
a runner and compares it with eager PyTorch.

A case is a Python function of tensors plus how to draw its inputs.  The same table
serves every runner: a runner is `(gm, inputs) -> tuple of tensors`, and RUNNERS
maps a name to one (`"buffers"` runs lower + realize and the reference interpreter;
a compiled target adds its own entry).  Other families append their own lists
(REDUCTION_CASES, VIEW_CASES) below POINTWISE_CASES and CREATION_CASES.

Shape kinds say how the inputs are laid out:
    broadcast   shapes (4, 1, 6), (5, 6), (4, 5, 1): the output broadcasts to (4, 5, 6)
    noncontig   (4, 6) inputs that are a transpose, a strided slice, an offset slice
    expanded    (4, 6) inputs with a stride-0 dim (`expand` of a (1, 6) or (4, 1))
    zerodim     the first input is 0-d, the others (4, 6)
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Sequence

import attrs
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coil.backends.reference import run_buffer_graph
from coil.ir.buffers import BufferGraph
from coil.options import Options
from coil.passes.lower import lower
from coil.passes.pipeline import Pipeline
from coil.passes.realize import realize

aten = torch.ops.aten

Runner = Callable[[torch.fx.GraphModule, Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]
MakeInputs = Callable[[torch.dtype, str, torch.Generator], tuple[torch.Tensor, ...]]

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I32, I64, BOOL = torch.int32, torch.int64, torch.bool
FLOATS = (F32, F16, BF16, F64)
INTS = (I32, I64)
ALL = FLOATS + INTS + (BOOL,)
NUMBERS = FLOATS + INTS
SHAPE_KINDS = ("broadcast", "noncontig", "expanded", "zerodim")


@attrs.frozen
class OpCase:
    """One op or variant.  `fn` takes the tensors `make_inputs` draws; `targets` are
    the aten/prims overload packets the traced graph must contain, so a case cannot
    silently test some other op."""

    name: str
    fn: Callable[..., Any]
    make_inputs: MakeInputs
    dtypes: tuple[torch.dtype, ...]
    targets: tuple[Any, ...] = ()
    shape_kinds: tuple[str, ...] = ("broadcast", "noncontig")

    @property
    def id(self) -> str:
        return self.name


# ---- runners ---------------------------------------------------------------------------

LOWER_REALIZE = Pipeline((("lower", lower), ("realize", realize)))


def buffer_graph(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> BufferGraph:
    """lower + realize with verification on: the IR the reference runner executes."""
    bg = LOWER_REALIZE.run(gm, inputs, until="realize", options=Options(target="reference", verify=True))
    assert isinstance(bg, BufferGraph)
    return bg


def run_buffers(bg: BufferGraph, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The reference interpreter's outputs, every one a tensor."""
    outs = run_buffer_graph(bg, inputs)
    assert all(o is not None for o in outs), "a graph output came back as None"
    return tuple(o for o in outs if o is not None)


def reference_runner(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return run_buffers(buffer_graph(gm, inputs), inputs)


# Op cases pin each lowering's meaning against eager, so half-precision
# intermediates round as eager rounds them (the triton default keeps them in float32,
# as Inductor does; tests/test_triton_target.py covers that mode on its own).
EAGER_ROUNDING = Options(emulate_precision_casts=True)


def compiled_runner(target: str) -> Runner:
    """The whole pipeline for `target`, then a call of the compiled function."""

    def run(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        import coil

        return tuple(coil.compile_graph(gm, inputs, EAGER_ROUNDING.replace(target=target))(*inputs))

    return run


RUNNERS: dict[str, Runner] = {"buffers": reference_runner, "triton": compiled_runner("triton"),
                             "cpp": compiled_runner("cpp")}


# ---- inputs ------------------------------------------------------------------------------

# Value domains, so that no case meets NaN, Inf or a pole unless it asks to.
#   any        N(0, 2) floats, ints in [-8, 8]
#   positive   floats in [0.1, 2.1], ints in [1, 8]: log, sqrt, pow bases
#   nonzero    |x| in [0.5, 1.5] floats, ints in +-[1, 8]: divisors
#   unit       floats in (-0.9, 0.9): tan, pow exponents
#   few        integers -3..3 in the dtype: comparisons and max/min meet ties
#   special    floats with NaN and +-Inf sprinkled in: isnan / isinf
#   bool       a random mask, whatever the case's dtype
def _floats(domain: str, shape: Sequence[int], g: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    match domain:
        case "any":
            return torch.randn(shape, generator=g, dtype=torch.float64) * 2
        case "positive":
            return u * 2 + 0.1
        case "nonzero":
            return sign * (u + 0.5)
        case "unit":
            return (u * 2 - 1) * 0.9
        case "few":
            return torch.randint(-3, 4, shape, generator=g).to(torch.float64)
        case "special":
            x = torch.randn(shape, generator=g, dtype=torch.float64)
            pick = torch.randint(0, 6, shape, generator=g)
            x = torch.where(pick == 0, float("nan"), x)
            x = torch.where(pick == 1, float("inf"), x)
            return torch.where(pick == 2, float("-inf"), x)
    raise ValueError(f"unknown domain {domain!r}")


def _ints(domain: str, shape: Sequence[int], g: torch.Generator) -> torch.Tensor:
    match domain:
        case "any" | "special":
            return torch.randint(-8, 9, shape, generator=g)
        case "positive":
            return torch.randint(1, 9, shape, generator=g)
        case "nonzero":
            sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1, 1)
            return torch.randint(1, 9, shape, generator=g) * sign
        case "unit":
            return torch.randint(0, 3, shape, generator=g)
        case "few":
            return torch.randint(-3, 4, shape, generator=g)
    raise ValueError(f"unknown domain {domain!r}")


def draw(domain: str, dtype: torch.dtype, shape: Sequence[int], g: torch.Generator) -> torch.Tensor:
    """Contiguous values of `domain` in `dtype`."""
    if domain == "bool" or dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=g).bool().to(dtype)
    if dtype.is_floating_point:
        return _floats(domain, shape, g).to(dtype)
    return _ints(domain, shape, g).to(dtype)


_BROADCAST = ((4, 1, 6), (5, 6), (4, 5, 1))


def _noncontig(k: int, domain: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """A (4, 6) input that is not contiguous, a different way for each position."""
    match k % 3:
        case 0:
            return draw(domain, dtype, (6, 4), g).t()
        case 1:
            return draw(domain, dtype, (4, 12), g)[:, ::2]
        case _:
            return draw(domain, dtype, (6, 7), g)[1:5, 1:]
    raise AssertionError


def _expanded(k: int, domain: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    small = (1, 6) if k % 2 == 0 else (4, 1)
    return draw(domain, dtype, small, g).expand(4, 6)


def layout_input(k: int, domain: str, dtype: torch.dtype, shape_kind: str, g: torch.Generator) -> torch.Tensor:
    """The k-th tensor input of a case for `shape_kind`."""
    match shape_kind:
        case "broadcast":
            return draw(domain, dtype, _BROADCAST[k % 3], g)
        case "noncontig":
            return _noncontig(k, domain, dtype, g)
        case "expanded":
            return _expanded(k, domain, dtype, g)
        case "zerodim":
            return draw(domain, dtype, () if k == 0 else (4, 6), g)
    raise ValueError(f"unknown shape kind {shape_kind!r}")


def tensors(*domains: str, dtypes: Mapping[int, torch.dtype] | None = None) -> MakeInputs:
    """Inputs for a pointwise case: one tensor per domain, laid out by shape kind.
    `dtypes` pins some positions to a fixed dtype (a bool mask, an int exponent)."""
    pinned = dict(dtypes or {})

    def make(dtype: torch.dtype, shape_kind: str, g: torch.Generator) -> tuple[torch.Tensor, ...]:
        return tuple(
            layout_input(k, d, pinned.get(k, dtype), shape_kind, g) for k, d in enumerate(domains)
        )

    return make


# ---- checking ----------------------------------------------------------------------------


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    """coil computes half types in float32 and rounds once (as Inductor does), eager
    rounds after every op: allow a couple of half-precision ulps, as Inductor's own
    tests do.  Other dtypes keep assert_close's defaults."""
    if dtype == torch.float16:
        return {"atol": 1e-3, "rtol": 2e-3}
    if dtype == torch.bfloat16:
        return {"atol": 1e-2, "rtol": 1.6e-2}
    return {}


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def graph_targets(gm: torch.fx.GraphModule) -> set[Any]:
    """Overload packets of every call in the graph."""
    return {getattr(n.target, "overloadpacket", n.target) for n in gm.graph.nodes if n.op == "call_function"}


@attrs.frozen
class Checked:
    """What check_case traced and ran, for tests that inspect the IR too."""

    gm: torch.fx.GraphModule
    inputs: tuple[torch.Tensor, ...]
    expected: tuple[torch.Tensor, ...]
    actual: tuple[torch.Tensor, ...]


def check_case(case: OpCase, shape_kind: str, dtype: torch.dtype, runner: Runner, seed: int = 0) -> Checked:
    """Trace `case.fn` with make_fx, run it through `runner`, compare with eager:
    same dtypes, same shapes, values within the dtype's tolerance."""
    g = torch.Generator().manual_seed(seed)
    inputs = case.make_inputs(dtype, shape_kind, g)
    gm = make_fx(case.fn)(*inputs)
    missing = [t for t in case.targets if t not in graph_targets(gm)]
    assert not missing, f"{case.name}: traced graph lacks {missing}:\n{gm.code}"
    expected = _as_tuple(case.fn(*inputs))
    actual = _as_tuple(runner(gm, inputs))
    assert len(actual) == len(expected), f"{case.name}: {len(actual)} outputs, eager gives {len(expected)}"
    for a, e in zip(actual, expected):
        tol = tolerances(e.dtype)
        torch.testing.assert_close(a, e, atol=tol.get("atol"), rtol=tol.get("rtol"), equal_nan=True,
                                   msg=lambda m: f"{case.name} [{shape_kind}, {dtype}]: {m}")
    return Checked(gm, inputs, expected, actual)


# ---- pointwise ---------------------------------------------------------------------------


def _p(name: str, fn: Callable[..., Any], make: MakeInputs, dtypes: tuple[torch.dtype, ...],
       *targets: Any, shape_kinds: tuple[str, ...] = SHAPE_KINDS) -> OpCase:
    return OpCase(name, fn, make, dtypes, targets, shape_kinds)


UNARY_FLOAT_OPS: tuple[tuple[str, Any, str], ...] = (
    # (name, aten op, domain); these promote ints to float
    ("sqrt", aten.sqrt, "positive"),
    ("rsqrt", aten.rsqrt, "positive"),
    ("exp", aten.exp, "any"),
    ("exp2", aten.exp2, "any"),
    ("expm1", aten.expm1, "any"),
    ("log", aten.log, "positive"),
    ("log1p", aten.log1p, "positive"),
    ("log2", aten.log2, "positive"),
    ("sin", aten.sin, "any"),
    ("cos", aten.cos, "any"),
    ("tan", aten.tan, "unit"),
    ("tanh", aten.tanh, "any"),
    ("sigmoid", aten.sigmoid, "any"),
    ("erf", aten.erf, "any"),
    ("reciprocal", aten.reciprocal, "nonzero"),
)

def _call(fn: Callable[..., Any], *consts: Any) -> Callable[[torch.Tensor], Any]:
    """`x -> fn(x, *consts)` with exactly one parameter: make_fx counts a lambda's
    defaulted parameters as inputs, so table entries cannot bind loop variables that way."""
    return lambda x: fn(x, *consts)


_unary_float = tuple(
    _p(name, _call(op), tensors(domain), FLOATS + INTS, op) for name, op, domain in UNARY_FLOAT_OPS
)

_unary_same = (
    _p("neg", torch.neg, tensors("any"), NUMBERS, aten.neg),
    _p("abs", torch.abs, tensors("any"), NUMBERS, aten.abs),
    _p("sign", torch.sign, tensors("few"), ALL, aten.sign),
    _p("relu", torch.relu, tensors("any"), NUMBERS, aten.relu),
    _p("floor", torch.floor, tensors("any"), NUMBERS, aten.floor),
    _p("ceil", torch.ceil, tensors("any"), NUMBERS, aten.ceil),
    _p("trunc", torch.trunc, tensors("any"), NUMBERS, aten.trunc),
    _p("round", torch.round, tensors("any"), NUMBERS, aten.round),
    _p("round_decimals_2", lambda x: torch.round(x, decimals=2), tensors("any"), FLOATS, aten.round),
    _p("round_decimals_neg1", lambda x: torch.round(x * 40, decimals=-1), tensors("any"), FLOATS, aten.round),
    _p("gelu", torch.nn.functional.gelu, tensors("any"), FLOATS, aten.gelu),
    _p("gelu_tanh", lambda x: torch.nn.functional.gelu(x, approximate="tanh"), tensors("any"), FLOATS, aten.gelu),
    _p("silu", lambda x: torch.nn.functional.silu(x), tensors("any"), FLOATS, aten.silu),
    _p("isnan", torch.isnan, tensors("special"), ALL, aten.isnan),
    _p("isinf", torch.isinf, tensors("special"), ALL, aten.isinf),
    _p("logical_not", torch.logical_not, tensors("few"), ALL, aten.logical_not),
    _p("bitwise_not", torch.bitwise_not, tensors("any"), INTS + (BOOL,), aten.bitwise_not),
)

_arith = (
    _p("add", torch.add, tensors("any", "any"), ALL, aten.add),
    _p("add_alpha", lambda x, y: torch.add(x, y, alpha=3), tensors("any", "any"), NUMBERS, aten.add),
    _p("add_alpha_float", lambda x, y: torch.add(x, y, alpha=0.5), tensors("any", "any"), FLOATS, aten.add),
    _p("add_scalar", lambda x: x + 2, tensors("any"), NUMBERS, aten.add),
    _p("sub", torch.sub, tensors("any", "any"), NUMBERS, aten.sub),
    _p("sub_alpha", lambda x, y: torch.sub(x, y, alpha=2), tensors("any", "any"), NUMBERS, aten.sub),
    _p("sub_scalar_alpha", lambda x: torch.sub(x, 1.5, alpha=2), tensors("any"), FLOATS, aten.sub),
    _p("rsub_scalar", lambda x: 3 - x, tensors("any"), NUMBERS, aten.rsub),
    _p("mul", torch.mul, tensors("any", "any"), ALL, aten.mul),
    _p("mul_scalar", lambda x: x * 1.5, tensors("any"), ALL, aten.mul),
    _p("div", torch.div, tensors("any", "nonzero"), ALL, aten.div),
    _p("div_scalar", lambda x: x / 4, tensors("any"), ALL, aten.div),
    _p("div_floor", lambda x, y: torch.div(x, y, rounding_mode="floor"), tensors("any", "nonzero"), NUMBERS, aten.div),
    _p("div_trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc"), tensors("any", "nonzero"), NUMBERS, aten.div),
    _p("div_floor_scalar", lambda x: torch.div(x, -3, rounding_mode="floor"), tensors("any"), NUMBERS, aten.div),
    _p("div_trunc_scalar", lambda x: torch.div(x, 2.5, rounding_mode="trunc"), tensors("any"), NUMBERS, aten.div),
    _p("fmod", torch.fmod, tensors("any", "nonzero"), NUMBERS, aten.fmod),
    _p("fmod_scalar", lambda x: torch.fmod(x, 3), tensors("any"), NUMBERS, aten.fmod),
    _p("remainder", torch.remainder, tensors("any", "nonzero"), NUMBERS, aten.remainder),
    _p("remainder_scalar", lambda x: torch.remainder(x, -3), tensors("any"), NUMBERS, aten.remainder),
    _p("pow", torch.pow, tensors("positive", "unit"), NUMBERS, aten.pow),
    _p("pow_scalar_exp", lambda x: torch.pow(x, 3), tensors("any"), NUMBERS, aten.pow),
    _p("pow_scalar_exp_float", lambda x: torch.pow(x, 1.7), tensors("positive"), NUMBERS, aten.pow),
    _p("pow_square", lambda x: torch.pow(x, 2), tensors("any"), NUMBERS, aten.pow),
    _p("pow_half", lambda x: torch.pow(x, 0.5), tensors("positive"), NUMBERS, aten.pow),
    _p("pow_minus_one", lambda x: torch.pow(x, -1.0), tensors("nonzero"), FLOATS, aten.pow),
    _p("pow_minus_two", lambda x: torch.pow(x, -2), tensors("nonzero"), FLOATS, aten.pow),
    _p("pow_scalar_base", lambda x: torch.pow(2.0, x), tensors("unit"), NUMBERS, aten.pow),
    _p("pow_int_scalar_base", lambda x: torch.pow(3, x), tensors("unit"), NUMBERS, aten.pow),
    _p("maximum", torch.maximum, tensors("few", "few"), ALL, aten.maximum),
    _p("minimum", torch.minimum, tensors("few", "few"), ALL, aten.minimum),
)

_clamps = (
    _p("clamp", lambda x: torch.clamp(x, -0.5, 0.7), tensors("any"), FLOATS, aten.clamp),
    _p("clamp_int", lambda x: torch.clamp(x, -2, 3), tensors("any"), NUMBERS, aten.clamp),
    _p("clamp_float_bound_int_input", lambda x: torch.clamp(x, 0.5), tensors("any"), NUMBERS, aten.clamp),
    _p("clamp_only_max", lambda x: torch.clamp(x, max=0.5), tensors("any"), FLOATS, aten.clamp),
    _p("clamp_tensor", lambda x, lo, hi: torch.clamp(x, lo, hi), tensors("any", "any", "any"), NUMBERS, aten.clamp),
    _p("clamp_tensor_min_only", lambda x, lo: torch.clamp(x, min=lo), tensors("any", "any"), NUMBERS, aten.clamp),
    _p("clamp_tensor_max_only", lambda x, hi: torch.clamp(x, max=hi), tensors("any", "any"), NUMBERS, aten.clamp),
    _p("clamp_min", lambda x: torch.clamp_min(x, 0.25), tensors("any"), FLOATS, aten.clamp_min),
    _p("clamp_min_tensor", torch.clamp_min, tensors("any", "any"), NUMBERS, aten.clamp_min),
    _p("clamp_max", lambda x: torch.clamp_max(x, 0.25), tensors("any"), FLOATS, aten.clamp_max),
    _p("clamp_max_tensor", torch.clamp_max, tensors("any", "any"), NUMBERS, aten.clamp_max),
)

_where = (
    _p("where", torch.where, tensors("bool", "any", "any", dtypes={0: BOOL}), ALL, aten.where),
    _p("where_scalar_other", lambda c, x: torch.where(c, x, 0.5), tensors("bool", "any", dtypes={0: BOOL}), ALL, aten.where),
    _p("where_scalar_self", lambda c, y: torch.where(c, 2, y), tensors("bool", "any", dtypes={0: BOOL}), ALL, aten.where),
    _p("where_from_compare", lambda x, y: torch.where(x > y, x, y * 2), tensors("any", "any"), NUMBERS, aten.where, aten.gt),
)


def _compare(name: str, fn: Callable[[Any, Any], Any]) -> tuple[OpCase, ...]:
    packet = getattr(aten, name)
    return (
        _p(name, fn, tensors("few", "few"), ALL, packet),
        _p(f"{name}_scalar", _call(fn, 1), tensors("few"), ALL, packet),
        _p(f"{name}_float_scalar", _call(fn, 0.5), tensors("few"), NUMBERS, packet),
    )


_comparisons = (
    _compare("eq", operator.eq)
    + _compare("ne", operator.ne)
    + _compare("lt", operator.lt)
    + _compare("le", operator.le)
    + _compare("gt", operator.gt)
    + _compare("ge", operator.ge)
)

_logic = (
    _p("logical_and", torch.logical_and, tensors("few", "few"), ALL, aten.logical_and),
    _p("logical_or", torch.logical_or, tensors("few", "few"), ALL, aten.logical_or),
    _p("logical_xor", torch.logical_xor, tensors("few", "few"), ALL, aten.logical_xor),
    _p("logical_and_mixed", lambda x, m: torch.logical_and(x, m), tensors("few", "bool", dtypes={1: BOOL}), NUMBERS,
       aten.logical_and),
    _p("bitwise_and", torch.bitwise_and, tensors("any", "any"), INTS + (BOOL,), aten.bitwise_and),
    _p("bitwise_or", torch.bitwise_or, tensors("any", "any"), INTS + (BOOL,), aten.bitwise_or),
    _p("bitwise_xor", torch.bitwise_xor, tensors("any", "any"), INTS + (BOOL,), aten.bitwise_xor),
    _p("bitwise_and_scalar", lambda x: torch.bitwise_and(x, 5), tensors("any"), INTS, aten.bitwise_and),
    _p("bitwise_or_bool_scalar", lambda x: torch.bitwise_or(x, True), tensors("any"), INTS + (BOOL,), aten.bitwise_or),
)

def _copy_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # copy=True keeps a same-dtype cast in the graph as _to_copy instead of tracing it away
    return x.to(dtype, copy=True)


_casts = tuple(
    _p(f"to_{str(dt).removeprefix('torch.')}", _call(_copy_to, dt), tensors("any"), ALL, aten._to_copy)
    for dt in ALL
) + (
    _p("convert_element_type", lambda x: torch.ops.prims.convert_element_type(x, torch.float64), tensors("any"), ALL,
       torch.ops.prims.convert_element_type),
    _p("convert_element_type_to_int", lambda x: torch.ops.prims.convert_element_type(x, torch.int32),
       tensors("any"), ALL, torch.ops.prims.convert_element_type),
)

POINTWISE_CASES: list[OpCase] = [
    *_unary_float, *_unary_same, *_arith, *_clamps, *_where, *_comparisons, *_logic, *_casts,
]


# ---- creation ----------------------------------------------------------------------------
# The creation op takes its shape and dtype from the (otherwise unused) input, so
# the table's dtype and shape kind steer it; some cases also feed the new tensor to
# a pointwise consumer, where its body is inlined.


def _c(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...], *targets: Any,
       domain: str = "any") -> OpCase:
    return OpCase(name, fn, tensors(domain), dtypes, targets, ("broadcast", "noncontig"))


CREATION_CASES: list[OpCase] = [
    _c("full", lambda x: torch.full(x.shape, 3, dtype=x.dtype), ALL, aten.full),
    _c("full_float_value", lambda x: torch.full((3, 5), 2.5, dtype=x.dtype), FLOATS, aten.full),
    _c("full_inferred_dtype", lambda x: (torch.full((2, 3), 7), torch.full((2, 3), 1.5), torch.full((2,), True)),
       (F32,), aten.full),
    _c("full_plus_input", lambda x: x + torch.full(x.shape[-1:], 2, dtype=x.dtype), NUMBERS, aten.full, aten.add),
    _c("scalar_tensor", lambda x: torch.scalar_tensor(3.5, dtype=x.dtype), ALL, aten.scalar_tensor),
    _c("scalar_tensor_default_dtype", lambda x: torch.scalar_tensor(3), (F32,), aten.scalar_tensor),
    _c("zeros", lambda x: torch.zeros(x.shape, dtype=x.dtype), ALL, aten.zeros),
    _c("ones", lambda x: torch.ones(3, 4, dtype=x.dtype), ALL, aten.ones),
    _c("ones_default_dtype", lambda x: torch.ones(2, 3), (F32,), aten.ones),
    _c("zeros_like", torch.zeros_like, ALL, aten.zeros_like),
    _c("ones_like", torch.ones_like, ALL, aten.ones_like),
    _c("ones_like_dtype", lambda x: torch.ones_like(x, dtype=torch.float16), ALL, aten.ones_like),
    _c("full_like", lambda x: torch.full_like(x, 2), ALL, aten.full_like),
    _c("full_like_float_value", lambda x: torch.full_like(x, 2.75), ALL, aten.full_like),
    _c("full_like_dtype", lambda x: torch.full_like(x, 7, dtype=torch.int32), ALL, aten.full_like),
    _c("arange_end", lambda x: torch.arange(7, dtype=x.dtype), NUMBERS, aten.arange),
    _c("arange_start_end", lambda x: torch.arange(2, 9, dtype=x.dtype), NUMBERS, aten.arange),
    _c("arange_step", lambda x: torch.arange(1, 20, 3, dtype=x.dtype), NUMBERS, aten.arange),
    _c("arange_negative_step", lambda x: torch.arange(10, -3, -4, dtype=x.dtype), NUMBERS, aten.arange),
    _c("arange_int_default", lambda x: torch.arange(2, 11, 2), (F32,), aten.arange),
    _c("arange_float", lambda x: torch.arange(0.5, 3.0, 0.25), (F32,), aten.arange),
    _c("arange_float_inexact_step", lambda x: torch.arange(-1.0, 1.0, 0.3, dtype=x.dtype), FLOATS, aten.arange),
    _c("arange_plus_input", lambda x: x + torch.arange(x.shape[-1], dtype=x.dtype), NUMBERS, aten.arange, aten.add),
    _c("arange_int32_float_args", lambda x: torch.arange(0.5, 5.7, 1.5, dtype=torch.int32), (F32,), aten.arange),
    _c("arange_int64_float_args", lambda x: torch.arange(-2.5, 3, 1.5, dtype=torch.int64), (F32,), aten.arange),
    _c("arange_float_dtype_int_args", lambda x: torch.arange(-3, 8, 2, dtype=x.dtype), FLOATS, aten.arange),
    _c("fill", lambda x: torch.ops.aten.fill.Scalar(x, 1.5), ALL, aten.fill),
    OpCase("fill_tensor", lambda v, x: torch.ops.aten.fill.Tensor(x, v), tensors("any", "any", dtypes={0: F64}),
           NUMBERS, (aten.fill,), ("zerodim",)),
    _c("iota", lambda x: torch.ops.prims.iota(6, start=3, step=-2, dtype=torch.int64, device=x.device,
                                               requires_grad=False), (F32,), torch.ops.prims.iota),
    _c("iota_dtype", lambda x: torch.ops.prims.iota(5, start=1, step=2, dtype=x.dtype, device=x.device,
                                                     requires_grad=False), INTS, torch.ops.prims.iota),
]


# ---- type promotion ----------------------------------------------------------------------
# Each case pins its input dtypes (the table dtype is only a label) and has one
# result dtype, which tests state explicitly besides comparing with eager.


def _promo(name: str, fn: Callable[..., Any], domains: tuple[str, ...], pinned: dict[int, torch.dtype],
           *targets: Any, shape_kinds: tuple[str, ...] = ("broadcast", "noncontig")) -> OpCase:
    return OpCase(name, fn, tensors(*domains, dtypes=pinned), (pinned[0],), targets, shape_kinds)


PROMOTION_CASES: list[OpCase] = [
    _promo("int32_plus_float_scalar", lambda x: x + 2.5, ("any",), {0: I32}, aten.add),
    _promo("int64_times_float_scalar", lambda x: x * 0.5, ("any",), {0: I64}, aten.mul),
    _promo("bool_plus_int_scalar", lambda x: x + 3, ("bool",), {0: BOOL}, aten.add),
    _promo("f16_plus_float_scalar", lambda x: x + 1e-3, ("any",), {0: F16}, aten.add),
    _promo("int32_plus_int64", torch.add, ("any", "any"), {0: I32, 1: I64}, aten.add),
    _promo("f16_plus_f32", torch.add, ("any", "any"), {0: F16, 1: F32}, aten.add),
    _promo("bf16_plus_f16", torch.add, ("any", "any"), {0: BF16, 1: F16}, aten.add),
    _promo("bool_plus_int32", torch.add, ("bool", "any"), {0: BOOL, 1: I32}, aten.add),
    _promo("int32_plus_f64", torch.add, ("any", "any"), {0: I32, 1: F64}, aten.add),
    _promo("zerodim_f64_plus_f16", torch.add, ("any", "any"), {0: F64, 1: F16}, aten.add, shape_kinds=("zerodim",)),
    _promo("zerodim_f32_plus_int32", torch.add, ("any", "any"), {0: F32, 1: I32}, aten.add, shape_kinds=("zerodim",)),
    _promo("zerodim_int64_plus_int32", torch.add, ("any", "any"), {0: I64, 1: I32}, aten.add, shape_kinds=("zerodim",)),
    _promo("zerodim_int64_times_bool", torch.mul, ("any", "bool"), {0: I64, 1: BOOL}, aten.mul, shape_kinds=("zerodim",)),
    _promo("div_int32_int32", torch.div, ("any", "nonzero"), {0: I32, 1: I32}, aten.div),
    _promo("div_int64_scalar", lambda x: x / 3, ("any",), {0: I64}, aten.div),
    _promo("floor_div_int32_int64", lambda x, y: torch.div(x, y, rounding_mode="floor"), ("any", "nonzero"),
           {0: I32, 1: I64}, aten.div),
    _promo("exp_int64", torch.exp, ("unit",), {0: I64}, aten.exp),
    _promo("sqrt_bool", torch.sqrt, ("bool",), {0: BOOL}, aten.sqrt),
    _promo("pow_int32_f32", torch.pow, ("positive", "unit"), {0: I32, 1: F32}, aten.pow),
    _promo("pow_bool_scalar", lambda x: torch.pow(x, 2), ("bool",), {0: BOOL}, aten.pow),
    _promo("where_int32_f16", torch.where, ("bool", "any", "any"), {0: BOOL, 1: I32, 2: F16}, aten.where),
    _promo("eq_int32_f32", torch.eq, ("few", "few"), {0: I32, 1: F32}, aten.eq),
    _promo("clamp_int32_f32_bounds", torch.clamp, ("any", "any", "any"), {0: I32, 1: F32, 2: F32}, aten.clamp),
    _promo("maximum_f16_zerodim_f32", torch.maximum, ("few", "few"), {0: F32, 1: F16}, aten.maximum,
           shape_kinds=("zerodim",)),
]


# ---- reductions --------------------------------------------------------------------------
# Each case reduces `x + y` (or `x * y`): under the "broadcast" shape kind the sum
# is a (4, 5, 6) broadcast of a (4, 1, 6) and a (5, 6) input, under "noncontig" two
# (4, 6) inputs that are a transpose and a strided slice.  Dims are negative or
# below 2 so one case is valid for both ranks.  "few" values (small integers) are
# exact in every dtype, so half-precision sums and ties in max / argmax give the
# same answer however the reduction is ordered.


def _r(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...], *targets: Any,
       domain: str = "few") -> OpCase:
    return OpCase(name, fn, tensors(domain, domain), dtypes, targets, ("broadcast", "noncontig"))


def _sum_of(fn: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """`(x, y) -> fn(x + y)`: a reduction whose input broadcasts."""
    return lambda x, y: fn(x + y)


REDUCTION_CASES: list[OpCase] = [
    # sum: every dim set; ints and bools accumulate (and return) int64
    _r("sum_all", _sum_of(torch.sum), (F32, I32, BOOL), aten.sum),
    _r("sum_dim", _sum_of(lambda s: s.sum(-1)), (F32, F16, I64, BOOL), aten.sum),
    _r("sum_dim0_keepdim", _sum_of(lambda s: s.sum(0, keepdim=True)), (F32, BF16, I32), aten.sum),
    _r("sum_dims", _sum_of(lambda s: s.sum((0, -1))), (F32, I32), aten.sum),
    _r("sum_dims_keepdim", _sum_of(lambda s: s.sum((-1, 0), keepdim=True)), (F32, I64), aten.sum),
    _r("sum_empty_dim_list", _sum_of(lambda s: torch.sum(s, [])), (F32, I32), aten.sum),
    _r("sum_dtype", _sum_of(lambda s: s.sum(-1, dtype=torch.float64)), (F32, I32), aten.sum),
    _r("sum_dtype_narrow", _sum_of(lambda s: s.sum(-1, dtype=torch.int32)), (F32, I64), aten.sum),
    # prod: |x * y| in [0.25, 2.25] keeps float products finite; int products wrap alike
    _r("prod_all", lambda x, y: torch.prod(x * y), (F32, I64), aten.prod, domain="nonzero"),
    _r("prod_dim", lambda x, y: torch.prod(x * y, -1), (F32, I32, BOOL), aten.prod, domain="nonzero"),
    _r("prod_dim_keepdim_dtype", lambda x, y: torch.prod(x * y, 0, keepdim=True, dtype=torch.float64), (F32, I32),
       aten.prod, domain="nonzero"),
    # max / min, values and indices (ties: the first index wins)
    _r("amax_dim", _sum_of(lambda s: s.amax(-1)), (F32, F16, I32, BOOL), aten.amax),
    _r("amax_dims", _sum_of(lambda s: s.amax((0, -1))), (F32, I64), aten.amax),
    _r("amax_all", _sum_of(lambda s: s.amax()), (F32, BF16), aten.amax),
    _r("amin_dim_keepdim", _sum_of(lambda s: s.amin(-2, keepdim=True)), (F32, I32, BOOL), aten.amin),
    _r("amin_dims", _sum_of(lambda s: s.amin((1, 0))), (F32, F16), aten.amin),
    _r("max_all", _sum_of(torch.max), (F32, I32), aten.max),
    _r("min_all", _sum_of(torch.min), (F32, I64), aten.min),
    _r("max_dim", _sum_of(lambda s: torch.max(s, -1)), (F32, F16, I32, BOOL), aten.max),
    _r("max_dim_keepdim", _sum_of(lambda s: torch.max(s, 0, keepdim=True)), (F32, I64), aten.max),
    _r("min_dim", _sum_of(lambda s: torch.min(s, -2)), (F32, I32), aten.min),
    _r("min_dim_keepdim", _sum_of(lambda s: torch.min(s, 1, keepdim=True)), (F32, BF16), aten.min),
    _r("argmax_dim", _sum_of(lambda s: s.argmax(-1)), (F32, F16, I32), aten.argmax),
    _r("argmax_dim_keepdim", _sum_of(lambda s: s.argmax(0, keepdim=True)), (F32, I64), aten.argmax),
    _r("argmax_none", _sum_of(lambda s: s.argmax()), (F32, I32), aten.argmax),
    _r("argmax_none_keepdim", _sum_of(lambda s: torch.argmax(s, keepdim=True)), (F32, I64), aten.argmax),
    _r("argmin_dim", _sum_of(lambda s: s.argmin(-2)), (F32, BF16, I32), aten.argmin),
    _r("argmin_none", _sum_of(lambda s: s.argmin()), (F32, I64), aten.argmin),
    _r("argmin_none_keepdim", _sum_of(lambda s: torch.argmin(s, keepdim=True)), (F32, I32), aten.argmin),
    # any / all: "few" values hold zeros, so both answers occur
    _r("any_all", _sum_of(torch.any), (BOOL, F32, I32), aten.any),
    _r("any_dim", _sum_of(lambda s: s.any(-1)), (BOOL, F32, I64), aten.any),
    _r("any_dims_keepdim", _sum_of(lambda s: torch.any(s, (0, -1), keepdim=True)), (BOOL, F32), aten.any),
    _r("all_all", lambda x, y: torch.all(x * y), (BOOL, F32, I32), aten.all),
    _r("all_dim_keepdim", lambda x, y: (x * y).all(0, keepdim=True), (BOOL, F32, I32), aten.all),
    _r("all_dims", lambda x, y: torch.all(x * y, (-2, -1)), (BOOL, I64), aten.all),
    # mean, var, var_mean, std (std decomposes into var and sqrt)
    _r("mean_all", _sum_of(torch.mean), (F32, F16), aten.mean),
    _r("mean_dim", _sum_of(lambda s: s.mean(-1)), (F32, BF16), aten.mean),
    _r("mean_dims_keepdim", _sum_of(lambda s: s.mean((0, -1), keepdim=True)), (F32, F64), aten.mean),
    _r("mean_dtype", _sum_of(lambda s: s.mean(0, dtype=torch.float64)), (F32, F16), aten.mean),
    _r("var_dim", _sum_of(lambda s: s.var(-1)), (F32, F16), aten.var),
    _r("var_all", _sum_of(torch.var), (F32, F64), aten.var),
    _r("var_correction0", _sum_of(lambda s: s.var(0, correction=0)), (F32, BF16), aten.var),
    _r("var_correction2_dims", _sum_of(lambda s: s.var((0, -1), correction=2)), (F32, F64), aten.var),
    _r("var_unbiased_false_keepdim", _sum_of(lambda s: s.var(-1, unbiased=False, keepdim=True)), (F32, F16),
       aten.var),
    _r("var_unbiased_true", _sum_of(lambda s: torch.var(s, -2, True)), (F32, F64), aten.var),
    _r("var_mean_dim", _sum_of(lambda s: torch.var_mean(s, -1)), (F32, F16), aten.var_mean),
    _r("var_mean_all_correction0", _sum_of(lambda s: torch.var_mean(s, correction=0)), (F32, BF16), aten.var_mean),
    _r("var_mean_unbiased_false_keepdim", _sum_of(lambda s: torch.var_mean(s, 0, unbiased=False, keepdim=True)),
       (F32, F64), aten.var_mean),
    _r("std_dim", _sum_of(lambda s: s.std(-1)), (F32, F16), aten.std),
    _r("std_all", _sum_of(torch.std), (F32, F64), aten.std),
    _r("std_correction0_keepdim", _sum_of(lambda s: s.std((0, -1), correction=0, keepdim=True)), (F32, BF16),
       aten.std),
    _r("std_mean", _sum_of(lambda s: torch.std_mean(s, -1)), (F32, F64), aten.std_mean),
]

# The reduction types each case's buffers must use (a case missing here is not checked).
REDUCTION_TYPES_OF: dict[str, frozenset[str]] = {
    "sum_dim": frozenset({"sum"}),
    "prod_dim": frozenset({"prod"}),
    "amax_dim": frozenset({"max"}),
    "amin_dims": frozenset({"min"}),
    "max_dim": frozenset({"max", "argmax"}),
    "min_dim": frozenset({"min", "argmin"}),
    "argmax_none": frozenset({"argmax"}),
    "argmin_dim": frozenset({"argmin"}),
    "any_dim": frozenset({"any"}),
    "all_dims": frozenset({"all"}),
    "mean_dim": frozenset({"sum"}),
    "var_dim": frozenset({"welford_m2"}),
    "var_mean_dim": frozenset({"welford_m2", "sum"}),
    "std_dim": frozenset({"welford_m2"}),
}


# ---- views ---------------------------------------------------------------------------------
# A view case's input has one logical shape under both of its layouts:
#     expanded   dim 0 (or, when it has size 1, the last dim) is a stride-0 broadcast
#     noncontig  the dims are stored in reverse order (a transpose for 2-d), or every
#                second element for 1-d
# The consumer is a pointwise op (`* 2`), so the view must fold into its index; a
# second input, where there is one, broadcasts against the view.


def _strided(shape: Sequence[int], domain: str, dtype: torch.dtype, shape_kind: str,
             g: torch.Generator) -> torch.Tensor:
    """One input of logical `shape`, laid out as the view kinds say."""
    shape = tuple(shape)
    match shape_kind:
        case "expanded":
            d = 0 if shape and shape[0] != 1 else len(shape) - 1
            small = tuple(1 if i == d else s for i, s in enumerate(shape))
            return draw(domain, dtype, small, g).expand(shape)
        case "noncontig":
            if len(shape) == 1:
                return draw(domain, dtype, (2 * shape[0],), g)[::2]
            rev = tuple(reversed(range(len(shape))))
            return draw(domain, dtype, tuple(reversed(shape)), g).permute(rev)
    raise ValueError(f"unknown view shape kind {shape_kind!r}")


def shaped(*shapes: Sequence[int], domain: str = "any") -> MakeInputs:
    """Inputs of the given logical shapes, laid out by the view shape kinds."""

    def make(dtype: torch.dtype, shape_kind: str, g: torch.Generator) -> tuple[torch.Tensor, ...]:
        return tuple(_strided(s, domain, dtype, shape_kind, g) for s in shapes)

    return make


VIEW_KINDS = ("expanded", "noncontig")
VIEW_DTYPES = (F32, I32)


def _v(name: str, fn: Callable[..., Any], shapes: Sequence[Sequence[int]], *targets: Any,
       dtypes: tuple[torch.dtype, ...] = VIEW_DTYPES) -> OpCase:
    return OpCase(name, fn, shaped(*shapes), dtypes, targets, VIEW_KINDS)


def _twice(fn: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    """`x -> fn(x) * 2` (each output of a tuple-valued view)."""

    def run(x: torch.Tensor) -> Any:
        out = fn(x)
        return tuple(o * 2 for o in out) if isinstance(out, (tuple, list)) else out * 2

    return run


VIEW_CASES: list[OpCase] = [
    # view / reshape: the graph holds aten.view when the layout allows a view, else
    # clone + _unsafe_view; both are index remaps
    _v("view_split_dim0", _twice(lambda x: x.view(2, 2, 6)), [(4, 6)], aten.view, dtypes=(F32, I32, BOOL)),
    _v("view_split_dim1", _twice(lambda x: x.view(4, 2, 3)), [(4, 6)], aten.view),
    _v("view_infer_minus_one", _twice(lambda x: x.view(2, -1, 6)), [(4, 6)], aten.view),
    _v("reshape_merge", _twice(lambda x: x.reshape(6, 4)), [(2, 3, 4)]),
    _v("reshape_neither_split_nor_merge", _twice(lambda x: x.reshape(6, 4)), [(4, 6)]),
    _v("reshape_flatten", _twice(lambda x: x.reshape(-1)), [(4, 6)], dtypes=(F32, I64, F16)),
    _v("reshape_to_0d", _twice(lambda x: x.reshape(())), [(1, 1)]),
    _v("reshape_from_0d", _twice(lambda x: x.reshape(1, 1)), [()]),
    _v("reshape_merge_split", _twice(lambda x: x.reshape(3, 8)), [(2, 3, 4)]),
    _v("unsafe_view", _twice(lambda x: torch.ops.aten._unsafe_view(x.contiguous(), [3, 2, 4])), [(4, 6)],
       aten._unsafe_view),
    # permutations
    _v("permute", _twice(lambda x: x.permute(2, 0, 1)), [(2, 3, 4)], aten.permute),
    _v("permute_negative_dims", _twice(lambda x: x.permute(-1, -3, -2)), [(2, 3, 4)], aten.permute),
    _v("transpose", _twice(lambda x: x.transpose(0, -1)), [(2, 3, 4)], aten.transpose),
    _v("t", _twice(lambda x: x.t()), [(4, 6)], aten.t, dtypes=(F32, I32, BOOL)),
    _v("t_1d", _twice(lambda x: x.t()), [(5,)], aten.t),
    # broadcasting views
    _v("expand", _twice(lambda x: x.expand(3, 4, 6)), [(4, 1)], aten.expand),
    _v("expand_minus_one", _twice(lambda x: x.expand(2, -1, 6)), [(4, 1)], aten.expand),
    _v("expand_as", lambda x, y: x.expand_as(y) + y, [(4, 1), (4, 6)], aten.expand),
    _v("unsqueeze_last", _twice(lambda x: x.unsqueeze(-1)), [(4, 6)], aten.unsqueeze),
    _v("unsqueeze_broadcast", lambda x, y: x.unsqueeze(1) + y, [(4, 6), (5, 6)], aten.unsqueeze),
    _v("squeeze_all", _twice(lambda x: x.squeeze()), [(1, 4, 1, 3)], aten.squeeze),
    _v("squeeze_dim", _twice(lambda x: x.squeeze(-2)), [(1, 4, 1, 3)], aten.squeeze),
    _v("squeeze_dim_not_one", _twice(lambda x: x.squeeze(1)), [(1, 4, 1, 3)], aten.squeeze),
    _v("squeeze_dims", _twice(lambda x: x.squeeze((0, 2, 3))), [(1, 4, 1, 3)], aten.squeeze),
    # slices and selects
    _v("slice_step", _twice(lambda x: x[:, 1::2]), [(4, 6)], aten.slice, dtypes=(F32, I32, BOOL)),
    _v("slice_negative_start_end", _twice(lambda x: x[-3:-1]), [(4, 6)], aten.slice),
    _v("slice_end_beyond_size", _twice(lambda x: x[:, 2:100]), [(4, 6)], aten.slice),
    _v("slice_negative_start_step", _twice(lambda x: x[:, -5::3]), [(4, 6)], aten.slice),
    _v("slice_empty", _twice(lambda x: x[3:1]), [(4, 6)], aten.slice),
    _v("narrow", _twice(lambda x: x.narrow(1, 1, 3)), [(4, 6)], aten.slice),
    _v("select", _twice(lambda x: x.select(1, 2)), [(2, 3, 4)], aten.select),
    _v("select_negative_index", _twice(lambda x: x[:, -1]), [(4, 6)], aten.select),
    _v("alias", _twice(torch.ops.aten.alias), [(4, 6)], aten.alias),
    # several outputs
    _v("split", _twice(lambda x: x.split(4, 1)), [(4, 6)], aten.split),
    _v("split_with_sizes", _twice(lambda x: x.split([1, 3], 0)), [(4, 6)], aten.split_with_sizes),
    _v("unbind", _twice(lambda x: x.unbind(1)), [(2, 3, 4)], aten.unbind),
    _v("chunk", _twice(lambda x: x.chunk(3, -1)), [(4, 6)], aten.split),
    # views of views, and of strided windows
    _v("views_of_views", _twice(lambda x: x.t()[1:, ::2].unsqueeze(0).expand(2, 5, 2)), [(2, 6)]),
    _v("view_of_slice", _twice(lambda x: x[:, 2:].reshape(-1)), [(4, 6)]),
    _v("select_of_permute", _twice(lambda x: x.permute(1, 2, 0)[1]), [(2, 3, 4)], aten.permute, aten.select),
    _v("diagonal", _twice(lambda x: x.diagonal()), [(4, 6)], aten.diagonal),
    _v("diagonal_offset_dims", _twice(lambda x: x.diagonal(-1, 2, 0)), [(4, 3, 5)], aten.diagonal),
    _v("unfold", _twice(lambda x: x.unfold(1, 3, 2)), [(4, 7)], aten.unfold),
    # the functional *_copy variants (torch.export): a remap and a copy that inlines
    _v("permute_copy", _twice(lambda x: torch.ops.aten.permute_copy(x, [1, 0])), [(4, 6)], aten.permute_copy),
    _v("slice_copy", _twice(lambda x: torch.ops.aten.slice_copy(x, 1, 1, 5, 2)), [(4, 6)], aten.slice_copy),
    _v("select_copy", _twice(lambda x: torch.ops.aten.select_copy(x, 0, -2)), [(4, 6)], aten.select_copy),
    _v("expand_copy", _twice(lambda x: torch.ops.aten.expand_copy(x, [3, 4, 6])), [(4, 1)], aten.expand_copy),
    _v("unsqueeze_copy", _twice(lambda x: torch.ops.aten.unsqueeze_copy(x, 1)), [(4, 6)], aten.unsqueeze_copy),
    _v("split_copy", _twice(lambda x: torch.ops.aten.split_copy(x, 2, 1)), [(4, 6)], aten.split_copy),
]


# ---- decompositions ------------------------------------------------------------------------
# Ops with no lowering of their own, which `lower` decomposes (torch._decomp) into
# pointwise ops and reductions, plus the prims that torch._refs decompositions emit.
# As for reductions, `s = x + y` is a (4, 5, 6) broadcast or a (4, 6) sum of
# non-contiguous inputs; parameters of the last dim's size come from rows of y.
# DECOMP_EXTERNS names the Extern kernels a case may keep (none now: nll_loss's
# gather is an IndirectLoad and its backward's scatter a pointwise where, see
# INDIRECT_CASES).

def _d(name: str, fn: Callable[..., Any], dtypes: tuple[torch.dtype, ...], *targets: Any,
       domain: str = "any", n: int = 2) -> OpCase:
    return OpCase(name, fn, tensors(*([domain] * n)), dtypes, targets, ("broadcast", "noncontig"))


def _logits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(x + y) as a (batch, classes) matrix: nll_loss's 2-d form."""
    s = x + y
    return s.reshape(-1, s.shape[-1])


def _target_of(s: torch.Tensor) -> torch.Tensor:
    """Class indices for the rows of `s`, computed in the graph from its first column."""
    return (s[:, 0].abs() * 100).to(torch.int64) % s.shape[1]


def _nll(reduction: str, ignore_index: int = -100) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        s = _logits(x, y)
        return F.nll_loss(s.log_softmax(1), _target_of(s), reduction=reduction, ignore_index=ignore_index)

    return fn


def _layer_norm_backward(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = x + y
    w, b = y[0] * 0.5 + 1, y[-1]
    out, mean, rstd = torch.ops.aten.native_layer_norm(s, [s.shape[-1]], w, b, 1e-5)
    return torch.ops.aten.native_layer_norm_backward(out * x, s, [s.shape[-1]], mean, rstd, w, b, [True, True, True])


def _nll_backward(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = _logits(x, y).log_softmax(1)
    t = _target_of(s)
    total = torch.scalar_tensor(float(t.numel()), dtype=s.dtype)
    return torch.ops.aten.nll_loss_backward(torch.scalar_tensor(0.5, dtype=s.dtype), s, t, None, 1, -100, total)


def _group_norm(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = (x + y).reshape(2, 6, -1)  # (N, C, L): 2 groups of 3 channels
    c = torch.arange(6, dtype=s.dtype)
    return torch.nn.functional.group_norm(s, 2, c * 0.1 + 1, c - 2)


def _batch_norm_eval(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = (x + y).reshape(2, 6, -1)
    c = torch.arange(6, dtype=s.dtype)
    return torch.nn.functional.batch_norm(s, c * 0.1, c * 0.2 + 0.5, c - 1, c * 0.3, training=False)


def _batch_norm_legit_eval(x: torch.Tensor, y: torch.Tensor) -> Any:
    s = (x + y).reshape(2, 6, -1)
    c = torch.arange(6, dtype=s.dtype)
    # only the output: eager's saved stats are empty in eval, the decomposition's are not
    return torch.ops.aten._native_batch_norm_legit_no_training(s, c - 1, c * 0.3, c * 0.1, c * 0.2 + 0.5, 0.1, 1e-5)[0]


F = torch.nn.functional
prims = torch.ops.prims

DECOMP_CASES: list[OpCase] = [
    # softmax family, forward and backward
    _d("softmax", lambda x, y: torch.softmax(x + y, -1), (F32, F16), aten._softmax),
    _d("softmax_dim0", lambda x, y: torch.softmax(x + y, 0), (F32, BF16), aten._softmax),
    _d("softmax_half_to_float", lambda x, y: torch.softmax(x + y, -1, dtype=torch.float32), (F16, BF16),
       aten._softmax),
    _d("log_softmax", lambda x, y: torch.log_softmax(x + y, -1), (F32, F16), aten._log_softmax),
    _d("log_softmax_dim0", lambda x, y: torch.log_softmax(x + y, 0), (F32, F64), aten._log_softmax),
    _d("softmax_backward", lambda x, y: torch.ops.aten._softmax_backward_data(x + y, (x * y).softmax(-1), -1, x.dtype),
       (F32, F64), aten._softmax_backward_data),
    _d("log_softmax_backward",
       lambda x, y: torch.ops.aten._log_softmax_backward_data(x + y, (x * y).log_softmax(-1), -1, x.dtype),
       (F32, F64), aten._log_softmax_backward_data),
    _d("logsumexp", lambda x, y: torch.logsumexp(x + y, -1), (F32, F64), aten.logsumexp),
    # norms
    _d("layer_norm", lambda x, y: F.layer_norm(x + y, (y.shape[-1],), y[0], y[-1]), (F32, F16),
       aten.native_layer_norm),
    _d("layer_norm_no_affine_two_dims", lambda x, y: F.layer_norm(x + y, (x + y).shape[-2:]), (F32, BF16),
       aten.native_layer_norm),
    _d("native_layer_norm_outputs",
       lambda x, y: torch.ops.aten.native_layer_norm(x + y, [y.shape[-1]], y[0], None, 1e-3),
       (F32, F64), aten.native_layer_norm),
    _d("layer_norm_backward", _layer_norm_backward, (F32, F64), aten.native_layer_norm_backward),
    _d("group_norm", _group_norm, (F32, F64), aten.native_group_norm),
    _d("batch_norm_eval", _batch_norm_eval, (F32, F64), aten.native_batch_norm),
    _d("batch_norm_legit_no_training", _batch_norm_legit_eval, (F32, F64), aten._native_batch_norm_legit_no_training),
    _d("vector_norm", lambda x, y: torch.linalg.vector_norm(x + y, 2, -1), (F32, F64), aten.linalg_vector_norm),
    _d("std_mean_decomposed", lambda x, y: torch.std_mean(x + y, (0, -1), correction=0), (F32, F64), aten.std_mean),
    # activations and their backward ops
    # (the backward ops take a gradient and an input of one shape: x + y and x * y)
    _d("gelu_backward", lambda x, y: torch.ops.aten.gelu_backward(x + y, x * y), (F32, F64), aten.gelu_backward),
    _d("gelu_tanh_backward", lambda x, y: torch.ops.aten.gelu_backward(x + y, x * y, approximate="tanh"), (F32, F64),
       aten.gelu_backward),
    _d("silu_backward", lambda x, y: torch.ops.aten.silu_backward(x + y, x * y), (F32, F16), aten.silu_backward),
    _d("sigmoid_backward", lambda x, y: torch.ops.aten.sigmoid_backward(x + y, (x * y).sigmoid()), (F32, F64),
       aten.sigmoid_backward),
    _d("tanh_backward", lambda x, y: torch.ops.aten.tanh_backward(x + y, (x * y).tanh()), (F32, F64),
       aten.tanh_backward),
    _d("threshold_backward", lambda x, y: torch.ops.aten.threshold_backward(x + y, x * y, 0.0), (F32, F64),
       aten.threshold_backward),
    _d("hardtanh", lambda x, y: F.hardtanh(x + y, -1.0, 1.5), (F32, BF16), aten.hardtanh),
    _d("leaky_relu", lambda x, y: F.leaky_relu(x + y, 0.1), (F32, F16), aten.leaky_relu),
    _d("elu", lambda x, y: F.elu(x + y), (F32, F64), aten.elu),
    _d("softplus", lambda x, y: F.softplus(x + y), (F32, F64), aten.softplus),
    _d("mish", lambda x, y: F.mish(x + y), (F32, F64), aten.mish),
    _d("logsigmoid", lambda x, y: F.logsigmoid(x + y), (F32, F64), aten.log_sigmoid_forward),
    _d("hardswish", lambda x, y: F.hardswish(x + y), (F32, F64), aten.hardswish),
    _d("hardsigmoid", lambda x, y: F.hardsigmoid(x + y), (F32, F64), aten.hardsigmoid),
    # losses
    _d("mse_loss", lambda x, y: F.mse_loss(x + y, x * y), (F32, F64), aten.mse_loss),
    _d("mse_loss_sum", lambda x, y: F.mse_loss(x + y, x * y, reduction="sum"), (F32, F64), aten.mse_loss),
    _d("mse_loss_none", lambda x, y: F.mse_loss(x + y, x * y, reduction="none"), (F32, BF16), aten.mse_loss),
    _d("nll_loss", _nll("mean"), (F32, F64), aten.nll_loss_forward),
    _d("nll_loss_sum_ignore_index", _nll("sum", ignore_index=1), (F32, F64), aten.nll_loss_forward),
    _d("nll_loss_none", _nll("none"), (F32, F64), aten.nll_loss_forward),
    _d("nll_loss_backward", _nll_backward, (F32, F64), aten.nll_loss_backward),
    # elementwise composites
    _d("addcmul", lambda x, y: torch.addcmul(x, y, x * y, value=0.5), (F32, F16), aten.addcmul),
    _d("addcdiv", lambda x, y: torch.addcdiv(x, y, x.abs() + 1, value=2), (F32, F64), aten.addcdiv),
    _d("lerp", lambda x, y: torch.lerp(x, y, 0.3), (F32, F64), aten.lerp),
    _d("masked_fill", lambda x, y: (x + y).masked_fill(x > y, -1.5), (F32, I32), aten.masked_fill),
    _d("xlogy", lambda x, y: torch.xlogy(x, y), (F32, F64), aten.xlogy, domain="positive"),
    _d("flip", lambda x, y: (x + y).flip(0, -1), (F32, I32), aten.flip),
    _d("copy", lambda x, y: torch.ops.aten.copy(x * y, y.to(torch.float64)), (F32, I32), aten.copy),
    # _to_copy: dtype casts (with a reduction after, which must read the cast inline)
    _d("to_copy_float64_sum", lambda x, y: (x + y).to(torch.float64).sum(-1), (F32, F16), aten._to_copy),
    _d("to_copy_half", lambda x, y: (x + y).to(torch.float16), (F32, I32), aten._to_copy),
    _d("to_copy_int_to_bool", lambda x, y: (x * y).to(torch.bool), (F32, I64), aten._to_copy),
    _d("to_copy_same_dtype", lambda x, y: (x + y).to(x.dtype, copy=True), (F32, BF16), aten._to_copy),
    # prims, called directly (torch._refs decompositions emit them)
    _d("prims_broadcast_in_dim_new_dim", lambda x, y: prims.broadcast_in_dim(y, [3, *y.shape], [1, 2]) * 2,
       (F32, I32), prims.broadcast_in_dim),
    _d("prims_broadcast_in_dim_grow", lambda x, y: prims.broadcast_in_dim(x, (x + y).shape, range(x.dim())) + y,
       (F32, I32), prims.broadcast_in_dim),
    _d("prims_sum", lambda x, y: prims.sum(x + y, [0, (x + y).dim() - 1]), (F32, F64), prims.sum),
    _d("prims_prod_amax_amin", lambda x, y: (prims.prod(x * y, [0]), prims.amax(x + y, [0]), prims.amin(x + y, [1])),
       (F32, I64), prims.prod, prims.amax, prims.amin, domain="nonzero"),
    _d("prims_var", lambda x, y: prims.var(x + y, [0], 0.0), (F32, F64), prims.var),
    _d("prims_var_correction1_all", lambda x, y: prims.var(x + y, range((x + y).dim()), 1.0), (F32, F64), prims.var),
    # 3 - 7x over x has negative, inexact quotients: C division truncates, floor would not
    _d("prims_div", lambda x: prims.div(3 - x * 7, x), (F32, I32), prims.div, domain="nonzero", n=1),
    _d("prims_where", lambda x: prims.where(x > 0, x * 2, x - 1), (F32, I32), prims.where, n=1),
    _d("prims_squeeze", lambda x, y: prims.squeeze((x + y)[None, ..., None], [0, (x + y).dim() + 1]) * 2, (F32, I32),
       prims.squeeze),
    _d("prims_collapse_view_split_dim",
       lambda x, y: prims.split_dim(prims.collapse_view((x + y).contiguous(), 0, 1), 0, 2) * 2,
       (F32, I32), prims.collapse_view, prims.split_dim),
    _d("prims_collapse", lambda x, y: prims.collapse(x + y, 0, 1) * 2, (F32, I32), prims.collapse),
    _d("prims_transpose_rev", lambda x, y: prims.rev(prims.transpose(x + y, [1, 0, *range(2, (x + y).dim())]), [0]),
       (F32, I32), prims.transpose, prims.rev),
    _d("prims_elementwise", lambda x: prims.mul(prims.exp(prims.neg(x)), prims.sub(x, prims.abs(x))), (F32, F64),
       prims.mul, prims.exp, prims.neg, prims.sub, prims.abs, n=1),
    _d("prims_compare", lambda x: prims.lt(prims.maximum(x, x * 0.5), prims.minimum(x, x * 2.0)), (F32, F64),
       prims.lt, prims.maximum, prims.minimum, n=1),
]

DECOMP_EXTERNS: dict[str, frozenset[str]] = {}


# ---- indirect reads ----------------------------------------------------------------------------
# gather, index.Tensor, index_select and embedding read their source at positions
# held in index tensors: one pointwise node with an IndirectLoad each, never an
# Extern.  The source is computed in the graph (so it is inlined into the read) or
# an input; shape kinds lay the source out contiguous, transposed or expanded along
# its last dim (read at stride 0).  Index tensors are int64 (int32 where named),
# drawn in range, negative ones where aten allows them.

INDIRECT_KINDS = ("contiguous", "noncontig", "expanded")


def _source(shape: Sequence[int], dtype: torch.dtype, shape_kind: str, g: torch.Generator) -> torch.Tensor:
    if shape_kind == "contiguous":
        return draw("any", dtype, shape, g)
    if shape_kind == "expanded":  # stride 0 along the last dim: an indexed dim of some cases
        return draw("any", dtype, (*shape[:-1], 1), g).expand(*shape)
    rev = tuple(reversed(range(len(shape))))
    return draw("any", dtype, tuple(reversed(shape)), g).permute(rev)


def indexed(source: Sequence[int], *index: tuple[Sequence[int], int, int, torch.dtype]) -> MakeInputs:
    """A source of shape `source`, then one index tensor per (shape, low, high, dtype)."""

    def make(dtype: torch.dtype, shape_kind: str, g: torch.Generator) -> tuple[torch.Tensor, ...]:
        x = _source(source, dtype, shape_kind, g)
        return (x, *(torch.randint(lo, hi, tuple(s), generator=g).to(dt) for s, lo, hi, dt in index))

    return make


def _i(name: str, fn: Callable[..., Any], make: MakeInputs, *targets: Any,
       dtypes: tuple[torch.dtype, ...] = (F32, I64, BF16)) -> OpCase:
    return OpCase(name, fn, make, dtypes, targets, INDIRECT_KINDS)


def _log_softmax_gather(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """nll_loss's core: the log-softmax is read only where the targets point."""
    return torch.gather(x.float().log_softmax(-1), 1, t[:, None]).squeeze(1)


INDIRECT_CASES: list[OpCase] = [
    _i("gather_dim0", lambda x, i: torch.gather(x * 2, 0, i), indexed((5, 6), ((3, 6), 0, 5, I64)), aten.gather),
    _i("gather_dim1", lambda x, i: torch.gather(x + x, 1, i), indexed((5, 6), ((5, 4), 0, 6, I64)), aten.gather),
    _i("gather_last_3d", lambda x, i: torch.gather(x, -1, i) * 3, indexed((2, 5, 6), ((2, 4, 3), 0, 6, I64)),
       aten.gather),
    _i("index_one_tensor_negative", lambda x, i: (x * 3)[i], indexed((5, 6), ((4,), -5, 5, I64)), aten.index),
    _i("index_two_tensors_broadcast", lambda x, i, j: x[i, j] + 1,
       indexed((5, 6), ((4, 1), -5, 5, I64), ((3,), -6, 6, I64)), aten.index),
    _i("index_int32", lambda x, i: x[i] * 2, indexed((5, 6), ((2, 3), -5, 5, I32)), aten.index),
    _i("index_slice_before", lambda x, i: x[:, i], indexed((5, 6, 7), ((2, 3), -6, 6, I64)), aten.index),
    _i("index_slice_between", lambda x, i, j: x[i, :, j], indexed((5, 6, 7), ((3,), 0, 5, I64), ((3,), -7, 7, I64)),
       aten.index),
    _i("index_then_slice", lambda x, i: x[i, 1:4] - 1, indexed((5, 6), ((3,), 0, 5, I64)), aten.index),
    _i("index_none_entry", lambda x, i: x[None, :, i], indexed((5, 6), ((4,), 0, 6, I64)), aten.index),
    _i("index_select", lambda x, i: torch.index_select(x, 1, i) * 2, indexed((5, 6), ((4,), 0, 6, I64)),
       aten.index_select),
    _i("embedding", lambda w, i: F.embedding(i, w * 2), indexed((10, 4), ((3, 5), 0, 10, I64)), aten.embedding),
    _i("embedding_int32", lambda w, i: F.embedding(i, w), indexed((10, 4), ((7,), 0, 10, I32)), aten.embedding),
    _i("log_softmax_gather", _log_softmax_gather, indexed((8, 10), ((8,), 0, 10, I64)), aten.gather,
       dtypes=(F32, BF16)),
    _i("cross_entropy", lambda x, t: F.cross_entropy(x.float(), t), indexed((8, 10), ((8,), 0, 10, I64)),
       aten.nll_loss_forward, dtypes=(F32, F16)),
    # scatter that writes one element per row: a where comparing positions, no Extern
    _i("scatter_value_one_per_row", lambda x, i: torch.scatter(x * 2, 1, i, -1.5),
       indexed((5, 6), ((5, 1), 0, 6, I64)), aten.scatter, dtypes=(F32, I64, BF16)),
    _i("scatter_src_dim0", lambda x, i: torch.scatter(x, 0, i, x + 1), indexed((5, 6), ((1, 6), 0, 5, I64)),
       aten.scatter),
]


def check_case_buffers(case: OpCase, shape_kind: str, dtype: torch.dtype, seed: int = 0) -> tuple[Checked, BufferGraph]:
    """check_case through lower + realize + the reference interpreter (the "buffers"
    runner), also returning the BufferGraph it ran, for tests that inspect the IR."""
    kept: list[BufferGraph] = []

    def runner(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        kept.append(buffer_graph(gm, inputs))
        return run_buffers(kept[-1], inputs)

    checked = check_case(case, shape_kind, dtype, runner, seed)
    return checked, kept[-1]


def combinations(cases: Sequence[OpCase]) -> list[tuple[OpCase, str, torch.dtype]]:
    """(case, shape kind, dtype) for every combination a table lists: parametrize
    with these and `ids=combination_id`."""
    return [(c, kind, dt) for c in cases for kind in c.shape_kinds for dt in c.dtypes]


def combination_id(value: Any) -> str | None:
    """A pytest id part: the case's name, the shape kind, the dtype without "torch."."""
    if isinstance(value, OpCase):
        return value.name
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return None
