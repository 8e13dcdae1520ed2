"""The cache dir holds code coil runs (pickles, shared objects, output_code.py), so
nobody else may write there: coil creates its folders with mode 0700 and refuses
one that another user owns or that group or others may write; output_code.py runs
from the text coil generated, never from a file or a .pyc found beside it; every
artifact goes under the configured cache dir; a read-only or full disk gives a
CoilError or an uncached compile; a damaged entry is rebuilt."""

from __future__ import annotations

import errno
import glob
import hashlib
import importlib._bootstrap_external as bootstrap
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil
from coil import graph_cache
from coil.backends import runtime
from coil.backends.cpp import build


def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * 2 + b).relu().sum(-1)


def _inputs() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(8, 16), torch.randn(8, 16)]


def _options(cache: Path, target: str = "cpp", **kw: Any) -> coil.Options:
    return coil.Options(target=target, cache_dir=str(cache), **kw)


def _compile(cache: Path, target: str = "cpp", **kw: Any) -> Any:
    inputs = _inputs()
    compiled = coil.compile_graph(make_fx(fn)(*inputs), inputs, _options(cache, target, **kw))
    torch.testing.assert_close(compiled(*inputs)[0], fn(*inputs))
    return compiled


def _cache(tmp_path: Path, mode: int = 0o700) -> Path:
    d = tmp_path / "cache"
    d.mkdir()
    d.chmod(mode)
    return d


