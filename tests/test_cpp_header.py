"""The cpp target's prelude header (backends/cpp/include/coil_prelude.h): every
translation unit #includes it instead of carrying its text, the build cache keys
each library on its hash, and it is precompiled once per cache folder (a .gch that
GCC really takes) and reused by every later compile."""

from __future__ import annotations

import fnmatch
import glob
import os
import subprocess
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil.backends.cpp import build, prelude

REPO = Path(__file__).resolve().parent.parent


def compile_cpp(fn: Callable[..., Any], inputs: list[torch.Tensor], cache: Path) -> Any:
    compiled = coil.compile_graph(make_fx(fn)(*inputs), inputs,
                                  coil.Options(target="cpp", graph_cache=False, cache_dir=str(cache)))
    torch.testing.assert_close(compiled(*inputs)[0], fn(*inputs), equal_nan=True)
    return compiled


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def gelu_bf16(x: torch.Tensor) -> torch.Tensor:
    """Calls the header's erf, bf16 rounding and NaN-propagating max."""
    return torch.nn.functional.gelu(x).to(torch.bfloat16).float().amax(-1) + torch.maximum(x, x.flip(-1)).sum(-1)


def pch_files(cache: Path) -> list[str]:
    return glob.glob(str(cache / "cpp" / "pch" / "*" / f"{prelude.HEADER}.gch"))


def cpp_dir(cache: Path) -> str:
    """The cpp folder of the build cache in `cache` (created and checked)."""
    return build.cache_entry("", str(cache)).directory


def needs_gcc() -> None:
    if "g++" not in build.compiler_version(build.compiler()) and "GCC" not in build.compiler_version(build.compiler()):
        pytest.skip("precompiled headers as GCC finds them (-H marks a used .gch with '!')")


