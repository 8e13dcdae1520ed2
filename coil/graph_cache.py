"""The compiled-graph cache: a graph compiled once is loaded, not compiled again,
by later processes (Inductor's FX graph cache plays this part for it).

The default pipeline's result, the CompiledModule (every IR the passes built, and
output_code.py), is pickled under `<cache dir>/graphs/<key>.pkl`.  The key hashes
everything the result depends on:

    the graph's code (gm.code: ops, arguments, order)
    each input's size, stride, storage offset, dtype and device (or its value)
    each tensor constant's name, layout and bytes (a hash of them)
    the options, less the ones that only choose where output goes
    (debug_dir, trace, cache_dir, graph_cache, dump_sources) and cuda_graphs,
    which wraps the compiled call after it is built (mode="reduce-overhead"
    loads what the default mode compiled)
    coil's own source files, torch's version, Python's version

so an edit to coil, a new torch or another layout misses.  A compile asked to
show its stages (debug_dir, trace) or run through a custom pipeline does not use
the cache.  A graph's tensor constants (get_attr nodes, which the compiled module
holds as inputs) are keyed by their layout and a hash of their bytes; a graph
with a constant over CONSTANT_KEY_MAX elements, or one that is not a plain
tensor, is not cached.  A higher-order op's subgraph (cond's branches, a scan's
combine function) is keyed by its graph's text (graph_text, which neither node
names nor node metadata change) and its own constants and subgraphs; the module pickles
it with its fake inputs as layouts (ir/lowered.py: Subgraph), and the subgraph's
own compile is a cache entry of its own.  A subgraph of symbolic sizes does not
pickle (the graph is not cached), nor is a graph that calls a user's Triton
kernel (its kernel_idx indexes a table of this process).
An entry that does not load (truncated, written by another version of a class)
is compiled again and overwritten, never trusted.  Since loading a pickle runs
code, the folder is checked first (backends/runtime.py: secure_dir): one that
another user owns or may write is refused.  A cache that cannot be written (a
read-only or full disk) is skipped: the compile goes on uncached.

Dynamo graphs get a second kind of entry, a link (`<key>.link`, holding the key of
the compiled graph's entry), as Inductor's AOTAutogradCache does for it: a Dynamo
graph whose AOTAutograd inference graph needed none of AOTAutograd's runtime
wrappers (no input mutated, every output a fresh tensor, no tokens, subclasses or
functionalized RNG) loads its compiled graph straight from the link, skipping
AOTAutograd's two traces, which are most of a warm compile of a big graph.  Its key
adds to the above the global state those traces read (grad and inference mode,
the default dtype, deterministic algorithms) and each input's requires_grad; a
graph that calls anything outside torch (a function put in the graph by
allow_in_graph, whose body gm.code does not show), holds parameters or
submodules, or runs under autocast or with an input that needs grad while grad is
on, gets no link.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import sys
from pathlib import Path
from typing import Any, Sequence

import attrs
import sympy
import torch

from coil.ir.module import CompiledModule
from coil.options import Options
from coil.passes.pipeline import Run, StageHook

log = logging.getLogger("coil")

_UNCACHED = ("debug_dir", "trace", "cache_dir", "graph_cache", "aot_cache_nodes", "dump_sources", "cuda_graphs")


@functools.lru_cache(maxsize=1)
def coil_source_hash() -> str:
    """sha256 over coil's .py files (every package coil is made of), by path."""
    import coil
    import coil.backends
    import coil.ir
    import coil.passes

    h = hashlib.sha256()
    roots = {Path(p).resolve() for mod in (coil, coil.backends, coil.ir, coil.passes) for p in mod.__path__}
    for root in sorted(roots):
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _input_key(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"T{tuple(x.shape)}{tuple(x.stride())}+{x.storage_offset()}:{x.dtype}:{x.device}"
    return f"V{type(x).__name__}:{x!r}"


def _symbol_ranges(example_inputs: Sequence[Any]) -> list[str]:
    """The ranges of a symbolic graph's size symbols (none for a static graph): code
    compiled for a bounded range (a persistent reduction under mark_dynamic's max)
    must not serve a wider one.  The hints are left out: they tune the code, and it
    is right for every size in the ranges, so one entry serves every batch size."""
    from coil.errors import CoilError
    from coil.passes.symbolic import SizeMap

    try:
        sm = SizeMap.of(example_inputs)
    except CoilError as e:  # sizes lower refuses: the compile fails the same way, cached or not
        return [f"unkeyed: {e}"]
    # and what Dynamo's guards made of them: the rules lower writes sizes by, the symbols they
    # pin, and the SymInt inputs compiled for one value (two graphs of one FX code may differ
    # in these alone, and code compiled under one set must not serve the other)
    return ([f.show().split(" hint ")[0] for f in sm.shapes.facts] + [r.show() for r in sm.shapes.rules]
            + [f"solved {k}: {v}" for k, v in sorted(sm.names.items(), key=str) if not isinstance(v, sympy.Symbol)]
            + [f"fixed {k}: {v}" for k, v in sorted(sm.fixed.items(), key=str)])


def _guard_keys(example_inputs: Sequence[Any]) -> list[str]:
    """What a Dynamo graph's link keys of its symbolic sizes (none for a static
    graph): Dynamo's guards as the ShapeEnv holds them, the range of each symbol
    they or the inputs use, each input symbol's replacement, and the value of a
    SymInt input negative at the first call (compiled for that value).  Those are
    all that `SizeMap.of` reads besides the hints (which `_symbol_ranges` leaves
    out too), so two graphs keyed alike map their sizes alike.  Read raw rather
    than as the rules lower solves them into (`_symbol_ranges`): the compile reads
    the AOT graph's guards into rules anyway, and reading the Dynamo graph's first
    cost Swin's recompile at a second image size 4.8 s (SizeMap.of, twice, 8.8 s
    before and 6.3 s after; this key 0.3 s, its guards printed).  Graphs whose
    guards differ in spelling alone get two links to two entries, never one link;
    the guards' order and repeats do not count."""
    from coil.passes.symbolic import _hint_of, _range_of, shape_env, size_leaves

    env = shape_env(example_inputs)
    if env is None:
        return []
    guards = {env.replace(g.expr) for g in getattr(env, "guards", ())}
    used: set[sympy.Symbol] = set()
    # as a set, sorted: Dynamo's list of guards for one program differs between processes in
    # order and repeats (Swin's: 259, 262, 264 guards, 231 distinct each time), and a link
    # keyed by the list would miss in every new process
    out = sorted(f"guard {g}" for g in guards)
    for g in guards:
        used |= g.free_symbols
    for x in example_inputs:
        for leaf in size_leaves(x):
            if isinstance(leaf, torch.SymInt):
                replaced = env.replace(leaf.node.expr)
                used |= replaced.free_symbols
                out.append(f"size {leaf.node.expr} = {replaced}")
                hint = _hint_of(env, replaced) if isinstance(replaced, sympy.Symbol) else None
                if isinstance(x, torch.SymInt) and hint is not None and hint < 0:
                    out.append(f"negative {replaced} = {hint}")
    out += [f"range {s} {_range_of(env, s, sizes=False)}" for s in sorted(used, key=str)]
    return out


def _interpreter() -> str:
    # Triton's interpreter mode changes the source made for CUDA tensors (no libdevice, no bound launches)
    return f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}"


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The graph's meaning as text, whatever its nodes are named and whatever
    metadata they carry: each node's op, target (an op with its overload) and
    arguments, a node named by its position.  A higher-order op's subgraph is keyed
    by this, not by its code: a subgraph that a cached module held is rebuilt
    without its nodes' metadata (ir/lowered.py: graph_module), from which a
    graph's code takes annotations and comments, and FX's own pickle renames
    nodes (`sin_default` for `sin`)."""
    at = {n: k for k, n in enumerate(gm.graph.nodes)}
    lines = []
    for n in gm.graph.nodes:
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda m: f"%{at[m]}")
        t = n.target
        if n.op == "placeholder":
            target = ""  # a placeholder's target is its name
        elif isinstance(t, str):
            target = t
        elif isinstance(t, (torch._ops.OpOverload, torch._ops.HigherOrderOperator, torch._ops.OpOverloadPacket)):
            target = f"{type(t).__name__} {t}"  # aten.add.Tensor, not add.Scalar's name too
        else:
            target = f"{getattr(t, '__module__', '')}.{getattr(t, '__qualname__', t)}"
        lines.append(f"{n.op} {target} {args!r}")
    return "\n".join(lines)


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
              subgraph: bool = False) -> str | None:
    """The cache key of compiling gm for these inputs with these options, or None
    when this compile does not use the cache.  A higher-order op's `subgraph` is
    keyed by graph_text, any other graph by its code."""
    if not options.graph_cache or options.debug_dir or options.trace:
        return None
    constants = _constant_keys(gm)
    if constants is None:
        return None
    opts = {k: v for k, v in attrs.asdict(options).items() if k not in _UNCACHED}
    # torch's deterministic mode changes what lower makes (embedding gradients: embedding_dense_backward)
    parts = [coil_source_hash(), torch.__version__, f"{sys.version_info[:2]}", _interpreter(),
             graph_text(gm) if subgraph else gm.code,
             f"deterministic={torch.are_deterministic_algorithms_enabled()}",
             *map(_input_key, example_inputs), *constants, repr(sorted(opts.items())),
             *_symbol_ranges(example_inputs), *_origin_keys(gm)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _origin_keys(gm: torch.fx.GraphModule) -> list[str]:
    """The nodes whose `original_aten` lower reads (a decomposed nll_loss's gather
    raises nll_loss's error), which gm.code does not show: by position."""
    from coil.passes.lowerings.indirect import origin_errors

    return [f"origin {k} {n.meta['original_aten']}" for k, n in enumerate(gm.graph.nodes) if origin_errors(n)]


# a graph whose tensor constants hold more elements than this is not cached: hashing
# them would cost about what compiling saves (constants are small: T5's, a scalar)
CONSTANT_KEY_MAX = 1 << 20


def _constant_keys(gm: torch.fx.GraphModule) -> list[str] | None:
    """What the key takes of the graph's tensor constants (get_attr nodes, which
    lower makes inputs the compiled module holds, so the cached module holds
    them too): each one's name, layout and a hash of its bytes; and of its
    higher-order ops' subgraphs: each one's name and a hash of its code and, in
    turn, of its own constants and subgraphs.  None where the graph is not
    cached: a constant that is not a plain dense tensor (a fake, sparse,
    quantized or meta one, a subclass, a submodule's attribute) or too large to
    hash for nothing, or a user's Triton kernel (its `kernel_idx` indexes this
    process's table of kernels)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    out: list[str] = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target):
            return None  # its kernel_idx indexes a table of this process's kernels
        if n.op != "get_attr":
            continue
        value: Any = gm
        for part in str(n.target).split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.fx.GraphModule):  # a higher-order op's subgraph: its code and its own constants
            inner = _constant_keys(value)
            if inner is None:
                return None
            out.append(f"G{n.target}:" + hashlib.sha256("\0".join([graph_text(value), *inner]).encode()).hexdigest())
            continue
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided \
                or value.is_quantized or value.device.type == "meta" or value.numel() > CONSTANT_KEY_MAX:
            return None
        try:
            with unset_fake_temporarily():
                data = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        except (RuntimeError, TypeError):  # bytes that cannot be read so: not cached
            return None
        out.append(f"C{n.target}:{_input_key(value)}:{hashlib.sha256(data).hexdigest()}")
    return out


_SAFE_MODULES = ("_operator", "operator", "math", "builtins")


def _torch_call(node: torch.fx.Node) -> bool:
    """A node whose meaning gm.code spells out: a tensor method, or a function of
    torch's own (or of operator/math), not a user function kept whole in the graph."""
    if node.op in ("placeholder", "output", "call_method"):
        return True
    if node.op != "call_function":
        return False  # get_attr, call_module: state the code only names
    module = getattr(node.target, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.") or module in _SAFE_MODULES


def _plain_tensor(x: Any) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return (isinstance(x, torch.Tensor) and x.layout == torch.strided and not is_traceable_wrapper_subclass(x)
            and not any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())))


