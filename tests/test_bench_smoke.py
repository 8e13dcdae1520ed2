"""The benchmark harness end to end on its smoke suite (tiny, CPU, no timing claims):
the JSON is written with the expected keys and coil's output matched eager's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import main

TOP_KEYS = {"suite", "device", "device_name", "torch", "coil_target", "copy_bytes_per_s", "workloads", "geomean",
            "elapsed_s"}
VARIANT_KEYS = {"status", "first_call_s", "time_s", "gb_per_s", "copy_fraction", "launches", "peak_bytes",
                "max_abs_err"}


def test_smoke_suite_writes_results(tmp_path: Path) -> None:
    assert main(["--suite", "smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "cpu-smoke.json").read_text())
    assert TOP_KEYS <= set(results)
    assert (tmp_path / "cpu-smoke.md").read_text().startswith("# coil benchmarks")
    (wl,) = results["workloads"]
    assert wl["min_bytes"] > 0
    eager, coil = wl["variants"]["eager"], wl["variants"]["coil"]
    assert VARIANT_KEYS <= set(eager) and VARIANT_KEYS <= set(coil)
    assert eager["status"] == "ref"
    assert coil["status"] == "ok", coil.get("mismatch") or coil.get("error")
    assert coil["launches"] >= 1 and coil["plan_peak_bytes"] > 0
    assert wl["ratios"]["coil/eager"] > 0


def test_a_wrong_output_is_a_mismatch() -> None:
    import torch

    from bench.check import compare

    want = [torch.ones(4, 4)]
    assert compare((torch.ones(4, 4) + 1e-6,), want, 1e-3, 1e-4) is None
    assert compare((torch.ones(4, 4) * 1.01,), want, 1e-3, 1e-4) is not None
    assert compare((torch.ones(4, 4, dtype=torch.float64),), want, 1e-3, 1e-4) is not None  # dtype matters
    assert compare((), want, 1e-3, 1e-4) is not None


def test_rounds_interleave_and_take_the_median(tmp_path: Path) -> None:
    assert main(["--suite", "smoke", "--out", str(tmp_path), "--rounds", "3", "--no-compile-times"]) == 0
    results = json.loads((tmp_path / "cpu-smoke.json").read_text())
    assert results["rounds"] == 3
    for rec in results["workloads"][0]["variants"].values():
        assert len(rec["time_rounds_s"]) == 3
        assert rec["time_s"] == sorted(rec["time_rounds_s"])[1]


def test_rounds_rotate_the_order_and_name_a_failing_variant() -> None:
    import pytest
    import torch

    from bench.harness import VariantFailed, timed_rounds

    order: list[str] = []
    count = {"b": 0}

    def log(name: str):  # type: ignore[no-untyped-def]
        return lambda: order.append(name) if not order or order[-1] != name else None

    def flaky() -> None:
        count["b"] += 1
        if count["b"] > 40:
            raise RuntimeError("died after 40 calls")

    got = timed_rounds({"a": log("a"), "b": log("b"), "c": log("c")}, torch.device("cpu"), True, 3, float("inf"))
    assert [len(v) for v in got.values()] == [3, 3, 3]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    with pytest.raises(VariantFailed) as failed:
        timed_rounds({"a": lambda: None, "b": flaky}, torch.device("cpu"), True, 50, float("inf"))
    assert failed.value.variant == "b" and "40 calls" in str(failed.value.error)


def test_the_table_gives_each_rounds_ratio_range() -> None:
    from bench.report import markdown, round_ratios

    def rec(times: list[float]) -> dict[str, object]:
        return {"status": "ok", "time_s": sorted(times)[1], "time_rounds_s": times}

    wl = {"name": "silu_mul", "description": "d", "variants": {
        "inductor": rec([1.0, 1.0, 1.0]), "coil": rec([0.99, 1.0, 1.01])}}
    results = {"device_name": "x", "suite": "gpu", "torch": "t", "triton": "t", "python": "p", "coil_target": "triton",
               "started": "now", "workloads": [wl]}
    assert round_ratios(wl) == [0.99, 1.0, 1.01]
    assert "- silu_mul: 1.000 (0.990 to 1.010)" in markdown(results)
    wl["variants"]["coil"]["status"] = "mismatch"
    assert round_ratios(wl) == [] and "0.990 to" not in markdown(results)


def test_a_graph_loaded_through_its_link_is_recorded(tmp_path: Path, monkeypatch) -> None:
    """The second compile of an inference graph skips AOTAutograd (the graph
    cache's link); the kernel counts must still see its compiled graph."""
    import torch

    from bench.variants import Capture, first_call, make_callable

    monkeypatch.setenv("COIL_CACHE_DIR", str(tmp_path))
    x = torch.randn(8, 16)
    caps = []
    for _ in range(2):
        torch._dynamo.reset()
        f = make_callable("coil", lambda a: (a * 2).softmax(-1), "cpp")
        cap = Capture()
        torch.testing.assert_close(first_call("coil", lambda: f(x), cap), (x * 2).softmax(-1))
        caps.append(cap)
    assert list((tmp_path / "graphs").glob("*.link"))
    assert [len(c.coil_graphs) for c in caps] == [1, 1]
    assert caps[0].coil_graphs[0].source == caps[1].coil_graphs[0].source
