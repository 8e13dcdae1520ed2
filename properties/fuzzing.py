"""Fuzzing coil against eager PyTorch: what `coil fuzz` runs, as functions.

    fuzz(graphs(), options, examples=100, seed=0, on_example=print_line)  -> FuzzRun
    shrink(graphs(), options, examples, seed, failure.signature)          -> the smallest failure

`fuzz` draws `examples` graphs with hypothesis under a fixed seed and no example
database, so a seed names one sequence of graphs; a failing example is recorded,
not raised, so the run goes on.  `shrink` replays the same sequence with failures
raised and lets hypothesis minimize the first one (keeping its signature, so a
mismatch does not shrink into some other crash), then cuts the FX graph itself
(simplify.py).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, settings

from coil.options import Options
from coil.properties.compare import INPUTS_WRITTEN
from coil.properties.invariants import check_all
from coil.properties.simplify import simplify
from coil.properties.strategies import DrawnGraph, mismatch


@attrs.frozen(eq=False)
class Failure:
    drawn: DrawnGraph
    kind: str  # mismatch | crash | invariant
    message: str

    @property
    def signature(self) -> str:
        """What shrinking must preserve, so a failure does not shrink into another:
        for a mismatch, whether inputs were written or outputs differ; else the
        exception's first words (its type and the stage it names)."""
        if self.kind == "mismatch":
            written = self.message.startswith(INPUTS_WRITTEN)
            return "mismatch: " + ("inputs written" if written else "outputs differ")
        return f"{self.kind}: " + " ".join(self.message.split()[:2])


@attrs.frozen(eq=False)
class FuzzRun:
    examples: int
    failures: tuple[Failure, ...]


def check_example(drawn: DrawnGraph, options: Options) -> Failure | None:
    """Compile `drawn` with `options`, check the wrapper's invariants and compare
    the outputs with eager; None when all is well."""
    import coil

    try:
        compiled = coil.compile_graph(drawn.gm, drawn.inputs, options)
    except Exception as e:  # noqa: BLE001 - any crash is a finding
        return Failure(drawn, "crash", f"{type(e).__name__}: {e}")
    try:
        check_all(compiled.module.program)
    except Exception as e:  # noqa: BLE001
        return Failure(drawn, "invariant", f"{type(e).__name__}: {e}")
    try:
        outputs = compiled(*drawn.inputs)
    except Exception as e:  # noqa: BLE001
        return Failure(drawn, "crash", f"{type(e).__name__} while running: {e}")
    why = mismatch(drawn, outputs)
    return None if why is None else Failure(drawn, "mismatch", why)


def _settings(examples: int, phases: tuple[Phase, ...]) -> settings:
    return settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
    )


def fuzz(strategy: hypothesis.strategies.SearchStrategy[DrawnGraph], options: Options, examples: int, seed: int,
         on_example: Callable[[int, DrawnGraph, Failure | None], None] | None = None) -> FuzzRun:
    """Run `examples` drawn graphs through coil; record every failure."""
    failures: list[Failure] = []
    count = [0]

    @hypothesis.seed(seed)
    @_settings(examples, (Phase.generate,))
    @hypothesis.given(strategy)
    def one(drawn: DrawnGraph) -> None:
        failure = check_example(drawn, options)
        count[0] += 1
        if failure is not None:
            failures.append(failure)
        if on_example is not None:
            on_example(count[0], drawn, failure)

    one()
    return FuzzRun(count[0], tuple(failures))


class _Found(Exception):
    pass


def shrink(strategy: hypothesis.strategies.SearchStrategy[DrawnGraph], options: Options, examples: int, seed: int,
           signature: str) -> Failure | None:
    """The smallest graph failing with `signature`: hypothesis replays the run of
    `seed` and shrinks its first such failure, then `simplify` cuts the graph."""
    last: list[Failure] = []

    @hypothesis.seed(seed)
    @_settings(examples, (Phase.generate, Phase.shrink))
    @hypothesis.given(strategy)
    def failing(drawn: DrawnGraph) -> None:
        failure = check_example(drawn, options)
        if failure is not None and failure.signature == signature:
            last[:] = [failure]  # hypothesis replays the minimal example last
            raise _Found(failure.message)

    try:
        failing()
    except _Found:
        pass
    if not last:
        return None

    def same_failure(drawn: DrawnGraph) -> Failure | None:
        failure = check_example(drawn, options)
        return failure if failure is not None and failure.signature == signature else None

    smallest = simplify(last[0].drawn, lambda d: same_failure(d) is not None)
    return same_failure(smallest) or last[0]
