"""What `coil demo` and `coil explain` share: loading a user's function and its
example inputs, tracing it to aten ops, and running the pipeline while keeping the
IR each stage returns."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable, Sequence, TypeVar

import attrs
import torch

from coil.errors import CoilError
from coil.options import Options
from coil.passes.pipeline import Pass, Pipeline

T = TypeVar("T")

# A user's mistake (no file, no function, no inputs) exits with 2, as argparse
# does for a bad command line; a failure inside coil exits with 1.
USAGE_ERROR = 2


def parse_spec(spec: str) -> tuple[str, str]:
    """`path/to/file.py:fn` -> (path, fn)."""
    path, sep, fn = spec.rpartition(":")
    if not sep or not path or not fn:
        raise CoilError(f"expected FILE.py:FUNCTION, got {spec!r}")
    return path, fn


def import_file(path: str) -> ModuleType:
    """Import a user's file as a fresh module; its folder is importable meanwhile,
    so the file may import its neighbours."""
    if not os.path.isfile(path):
        raise CoilError(f"no such file: {path}")
    folder = os.path.dirname(os.path.abspath(path))
    name = "coil_user_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CoilError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's code: report, don't crash
        raise CoilError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    finally:
        sys.path.remove(folder)
    return module


def example_inputs_of(module: ModuleType, fn_name: str) -> tuple[Any, ...]:
    """The inputs to trace with: `<fn>_inputs`, else `example_inputs`; each either a
    tuple/list or a function returning one (a lone tensor counts as one input)."""
    for attr in (f"{fn_name}_inputs", "example_inputs"):
        if hasattr(module, attr):
            value = getattr(module, attr)
            if callable(value) and not isinstance(value, torch.Tensor):
                value = value()
            if isinstance(value, torch.Tensor):
                return (value,)
            if isinstance(value, (tuple, list)):
                return tuple(value)
            raise CoilError(f"{attr} must be a tuple or list of inputs (or return one), got {type(value).__name__}")
    raise CoilError(
        f"no example inputs for {fn_name}: define `example_inputs` (a tuple of tensors, or a function "
        f"returning one) or `{fn_name}_inputs` in {module.__file__}"
    )


def load_function(spec: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """`FILE.py:FN` -> the function and its example inputs."""
    path, fn_name = parse_spec(spec)
    module = import_file(path)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items()
                       if callable(v) and getattr(v, "__module__", None) == module.__name__)
        hint = f"; functions there: {', '.join(found)}" if found else ""
        raise CoilError(f"no function {fn_name!r} in {path}{hint}")
    return fn, example_inputs_of(module, fn_name)


def trace(fn: Callable[..., Any], inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """An FX graph of aten ops, as make_fx records it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        return make_fx(fn)(*inputs)
    except Exception as e:  # noqa: BLE001 - name what failed
        raise CoilError(f"make_fx could not trace {getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}") from e


def run_stages(pipeline: Pipeline, gm: torch.fx.GraphModule, inputs: Sequence[Any], options: Options,
               until: str | None = None) -> dict[str, Any]:
    """Run the pipeline once and return every stage's IR by stage name.  Each pass is
    wrapped to keep its output, so Pipeline.run still verifies, traces and dumps."""
    outputs: dict[str, Any] = {}

    def keeping(name: str, fn: Pass[Any, Any]) -> Pass[Any, Any]:
        def stage(ir: Any, o: Options) -> Any:
            outputs[name] = fn(ir, o)
            return outputs[name]

        return stage

    kept = attrs.evolve(pipeline, passes=tuple((n, keeping(n, fn)) for n, fn in pipeline.passes))
    kept.run(gm, inputs, until=until, options=options)
    return outputs


def ir_of(stages: dict[str, Any], kind: type[T]) -> T:
    """The last IR of one language among the stages' outputs."""
    for ir in reversed(stages.values()):
        if isinstance(ir, kind):
            return ir
    raise CoilError(f"the pipeline produced no {kind.__name__}")


def describe_inputs(inputs: Sequence[Any]) -> str:
    parts = []
    for t in inputs:
        if isinstance(t, torch.Tensor):
            parts.append(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} {t.device}")
        else:
            parts.append(repr(t))
    return ", ".join(parts)


def fx_listing(gm: torch.fx.GraphModule) -> str:
    """The FX graph, one node a line, in the seed's notation."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            out.append(f"{n.name} = placeholder()")
        elif n.op == "call_function":
            args = ", ".join(str(a) for a in n.args)
            out.append(f"{n.name} = {n.target}({args})")
        elif n.op == "output":
            out.append(f"output {n.args[0]}")
    return "\n".join("  " + ln for ln in out)