def gch_used(source: str, cache: Path) -> str:
    """The compiler's -H trace of the first #include when compiling `source`'s
    library the way build.py does (GCC marks a precompiled header it takes with
    '!', one it rejects with 'x')."""
    entry = build.cache_entry(source, str(cache))
    if not os.path.exists(entry.cpp):
        Path(entry.cpp).write_text(source)
    cmd = build.compile_command(entry, build.include_dir(source, entry), os.devnull) + ["-H", "-Winvalid-pch"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return proc.stderr.splitlines()[0]


def test_translation_unit_includes_the_header_and_none_of_its_text(tmp_path: Path) -> None:
    """The generated source names the header and carries none of its lines
    (the kernels use the header: NaN-propagating max, bf16 rounding, erf)."""
    compiled = compile_cpp(gelu_bf16, [torch.randn(8, 100)], tmp_path)
    source = compiled.namespace["_cpp_source"]
    assert source.startswith(prelude.INCLUDE)
    assert '#include "coil_prelude.h"' in compiled.source
    assert "coil_max<float>(" in source and "coil_round_bf16(" in source and "coil_erf(" in source
    header_lines = {ln.strip() for ln in prelude.header_text().decode().splitlines() if len(ln.strip()) >= 20}
    assert len(header_lines) > 150
    assert not [ln for ln in compiled.source.splitlines() if ln.strip() in header_lines]
    assert "#pragma omp declare reduction" not in compiled.source and "extern \"C\" {" not in compiled.source


def test_header_is_package_data() -> None:
    """pyproject ships include/*.h with coil.backends.cpp, so a wheel install has the
    header where prelude.header_dir() looks (an editable one reads the source tree)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir = Path(config["package-dir"]["coil.backends.cpp"])
    header = Path(prelude.header_dir(), prelude.HEADER)
    assert header.read_bytes() == (REPO / package_dir / "include" / prelude.HEADER).read_bytes()
    patterns = config["package-data"]["coil.backends.cpp"]
    assert any(fnmatch.fnmatch(f"include/{prelude.HEADER}", p) for p in patterns)


def test_the_precompiled_header_is_built_once_and_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs_gcc()
    header_compiles: list[list[str]] = []
    run = subprocess.run

    def counting_run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(cmd, list) and "c++-header" in cmd:
            header_compiles.append(cmd)
        return run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting_run)
    compile_cpp(softmax, [torch.randn(4, 50)], tmp_path)
    [gch] = pch_files(tmp_path)
    before = os.stat(gch)
    assert len(header_compiles) == 1
    second = compile_cpp(gelu_bf16, [torch.randn(8, 100)], tmp_path)  # another library, same header
    assert len(glob.glob(str(tmp_path / "cpp" / "*.so"))) == 2
    assert len(header_compiles) == 1 and pch_files(tmp_path) == [gch]
    after = os.stat(gch)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    monkeypatch.setattr(subprocess, "run", run)
    trace = gch_used(second.namespace["_cpp_source"], tmp_path)
    assert trace == f"! {gch}", trace
    assert not glob.glob(str(tmp_path / "cpp" / "pch" / "*" / "*.tmp"))


def test_a_changed_header_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit of the header gives every library that includes it a new key, and a
    new precompiled header; going back gives the old key again."""
    source = prelude.INCLUDE + 'extern "C" void twice(float* p) { p[0] = coil_max(p[0], 2 * p[0]); }\n'
    ours = build.cache_entry(source, str(tmp_path)).key
    ours_pch = build.precompiled_prelude(cpp_dir(tmp_path))
    edited = tmp_path / "include"
    edited.mkdir()
    (edited / prelude.HEADER).write_bytes(prelude.header_text() + b"\n// an edit\n")
    monkeypatch.setattr(prelude, "header_dir", lambda: str(edited))
    other = build.cache_entry(source, str(tmp_path)).key
    other_pch = build.precompiled_prelude(cpp_dir(tmp_path))
    assert other != ours and other_pch != ours_pch
    assert Path(other_pch, prelude.HEADER).read_bytes().endswith(b"// an edit\n")
    monkeypatch.undo()
    assert build.cache_entry(source, str(tmp_path)).key == ours
    assert build.precompiled_prelude(cpp_dir(tmp_path)) == ours_pch


def test_an_edited_header_rebuilds_the_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same source against an edited header runs the edited code."""
    source = prelude.INCLUDE + 'extern "C" void fill(float* p) { p[0] = coil_max(1.0f, 2.0f); }\n'
    edited = tmp_path / "include"
    edited.mkdir()
    text = prelude.header_text().replace(b"return (a > b || a != a) ? a : b;", b"return 7;")
    assert text != prelude.header_text()
    (edited / prelude.HEADER).write_bytes(text)
    results = []
    for header_dir in (prelude.header_dir(), str(edited)):
        monkeypatch.setattr(prelude, "header_dir", lambda d=header_dir: d)
        t = torch.zeros(1)
        build.bind(build.load_library(source, str(tmp_path)), "fill", 1)(t.data_ptr(), 0, 0)
        results.append(t.item())
    assert results == [2.0, 7.0]


def test_a_stale_header_copy_is_rewritten(tmp_path: Path) -> None:
    """The precompiled header's folder holds a copy of the header; a copy that is
    not the installed header is replaced and its .gch built again."""
    folder = build.precompiled_prelude(cpp_dir(tmp_path))
    gch = os.path.join(folder, prelude.HEADER + ".gch")
    first = os.stat(gch).st_ino
    Path(folder, prelude.HEADER).write_text("#error planted\n")
    assert build.precompiled_prelude(cpp_dir(tmp_path)) == folder
    assert Path(folder, prelude.HEADER).read_bytes() == prelude.header_text()
    assert os.stat(gch).st_ino != first


def test_a_damaged_precompiled_header_is_dropped(tmp_path: Path) -> None:
    """A .gch cut short (GCC fails on it rather than ignoring it) costs one compile
    from the header's text and is removed; the next compile builds it again."""
    needs_gcc()
    compile_cpp(softmax, [torch.randn(4, 50)], tmp_path)
    [gch] = pch_files(tmp_path)
    with open(gch, "r+b") as f:
        f.truncate(os.path.getsize(gch) // 2)
    compile_cpp(gelu_bf16, [torch.randn(8, 100)], tmp_path)
    assert not os.path.exists(gch)
    third = compile_cpp(lambda x: x.exp() + 1, [torch.randn(30)], tmp_path)
    assert pch_files(tmp_path) == [gch]
    assert gch_used(third.namespace["_cpp_source"], tmp_path) == f"! {gch}"


def test_concurrent_builders_leave_one_whole_precompiled_header(tmp_path: Path) -> None:
    """Builders racing on a fresh cache (pytest-xdist workers, threads) each write a
    temporary file and rename it: every one gets a folder whose .gch GCC takes, and
    no temporary file is left."""
    needs_gcc()
    directory = cpp_dir(tmp_path)
    folders: list[str] = []
    errors: list[BaseException] = []

    def builder() -> None:
        try:
            folders.append(build.precompiled_prelude(directory))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=builder) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(folders)) == 1
    assert sorted(os.listdir(folders[0])) == [prelude.HEADER, prelude.HEADER + ".gch"]
    source = prelude.INCLUDE + 'extern "C" void noop() {}\n'
    assert gch_used(source, tmp_path) == f"! {folders[0]}/{prelude.HEADER}.gch"


