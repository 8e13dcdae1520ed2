"""AOTAutograd's cache for coil's graphs: a warm start skips AOTAutograd's trace.

Inductor's warm start loads AOTAutograd's result (the forward and backward
graphs' runtime wrappers and metadata) from torch's AOTAutogradCache; coil, a
plain custom backend, traced every training graph again at every start: Llama
training at the H100 models size spent 5.3 s of a 9.4 s warm first call there,
against Inductor's 1.3 s backend.

torch lets a backend's graphs into that cache when its compilers are
`SerializableAOTDispatchCompiler`s returning `OutputCode`s that pickle, stored
whole in the entry ("bundled").  coil's OutputCode pickles as its graph-cache key
and the options it compiled with; loading it loads the compiled graph from coil's
graph cache (`coil.load_compiled`).  A key whose graph is gone (another
COIL_CACHE_DIR, a cleaned folder) is a cache miss, and AOTAutograd traces and
coil compiles as before.

What keeps a coil entry from serving another compile:
- torch's key covers the Dynamo graph, its inputs, grad and autocast state, and
  the functorch and Inductor configs; `scope` adds coil's part through
  `torch.compiler.config.cache_key_tag` (coil's source hash, its options, the
  cache folder, TRITON_INTERPRET), so coil's entries never meet Inductor's or
  those of other options;
- a graph whose call needs more than its compiled module is never stored
  (prepare_for_serialization refuses it): one run eagerly, one whose SymInt
  ranges coil assumed (its eager fallback needs the graph), one with opaque
  inputs, one compiled without the graph cache.

A graph compiled with CUDA graphs (`mode="reduce-overhead"`) is stored with its
`cudagraphs.GraphPlan` (which inputs are read in place, whether it may be
recorded), so loading it needs no FX graph: before, such graphs bypassed the
cache, and a warm reduce-overhead training start traced AOTAutograd again (3.5 s
against the default mode's 1.6 for the small Llama on an H100, Inductor's 1.1).
A loaded forward and backward record into one PoolSet, the one the backend call
made for them, as compiled ones do (`scope` hands it to `post_compile`).

Only training graphs of Options.aot_cache_nodes Dynamo nodes and up go in
(`usable`: torch's key has a cost of its own).  torch stores a backend's
OutputCode only with `functorch.config.bundled_autograd_cache` on.  `scope` turns
it on for the backend call (the key, an inference graph's entry); a training
graph's entry is written after its backward compiles, at the first backward,
outside that call, so the backward's compiler turns it on then, and the entry's
writing or the backward's first call puts it back (`_bundled_until_first_call`).
`torch._functorch.config.enable_autograd_cache = False` turns all of this off, as
it does for Inductor."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, FXGraphCacheMiss
from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
from torch._inductor.output_code import OutputCode

from coil.options import Options

if TYPE_CHECKING:
    from coil.backends.cudagraphs import GraphPlan, PoolSet

log = logging.getLogger("coil")


def key_tag(options: Options, handlers: str = "") -> str:
    """coil's part of AOTAutograd's cache key: what decides coil's compile of a
    graph beyond what torch keys (torch's version, the graph, its inputs), the
    backend's handlers (`handlers`: TapsChoice.cache_key, whose decompositions shape
    the joint graph) among it."""
    from coil.backends.runtime import configured_dir
    from coil.graph_cache import coil_source_hash

    parts = [coil_source_hash(), repr(options.replace(aot_cache_nodes=0)),
             os.path.realpath(configured_dir(options.cache_dir)),
             f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}", handlers]
    return "coil-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def usable(options: Options, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether this Dynamo graph's AOTAutograd result goes into AOTAutograd's cache:
    a training graph (an input needs grad, grad is on) of at least
    Options.aot_cache_nodes nodes, coil's graph cache on (the entries point into
    it), no debug output (a debug_dir's files come from compiling), torch's
    autograd cache on.  torch's key costs each process about half a second at its
    first use on a 2-core VM (it hashes torch's and Triton's sources; Inductor's
    codegen it would import too is skipped, `key_without_inductor_codegen`): more
    than the trace of a small graph, or of an inference graph, saves (and the
    graph cache's links already skip AOTAutograd for most inference graphs)."""
    training = torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in example_inputs)
    big = 0 <= options.aot_cache_nodes <= len(gm.graph.nodes)
    return bool(training and big and options.graph_cache and not options.debug_dir and not options.trace
                and torch._functorch.config.enable_autograd_cache)


