"""Pipeline: a flat tuple of named passes, run in order, with a between-pass step
that verifies and traces, and observers handed each stage's IR (coil.default_pipeline
adds coil's two: Options.debug_dir's files and Options.dump_sources's sources).
`replace` and `insert_after` return new pipelines."""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeVar

import attrs
import torch

from coil.errors import CoilError
from coil.options import Options

if TYPE_CHECKING:
    from coil.ir.buffers import BufferGraph
    from coil.ir.fused import FusedSchedule
    from coil.ir.kernel import KernelProgram
    from coil.ir.lowered import LoweredGraph
    from coil.ir.memory import MemoryPlan
    from coil.ir.module import CompiledModule
    from coil.ir.schedule import ScheduleGraph
    from coil.ir.wrapper import WrapperProgram
    from coil.passes.lower import FxGraph

log = logging.getLogger("coil.trace")

In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", covariant=True)


class Pass(Protocol[In, Out]):
    """A pass from language In to language Out: `def name(ir: In, options) -> Out`,
    pure.  A user's pass of any parameter names fits; Pass[Any, Any] is any pass."""

    def __call__(self, ir: In, options: Options, /) -> Out: ...


# the default stages, by the languages they read and return
Lower = Pass["FxGraph", "LoweredGraph"]
Realize = Pass["LoweredGraph", "BufferGraph"]
ExtractDeps = Pass["BufferGraph", "ScheduleGraph"]
Fuse = Pass["ScheduleGraph", "FusedSchedule"]
Overlap = Pass["FusedSchedule", "FusedSchedule"]
PlanMemory = Pass["FusedSchedule", "MemoryPlan"]
ScheduleKernels = Pass["MemoryPlan", "KernelProgram"]
Wrap = Pass["KernelProgram", "WrapperProgram"]
KernelGen = Pass["WrapperProgram", "CompiledModule"]


@attrs.frozen
class Run:
    """What one Pipeline.run compiles, handed to each observer as the run starts."""

    gm: torch.fx.GraphModule
    example_inputs: tuple[Any, ...]
    options: Options  # its target resolved
    kind: str  # forward, backward, inference or graph: names the graph's debug_dir folder


StageHook = Callable[[int, str, Any], None]  # after each stage: (its index, its name, the IR it returned)
Observer = Callable[[Run], "StageHook | None"]  # per run: its stage hook, or None when it has nothing to do


def resolve_target(options: Options, example_inputs: Sequence[Any], gm: torch.fx.GraphModule | None = None
                   ) -> Options:
    """`target="auto"`: triton for a graph on CUDA, cpp for one on the CPU; the
    graph's device is its inputs' or, with `gm`, that of the tensors it makes
    (`lower.compute_device`)."""
    if options.target != "auto":
        return options
    from coil.passes.lower import compute_device

    cuda = compute_device(gm, example_inputs).startswith("cuda")
    return options.replace(target="triton" if cuda else "cpp")


def enable_trace() -> None:
    if not any(getattr(h, "_coil", False) for h in log.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[coil] %(message)s"))
        h._coil = True  # type: ignore[attr-defined]
        log.addHandler(h)
    log.setLevel(logging.DEBUG)
    log.propagate = False


@attrs.frozen
class Pipeline:
    """The passes, and the observers each run hands every stage's IR to (after it is
    verified).  A pipeline made from `coil.default_pipeline()` keeps its observers
    through replace and insert_after; one built from bare passes has none."""

    passes: tuple[tuple[str, Pass[Any, Any]], ...]
    observers: tuple[Observer, ...] = ()

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.passes)

    def _index(self, name: str) -> int:
        if name not in self.stages:
            raise KeyError(f"no stage {name!r}; stages are {self.stages}")
        return self.stages.index(name)

    def replace(self, name: str, fn: Pass[Any, Any]) -> Pipeline:
        i = self._index(name)
        return attrs.evolve(self, passes=self.passes[:i] + ((name, fn),) + self.passes[i + 1 :])

    def insert_after(self, name: str, fn: Pass[Any, Any], new_name: str | None = None) -> Pipeline:
        i = self._index(name)
        label = new_name or str(getattr(fn, "__name__", "custom"))
        return attrs.evolve(self, passes=self.passes[: i + 1] + ((label, fn),) + self.passes[i + 1 :])

    def run(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], until: str | None = None,
            options: Options | None = None, *, kind: str = "graph") -> Any:
        """Run the stages in order; return the IR after stage `until` (the
        CompiledModule when None).  `kind` (forward, backward or inference through
        torch.compile) is handed to the observers: the debug_dir observer names this
        graph's folder `<debug_dir>/<n>_<kind>` by it."""
        from coil.passes.lower import FxGraph

        options = resolve_target(options or Options.from_env(), example_inputs, gm)
        if until is not None:
            self._index(until)
        if options.trace:
            enable_trace()
        run = Run(gm, tuple(example_inputs), options, kind)
        hooks = [h for h in (observe(run) for observe in self.observers) if h is not None]
        ir: Any = FxGraph(gm, tuple(example_inputs))
        for i, (name, fn) in enumerate(self.passes):
            t0 = time.perf_counter()
            try:
                ir = fn(ir, options)
            except CoilError as e:
                if e.stage is None:
                    raise CoilError(str(e), stage=name, node=e.node) from e
                raise
            except Exception as e:  # noqa: BLE001 - name the stage
                raise CoilError(f"{type(e).__name__}: {e}", stage=name) from e
            log.debug("stage %s done in %.1f ms -> %s", name, 1e3 * (time.perf_counter() - t0), type(ir).__name__)
            self._check_language(i, ir)
            if options.verify:
                verify_stage(ir, name)
            for hook in hooks:
                hook(i, name, ir)
            if name == until:
                return ir
        return ir

    def _check_language(self, i: int, ir: Any) -> None:
        """Stage i's output is of the language its name promises (a default stage's
        name, even when replaced) or, for a stage of another name, of the language
        the next stage reads; else the stage that returned it is blamed, not the
        one that would trip over it.  A stage inserted with insert_after may thus
        return what it got (a checker)."""
        name = self.passes[i][0]
        reads, returns = stage_languages()
        if name in returns:
            expected, why = returns[name], f"a {name!r} stage must return"
        elif i + 1 < len(self.passes) and self.passes[i + 1][0] in reads:
            after = self.passes[i + 1][0]
            expected, why = reads[after], f"the next stage, {after!r}, reads"
        else:
            return
        if not isinstance(ir, expected):
            raise CoilError(f"stage {name!r} returned {type(ir).__name__}, but {why} a {expected.__name__}",
                            stage=name)


