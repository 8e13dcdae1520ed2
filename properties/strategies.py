"""Hypothesis strategies for coil: `graphs()` draws a random FX graph of aten ops and
example inputs to run it on.

    @given(graphs(max_nodes=6, dtypes=(torch.float32,)))
    def test_my_pass(drawn):
        out = my_compile(drawn.gm, drawn.inputs)(*drawn.inputs)
        assert_matches_eager(drawn, out)

What is drawn (see families.py for the op tables):
- inputs: up to `max_inputs` tensors whose shapes are right-aligned suffixes of one
  base shape with some dims set to 1, so most values broadcast together; each may be
  passed non-contiguous (a transpose, a strided or offset slice, an expand);
- instructions: up to `max_nodes`, each one aten op (pointwise of every arity,
  reductions over random dims with and without keepdim, views, casts, creation ops,
  and ops coil leaves to Extern calls) on earlier values, plus the guards that keep
  its operands in its domain (a clamp, `abs(x) + 1`), so an instruction adds at
  most five FX nodes;
- outputs: every value no op reads (so nothing drawn is dead code) and up to two
  more (an intermediate that is also read, an input, a view).

The program is a list of drawn instructions, so hypothesis shrinks a failure
toward fewer instructions, simpler ops (each table starts with its simplest op),
smaller shapes, contiguous inputs and float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import hypothesis.strategies as st
import torch
import torch.fx
from hypothesis import reject

from coil.options import Options
from coil.properties.builder import GraphBuilder, Rejected, Value, is_float, is_int
from coil.properties.compare import assert_matches_eager, mismatch
from coil.properties.families import OTHER, POINTWISE, Config, Family, binary, reduction, unary, view

__all__ = ["DrawnGraph", "InputSpec", "assert_matches_eager", "graphs", "input_specs", "mismatch"]

DEFAULT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
LAYOUTS = ("contiguous", "transposed", "strided", "offset", "expanded")
PROFILES = ("normal", "rounded", "positive", "wide")


# ---- inputs ------------------------------------------------------------------------------------


@attrs.frozen
class InputSpec:
    """How one example input is made: logical shape and dtype, how it sits in its
    storage (`layout` along `layout_dims`), and where its values come from."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str = attrs.field(validator=attrs.validators.in_(LAYOUTS))
    layout_dims: tuple[int, ...]
    profile: str = attrs.field(validator=attrs.validators.in_(PROFILES))
    seed: int

    def describe(self) -> str:
        how = self.layout if not self.layout_dims else f"{self.layout}{self.layout_dims}"
        return f"{how}, {self.profile} values (seed {self.seed})"


