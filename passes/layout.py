"""prefer_channels_last : LoweredGraph -> LoweredGraph

Inductor's layout optimisation (`GraphLowering.decide_layout_opt` and
`find_nodes_prefer_channels_last`), as a rewrite of the lowered graph.  A vendor
convolution runs faster on channels-last tensors (one MobileNetV2 layer on one CPU
thread: mkldnn took 61 µs channels-last against 126 µs contiguous), and it hands
back a channels-last result when its input is one.  So, in a graph with a 2-d
convolution:

- a node *prefers* channels-last when it is an input of a convolution, when a
  reader that prefers it reads it channel by channel (conv -> batch_norm -> relu
  -> conv: the whole chain), or when it reads a convolution's result, directly or
  not, channel by channel.  A read that moves the channel dim (ConvNeXt's permute
  to (N, H, W, C) before its layer norm, a reduction over channels) ends the
  region: that tensor is already laid out for its readers;
- a preferred Pointwise or Reduction of rank 4, (N, C, H, W) with C > 1 and H * W > 1,
  is rewritten into the same computation over (N, H, W, C) (name `<node>__cl`)
  and a View of it under the node's own name:

      P(ranges [N, C, H, W], body B(x0, x1, x2, x3))
    ->
      P__cl(ranges [N, H, W, C], body B(x0, x3, x1, x2))
      P = View(P__cl, [N, C, H, W], index (x0, x2, x3, x1))

  Readers are untouched: realize substitutes the view, so a kernel that computes
  P__cl iterates channels innermost and stores contiguously, the readers' loads
  follow, and an Extern that reads P gets a strided alias with channels-last
  strides (realize's `extern_input_view`);
- a convolution whose input or weight is not channels-last by then (a graph
  input, a parameter, a view) reads a channels-last copy of it
  (`<conv>__cl_in<i>`, i the argument's position), as Inductor's
  `require_stride_order` makes one (a 1x1 or depthwise weight is both already);
- each convolution Extern's layout is what its meta function gives for those
  input layouts (channels-last for a channels-last input).  The wrapper already
  holds an extern's result to its planned layout, so a kernel that answers
  otherwise costs a copy, never a misread.

Graph outputs keep eager's strides: realize copies an output laid out otherwise
into the strides the FX graph promises (rule `output_stride`).  A graph that
returns rank-4 tensors of the channels-last region is left as it is (a copy of
each output a call costs more than the convolutions gain: `_kept_outputs`),
except for the outputs whose strides are free (Options.free_output_strides): a
training forward's saved activations, which the torch.compile backend marks and
whose strides it reports back to AOTAutograd, as Inductor does.  The backward
graph then gets them channels-last, and its convolution_backward runs
channels-last too (its incoming gradient made so), where its forward did.  A
saved weight is handed out as the channels-last copy its forward convolution
read (`_saved_copies`), so the backward reads the weight as the forward did.

Whether the rewrite runs is the target's trait, `Options.prefers_channels_last()`
(on for the C++ target, whose convolutions are mkldnn's, and for Triton's, whose
cuDNN convolutions convert NCHW tensors to NHWC and back around each call), never a
branch on the target's name here.  A 1-d convolution comes here as the 2-d
convolution of one row it is where the joint graph's decompositions make it so
(conv_taps.TapsChoice.rows_2d).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import torch

from coil.ir.expr import Load, loads, substitute_symbols, xsyms
from coil.ir.indexing import contiguous_strides
from coil.ir.layout import Layout
from coil.ir.lowered import Extern, Input, LNode, LoweredGraph, MultiOutput, Pointwise, Reduction, TensorRef, View
from coil.ir.lowered import resolve_kernel
from coil.options import Options
from coil.passes.realize import view_layout

log = logging.getLogger("coil.trace")

# the 2-d convolutions: (kernel, positions of the arguments that are activations).
# convolution_backward reads the incoming gradient and the forward's input; a
# training forward saves that input channels-last when its strides are coil's to
# choose (Options.free_output_strides), so the backward reads it as it is
CONVOLUTIONS: dict[str, tuple[int, ...]] = {
    "aten.convolution.default": (0,),
    "aten.convolution_backward.default": (0, 1),
}
# the arguments each convolution gets channels-last: the forward's input and weight
# (mkldnn reorders a contiguous weight for a channels-last input on every call:
# ResNet's twelve convolutions at the CPU size, one thread, 845 µs contiguous, 957
# µs with a channels-last input alone, 680 µs with the weight channels-last too);
# the backward's gradient and input (its weight is read as the forward's parameter)
CHANNELS_LAST_ARGS: dict[str, tuple[int, ...]] = {
    "aten.convolution.default": (0, 1),
    "aten.convolution_backward.default": (0, 1),
}
# their tensors' rank: the permutation below is for 2-d images
RANK = 4
# (N, C, H, W) -> (N, H, W, C): the new node's dim k is the old node's dim PERM[k]
PERM = (0, 2, 3, 1)


def channels_last_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a channels-last (N, C, H, W) tensor."""
    n, c, h, w = size
    return contiguous_strides((n, h, w, c))[0], 1, w * c, c