class _Mkdir:
    """Unpickles by creating a folder: proof that a planted pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.mkdir, (str(self.marker),))


# ---- who may own and write the cache dir ---------------------------------------------------


def test_new_cache_folders_are_private(tmp_path: Path) -> None:
    cache = tmp_path / "new" / "cache"
    _compile(cache)
    for d in (cache, cache / "cpp", cache / "graphs"):
        assert d.stat().st_mode & 0o777 == 0o700, d


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_dir_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    cache = _cache(tmp_path, mode)
    with pytest.raises(coil.CoilError) as info:
        _compile(cache)
    message = str(info.value)
    assert f"refusing the cache dir {cache}" in message
    assert "writable by" in message and f"{mode:04o}" in message
    assert "chmod 700" in message and "COIL_CACHE_DIR" in message and "cache_dir" in message
    assert list(cache.iterdir()) == []  # nothing written, nothing read


def test_a_dir_of_another_owner_is_refused(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    try:
        os.chown(cache, 12345, -1)
    except PermissionError:
        pytest.skip("chown is not permitted here")
    with pytest.raises(coil.CoilError, match=f"{cache}: it is owned by uid 12345, not by you.*COIL_CACHE_DIR"):
        _compile(cache)


def test_a_subfolder_others_may_write_is_refused(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    (cache / "graphs").mkdir(mode=0o700)
    (cache / "graphs").chmod(0o777)
    with pytest.raises(coil.CoilError, match=f"refusing the cache dir {cache / 'graphs'}: it is writable"):
        _compile(cache)


def test_a_folder_replaced_after_its_check_is_checked_again(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    assert runtime.cache_dir(str(cache)) == str(cache)
    cache.rmdir()
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(coil.CoilError, match="writable by group and others"):
        runtime.cache_dir(str(cache))


def test_a_parent_others_may_swap_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)  # no sticky bit: anyone may rename the cache dir away
    with pytest.raises(coil.CoilError, match="writable by others without the sticky bit"):
        runtime.cache_dir(str(parent / "cache"))
    parent.chmod(0o1777)  # as /tmp: only the owner may rename what is in it
    assert runtime.cache_dir(str(parent / "cache")) == str(parent / "cache")


# ---- planted code never runs ----------------------------------------------------------------


def test_a_planted_pickle_in_an_open_dir_never_loads(tmp_path: Path) -> None:
    cache, marker = _cache(tmp_path), tmp_path / "pwned"
    inputs = _inputs()
    key = graph_cache.graph_key(make_fx(fn)(*inputs), inputs, _options(cache))
    (cache / "graphs").mkdir(mode=0o700)
    (cache / "graphs" / f"{key}.pkl").write_bytes(pickle.dumps(_Mkdir(marker)))
    (cache / "graphs").chmod(0o777)
    with pytest.raises(coil.CoilError, match="refusing the cache dir"):
        _compile(cache)
    assert not marker.exists()
    # the plant was a real threat: in a folder coil accepts, the entry is loaded
    (cache / "graphs").chmod(0o700)
    _compile(cache)
    assert marker.exists()


def _plant_so(entry: build.CacheEntry, marker: Path, tmp_path: Path) -> None:
    """A shared object whose constructor creates `marker`, with a sidecar that vouches for it."""
    src = tmp_path / "planted.cpp"
    src.write_text('#include <sys/stat.h>\n__attribute__((constructor)) static void planted() '
                   f'{{ mkdir("{marker}", 0700); }}\n')
    subprocess.run([build.compiler(), "-shared", "-fPIC", str(src), "-o", entry.so], check=True)
    with open(entry.sidecar, "w") as f:
        json.dump({"key": entry.key, "so_sha256": build._sha256_file(entry.so)}, f)


def test_a_planted_shared_object_in_an_open_dir_never_loads(tmp_path: Path) -> None:
    cache, marker = _cache(tmp_path), tmp_path / "pwned"
    source = '#include <cstdint>\nextern "C" void noop(int64_t a, int64_t b) {}\n'
    entry = build.cache_entry(source, str(cache))
    _plant_so(entry, marker, tmp_path)
    Path(entry.directory).chmod(0o777)
    with pytest.raises(coil.CoilError, match=f"refusing the cache dir {entry.directory}"):
        build.load_library(source, str(cache))
    assert not marker.exists()
    Path(entry.directory).chmod(0o700)  # the control: a trusted folder's entry is used
    build.load_library(source, str(cache))
    assert marker.exists()


def _plant_pyc(py: Path, marker: Path) -> None:
    """A .pyc in __pycache__ that Python's import system would take for `py`'s:
    its header carries py's mtime and size, its code creates `marker`."""
    code = compile(f"import os\nos.mkdir({str(marker)!r})\n", str(py), "exec")
    st = py.stat()
    pyc = Path(importlib.util.cache_from_source(str(py)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(bootstrap._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))


def test_a_planted_pyc_beside_output_code_never_runs(tmp_path: Path) -> None:
    cache, marker = _cache(tmp_path), tmp_path / "pwned"
    compiled = _compile(cache, graph_cache=False)
    (py,) = cache.glob("c*.py")
    _plant_pyc(py, marker)
    again = runtime.load_module(compiled.module, str(cache))
    inputs = _inputs()
    torch.testing.assert_close(again(*inputs)[0], fn(*inputs))
    assert not marker.exists()
    # the control: importing the file the usual way runs the planted .pyc
    spec = importlib.util.spec_from_file_location("planted_check", py)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert marker.exists()


def test_a_planted_pyc_in_an_open_dir_never_runs(tmp_path: Path) -> None:
    cache, marker = _cache(tmp_path), tmp_path / "pwned"
    compiled = _compile(cache, graph_cache=False)
    (py,) = cache.glob("c*.py")
    _plant_pyc(py, marker)
    cache.chmod(0o777)
    with pytest.raises(coil.CoilError, match="refusing the cache dir"):
        runtime.load_module(compiled.module, str(cache))
    assert not marker.exists()


def test_output_code_with_other_text_is_rewritten_not_run(tmp_path: Path) -> None:
    cache, marker = _cache(tmp_path), tmp_path / "pwned"
    _compile(cache)
    (py,) = cache.glob("c*.py")
    good = py.read_bytes()
    py.write_text(f"import os\nos.mkdir({str(marker)!r})\n")
    _compile(cache)  # from the graph cache: the same output_code.py
    assert not marker.exists()
    assert py.read_bytes() == good


def test_output_code_with_invalid_utf8_is_rebuilt(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    _compile(cache)
    (py,) = cache.glob("c*.py")
    good = py.read_bytes()
    py.write_bytes(b"\xff\xfe\x00 not python, not utf-8 \xc3\x28")
    compiled = _compile(cache)
    assert py.read_bytes() == good
    _compile(cache, max_fusion_size=1)  # later compiles, of other graphs, work too
    assert compiled.source == good.decode()


def test_tracebacks_and_inspect_see_the_generated_text(tmp_path: Path) -> None:
    import inspect
    import linecache

    cache = _cache(tmp_path)
    compiled = _compile(cache, graph_cache=False)
    (py,) = cache.glob("c*.py")
    py.write_text("# changed on disk after the load\n")
    call = compiled.namespace["call"]
    assert inspect.getsource(call).startswith("def call(args")
    assert "".join(linecache.getlines(str(py))) == compiled.source


# ---- everything under the configured cache dir ------------------------------------------------


@pytest.mark.parametrize("target", ["cpp", "triton"])
def test_options_cache_dir_holds_every_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                target: str) -> None:
    default, chosen = tmp_path / "default", tmp_path / "chosen"
    monkeypatch.setenv("COIL_CACHE_DIR", str(default))
    _compile(chosen, target)
    assert list(chosen.glob("c*.py")) and list(chosen.glob("graphs/*.pkl"))
    if target == "cpp":
        assert list(chosen.glob("cpp/*.so")) and list(chosen.glob("cpp/*.cpp")) and list(chosen.glob("cpp/*.json"))
    # through torch.compile too (AOTAutograd, then the Dynamo graph's link)
    torch._dynamo.reset()
    x = torch.randn(4, 8)
    out = torch.compile(lambda t: (t * 3).exp(), backend="coil",
                        options={"target": target, "cache_dir": str(chosen)})(x)
    torch.testing.assert_close(out, (x * 3).exp())
    assert list(chosen.glob("graphs/*.link"))
    assert not default.exists() or not any(default.rglob("*"))


def test_the_default_is_coil_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path / "env"))
    inputs = _inputs()
    coil.compile_graph(make_fx(fn)(*inputs), inputs, coil.Options(target="cpp"))
    assert list((tmp_path / "env").glob("c*.py")) and list((tmp_path / "env").glob("cpp/*.so"))


