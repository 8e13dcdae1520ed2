"""Pipeline: a flat tuple of named passes with a between-pass callback that
verifies, traces and dumps.  `replace` and `insert_after` return new pipelines."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Sequence

import attrs
import torch

from coil.errors import CoilError
from coil.options import Options

log = logging.getLogger("coil.trace")

Pass = Callable[[Any, Options], Any]


def resolve_target(options: Options, example_inputs: Sequence[Any]) -> Options:
    """`target="auto"`: triton for CUDA tensors, cpp for CPU tensors."""
    if options.target != "auto":
        return options
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
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
    passes: tuple[tuple[str, Pass], ...]

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.passes)

    def _index(self, name: str) -> int:
        if name not in self.stages:
            raise KeyError(f"no stage {name!r}; stages are {self.stages}")
        return self.stages.index(name)

    def replace(self, name: str, fn: Pass) -> "Pipeline":
        i = self._index(name)
        return Pipeline(self.passes[:i] + ((name, fn),) + self.passes[i + 1 :])

    def insert_after(self, name: str, fn: Pass, new_name: str | None = None) -> "Pipeline":
        i = self._index(name)
        label = new_name or str(getattr(fn, "__name__", "custom"))
        return Pipeline(self.passes[: i + 1] + ((label, fn),) + self.passes[i + 1 :])

    def run(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], until: str | None = None,
            options: Options | None = None, *, kind: str = "graph") -> Any:
        """Run the stages in order; return the IR after stage `until` (the
        CompiledModule when None).  With Options.debug_dir, this graph's files go
        to a folder of their own, `<debug_dir>/<n>_<kind>` (kind: forward, backward
        or inference through torch.compile)."""
        from coil.ir.verify import VerifyError, verifier_of
        from coil.passes.lower import FxGraph

        options = resolve_target(options or Options.from_env(), example_inputs)
        if until is not None:
            self._index(until)
        if options.trace:
            enable_trace()
        debug_dir = None
        if options.debug_dir:
            from coil.report import new_graph_dir

            debug_dir = new_graph_dir(options.debug_dir, kind)
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
            check = verifier_of(ir) if options.verify else None  # None too: a language coil does not know
            if check is not None:
                try:
                    check(ir, name)
                except VerifyError:
                    raise
                except Exception as e:  # noqa: BLE001 - a verifier that breaks on this IR names the stage
                    raise CoilError(f"verifying {type(ir).__name__}: {type(e).__name__}: {e}", stage=name) from e
            if debug_dir is not None:
                from coil.report import write_debug_dir

                write_debug_dir(i, name, ir, debug_dir)
            if name == "kernel_gen" and hasattr(ir, "source"):
                from coil.graph_cache import dump_source

                dump_source(ir.source, gm, example_inputs, options)
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


@functools.lru_cache(maxsize=1)
def stage_languages() -> tuple[dict[str, type], dict[str, type]]:
    """The default stages' languages: (what each reads, what each returns)."""
    from coil.ir.buffers import BufferGraph
    from coil.ir.fused import FusedSchedule
    from coil.ir.lowered import LoweredGraph
    from coil.ir.memory import MemoryPlan
    from coil.ir.module import CompiledModule
    from coil.ir.schedule import ScheduleGraph
    from coil.ir.wrapper import WrapperProgram
    from coil.passes.lower import FxGraph

    chain: tuple[tuple[str, type], ...] = (
        ("lower", LoweredGraph), ("realize", BufferGraph), ("extract_deps", ScheduleGraph),
        ("fuse", FusedSchedule), ("plan_memory", MemoryPlan), ("wrap", WrapperProgram),
        ("kernel_gen", CompiledModule),
    )
    reads = {name: (FxGraph if k == 0 else chain[k - 1][1]) for k, (name, _) in enumerate(chain)}
    return reads, dict(chain)


def default_pipeline() -> Pipeline:
    from coil.passes.extract_deps import extract_deps
    from coil.passes.fuse import fuse
    from coil.passes.kernel_gen import kernel_gen
    from coil.passes.lower import lower
    from coil.passes.plan_memory import plan_memory
    from coil.passes.realize import realize
    from coil.passes.wrap import wrap

    return Pipeline(
        (
            ("lower", lower),
            ("realize", realize),
            ("extract_deps", extract_deps),
            ("fuse", fuse),
            ("plan_memory", plan_memory),
            ("wrap", wrap),
            ("kernel_gen", kernel_gen),
        )
    )
