"""`coil fuzz`: the property tests' graph generator against eager PyTorch, from the
command line."""

from __future__ import annotations

import pytest
from coil.properties import fuzzing

from coil.__main__ import main


def test_fuzz_reports_every_example_and_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fuzz", "--examples", "5", "--seed", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "5 examples, 0 mismatches"
    assert rc == 0
    assert [ln.split()[:2] for ln in lines[:-1]] == [[str(i), "ok"] for i in range(1, 6)]


def test_a_seed_names_one_sequence_of_graphs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["fuzz", "--examples", "4", "--seed", "7", "--no-shrink"])
    first = capsys.readouterr().out
    main(["fuzz", "--examples", "4", "--seed", "7", "--no-shrink"])
    assert capsys.readouterr().out == first


def test_a_mismatch_prints_a_reproducer_and_exits_1(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example made to mismatch: each gets its inputs and graph printed, the
    first is shrunk (to at most one op: any graph fails) and printed as a script."""
    monkeypatch.setattr(fuzzing, "mismatch", lambda drawn, outputs: "output 0: injected mismatch")
    rc = main(["fuzz", "--examples", "3", "--seed", "2", "--dtypes", "float32"])
    out = capsys.readouterr().out
    assert rc == 1
    assert out.splitlines()[-1] == "3 examples, 3 mismatches"
    assert out.count("--- example") == 3 and out.count("injected mismatch") >= 3
    assert "arg0_1: float32[" in out and "def forward(self, arg0_1" in out
    shrunk = out.split("--- smallest failing graph (shrunk): mismatch", 1)[1]
    graph = shrunk.split("graph:", 1)[1].split("---", 1)[0]
    assert graph.count("torch.ops.aten.") <= 1
    assert "coil.compile_graph(gm, inputs, coil.Options(target='reference'))" in shrunk


def test_quiet_prints_a_progress_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--examples", "10", "--seed", "3", "--quiet", "--dtypes", "int32,float64"]) == 0
    assert capsys.readouterr().out.splitlines() == ["10/10 examples", "10 examples, 0 mismatches"]


def test_unknown_dtype_is_a_usage_error() -> None:
    with pytest.raises(SystemExit, match="unknown dtypes \\['float8'\\]"):
        main(["fuzz", "--examples", "1", "--dtypes", "float32,float8"])
