"""What Triton-target output_code.py calls at run time: grids, launchers,
autotuning with an on-disk cache of the winners, and the guard that CPU tensors
only run under the Triton interpreter.

Sizes are static, so schedule_kernels picks the heuristic config
(passes/schedule/launch.py) and codegen prints it into the launch line; with
Options.autotune, output_code.py rebinds each kernel name to `autotuned(kernel,
kind)`, which keeps that line but launches the timed winner on CUDA, out of the
same policy's candidate configs.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import attrs
import torch

from coil.backends.triton.images import (ImageBook, KernelImage, book_key, kernel_image, load_image,
                                         static_launcher)
from coil.errors import CoilError
from coil.ir.kernel import LaunchConfig
from coil.options import TRITON_LAUNCH
from coil.passes.schedule.launch import candidate_configs

log = logging.getLogger("coil")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid(xnumel: int, xblock: int) -> tuple[int]:
    """One program per XBLOCK rows (or elements)."""
    return (cdiv(xnumel, xblock),)


def grid2(ynumel: int, xnumel: int, yblock: int, xblock: int, one_axis: bool = False) -> tuple[int, ...]:
    """Tiled kernels: column blocks on axis 0, row blocks on axis 1; one_axis:
    every block on axis 0 (rows that may pass axis 1's limit, Tiled.one_axis)."""
    if one_axis:
        return (cdiv(xnumel, xblock) * cdiv(ynumel, yblock),)
    return (cdiv(xnumel, xblock), cdiv(ynumel, yblock))


@attrs.frozen
class Launch:
    """One kernel launch as the wrapper makes it, every number fixed at compile
    time: the grid (programs along x, y, z) and how it reads in a launch line, the
    tensor arguments (buffer names), the size arguments, and the constexprs and
    launch options."""

    kernel: str
    grid: tuple[int, int, int]
    grid_text: str
    tensors: tuple[str, ...]
    sizes: tuple[int, ...]
    meta: tuple[tuple[str, Any], ...]
    tag: str = ""  # after the kernel's name in its launcher's: a choice's tier, `_r1024`

    def with_meta(self, extra: dict[str, Any]) -> "Launch":
        return attrs.evolve(self, meta=(*self.meta, *extra.items()))

    def line(self) -> str:
        """`kernel[grid](tensors, sizes, XBLOCK=..., num_warps=...)`: Triton's own launch."""
        args = ", ".join([*self.tensors, *map(str, self.sizes), *(f"{k}={v}" for k, v in self.meta)])
        return f"{self.kernel}[{self.grid_text}]({args})"

    @property
    def launcher(self) -> str:
        return f"launch_{self.kernel}{self.tag}"

    def definition(self, bind: bool, static: bool = True) -> str:
        """output_code.py's module-level Launcher of this launch (`static` False:
        Options.kernel_images off, it binds Triton's launcher only)."""
        meta = ", ".join(f"{k!r}: {v}" for k, v in self.meta)
        sizes = ", ".join(map(str, self.sizes)) + ("," if len(self.sizes) == 1 else "")
        return (f"{self.launcher} = Launcher({self.kernel}, {self.grid}, ({sizes}), {{{meta}}}"
                f"{'' if bind else ', bind=False'}{'' if static else ', static=False'})")

    def bound_line(self, stream: str) -> str:
        """The call of its Launcher, and as a comment the launch as Triton's own
        line would read."""
        return f"{self.launcher}({stream}, {', '.join(self.tensors)})  # {self.line()}"

    def sized_definition(self, bind: bool) -> str:
        """output_code.py's module-level SizedLauncher of this launch (symbolic
        sizes: the grid and sizes come with each call)."""
        meta = ", ".join(f"{k!r}: {v}" for k, v in self.meta)
        return f"{self.launcher} = SizedLauncher({self.kernel}, {{{meta}}}{'' if bind else ', bind=False'})"

    def sized_line(self, stream: str) -> str:
        """The call of its SizedLauncher with the grid and sizes this call computes."""
        sizes = ", ".join(map(str, self.sizes)) + ("," if len(self.sizes) == 1 else "")
        return f"{self.launcher}({stream}, {self.grid_text}, ({sizes}), {', '.join(self.tensors)})"


def launch(kernel: Any, kind: str, xnumel: int, rnumel: int, cfg: LaunchConfig, args: tuple[Any, ...]) -> None:
    if kind == "tiled":  # (rows, columns)
        kernel[grid2(xnumel, rnumel, cfg.yblock, cfg.xblock)](*args, xnumel, rnumel, **cfg.meta(),
                                                              num_warps=cfg.num_warps)
        return
    sizes = (xnumel,) if kind == "pointwise" else (xnumel, rnumel)
    kernel[grid(xnumel, cfg.xblock)](*args, *sizes, **cfg.meta(), num_warps=cfg.num_warps)


# ---- autotuning -----------------------------------------------------------------------------

_BEST: dict[tuple[Any, str], LaunchConfig] = {}


def _tune_key(kernel: Any, kind: str, xnumel: int, rnumel: int, device: Any) -> str:
    import torch
    import triton

    src = getattr(kernel, "src", None) or inspect.getsource(getattr(kernel, "fn", kernel))
    parts = [src, triton.__version__, torch.cuda.get_device_name(device), kind, str(xnumel), str(rnumel)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _cache_path(key: str, cache_dir: str | None) -> str | None:
    """Where a tuning result is kept (a checked folder, runtime.secure_dir), or None
    where the cache cannot be written: then it is kept in memory only."""
    from coil.backends.runtime import CacheUnwritable, cache_dir as base

    try:
        return os.path.join(base(cache_dir, "triton-autotune"), f"{key}.json")
    except CacheUnwritable:
        return None


def _load_config(path: str | None) -> LaunchConfig | None:
    """A tuning result from the cache; a damaged one is tuned again, never trusted."""
    from coil.backends.runtime import read_bytes

    raw = read_bytes(path) if path else None
    if raw is None:
        return None
    try:
        return LaunchConfig(**json.loads(raw))
    except Exception:  # noqa: BLE001 - not JSON, not a config: tune again
        return None


def _store_config(path: str | None, cfg: LaunchConfig) -> None:
    from coil.backends.runtime import write_atomic

    if path is not None:
        try:
            write_atomic(path, json.dumps(attrs.asdict(cfg)).encode())
        except OSError:
            pass  # a read-only or full cache: the result lives in memory only


def _time(kernel: Any, kind: str, xnumel: int, rnumel: int, cfg: LaunchConfig, args: tuple[Any, ...]) -> float:
    import triton.testing

    try:
        return float(triton.testing.do_bench(lambda: launch(kernel, kind, xnumel, rnumel, cfg, args), warmup=5, rep=20))
    except Exception:  # noqa: BLE001 - a config that does not compile or fit simply loses
        return float("inf")


def autotuned_launch(kernel: Any, kind: str, xnumel: int, rnumel: int, args: tuple[Any, ...],
                     cache_dir: str | None = None) -> None:
    """Launch with the fastest of `candidate_configs`, timed on the first call on
    clones of the arguments (so a kernel that reads what it writes is not run twice
    on its real buffers) and remembered on disk by source, Triton version and GPU."""
    import torch

    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cuda"))
    mem_key = (kernel, f"{kind}:{xnumel}:{rnumel}")
    cfg = _BEST.get(mem_key)
    if cfg is None:
        path = _cache_path(_tune_key(kernel, kind, xnumel, rnumel, device), cache_dir)
        cfg = _load_config(path)
        if cfg is None:
            scratch = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
            timed = [(_time(kernel, kind, xnumel, rnumel, c, scratch), i, c)
                     for i, c in enumerate(candidate_configs(TRITON_LAUNCH, kind, xnumel, rnumel))]
            cfg = min(timed)[2]
            _store_config(path, cfg)
        _BEST[mem_key] = cfg
    launch(kernel, kind, xnumel, rnumel, cfg, args)


class autotuned:  # noqa: N801 - used like a decorator in output_code.py
    """Stands in for a kernel in `kernel[grid](*args, xnumel, [rnumel], XBLOCK=...)`
    launch lines: on CUDA tensors it ignores the given grid and blocks and launches
    the autotuned config; elsewhere (the interpreter) it launches as written."""

    def __init__(self, kernel: Any, kind: str, cache_dir: str | None = None) -> None:
        self.kernel = kernel
        self.kind = kind
        self.cache_dir = cache_dir

    def __getitem__(self, launch_grid: tuple[int, ...]) -> Any:
        def run(*args: Any, **meta: Any) -> None:
            n = 1 if self.kind == "pointwise" else 2
            tensors, sizes = args[:-n], args[-n:]
            if not any(getattr(a, "is_cuda", False) for a in tensors):
                self.kernel[launch_grid](*args, **meta)
                return
            rnumel = sizes[1] if n == 2 else 1
            autotuned_launch(self.kernel, self.kind, sizes[0], rnumel, tensors, self.cache_dir)

        return run


# ---- launching without Triton's per-call binding ------------------------------------------------


@functools.lru_cache(maxsize=1)
def _fast_launch_supported() -> bool:
    """Triton releases whose CompiledKernel.run takes (grid x3, stream, function,
    packed metadata, launch metadata, enter hook, exit hook, *args), as
    JITFunction.run calls it (3.6 on the H200 and 3.9 here read so)."""
    try:
        import triton
        from triton import knobs  # noqa: F401
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return False
    major, minor = (int(p) for p in triton.__version__.split(".")[:2])
    return (3, 4) <= (major, minor) <= (3, 9) and all(
        hasattr(CompiledKernel, a) for a in ("launch_metadata", "_init_handles"))


def int_key(v: int) -> tuple[bool, bool, bool]:
    """What Triton 3.4-3.9 specialize an integer argument on (read off
    native_specialize_impl on 3.9 and 3.6): equal to 1 (a constant of the
    kernel), a multiple of 16 (divisibility, which vectorizes), and whether it
    fits int32 (else the argument is int64).  Two values with the same key run
    the same compiled kernel."""
    return v == 1, v % 16 == 0, -(2**31) <= v < 2**31


class fast_launch:  # noqa: N801 - used like a decorator in output_code.py
    """Stands in for a CUDA kernel in `kernel[grid](*args, XBLOCK=..., num_warps=...)`
    launch lines.  The first launch of each specialization goes through Triton's
    JITFunction (binding, specialization, cache lookup: tens of microseconds of
    CPU per launch, which a slow host pays before every kernel); later ones call
    the compiled kernel's launcher directly.  The key holds what Triton
    specializes a kernel on that can change between calls: each tensor's dtype and
    whether its address is 16-byte aligned, and each integer's `int_key` (a
    symbolic graph's sizes change by call; a static one's are constants of the
    launch line).  The grid is not in the key: it picks no specialization, and a
    symbolic launch computes a new one for every size."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.names = tuple(getattr(kernel, "arg_names", ()))
        self.compiled: dict[Any, Any] = {}
        self.sites: dict[tuple[int, ...], Any] = {}  # grid -> its launcher
        self.tensor_at: tuple[int, ...] | None = None  # positions of the tensor arguments
        self.int_at: tuple[int, ...] = ()  # and of the integer ones
        self.enabled = bool(self.names) and _fast_launch_supported()
        if self.enabled:  # imported here, not on every launch
            from triton import knobs

            self.knobs, self.stream = knobs, _current_stream()

    def __getitem__(self, launch_grid: tuple[int, ...]) -> Any:
        site = self.sites.get(launch_grid)
        if site is None:
            site = functools.partial(self._run, launch_grid)
            if len(self.sites) < 64:  # a symbolic launch's grids: one a size, kept for the first few
                self.sites[launch_grid] = site
        return site

    def _run(self, launch_grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
        if not self.enabled:
            self.kernel[launch_grid](*args, **meta)
            return
        at = self.tensor_at
        if at is None:  # a launch line passes the same kinds of argument every time
            at = self.tensor_at = tuple(i for i, a in enumerate(args) if hasattr(a, "data_ptr"))
            self.int_at = tuple(i for i, a in enumerate(args) if isinstance(a, int))
        key = (*meta.values(), *[(args[i].dtype, args[i].data_ptr() % 16 == 0) for i in at],
               *[int_key(args[i]) for i in self.int_at])
        hit = self.compiled.get(key)
        if hit is None:
            ck = self.kernel[launch_grid](*args, **meta)
            rest = self.names[len(args):]
            if ck is not None and all(n in meta for n in rest):
                self.compiled[key] = (ck, tuple(meta[n] for n in rest))
            return
        # what JITFunction.run does once it has found the compiled kernel
        ck, constexprs = hit
        stream = self.stream()
        g = (*launch_grid, 1, 1)
        enter, leave = self.knobs.runtime.launch_enter_hook, self.knobs.runtime.launch_exit_hook
        if getattr(enter, "calls", enter) or getattr(leave, "calls", leave):  # a profiler's hooks: their metadata
            md = ck.launch_metadata(launch_grid, stream, *args, *constexprs)
        else:  # no hook registered (Triton's hook chains are empty, not None)
            md, enter, leave = None, None, None
        ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, md, enter, leave, *args, *constexprs)


class Launcher:
    """One kernel launch of output_code.py on CUDA, with everything about it fixed
    at compile time: the kernel, its grid, its size arguments, its constexprs and
    launch options.  The wrapper calls it with the call's stream and the tensors,
    `launch_k(stream0, buf0, buf1)`.

    The first call goes through Triton's JITFunction, which compiles the kernel or
    finds it in its cache; the Launcher then binds Triton's compiled C launcher
    with what does not change between calls (function handle, packed metadata,
    grid, sizes, constexprs), and every later call is one call of it: no argument
    binding, no specialization key, no Python work per argument.  `rule` says
    which of the two paths it is on, and why.

    Where torch has its static CUDA launcher and Options.kernel_images is on, the
    binding launches the cubin Triton compiled through it instead (images.py), and
    the cubin goes into the module's book in coil's cache; a Launcher loaded again
    from that cache gets its image before the first call (`adopt`), and never asks
    Triton.

    Triton specializes a pointer on its 16-byte alignment.  Buffers coil or an
    aten kernel allocates are always so aligned; graph inputs may not be, so the
    wrapper passes stream None when one it launches on is not, and such a call (and
    every call of a launcher with `bind` False: one reading an alias an extern
    returned, whose alignment is not known ahead) goes through fast_launch's path,
    keyed on each tensor's alignment."""

    __slots__ = ("kernel", "grid", "sizes", "meta", "bind", "static", "keyed", "run", "head", "tail", "mode",
                 "rule", "name", "book")

    # how `run` takes its arguments: Triton 3.6's launcher (spread), Triton 3.9's (the
    # kernel's arguments as one tuple), torch's static CUDA launcher (images.py)
    SPREAD, PACKED, STATIC = 0, 1, 2

    def __init__(self, kernel: Any, launch_grid: tuple[int, ...], sizes: tuple[Any, ...], meta: dict[str, Any],
                 bind: bool = True, static: bool = True) -> None:
        self.kernel, self.grid, self.sizes, self.meta, self.bind = kernel, launch_grid, sizes, meta, bind
        self.static = static  # Options.kernel_images: bind through torch's static launcher where it can
        self.keyed = fast_launch(kernel)
        self.run: Any = None
        self.head: tuple[Any, ...] = ()
        self.tail: tuple[Any, ...] = ()
        self.mode = Launcher.SPREAD
        self.rule = ("not bound: it reads an alias an extern returned (its alignment is known only at run time)"
                     if not bind else "not bound yet: the first call goes through Triton's JITFunction")
        self.name = ""  # its name in output_code.py and the book its image goes into (prepare_module)
        self.book: ImageBook | None = None

    def __call__(self, stream: Any, *tensors: Any) -> None:
        run = self.run
        if run is None or stream is None:
            self._slow(stream, tensors)
            return
        try:
            mode = self.mode
            if mode == 2:  # Launcher.STATIC: (function, grid, warps, shared, parameter codes, arguments, stream)
                run(*self.head, (*tensors, *self.tail), stream)
            elif mode == 1:  # Triton 3.9's launcher takes the kernel's arguments as one tuple
                run(*self.grid, stream, *self.head, (*tensors, *self.tail))
            else:
                run(*self.grid, stream, *self.head, *tensors, *self.tail)
        except TypeError as e:  # the launcher parses its arguments before launching: nothing ran
            self.run, self.bind = None, False
            self.rule = f"not bound: this Triton's launcher refused the bound arguments ({e})"
            self._slow(stream, tensors)

    def _slow(self, stream: Any, tensors: tuple[Any, ...]) -> None:
        args = (*tensors, *self.sizes)
        if stream is None or not self.bind or not self.keyed.enabled:
            self.keyed[self.grid](*args, **self.meta)
            return
        ck = self.kernel[self.grid](*args, **self.meta)
        if ck is not None and self.run is None:
            self._bind(ck, len(args))

    def _bind(self, ck: Any, given: int) -> None:
        """Bind ck for later calls: through torch's static launcher on its image
        (images.kernel_image; the image goes into the module's book), else Triton's
        launcher (`bound_launch`); else stay on the keyed path, with the reason in
        `rule`."""
        static_why = ""
        if self.static and not _launch_hooks(self.keyed):
            image, static_why = kernel_image(ck, self.keyed.names, given, given - len(self.sizes))
            launcher = static_launcher()
            function = getattr(ck, "function", None)
            if image is not None and launcher is not None and function:
                self._adopt(image, int(function), launcher)
                if self.book is not None:
                    self.book.add(self.name, image)
                return
            if image is not None:
                static_why = "this torch has no static CUDA launcher" if launcher is None else "no loaded function"
        bound, why = bound_launch(ck, self.keyed, self.meta, given)
        if static_why and bound is not None:
            why += f" (not static: {static_why})"
        if bound is None:
            self.rule = why
            return
        self.run, self.head, packed, consts = bound
        self.mode = Launcher.PACKED if packed else Launcher.SPREAD
        self.tail = (*self.sizes, *consts)
        self.rule = why

    def _adopt(self, image: KernelImage, function: int, launcher: Any) -> None:
        g = (*self.grid, 1, 1)[:3]
        self.run = launcher._launch_kernel
        self.head = (function, *g, image.num_warps, image.shared, image.params)
        self.tail = image.tail(self.sizes, len(image.kept) - len(self.sizes))
        self.mode = Launcher.STATIC
        self.rule = "bound: torch's static CUDA launcher, on the cubin Triton compiled"

    def adopt(self, image: KernelImage, folder: str, device_index: int) -> None:
        """Launch through `image` (read from the module's book in `folder`) from the
        first call on: its cubin is loaded now, Triton is not asked."""
        self._adopt(image, load_image(image, folder, device_index), static_launcher())
        self.rule = "bound: torch's static CUDA launcher, on a cubin from coil's cache"


def _launch_hooks(keyed: "fast_launch") -> bool:
    """Whether a launch hook is registered with Triton (a profiler's): its launches
    then go through Triton, which calls them (Triton's hook chains are empty, not None)."""
    knobs = getattr(keyed, "knobs", None)
    if knobs is None:
        return False
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


def bound_launch(ck: Any, keyed: "fast_launch", meta: dict[str, Any],
                 given: int) -> tuple[tuple[Any, tuple[Any, ...], bool, tuple[Any, ...]] | None, str]:
    """Triton's compiled launcher of ck with what does not change between calls:
    (launch function, the arguments before the kernel's (function handle, launch
    flags, packed metadata), whether it takes the kernel's arguments as one tuple
    (3.9) or spread (3.6), the constexprs after the `given` arguments), and why;
    None where this Triton's launcher is not one of the two shapes read here, the
    kernel needs something allocated per launch (global or profile scratch, a
    sanitizer), or a launch hook is registered (a profiler's)."""
    run: Any = getattr(ck, "run", None)
    launch = getattr(run, "launch", None)
    rest = keyed.names[given:]
    if launch is None or not all(n in meta for n in rest):
        return None, "not bound: this Triton's launcher is not one coil knows"
    if any(getattr(run, a, 0) for a in ("global_scratch_size", "profile_scratch_size", "gsan_enabled")):
        return None, "not bound: the kernel needs scratch memory allocated per launch"
    if _launch_hooks(keyed):
        return None, "not bound: a launch hook is registered (a profiler's); launches go through Triton"
    params = list(inspect.signature(type(run).__call__).parameters)
    flags = (run.launch_cooperative_grid, run.launch_pdl)
    if params[-1] == "args" and "kernel_metadata" in params and hasattr(run, "arg_annotations"):  # 3.9
        head: tuple[Any, ...] = (ck.function, *flags, ck.packed_metadata, None, None, None, None, None,
                                 run.arg_annotations, run.kernel_signature)
        packed = True
    elif params[-2:] == ["function", "args"]:  # 3.6: scratch pointers, then metadata and hooks
        head, packed = (ck.function, *flags, None, None, ck.packed_metadata, None, None, None), False
    else:
        return None, "not bound: this Triton's launcher is not one coil knows"
    why = "bound: Triton's compiled launcher, called with arguments prepared at the first call"
    return (launch, head, packed, tuple(meta[n] for n in rest)), why


class SizedLauncher:
    """One kernel launch of a symbolic graph's output_code.py on CUDA: its grid and
    size arguments change by call, the wrapper passes them,
    `launch_k(stream0, grid(s0*s1, 1024), (s0*s1, s0, s1), buf0, buf1)`.

    Triton compiles a kernel per specialization of its integer arguments
    (`int_key`: equal to 1, a multiple of 16, fitting int32); the first call of
    each goes through Triton's JITFunction, and its compiled launcher is bound as
    Launcher binds a static launch (`bound_launch`), keyed on the sizes' int_keys:
    a later call with sizes of that key is one call of it, the grid and sizes
    spread in.  stream None (a graph input not 16-byte aligned) and `bind` False
    (an alias an extern returned) go through fast_launch's path, keyed on each
    tensor's alignment too.  `rule` says how the last bind went."""

    __slots__ = ("kernel", "meta", "bind", "keyed", "bound", "rule")

    def __init__(self, kernel: Any, meta: dict[str, Any], bind: bool = True) -> None:
        self.kernel, self.meta, self.bind = kernel, meta, bind
        self.keyed = fast_launch(kernel)
        self.bound: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...], bool, tuple[Any, ...]]] = {}
        self.rule = ("not bound: it reads an alias an extern returned (its alignment is known only at run time)"
                     if not bind else "not bound yet: each specialization's first call goes through Triton")

    def __call__(self, stream: Any, launch_grid: tuple[int, ...], sizes: tuple[int, ...], *tensors: Any) -> None:
        hit = self.bound.get(tuple(map(int_key, sizes))) if stream is not None else None
        if hit is None:
            self._slow(stream, launch_grid, sizes, tensors)
            return
        run, head, packed, tail = hit
        g = (*launch_grid, 1, 1)
        try:
            if packed:  # Triton 3.9's launcher takes the kernel's arguments as one tuple
                run(g[0], g[1], g[2], stream, *head, (*tensors, *sizes, *tail))
            else:
                run(g[0], g[1], g[2], stream, *head, *tensors, *sizes, *tail)
        except TypeError as e:  # the launcher parses its arguments before launching: nothing ran
            self.bound.clear()
            self.bind = False
            self.rule = f"not bound: this Triton's launcher refused the bound arguments ({e})"
            self._slow(stream, launch_grid, sizes, tensors)

    def _slow(self, stream: Any, launch_grid: tuple[int, ...], sizes: tuple[int, ...],
              tensors: tuple[Any, ...]) -> None:
        args = (*tensors, *sizes)
        if stream is None or not self.bind or not self.keyed.enabled:
            self.keyed[launch_grid](*args, **self.meta)
            return
        ck = self.kernel[launch_grid](*args, **self.meta)
        if ck is None:
            return
        bound, self.rule = bound_launch(ck, self.keyed, self.meta, len(args))
        if bound is not None:
            self.bound[tuple(map(int_key, sizes))] = bound