def _permutable(size: tuple[int, ...]) -> bool:
    """Rank 4 with channels and pixels both more than one (else the orders agree)."""
    return len(size) == RANK and size[1] > 1 and size[2] * size[3] > 1


def _convolutions(g: LoweredGraph) -> list[Extern]:
    """The 2-d convolutions to run channels-last.  A backward's only where its
    forward went channels-last (some rank-4 input of the graph comes in so): else
    its saved activations are in eager's strides, and copying them costs more."""
    forward_went = any(isinstance(n, Input) and _permutable(n.layout.size)
                       and n.layout.stride == channels_last_strides(n.layout.size) for n in g.nodes)
    out = []
    for n in g.nodes:
        if isinstance(n, Extern) and n.kernel == "aten.convolution_backward.default" and not forward_went:
            continue
        if isinstance(n, Extern) and n.kernel in CONVOLUTIONS:
            acts = [n.args[i] for i in CONVOLUTIONS[n.kernel]]
            if all(isinstance(a, TensorRef) and len(g.node(a.name).size) == RANK for a in acts):
                out.append(n)
    return out


def _aligned(index: tuple[Any, ...]) -> bool:
    """A rank-4 index that keeps the channel dim where it is: channel x1 of the
    reader is channel x1 of what it reads, and no other position uses x1."""
    c = xsyms(RANK)[1]
    return (len(index) == RANK and index[1] == c
            and not any(c in getattr(i, "free_symbols", ()) for k, i in enumerate(index) if k != 1))


def aligned_reads(n: LNode) -> set[str]:
    """What a rank-4 Pointwise, Reduction or View reads channel by channel, (N, C,
    H, W) as (N, C, H, W): the producers the channels-last region extends to.  A
    read that moves the channel dim (a permute to (N, H, W, C), a reduction over
    channels) ends the region."""
    match n:
        case Pointwise() | Reduction() if len(n.ranges) == RANK:
            found = loads(n.body)
            bad = {ld.name for ld in found if not _aligned(ld.index)}
            return {ld.name for ld in found if len(ld.index) == RANK} - bad
        case View() if len(n.ranges) == RANK:
            return {n.base} if _aligned(n.index) else set()
    return set()


