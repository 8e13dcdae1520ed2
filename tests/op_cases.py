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


def compiled_runner(target: str) -> Runner:
    """The whole pipeline for `target`, then a call of the compiled function."""

    def run(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        import coil

        return tuple(coil.compile_graph(gm, inputs, Options(target=target))(*inputs))

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
