"""The `triton` target: one @triton.jit kernel per fused kernel, defined at module
level in output_code.py (Triton reads the source from that file), launched by the
wrapper with a grid and block sizes chosen from the static sizes.

    triton_poi_fused_add_0[grid(4096, 1024)](arg0_1, buf0, 4096, XBLOCK=1024, num_warps=4)

A reduction of one long row launches as two kernels, partial results then their
combination (split.py).  Kernels on CUDA tensors launch under `torch.cuda.device(...)`; kernels on CPU
tensors need the Triton interpreter (TRITON_INTERPRET=1), which the call checks.

A kernel whose spec asserts run-time checks (KernelSpec.asserts, spelled as
handler.py's tl.device_assert) launches on CUDA with
`debug=True` (Triton compiles device asserts only then) and `sanitize_overflow=False`
(which debug would otherwise turn on: asserts on every int32 overflow, where eager
wraps), as Inductor launches its kernels with indirect indexing; a failed check is
then a device-side assert, as in eager.  On CPU tensors the launch runs under
`interpreter_checks`, which turns the interpreter's asserts on and raises eager's
error for a failed check.
"""

from __future__ import annotations

import dataclasses
import re
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import attrs
import torch

from coil.backends.common import repeated_kernels
from coil.backends.triton.helpers import helpers_for
from coil.backends.triton.kernel import combo_source, kernel_source
from coil.backends.triton.runtime import Launch, interpreter_on
from coil.backends.triton.split import split_source
from coil.backends.wrapper import owns_storage
from coil.ir.buffers import ExternBuffer
from coil.ir.expr import check_error
from coil.ir.kernel import Combo, KernelLaunch, KernelSpec, LaunchRule, Split, Tiled
from coil.ir.lowered import returns_alias
from coil.ir.module import KernelSource
from coil.ir.wrapper import ExternCall, KernelCall, MultiOutputLine, ReinterpretView, WrapperProgram
from coil.ir.shapes import py_size
from coil.options import Options

# launch options of a CUDA kernel whose device asserts must exist
CHECKED_LAUNCH = {"debug": True, "sanitize_overflow": False}


# a symbolic size is its expression (the message is a constant of the kernel): eager's
# error then names the size by it ("with size s1")
_CHECK_MESSAGE = re.compile(r"coil check: error=(\w+) dim=(-?\d+) size=([^'\"\n]+)")


@contextmanager
def interpreter_checks() -> Iterator[None]:
    """Around an interpreted launch of a kernel with device asserts (CPU tensors).
    Triton's interpreter runs tl.device_assert only when its options have debug on,
    which a launch cannot ask for: they are turned on for the launch (overflow
    sanitizing off), and an assert that fails becomes eager's error for the check
    its message names (without the bad value, which the message cannot carry).  A
    Triton whose interpreter keeps no such options leaves the asserts off: the
    clamp after each still keeps reads in bounds."""
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    saved = getattr(builder, "options", None)
    if builder is None or not dataclasses.is_dataclass(saved) or not hasattr(saved, "debug"):
        yield
        return
    fields = {"debug": True, **({"sanitize_overflow": False} if hasattr(saved, "sanitize_overflow") else {})}
    builder.options = dataclasses.replace(saved, **fields)  # type: ignore[type-var]
    try:
        yield
    except Exception as e:
        m = _CHECK_MESSAGE.search(str(e))
        if m is None:
            raise
        size = m.group(3).strip()
        raise check_error(m.group(1), None, int(size) if size.isdigit() else size, int(m.group(2))) from e
    finally:
        builder.options = saved


def grid_text(k: KernelSpec, ln: KernelLaunch) -> str:
    """How a launch's grid reads in its launch line: runtime.grid / grid2 of the
    sizes and blocks, or a split's literal grids."""
    c = ln.config
    if ln.rule is LaunchRule.SPLIT:
        return f"({ln.grid[0]}, {ln.grid[1]})"
    if ln.rule in (LaunchRule.COMBINE, LaunchRule.COMBO):
        return f"({ln.grid[0]},)"
    if isinstance(k.space, Tiled):
        one = ", one_axis=True" if k.space.one_axis else ""
        return f"grid2({py_size(ln.sizes[0])}, {py_size(ln.sizes[1])}, {c.yblock}, {c.xblock}{one})"
    return f"grid({py_size(ln.sizes[0])}, {c.xblock})"