def preferred(g: LoweredGraph, convs: list[Extern]) -> set[str]:
    """The nodes that prefer channels-last (module docstring): the convolutions'
    activations, their producers, and the readers of a convolution's result,
    transitively, as far as the reads keep the channel dim in place (`aligned_reads`)."""
    readers: dict[str, list[str]] = {}
    for n in g.nodes:
        for r in aligned_reads(n):
            readers.setdefault(r, []).append(n.name)
    up = [a.name for c in convs for i in CONVOLUTIONS[c.kernel] for a in (c.args[i],) if isinstance(a, TensorRef)]
    # a convolution's result: the Extern's own, or the first of a tuple (the
    # backward's gradient of its input)
    conv_names = {c.name for c in convs}
    down = [c.name for c in convs] + [n.name for n in g.nodes if isinstance(n, MultiOutput)
                                      and n.extern in conv_names and n.index == (0,)]
    out: set[str] = set()
    while up:
        name = up.pop()
        if name not in out:
            out.add(name)
            up.extend(aligned_reads(g.node(name)))
    seen: set[str] = set()
    while down:
        name = down.pop()
        if name not in seen:
            seen.add(name)
            down.extend(readers.get(name, []))
    return out | seen


def _permuted(n: Pointwise | Reduction, name: str, perm: tuple[int, ...] = PERM) -> Pointwise | Reduction:
    """The node over its dims in the order `perm` (its dim k is the old dim
    perm[k]): (N, H, W, C) for channels-last."""
    xs = xsyms(len(perm))
    old_to_new = {xs[old]: xs[new] for new, old in enumerate(perm)}
    body = substitute_symbols(n.body, old_to_new)
    ranges = tuple(n.ranges[d] for d in perm)
    if isinstance(n, Pointwise):
        return Pointwise(name, n.dtype, n.device, ranges, body, n.origin, n.op)
    return Reduction(name, n.dtype, n.device, ranges, n.reduction_ranges, n.reduction_type, body, n.origin, n.op)


def _kept_outputs(g: LoweredGraph, prefer: set[str]) -> list[str]:
    """Graph outputs of rank 4 that would be channels-last and must come back in
    eager's strides, a copy a call.  A training forward returns its saved
    activations so unless their strides are free (Options.free_output_strides, set
    by the torch.compile backend, which reports the strides chosen to AOTAutograd);
    where they are not, the copies cost more than the convolutions gain
    (MobileNetV2 at the CPU size, one thread, module times with the forward and
    backward both channels-last: forward 5.7 -> 8.0 ms, backward 7.0 -> 10.8 ms of
    externs), so such a graph is left contiguous."""
    out = []
    strides = g.output_strides or (None,) * len(g.outputs)
    for o, st in zip(g.outputs, strides):
        if st is None:  # free: the graph hands it out in whatever strides it has
            continue
        n = g.node(o) if o is not None else None
        if n is None or o not in prefer or (isinstance(n, Extern) and n.layout is None):
            continue
        if _permutable(tuple(n.size)):
            out.append(n.name)
    return out


def _view_of(base: str, n: Pointwise | Reduction, perm: tuple[int, ...] = PERM) -> View:
    """n's view, in its own dim order, of a node laid out in the order `perm`
    ((N, C, H, W) of one laid out (N, H, W, C))."""
    xs = xsyms(len(perm))
    index = tuple(xs[perm[k]] for k in range(len(perm)))
    return View(n.name, base, n.dtype, n.device, n.size, index, n.origin, n.op)


def _fresh(name: str, taken: set[str]) -> str:
    k, out = 0, name
    while out in taken:
        k += 1
        out = f"{name}{k}"
    taken.add(out)
    return out