def _autocast_on() -> bool:
    return any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))


def may_skip_aot(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether this Dynamo graph may stand in for its AOTAutograd inference graph
    (if AOTAutograd passes it through unchanged): plain static tensors in, no
    autocast, no input that needs grad while grad is on (a training graph), no
    parameters or submodules, and nothing called that gm.code does not spell out."""
    if not all(_plain_tensor(x) or isinstance(x, torch.SymInt) for x in example_inputs) or _autocast_on():
        return False
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs):
        return False
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        return False
    return all(map(_torch_call, gm.graph.nodes))


def dynamo_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
               skippable: bool | None = None, handlers: str = "") -> str | None:
    """The key of a Dynamo graph's link (see the module's docstring), or None when
    this graph may not skip AOTAutograd or this compile does not use the cache
    (`skippable`: may_skip_aot's answer, where the caller has it).  `handlers`: what
    of the backend's handlers decides the graph (TapsChoice.cache_key)."""
    if not options.graph_cache or options.debug_dir or options.trace:
        return None
    if not (may_skip_aot(gm, example_inputs) if skippable is None else skippable):
        return None
    opts = {k: v for k, v in attrs.asdict(options).items() if k not in _UNCACHED}
    state = (f"grad={torch.is_grad_enabled()} inference={torch.is_inference_mode_enabled()} "
             f"dtype={torch.get_default_dtype()} deterministic={torch.are_deterministic_algorithms_enabled()}")
    parts = ["dynamo", coil_source_hash(), torch.__version__, f"{sys.version_info[:2]}", _interpreter(), state, gm.code,
             *_dynamo_input_keys(gm, example_inputs), repr(sorted(opts.items())), handlers]
    if any(isinstance(x, torch.SymInt) for x in example_inputs):
        parts += _guard_keys(example_inputs)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _dynamo_input_keys(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """Each input of a Dynamo graph as its link's key holds it.  A graph of symbolic
    sizes takes SymInts (keyed by their symbols) and tensors of the first call's
    sizes: those are keyed by the sizes its placeholders' fake values give
    (`(s77, 32)`), so one link serves every size the graph's guards admit."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    symbolic = any(isinstance(x, torch.SymInt) for x in example_inputs) and len(places) == len(example_inputs)
    out = []
    for k, x in enumerate(example_inputs):
        fake = places[k].meta.get("example_value") if symbolic else None
        if isinstance(x, torch.SymInt):
            out.append(f"S{x.node.expr}")
        elif isinstance(fake, torch.Tensor) and isinstance(x, torch.Tensor):
            shown = ", ".join(map(str, (*fake.shape, "/", *fake.stride(), "+", fake.storage_offset())))
            out.append(f"T({shown}):{x.dtype}:{x.device}:rg={x.requires_grad}")
        else:
            out.append(f"{_input_key(x)}:rg={getattr(x, 'requires_grad', False)}")
    return out


def load_link(key: str, cache_dir: str | None) -> CompiledModule | None:
    """The compiled graph a Dynamo graph's link points to, or None (no link, or a
    link whose target is gone or does not load)."""
    from coil.backends.runtime import read_bytes

    path = _path(key, cache_dir, ".link")
    raw = read_bytes(str(path)) if path is not None else None
    if raw is None:
        return None
    target = raw.strip()
    if len(target) != 32 or any(c not in b"0123456789abcdef" for c in target):
        log.warning("coil: graph cache link %s is damaged; compiling again", path)
        return None
    return load(target.decode(), cache_dir)


def store_link(key: str, target: str, cache_dir: str | None) -> None:
    """Write the link; one that cannot be written (a read-only cache dir) is logged
    and skipped: the compile it follows has already succeeded."""
    from coil.backends.runtime import write_atomic

    path = _path(key, cache_dir, ".link")
    if path is None:
        return
    try:
        write_atomic(str(path), target.encode())
    except OSError as e:
        log.debug("coil: graph cache link not written (%s: %s)", type(e).__name__, e)


def _path(key: str, cache_dir: str | None, suffix: str = ".pkl") -> Path | None:
    """The entry's path in `<cache dir>/graphs` (created and checked: pickles run
    code when loaded, so a folder others can write is refused with a CoilError),
    or None where the folder cannot be created (a read-only or full disk): then
    the compile goes on uncached."""
    from coil.backends.runtime import CacheUnwritable, cache_dir as base

    try:
        return Path(base(cache_dir, "graphs")) / f"{key}{suffix}"
    except CacheUnwritable as e:
        log.debug("coil: graph cache skipped (%s)", e)
        return None


def load(key: str, cache_dir: str | None) -> CompiledModule | None:
    path = _path(key, cache_dir)
    if path is None or not path.exists():
        return None
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:  # a tensor constant the module holds is made outside AOTAutograd's fake mode (in it: a crash)
        with open(path, "rb") as f, unset_fake_temporarily():
            module = pickle.load(f)
    except Exception as e:  # noqa: BLE001 - a bad entry is rebuilt, never trusted
        log.warning("coil: graph cache entry %s does not load (%s: %s); compiling again", path, type(e).__name__, e)
        return None
    if not isinstance(module, CompiledModule):
        log.warning("coil: graph cache entry %s holds a %s; compiling again", path, type(module).__name__)
        return None
    return module


def store(key: str, module: CompiledModule, cache_dir: str | None) -> None:
    from coil.backends.runtime import write_atomic

    path = _path(key, cache_dir)
    if path is None:
        return
    try:
        write_atomic(str(path), pickle.dumps(module, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as e:  # noqa: BLE001 - a graph that does not pickle is simply not cached
        log.debug("coil: graph not cached (%s: %s)", type(e).__name__, e)


def dump_source(source: str, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options) -> None:
    """Process replay: write a compiled module's source to Options.dump_sources (or
    the environment's COIL_DUMP_SOURCES), named by what it was compiled from (the
    graph's code, the inputs, the options that shape code), not by coil's own
    source, so the same case has the same name before and after a change.  The
    same name with another source (a compile that is not deterministic) is kept
    beside it, numbered."""
    folder = options.dump_sources or os.environ.get("COIL_DUMP_SOURCES")
    if not folder:
        return
    opts = {k: v for k, v in attrs.asdict(options).items() if k not in _UNCACHED}
    parts = [gm.code, *map(_input_key, example_inputs), repr(sorted(opts.items()))]
    name = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    try:
        _write_dump(folder, name, source)
    except OSError as e:  # a folder that cannot be written: the compile goes on, the log says so
        log.warning("coil: cannot dump a source to %s: %s", folder, e)


def dump_sources_observer(run: Run) -> StageHook | None:
    """Options.dump_sources as a pipeline observer: kernel_gen's source, dumped."""
    if not (run.options.dump_sources or os.environ.get("COIL_DUMP_SOURCES")):
        return None

    def hook(index: int, stage: str, ir: Any) -> None:
        if stage == "kernel_gen" and hasattr(ir, "source"):
            dump_source(ir.source, run.gm, run.example_inputs, run.options)

    return hook


def _write_dump(folder: str, name: str, source: str) -> None:
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(source)
    try:
        for n in range(100):  # linked whole, so a reader never sees half a file
            path = os.path.join(folder, f"{name}.py" if n == 0 else f"{name}.{n}.py")
            try:
                os.link(tmp, path)
                return
            except FileExistsError:
                with open(path) as f:
                    if f.read() == source:
                        return
    finally:
        os.unlink(tmp)
