"""What generated code calls at run time, and `load_module`, which turns a
CompiledModule into the callable `compiled(*inputs) -> tuple`."""

from __future__ import annotations

import logging
import os
import stat
import time
from typing import Any, Callable, Sequence

import torch

from coil.errors import CoilError
from coil.ir.layout import Layout
from coil.ir.lowered import Subgraph
from coil.ir.shapes import GraphSizes, py_size
from coil.ir.module import CompiledModule

log = logging.getLogger("coil")


# output_code.py allocates with size and stride tuples: torch's own function, no
# Python frame in between (a graph's call allocates every buffer it plans)
empty_strided = torch.empty_strided
# on the current CUDA device, (size, stride, dtype): torch's allocation without the
# dispatcher (what Inductor's wrappers call); torch.empty_strided where it is missing
empty_strided_cuda = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None) or (
    lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device="cuda"))

# on the CPU, (size, stride, dtype): the same without the dispatcher
empty_strided_cpu = getattr(torch._C._dynamo.guards, "_empty_strided_cpu", None) or (
    lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device="cpu"))


# externs whose torch function takes the overload's arguments as output_code.py passes
# them (positional, keyword-only ones by name) and calls that overload, unboxed.  The
# overload's C++ entry point (`_op`) boxes every argument into the dispatcher's stack:
# a convolution's four int lists cost it 3.5 µs more a call than torch.convolution on
# this 2-vCPU host (mm 0.25, addmm 0.55, bmm 0.3, baddbmm 0.5): a ResNet inference
# call makes 20 convolutions, MobileNetV2's 52.  tests/test_runtime_calls.py checks that
# each function dispatches to its overload.
DIRECT_BINDINGS: dict[str, str] = {
    "aten::convolution": "convolution",
    "aten::mm": "mm",
    "aten::addmm": "addmm",
    "aten::bmm": "bmm",
    "aten::baddbmm": "baddbmm",
}


def run_cond(pred: Any, true_fn: Any, false_fn: Any, operands: Sequence[Any]) -> Any:
    """higher_order.cond as its dense implementation (CompositeExplicitAutograd)
    runs it, the branch `pred` picks called on the operands, without the
    higher-order op's dispatch to get there: a cond of two one-kernel branches on
    the CPU took 56 µs a call, Inductor's (an `if` in its wrapper) 19."""
    return true_fn(*operands) if pred else false_fn(*operands)


def run_while_loop(cond_fn: Any, body_fn: Any, carried_inputs: Sequence[Any], additional_inputs: Sequence[Any],
                   stack_output: bool = False, **rest: Any) -> Any:
    """higher_order.while_loop as its dense implementation runs it (torch 2.13's:
    the carried values cloned where the body never runs, each step's stacked with
    `stack_output`), without the op's dispatch: 16 steps of a one-kernel body on
    the CPU took 163 µs a call, Inductor's 71.  An argument this does not know
    (a later torch's) goes to the op itself."""
    if any(k != "mutated_arg_indices" for k in rest):
        return torch.ops.higher_order.while_loop(cond_fn, body_fn, carried_inputs, additional_inputs,
                                                 stack_output=stack_output, **rest)
    carried = tuple(carried_inputs)
    pred = cond_fn(*carried, *additional_inputs)
    if not pred:
        return tuple((v.unsqueeze(0) if stack_output else v).clone() if isinstance(v, torch.Tensor) else v
                     for v in carried)
    steps: list[list[Any]] = [[] for _ in carried]
    while pred:
        carried = tuple(body_fn(*carried, *additional_inputs))
        if stack_output:
            for kept, v in zip(steps, carried):
                kept.append(v)
        pred = cond_fn(*carried, *additional_inputs)
    return tuple(torch.stack(kept) for kept in steps) if stack_output else carried


# higher-order ops output_code.py calls as plain functions
DIRECT_HIGHER_ORDER = {"cond": run_cond, "while_loop": run_while_loop}


def aten_op(overload: Any) -> Any:
    """What output_code.py calls for an extern: for a default overload in
    DIRECT_BINDINGS, torch's function of it; else the operator's C++ entry point,
    which OpOverload.__call__ only forwards to (a Python frame and 2 µs less per
    call); a higher-order op of DIRECT_HIGHER_ORDER, its function; the overload
    itself where torch has neither."""
    if isinstance(overload, torch._ops.HigherOrderOperator) and overload.name() in DIRECT_HIGHER_ORDER:
        return DIRECT_HIGHER_ORDER[overload.name()]
    schema = getattr(overload, "_schema", None)
    if schema is not None and getattr(overload, "_overloadname", None) == "default":
        name = DIRECT_BINDINGS.get(schema.name)
        direct = getattr(torch._C._VariableFunctions, name, None) if name else None
        if direct is not None:
            return direct
    return getattr(overload, "_op", overload)


