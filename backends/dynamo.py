"""The torch.compile entry: `torch.compile(model, backend="coil", options={...})`.

Dynamo hands over an FX graph of torch calls; AOTAutograd, with coil's
decomposition table, turns it into forward (and backward) graphs of aten ops; each
goes through `coil.compile_graph`.  A graph coil cannot take (symbolic shapes) runs
eagerly with a logged warning instead of failing the user's model.

An inference graph that AOTAutograd passed through unchanged (nothing mutated or
aliased) leaves a link in the graph cache from the Dynamo graph to its compiled
graph; the next compile of that Dynamo graph, in any process, loads the compiled
graph through the link and skips AOTAutograd (coil/graph_cache.py says when).
Such a graph, linked or just compiled, is called directly, without AOTAutograd's
runtime wrappers, which have nothing to do for it (about 2 µs a call)."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import attrs
import torch

from coil.errors import CoilError
from coil.options import Options

if TYPE_CHECKING:
    from coil.passes.lowerings.conv_taps import TapsChoice

log = logging.getLogger("coil")


@functools.lru_cache(maxsize=1)
def default_taps() -> TapsChoice:
    """The process's TapsChoice where the caller passes none: timed on CUDA devices,
    its answers kept for every graph the backend compiles."""
    from coil.passes.lowerings.conv_taps import TapsChoice

    return TapsChoice()


@functools.lru_cache(maxsize=4)
def aot_decompositions(taps: TapsChoice | None = None) -> dict[Any, Callable[..., Any]]:
    """Core ATen decompositions plus the fusion-friendly ones, minus the ops coil
    lowers itself (those arrive whole and fuse better that way), plus the `*_like`
    creations as `full` (AOT_ONLY_DECOMPOSITIONS says why) and the convolutions'
    rules, bound to `taps` (default_taps() where None: which long grouped conv1d
    goes by taps, and where a 1-d convolution goes as a 2-d one, conv_taps.py)."""
    from coil.passes.lowerings import DECOMPOSITIONS, LOWERINGS
    from coil.passes.lowerings.decompositions import aot_only_decompositions

    return ({op: fn for op, fn in DECOMPOSITIONS.items() if op not in LOWERINGS}
            | aot_only_decompositions(taps if taps is not None else default_taps()))


def _static(inputs: Sequence[Any]) -> bool:
    """No symbolic size among the inputs (a SymInt Dynamo specialized is a number)."""
    from coil.passes.symbolic import has_symbols

    return not has_symbols(inputs)


def _target_for_device(opts: Options, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Options:
    """An explicit `target="triton"` for a graph whose tensors are all on the CPU,
    where Triton's interpreter is off (its kernels could not run there): the cpp
    target, with a log line (Inductor too compiles such a graph for the CPU).  The
    graph's device is that of the tensors it takes and makes (`compute_device`): a
    graph that takes no tensor may build CUDA ones (Wav2Vec2's attention mask)."""
    from coil.passes.lower import compute_device

    if opts.target != "triton" or compute_device(gm, example_inputs) != "cpu":
        return opts
    from coil.backends.triton.runtime import interpreter_on

    if interpreter_on():
        return opts
    log.warning("coil: a graph on the CPU with target 'triton', whose kernels run on the CPU only in Triton's "
                "interpreter (TRITON_INTERPRET=1, off): compiled for target 'cpp'")
    return opts.replace(target="cpp")


def _count(what: str) -> None:
    """torch._dynamo.utils.counters["coil"]: graphs compiled, and graphs left to run
    eagerly; benchmarks and tests read them as they read Dynamo's own counters."""
    from torch._dynamo.utils import counters

    counters["coil"][what] += 1


def _passed_through(n_inputs: int, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd's inference graph being compiled now takes the Dynamo
    graph's inputs as they are and returns its outputs as they are: then its
    runtime wrappers do nothing, and the compiled graph can stand for the Dynamo
    graph.  Read from the metadata AOTAutograd leaves in the tracing context."""
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType, SubclassCreationMeta
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None or len(example_inputs) != n_inputs or len(meta.input_info) != n_inputs:
        return False
    try:
        return (meta.num_intermediate_bases == 0 and not meta.tokens
                and not getattr(meta, "is_rng_op_functionalized", False)
                and not any(isinstance(m, SubclassCreationMeta)
                            for m in (*meta.subclass_inp_meta, *meta.subclass_fw_graph_out_meta))
                and all(i.mutation_type == MutationType.NOT_MUTATED for i in meta.input_info)
                and all(o.output_type == OutputType.non_alias and isinstance(o.raw_type, type)
                        and issubclass(o.raw_type, torch.Tensor) for o in meta.output_info))
    except AttributeError:  # another torch's metadata: no link, nothing lost
        return False


def _graph_compiler(options: Options, kind: str, link: str | None = None, n_inputs: int | None = None,
                    through: list[Any] | None = None, pools: Any = None
                    ) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
    """The compiler AOTAutograd calls with one graph.  For an inference graph of a
    Dynamo graph with `n_inputs` inputs that may stand in for it: when AOTAutograd
    passed it through, its call goes into `through`, and the Dynamo graph's `link`
    is stored.  With Options.cuda_graphs, the call replays CUDA graphs recorded in
    `pools` (backends/cudagraphs.py)."""

    def compile_one(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        from coil import compile_graph, graph_cache

        opaque = [k for k, x in enumerate(example_inputs) if _is_opaque(x)]
        if opaque:
            return _around_opaque(gm, example_inputs, opaque, compile_one)
        opts = _target_for_device(options, gm, example_inputs)
        if not _static(example_inputs):
            from coil.passes.pipeline import resolve_target

            target = resolve_target(opts, example_inputs, gm)
            if not opts.dynamic or not target.traits().symbolic_sizes:
                why = "Options.dynamic is off" if not opts.dynamic else \
                    f"the {target.target} target does not compile symbolic sizes yet"
                log.warning("coil: %s graph has symbolic shapes and %s; running it eagerly", kind, why)
                _count("eager")
                return gm.forward
            _count("symbolic")
        if kind == "forward" and _has_convolution(gm):
            from coil.passes.pipeline import resolve_target

            resolved = resolve_target(opts, example_inputs, gm)
            if resolved.prefers_channels_last() and resolved.traits().channels_last_training:
                opts = opts.replace(free_output_strides=_saved_outputs(gm))
        if kind == "backward" and (donated := _donated_inputs()):
            opts = opts.replace(donated_inputs=donated)
        if aligned := _aligned_static_inputs(gm, example_inputs, kind):
            opts = opts.replace(aligned_inputs=aligned)
        try:
            compiled = compile_graph(gm, list(example_inputs), opts, kind=kind)
        except CoilError as e:
            if not options.eager_fallback:
                raise
            # as Inductor's fallbacks do: the user's program runs, and the log says why not compiled
            log.warning("coil: %s graph cannot be compiled, running it eagerly: %s", kind, e)
            _count("eager")
            return eager_backward(gm) if kind == "backward" else gm.forward
        log.debug("coil: compiled %s graph (%d nodes)", kind, len(gm.graph.nodes))
        _count("compiled")
        if kind == "forward":
            _report_output_strides(compiled)
        call = _eager_outside_assumed(compiled, graph_call(compiled, kind), gm, kind)
        graph_plan = None
        if options.cuda_graphs:
            from coil.backends import cudagraphs

            graph_plan = cudagraphs.plan(gm, example_inputs, kind, opts.donated_inputs)
            call = graph_plan.graphed(call, pools if pools is not None else cudagraphs.PoolSet())
        if n_inputs is not None and through is not None and _passed_through(n_inputs, example_inputs):
            through.append((compiled, call))
            if link and compiled.cache_key:
                graph_cache.store_link(link, compiled.cache_key, options.cache_dir)
        run = _boxed(compiled, call)
        run.options = opts  # type: ignore[attr-defined]  # what compiled it, for AOTAutograd's cache (aot_cache.py)
        run.graph_plan = graph_plan  # type: ignore[attr-defined]  # its CUDA graphs', for the same
        return run

    return compile_one


def graph_call(compiled: Any, kind: str) -> Callable[[list[Any]], Any]:
    """The boxed call of a compiled graph of this kind: a forward or inference graph
    takes the Dynamo graph's inputs, which Dynamo's guards have just checked
    (CompiledFn.call_guarded); a backward graph's are checked."""
    return compiled.call_guarded if kind != "backward" else compiled.call_boxed


def _is_opaque(x: Any) -> bool:
    """A script object among a graph's inputs (DTensor's, through AOTAutograd's
    subclass flattening in this torch): no tensor, no size, read by no op."""
    from torch._library.fake_class_registry import FakeScriptObject

    return isinstance(x, (torch.ScriptObject, FakeScriptObject))


def _around_opaque(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opaque: Sequence[int],
                   compile_one: Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]
                   ) -> Callable[..., Any]:
    """A graph whose opaque inputs only pass through to its outputs (a DTensor
    forward hands them on to its backward) compiles without them: `call` takes the
    other inputs, and the opaque ones are put back at their output positions.  One
    that an op reads runs eagerly (coil lowers no op on a script object)."""
    graph = copy.deepcopy(gm.graph)
    holders = [n for n in graph.nodes if n.op == "placeholder"]
    out = next(n for n in graph.nodes if n.op == "output")
    drop = [holders[k] for k in opaque]
    if any(set(n.users) - {out} for n in drop) or not isinstance(out.args[0], (tuple, list)):
        log.warning("coil: a graph reads an opaque input (a script object); running it eagerly")
        _count("eager")
        return gm.forward
    which = {n: i for i, n in enumerate(drop)}
    flat = list(out.args[0])
    put_back = [(pos, which[a]) for pos, a in enumerate(flat) if a in which]
    out.args = (tuple(a for a in flat if a not in which),)
    for n in drop:
        graph.erase_node(n)
    inner = compile_one(torch.fx.GraphModule(gm, graph), [x for k, x in enumerate(example_inputs) if k not in set(opaque)])
    boxed = getattr(inner, "_boxed_call", False)
    keep = [k for k in range(len(example_inputs)) if k not in set(opaque)]

    def run(args: list[Any]) -> Any:
        held = [args[k] for k in opaque]
        rest = [args[k] for k in keep]
        args.clear()
        outs = list(inner(rest) if boxed else inner(*rest))
        for pos, i in put_back:  # ascending positions: each lands where the graph returned it
            outs.insert(pos, held[i])
        return outs

    run._boxed_call = True  # type: ignore[attr-defined]
    run.compiled = getattr(inner, "compiled", None)  # type: ignore[attr-defined]
    return run


def _has_convolution(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and n.target is torch.ops.aten.convolution.default for n in gm.graph.nodes)


def _saved_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The positions of a training forward's outputs that AOTAutograd saves for
    the backward (not the user's outputs, nor mutated inputs): their strides are
    coil's to choose, as Inductor chooses them (its user-visible outputs alone keep
    eager's strides).  () where this torch's metadata does not say."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    outputs = [n for n in gm.graph.nodes if n.op == "output"]
    if meta is None or not outputs:
        return ()
    try:
        saved = meta.tensors_saved_for_backwards_slice
    except (AttributeError, AssertionError, TypeError):
        return ()
    n = len(torch.utils._pytree.tree_leaves(outputs[0].args[0]))
    tokens = _tokens(meta)  # the graph returns its effect tokens first; the slice counts past them
    return tuple(range(tokens, n))[saved]


def _tokens(meta: Any) -> int:
    """How many effect tokens a forward graph takes first and returns first
    (`with_effects`: linalg's error checks, prints), which AOTAutograd's slices of
    the forward's outputs do not count.  Inductor unlifts them; coil keeps them."""
    return len(getattr(meta, "tokens", None) or ())


def _report_output_strides(compiled: Any) -> None:
    """Tell AOTAutograd the strides of the forward's outputs, as Inductor does
    (TracingContext.output_strides), so the backward graph is compiled for the
    saved activations as they are (channels-last ones, say), not as eager has them."""
    from torch._guards import TracingContext

    from coil.ir.wrapper import Return

    ctx = TracingContext.try_get()
    strides = getattr(ctx, "output_strides", None)
    if strides is None or strides:
        return
    program = compiled.module.program
    returns = [line for line in program.lines if isinstance(line, Return)]
    if not returns:
        return
    skip = _tokens(getattr(ctx, "fw_metadata", None))  # AOTAutograd's list has no token's entry
    for name in returns[-1].names[skip:]:
        strides.append(None if name is None else _stride_for_aot(program, name))


def _stride_for_aot(program: Any, name: str) -> tuple[Any, ...] | None:
    """An output's strides as AOTAutograd takes them: ints; None (eager's) where
    any is symbolic (coil's symbols are not the ShapeEnv's)."""
    stride = tuple(program.layout(name).stride)
    return stride if all(isinstance(s, int) for s in stride) else None


def _partition_fn(options: Options | None = None) -> Callable[..., Any]:
    """How AOTAutograd splits a training graph into forward and backward:
    Inductor's min-cut partitioner, which saves fewer activations for the backward
    and recomputes the cheap pointwise ops that fusion makes free there (smaller
    peak memory, fewer bytes stored by the forward), on the joint graph without its
    no-op copies (Options.joint_noop_copies, backends/joint_graph.py)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from coil.backends.joint_graph import partition_fn

    return partition_fn(min_cut_rematerialization_partition, (options or Options()).joint_noop_copies)


def _on_cuda(example_inputs: Sequence[Any]) -> bool:
    return any(getattr(x, "is_cuda", False) for x in example_inputs)


def _aligned_static_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> tuple[int, ...]:
    """The inputs of a forward or inference CUDA graph that stay where they are
    between calls (AOTAutograd's static inputs: parameters and buffers) and are
    16-byte aligned now, by their storage offsets (the base of every CUDA
    allocation is): Options.aligned_inputs.  Not a backward's saved tensors: one
    may be a view of an input the caller passes anew each call."""
    if kind == "backward" or not _on_cuda(example_inputs):
        return ()
    from coil.backends.cudagraphs import graph_facts

    static, _, _ = graph_facts(gm, kind)
    return tuple(i for i in sorted(static) if i < len(example_inputs) and isinstance(example_inputs[i], torch.Tensor)
                 and isinstance(off := example_inputs[i].storage_offset(), int)
                 and off * example_inputs[i].element_size() % 16 == 0)


def _donated_inputs() -> tuple[int, ...]:
    """The backward graph's inputs AOTAutograd donates (functorch's donated_buffer:
    saved activations nothing else holds, given that a backward with retain_graph
    or create_graph is refused, as it is for Inductor), from the tracing context
    it compiles the backward in; () where it says nothing."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    idxs = getattr(getattr(ctx, "fw_metadata", None), "bw_donated_idxs", None)
    return tuple(sorted(int(i) for i in idxs)) if idxs else ()


def eager_backward(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """A backward graph to run eagerly, its `aten.view`s as `aten.reshape`s.  The
    graph's views were traced on fake tensors, whose strides a tensor saved by the
    forward need not have when that forward also ran eagerly: LongT5's blocked
    attention at a second sequence length failed so (`view size is not compatible
    with input tensor's size and stride`), under torch's aot_eager too.  A
    backward graph is functional, so a reshape that copies changes no result."""
    view, reshape = torch.ops.aten.view.default, torch.ops.aten.reshape.default
    if not any(n.target is view for n in gm.graph.nodes):
        return gm.forward
    graph = copy.deepcopy(gm.graph)
    for n in graph.nodes:
        if n.target is view:
            n.target = reshape
    return torch.fx.GraphModule(gm, graph).forward


def _eager_outside_assumed(compiled: Any, call: Callable[[list[Any]], Any], gm: torch.fx.GraphModule,
                           kind: str) -> Callable[[list[Any]], Any]:
    """`call`, or where coil assumed a SymInt input's range (SymbolFacts.assumed: a
    counter the ShapeEnv lets be negative) a call that first checks those inputs and
    runs the graph eagerly, with a warning the first time, when one lies outside:
    Dynamo's guards admit such a value, and recompiling would not change them."""
    checks = getattr(compiled, "assumed_ranges", ())
    if not checks:
        return call
    warned: list[bool] = []

    def checked(args: list[Any]) -> Any:
        for k, lo, hi in checks:
            v = args[k]
            if v < lo or (hi is not None and v > hi):
                if not warned:
                    warned.append(True)
                    log.warning("coil: %s graph called with %s = %d, outside the range %s..%s it was compiled for "
                                "(an assumption: the ShapeEnv allows it); running it eagerly", kind,
                                compiled.input_names[k], v, lo, "oo" if hi is None else hi)
                _count("eager_calls")
                out = gm.forward(*args)
                args.clear()  # the boxed convention, as `call` keeps it
                return out
        return call(args)

    return checked


def _boxed(compiled: Any, call: Callable[[list[Any]], Any]) -> Callable[..., Any]:
    """AOTAutograd's boxed callable of a compiled graph."""

    def run(args: list[Any]) -> Any:
        return call(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    run.compiled = compiled  # type: ignore[attr-defined]
    return run


def _direct(compiled: Any, call: Callable[[list[Any]], Any]) -> Callable[..., Any]:
    """The compiled graph as the callable Dynamo calls with its graph's inputs, in
    place of AOTAutograd's runtime wrappers (which have nothing to do for it)."""

    def forward(*args: Any) -> Any:
        return call(list(args))

    forward.compiled = compiled  # type: ignore[attr-defined]
    return forward


def _linked(key: str, options: Options, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
            ) -> Callable[..., Any] | None:
    """The Dynamo graph's compiled graph, loaded through its link; None on a miss."""
    from coil import graph_cache
    from coil.backends.runtime import load_module

    module = graph_cache.load_link(key, options.cache_dir)
    if module is None:
        return None
    log.debug("coil: Dynamo graph loaded from the graph cache, AOTAutograd skipped")
    compiled = load_module(module, options.cache_dir)
    call = _eager_outside_assumed(compiled, compiled.call_guarded, gm, "inference")
    if options.cuda_graphs:
        from coil.backends import cudagraphs

        call = cudagraphs.wrap(call, gm, example_inputs, "inference", cudagraphs.PoolSet())
    return _direct(compiled, call)


# torch.compile's `mode=`, which it hands a backend named by string as a keyword
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def options_for_mode(mode: str | None, opts: Options) -> Options:
    """What torch.compile's `mode` means for coil, as for Inductor: reduce-overhead
    turns on Options.cuda_graphs; max-autotune turns on Options.autotune and CUDA
    graphs, max-autotune-no-cudagraphs autotune only; an unknown mode is an error."""
    if mode is None or mode == "default":
        return opts
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        log.info("coil: mode=%r turns on Options.autotune (Triton kernels on CUDA launch the fastest of a few "
                 "configs)%s", mode, " and CUDA graphs" if mode == "max-autotune" else "")
        return opts.replace(autotune=True, cuda_graphs=mode == "max-autotune")
    if mode == "reduce-overhead":
        return opts.replace(cuda_graphs=True)
    from coil.errors import CoilError

    raise CoilError(f"unknown torch.compile mode {mode!r} for backend 'coil'; known modes: {', '.join(MODES)}")


# Inductor's names (torch.compile's `options=`) for options coil has under its own name: a script
# written for Inductor means the same under coil.  Inductor's names that are coil's too
# (inplace_buffers, max_fusion_size, reorder_for_peak_memory, the realize_* thresholds,
# emulate_precision_casts) need no entry.
INDUCTOR_NAMES = {
    "triton.cudagraphs": "cuda_graphs",
    "max_autotune": "autotune",
    "max_autotune_pointwise": "autotune",
    "combo_kernels": "combo_launches",
    "cpp.threads": "num_threads",
}


# Inductor's options for what coil does whatever their value: left out with a log line saying
# what coil does, not a warning
INDUCTOR_MOOT = {
    "fallback_random": "coil's random ops run as aten's, from eager's generator: the same numbers as eager",
}


def coil_options(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """torch.compile's `options=` as coil's Options by name: coil's names as they
    are; Inductor's name for an option coil has under another (INDUCTOR_NAMES)
    translated, with a log line; Inductor's options for what coil does anyway
    (INDUCTOR_MOOT: fallback_random) left out with a log line; those that coil has nothing like
    (they tune Inductor's own codegen: epilogue_fusion, shape_padding, ...) left
    out, with a warning naming them; any other name left for Options.from_mapping,
    which refuses it.  An option given under both names with two values is an
    error."""
    if not options:
        return None
    coil_names = {f.name for f in attrs.fields(Options)}
    for name in sorted(set(options) & set(INDUCTOR_MOOT) - coil_names):
        log.info("coil: Inductor's option %s left out: %s", name, INDUCTOR_MOOT[name])
    out: dict[str, Any] = {k: v for k, v in options.items()
                           if k in coil_names or (k not in INDUCTOR_NAMES and k not in INDUCTOR_MOOT)}
    translated: set[str] = set()  # coil options set from an Inductor name
    for name, value in options.items():
        if name not in INDUCTOR_NAMES or name in coil_names:
            continue
        ours = INDUCTOR_NAMES[name]
        if name == "cpp.threads":
            value = max(int(value), 0)  # Inductor's -1: as many as the machine has, coil's 0
        if ours in translated and isinstance(value, bool):
            value = bool(out[ours]) or value  # max_autotune and max_autotune_pointwise: autotune if either
        elif ours in out and out[ours] != value:
            raise CoilError(f"options: {name}={value!r} (Inductor's name for coil's {ours}) and {ours}={out[ours]!r}")
        translated.add(ours)
        log.info("coil: Inductor's option %s=%r taken as coil's %s", name, value, ours)
        out[ours] = value
    unknown = [k for k in out if k not in coil_names]
    if unknown:
        import torch._inductor.config as inductor_config

        inductors = set(inductor_config.get_config_copy())
        ignored = sorted(k for k in unknown if k in inductors)
        if ignored:
            import warnings

            warnings.warn(f"coil ignores Inductor's options {ignored}: they tune Inductor's own code generation, "
                          "which coil has nothing like", UserWarning, stacklevel=2)
            out = {k: v for k, v in out.items() if k not in ignored}
    return out


def coil_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None,
                 mode: str | None = None, taps: TapsChoice | None = None, **_: Any) -> Callable[..., Any]:
    """The Dynamo backend (entry point `coil`); `options` are coil's Options by name,
    `mode` is torch.compile's (options_for_mode); `taps` decides which long grouped
    conv1d the joint graph takes by taps, and where a 1-d convolution goes as a 2-d
    one (default_taps() where None; bind another with
    functools.partial(coil_backend, taps=...)); its cache_key is in the caches' keys."""
    from torch._dynamo.backends.common import aot_autograd

    from coil import graph_cache
    from coil.backends import aot_cache

    opts = options_for_mode(mode, Options.from_mapping(coil_options(options)))
    taps = taps if taps is not None else default_taps()
    handlers = taps.cache_key()
    skippable = graph_cache.may_skip_aot(gm, example_inputs)
    link = graph_cache.dynamo_key(gm, example_inputs, opts, skippable, handlers)
    if link is not None and (hit := _linked(link, opts, gm, example_inputs)) is not None:
        return hit
    through: list[Any] = []
    pools = None
    if opts.cuda_graphs:  # one set of pools per Dynamo graph: its backward records into its forward's pool
        from coil.backends.cudagraphs import PoolSet

        pools = PoolSet()
    compilers = {"forward": _graph_compiler(opts, "forward", pools=pools),
                 "backward": _graph_compiler(opts, "backward", pools=pools),
                 "inference": _graph_compiler(opts, "inference", link, len(example_inputs) if skippable else None,
                                              through, pools)}
    scope: Any = contextlib.nullcontext()
    if aot_cache.usable(opts, gm, example_inputs):  # a warm start loads AOTAutograd's result instead of tracing again
        compilers = {kind: aot_cache.serializable(c, kind) for kind, c in compilers.items()}
        scope = aot_cache.scope(opts, pools, handlers)
    backend = aot_autograd(
        fw_compiler=compilers["forward"],
        bw_compiler=compilers["backward"],
        inference_compiler=compilers["inference"],
        decompositions=aot_decompositions(taps),
        partition_fn=_partition_fn(opts),
        # writes into the graph's inputs (BatchNorm's buffers) stay in the graph, as Inductor asks:
        # coil runs them, inside a CUDA graph's recording too
        keep_inference_input_mutations=True,
    )
    with scope:
        wrapped = backend(gm, example_inputs)
    return _direct(*through[0]) if through else wrapped
