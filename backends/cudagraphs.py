"""CUDA graphs: `torch.compile(mode="reduce-overhead")`, or Options.cuda_graphs.

A compiled graph's call is recorded once into a CUDA graph and replayed after
that: one launch for the whole wrapper, none of its Python.  What this module
decides, and where a person can see it (each decision is logged, and
`CudaGraphed.decisions` keeps them):

- **Whether a graph may be recorded** (`capture_verdict`): not with CPU tensors
  among its inputs or outputs (a replay would reuse the values read when it was
  recorded), not with inputs on several devices, not with an op that waits for
  the GPU (a result sized by the data), not when it writes into an input that is
  copied in (the write would land in the copy).  Such a graph runs as compiled,
  without a CUDA graph, and one log line says why.  A capture that fails for a
  reason not foreseen here falls back the same way.
- **What is copied in**: parameters and buffers (AOTAutograd's static inputs),
  and a backward graph's saved tensors that stay put (parameters, outputs of a
  recording), keep their addresses and are read where they are; every other
  input is copied into a placeholder the graph was recorded with.  Each
  recording keeps its own set (a graph called for every layer copies in the
  first layer's saved input, made outside CUDA graphs); a recording made while
  its saved tensors were fresh gives way once they lie in a pool.  A call whose
  static inputs sit elsewhere (a new pointer set) records another graph.
- **Memory**: each recording allocates in a private pool.  A backward graph is
  recorded into the pool of the forward recording whose outputs it reads, so it
  reuses the forward's freed temporaries, as Inductor's cudagraph trees share one
  pool.  That is safe because a recording's outputs stay allocated to it (they
  are never handed to a later recording), and a recording is replayed only when
  nothing still refers to the outputs that the replay would overwrite: its own
  from the last replay, and those of every recording made after it in its pool
  (they may lie in its freed temporaries).  Otherwise another recording is made
  in a pool of its own, up to `MAX_RECORDINGS` for one set of static addresses
  (a training loop holds the last step's loss while the next forward runs: the
  forward then alternates between two recordings) and `MAX_POINTER_SETS` sets (a
  graph called for each layer of a model); past that the graph runs without CUDA
  graphs.  So outputs never change under the caller's hands, unlike Inductor's,
  which a later step may overwrite.
- **Outputs** are handed out as fresh tensors over the recording's memory
  (`detach()`), so whether anyone still holds one is the count of references to
  its storage.  An output that is a parameter (or a view of one: a weight saved
  transposed for the backward) is made once, when recorded, and handed out as it
  is; one that is a view of an input in a pool (a gradient written into a saved
  tensor's buffer) is made from the caller's input at each replay.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Callable, Sequence

import attrs
import torch

from coil.passes.higher_order import HOST_DECIDES, hop_name

log = logging.getLogger("coil")

# recordings of one compiled graph with one set of static input addresses (another is made
# when the outputs of every earlier one are still held: a training loop holds the last loss)
MAX_RECORDINGS = 4
# sets of static input addresses recorded for one compiled graph: a graph Dynamo compiled
# once and calls for each of a model's layers (a graph break inside the layer) reads each
# layer's parameters, one set a layer
MAX_POINTER_SETS = 32
# the device whose graphs are recorded (the tests simulate the bookkeeping on the CPU)
DEVICE_TYPE = "cuda"


# how an output is made from the caller's inputs: input i itself, or (i, size, stride,
# storage offset from input i's own, whether input i is detached first)
Alias = int | tuple[int, tuple[int, ...], tuple[int, ...], int, bool]


def capture_verdict(example_inputs: Sequence[Any], copied: frozenset[int], mutated: frozenset[int],
                    syncs: Sequence[str]) -> str | None:
    """None when a graph may be recorded, else why not.  `copied`: the inputs
    copied into placeholders; `mutated`: the inputs the graph writes into;
    `syncs`: the ops that wait for the GPU."""
    if syncs:
        why = ("the host reads a tensor to choose what runs next" if syncs[0].startswith("higher_order.")
               else "its result's size depends on the data")
        return f"{syncs[0]} waits for the GPU ({why})"
    from coil.passes.symbolic import has_symbols

    if has_symbols(example_inputs):
        return "its sizes are symbolic (dynamic shapes): a recording holds one size"
    written = sorted(mutated & copied)
    if written:
        return f"it writes into input {written[0]}, which is copied in (not a parameter or buffer)"
    devices = set()
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cuda":
                return f"input {i} is a {x.device.type.upper()} tensor"
            devices.add(x.device)
    if not devices:
        return "no CUDA tensor among its inputs"
    if len(devices) > 1:
        return f"inputs on {len(devices)} devices"
    return None


class _Pool:
    """A private memory pool and the recordings made in it, in order."""

    def __init__(self) -> None:
        self.handle = torch.cuda.graph_pool_handle()
        self.recordings: list[_Recording] = []


class _Recording:
    """One CUDA graph of a compiled graph: its placeholders, the addresses of its
    static inputs, its outputs and how many references each output's storage
    had when nothing outside held it."""

    def __init__(self, graph: Any, pool: _Pool, static_ptrs: list[int | None], placeholders: dict[int, torch.Tensor],
                 outputs: tuple[Any, ...], watched: tuple[int, ...],
                 aliases: dict[int, Alias], fixed: dict[int, torch.Tensor]) -> None:
        self.graph, self.pool = graph, pool
        self.static_ptrs = static_ptrs  # by input index: the address of each static input, None for the others
        # the inputs read in place (the others are copied in), as a list for torch's C comparison
        self.static_idx = tuple(i for i, p in enumerate(static_ptrs) if p is not None)
        self.static_list = list(self.static_idx)
        self.check: Any = None  # torch's C comparison of the static addresses, where it agrees (_choose_check)
        # a backward's saved tensors copied in when recorded (fresh tensors then): read in place
        # by a new recording once they lie in a pool (CudaGraphed._superseded)
        self.copied_saved: tuple[int, ...] = ()
        self.number = 0  # its number among its graph's recordings, for the decisions
        self.placeholders = placeholders
        # the storages of every output (ints: no reference held), the aliases' too
        self.storage_ptrs = frozenset(o.untyped_storage().data_ptr() for o in outputs if isinstance(o, torch.Tensor))
        # an alias is made from the caller's tensor at each replay and not kept here: a
        # reference kept to a backward's output that lies in its forward's memory (a saved
        # tensor's buffer reused for a gradient) would hold the forward's recording forever
        # `fixed`: outputs that are a parameter's (or buffer's) detached self or a view of it,
        # made once when recorded and handed out as they are at every replay (Inductor's
        # cudagraph trees hand out such outputs so): memory outside every pool, where a
        # replay finds the parameter, as the static addresses checked before it say.
        # Making them anew cost MobileNetV2's training step 140 as_strided calls, 0.7 ms
        self.outputs = tuple(fixed[k] if k in fixed else None if k in aliases else o for k, o in enumerate(outputs))
        # (storage, references when only this recording holds it) of each output in the pool;
        # the counts are taken once every storage object here exists (outputs may share one)
        storages = [outputs[i].untyped_storage() for i in watched]
        # the addresses of the memory this recording owns in its pool (an output that is a view
        # of a parameter, or a copied-in input, is not the pool's)
        self.owned = frozenset(s.data_ptr() for s in storages)
        self._storages = [(s, torch._C._storage_Use_Count(s._cdata)) for s in storages]
        # the same, as two tuples walked by C loops on every call (a training step checks
        # and hands out a few hundred outputs: Python-level loops cost more than the checks)
        self._cdatas = tuple(s._cdata for s, _ in self._storages)
        self._bases = tuple(base for _, base in self._storages)
        # what a replay does, prepared once: the copies into the placeholders as one
        # _foreach_copy_, the outputs of the pool detached in one C loop and put in their
        # places among the others (None, numbers) and the views of the caller's inputs
        self._ph_dst = list(placeholders.values())
        self._ph_src_at = tuple(placeholders)
        # outputs that are a copied-in input (its index), or a view of one or of a static input
        # (input, size, stride, offset from the input's own, whether detached first): handed
        # out as the caller's tensor or a view of it
        self._alias_items = tuple(aliases.items())
        self._tensor_at = tuple(k for k, o in enumerate(outputs)
                                if isinstance(o, torch.Tensor) and k not in aliases and k not in fixed)
        self._tensors = tuple(outputs[k] for k in self._tensor_at)
        self._dense = len(self._tensor_at) == len(outputs)  # the detached tensors are the outputs

    def outputs_free(self) -> bool:
        """Whether nothing outside this recording refers to its outputs' memory."""
        return all(map(operator.le, map(_use_count, self._cdatas), self._bases))

    def replayable(self) -> bool:
        """Whether a replay overwrites nothing anyone holds: its own outputs and
        those of the recordings made after it in its pool are all unreferenced."""
        recs = self.pool.recordings
        if recs[-1] is self:
            return self.outputs_free()
        return all(r.outputs_free() for r in recs[recs.index(self):])

    def run(self, args: list[Any]) -> tuple[Any, ...]:
        if self._ph_dst:
            if len(self._ph_dst) == 1:
                self._ph_dst[0].copy_(args[self._ph_src_at[0]])
            else:
                _copy_all(self._ph_dst, [args[i] for i in self._ph_src_at])
        aliased = [(k, _view_of(args, how)) for k, how in self._alias_items]
        args.clear()
        self.graph.replay()
        detached = map(_detach, self._tensors)
        if self._dense:
            return tuple(detached)
        out = list(self.outputs)
        for k, t in zip(self._tensor_at, detached):
            out[k] = t
        for k, t in aliased:
            out[k] = t
        return tuple(out)


