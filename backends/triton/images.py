"""Kernel images: a compiled Triton kernel as the CUDA driver loads it, kept in
coil's cache so that a warm start launches it without Triton.

A Triton kernel's first launch goes through Triton's JITFunction, which compiles
it or finds it in Triton's cache: on a warm start that lookup still hashes the
kernel's source and Triton's compiler for every kernel (about 15 ms a kernel on
the H100, 0.43 s for a Llama training step's 28).  Inductor skips it by loading
its cubins itself and launching them through torch's static CUDA launcher
(`torch._C._StaticCudaLauncher`, in every CUDA build of torch since 2.7).

coil does the same for the launches it binds (runtime.Launcher, static sizes):
- when a Launcher first launches through Triton, `kernel_image` reads what the
  driver needs off Triton's CompiledKernel (the cubin, its entry's name, shared
  memory, warps, and the parameters the entry takes), and the Launcher launches
  through the static launcher from then on;
- `ImageBook` writes those images into cache_dir after the module's first call,
  keyed by the module's source, the GPU's architecture, and the versions of
  Triton, torch and CUDA that built them;
- load_module finds the book of a module it loads again and hands each Launcher
  its image before the first call: the kernels load with one driver call each,
  and output_code.py's precompile step is skipped when every bound launch has one.

A kernel whose entry takes something the static launcher cannot pass (a float16
scalar, a tensor descriptor), needs scratch memory, several CTAs or a launch
attribute stays on Triton's launcher, and says why (`kernel_image`'s reason).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Mapping, Sequence

import attrs

log = logging.getLogger("coil")

# Triton's scalar types as the static launcher's one-letter codes (the widths the
# kernel's entry takes them at); a pointer is "O"
SCALAR_CODES: Mapping[str, str] = {
    "i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "l",
    "u1": "B", "u8": "B", "u16": "H", "u32": "I", "u64": "K",
    "fp32": "f", "f32": "f", "fp64": "d",
}
BOOK_VERSION = 1


@attrs.frozen
class KernelImage:
    """One launch's compiled kernel as the driver loads and launches it.

    `function`: the entry's name in the cubin; `shared`: its dynamic shared memory
    in bytes; `params`: one code per parameter of the entry (SCALAR_CODES, "O" a
    pointer), the trailing scratch pointers included (passed as null); `kept`: for
    each argument the launch passes (tensors, then sizes), whether the entry takes
    it (a size equal to 1 is a constant of the kernel, not a parameter)."""

    function: str
    cubin: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    shared: int
    num_warps: int
    params: str
    kept: tuple[bool, ...]
    scratch: int
    # the cubin's hash, which names its file in the book's folder (computed once)
    digest: str = attrs.field(init=False, repr=False, eq=False, default=attrs.Factory(
        lambda self: hashlib.sha256(self.cubin).hexdigest()[:32], takes_self=True))

    def cubin_file(self, folder: str) -> str:
        return os.path.join(folder, f"{self.digest}.cubin")

    def tail(self, sizes: Sequence[int], tensors: int) -> tuple[Any, ...]:
        """What follows the tensors in the static launcher's argument tuple: the sizes
        the entry takes, then a null per scratch pointer."""
        taken = tuple(s for s, keep in zip(sizes, self.kept[tensors:]) if keep)
        return (*taken, *([None] * self.scratch))

    def describe(self) -> dict[str, Any]:
        return {"function": self.function, "shared": self.shared, "num_warps": self.num_warps,
                "params": self.params, "kept": "".join("1" if k else "0" for k in self.kept),
                "scratch": self.scratch, "cubin": self.digest}


def static_launcher() -> Any:
    """torch's static CUDA launcher (`_load_kernel`, `_launch_kernel`), or None where
    this torch has none (a CPU build)."""
    import torch

    return getattr(torch._C, "_StaticCudaLauncher", None)


def kernel_image(ck: Any, names: Sequence[str], given: int, tensors: int) -> tuple[KernelImage | None, str]:
    """The image of Triton's CompiledKernel `ck`, launched with `given` arguments
    (`tensors` tensors, then sizes) of the kernel whose parameters are `names` (the
    rest constexprs); else None and why it stays on Triton's launcher."""
    md = getattr(ck, "metadata", None)
    src = getattr(ck, "src", None)
    cubin = getattr(ck, "asm", {}).get("cubin") if hasattr(ck, "asm") else None
    if md is None or src is None or not isinstance(cubin, (bytes, bytearray)):
        return None, "no cubin: this Triton's CompiledKernel is not one coil reads"
    if getattr(md, "num_ctas", 1) != 1 or tuple(getattr(md, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in (
            (1, 1, 1), (1, 1), (1,)):
        return None, "several CTAs per program"
    if getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
        return None, "a launch attribute (cooperative grid or programmatic dependent launch)"
    if getattr(md, "tensordesc_meta", None):
        return None, "a tensor descriptor argument"
    scratch = 0
    for attr in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(md, attr):
            if getattr(md, attr):
                return None, "scratch memory allocated per launch"
            scratch += 1  # the entry takes the pointer all the same: passed as null
    signature = dict(getattr(src, "signature", {}))
    if len(names) < given:
        return None, "more arguments than the kernel has parameters"
    params, kept = [], []
    for i, name in enumerate(names):
        ty = signature.get(name)
        if ty is None:
            return None, f"parameter {name} is not in the kernel's signature"
        if i >= given:  # launch options and constexprs: never parameters of the entry
            if ty != "constexpr":
                return None, f"parameter {name} is passed by keyword but is not a constexpr"
            continue
        if not isinstance(ty, str):
            return None, f"parameter {name} has a tuple type"
        if ty == "constexpr":
            if i < tensors:
                return None, f"tensor {name} is a constant of the kernel"
            kept.append(False)
            continue
        if i < tensors:
            if not ty.startswith("*"):
                return None, f"tensor {name} has type {ty}"
            code = "O"
        else:
            code = SCALAR_CODES.get(ty, "")
            if not code:
                return None, f"size {name} has type {ty}, which the static launcher does not pass"
        params.append(code)
        kept.append(True)
    shared = int(getattr(md, "shared", 0))
    image = KernelImage(function=str(md.name), cubin=bytes(cubin), shared=shared, num_warps=int(md.num_warps),
                        params="".join(params) + "O" * scratch, kept=tuple(kept), scratch=scratch)
    return image, "static: torch's static CUDA launcher, on the cubin Triton compiled"


def book_key(source: str, device: str) -> str | None:
    """The key of a module's images: its source, the GPU's architecture, and the
    versions of Triton, torch and CUDA (what the cubins depend on besides the
    source); None where CUDA or Triton is missing."""
    try:
        import torch
        import triton

        major, minor = torch.cuda.get_device_capability(device)
    except Exception:  # noqa: BLE001 - no CUDA, no Triton: no images
        return None
    text = "\0".join((source, f"sm_{major}{minor}", triton.__version__, torch.__version__,
                      str(torch.version.cuda), str(BOOK_VERSION)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@attrs.define
class ImageBook:
    """The images of one module's launches, by Launcher name: read from cache_dir
    when the module loads, added to as launches bind, written after the first
    call.  `folder` None: nothing is written (no cache dir)."""

    key: str
    folder: str | None
    images: dict[str, KernelImage] = attrs.field(factory=dict)
    loaded: bool = False  # read from the cache: nothing new to write
    written: bool = False

    def path(self) -> str | None:
        return None if self.folder is None else os.path.join(self.folder, f"{self.key}.json")

    def add(self, name: str, image: KernelImage) -> None:
        self.images[name] = image

    def save(self) -> None:
        """Write the book (a JSON index and one file per cubin, by its hash) unless
        it was read from the cache or holds nothing; a failure to write is logged
        and ignored (the next start compiles through Triton again)."""
        from coil.backends.runtime import read_bytes, write_atomic

        path = self.path()
        if path is None or self.loaded or self.written or not self.images:
            return
        self.written = True
        try:
            index = {}
            for name, img in sorted(self.images.items()):
                cubin = img.cubin_file(self.folder or "")
                if read_bytes(cubin) != img.cubin:
                    write_atomic(cubin, img.cubin)
                index[name] = img.describe()
            write_atomic(path, json.dumps({"version": BOOK_VERSION, "images": index}, sort_keys=True).encode())
        except OSError as e:
            log.debug("coil: kernel images not written to %s: %s", self.folder, e)

    @classmethod
    def load(cls, key: str, folder: str | None) -> "ImageBook":
        """The book under `key` in `folder`, or an empty one: a missing, damaged or
        foreign file (another version; a cubin whose hash differs) is a miss."""
        from coil.backends.runtime import read_bytes

        book = cls(key=key, folder=folder)
        path = book.path()
        raw = read_bytes(path) if path is not None else None
        if raw is None:
            return book
        try:
            data = json.loads(raw)
            if data.get("version") != BOOK_VERSION:
                return book
            images = {}
            for name, e in data["images"].items():
                cubin = read_bytes(os.path.join(folder or "", f"{e['cubin']}.cubin"))
                if cubin is None:
                    return book
                image = KernelImage(function=str(e["function"]), cubin=cubin, shared=int(e["shared"]),
                                    num_warps=int(e["num_warps"]), params=str(e["params"]),
                                    kept=tuple(c == "1" for c in e["kept"]), scratch=int(e["scratch"]))
                if image.digest != e["cubin"]:  # damaged, or another file under its name
                    return book
                images[name] = image
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.debug("coil: kernel images at %s not read: %s", path, e)
            return book
        book.images = images
        book.loaded = True
        return book


def load_image(image: KernelImage, folder: str, device_index: int) -> int:
    """Load the image's cubin on the device (through its file in `folder`, as the
    static launcher reads it) and return its function's handle."""
    launcher = static_launcher()
    got = launcher._load_kernel(image.cubin_file(folder), image.function, image.shared, device_index)
    # (function, registers, spills); newer torch: (module, function, registers, spills)
    return int(got[-3])