def reinterpret_tensor(t: torch.Tensor, size: Sequence[int], stride: Sequence[int], offset: int) -> torch.Tensor:
    return t.as_strided(tuple(size), tuple(stride), offset)


# output_code.py's views: (base, size, stride, offset from the base's own storage
# offset), torch's C++ function that Inductor's wrappers call (no dispatcher, half
# as_strided's cost), else as_strided
reinterpret_view = getattr(torch._C._dynamo.guards, "_reinterpret_tensor", None) or (
    lambda t, size, stride, delta: t.as_strided(size, stride, t.storage_offset() + delta))


def ensure_layout(t: Any, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype, name: str = "") -> Any:
    """An extern's result in the layout its fake tensor promised.  Kernels index
    extern outputs by that layout; an aten kernel whose meta function disagrees
    with it gets its result converted or copied, not misread: other strides (seen:
    CPU attention backward) are copied, another dtype (seen: bfloat16 running
    stats of _batch_norm_with_update, whose meta function says float32) is
    converted, and another size raises."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.dtype != dtype:
        t = t.to(dtype)
    if t.shape != size:
        raise CoilError(f"extern result {name} has size {list(t.shape)}, planned {list(size)}", stage="run")
    if all(s == 1 or a == b for s, a, b in zip(size, t.stride(), stride)):
        return t
    fixed = torch.empty_strided(tuple(size), tuple(stride), dtype=t.dtype, device=t.device)
    fixed.copy_(t)
    return fixed


def ensure_dtype(t: Any, dtype: torch.dtype) -> Any:
    """An extern's result that no kernel indexes, in the dtype coil planned for it
    (its meta function's): eager code after it sees the dtype it was traced with."""
    return t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype != dtype else t


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
        bg = module.buffer_graph
        # the caller's inputs; the graph's tensor constants follow them in `call`'s args
        self.input_layouts = tuple(i.layout for i in bg.inputs if i.value is None)
        self.input_names = tuple(i.name for i in bg.inputs if i.value is None)
        # symbolic sizes: the call's arguments are the SymInt inputs and the tensors, in
        # placeholder order; `check` reads the symbols from them, then checks every input
        self.sizes = bg.sizes
        self._bind_sources: frozenset[str] = frozenset()  # the inputs a symbol is read from
        self._size_inputs = frozenset(name for name, _ in bg.sizes.inputs)
        if bg.sizes:
            by_name = dict(zip(self.input_names, self.input_layouts))
            self.input_names = tuple(n for n in bg.sizes.order)
            self.input_layouts = tuple(by_name.get(n) for n in self.input_names)  # type: ignore[misc]
            from coil.ir.wrapper import Bind

            # the symbols the inputs give; a data-dependent one (u0) `call` binds from an extern's result
            self._binds = tuple(ln for ln in module.program.lines
                                if isinstance(ln, Bind) and ln.source in bg.sizes.order)
            self._bind_sources = frozenset(b.source for b in self._binds)
            self._at = _expected_at(bg.sizes, self.input_names, self.input_layouts)
            self._entry = bg.sizes.entry_symbols()  # the order `_at` takes their values in
        # SymInt inputs whose range coil assumed: (position, least, greatest)
        self.assumed_ranges = tuple((self.input_names.index(name), lo, hi)
                                    for name, lo, hi in bg.sizes.assumed_inputs())
        self.constants = tuple(i.value for i in bg.inputs if i.value is not None)
        self._tokens = frozenset(i.name for i in bg.inputs if i.token)
        self._restrided: set[str] = set()
        from coil.ir.wrapper import indexed_by_layout

        self._indexed = indexed_by_layout(module.program.lines)
        # what a matching input looks like, compared field by field on each call
        # (building a Layout per input per call cost more than a small kernel)
        # `taken`: what else `check` takes as it is, so it need not run on every call:
        # None for an effect token, a CPU scalar for a scalar no kernel indexes
        self._expected = tuple(
            (lay.size, lay.dtype, torch.device(lay.device), tuple(i for i, n in enumerate(lay.size) if n != 1),
             lay.stride, "token" if name in self._tokens else "cpu" if not lay.size and name not in self._indexed else "")
            for name, lay in zip(self.input_names, self.input_layouts) if lay is not None
        )
        self._indexed_expected = tuple(
            (k, lay.stride, tuple(i for i, n in enumerate(lay.size) if n != 1), torch.device(lay.device))
            for k, (name, lay) in enumerate(zip(self.input_names, self.input_layouts))
            if name in self._indexed and lay is not None
        )

    def _matches(self, inputs: Sequence[Any]) -> bool:
        if len(inputs) != len(self._expected):
            return False
        for t, (size, dtype, device, dims, stride, taken) in zip(inputs, self._expected):
            if t is None and taken == "token":
                continue
            if not isinstance(t, torch.Tensor) or t.shape != size or t.dtype != dtype:
                return False
            if t.device != device and not (taken == "cpu" and t.device.type == "cpu"):
                return False
            got = t.stride()
            # equal strides (the usual case) compare as one tuple; else only dims of size > 1 count
            if got != stride and any(got[i] != stride[i] for i in dims):
                return False
        return True

    def check(self, inputs: list[Any], restride: bool = False) -> None:
        """Raise on inputs of another count, size, dtype or device, naming what
        differs.  A CPU scalar tensor is taken where a scalar tensor of another
        device was compiled for, as eager takes one (the RNG seed and offset of
        CUDA attention arrive so): passed on as it is to externs, moved to the
        device for kernels.  Other strides raise too, unless `restride`: then the
        input is copied, in place in the list, into the layout the kernels were
        compiled for.  Storage offsets may differ: every kernel and view indexes
        an input from its own first element."""
        if self.sizes:
            return self._check_symbolic(inputs, restride)
        if self._matches(inputs):
            return
        if len(inputs) != len(self.input_layouts):
            raise CoilError(f"compiled for {len(self.input_layouts)} inputs, called with {len(inputs)}")
        for k, (name, lay, t) in enumerate(zip(self.input_names, self.input_layouts, inputs)):
            self._check_tensor(inputs, k, name, lay, t, lay.size, lay.stride, restride)

    def _check_tensor(self, inputs: list[Any], k: int, name: str, lay: Layout, t: Any, size: tuple[int, ...],
                      stride: tuple[int, ...], restride: bool) -> None:
        """check of input k against `lay`, whose size and strides are `size` and
        `stride` in this call (the layout's own, or its symbolic ones evaluated)."""
        here = "" if size == lay.size else f" = {list(size)} here"
        if name in self._tokens and t is None:
            return  # AOTAutograd passes None for an effect token
        if not isinstance(t, torch.Tensor):
            raise CoilError(f"input {name}: expected a tensor, got {type(t).__name__}")
        if tuple(t.shape) != size:
            if restride and name not in self._indexed and name not in self._bind_sources:
                # a backward's input only externs see, and no symbol is read from: taken as
                # eager takes it (an aten kernel's result whose meta function gives another
                # size: bf16 embedding_bag's offset2bag, empty where its meta says one per index)
                return
            raise CoilError(f"input {name}: compiled for size {list(lay.size)}{here}, called with size "
                            f"{list(t.shape)}; recompile for new shapes")
        if t.dtype != lay.dtype:
            raise CoilError(f"input {name}: compiled for dtype {lay.dtype}, called with {t.dtype}")
        if t.device != torch.device(lay.device):
            if t.dim() != 0 or t.device.type != "cpu":
                raise CoilError(f"input {name}: compiled for device {lay.device}, called with {t.device}")
            if name in self._indexed:
                inputs[k] = t.to(lay.device)
            return
        if any(n != 1 and a != b for n, a, b in zip(size, stride, t.stride())):
            if restride and name not in self._indexed:
                return  # only externs see it: they take any strides, as in eager
            if not restride:
                shown = "" if stride == lay.stride else f" = {list(stride)} here"
                raise CoilError(f"input {name}: compiled for strides {list(lay.stride)}{shown}, called with "
                                f"{list(t.stride())}")
            if name not in self._restrided:
                self._restrided.add(name)
                log.warning("coil: input %s arrives with strides %s, compiled for %s: copying it",
                            name, list(t.stride()), list(stride))
            fixed = torch.empty_strided(size, stride, dtype=lay.dtype, device=t.device)
            fixed.copy_(t)
            inputs[k] = fixed

    def _check_symbolic(self, inputs: list[Any], restride: bool) -> None:
        """check for a graph of symbolic sizes: the symbols' values come from the
        inputs as `call` reads them (its Bind lines from inputs), each must lie in
        its range, and every input must have the sizes and strides its layout gives
        at them.  A data-dependent symbol is bound and checked inside `call`."""
        if len(inputs) != len(self.input_names):
            raise CoilError(f"compiled for {len(self.input_names)} inputs, called with {len(inputs)}")
        args = dict(zip(self.input_names, inputs))
        symbols = {f.symbol.name: f.symbol for f in self.sizes.shapes.facts}
        values: dict[Any, int] = {}
        for b in self._binds:
            if b.source not in args:
                continue  # bound from an extern's result, after it runs
            src = args[b.source]
            v = src if b.what == "value" else (src.shape if b.what == "size" else src.stride())[b.dim]
            values[symbols[b.symbol]] = int(v)
        for f in self.sizes.shapes.facts:
            if f.symbol not in values:  # known once `call` ran its extern, which checks its range then
                continue
            v = values[f.symbol]
            if v < f.lower or (f.upper is not None and v > f.upper):
                raise CoilError(f"size {f.symbol} = {v} is outside the range {f.lower}..{f.upper} compiled for")

        expected = self._at(*(values[s] for s in self._entry))
        for k, (name, lay, t, want) in enumerate(zip(self.input_names, self.input_layouts, inputs, expected)):
            if lay is None:  # a SymInt input, or one passed on untouched (a jagged tensor's nested int)
                if name not in self._size_inputs:
                    continue
                if not isinstance(t, int) or t != want:
                    raise CoilError(f"input {name}: expected the size {dict(self.sizes.inputs)[name]} = {want}, "
                                    f"got {t!r}")
                continue
            self._check_tensor(inputs, k, name, lay, t, want[0], want[1], restride)

    def save_after_first_call(self, book: Any) -> None:
        """Write `book` (the kernel images its launches bound: triton/images.py) once
        the first call has run, then call `call` directly again."""
        call = self._call

        def first(args: list[Any]) -> Any:
            try:
                return call(args)
            finally:
                self._call = call
                book.save()

        self._call = first

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        args = list(inputs)
        self.check(args)
        args.extend(self.constants)
        return tuple(self._call(args))

    def _indexed_match(self, inputs: Sequence[Any]) -> bool:
        """Whether the inputs that kernels and views index have the strides and
        device compiled for (the fast path of a backward graph's check)."""
        for k, stride, dims, device in self._indexed_expected:
            t = inputs[k]
            got = t.stride()
            if got != stride and any(got[i] != stride[i] for i in dims):
                return False
            if t.device != device:
                return False
        return True

    def call_boxed(self, args: list[Any]) -> tuple[Any, ...]:
        """AOTAutograd's boxed convention: `call` clears the list, so inputs die as
        soon as their last reader ran.  This is how a backward graph is called: its
        inputs (saved tensors, gradients) are not Dynamo's, so the layouts coil
        indexes are checked (only those: autograd holds sizes and dtypes).  A tensor
        whose strides differ from the fake tensor's the graph was compiled with (an
        aten kernel whose meta function disagrees with it) is copied into the
        compiled layout instead of failing."""
        if self.sizes or len(args) != len(self._expected) or not self._indexed_match(args):
            self.check(args, restride=True)
        if self.constants:
            args.extend(self.constants)
        return tuple(self._call(args))

    def call_guarded(self, args: list[Any]) -> tuple[Any, ...]:
        """The boxed call of a forward or inference graph under torch.compile: its
        inputs are the Dynamo graph's (parameters, buffers, the caller's tensors),
        whose sizes, strides, dtypes and devices Dynamo's guards have checked just
        before this call, so nothing is checked again."""
        if self.constants:
            args.extend(self.constants)
        return tuple(self._call(args))


def _expected_at(sizes: GraphSizes, names: Sequence[str], layouts: Sequence[Layout | None]) -> Callable[..., Any]:
    """A function of the values of the symbols known on entry (GraphSizes.entry_symbols)
    giving, for each input, its value (a SymInt input) or its sizes and strides:
    the expressions written once as Python, so a call checks its inputs without
    evaluating sympy (a backward graph's check runs on every call)."""
    backed = sizes.entry_symbols()
    given = dict(sizes.inputs)
    items = []
    for name, lay in zip(names, layouts):
        if lay is None:  # a SymInt input; None for one passed on untouched (a nested int)
            items.append(py_size(given[name]) if name in given else "None")
        else:
            items.append(f"(({''.join(py_size(v) + ', ' for v in lay.size)}), "
                         f"({''.join(py_size(v) + ', ' for v in lay.stride)}))")
    text = f"def at({', '.join(s.name for s in backed)}):\n    return ({''.join(i + ', ' for i in items)})\n"
    scope: dict[str, Any] = {}
    exec(compile(text, "<coil input sizes>", "exec"), scope)  # noqa: S102 - expressions coil printed
    return scope["at"]  # type: ignore[no-any-return]


class CacheUnwritable(CoilError):
    """The cache dir, or a folder or file in it, cannot be created or written (a
    read-only or full disk).  A cache that only saves time (compiled graphs, links,
    autotuning results) catches it and goes on uncached; the C++ target, whose
    shared object must live somewhere, lets it through."""


FIX_HINT = "point $COIL_CACHE_DIR (or Options(cache_dir=...)) at a folder only you can write"


def _unsafe(st: os.stat_result) -> str | None:
    """Why a folder of this stat may not hold code coil runs, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
        return f"it is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _unsafe_parent(parent: str) -> str | None:
    try:
        st = os.stat(parent)
    except OSError:
        return None
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        return f"its parent {parent} is writable by others without the sticky bit"
    return None


def secure_dir(path: str) -> str:
    """`path`, created with mode 0700 if missing, after making sure nobody else can
    put files there: anyone who can write in coil's cache can plant a pickle, a
    shared object or Python that coil would load and run as you.  A folder owned
    by another user or writable by group or others is refused, as is one in a
    parent that others may write without the sticky bit (they could swap it).
    Checked on every use (a few stat calls), so a folder replaced or opened up
    since is seen."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
        except OSError as e:
            raise CacheUnwritable(f"cannot create the cache dir {path} ({e.strerror or e}); {FIX_HINT}") from e
    except OSError as e:
        raise CacheUnwritable(f"cannot read the cache dir {path} ({e.strerror or e}); {FIX_HINT}") from e
    problem = None
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (os.getuid(), 0):
            problem = f"it is a symbolic link owned by uid {st.st_uid}"
        else:
            try:
                st = os.stat(path)
            except OSError as e:
                problem = f"it is a symbolic link that does not resolve ({e.strerror or e})"
    problem = problem or _unsafe(st) or _unsafe_parent(os.path.dirname(os.path.abspath(path)))
    if problem is not None:
        fix = f"`chmod 700 {path}` if it is yours, or " if problem.startswith("it is writable") else ""
        raise CoilError(f"refusing the cache dir {path}: {problem}; whoever can write there could plant code "
                        f"that coil would load and run as you. To fix: {fix}{FIX_HINT}")
    return path


def configured_dir(configured: str | None = None) -> str:
    """Options.cache_dir, else $COIL_CACHE_DIR, else a per-user folder under the
    system temp dir; not created, not checked."""
    import tempfile

    return configured or os.environ.get("COIL_CACHE_DIR") or os.path.join(tempfile.gettempdir(), f"coil-{os.getuid()}")


def cache_dir(configured: str | None = None, sub: str | None = None) -> str:
    """Where generated files live (configured_dir); with `sub`, that folder in it.
    Both are created and checked (secure_dir) on every use."""
    d = secure_dir(configured_dir(configured))
    return secure_dir(os.path.join(d, sub)) if sub else d


def write_atomic(path: str, data: bytes) -> None:
    """Write through a temporary file (mode 0600) in the same folder, then rename it
    into place: a reader sees the old file or the whole new one, never half of it."""
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


def read_bytes(path: str) -> bytes | None:
    """The file's bytes, or None when it is missing or cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


_warned_uncached: set[str] = set()


def _source_file(source: str, key: str, directory: str | None) -> str:
    """The path of output_code.py in the cache, written there unless a file with
    exactly this text is there already.  Triton reads a kernel's source back with
    inspect, so the text should be on disk; where the cache cannot be written the
    module still loads, from the text registered with linecache (load_module)."""
    try:
        folder = cache_dir(directory)
    except CacheUnwritable as e:
        _warn_uncached(str(e))
        return os.path.join(configured_dir(directory), f"c{key}.py")
    path = os.path.join(folder, f"c{key}.py")
    data = source.encode()
    if read_bytes(path) != data:  # missing, damaged, or another text: never trusted
        try:
            write_atomic(path, data)
        except OSError as e:
            _warn_uncached(f"cannot write {path} ({e.strerror or e})")
    return path


def _warn_uncached(why: str) -> None:
    if why not in _warned_uncached:
        _warned_uncached.add(why)
        log.warning("coil: %s; output_code.py runs without a copy in the cache", why)


def load_module(module: CompiledModule, directory: str | None = None,
                compile_subgraph: Callable[[Subgraph], CompiledFn] | None = None) -> CompiledFn:
    """Write output_code.py to the cache dir `directory` (Options.cache_dir; Triton
    reads kernel source from files) and run it as a fresh module, compiled from
    the text in hand, never from a file or a .pyc someone else could have put
    there; wrap its `call`.  Its higher-order ops' subgraphs are bound then
    (`bind_subgraphs`): `compile_subgraph` compiles one (by default
    coil.compile_graph with the environment's options)."""
    import hashlib
    import linecache
    import types

    key = hashlib.sha256(module.source.encode()).hexdigest()[:24]
    path = _source_file(module.source, key, directory)
    # tracebacks and inspect.getsource (Triton's @jit) read this text, whatever the
    # file on disk holds later; an mtime of None keeps checkcache from dropping it
    linecache.cache[path] = (len(module.source), None, module.source.splitlines(True), path)
    mod = types.ModuleType(f"coil_output_{key}")
    mod.__file__ = path
    exec(compile(module.source, path, "exec"), mod.__dict__)  # noqa: S102 - coil's own generated code
    bind_subgraphs(module, mod.__dict__, compile_subgraph)
    # a target's loading step (Triton on CUDA: kernel images, compiling ahead)
    prepare = mod.__dict__.get("prepare_module")
    book = prepare(mod.__dict__, module.source, directory) if prepare is not None else None
    fn = CompiledFn(module, mod.__dict__)
    if book is not None and not book.loaded:
        fn.save_after_first_call(book)
    return fn


def bind_subgraphs(module: CompiledModule, namespace: dict[str, Any],
                   compile_subgraph: Callable[[Subgraph], CompiledFn] | None) -> None:
    """Bind each subgraph output_code.py names (passes/higher_order.py), once per
    name: a compiled one to a SubgraphFn of its compile, an FX one to its
    GraphModule.  A subgraph coil cannot compile runs as its FX graph, with a log
    line: the op still gets a function that computes the same values."""
    from coil.backends.wrapper import subgraph_symbol
    from coil.ir.lowered import extern_subgraphs
    from coil.ir.wrapper import ExternCall

    for ln in module.program.lines:
        if not isinstance(ln, ExternCall):
            continue
        for sub in extern_subgraphs((ln.args, tuple(v for _, v in ln.kwargs))):
            symbol = subgraph_symbol(sub.name)
            if namespace.get(symbol) is not None:
                continue
            namespace[symbol] = sub.gm
            if not sub.compiled:
                continue
            try:
                if compile_subgraph is None:
                    import coil

                    fn = coil.compile_graph(sub.gm, sub.inputs, kind="subgraph")
                else:
                    fn = compile_subgraph(sub)
                namespace[symbol] = SubgraphFn(fn, sub.gm, sub.takes, sub.arity)
            except CoilError as e:
                log.warning("coil: subgraph %s of %s was not compiled (%s): it runs as its FX graph, in eager",
                            sub.name, ln.kernel, e)


class SubgraphFn:
    """A compiled subgraph as its higher-order op calls it: with all the subgraph's
    inputs (of which it takes those at `takes`), any strides (copied into those
    compiled for where a kernel indexes them, as a backward's are), returning what
    the FX graph returns (one tensor, a tuple or a list)."""

    def __init__(self, compiled: CompiledFn, gm: torch.fx.GraphModule, takes: Sequence[int], arity: int) -> None:
        self.compiled = compiled
        out = gm.graph.output_node().args[0]
        self._shape = "one" if not isinstance(out, (tuple, list)) else type(out).__name__
        self._takes = None if list(takes) == list(range(arity)) else tuple(takes)
        self._arity = arity

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != self._arity:
            raise CoilError(f"a subgraph of {self._arity} inputs called with {len(inputs)}")
        args = list(inputs) if self._takes is None else [inputs[k] for k in self._takes]
        self.compiled.check(args, restride=True)
        args.extend(self.compiled.constants)
        out = self.compiled._call(args)
        if self._shape == "one":
            return out[0]
        return list(out) if self._shape == "list" else tuple(out)