_use_count = torch._C._storage_Use_Count
_detach = torch.Tensor.detach


def _copy_each(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    for d, s in zip(dst, src):
        d.copy_(s)


# several placeholders filled in one call (what Inductor's CUDA graph trees call), where torch has it
_copy_all = getattr(torch, "_foreach_copy_", None) or _copy_each


def _input_of(how: Any) -> int:
    return how if isinstance(how, int) else how[0]


def _view_of(args: list[Any], how: Alias) -> Any:
    if isinstance(how, int):
        return args[how]
    i, size, stride, delta, detached = how
    x = args[i].detach() if detached else args[i]
    return x.as_strided(size, stride, x.storage_offset() + delta)


class PoolSet:
    """The pools of one Dynamo graph's compiled graphs (forward, backward,
    inference), so a backward graph finds the pool of the forward it reads."""

    def __init__(self) -> None:
        self.pools: list[_Pool] = []
        self.latest: _Pool | None = None  # the pool of the last recording made
        self._managed: frozenset[int] | None = None  # managed(), until the next recording

    def add(self, pool: _Pool, rec: "_Recording") -> None:
        pool.recordings.append(rec)
        self.latest = pool
        self._managed = None

    def owned(self) -> set[int]:
        """The storages the recordings own in their pools."""
        return {p for pool in self.pools for rec in pool.recordings for p in rec.owned}

    def managed(self) -> frozenset[int]:
        """The storages of every recording's outputs: memory that stays put
        between calls (a pool's, or a parameter's that an output is a view of)."""
        if self._managed is None:
            self._managed = frozenset(p for pool in self.pools for rec in pool.recordings for p in rec.storage_ptrs)
        return self._managed

    def pool_for(self, static: Sequence[torch.Tensor], backward: bool) -> _Pool:
        """The pool whose memory holds one of these inputs (a forward's output a
        backward reads); else, for a backward, the pool of the latest recording
        (its forward's, which ran last); else a new pool.  Only memory a
        recording owns counts: a forward that hands out a view of a parameter (a
        transposed weight saved for the backward) does not draw the next forward
        reading that parameter into its pool, where the two could never replay in
        turn (a training loop holds the last step's loss while the next forward
        runs, so the forward alternates between two recordings)."""
        ptrs = {t.untyped_storage().data_ptr() for t in static}
        for pool in self.pools:
            for rec in pool.recordings:
                if not rec.owned.isdisjoint(ptrs):
                    return pool
        if backward and self.latest is not None:
            return self.latest
        pool = _Pool()
        self.pools.append(pool)
        return pool


class CudaGraphed:
    """A compiled graph's boxed call, replayed from CUDA graphs (the module's
    docstring says how).  `static`: the inputs whose addresses are kept."""

    def __init__(self, call: Callable[[list[Any]], tuple[Any, ...]], kind: str, static: frozenset[int],
                 pools: PoolSet, verdict: str | None, written: frozenset[int] = frozenset()) -> None:
        self.call, self.kind, self.pools = call, kind, pools
        self.static = static  # the inputs that may be read in place; each recording says which it read so
        # inputs whose memory the graph may write over once it has read them (the saved
        # tensors AOTAutograd donates to a backward): copied in, the write lands in the copy
        self.written = written
        self.recordings: list[_Recording] = []
        self.made = 0  # recordings made, superseded ones too
        self.warmed = False
        self.off: str | None = None
        self.decisions: list[str] = []
        if verdict is not None:
            self._turn_off(verdict)

    def _turn_off(self, why: str) -> None:
        self.off = why
        self.decisions.append(f"no CUDA graph: {why}")
        log.warning("coil: %s graph runs without CUDA graphs: %s", self.kind, why)

    def __call__(self, args: list[Any]) -> tuple[Any, ...]:
        if self.off is not None:
            return self.call(args)
        same = 0  # recordings made with the static inputs where they are now
        for rec in self.recordings:
            if self._static_match(rec, args):
                if rec.copied_saved and self._superseded(rec, args):
                    return self(args)
                if rec.replayable():
                    return rec.run(args)
                same += 1
        if not self.warmed:  # the first call compiles kernels and sets up libraries: not recorded
            self.warmed = True
            return self.call(args)
        if same >= MAX_RECORDINGS:
            self._turn_off(f"{MAX_RECORDINGS} recordings with these parameters, and a call that none can replay "
                           "(the outputs of every one still held)")
            return self.call(args)
        if not same and len(self._pointer_sets()) >= MAX_POINTER_SETS:
            self._turn_off(f"{MAX_POINTER_SETS} sets of parameter addresses recorded, and a call with another")
            return self.call(args)
        return self._record(args)

    def _superseded(self, rec: _Recording, args: list[Any]) -> bool:
        """Whether rec, a backward's recording that copies in saved tensors, gives
        way to a new recording: it was made while they were fresh tensors (its
        forward not recorded yet: the first step runs the forward of a graph
        called for several layers without a CUDA graph for its first call), and
        one of them now lies in a pool.  rec is then no longer replayed."""
        managed = self.pools.managed()
        if not any(args[i].untyped_storage().data_ptr() in managed for i in rec.copied_saved):
            return False
        self.recordings.remove(rec)
        self.decisions.append(f"recording {rec.number} superseded: saved tensors it copies in now lie in a pool")
        log.info("coil: %s graph: %s", self.kind, self.decisions[-1])
        return True

    def _pointer_sets(self) -> set[tuple[int | None, ...]]:
        return {tuple(r.static_ptrs) for r in self.recordings}

    @staticmethod
    def _static_match(rec: _Recording, args: list[Any]) -> bool:
        """Whether the inputs rec reads in place are where they were when it was
        recorded: torch's C++ comparison where this torch has it (Inductor's),
        else Python's."""
        if rec.check is not None:
            return bool(rec.check(args, rec.static_ptrs, rec.static_list))
        ptrs = rec.static_ptrs
        return all(args[i].data_ptr() == ptrs[i] for i in rec.static_idx)

    @staticmethod
    def _choose_check(rec: _Recording, args: list[Any]) -> None:
        """Use the C++ comparison only if it agrees on the call being recorded."""
        check = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
        try:
            ok = check is not None and check(args, rec.static_ptrs, rec.static_list) is True
        except (TypeError, RuntimeError):
            ok = False
        rec.check = check if ok else None

    def _static_now(self, args: list[Any]) -> frozenset[int]:
        """The inputs this recording reads in place.  A forward's: its parameters
        and buffers.  A backward's, call by call: a saved tensor is read in place
        where it stays put, a parameter or an output of a recording (in a pool);
        one the forward saved from its own inputs is copied in where it is a fresh
        tensor.  A graph Dynamo compiled once for every layer of a model (a graph
        break inside the layer) saves the layer's input: the output of the
        layer before, in a pool, but for the first layer the output of code that
        ran without CUDA graphs, new at every step.  Decided once for all calls,
        Whisper's encoder recorded its first layer's backward anew at every step
        until the graph went off CUDA graphs (H200, 2026-12-04: its
        reduce-overhead training step at 1.46x Inductor's time)."""
        if self.kind != "backward":
            return self.static
        managed = self.pools.managed()
        return frozenset(i for i in self.static if isinstance(args[i], torch.nn.Parameter)
                         or args[i].untyped_storage().data_ptr() in managed)

    def _record(self, args: list[Any]) -> tuple[Any, ...]:
        static = self._static_now(args)
        static_idx = sorted(static)
        static_inputs = [args[i] for i in static_idx]
        pool = self.pools.pool_for(static_inputs, self.kind == "backward")
        placeholders: dict[int, torch.Tensor] = {}
        inputs = list(args)
        for i, x in enumerate(args):
            if i not in static and isinstance(x, torch.Tensor):
                ph = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                ph.copy_(x)
                placeholders[i] = inputs[i] = ph
        static_ptrs: list[int | None] = [x.data_ptr() if i in static else None for i, x in enumerate(args)]
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph, pool=pool.handle):
                outputs = tuple(self.call(list(inputs)))
        except Exception as e:  # noqa: BLE001 - an op that cannot be captured: run as compiled
            self._turn_off(f"capture failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            torch.cuda.synchronize()
            return self.call(args)
        why = self._outputs_verdict(outputs)
        if why is not None:
            self._turn_off(why)
            return self.call(args)
        # an output in the copy of an input the graph writes over (a gradient in a donated
        # saved tensor's buffer) is the graph's own result: handed out over the copy, not
        # as the caller's tensor (which the write never reached)
        aliases = self._aliases(outputs, {i: ph for i, ph in placeholders.items() if i not in self.written})
        odd = [k for k in aliases if outputs[k].dtype != placeholders[_input_of(aliases[k])].dtype]
        if odd:  # a view in another dtype: as_strided of the caller's tensor cannot make it
            self._turn_off(f"output {odd[0]} is a view of a copied-in input in another dtype")
            return self.call(args)
        # a view of a static input in its dtype (a weight's transpose, a saved tensor's buffer
        # a backward reused): made from the caller's input, which a replay finds in place;
        # once, now, where that input lies outside every pool (a parameter or buffer), else
        # at each replay (an output kept here in another recording's memory would hold it)
        statics = {i: args[i] for i in static_idx}
        in_pools = self.pools.owned()
        fixed: dict[int, torch.Tensor] = {}
        for k, how in self._aliases(outputs, statics, detached=True).items():
            x = statics[_input_of(how)]
            if outputs[k].dtype != x.dtype:
                continue
            if x.untyped_storage().data_ptr() in in_pools:
                aliases[k] = how
            else:
                fixed[k] = _view_of(args, how)
        outside = {x.untyped_storage().data_ptr() for x in static_inputs}
        outside |= {ph.untyped_storage().data_ptr() for i, ph in placeholders.items() if i not in self.written}
        watched = tuple(i for i, o in enumerate(outputs)
                        if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in outside)
        rec = _Recording(graph, pool, static_ptrs, placeholders, outputs, watched, aliases, fixed)
        self._choose_check(rec, args)
        if self.kind == "backward":
            rec.copied_saved = tuple(i for i in sorted(self.static - static) if isinstance(args[i], torch.Tensor))
        self.pools.add(pool, rec)
        self.recordings.append(rec)
        self.made += 1
        rec.number = n = self.made
        self.decisions.append(f"recording {n}: {len(static_idx)} inputs read in place, {len(placeholders)} "
                              f"copied in; pool {self.pools.pools.index(pool)} (recording {len(pool.recordings)} in it)")
        log.info("coil: %s graph recorded into a CUDA graph: %s", self.kind, self.decisions[-1])
        return rec.run(args)

    @staticmethod
    def _outputs_verdict(outputs: tuple[Any, ...]) -> str | None:
        for i, o in enumerate(outputs):
            if isinstance(o, torch.Tensor) and o.device.type != DEVICE_TYPE:
                return f"output {i} is a {o.device.type.upper()} tensor"
        return None

    @staticmethod
    def _aliases(outputs: tuple[Any, ...], inputs: dict[int, torch.Tensor], detached: bool = False
                 ) -> dict[int, Alias]:
        """Outputs that are one of these inputs or a view of one (a forward saves
        its input for the backward): how to make each from the caller's input.
        `detached`: a view of the input's detached self (a parameter's view
        must not join its autograd graph), never the input itself."""
        by_storage = {x.untyped_storage().data_ptr(): (i, x) for i, x in inputs.items()}
        out: dict[int, Alias] = {}
        for k, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor) or (hit := by_storage.get(o.untyped_storage().data_ptr())) is None:
                continue
            i, x = hit
            same = o.size() == x.size() and o.stride() == x.stride() and o.storage_offset() == x.storage_offset()
            out[k] = i if same and not detached else (i, tuple(o.size()), tuple(o.stride()),
                                                       o.storage_offset() - x.storage_offset(), detached)
        return out