def _values(shape: Sequence[int], dtype: torch.dtype, profile: str, seed: int) -> torch.Tensor:
    """Contiguous values of a profile: `rounded` gives exact halves and many ties
    (argmax tie-breaks, round-half-even), `positive` stays in [0.5, 2.5], `wide`
    reaches +-100."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if is_int(dtype):
        lo, hi = {"normal": (-5, 6), "rounded": (-2, 3), "positive": (1, 9), "wide": (-100, 101)}[profile]
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    match profile:
        case "rounded":
            x = torch.round(x * 4) / 2
        case "positive":
            x = torch.rand(shape, generator=g, dtype=torch.float64) * 2 + 0.5
        case "wide":
            x = x * 30
    return x.to(dtype)


def materialize(spec: InputSpec, device: str = "cpu") -> torch.Tensor:
    """The tensor a spec describes, laid out in its storage as the spec says."""
    shape = list(spec.shape)
    match spec.layout:
        case "transposed":
            i, j = spec.layout_dims
            shape[i], shape[j] = shape[j], shape[i]
            return _values(shape, spec.dtype, spec.profile, spec.seed).to(device).transpose(i, j)
        case "strided" | "offset":
            (d,) = spec.layout_dims
            index: list[Any] = [slice(None)] * len(shape)
            if spec.layout == "strided":
                shape[d] = 2 * shape[d]
                index[d] = slice(None, None, 2)
            else:
                shape[d] += 1
                index[d] = slice(1, None)
            return _values(shape, spec.dtype, spec.profile, spec.seed).to(device)[tuple(index)]
        case "expanded":
            (d,) = spec.layout_dims
            shape[d] = 1
            return _values(shape, spec.dtype, spec.profile, spec.seed).to(device).expand(spec.shape)
    return _values(shape, spec.dtype, spec.profile, spec.seed).to(device)


def _layout_dims(shape: Sequence[int]) -> dict[str, list[tuple[int, ...]]]:
    """For each layout, the dims it can apply to in `shape` (none: not applicable)."""
    n = len(shape)
    return {
        "contiguous": [()],
        "transposed": [(i, j) for i in range(n) for j in range(i + 1, n) if shape[i] > 1 or shape[j] > 1],
        "strided": [(d,) for d in range(n)],
        "offset": [(d,) for d in range(n)],
        "expanded": [(d,) for d in range(n) if shape[d] > 1],
    }


def _layout(draw: st.DrawFn, shape: Sequence[int], layouts: Sequence[str] = LAYOUTS) -> tuple[str, tuple[int, ...]]:
    """A layout (equally likely among those of `layouts` that apply), then its dims."""
    choices = {k: v for k, v in _layout_dims(shape).items() if v and k in layouts}
    layout = draw(st.sampled_from(tuple(choices)))
    return layout, draw(st.sampled_from(choices[layout]))


def _mostly(draw: st.DrawFn, n: int) -> int:
    """n three times in four, else 0..n; shrinks toward n.  (integers() alone
    favours its ends: 0 would be as common as n.)"""
    if n > 0 and draw(st.booleans()) and draw(st.booleans()):
        return draw(st.integers(0, n))
    return n


@st.composite
def input_specs(draw: st.DrawFn, max_inputs: int = 3, max_rank: int = 3, max_dim: int = 6,
                dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES, noncontiguous: bool = True,
                min_dim: int = 1, layouts: Sequence[str] = LAYOUTS) -> tuple[InputSpec, ...]:
    """Specs of 1..max_inputs inputs: suffixes of one base shape, some dims 1; most
    share one dtype, some another (so promotion is drawn too).  The base shape's
    dims are at least `min_dim` (symbolic draws ask for 2: a dim of size 1 stays
    static); an input's own dims may still be 1, to broadcast.  Non-contiguous
    inputs take one of `layouts`."""
    # most graphs get the full rank (their dims still shrink to 1), few are scalars
    # with nothing to reduce
    rank = _mostly(draw, max_rank)
    base = [draw(st.integers(min_dim, max_dim)) for _ in range(rank)]
    main = draw(st.sampled_from(tuple(dtypes)))
    specs = []
    for _ in range(draw(st.integers(1, max_inputs))):
        own = base[rank - _mostly(draw, rank) :]
        shape = tuple(own)
        if len(own) > 0 and draw(st.booleans()):  # some dims 1: broadcast against the others
            shape = tuple(1 if draw(st.booleans()) else s for s in own)
        dtype = draw(st.sampled_from(tuple(dtypes))) if draw(st.booleans()) else main
        layout, dims = _layout(draw, shape, layouts) if noncontiguous else ("contiguous", ())
        profile = draw(st.sampled_from(PROFILES))
        specs.append(InputSpec(shape, dtype, layout, dims, profile, draw(st.integers(0, 2**16 - 1))))
    return tuple(specs)


# ---- the drawn graph ---------------------------------------------------------------------------


@attrs.frozen(eq=False, repr=False)
class DrawnGraph:
    """A drawn FX graph of aten ops and the inputs to run it on.  A graph traced
    with symbolic sizes (symbolic.py) also takes sizes: an int input's spec is
    the int itself."""

    gm: torch.fx.GraphModule
    inputs: tuple[Any, ...]  # tensors, and ints for the SymInt placeholders of a symbolic graph
    specs: tuple[InputSpec | int, ...]
    instructions: tuple[str, ...]  # the drawn instruction families, in order

    @property
    def code(self) -> str:
        """The FX graph's Python code (a reproducer's core)."""
        return self.gm.code

    def describe(self) -> str:
        """One line per input: name, dtype, shape, strides, offset and how it was made."""
        return "\n".join(
            f"{name}: size {t}" if not isinstance(spec, InputSpec) else
            f"{name}: {str(t.dtype).removeprefix('torch.')}{list(t.shape)} stride={tuple(t.stride())} "
            f"offset={t.storage_offset()}  ({spec.describe()})"
            for name, t, spec in zip(self.input_names, self.inputs, self.specs)
        )

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.gm.graph.nodes if n.op == "placeholder")

    def fresh_inputs(self) -> tuple[Any, ...]:
        """The inputs made again from their specs: what `inputs` held before any
        compiled code ran on them."""
        return tuple(materialize(s, str(t.device)) if isinstance(s, InputSpec) else s
                     for s, t in zip(self.specs, self.inputs))

    def eager(self) -> tuple[Any, ...]:
        """Eager PyTorch's outputs, on fresh inputs."""
        return tuple(self.gm(*self.fresh_inputs()))

    def eager_float64(self) -> tuple[Any, ...] | None:
        """The graph run with float inputs in float64, and float64 the default dtype
        (so an int input's reciprocal is computed in float64 too): the yardstick for
        how far a low-precision result may stray.  None when the graph does not run
        so."""
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return tuple(self.gm(*[t.to(torch.float64) if isinstance(t, torch.Tensor) and is_float(t.dtype) else t
                                   for t in self.fresh_inputs()]))
        except RuntimeError:
            return None
        finally:
            torch.set_default_dtype(before)

    def reproducer(self, options: Options | None = None) -> str:
        """A self-contained script that rebuilds the graph and inputs and compares
        coil (compiled with `options`, default the reference target) with eager."""
        from coil.properties.repro import reproducer

        return reproducer(self, options or Options(target="reference"))

    def __repr__(self) -> str:
        return f"DrawnGraph(\n{self.describe()}\n{self.code.strip()}\n)"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """How hypothesis prints a falsifying example: inputs and graph code."""
        p.text(repr(self))