def _launch(k: KernelSpec, ln: KernelLaunch, tensors: tuple[str, ...]) -> Launch:
    c = ln.config
    sizes: tuple[Any, ...] = ln.sizes
    if k.symbols:  # symbolic sizes: expressions of the symbols `call` bound, then the symbols
        sizes = (*(py_size(v) for v in ln.sizes), *k.symbols)
    return Launch(ln.function, ln.grid, grid_text(k, ln), tensors, sizes, (*c.meta().items(), ("num_warps", c.num_warps)))


def workspaces(k: KernelSpec) -> list[str]:
    """A split kernel's workspace names."""
    assert isinstance(k.space, Split)
    return [f"ws{k.name.rsplit('_', 1)[-1]}_{i}" for i in range(len(k.space.workspaces))]


def launches(line: KernelCall, program: WrapperProgram) -> tuple[list[str], list[Launch], list[str]] | None:
    """A launch line's kernel launches, with the lines before them (a split's
    workspaces) and after them (their frees); None when there is nothing to
    compute.  A kernel with device asserts launches on CUDA with CHECKED_LAUNCH."""
    return spec_launches(program.spec(line.kernel), line)


def spec_launches(k: KernelSpec, line: KernelCall, guard: str | None = None
                  ) -> tuple[list[str], list[Launch], list[str]] | None:
    """launches() of the kernel `k` (a spec of the program or a persistent variant) on
    the line's arguments.  A split's workspaces on `guard`, the device current while
    `call` runs, are allocated without the dispatcher (empty_strided_cuda)."""
    if not k.launches:
        return None
    before: list[str] = []
    after: list[str] = []
    tensors = tuple(line.args)
    if isinstance(k.space, Split):
        ws = workspaces(k)
        rows = k.space.xnumel
        n = rows * k.space.parts
        before = [f"{w} = empty_strided_cuda(({n},), (1,), {dt})" if k.device == guard else
                  f"{w} = empty_strided(({n},), (1,), dtype={dt}, device={k.device!r})"
                  for w, (_, dt) in zip(ws, k.space.workspaces)]
        tensors = (*tensors, *ws)
        after = [f"del {', '.join(ws)}"]
    out = [_launch(k, ln, tensors) for ln in k.launches]
    if k.asserts and k.device.startswith("cuda"):
        out = [ln.with_meta(CHECKED_LAUNCH) for ln in out]
    return before, out, after


def tier_launches(k: KernelSpec, line: KernelCall) -> list[tuple[KernelLaunch, list[Launch]]]:
    """The launches of the tiers of k's choice (Choice.tiers) on the line's
    arguments: the persistent variant at a longer row's RBLOCK, each through a
    launcher of its own (`launch_<variant>_r1024`)."""
    assert k.choice is not None
    v = k.choice.persistent
    out = []
    for tier in k.choice.tiers:
        planned = spec_launches(attrs.evolve(v, launches=(tier,)), line)
        assert planned is not None
        out.append((tier, [attrs.evolve(ln, tag=f"_r{tier.config.rblock}") for ln in planned[1]]))
    return out


def aligned_by_allocation(program: WrapperProgram) -> tuple[frozenset[str], frozenset[str]]:
    """(inputs, unknown): the graph inputs whose storage the kernels launch on
    (directly or through views), whose 16-byte alignment the call checks; and the
    kernel arguments whose alignment is not fixed ahead (an alias an extern
    returns).  Everything else a kernel takes was allocated by coil or returned
    fresh by an aten kernel: aligned on every call alike."""
    graph = program.buffer_graph
    inputs = set(program.inputs)
    base: dict[str, str] = {}
    fresh: dict[str, bool] = {}
    for ln in program.lines:
        if isinstance(ln, ReinterpretView):
            base[ln.name] = base.get(ln.base, ln.base)
        elif isinstance(ln, ExternCall):
            fresh[ln.name] = owns_storage(program, ln.name)
        elif isinstance(ln, MultiOutputLine):
            parent = graph.get(ln.extern)
            fresh[ln.name] = not (isinstance(parent, ExternBuffer) and returns_alias(parent.kernel))
    read: set[str] = set()
    unknown: set[str] = set()
    for ln in program.lines:
        if isinstance(ln, KernelCall):
            for a in ln.args:
                root = base.get(a, a)
                if root in inputs:
                    read.add(root)
                elif not fresh.get(root, True):
                    unknown.add(a)
    return frozenset(read), frozenset(unknown)