def graph_facts(gm: torch.fx.GraphModule, kind: str) -> tuple[frozenset[int], frozenset[int], list[str]]:
    """(static inputs, mutated inputs, ops that wait for the GPU) of an FX graph
    AOTAutograd hands over, or of a Dynamo graph (one loaded through the graph
    cache's link, AOTAutograd skipped).  Static: AOTAutograd's static input
    indices (parameters and buffers) for a forward or inference graph, or where
    AOTAutograd did not run, the placeholders Dynamo marked static (its
    `_dynamo_static_input_type`, which AOTAutograd reads too: a module's
    parameters and buffers); for a backward graph every input but the incoming
    gradients (`tangents_*`): saved tensors are forward outputs or parameters."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders)}
    if kind == "backward":
        static = frozenset(i for i, n in enumerate(placeholders) if "tangents" not in n.name)
    else:
        from torch._guards import TracingContext

        ctx = TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None)
        if meta is not None:
            static = frozenset(getattr(meta, "static_input_indices", None) or ())
        else:  # a Dynamo graph: without it a buffer (a rotary embedding's inv_freq) was copied in at every replay
            static = frozenset(i for i, n in enumerate(placeholders)
                               if (n.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type"))
    mutated: set[int] = set()
    syncs: list[str] = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is not None:
            for a, arg in zip(schema.arguments, n.args):
                if a.alias_info is not None and a.alias_info.is_write and arg in index:
                    mutated.add(index[arg])
        name = str(n.target)
        if any(s in name for s in ("nonzero", "masked_select", "_local_scalar_dense", "unique", "repeat_interleave")):
            syncs.append(name)
        elif hop_name(n.target) in HOST_DECIDES:  # torch.cond's branch, while_loop's end
            syncs.append(f"higher_order.{hop_name(n.target)}")
    return static, frozenset(mutated), syncs


@attrs.frozen
class GraphPlan:
    """What CudaGraphed needs of a compiled graph beyond its call, decided once
    from the FX graph and its example inputs (`plan`): the inputs read in place
    (`static`), why the graph may not be recorded (`verdict`, None: it may), and
    the inputs it may write over (`written`).  Small and picklable, so a graph
    loaded through AOTAutograd's cache (backends/aot_cache.py), whose FX graph is
    not at hand, replays CUDA graphs as the compiled one did."""

    kind: str
    static: frozenset[int]
    verdict: str | None
    written: frozenset[int] = frozenset()

    def graphed(self, run: Callable[[list[Any]], tuple[Any, ...]], pools: PoolSet) -> CudaGraphed:
        """`run` replayed from CUDA graphs recorded in `pools`, by this plan."""
        return CudaGraphed(run, self.kind, self.static, pools, self.verdict, self.written)


def plan(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str, written: Sequence[int] = ()
         ) -> GraphPlan:
    """The GraphPlan of a compiled graph: its static inputs (graph_facts', and
    parameters) among the tensors, and capture_verdict over the rest.  `written`:
    the inputs the compiled graph may write over (donated: Options.donated_inputs)."""
    static, mutated, syncs = graph_facts(gm, kind)
    static = frozenset(i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)
                       and (i in static or isinstance(x, torch.nn.Parameter)))
    copied = frozenset(i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)) - static
    return GraphPlan(kind, static, capture_verdict(example_inputs, copied, mutated, syncs), frozenset(written))


def wrap(run: Callable[[list[Any]], tuple[Any, ...]], gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
         kind: str, pools: PoolSet, written: Sequence[int] = ()) -> CudaGraphed:
    """The boxed call `run` of a compiled graph, replayed from CUDA graphs where
    the graph may be recorded (capture_verdict): `plan(...).graphed(run, pools)`."""
    return plan(gm, example_inputs, kind, written).graphed(run, pools)
