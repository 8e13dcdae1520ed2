"""The dynamic-shapes suite (bench/dynamic.py) end to end at its tiny size on the CPU:
one batch workload at three batch sizes and the GPT-2 decoder for three steps,
eager and both coil variants (Inductor's cold C++ builds take tens of seconds on a
small CPU, so it is left out here).  The records must have their fields and values
that make sense; nothing here is a timing claim, and the counts hold whether coil
runs symbolic graphs eagerly or compiles them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import main  # noqa: E402

FIELDS = {"workload", "variant", "size", "step", "ms", "compiles", "coil_compiled", "coil_eager", "compile_s",
          "status", "first_call_ms", "dynamo_compile_s", "device", "torch"}


def test_dynamic_suite_at_its_tiny_size(tmp_path: Path) -> None:
    argv = ["--suite", "dynamic", "--device", "cpu", "--size", "tiny", "--only", "seed,decoder",
            "--variants", "eager,coil-dynamic,coil-static", "--threads", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    records = json.loads((tmp_path / "cpu-dynamic-tiny-seed-decoder.json").read_text())
    assert isinstance(records, list)
    shapes = [r for r in records if not r.get("summary")]
    summaries = {(r["workload"], r["variant"]): r for r in records if r.get("summary")}
    variants = ("eager", "coil-dynamic", "coil-static")
    assert set(summaries) == {(wl, v) for wl in ("seed", "decoder") for v in variants}
    assert sorted({r["size"] for r in shapes if r["workload"] == "seed"}) == [1, 2, 3]
    assert sorted({r["step"] for r in shapes if r["workload"] == "decoder"}) == [1, 2, 3]
    for r in shapes:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["status"] == ("ref" if r["variant"] == "eager" else "ok"), r.get("mismatch") or r.get("error")
        assert 0 < r["ms"] < 10_000 and r["first_call_ms"] > 0
        if r["variant"] == "eager":
            assert r["compiles"] == 0 and r["compile_s"] is None
        else:
            assert r["compile_s"] >= 0 and r["compiles"] >= 0
    for (wl, v), s in summaries.items():
        assert s["status"] == ("ref" if v == "eager" else "ok")
        assert s["shapes"] == s["shapes_passed"] == 3 and s["ms"] > 0
        if v == "eager":
            assert s["compiles"] == 0 and s["coil_compiled"] == s["coil_eager"] == 0
            continue
        assert s["compiles"] >= 1 and s["coil_compiled"] + s["coil_eager"] >= 1
        assert s["compile_s"] > 0 and s["dynamo_compile_s"] > 0
        if v == "coil-static":  # one Dynamo graph per shape, each compiled by coil
            assert s["compiles"] == 3 and s["coil_compiled"] == 3 and s["coil_eager"] == 0
    dyn = summaries[("seed", "coil-dynamic")]
    assert dyn["dynamic_over_static"] > 0 and dyn["dynamic_over_inductor"] is None
    md = (tmp_path / "cpu-dynamic-tiny-seed-decoder.md").read_text()
    assert md.startswith("# coil benchmarks") and "| **decoder** | eager | ref |" in md
    assert "time dyn coil / static coil" in md


def test_the_options_choose_sizes_and_variants() -> None:
    from bench.dynamic import parse_args

    cfg = parse_args(["--suite", "dynamic", "--device", "cpu", "--batches", "4,1", "--steps", "5",
                      "--variants", "coil-static"])
    assert cfg.size.name == "cpu" and cfg.size.batches == (4, 1) and cfg.size.steps == 5
    assert cfg.variants == ("eager", "coil-static")  # eager always runs: it is the reference
    with pytest.raises(SystemExit):
        parse_args(["--suite", "dynamic", "--only", "nonesuch"])


def test_gpu_kernel_ratios_are_the_geomean_over_shapes(tmp_path: Path) -> None:
    """CUDA records carry the GPU kernel time a call (gpu_ms); the summary and the
    comparison table give dynamic / static coil and dynamic coil / Inductor by it,
    the geomean over the shapes both passed, beside the wall-time ratios."""
    from bench.dynamic import Writer

    info = {"device": "cuda", "device_name": "GPU", "size_preset": "gpu", "torch": "t", "transformers": "-",
            "python": "3", "coil_target": "triton", "threads": 1, "started": "now", "command": "c"}
    wr = Writer(tmp_path, "x", info, [])
    gpu = {"coil-dynamic": (2.0, 9.0), "coil-static": (1.0, 4.5), "inductor-dynamic": (4.0, 36.0)}
    for variant, per in {"eager": (10.0, 10.0), **gpu}.items():
        for batch, g in zip((1, 8), per):
            wr.new(workload="softmax", variant=variant, size=batch, status="ref" if variant == "eager" else "ok",
                   ms=50.0, gpu_ms=g)
    (dyn,) = [s for s in wr.summaries() if s["variant"] == "coil-dynamic"]
    assert dyn["dynamic_over_static"] == 1.0  # the wall times: all 50 ms
    assert dyn["gpu_dynamic_over_static"] == pytest.approx(2.0)
    assert dyn["gpu_dynamic_over_inductor"] == pytest.approx((0.5 * 0.25) ** 0.5)
    md = wr.markdown()
    assert "GPU kernels dyn coil / static coil | GPU kernels dyn coil / dyn Inductor |" in md
    assert "| **softmax** | 1.00 | 1.00 |" in md and md.split("| **softmax** | 1.00 | 1.00 |")[1].split("\n")[0].endswith(
        "| 2.00 | 0.35 |")