def _meta_layout(ext: Extern, layouts: dict[str, Layout], device: str) -> Layout | tuple[Layout | None, ...]:
    """The Extern's result layout as its meta function gives it for its
    arguments' layouts (a tuple of them, None for a result that is not a tensor,
    for an Extern that returns several)."""

    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    def fake(a: Any) -> Any:
        if isinstance(a, TensorRef):
            lay = layouts[a.name]
            return torch.empty_strided(lay.size, lay.stride, dtype=lay.dtype, device=device)
        if isinstance(a, tuple):
            return [fake(x) for x in a]
        return a

    # fake tensors of the graph's device, not meta ones: a meta function picks
    # its result's memory format by the device (meta tensors come back contiguous)
    with unset_fake_temporarily(), FakeTensorMode():
        out = resolve_kernel(ext.kernel)(*[fake(a) for a in ext.args], **{k: fake(v) for k, v in ext.kwargs})
    def layout(t: Any) -> Layout | None:
        return Layout(tuple(t.shape), tuple(t.stride()), t.dtype, device) if isinstance(t, torch.Tensor) else None

    if isinstance(out, (tuple, list)):
        return tuple(layout(t) for t in out)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{ext.kernel} returned {type(out).__name__}")
    lay = layout(out)
    assert lay is not None
    return lay


def prefer_channels_last(g: LoweredGraph, options: Options) -> LoweredGraph:
    """Rewrite the preferred rank-4 nodes to compute channels-last (module docstring).
    Not for a graph of symbolic sizes: its convolutions keep eager's layouts."""
    if not options.prefers_channels_last() or g.sizes:
        return g
    convs = _convolutions(g)
    if not convs:
        return g
    prefer = preferred(g, convs)
    kept = _kept_outputs(g, prefer)
    if kept:
        log.debug("prefer_channels_last: none, the graph returns %s in eager's strides", ", ".join(kept[:4]))
        return g
    taken = {n.name for n in g.nodes}
    # each node's layout as the convolutions will see it: channels-last for the
    # rewritten nodes, the node's own for inputs and externs, else contiguous
    layouts: dict[str, Layout] = {}
    nodes: list[LNode] = []
    conv_names = {c.name for c in convs}
    # the layouts a tuple-returning convolution's meta function gives its results, by index
    results: dict[str, dict[tuple[int | str, ...], Layout]] = {}
    copies: dict[str, str] = {}  # a node a convolution reads a channels-last copy of -> that copy's view
    for n in g.nodes:
        if isinstance(n, (Pointwise, Reduction)) and n.name in prefer and _permutable(n.size):
            inner = _permuted(n, _fresh(f"{n.name}__cl", taken))
            nodes += [inner, _view_of(inner.name, n)]
            layouts[n.name] = Layout(n.size, channels_last_strides(n.size), n.dtype, n.device)
            log.debug("prefer_channels_last %s -> %s over %s", n.name, inner.name, list(inner.ranges))
            continue
        if isinstance(n, Extern) and n.name in conv_names:
            n = _channels_last_conv(n, layouts, nodes, taken, results, copies)
        elif isinstance(n, MultiOutput) and n.index in results.get(n.extern, {}):
            n = MultiOutput(n.name, n.extern, n.index, results[n.extern][n.index], n.origin, n.op)
        nodes.append(n)
        match n:
            case Input() | MultiOutput():
                layouts[n.name] = n.layout
            case Extern() if n.layout is not None:
                layouts[n.name] = n.layout
            case Pointwise() | Reduction() | View():
                layouts[n.name] = Layout.contiguous(n.size, n.dtype, n.device)
    return LoweredGraph(tuple(nodes), _saved_copies(g, copies), g.output_strides, g.sizes)


def _saved_copies(g: LoweredGraph, copies: dict[str, str]) -> tuple[str | None, ...]:
    """The graph's outputs, each whose strides are free (a training forward's saved
    tensor) and of which a convolution read a channels-last copy (a weight) handed
    out as that copy: the backward's convolution_backward then reads the weight as
    the forward's convolution did.  Left as the parameter, aten converted it inside
    every convolution_backward on CUDA (ResNet's training step on the H200: 16
    copies, 58 µs of 1.39 ms), as mkldnn reorders it on the CPU; Inductor saves
    the converted weight too."""
    strides = g.output_strides or (None,) * len(g.outputs)
    return tuple(copies[o] if o is not None and st is None and o in copies else o
                 for o, st in zip(g.outputs, strides))


