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