# the PoolSet of the backend call in progress (`scope`): AOTAutograd calls post_compile with
# no argument of coil's, so a loaded graph finds its CUDA graphs' pools here
_POOLS: contextvars.ContextVar[PoolSet | None] = contextvars.ContextVar("coil_aot_cache_pools", default=None)


@contextlib.contextmanager
def scope(options: Options, pools: PoolSet | None = None, handlers: str = "") -> Iterator[None]:
    """The backend call's settings: coil's key tag after the user's own, bundled
    entries (see the module's docstring), torch's key without Inductor's codegen
    (`key_without_inductor_codegen`), and `pools`, the PoolSet the call's graphs
    record their CUDA graphs in (with Options.cuda_graphs), for graphs loaded
    through the cache; `handlers` goes into the key tag (key_tag)."""
    tag = torch.compiler.config.cache_key_tag
    token = _POOLS.set(pools)
    try:
        with torch.compiler.config.patch(cache_key_tag=f"{tag}{key_tag(options, handlers)}"), \
                torch._functorch.config.patch(bundled_autograd_cache=True), key_without_inductor_codegen():
            yield
    finally:
        _POOLS.reset(token)


@contextlib.contextmanager
def key_without_inductor_codegen() -> Iterator[None]:
    """torch's key (codecache.FxGraphHashDetails) first registers Inductor's codegen
    for every device, importing all of it, so as to hash the graph passes a device
    backend registered with it: 0.7 s of coil's 1.7 s warm backend call for Llama
    training on a 2-core VM, for code coil never runs.  Within this scope the key
    skips that registration and reads the passes registered so far, without the
    devices that registered none: the same key whether or not Inductor ran in
    this process before, and a device backend's own pass still in it.  A torch
    without these two names is left as it is."""
    from torch._inductor import codecache

    names = ("init_backend_registration", "custom_backend_passes")
    saved = {n: getattr(codecache, n, None) for n in names}
    if not callable(saved["init_backend_registration"]) or not isinstance(saved["custom_backend_passes"], dict):
        yield
        return
    codecache.init_backend_registration = _registered_elsewhere
    codecache.custom_backend_passes = {d: p for d, p in saved["custom_backend_passes"].items() if p is not None}
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(codecache, n, v)


def _registered_elsewhere() -> None:
    """Inductor's codegen registration, skipped for coil's key: Inductor registers
    it itself where it compiles (its other callers import the real one)."""


def _bundled_until_first_call(code: "CoilOutputCode") -> None:
    """Bundled entries on from a backward's compile to its first call: AOTAutograd
    writes the training graph's entry in between (runtime_wrappers: the lazy
    backward's compile, then try_save_cache_entry, then the call).  The entry's
    writing (prepare_for_serialization) puts it back too, in case the call never
    comes (a check between them failing); only once."""
    cfg = torch._functorch.config
    if cfg.bundled_autograd_cache:
        return
    cfg.bundled_autograd_cache = True
    pending = [True]

    def restore() -> None:
        if pending:
            pending.clear()
            cfg.bundled_autograd_cache = False

    code.on_first_call = restore