def _channels_last_conv(c: Extern, layouts: dict[str, Layout], nodes: list[LNode], taken: set[str],
                        results: dict[str, dict[tuple[int | str, ...], Layout]], copies: dict[str, str]) -> Extern:
    """The convolution reading a channels-last copy of an input that is not one,
    with the layout its meta function gives (for a tuple result, into `results`,
    which the MultiOutputs that follow take); each copy's view by what it copies
    into `copies`."""
    args = list(c.args)
    for i in CHANNELS_LAST_ARGS[c.kernel]:
        ref = args[i]
        if not isinstance(ref, TensorRef):
            continue
        lay = layouts[ref.name]
        if not _permutable(lay.size) or lay.stride == channels_last_strides(lay.size):
            continue
        xs = xsyms(RANK)
        # the copy over (N, H, W, C): element (n, h, w, c) is src[n, c, h, w]
        body = Load(ref.name, (xs[0], xs[3], xs[1], xs[2]), lay.dtype)
        copy = Pointwise(_fresh(f"{c.name}__cl_in{i}", taken), lay.dtype, lay.device,
                         tuple(lay.size[d] for d in PERM), body, c.origin, "channels_last")
        view = View(_fresh(f"{copy.name}_view", taken), copy.name, lay.dtype, lay.device, lay.size,
                    tuple(xs[PERM[k]] for k in range(RANK)), c.origin, "channels_last")
        nodes += [copy, view]
        layouts[view.name] = Layout(lay.size, channels_last_strides(lay.size), lay.dtype, lay.device)
        args[i] = TensorRef(view.name)
        copies.setdefault(ref.name, view.name)
        log.debug("prefer_channels_last %s reads a channels-last copy of %s (%s)", c.name, ref.name, copy.name)
    c = attrs.evolve(c, args=tuple(args))
    device = c.layout.device if c.layout is not None else _device_of(c, layouts)
    try:
        result = _meta_layout(c, layouts, device)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:  # keep the traced layout
        log.debug("prefer_channels_last %s: no meta layout (%s)", c.name, e)
        return c
    if isinstance(result, Layout):
        return attrs.evolve(c, layout=result)
    results[c.name] = {(k,): lay for k, lay in enumerate(result) if lay is not None}
    return c


def _device_of(c: Extern, layouts: dict[str, Layout]) -> str:
    refs = [a for a in c.args if isinstance(a, TensorRef)]
    return layouts[refs[0].name].device


# ---- attention kernels get their arguments in eager's strides ----------------------------------


def dense_order(size: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dims from outermost to innermost of a tensor laid out densely (each
    stride the product of the sizes inside it, dims of size 1 anywhere), the
    order `_permuted` takes; None for a padded or overlapping layout."""
    order = tuple(sorted(range(len(size)), key=lambda d: (-stride[d], d) if size[d] != 1 else (0, d)))
    inner = 1
    for d in reversed(order):
        if size[d] != 1 and stride[d] != inner:
            return None
        inner *= size[d]
    return order


def _same_strides(size: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return all(n == 1 or x == y for n, x, y in zip(size, a, b))


class _Planned:
    """The strides each node of a lowered graph will have once realized, as far
    as they are known here: an input's, an extern's or a multi-output's own, a
    computed node's contiguous ones (or those of the order it was rewritten in),
    a view's as realize aliases it (`view_layout` of its index into its base), or
    contiguous where realize copies it."""

    def __init__(self) -> None:
        self.layouts: dict[str, Layout] = {}

    def add(self, n: LNode) -> None:
        match n:
            case Input() | MultiOutput():
                self.layouts[n.name] = n.layout
            case Extern() if n.layout is not None:
                self.layouts[n.name] = n.layout
            case Pointwise() | Reduction():
                self.layouts[n.name] = Layout.contiguous(n.size, n.dtype, n.device)
            case View():
                base = self.layouts.get(n.base)
                lay = view_layout(n.index, n.size, base) if base is not None else None
                self.layouts[n.name] = lay if lay is not None else Layout.contiguous(n.size, n.dtype, n.device)


def attention_input_strides(g: LoweredGraph, options: Options) -> LoweredGraph:
    """An attention kernel's meta function gives its result's layout for the
    strides eager handed it its arguments (Extern.arg_strides), and some of its
    CUDA kernels follow the query's layout instead (cuDNN's): so each argument is
    given the strides eager gave it, as Inductor's `sdpa_constraint` requires
    them.  A computed argument read by no graph output is computed in that order
    (the rotary embedding writes the query (B, S, H, D) in memory, and the output
    projection then reads the attention's result as a view); any other argument
    laid out otherwise reads a copy in that order.  Arguments eager had padded
    or overlapping (not dense) are left as they are.  Without this, Llama's
    attention results came back contiguous where coil planned (B, S, H, D), and
    the wrapper copied each one on every call (H200, bf16: 4 copies a call)."""
    wanted: dict[str, set[tuple[int, ...]]] = {}
    for n in g.nodes:
        if isinstance(n, Extern) and n.arg_strides:
            for a, st in zip(n.args, n.arg_strides):
                if isinstance(a, TensorRef) and st is not None:
                    size = tuple(g.node(a.name).size)
                    order = dense_order(size, st)
                    if order is not None and not _same_strides(size, contiguous_strides(size), st):
                        wanted.setdefault(a.name, set()).add(order)
    if not wanted or g.sizes:
        return g
    outputs = set(g.outputs)
    taken = {n.name for n in g.nodes}
    planned = _Planned()
    nodes: list[LNode] = []
    for n in g.nodes:
        orders = wanted.get(n.name, set())
        if isinstance(n, (Pointwise, Reduction)) and len(orders) == 1 and n.name not in outputs:
            order = next(iter(orders))
            inner = _permuted(n, _fresh(f"{n.name}__eager", taken), order)
            view = _view_of(inner.name, n, order)
            for m in (inner, view):
                nodes.append(m)
                planned.add(m)
            log.debug("attention_input_strides %s computed over %s (dims %s)", n.name, inner.name, list(order))
            continue
        if isinstance(n, Extern) and n.arg_strides:
            n = _eager_args(n, planned, nodes, taken)
        nodes.append(n)
        planned.add(n)
    return LoweredGraph(tuple(nodes), g.outputs, g.output_strides, g.sizes)


def _eager_args(ext: Extern, planned: _Planned, nodes: list[LNode], taken: set[str]) -> Extern:
    """The extern reading, for each argument planned in other strides than eager
    gave it, a copy in eager's order (`<extern>__eager_in<i>`)."""
    args = list(ext.args)
    for i, (a, st) in enumerate(zip(ext.args, ext.arg_strides)):
        if not isinstance(a, TensorRef) or st is None:
            continue
        lay = planned.layouts[a.name]
        order = dense_order(lay.size, st)
        if order is None or _same_strides(lay.size, lay.stride, st):
            continue
        xs = xsyms(len(order))
        src = Load(a.name, tuple(xs[order.index(d)] for d in range(len(order))), lay.dtype)
        copy = Pointwise(_fresh(f"{ext.name}__eager_in{i}", taken), lay.dtype, lay.device,
                         tuple(lay.size[d] for d in order), src, ext.origin, "eager_strides")
        view = View(_fresh(f"{copy.name}_view", taken), copy.name, lay.dtype, lay.device, lay.size,
                    tuple(xs[order[k]] for k in range(len(order))), ext.origin, "eager_strides")
        for m in (copy, view):
            nodes.append(m)
            planned.add(m)
        args[i] = TensorRef(view.name)
        log.debug("attention_input_strides %s reads a copy of %s in eager's strides %s", ext.name, a.name, list(st))
    return attrs.evolve(ext, args=tuple(args))