def verify_stage(ir: Any, stage: str) -> None:
    """Run the verifier of ir's language (none for a language coil does not know: a
    user's stage may return one).  A broken invariant is the verifier's VerifyError;
    any other exception is a bug in the verifier itself, raised as a CoilError that
    names the stage, with the verifier's exception and traceback as its cause."""
    from coil.ir.verify import VerifyError, verifier_of

    check = verifier_of(ir)
    if check is None:
        return
    try:
        check(ir, stage)
    except VerifyError:
        raise
    except Exception as e:  # noqa: BLE001 - a verifier that breaks on this IR names the stage
        raise CoilError(f"verifying {type(ir).__name__}: {type(e).__name__}: {e}", stage=stage) from e


@functools.lru_cache(maxsize=1)
def stage_languages() -> tuple[dict[str, type], dict[str, type]]:
    """The default stages' languages: (what each reads, what each returns)."""
    from coil.ir.buffers import BufferGraph
    from coil.ir.fused import FusedSchedule
    from coil.ir.kernel import KernelProgram
    from coil.ir.lowered import LoweredGraph
    from coil.ir.memory import MemoryPlan
    from coil.ir.module import CompiledModule
    from coil.ir.schedule import ScheduleGraph
    from coil.ir.wrapper import WrapperProgram
    from coil.passes.lower import FxGraph

    chain: tuple[tuple[str, type], ...] = (
        ("lower", LoweredGraph), ("realize", BufferGraph), ("extract_deps", ScheduleGraph),
        ("fuse", FusedSchedule), ("overlap", FusedSchedule), ("plan_memory", MemoryPlan), ("schedule_kernels", KernelProgram),
        ("wrap", WrapperProgram), ("kernel_gen", CompiledModule),
    )
    reads = {name: (FxGraph if k == 0 else chain[k - 1][1]) for k, (name, _) in enumerate(chain)}
    return reads, dict(chain)


def default_pipeline(kernel_gen: KernelGen) -> Pipeline:
    """The default passes, ending with the backends' stage, `kernel_gen`, handed in
    (passes/ imports no backend); `coil.default_pipeline()` hands in
    coil.backends.kernel_gen and adds coil's observers (Options.debug_dir,
    Options.dump_sources).  Each pass is typed by its stage, so the type checker
    holds it to the languages that stage reads and returns."""
    from coil.passes.extract_deps import extract_deps
    from coil.passes.fuse import fuse
    from coil.passes.lower import lower
    from coil.passes.overlap import overlap
    from coil.passes.plan_memory import plan_memory
    from coil.passes.realize import realize
    from coil.passes.schedule_kernels import schedule_kernels
    from coil.passes.wrap import wrap

    stages: tuple[tuple[str, Lower], tuple[str, Realize], tuple[str, ExtractDeps], tuple[str, Fuse],
                  tuple[str, Overlap], tuple[str, PlanMemory], tuple[str, ScheduleKernels], tuple[str, Wrap],
                  tuple[str, KernelGen]] = (
        ("lower", lower),
        ("realize", realize),
        ("extract_deps", extract_deps),
        ("fuse", fuse),
        ("overlap", overlap),  # collectives issued early, waited late
        ("plan_memory", plan_memory),
        ("schedule_kernels", schedule_kernels),
        ("wrap", wrap),
        ("kernel_gen", kernel_gen),
    )
    return Pipeline(stages)