def _families(allow_reductions: bool, allow_views: bool) -> tuple[Family, ...]:
    """The families to draw from, each as often as it has ops to offer: unary,
    binary, reductions and views stand for many ops each.  Pointwise families come
    first, where shrinking moves."""
    fams: tuple[Family, ...] = (unary, binary, unary, binary) + POINTWISE[2:] + (unary, binary)
    if allow_reductions:
        fams += (reduction,) * 4
    if allow_views:
        fams += (view,) * 3
    return fams + OTHER


def _outputs(draw: st.DrawFn, b: GraphBuilder) -> list[Value]:
    """Every value nothing reads (so no drawn op is dead code), and up to two more:
    an intermediate that is also read, an input, a view, or a repeat."""
    sinks = b.sinks() or [b.values[-1]]
    extra = draw(st.lists(st.integers(0, len(b.values) - 1), max_size=2))
    return sinks + [b.values[i] for i in extra]


@st.composite
def _graphs(draw: st.DrawFn, cfg: Config, max_nodes: int, max_inputs: int, families: tuple[Family, ...],
            noncontiguous: bool, min_dim: int = 1, layouts: Sequence[str] = LAYOUTS) -> DrawnGraph:
    specs = draw(input_specs(max_inputs, cfg.max_rank, cfg.max_dim, cfg.dtypes, noncontiguous, min_dim, layouts))
    b = GraphBuilder()
    for spec in specs:
        b.placeholder(materialize(spec, cfg.device))
    try:
        for _ in range(draw(st.integers(1, max_nodes))):
            family = draw(st.sampled_from(families))
            b.instructions.append(family.__name__.rstrip("_"))
            family(draw, b, cfg)
    except Rejected:
        reject()
    b.output(_outputs(draw, b))
    return DrawnGraph(b.module(), tuple(b.inputs), specs, tuple(b.instructions))


def graphs(max_nodes: int = 8, max_inputs: int = 3, max_rank: int = 3, max_dim: int = 6,
           dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES, allow_reductions: bool = True,
           allow_views: bool = True, *, noncontiguous_inputs: bool = True,
           device: str = "cpu") -> st.SearchStrategy[DrawnGraph]:
    """Random FX graphs of aten ops with example inputs (see the module docstring).

    max_nodes bounds the drawn instructions (each adds one op node and at most
    four guard nodes), max_rank and max_dim the shapes, `dtypes` the input and
    cast dtypes (floats and int32/int64; float16/bfloat16 compare with looser
    tolerances)."""
    if max_nodes < 1 or max_inputs < 1 or max_dim < 1 or max_rank < 0:
        raise ValueError("graphs() needs max_nodes, max_inputs, max_dim >= 1 and max_rank >= 0")
    if not dtypes:
        raise ValueError("graphs() needs at least one dtype")
    cfg = Config(max_rank, max_dim, tuple(dtypes), device)
    return _graphs(cfg, max_nodes, max_inputs, _families(allow_reductions, allow_views), noncontiguous_inputs)
