"""bench/fsdp.py: the FSDP2 step benchmark, run on the CPU with gloo at the tiny
size (on the multi-GPU machine it is issue 18's measurement), and its overlap
arithmetic on made-up kernel timelines."""

from __future__ import annotations

import json

import pytest

from bench import fsdp


def test_union_and_covered_time() -> None:
    assert fsdp.union([(5, 7), (0, 2), (1, 3), (7, 8), (4, 4)]) == [(0, 3), (5, 8)]
    assert fsdp.covered([(0, 3), (5, 8)], [(2, 6)]) == 2  # 2-3 and 5-6
    assert fsdp.covered([(0, 1)], [(1, 2)]) == 0


def test_overlap_is_the_share_of_communication_under_compute() -> None:
    kernels = [
        ("ncclDevKernel_AllGather_RING_LL", 0.0, 10.0),
        ("triton_poi_fused_add_0", 2.0, 6.0),  # under the all-gather: 4 of its 10 us
        ("sm90_xmma_gemm_bf16", 5.0, 12.0),  # 5-10 under it, 6-10 counted once
        ("ncclDevKernel_ReduceScatter_Sum", 20.0, 30.0),  # nothing runs beside it
    ]
    ov = fsdp.overlap(kernels)
    assert ov["comm_us"] == 20.0 and ov["compute_us"] == 10.0
    assert ov["hidden"] == pytest.approx(8.0 / 20.0)  # 2-10 of the first, none of the second
    assert fsdp.overlap([("triton_poi", 0.0, 1.0)])["hidden"] is None  # no communication at all


def test_traced_kernels_are_the_device_events() -> None:
    """The profiler's device-side events, as (name, start, end); host events left out."""
    from types import SimpleNamespace as NS

    class Range:
        def __init__(self, start: float, us: float) -> None:
            self.start, self.us = start, us

        def elapsed_us(self) -> float:
            return self.us

    events = [NS(name="ncclDevKernel_AllGather", device_type=NS(name="CUDA"), time_range=Range(10.0, 5.0)),
              NS(name="aten::mm", device_type=NS(name="CPU"), time_range=Range(0.0, 50.0)),
              NS(name="triton_poi_0", device_type=NS(name="CUDA"), time_range=Range(12.0, 1.0))]
    assert fsdp.traced_kernels(events) == [("ncclDevKernel_AllGather", 10.0, 15.0), ("triton_poi_0", 12.0, 13.0)]


def test_losses_are_checked_against_eagers() -> None:
    records = [{"variant": "eager", "losses": [2.0, 1.0]}, {"variant": "coil", "losses": [2.0, 1.001]},
               {"variant": "inductor", "losses": [2.0, 1.5]}, {"variant": "x", "error": "boom"}]
    fsdp.check(records, rtol=1e-2)
    assert [r["check"] for r in records][:2] == ["ok", "ok"]
    assert records[2]["check"].startswith("loss off by 0.5")
    assert records[3]["check"] == "error"


def test_fsdp2_steps_on_two_cpu_ranks(tmp_path) -> None:
    """Two gloo ranks, each layer of a tiny Llama compiled by coil then sharded:
    the compiled steps' losses are eager's (float32, the same data), the layer's
    forward and backward are compiled with no graph break, and the files say
    why the overlap figure is not measured on the CPU."""
    pytest.importorskip("transformers")
    rc = fsdp.main(["--world", "2", "--device", "cpu", "--steps", "1", "--variants", "eager,coil",
                    "--out", str(tmp_path), "--name", "t"])
    data = json.loads((tmp_path / "t.json").read_text())
    by = {r["variant"]: r for r in data["records"]}
    assert rc == 0 and set(by) == {"eager", "coil"}, data
    coil, eager = by["coil"], by["eager"]
    assert coil["check"] == "ok" and coil["loss_rel_err"] <= 1e-4, coil
    assert len(coil["losses"]) == 2 and coil["losses"][1] < coil["losses"][0]  # the SGD step trains
    assert coil["coil_counts"].get("compiled", 0) >= 2 and not coil["coil_counts"].get("eager"), coil
    assert coil["graph_breaks"] == 0 and eager["hidden"] is None
    md = (tmp_path / "t.md").read_text()
    assert "| coil |" in md and "not measured: no GPU kernels" in md