# the current CUDA stream of a device, by index: torch's C function where torch was built with CUDA
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream() -> Any:
    """A function giving the current CUDA stream's handle: torch's two C calls
    where this torch has them (what Triton's driver ends in, without its Python
    device lookup on every launch), else Triton's driver."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    device = getattr(torch._C, "_cuda_getDevice", None)
    if raw is not None and device is not None:
        return lambda: raw(device())
    from triton.runtime import driver

    active = driver.active
    return lambda: active.get_current_stream(active.get_current_device())


# ---- compiling ahead of the first call ----------------------------------------------------------


def precompile(specs: Sequence[tuple[Any, tuple[Any, ...], dict[str, int], str]]) -> None:
    """Compile the kernels of output_code.py's launch lines before its first call,
    one thread per CPU core: Triton releases the GIL while its passes and ptxas run
    (this 2-core VM compiled four of graph_2000's kernels for sm_90 in 14.4 s on two
    threads, 27.5 s on one).  Each spec is (kernel, the launch's arguments with
    tensors given by dtype, its constexprs and num_warps, its device); the warm-up
    specializes as the launch will for 16-byte-aligned tensors, so the launch finds
    the compiled kernel in Triton's cache.  A kernel that fails here is logged and
    left to its launch, which reports the error as it would have."""
    import contextlib
    import logging

    import torch

    def one(spec: tuple[Any, tuple[Any, ...], dict[str, int], str]) -> None:
        kernel, args, meta, device = spec
        # a JITFunction, or a launcher wrapping one (a JITFunction has a `kernel` attribute of its own)
        jit = kernel if hasattr(kernel, "warmup") else kernel.kernel
        guard = torch.cuda.device(device) if device.startswith("cuda") else contextlib.nullcontext()
        try:
            with guard:
                jit.warmup(*args, grid=(1,), **meta)
        except Exception as e:  # noqa: BLE001 - the launch compiles it again and raises
            logging.getLogger("coil").debug("precompile of %s failed: %s", getattr(jit, "__name__", jit), e)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = max(1, min(len(specs), cores))
    if workers == 1:
        for spec in specs:
            one(spec)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="coil-precompile") as pool:
        list(pool.map(one, specs))


def prepare_module(namespace: dict[str, Any], source: str, directory: str | None) -> ImageBook | None:
    """What load_module does with a Triton output_code.py it has just run: name
    each Launcher and give it the module's book of kernel images (images.py); where
    the book in coil's cache has an image for a Launcher, load it, so its first
    call launches without Triton.  Then compile ahead (`PRECOMPILE`, the launches'
    specs) unless every bound Launcher has its image.  The book is returned for
    load_module to write after the first call (None: no Launcher binds static)."""
    launchers = {name: v for name, v in namespace.items() if isinstance(v, Launcher)}
    specs = namespace.get("PRECOMPILE") or []
    static = [lau for lau in launchers.values() if lau.static and lau.bind]
    device = _launch_device(namespace)
    key = book_key(source, device) if static and device is not None and static_launcher() is not None else None
    if key is None:
        if specs:
            precompile(specs)
        return None
    from coil.backends.runtime import CacheUnwritable, cache_dir

    try:
        folder: str | None = cache_dir(directory, "kernels")
    except CacheUnwritable:
        folder = None
    book = ImageBook.load(key, folder)
    index = torch.device(device).index or 0
    adopted = 0
    for name, lau in launchers.items():
        lau.name, lau.book = name, book
        image = book.images.get(name)
        if image is None or not (lau.static and lau.bind) or folder is None or _launch_hooks(lau.keyed):
            continue  # (a profiler's launch hook: its launches go through Triton, which calls it)
        try:
            lau.adopt(image, folder, index)
            adopted += 1
        except Exception as e:  # noqa: BLE001 - a cubin the driver refuses: Triton's path, as before
            log.warning("coil: kernel image of %s not loaded (%s); it launches through Triton", name, e)
            book.loaded = False  # written again after the first call
    if adopted < len(static):  # a launch without its image (a branch the first call did not take)
        book.loaded = False  # written again after this first call, with the images it adds
        if specs:
            precompile(specs)
    return book


def _launch_device(namespace: dict[str, Any]) -> str | None:
    """The CUDA device output_code.py's bound launches run on (its device guard's)."""
    guard = namespace.get("LAUNCH_DEVICE")
    return guard if isinstance(guard, str) and guard.startswith("cuda") else None


# ---- CPU tensors ------------------------------------------------------------------------------


def interpreter_on() -> bool:
    """Whether `triton.jit` builds interpreted kernels (TRITON_INTERPRET=1 read when
    triton.language was imported, which decorated tl's own jit functions)."""
    import triton.language as tl

    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(getattr(tl, "zeros_like", None), InterpretedFunction)


@contextmanager
def interpreted() -> Iterator[None]:
    """The guard of a call whose kernels take CPU tensors."""
    if not interpreter_on():
        raise CoilError(
            "target 'triton' on CPU tensors runs kernels in the Triton interpreter: set TRITON_INTERPRET=1 "
            "before triton is imported (or use target 'cpp')"
        )
    yield