def shared_kernels(kernels: Sequence[KernelSource]) -> dict[str, str]:
    """The Triton functions named after an earlier one of the same source
    (common.repeated_kernels): Triton's cache keys on a function's source, name
    included, so each would be compiled anew."""
    return repeated_kernels(kernels, r"^def (\w+)\(", "#")


def precompile_specs(program: WrapperProgram, shared: dict[str, str] | None = None) -> list[str]:
    """One `(kernel, argument dtypes and sizes, launch meta, device)` line per launch
    the spec does not fix (KernelLaunch.fixed), for runtime.precompile; a kernel
    named after an earlier one (`shared`) is compiled under that one's name, once
    for each launch that differs."""
    shared = shared or {}
    out = []
    for ln in program.lines:
        if not isinstance(ln, KernelCall):
            continue
        k = program.spec(ln.kernel)
        for launch in k.launches:
            if launch.fixed:
                continue
            cfg = launch.config
            args = [str(program.layout(a).dtype) for a in ln.args] + [str(n) for n in launch.sizes]
            meta = ", ".join(f"{key!r}: {v}" for key, v in (*cfg.meta().items(), ("num_warps", cfg.num_warps)))
            if k.asserts:
                meta += "".join(f", {key!r}: {v}" for key, v in CHECKED_LAUNCH.items())
            out.append(f"    ({shared.get(launch.function, launch.function)}, ({', '.join(args)},), {{{meta}}}, "
                       f"{k.device!r}),")
    return list(dict.fromkeys(out))


def launch_decisions(program: WrapperProgram) -> list[tuple[str, str, str, str]]:
    """(kernel, kind, launch, why) for every kernel launch of the program: the grid
    and config the wrapper will print, and why schedule_kernels chose them."""
    out: list[tuple[str, str, str, str]] = []
    for ln in program.lines:
        if not isinstance(ln, KernelCall):
            continue
        k = program.spec(ln.kernel)
        if not k.launches:
            out.append((k.name, k.kind, "-", "nothing to compute: no launch"))
            continue
        for launch in k.launches:
            kind = launch.rule.value if isinstance(k.space, (Split, Combo)) else k.config_kind
            out.append((launch.function, kind, f"{grid_text(k, launch)} {launch.config.as_kwargs()}", launch.why))
        if isinstance(k.space, Combo):  # each member's own launch, which the combo's programs run
            for name, start in zip(k.space.members, k.space.starts):
                m = program.spec(name)
                own = m.launches[0]
                out.append((name, m.config_kind, f"programs [{start}, {start + own.grid[0]}) of {k.name}, "
                            f"XBLOCK={own.config.xblock}", own.why))
        if k.choice is not None:
            v = k.choice.persistent
            for launch, test in zip(k.choice.launches, k.choice.tests()):
                out.append((launch.function, v.config_kind, f"{grid_text(v, launch)} {launch.config.as_kwargs()}",
                            f"where {test}, instead of {k.name}: {launch.why}"))
        if k.wide is not None:
            twins = ", ".join(v.name for v in k.wide_twin().variants)
            out.append((twins, k.config_kind, "as above, int64 index math",
                        f"where not ({k.wide.test()}), instead of {k.name}: an offset passes int32"))
    return out