def test_a_source_without_the_header_builds_no_precompiled_header(tmp_path: Path) -> None:
    build.build('#include <cstdint>\nextern "C" void noop(int64_t a) {}\n', str(tmp_path))
    assert not pch_files(tmp_path) and not (tmp_path / "cpp" / "pch").exists()


def test_exp_over_its_whole_range_as_eager(tmp_path: Path) -> None:
    """coil_exp over the inputs where glibc's vector expf leaves its fast path (below
    -87.3, which a causal mask's -3.4e38 puts in most vectors of a softmax): the
    values are eager's to two denormal ulps, 0 below -104, and -inf, +inf and NaN
    come out as eager's; a causal softmax's masked probabilities are exact zeros."""
    needs_gcc()
    x = torch.tensor([float("-inf"), -3.4028234663852886e38, -1e4, -120.0, -104.5, -103.9, -100.0, -95.0,
                      -87.5, -87.2, -87.0, -86.9, -50.0, -1e-3, 0.0, 1.0, 50.0, 88.0, 89.0, float("inf"),
                      float("nan")] * 4)
    fn = lambda a: (torch.exp(a),)  # noqa: E731
    c = coil.compile_graph(make_fx(fn)(x), [x], coil.Options(target="cpp", graph_cache=False, cache_dir=str(tmp_path)))
    got, want = c(x)[0], torch.exp(x)
    torch.testing.assert_close(got, want, rtol=1.3e-6, atol=3e-45, equal_nan=True)
    assert torch.equal(got[x < -104], torch.zeros_like(got[x < -104]))
    # a softmax over a causal mask: the masked probabilities are exactly 0, as eager's
    s = torch.randn(4, 64, 64)
    mask = torch.full((64, 64), torch.finfo(torch.float32).min).triu(1)
    soft = lambda a, m: (torch.softmax(a + m, -1),)  # noqa: E731
    c = coil.compile_graph(make_fx(soft)(s, mask), [s, mask],
                           coil.Options(target="cpp", graph_cache=False, cache_dir=str(tmp_path)))
    got, want = c(s, mask)[0], soft(s, mask)[0]
    torch.testing.assert_close(got, want)
    assert torch.equal(got[:, mask < 0], torch.zeros_like(got[:, mask < 0]))


def test_kernels_use_512_bit_vectors_where_the_cpu_has_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """GCC vectorises for 256-bit registers on an AVX-512 CPU unless asked; coil
    asks where -march=native enables AVX-512 (the flags key every cached build), and
    COIL_CPP_VECTOR_WIDTH overrides the choice."""
    from coil.backends.cpp import build

    monkeypatch.delenv("COIL_CPP_VECTOR_WIDTH", raising=False)
    for isa, wide in (("  -mavx512f                   \t\t[enabled]\n", True),
                      ("  -mavx512f                   \t\t[disabled]\n", False)):
        monkeypatch.setattr(build, "cpu_isa", lambda cxx, isa=isa: isa)
        assert ("-mprefer-vector-width=512" in build.compile_flags()) == wide
    monkeypatch.setenv("COIL_CPP_VECTOR_WIDTH", "256")
    assert "-mprefer-vector-width=256" in build.compile_flags()
    assert "-mprefer-vector-width=512" not in build.compile_flags()
