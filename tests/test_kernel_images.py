"""Kernel images (backends/triton/images.py): a bound Triton launch goes through
torch's static CUDA launcher on the cubin Triton compiled, and the cubins are kept
in coil's cache so that a warm start loads them without Triton.

On the CPU: what an image takes off Triton's CompiledKernel (both Triton shapes
coil knows) and why one is refused, the book's round trip through the cache and
its misses, the generated module's lines, and the Launcher's binding, adoption and
call against a stand-in static launcher.  On CUDA: many kinds of kernel launch
statically and match eager call after call, and a module loaded again from the
cache launches from its images without compiling anything through Triton."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.backends import runtime as base_runtime
from coil.backends.triton import images, runtime
from coil.backends.triton.images import ImageBook, KernelImage, kernel_image

HAS_CUDA = torch.cuda.is_available()

NAMES = ("in_ptr0", "out_ptr0", "xnumel", "rnumel", "XBLOCK", "RBLOCK")


def compiled_kernel(signature: dict[str, str] | None = None, scratch: tuple[int, int] | None = (0, 0),
                    cubin: bytes = b"\x7fELF cubin", **md: Any) -> Any:
    """A stand-in for Triton's CompiledKernel, as Triton 3.6 and 3.9 shape it: the
    signature by parameter name ("constexpr" for constants, a size equal to 1
    included), the metadata's launch numbers, the cubin in `asm`."""
    sig = signature or {"in_ptr0": "*fp32", "out_ptr0": "*bf16", "xnumel": "i32", "rnumel": "i64",
                        "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
    fields = dict(name="triton_red_fused_0", shared=1024, num_warps=4, num_ctas=1, cluster_dims=(1, 1, 1),
                  launch_cooperative_grid=False, launch_pdl=False)
    fields.update(md)
    if scratch is not None:
        fields["global_scratch_size"], fields["profile_scratch_size"] = scratch
    return SimpleNamespace(metadata=SimpleNamespace(**fields), src=SimpleNamespace(signature=sig),
                           asm={"cubin": cubin}, function=0xABC)


def test_an_image_takes_the_entrys_parameters_off_the_compiled_kernel() -> None:
    image, why = kernel_image(compiled_kernel(), NAMES, given=4, tensors=2)
    assert image is not None and why.startswith("static"), why
    assert (image.function, image.shared, image.num_warps) == ("triton_red_fused_0", 1024, 4)
    # two pointers, an int32 and an int64 size, then the two scratch pointers the entry takes
    assert image.params == "OOil" + "OO" and image.scratch == 2
    assert image.kept == (True, True, True, True)
    assert image.tail((300, 7), tensors=2) == (300, 7, None, None)


def test_a_size_equal_to_one_is_a_constant_not_a_parameter() -> None:
    sig = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "constexpr", "rnumel": "i32",
           "XBLOCK": "constexpr", "RBLOCK": "constexpr"}
    image, _ = kernel_image(compiled_kernel(sig, scratch=None), NAMES, given=4, tensors=2)
    assert image is not None
    assert image.params == "OOi" and image.scratch == 0  # a Triton without scratch parameters
    assert image.kept == (True, True, False, True)
    assert image.tail((1, 512), tensors=2) == (512,)


@pytest.mark.parametrize("change, reason", [
    (dict(signature={"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "fp16", "rnumel": "i32",
                     "XBLOCK": "constexpr", "RBLOCK": "constexpr"}), "size xnumel has type fp16"),
    (dict(signature={"in_ptr0": "constexpr", "out_ptr0": "*fp32", "xnumel": "i32", "rnumel": "i32",
                     "XBLOCK": "constexpr", "RBLOCK": "constexpr"}), "tensor in_ptr0 is a constant"),
    (dict(signature={"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "rnumel": "i32",
                     "XBLOCK": "i32", "RBLOCK": "constexpr"}), "XBLOCK is passed by keyword"),
    (dict(signature={"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32"}), "rnumel is not in"),
    (dict(scratch=(256, 0)), "scratch memory"),
    (dict(num_ctas=2), "several CTAs"),
    (dict(launch_pdl=True), "launch attribute"),
    (dict(tensordesc_meta=[{"swizzle": 1}]), "tensor descriptor"),
    (dict(cubin=None), "no cubin"),
])
def test_what_the_static_launcher_cannot_pass_stays_on_tritons(change: dict[str, Any], reason: str) -> None:
    image, why = kernel_image(compiled_kernel(**change), NAMES, given=4, tensors=2)
    assert image is None and reason in why, why