class TritonBackend:
    language = "triton"

    def header(self, options: Options) -> list[str]:
        return [
            "import triton",
            "import triton.language as tl",
            "from triton.language.extra import libdevice",
            "from coil.backends.triton.runtime import Launcher, SizedLauncher, autotuned, grid, grid2, interpreted, "
            "prepare_module, raw_stream",
            "from coil.backends.triton.codegen import interpreter_checks",
        ]

    def kernels(self, program: WrapperProgram, options: Options) -> tuple[KernelSource, ...]:
        """One source per spec, and after it its variants (KernelSpec.variants: a persistent
        variant, an int64 twin)."""
        specs = [v for k in program.specs for v in k.variants]
        own = tuple(kernel_source(k, part=True) if program.combo_of(k.name) else
                    split_source(k) if isinstance(k.space, Split) else kernel_source(k) for k in specs)
        return own + tuple(combo_source(c, [program.spec(m) for m in c.space.members])  # type: ignore[union-attr]
                           for c in program.combos)

    def definitions(self, kernels: Sequence[KernelSource], options: Options,
                    program: WrapperProgram) -> list[str]:
        out: list[str] = []
        cuda = any(k.device.startswith("cuda") for k in program.specs)
        # the GPU's helpers (libdevice) only where kernels are compiled: the
        # interpreter (TRITON_INTERPRET=1) has no libdevice, CUDA tensors or not
        shared = shared_kernels(kernels)
        own = [k.source for k in kernels if k.name not in shared]
        for text in helpers_for((k.source for k in kernels), cuda and not interpreter_on()) + own:
            out += ["", text, ""]
        if shared:
            out += ["# kernels whose source repeats an earlier one's (comments aside): one function, compiled once",
                    *(f"{name} = {earlier}" for name, earlier in shared.items()), ""]
        symbolic = bool(program.shapes)  # sizes change by call: Triton's own launch path, no precompiling
        if cuda and not options.autotune and not symbolic:  # bound launches: Triton's binding runs once (runtime.Launcher)
            guard = self.guard_device(program)
            _, unknown = aligned_by_allocation(program)
            # the device the bound launches run on: load_module (prepare_module) loads their
            # kernel images there, kept in cache_dir by the source (Options.kernel_images)
            out += ["", f"LAUNCH_DEVICE = {guard!r}"]
            for ln in program.lines:
                if not isinstance(ln, KernelCall) or (planned := launches(ln, program)) is None:
                    continue
                bind = program.spec(ln.kernel).device == guard and not unknown.intersection(ln.args)
                out += [launch.definition(bind, options.kernel_images) for launch in planned[1]]
            specs = precompile_specs(program, shared) if options.precompile else []
            if specs:  # compiled when the module loads, several at a time, instead of one by one at
                # their first launch; skipped where every bound launch has its image (prepare_module)
                out += ["", "PRECOMPILE = [", *specs, "]"]
        if cuda and not options.autotune and symbolic:
            # sizes change by call: each launch line computes its grid and passes the sizes to
            # its SizedLauncher, bound once for each specialization of the sizes (a choice's
            # persistent variant too); a kernel on another device keeps Triton's own launch
            guard = self.guard_device(program)
            _, unknown = aligned_by_allocation(program)
            out.append("")
            for ln in program.lines:
                if not isinstance(ln, KernelCall) or program.spec(ln.kernel).device != guard:
                    continue
                bind = not unknown.intersection(ln.args)
                chosen = {v.choice.persistent.name: v for v in program.spec(ln.kernel).variants if v.choice}
                for v in program.spec(ln.kernel).variants:
                    if (planned := spec_launches(v, ln)) is not None:
                        out += [launch.sized_definition(bind) for launch in planned[1]]
                    if v.name in chosen:  # a persistent variant's tiers after its own launch
                        out += [launch.sized_definition(bind) for _, tier in tier_launches(chosen[v.name], ln)
                                for launch in tier]
        if options.autotune and not symbolic:
            # the launch lines stay as they are; on CUDA the wrapper times a few
            # configs at the first call and launches the winner instead
            cache = f", cache_dir={options.cache_dir!r}" if options.cache_dir else ""
            for k in program.specs:
                if any(ln.fixed for ln in k.launches):
                    continue
                out.append(f"{k.name} = autotuned({k.name}, {k.config_kind!r}{cache})")
        return out

    def call(self, line: KernelCall, program: WrapperProgram, options: Options) -> list[str]:
        """The launch lines of a kernel call; a kernel with a persistent variant
        (KernelSpec.choice) launches that one where the row fits it, else itself;
        one with an int64 twin (KernelSpec.wide) launches the twin (and its own
        choice) where an offset passes int32."""
        k = program.spec(line.kernel)
        narrow = self._chosen(k, line, program, options)
        if k.wide is None:
            return narrow
        # int32 index math where every offset fits, else the int64 twin (KernelSpec.wide)
        wide = self._chosen(k.wide_twin(), line, program, options)
        return [f"if {k.wide.test()}:", *("    " + ln for ln in narrow), "else:", *("    " + ln for ln in wide)]

    def _chosen(self, k: KernelSpec, line: KernelCall, program: WrapperProgram, options: Options) -> list[str]:
        looped = self._call(k, line, program, options)
        c = k.choice
        if c is None:
            return looped
        tests = c.tests()
        out = [f"if {tests[0]}:", *("    " + ln for ln in self._call(c.persistent, line, program, options))]
        for test, (_, tier) in zip(tests[1:], tier_launches(k, line)):
            out += [f"elif {test}:", *("    " + ln for ln in self._call(c.persistent, line, program, options, tier))]
        return [*out, "else:", *("    " + ln for ln in looped)]

    def _call(self, k: KernelSpec, line: KernelCall, program: WrapperProgram, options: Options,
              launched: list[Launch] | None = None) -> list[str]:
        """The launch lines of `k` on the line's arguments (`launched`: these
        launches of it instead of its own, a choice's tier)."""
        planned = spec_launches(k, line, None if options.autotune else self.guard_device(program))
        if planned is None:
            return [f"pass  # {k.name}: nothing to compute (xnumel = 0)"]
        before, out, after = planned
        if launched is not None:
            out = launched
        if k.device.startswith("cuda"):
            if options.autotune or (program.shapes and k.device != self.guard_device(program)):
                return [*before, *(ln.line() for ln in out), *after]
            if program.shapes:
                return [*before, *(ln.sized_line("stream0") for ln in out), *after]
            return [*before, *(ln.bound_line("stream0") for ln in out), *after]
        body = [ln.line() for ln in out]
        if k.asserts:
            body = ["with interpreter_checks():", *("    " + ln for ln in body)]
        return [*before, *body, *after]

    def prologue(self, program: WrapperProgram, options: Options) -> list[str]:
        """The lines at the top of `call`, inside the device guard: on CUDA the
        current stream that the bound launches take, or None when a graph input
        they launch on is not 16-byte aligned (then they launch through Triton's
        path, which specializes on alignment)."""
        guard = self.guard_device(program)
        if guard is None:
            return []
        graph = program.buffer_graph
        inputs, _ = aligned_by_allocation(program)
        kept = {program.inputs[i] for i in options.aligned_inputs if i < len(program.inputs)}
        tested = frozenset(inputs - kept)  # the others keep their place and alignment (Options.aligned_inputs)
        # a CPU scalar tensor a CUDA kernel reads (x * torch.tensor(2.0)) goes to the device first
        moved = [f"{n} = {n}.to({guard!r})" for n in sorted(inputs, key=program.inputs.index)
                 if not graph.layout(n).device.startswith("cuda")]
        if options.autotune:
            return moved
        index = torch.device(guard).index or 0
        if not tested:
            return [*moved, f"stream0 = raw_stream({index})"]
        ptrs = " | ".join(f"{n}.data_ptr()" for n in sorted(tested, key=program.inputs.index))
        return [*moved, f"stream0 = None if ({ptrs}) & 15 else raw_stream({index})"]

    def guard_device(self, program: WrapperProgram) -> str | None:
        """The CUDA device current while `call` runs (device_guard's), if any: its
        first CUDA kernel's."""
        return next((k.device for k in program.specs if k.device.startswith("cuda")), None)

    def device_guard(self, program: WrapperProgram) -> str | None:
        """The `with` line the wrapper puts around the body of `call`."""
        if not program.specs:
            return None
        cuda = self.guard_device(program)
        if cuda is not None:
            return f"with torch.cuda.device({cuda!r}):"
        return "with interpreted():"
