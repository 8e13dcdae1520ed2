"""Compile a C++ translation unit once, cache the shared object on disk, load it
with ctypes.

The cache key hashes the source, the prelude header it includes
(include/coil_prelude.h), the compiler flags, the compiler's version and what
-march=native means on this CPU (cpu_isa), so a new header, compiler, flag or CPU
never reuses an old binary.  The folder, `<cache dir>/cpp`, is created with mode
0700 and refused when another user owns it or may write it (a planted .so with a
matching sidecar would run as you).  Next to each `<key>.so`
lie `<key>.cpp` (the source a compile error points at) and `<key>.json`, a
sidecar with the key and the SHA-256 of the .so: an entry whose sidecar is
missing or disagrees (a crashed writer, a corrupted file) is rebuilt, never
loaded.  The .so is compiled to a temporary name and renamed into place, so a
reader never sees half a file.

The header is compiled once per (header, compiler, flags, CPU) into a precompiled
header, `<cache dir>/cpp/pch/<key>/coil_prelude.h.gch`, beside a copy of the
header; a translation unit that includes it compiles with -I of that folder, where
GCC takes the .gch instead of parsing the text (and falls back to the text when the
.gch does not fit the compile).  It too is written to a temporary name and renamed,
so processes compiling at once (pytest-xdist) never see half of it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import tempfile
from typing import Any

import attrs

from coil.backends.cpp import prelude
from coil.backends.runtime import secure_dir, write_atomic
from coil.errors import CoilError
from coil.ir.expr import CHECK_ERROR_CODES, check_error

# No -ffast-math: NaN and Inf must behave as in eager.  -fno-math-errno and
# -fno-trapping-math only drop errno writes and FP-exception ordering (results are
# unchanged) so sqrt and selects vectorize; -ffp-contract=off keeps a*b+c two
# roundings, as eager computes it.  -fno-tree-pre: coil's kernels come with their
# common subexpressions shared already, and GCC's partial redundancy elimination
# carries a stencil's loads (max_pool2d's window) from one iteration of an outer
# loop to the next, which stops the inner loop from vectorizing: ResNet's
# max_pool2d at the CPU models size, one thread, 131 -> 22 us; over 200 translation
# units of the C++ tests, 236 -> 238 loops vectorized, none fewer
BASE_FLAGS = (
    "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
    "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fno-tree-pre",
)


def compiler() -> str:
    return os.environ.get("CXX", "g++")


@functools.cache
def compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CoilError(f"the cpp target needs a C++ compiler; running {cxx!r} failed: {e}", stage="kernel_gen") from e
    return out.splitlines()[0] if out else cxx


@functools.cache
def has_libmvec() -> bool:
    """glibc >= 2.35 on x86-64 ships vector exp/log/erf/tanh/... in libmvec."""
    if platform.machine() != "x86_64":
        return False
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return False
    parts = version.split()[-1].split(".") if version.startswith("glibc") else []
    if len(parts) < 2 or (int(parts[0]), int(parts[1])) < (2, 35):
        return False
    return ctypes.util.find_library("mvec") is not None


def compile_flags() -> tuple[str, ...]:
    width = os.environ.get("COIL_CPP_VECTOR_WIDTH") or ("512" if wide_vectors(compiler()) else "")
    wide = (f"-mprefer-vector-width={width}",) if width else ()
    return BASE_FLAGS + wide + (("-DCOIL_LIBMVEC",) if has_libmvec() else ())


def wide_vectors(cxx: str) -> bool:
    """Whether -march=native enables AVX-512 here: GCC then still vectorises for
    256-bit registers unless asked, and coil asks for 512 (Inductor's C++ kernels
    use them too).  A compute-bound kernel runs faster so: Llama's cross-entropy
    forward at the CPU models size (128 rows of 8000: max, then the sum of exp),
    one thread, 757 -> 532 us a call; libmvec has 16-lane variants of its functions.
    COIL_CPP_VECTOR_WIDTH (128, 256 or 512) overrides the choice: a CPU that clocks
    down under 512-bit work may run faster at 256."""
    return re.search(r"-mavx512f\s+\[enabled\]", cpu_isa(cxx)) is not None


def link_flags() -> tuple[str, ...]:
    return ("-lmvec",) if has_libmvec() else ()


@attrs.frozen
class CacheEntry:
    key: str
    directory: str

    def path(self, ext: str) -> str:
        return os.path.join(self.directory, f"{self.key}.{ext}")

    @property
    def so(self) -> str:
        return self.path("so")

    @property
    def cpp(self) -> str:
        return self.path("cpp")

    @property
    def sidecar(self) -> str:
        return self.path("json")


@functools.cache
def cpu_isa(cxx: str) -> str:
    """What -march=native stands for on this machine: the compiler's resolved target
    options (`-march=native -Q --help=target`), else the CPU's model name and flags
    from /proc/cpuinfo.  A .so built for one CPU may use instructions another lacks
    (a cache dir on a shared home, a container moved between hosts)."""
    try:
        out = subprocess.run([cxx, "-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    if out.strip():
        return out
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    picked = [next((ln for ln in lines if ln.startswith(k)), "") for k in ("model name", "flags", "Features")]
    return "\n".join([platform.machine(), platform.processor(), *picked])


def header_hash() -> str:
    """The SHA-256 of the prelude header a translation unit includes."""
    return hashlib.sha256(prelude.header_text()).hexdigest()


def cache_entry(source: str, cache_dir: str | None = None, sub: str = "cpp") -> CacheEntry:
    from coil.backends.runtime import cache_dir as checked_cache_dir

    cxx = compiler()
    material = "\0".join([source, header_hash(), cxx, " ".join(compile_flags() + link_flags()),
                          compiler_version(cxx), cpu_isa(cxx)])
    key = "k" + hashlib.sha256(material.encode()).hexdigest()[:40]
    return CacheEntry(key, checked_cache_dir(cache_dir, sub))


def _sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def is_valid(entry: CacheEntry) -> bool:
    """The .so exists and its sidecar vouches for exactly these bytes."""
    try:
        with open(entry.sidecar, "rb") as f:
            meta = json.loads(f.read())
        return bool(isinstance(meta, dict) and meta.get("key") == entry.key
                    and meta.get("so_sha256") == _sha256_file(entry.so))
    except (OSError, ValueError):
        return False


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def compile_entry(source: str, entry: CacheEntry) -> None:
    """Compile `source` into entry.so (via a temporary file), then write the sidecar.
    A failed compile raises CoilError with the compiler's message and the source
    path; a cache dir that cannot be written (read-only, full), CacheUnwritable."""
    from coil.backends.runtime import FIX_HINT, CacheUnwritable

    try:
        _compile_entry(source, entry)
    except OSError as e:
        raise CacheUnwritable(
            f"cannot write the C++ kernels' shared object into the cache dir {entry.directory} "
            f"({e.strerror or e}); the cpp target needs it on disk: {FIX_HINT}", stage="kernel_gen") from e


def includes_prelude(source: str) -> bool:
    return f'#include "{prelude.HEADER}"' in source


def precompiled_prelude(directory: str) -> str:
    """The folder that holds a copy of the prelude header and its precompiled form
    (`coil_prelude.h.gch`) for this compiler, these flags and this CPU, under the
    cpp cache folder `directory`; the .gch is built the first time, compiled with
    exactly the flags of a translation unit (GCC refuses a .gch made with others).
    A copy that differs from the installed header (the folder's name hashes it) is
    rewritten and its .gch rebuilt."""
    header = prelude.header_text()
    cxx = compiler()
    material = "\0".join([hashlib.sha256(header).hexdigest(), cxx, " ".join(compile_flags()),
                          compiler_version(cxx), cpu_isa(cxx)])
    folder = secure_dir(os.path.join(secure_dir(os.path.join(directory, "pch")),
                                     "h" + hashlib.sha256(material.encode()).hexdigest()[:40]))
    copy = os.path.join(folder, prelude.HEADER)
    gch = copy + ".gch"
    try:
        with open(copy, "rb") as f:
            fresh = f.read() == header
    except FileNotFoundError:
        fresh = False
    if fresh and os.path.exists(gch):
        return folder
    if not fresh:
        write_atomic(copy, header)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prelude.HEADER + ".", suffix=".gch.tmp")
    os.close(fd)
    cmd = [cxx, *compile_flags(), "-x", "c++-header", copy, "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CoilError(f"C++ compile failed for the prelude header {copy} (exit {proc.returncode}): "
                            f"{' '.join(cmd)}\n{proc.stderr.strip()}", stage="kernel_gen")
        os.replace(tmp, gch)
    finally:
        _remove(tmp)
    return folder


def include_dir(source: str, entry: CacheEntry) -> str:
    """The folder a compile of `source` takes the prelude header from: the
    precompiled one's (built first if need be) when the source includes it."""
    return precompiled_prelude(entry.directory) if includes_prelude(source) else prelude.header_dir()


def compile_command(entry: CacheEntry, include: str, output: str, extra: tuple[str, ...] = ()) -> list[str]:
    more = [a for d in extra for a in ("-I", d)]
    return [compiler(), *compile_flags(), "-I", include, *more, entry.cpp, "-o", output, *link_flags()]


def build_with_includes(source: str, includes: tuple[str, ...], cache_dir: str | None = None) -> str:
    """build() for a source that also needs these include folders (the C++
    launcher's Python.h: backends/cpp/fastcall.py), kept in `<cache dir>/cpp-launcher`;
    the folders are part of the key, so another Python's headers never reuse
    this binary."""
    keyed = "".join(f"// include {d}\n" for d in includes) + source
    entry = cache_entry(keyed, cache_dir, "cpp-launcher")
    if not is_valid(entry):
        try:
            _compile_entry(keyed, entry, includes)
        except OSError as e:
            raise CoilError(f"cannot write {entry.so}: {e}", stage="kernel_gen") from e
    return entry.so


def _compile_entry(source: str, entry: CacheEntry, extra: tuple[str, ...] = ()) -> None:
    write_atomic(entry.cpp, source.encode())
    include = include_dir(source, entry)
    fd, tmp = tempfile.mkstemp(dir=entry.directory, prefix=entry.key + ".", suffix=".so.tmp")
    os.close(fd)
    cmd = compile_command(entry, include, tmp, extra)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 and include != prelude.header_dir():
            # GCC ignores a .gch made for other flags, but fails on a damaged one (cut
            # short by a crash): when the header's own text compiles, the .gch goes
            # (the next compile builds it again)
            plain = subprocess.run(compile_command(entry, prelude.header_dir(), tmp, extra), capture_output=True,
                                   text=True, check=False)
            if plain.returncode == 0:
                _remove(os.path.join(include, prelude.HEADER + ".gch"))
                proc = plain
        if proc.returncode != 0:
            raise CoilError(
                f"C++ compile failed for {entry.cpp} (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}",
                stage="kernel_gen",
            )
        os.replace(tmp, entry.so)
    finally:
        _remove(tmp)
    meta = {"key": entry.key, "so_sha256": _sha256_file(entry.so), "compiler": compiler_version(compiler())}
    write_atomic(entry.sidecar, json.dumps(meta).encode())


def build(source: str, cache_dir: str | None = None) -> str:
    """The path of an up-to-date shared object for `source`, compiling if needed."""
    entry = cache_entry(source, cache_dir)
    if not is_valid(entry):
        compile_entry(source, entry)
    return entry.so


def load_library(source: str, cache_dir: str | None = None) -> ctypes.CDLL:
    """Build (or reuse) and dlopen; an entry the loader rejects is rebuilt once."""
    path = build(source, cache_dir)
    try:
        return ctypes.CDLL(path)
    except OSError:
        entry = cache_entry(source, cache_dir)
        _remove(entry.sidecar)
        compile_entry(source, entry)
        try:
            return ctypes.CDLL(entry.so)
        except OSError as e:
            raise CoilError(f"cannot load {entry.so} (built from {entry.cpp}): {e}", stage="kernel_gen") from e


def error_word(lib: ctypes.CDLL) -> Any:
    """The translation unit's error channel (prelude's coil_error): four int64,
    {error code, value, size, dim}; a code of 0 means no check failed."""
    fn = lib.coil_errors
    fn.argtypes = []
    fn.restype = ctypes.c_void_p
    return (ctypes.c_int64 * 4).from_address(fn())


def raise_check(word: Any) -> None:
    """Raise the error a kernel recorded in its error channel (`error_word`),
    clearing it first so the next call starts clean."""
    code, value, size, dim = word[0], word[1], word[2], word[3]
    word[0] = word[1] = word[2] = word[3] = 0
    error = list(CHECK_ERROR_CODES)[code - 1]
    raise check_error(error, value, size, dim)


def launcher(lib: ctypes.CDLL, name: str, pointers: int, sizes: int = 2, cache_dir: str | None = None) -> Any:
    """The kernel `name` as output_code.py calls it: its tensors themselves, then
    xnumel, rnumel and any size symbols (backends/cpp/fastcall.py)."""
    from coil.backends.cpp import fastcall

    return fastcall.launcher(bind(lib, name, pointers, sizes), pointers, sizes, cache_dir)


def bind(lib: ctypes.CDLL, name: str, pointers: int, sizes: int = 2) -> Any:
    """The kernel `name`: `pointers` data pointers, then xnumel and rnumel (and the
    size symbols of a kernel of symbolic sizes: `sizes` int64 in all)."""
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int64] * sizes
    fn.restype = None
    return fn
