"""What generated code calls at run time, and `load_module`, which turns a
CompiledModule into the callable `compiled(*inputs) -> tuple`."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import torch

from coil.errors import CoilError
from coil.ir.layout import Layout
from coil.ir.module import CompiledModule

log = logging.getLogger("coil")


# output_code.py allocates with size and stride tuples: torch's own function, no
# Python frame in between (a graph's call allocates every buffer it plans)
empty_strided = torch.empty_strided


def reinterpret_tensor(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    return t.as_strided(tuple(size), tuple(stride), offset)


def ensure_layout(t: Any, size: Sequence[int], stride: Sequence[int]) -> Any:
    """An extern's result in the layout its fake tensor promised.  Kernels index
    extern outputs by that layout; an aten kernel whose meta function disagrees
    with it (seen: CPU attention backward) gets its result copied, not misread."""
    if not isinstance(t, torch.Tensor) or all(s == 1 or a == b for s, a, b in zip(size, t.stride(), stride)):
        return t
    fixed = torch.empty_strided(tuple(size), tuple(stride), dtype=t.dtype, device=t.device)
    fixed.copy_(t)
    return fixed


def poison(t: torch.Tensor) -> None:
    """Sanitize mode: overwrite a freed buffer's storage so a later read shows."""
    flat = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        flat.fill_(float("nan"))
    elif t.dtype == torch.bool:
        flat.view(torch.uint8).fill_(0xFF)
    else:
        flat.fill_(-1)  # all-ones bits


def rand_strided(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, device: str, offset: int = 0) -> torch.Tensor:
    lay = Layout(tuple(size), tuple(stride), dtype, device, offset)
    n = lay.storage_size()
    if dtype.is_floating_point:
        base = torch.randn(n, device=device).to(dtype)
    elif dtype == torch.bool:
        base = torch.rand(n, device=device) > 0.5
    else:
        base = torch.randint(0, 8, (n,), device=device, dtype=dtype)
    return base.as_strided(tuple(size), tuple(stride), offset)


def benchmark(fn: Callable[[], Any], times: int = 10, repeat: int = 10) -> float:
    """Median seconds per call."""
    fn()
    samples = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(times):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / times)
    samples.sort()
    return samples[len(samples) // 2]


class CompiledFn:
    """`compiled(*inputs) -> tuple`; checks every input against the layout it was
    compiled for, so a mismatch is an error and never an out-of-bounds read."""

    def __init__(self, module: CompiledModule, namespace: dict[str, Any]) -> None:
        self.module = module
        self.source = module.source
        self._call = namespace["call"]
        self.namespace = namespace
        self.cache_key: str | None = None  # its graph cache entry, where compile_graph stored one
        bg = module.program.plan.schedule.graph.graph
        self.input_layouts = tuple(i.layout for i in bg.inputs)
        self.input_names = tuple(i.name for i in bg.inputs)
        self._restrided: set[str] = set()
        from coil.backends.wrapper import indexed_by_layout

        self._indexed = indexed_by_layout(module.program)
        # what a matching input looks like, compared field by field on each call
        # (building a Layout per input per call cost more than a small kernel)
        self._expected = tuple(
            (lay.size, lay.dtype, torch.device(lay.device), tuple(i for i, n in enumerate(lay.size) if n != 1), lay.stride)
            for lay in self.input_layouts
        )

    def _matches(self, inputs: Sequence[Any]) -> bool:
        if len(inputs) != len(self._expected):
            return False
        for t, (size, dtype, device, dims, stride) in zip(inputs, self._expected):
            if not isinstance(t, torch.Tensor) or t.shape != size or t.dtype != dtype or t.device != device:
                return False
            got = t.stride()
            # equal strides (the usual case) compare as one tuple; else only dims of size > 1 count
            if got != stride and any(got[i] != stride[i] for i in dims):
                return False
        return True

    def check(self, inputs: Sequence[Any], restride: bool = False) -> None:
        """Raise on inputs of another count, size, dtype or device.  Other strides
        raise too, unless `restride`: then the input is copied, in place in the
        list, into the layout the kernels were compiled for."""
        if self._matches(inputs):
            return
        if len(inputs) != len(self.input_layouts):
            raise CoilError(f"compiled for {len(self.input_layouts)} inputs, called with {len(inputs)}")
        for k, (name, lay, t) in enumerate(zip(self.input_names, self.input_layouts, inputs)):
            if not isinstance(t, torch.Tensor):
                raise CoilError(f"input {name}: expected a tensor, got {type(t).__name__}")
            got = Layout.of(t)
            if (got.size, got.dtype) != (lay.size, lay.dtype) or torch.device(got.device) != torch.device(lay.device):
                raise CoilError(
                    f"input {name}: compiled for {lay.show()}, called with {got.show()}; recompile for new shapes"
                )
            if any(s != 1 and a != b for s, a, b in zip(lay.size, lay.stride, got.stride)):
                if restride and name not in self._indexed:
                    continue  # only externs see it: they take any strides, as in eager
                if not restride:
                    raise CoilError(f"input {name}: compiled for strides {list(lay.stride)}, called with {list(got.stride)}")
                if name not in self._restrided:
                    self._restrided.add(name)
                    log.warning("coil: input %s arrives with strides %s, compiled for %s: copying it",
                                name, list(got.stride), list(lay.stride))
                fixed = torch.empty_strided(lay.size, lay.stride, dtype=lay.dtype, device=t.device)
                fixed.copy_(t)
                inputs[k] = fixed  # type: ignore[index]

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        self.check(inputs)
        return tuple(self._call(list(inputs)))

    def call_boxed(self, args: list[Any]) -> tuple[Any, ...]:
        """AOTAutograd's boxed convention: `call` clears the list, so inputs die as
        soon as their last reader ran.  A tensor whose strides differ from the fake
        tensor's the graph was compiled with (an aten kernel whose meta function
        disagrees with it) is copied into the compiled layout instead of failing."""
        self.check(args, restride=True)
        return tuple(self._call(args))


def cache_dir(configured: str | None = None) -> str:
    """Where generated files live: Options.cache_dir, else $COIL_CACHE_DIR, else a
    per-user folder under the system temp dir."""
    import os
    import tempfile

    d = configured or os.environ.get("COIL_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"coil-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def write_atomic(path: str, data: bytes) -> None:
    """Write through a temporary file in the same folder, then rename it into
    place: a reader sees the old file or the whole new one, never half of it."""
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        raise


def load_module(module: CompiledModule, directory: str | None = None) -> CompiledFn:
    """Write output_code.py to the cache (Triton reads kernel source from files),
    import it as a fresh module, and wrap its `call`."""
    import hashlib
    import importlib.util
    import os

    key = hashlib.sha256(module.source.encode()).hexdigest()[:24]
    path = os.path.join(cache_dir(directory), f"c{key}.py")
    if not os.path.exists(path) or open(path).read() != module.source:
        write_atomic(path, module.source.encode())
    spec = importlib.util.spec_from_file_location(f"coil_output_{key}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return CompiledFn(module, mod.__dict__)
