"""Process replay (scripts/process_replay.py): every compiled module's source is
dumped under a name that depends on what it was compiled from, so two dumps of the
same cases compare file by file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import coil

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("process_replay", ROOT / "scripts" / "process_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(fn, inputs, folder: Path, **options) -> str:
    gm = make_fx(fn)(*inputs)
    return coil.compile_graph(gm, inputs, coil.Options(dump_sources=str(folder), graph_cache=False,
                                                       **options)).source


def test_sources_are_named_by_graph_inputs_and_options(tmp_path: Path) -> None:
    x = torch.randn(8, 16)
    fn = lambda a: (a.softmax(-1) * 2,)  # noqa: E731
    src = _compile(fn, [x], tmp_path / "s", target="cpp")
    again = _compile(fn, [x], tmp_path / "s", target="cpp")
    files = sorted((tmp_path / "s").glob("*.py"))
    assert len(files) == 1 and src == again and files[0].read_text() == src
    _compile(fn, [x], tmp_path / "s", target="reference")  # other options: another name
    _compile(fn, [torch.randn(8, 17)], tmp_path / "s", target="cpp")  # other inputs: another name
    assert len(list((tmp_path / "s").glob("*.py"))) == 3
    assert not list((tmp_path / "s").glob(".*"))  # no temporary file left


def test_a_source_that_changes_under_the_same_name_is_kept_beside_it(tmp_path: Path) -> None:
    from coil.graph_cache import dump_source

    x = torch.randn(4)
    gm = make_fx(lambda a: (a + 1,))(x)
    opts = coil.Options(dump_sources=str(tmp_path))
    for text in ("one", "two", "one"):
        dump_source(text, gm, [x], opts)
    assert sorted(p.read_text() for p in tmp_path.glob("*.py")) == ["one", "two"]


def test_compare_counts_identical_and_different_sources(tmp_path: Path, capsys) -> None:
    replay = _script()
    for side in ("a", "b"):
        (tmp_path / side / "sources").mkdir(parents=True)
        (tmp_path / side / "sources" / "k1.py").write_text("same\n")
    assert replay.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    (tmp_path / "b" / "sources" / "k2.py").write_text("new\n")
    (tmp_path / "a" / "sources" / "k1.py").write_text("changed\n")
    assert replay.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "identical 1, different 0" in out and "identical 0, different 1" in out and "only in" in out
    assert "-changed" in out and "+same" in out


def test_a_folder_that_cannot_be_written_does_not_fail_the_compile(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    x = torch.randn(4)
    src = _compile(lambda a: (a * 2,), [x], blocker / "sources", target="reference")
    assert "def call(" in src
    assert "cannot dump a source" in caplog.text


def test_compare_ignores_where_a_cpp_library_is_loaded_from(tmp_path: Path) -> None:
    replay = _script()
    for side, folder in (("a", "/tmp/x/cache"), ("b", "/tmp/pytest-7/cache")):
        (tmp_path / side / "sources").mkdir(parents=True)
        (tmp_path / side / "sources" / "k.py").write_text(f"_cpp_lib = _cpp_build.load_library(_cpp_source, '{folder}')\n")
    assert replay.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