def _image(function: str = "k0", cubin: bytes = b"cubin-0") -> KernelImage:
    return KernelImage(function=function, cubin=cubin, shared=0, num_warps=2, params="OOiOO",
                       kept=(True, True, True), scratch=2)


def test_the_book_round_trips_through_the_cache_and_misses_when_damaged(tmp_path: Any) -> None:
    folder = str(tmp_path)
    book = ImageBook.load("k" * 32, folder)
    assert not book.loaded and book.images == {}
    book.add("launch_a", _image("a", b"A" * 100))
    book.add("launch_b", _image("b", b"B" * 50))
    book.save()
    again = ImageBook.load("k" * 32, folder)
    assert again.loaded and again.images == book.images
    again.save()  # read from the cache: nothing written again
    assert sorted(os.listdir(folder)) == sorted([f"{'k' * 32}.json", *(f"{i.digest}.cubin"
                                                                         for i in book.images.values())])
    assert ImageBook.load("x" * 32, folder).images == {}  # another module's key
    cubin = book.images["launch_a"].cubin_file(folder)
    with open(cubin, "wb") as f:
        f.write(b"A" * 99)  # damaged: its hash no longer matches
    assert not ImageBook.load("k" * 32, folder).loaded
    index = os.path.join(folder, f"{'k' * 32}.json")
    data = json.load(open(index))
    data["version"] = 0
    open(index, "w").write(json.dumps(data))
    assert not ImageBook.load("k" * 32, folder).loaded
    open(index, "w").write("{not json")
    assert not ImageBook.load("k" * 32, folder).loaded


def test_an_empty_book_or_one_without_a_folder_writes_nothing(tmp_path: Any) -> None:
    ImageBook(key="e" * 32, folder=str(tmp_path)).save()
    nowhere = ImageBook(key="e" * 32, folder=None)
    nowhere.add("launch_a", _image())
    nowhere.save()
    assert os.listdir(tmp_path) == []


class FakeStatic:
    """Stands in for torch._C._StaticCudaLauncher (a CPU build has none)."""

    def __init__(self, load_result: tuple[int, ...] = (0xF00, 32, 0)) -> None:
        self.launches: list[tuple[Any, ...]] = []
        self.loads: list[tuple[Any, ...]] = []
        self.load_result = load_result

    def _launch_kernel(self, *args: Any) -> None:
        self.launches.append(args)

    def _load_kernel(self, *args: Any) -> tuple[int, ...]:
        assert os.path.exists(args[0])
        self.loads.append(args)
        return self.load_result


class JitStandIn:
    """A JITFunction as a Launcher sees it: arg_names, and a launch returning the
    CompiledKernel (no driver here: the launch itself records nothing)."""

    arg_names = list(NAMES)

    def __init__(self, ck: Any) -> None:
        self.ck, self.launched = ck, 0

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def run(*args: Any, **meta: Any) -> Any:
            self.launched += 1
            return self.ck
        return run