def serializable(compile_one: Callable[[torch.fx.GraphModule, Sequence[Any]], Any], kind: str) -> Any:
    """`compile_one` (backends/dynamo.py: a graph to a boxed callable) as a compiler
    AOTAutograd may cache: each result wrapped in a CoilOutputCode."""

    def compile_cached(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CoilOutputCode:
        start, before = time.time_ns(), dict(counters["coil"])
        code = CoilOutputCode.made(kind, compile_one(gm, example_inputs))
        code._time_taken_ns = time.time_ns() - start  # the cache's "time saved" on a hit
        # what the compile counted (compiled, symbolic), counted again by a load: a test or
        # a benchmark reading torch._dynamo.utils.counters["coil"] sees the same either way
        code.counted = tuple(sorted((k, v - before.get(k, 0)) for k, v in counters["coil"].items()
                                    if v != before.get(k, 0)))
        if kind == "backward":
            _bundled_until_first_call(code)
        return code

    return SerializableAOTDispatchCompiler(CoilOutputCode, compile_cached)


class CoilOutputCode(OutputCode):  # type: ignore[misc]
    """A graph coil compiled, as AOTAutograd's cache holds it: `kind` (forward,
    backward, inference), the graph-cache `key` and the `options` it compiled
    with; live, the boxed `call` and the `compiled` graph.  Not a dataclass
    (OutputCode is): its fields are coil's."""

    def __init__(self, kind: str, key: str | None, options: Options | None, call: Callable[[list[Any]], Any],
                 compiled: Any, refused: str | None, graph_plan: GraphPlan | None = None) -> None:
        self.kind = kind
        self.key = key
        self.options = options
        self.graph_plan = graph_plan  # its CUDA graphs' cudagraphs.GraphPlan, with Options.cuda_graphs
        self.call: Callable[[list[Any]], Any] | None = call
        self.compiled = compiled
        self.refused = refused  # why this graph is not stored, or None
        self.on_first_call: Callable[[], None] | None = None
        self.counted: tuple[tuple[str, int], ...] = ()  # counters["coil"] the compile added
        self._time_taken_ns = 0
        self._boxed_call = True  # on the instance: torch._dynamo.disable's wrapper copies its __dict__

    @classmethod
    def made(cls, kind: str, run: Any) -> "CoilOutputCode":
        """The OutputCode of compile_one's result `run`: a boxed call with
        `compiled` and `options` attributes when coil compiled the graph; an
        unboxed function (the graph's forward) when it runs eagerly."""
        compiled = getattr(run, "compiled", None)
        options = getattr(run, "options", None)
        call = run
        if not getattr(run, "_boxed_call", False):
            def call(args: list[Any]) -> Any:
                return run(*args)

        graph_plan = getattr(run, "graph_plan", None)
        refused: str | None = None
        if compiled is None:
            refused = "it runs eagerly"
        elif options is None:
            refused = "it passes opaque inputs through"
        elif not compiled.cache_key:
            refused = "compiled without the graph cache"
        elif getattr(compiled, "assumed_ranges", ()):
            refused = "its SymInt ranges are assumed"
        elif options.cuda_graphs and graph_plan is None:
            refused = "it replays CUDA graphs without a plan"
        return cls(kind, getattr(compiled, "cache_key", None), options, call, compiled, refused, graph_plan)

    # AOTAutograd writes an Inductor entry (a FxGraphCache key) for a callable with
    # this attribute; torch 2.11 asks with hasattr, so it must be absent
    @property
    def _fx_graph_cache_key(self) -> str:  # type: ignore[override]
        raise AttributeError("_fx_graph_cache_key")

    @property
    def _fx_graph_cache_debug_lines(self) -> list[str]:  # type: ignore[override]
        raise AttributeError("_fx_graph_cache_debug_lines")

    def __repr__(self) -> str:
        return f"CoilOutputCode({self.kind}, key={self.key}, refused={self.refused!r})"

    def __call__(self, inputs: list[Any]) -> Any:
        if self.on_first_call is not None:
            self.on_first_call()
            self.on_first_call = None
        assert self.call is not None, "a CoilOutputCode called before post_compile"
        return self.call(inputs)

    def prepare_for_serialization(self) -> None:
        # on AOTAutograd's shallow copy of the live object, after the entry was made
        if self.on_first_call is not None:
            self.on_first_call()
        if self.refused is not None:
            raise BypassAOTAutogradCache(f"coil: the {self.kind} graph is not cached: {self.refused}")
        self.call = None
        self.compiled = None
        self.on_first_call = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        if self.call is not None:
            return
        from coil import load_compiled
        from coil.backends.dynamo import graph_call

        assert self.key is not None and self.options is not None
        compiled = load_compiled(self.key, self.options)
        if compiled is None:
            raise FXGraphCacheMiss(f"coil: graph {self.key} is not in the graph cache")
        self.compiled = compiled
        self.call = graph_call(compiled, self.kind)
        if self.graph_plan is not None:
            from coil.backends.cudagraphs import PoolSet

            pools = _POOLS.get()
            self.call = self.graph_plan.graphed(self.call, pools if pools is not None else PoolSet())
        log.debug("coil: loaded %s graph through AOTAutograd's cache", self.kind)
        for name, n in self.counted:
            counters["coil"][name] += n
        counters["coil"]["aot_cache_hits"] += 1

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass
