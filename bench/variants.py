"""The three ways to run a workload, and what each compiler leaves behind for the
kernel counts: coil's compiled modules, Inductor's output code."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


def make_callable(variant: str, fn: Callable[..., Any], coil_target: str, threads: int | None = None) -> Callable[..., Any]:
    """eager: fn itself; inductor: torch.compile's default; coil: backend="coil"
    (with `num_threads` when the run fixes the thread count).  Dynamo is not reset
    here: its cache keeps one entry per backend, so both compiled variants of one
    function stay callable side by side."""
    if variant == "eager":
        return fn
    if variant == "inductor":
        return torch.compile(fn)
    if variant == "coil":
        options: dict[str, Any] = {"target": coil_target}
        if threads:
            options["num_threads"] = threads
        return torch.compile(fn, backend="coil", options=options)
    raise ValueError(f"unknown variant {variant!r}")


@dataclass
class Capture:
    """What one first call compiled."""

    coil_graphs: list[Any] = field(default_factory=list)  # CompiledFn, or None for a graph run eagerly
    inductor_code: list[str] = field(default_factory=list)
    inductor_kernels_generated: int | None = None


@contextlib.contextmanager
def record_coil_graphs(cap: Capture) -> Iterator[None]:
    """Wrap coil's per-graph compiler so each compiled graph (forward, backward,
    inference) is kept; AOTAutograd compiles the backward at the first backward.
    A Dynamo graph loaded through its graph cache link is kept too."""
    import coil.backends.dynamo as dyn

    real, real_linked = dyn._graph_compiler, dyn._linked

    def spy(*args: Any, **kwargs: Any) -> Callable[[Any, Any], Any]:
        inner = real(*args, **kwargs)

        def compile_one(gm: Any, example_inputs: Any) -> Any:
            run = inner(gm, example_inputs)
            cap.coil_graphs.append(getattr(run, "compiled", None))
            return run

        return compile_one

    def linked(*args: Any, **kwargs: Any) -> Any:
        hit = real_linked(*args, **kwargs)
        if hit is not None:
            cap.coil_graphs.append(hit.compiled)
        return hit

    dyn._graph_compiler, dyn._linked = spy, linked
    try:
        yield
    finally:
        dyn._graph_compiler, dyn._linked = real, real_linked


def first_call(variant: str, call: Callable[[], Any], cap: Capture) -> Any:
    """Run the first (compiling) call, recording what the compiler produced."""
    if variant == "coil":
        with record_coil_graphs(cap):
            return call()
    if variant == "inductor":
        from torch._inductor import metrics

        before = metrics.generated_kernel_count
        try:
            from torch._inductor.utils import run_and_get_code

            out, codes = run_and_get_code(call)
            cap.inductor_code.extend(codes)
        except ImportError:
            out = call()
        cap.inductor_kernels_generated = metrics.generated_kernel_count - before
        return out
    return call()