def test_a_launcher_binds_the_static_launcher_and_puts_its_image_in_the_book(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeStatic()
    monkeypatch.setattr(runtime, "static_launcher", lambda: fake)
    monkeypatch.setattr(runtime, "_fast_launch_supported", lambda: False)  # no Triton knobs needed here
    jit = JitStandIn(compiled_kernel())
    lau = runtime.Launcher(jit, (6,), (300, 7), {"XBLOCK": 1, "RBLOCK": 512, "num_warps": 4})
    book = ImageBook(key="b" * 32, folder=None)
    lau.name, lau.book = "launch_k", book
    lau._bind(jit.ck, 4)
    assert lau.mode == runtime.Launcher.STATIC and "static CUDA launcher" in lau.rule, lau.rule
    assert book.images["launch_k"].params == "OOilOO"
    lau(77, "x", "y")
    assert fake.launches == [(0xABC, 6, 1, 1, 4, 1024, "OOilOO", ("x", "y", 300, 7, None, None), 77)]
    off = runtime.Launcher(jit, (6,), (300, 7), {"XBLOCK": 1, "RBLOCK": 512, "num_warps": 4}, static=False)
    off._bind(jit.ck, 4)
    assert off.mode != runtime.Launcher.STATIC


@pytest.mark.parametrize("load_result", [(0xF00, 32, 0), (0x1, 0xF00, 32, 0)])
def test_adopting_an_image_loads_its_cubin_once_and_launches_without_triton(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, load_result: tuple[int, ...]) -> None:
    """Both shapes of _load_kernel's answer (older torch: function first; newer: the
    module first) give the function's handle."""
    fake = FakeStatic(load_result)
    monkeypatch.setattr(runtime, "static_launcher", lambda: fake)
    monkeypatch.setattr(images, "static_launcher", lambda: fake)
    monkeypatch.setattr(runtime, "_fast_launch_supported", lambda: False)
    book = ImageBook(key="c" * 32, folder=str(tmp_path))
    image, _ = kernel_image(compiled_kernel(), NAMES, given=4, tensors=2)
    assert image is not None
    book.add("launch_k", image)
    book.save()
    jit = JitStandIn(compiled_kernel())
    lau = runtime.Launcher(jit, (6, 2), (300, 7), {"XBLOCK": 1, "RBLOCK": 512, "num_warps": 4})
    lau.adopt(ImageBook.load("c" * 32, str(tmp_path)).images["launch_k"], str(tmp_path), 0)
    assert [a[1:] for a in fake.loads] == [("triton_red_fused_0", 1024, 0)]
    lau(5, "x", "y")
    lau(5, "x", "y")
    assert jit.launched == 0 and "coil's cache" in lau.rule
    assert fake.launches == [(0xF00, 6, 2, 1, 4, 1024, "OOilOO", ("x", "y", 300, 7, None, None), 5)] * 2


def _module_namespace(jit: Any, static: bool = True) -> dict[str, Any]:
    meta = {"XBLOCK": 1, "RBLOCK": 512, "num_warps": 4}
    return {"launch_a": runtime.Launcher(jit, (6,), (300, 7), meta, static=static),
            "launch_b": runtime.Launcher(jit, (3,), (300, 7), meta, static=static),
            "launch_c": runtime.Launcher(jit, (3,), (300, 7), meta, bind=False),
            "LAUNCH_DEVICE": "cuda:0", "PRECOMPILE": [("spec",)]}


def test_prepare_module_skips_compiling_ahead_only_where_every_bound_launch_has_its_image(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeStatic()
    compiled_ahead: list[Any] = []
    monkeypatch.setattr(runtime, "static_launcher", lambda: fake)
    monkeypatch.setattr(images, "static_launcher", lambda: fake)
    monkeypatch.setattr(runtime, "book_key", lambda source, device: "d" * 32)
    monkeypatch.setattr(runtime, "precompile", lambda specs: compiled_ahead.append(specs))
    monkeypatch.setattr(runtime, "_fast_launch_supported", lambda: False)
    jit = JitStandIn(compiled_kernel())

    cold = _module_namespace(jit)
    book = runtime.prepare_module(cold, "source", str(tmp_path))
    assert book is not None and not book.loaded and compiled_ahead == [[("spec",)]]
    assert cold["launch_a"].name == "launch_a" and cold["launch_a"].book is book
    for name in ("launch_a", "launch_b"):
        cold[name]._bind(jit.ck, 4)  # as after a first call through Triton
    book.save()
    folder = os.path.join(str(tmp_path), "kernels")
    assert sorted(ImageBook.load("d" * 32, folder).images) == ["launch_a", "launch_b"]

    compiled_ahead.clear()
    warm = _module_namespace(jit)
    again = runtime.prepare_module(warm, "source", str(tmp_path))
    assert again is not None and again.loaded and compiled_ahead == []  # every bound launch loaded
    assert all("coil's cache" in warm[n].rule for n in ("launch_a", "launch_b"))
    assert warm["launch_c"].run is None  # an unbound launch keeps Triton's path
    launched = jit.launched
    warm["launch_a"](1, "x", "y")
    assert jit.launched == launched

    # a profiler's launch hook registered: its launches go through Triton, which calls it
    hooked = _module_namespace(jit)
    hooked["launch_a"].keyed.knobs = SimpleNamespace(runtime=SimpleNamespace(
        launch_enter_hook=SimpleNamespace(calls=[print]), launch_exit_hook=None))
    compiled_ahead.clear()
    runtime.prepare_module(hooked, "source", str(tmp_path))
    assert hooked["launch_a"].run is None and "coil's cache" in hooked["launch_b"].rule
    assert compiled_ahead == [[("spec",)]]

    # a book without one bound launch's image (a branch the first call did not take):
    # compiled ahead, and written again after the first call with the image added
    partial = ImageBook.load("d" * 32, folder)
    del partial.images["launch_b"]
    partial.loaded = False
    os.remove(partial.path() or "")
    partial.save()
    compiled_ahead.clear()
    third = _module_namespace(jit)
    book3 = runtime.prepare_module(third, "source", str(tmp_path))
    assert book3 is not None and not book3.loaded and compiled_ahead == [[("spec",)]]
    assert "coil's cache" in third["launch_a"].rule and third["launch_b"].run is None
    third["launch_b"]._bind(jit.ck, 4)
    book3.save()
    assert sorted(ImageBook.load("d" * 32, folder).images) == ["launch_a", "launch_b"]

    # a module whose bound launches take Triton's launcher only (Options.kernel_images off)
    compiled_ahead.clear()
    assert runtime.prepare_module(_module_namespace(jit, static=False), "source", str(tmp_path)) is None
    assert compiled_ahead == [[("spec",)]]
    # no static launcher in this torch: compiled ahead, no book
    monkeypatch.setattr(runtime, "static_launcher", lambda: None)
    compiled_ahead.clear()
    assert runtime.prepare_module(_module_namespace(jit), "source", str(tmp_path)) is None
    assert compiled_ahead == [[("spec",)]]


def test_the_generated_module_names_its_device_and_its_specs() -> None:
    """Generated for fake CUDA tensors (nothing runs): the launch device and the
    precompile specs as module-level values for load_module, and a Launcher per
    launch, with static=False where Options.kernel_images is off."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        inputs = [torch.empty(64, 32, device="cuda"), torch.empty(32, device="cuda")]
    gm = make_fx(lambda x, w: ((x * w).softmax(-1), x.sum()), tracing_mode="fake")(*inputs)

    def source(**kw: Any) -> str:
        out = coil.default_pipeline().run(gm, inputs, until="kernel_gen",
                                          options=coil.Options(target="triton", graph_cache=False, **kw))
        return out.source

    on, off = source(), source(kernel_images=False)
    assert "LAUNCH_DEVICE = 'cuda:0'" in on and "PRECOMPILE = [" in on
    assert "precompile(" not in on
    launchers = [ln for ln in on.splitlines() if " = Launcher(" in ln]
    assert launchers and not any("static=False" in ln for ln in launchers)
    assert all(ln.endswith(", static=False)") for ln in off.splitlines() if " = Launcher(" in ln)


def test_a_compiled_function_saves_its_book_after_its_first_call_only() -> None:
    class Book:
        saved = 0

        def save(self) -> None:
            self.saved += 1

    calls: list[Any] = []
    fn = SimpleNamespace(_call=lambda args: calls.append(args) or ("out",))
    book = Book()
    base_runtime.CompiledFn.save_after_first_call(fn, book)  # type: ignore[arg-type]
    assert fn._call([1]) == ("out",) and book.saved == 1
    assert fn._call([2]) == ("out",) and book.saved == 1
    assert calls == [[1], [2]]


# ---- on CUDA -------------------------------------------------------------------------------------

CASES: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]]]] = {
    "softmax and a split sum": (lambda a: (a.softmax(-1), a.sum()),
                                lambda: [torch.randn(512, 700, device="cuda")]),
    "a transpose (tiled)": (lambda c: (c + c.t()) * 2, lambda: [torch.randn(96, 96, device="cuda")]),
    "one row (a size of 1)": (lambda a: (a.exp().sum(-1, keepdim=True), a.amax()),
                              lambda: [torch.randn(1, 4096, device="cuda")]),
    "cross entropy (an index checked)": (lambda a, t: F.cross_entropy(a, t),
                                         lambda: [torch.randn(64, 300, device="cuda"),
                                                  torch.randint(0, 300, (64,), device="cuda")]),
    "layer norm in bfloat16": (lambda a, w: F.layer_norm(a, (a.shape[-1],), w),
                               lambda: [torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16),
                                        torch.randn(1024, device="cuda", dtype=torch.bfloat16)]),
    "three pointwise ops (a combo)": (lambda a, b, c: (a.sin(), b.cos(), c * 3),
                                      lambda: [torch.randn(1000, device="cuda") for _ in range(3)]),
}


def _compile(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], **options: Any) -> Any:
    gm = make_fx(fn)(*inputs)
    return coil.compile_graph(gm, list(inputs), coil.Options(target="triton", **options))


def _launchers(compiled: Any) -> list[Any]:
    return [v for v in compiled.namespace.values() if isinstance(v, runtime.Launcher)]


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", sorted(CASES))
def test_static_launches_match_eager_call_after_call(case: str) -> None:
    fn, make = CASES[case]
    inputs = make()
    compiled = _compile(fn, inputs, graph_cache=False)
    launchers = _launchers(compiled)
    assert launchers, compiled.source
    for _ in range(3):
        for got, want in zip(compiled(*inputs), _flat(fn(*inputs))):
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    bound = [lau for lau in launchers if lau.bind]
    assert bound and all(lau.mode == runtime.Launcher.STATIC for lau in bound), [lau.rule for lau in bound]
    off = _compile(fn, inputs, graph_cache=False, kernel_images=False)
    for _ in range(2):
        for got, want in zip(off(*inputs), _flat(fn(*inputs))):
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    assert not any(lau.mode == runtime.Launcher.STATIC for lau in _launchers(off))



@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_a_module_loaded_again_launches_from_its_images_without_triton(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first load compiles ahead and writes the book after its first call; the
    same graph loaded again (coil's graph cache) loads every bound launch's cubin,
    compiles nothing ahead, and its calls never reach Triton's JITFunction."""
    fn = lambda a, w: ((a * w).softmax(-1), a.sum(), (a + 1).t().contiguous())  # noqa: E731
    inputs = [torch.randn(512, 700, device="cuda"), torch.randn(700, device="cuda")]
    cache = str(tmp_path)
    first = _compile(fn, inputs, cache_dir=cache)
    first(*inputs)
    books = [f for f in os.listdir(os.path.join(cache, "kernels")) if f.endswith(".json")]
    assert len(books) == 1

    compiled_ahead: list[Any] = []
    monkeypatch.setattr(runtime, "precompile", lambda specs: compiled_ahead.append(specs))
    again = _compile(fn, inputs, cache_dir=cache)
    assert again.namespace is not first.namespace
    bound = [lau for lau in _launchers(again) if lau.bind]
    assert bound and all("coil's cache" in lau.rule for lau in bound), [lau.rule for lau in bound]
    assert compiled_ahead == []
    for _ in range(2):
        for got, want in zip(again(*inputs), fn(*inputs)):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
    kernels = {id(lau.kernel): lau.kernel for lau in bound}
    assert all(sum(len(c[0]) for c in k.device_caches.values()) == 0 for k in kernels.values())