# ---- the C++ key names the CPU -------------------------------------------------------------


def test_the_cpp_key_names_the_cpus_instruction_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isa = build.cpu_isa(build.compiler())
    assert isa.strip()
    if "g++" in build.compiler():
        assert "-march=" in isa  # what -march=native resolved to
    source = "int x;\n"
    ours = build.cache_entry(source, str(tmp_path)).key
    monkeypatch.setattr(build, "cpu_isa", lambda cxx: isa + "\n  -mavx512f  [enabled]")
    other = build.cache_entry(source, str(tmp_path)).key
    monkeypatch.setattr(build, "cpu_isa", lambda cxx: isa)
    assert other != ours and build.cache_entry(source, str(tmp_path)).key == ours


def test_cpu_isa_falls_back_to_proc_cpuinfo() -> None:
    isa = build.cpu_isa.__wrapped__("/nonexistent/c++")
    if os.path.exists("/proc/cpuinfo"):
        assert "flags" in isa or "Features" in isa


# ---- read-only and full disks --------------------------------------------------------------


def _refuse_writes(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def refuse(path: str, data: bytes) -> None:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(runtime, "write_atomic", refuse)
    monkeypatch.setattr(build, "write_atomic", refuse)


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_an_unwritable_cache_compiles_uncached_where_it_can(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            code: int) -> None:
    cache = _cache(tmp_path)
    _refuse_writes(monkeypatch, code)
    compiled = _compile(cache, "reference")  # the check inside runs it against eager
    assert "def call(args" in compiled.source
    assert not list(cache.rglob("*.py")) and not list(cache.rglob("*.pkl"))
    # with the Dynamo link too
    torch._dynamo.reset()
    x = torch.randn(4, 8)
    out = torch.compile(lambda t: t.sin() + 1, backend="coil", options={"target": "reference",
                                                                        "cache_dir": str(cache)})(x)
    torch.testing.assert_close(out, x.sin() + 1)


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_an_unwritable_cache_gives_the_cpp_target_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                code: int) -> None:
    cache = _cache(tmp_path)
    _refuse_writes(monkeypatch, code)
    with pytest.raises(coil.CoilError) as info:
        _compile(cache, "cpp")
    assert isinstance(info.value, runtime.CacheUnwritable)
    assert f"cache dir {cache / 'cpp'}" in str(info.value) and os.strerror(code) in str(info.value)
    assert "COIL_CACHE_DIR" in str(info.value)


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_a_cache_dir_that_cannot_be_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def refuse(path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        raise OSError(code, os.strerror(code), path)

    monkeypatch.setattr(os, "makedirs", refuse)
    cache = tmp_path / "never"
    compiled = _compile(cache, "reference")
    assert "def call(args" in compiled.source and not cache.exists()
    with pytest.raises(coil.CoilError, match=f"cannot create the cache dir {cache} .*COIL_CACHE_DIR"):
        _compile(cache, "cpp")


# ---- damaged entries of every kind are rebuilt -----------------------------------------------


@pytest.mark.parametrize("damage", [b"\xff\xfe\xc3\x28", b"", b"[1, 2]", b"{\"key\": 3}", b"null"])
def test_a_damaged_sidecar_is_rebuilt(tmp_path: Path, damage: bytes) -> None:
    source = '#include <cstdint>\nextern "C" void noop(int64_t a, int64_t b) {}\n'
    entry = build.cache_entry(source, str(tmp_path))
    build.build(source, str(tmp_path))
    Path(entry.sidecar).write_bytes(damage)
    assert not build.is_valid(entry)
    build.load_library(source, str(tmp_path))
    assert build.is_valid(entry)


def test_a_link_with_invalid_utf8_is_rebuilt(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    x = torch.randn(4, 8)
    options = {"target": "cpp", "cache_dir": str(cache)}
    torch._dynamo.reset()
    torch.compile(lambda t: t.cos() * 2, backend="coil", options=options)(x)
    (link,) = cache.glob("graphs/*.link")
    link.write_bytes(b"\xff" * 32)
    torch._dynamo.reset()
    out = torch.compile(lambda t: t.cos() * 2, backend="coil", options=options)(x)
    torch.testing.assert_close(out, x.cos() * 2)
    assert len(link.read_bytes().strip()) == 32 and link.read_bytes().isascii()


def test_generated_files_are_private(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    _compile(cache)
    for f in glob.glob(str(cache / "**" / "*"), recursive=True):
        if os.path.isfile(f):
            assert os.stat(f).st_mode & 0o022 == 0, f


def test_the_key_of_output_code_is_its_text(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    compiled = _compile(cache, graph_cache=False)
    key = hashlib.sha256(compiled.source.encode()).hexdigest()[:24]
    assert (cache / f"c{key}.py").read_text() == compiled.source
    assert sys.modules.get(f"coil_output_{key}") is None  # a fresh namespace, not an import


def test_autotuning_results_live_in_a_checked_folder_and_damage_is_retuned(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from coil.backends.triton import runtime as triton_runtime

    cache = _cache(tmp_path)
    path = triton_runtime._cache_path("k" * 32, str(cache))
    assert path is not None and Path(path).parent == cache / "triton-autotune"
    assert (cache / "triton-autotune").stat().st_mode & 0o777 == 0o700
    cfg = triton_runtime.LaunchConfig(64, 0, 2)
    triton_runtime._store_config(path, cfg)
    assert triton_runtime._load_config(path) == cfg
    for damage in (b"\xff\xfe", b"{}", b"[]", b'{"xblock": "x", "bogus": 1}'):
        Path(path).write_bytes(damage)
        assert triton_runtime._load_config(path) is None
    _refuse_writes(monkeypatch, errno.ENOSPC)
    triton_runtime._store_config(path, cfg)  # a full disk: kept in memory only, no error
    (cache / "triton-autotune").chmod(0o777)
    with pytest.raises(coil.CoilError, match="refusing the cache dir"):
        triton_runtime._cache_path("k" * 32, str(cache))
