"""The models suite (bench/models.py) end to end on one tiny model on the CPU,
eager and coil, one round: the JSON is a list of records with the fields the
issue names and values that make sense.  Nothing here is a timing claim."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import main  # noqa: E402

FIELDS = {"model", "mode", "compile_mode", "variant", "ms", "kernels", "status", "size", "peak_mib",
          "first_call_s", "device", "torch"}


def test_models_suite_on_one_tiny_model(tmp_path: Path) -> None:
    argv = ["--suite", "models", "--device", "cpu", "--size", "tiny", "--only", "gpt2", "--variants", "eager,coil",
            "--rounds", "1", "--threads", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    records = json.loads((tmp_path / "cpu-models-tiny-gpt2.json").read_text())
    assert isinstance(records, list)
    assert {(r["mode"], r["variant"]) for r in records} == {(m, v) for m in ("infer", "train")
                                                          for v in ("eager", "coil")}
    for r in records:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["model"] == "gpt2" and r["size"] == "tiny" and r["compile_mode"] == "default"
        assert r["status"] == ("ref" if r["variant"] == "eager" else "ok"), r.get("mismatch") or r.get("error")
        assert 0 < r["ms"] < 10_000 and len(r["ms_rounds"]) == 1
        assert r["kernels"] >= 1 and r["peak_mib"] >= 0
    for r in records:  # called once before the timed rounds: nothing compiled again on the CPU
        assert r["before_timing_s"] >= 0 and r["before_timing_compiles"] == [], r["before_timing_compiles"]
    coil_train = next(r for r in records if r["variant"] == "coil" and r["mode"] == "train")
    assert coil_train["coil_graphs"] >= 2 and coil_train["eager_fallbacks"] == 0  # forward and backward
    md = (tmp_path / "cpu-models-tiny-gpt2.md").read_text()
    assert md.startswith("# coil benchmarks") and "reduce-overhead skipped" in md and "| **gpt2** | train |" in md


def test_merge_keeps_what_a_run_does_not_measure_again(tmp_path: Path) -> None:
    from bench.models_report import Writer

    info = {"device": "cpu", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "cpp", "dtype": "float32", "threads": 1, "rounds": 1, "started": "a"}

    def rec(w: Writer, model: str, variant: str, ms: float) -> None:
        r = w.new_record(model=model, size="cpu", mode="infer", compile_mode="default", variant=variant, batch=2,
                         seq=64, hidden=128, layers=2)
        r.update(status="ref" if variant == "eager" else "ok", ms=ms, kernels=3)

    first = Writer(tmp_path, "m", dict(info), [], ("default",))
    for model in ("gpt2", "bert"):
        for variant, ms in (("eager", 2.0), ("inductor", 1.0), ("coil", 0.5)):
            rec(first, model, variant, ms)
    first.write()
    second = Writer(tmp_path, "m", dict(info, started="b"), [], ("default",), merge=True)
    rec(second, "bert", "coil", 2.0)
    second.write()
    records = json.loads((tmp_path / "m.json").read_text())
    assert len(records) == 6
    assert [r["ms"] for r in records if r["model"] == "bert" and r["variant"] == "coil"] == [2.0]
    md = (tmp_path / "m.md").read_text()
    assert "from 2 runs" in md and "| **geomean infer** | (2) |  |  |  | 1.00 | - | 2.00 |" in md
    # a case a resumed run planned but the budget skipped whole keeps what an earlier run measured
    third = Writer(tmp_path, "m", dict(info, started="c"), [], ("default",), merge=True)
    for variant in ("eager", "inductor", "coil"):
        third.new_record(model="gpt2", size="cpu", mode="infer", compile_mode="default", variant=variant, batch=2,
                         seq=64, hidden=128, layers=2).update(status="skipped", error="time budget spent")
    skipped = third.new_record(model="gpt2", size="cpu", mode="train", compile_mode="default", variant="coil",
                               batch=2, seq=64, hidden=128, layers=2)
    skipped.update(status="skipped", error="time budget spent")
    third.write()
    records = json.loads((tmp_path / "m.json").read_text())
    assert [(r["mode"], r["variant"], r["status"], r["started"]) for r in records if r["model"] == "gpt2"] == [
        ("infer", "eager", "ref", "a"), ("infer", "inductor", "ok", "a"), ("infer", "coil", "ok", "a"),
        ("train", "coil", "skipped", "c")]


def test_cuda_tables_show_the_back_to_back_wall_time_beside_do_bench(tmp_path: Path) -> None:
    """A CUDA run's records carry `wall_ms` (steps back to back, one sync) beside
    do_bench's `ms`: the table shows both ratios and the geomeans of both, each
    over the rows where both sides have it."""
    from bench.models_report import Writer

    info = {"device": "cuda", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "triton", "dtype": "bfloat16", "rounds": 1, "started": "a"}
    w = Writer(tmp_path, "g", info, [], ("reduce-overhead",))
    for model, times in (("gpt2", {"eager": (9.0, 9.0), "inductor": (2.2, 1.9), "coil": (2.6, 1.8)}),
                         ("bert", {"eager": (9.0, None), "inductor": (2.0, None), "coil": (2.0, None)})):
        for variant, (ms, wall) in times.items():
            r = w.new_record(model=model, size="small", mode="train", variant=variant, batch=8, seq=256, hidden=512,
                             layers=4, compile_mode="default" if variant == "eager" else "reduce-overhead")
            r.update(status="ref" if variant == "eager" else "ok", ms=ms, kernels=3)
            if wall is not None:
                r["wall_ms"] = wall
    w.write()
    md = (tmp_path / "g.md").read_text()
    assert "| wall ms e / I / c | wall coil/Ind |" in md
    assert "| **gpt2** | train | 9 | 2.2 | 2.6 | 1.18 | - | 4.09 | 9 / 1.9 / 1.8 | 0.95 |" in md
    assert "| **bert** | train | 9 | 2 | 2 | 1.00 | - | 4.50 | - / - / - | - |" in md
    assert "| **geomean train** | (2) |  |  |  | 1.09 | - | 4.29 |  | 0.95 |" in md
    assert "coil/Inductor 1.09 over 2 models; by back-to-back wall time 0.95 over 1" in md


def test_rows_the_budget_cut_short_say_how_many_rounds_they_had(tmp_path: Path) -> None:
    """The time budget can stop a case's timing after its first round (session 26:
    ViT's training rows and BERT's at the large size, 1 of 9 rounds, one of them
    at 1.50 where its back-to-back time said 0.96): the row and the geomean line
    say so, where the header names the planned rounds."""
    from bench.models_report import Writer

    info = {"device": "cuda", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "triton", "dtype": "bfloat16", "rounds": 9, "started": "a"}
    w = Writer(tmp_path, "r", info, [], ("default",))
    for model, n in (("gpt2", 9), ("vit", 1)):
        for variant, ms in (("eager", 9.0), ("inductor", 2.0), ("coil", 2.5)):
            r = w.new_record(model=model, size="small", mode="train", variant=variant, batch=8, seq=256, hidden=512,
                             layers=4, compile_mode="default")
            r.update(status="ref" if variant == "eager" else "ok", ms=ms, kernels=3, ms_rounds=[ms] * n)
    w.write()
    md = (tmp_path / "r.md").read_text()
    vit = next(line for line in md.splitlines() if line.startswith("| **vit**"))
    gpt2 = next(line for line in md.splitlines() if line.startswith("| **gpt2**"))
    assert vit.endswith("| ok (1 of 9 rounds: the time budget ran out) |") and gpt2.endswith("| ok |")
    assert "over 2 models; by round (each row's median of its rounds' ratios) 1.25 (vit timed in fewer rounds: " \
        "the time budget ran out)" in md


def test_the_summary_takes_both_sizes_together_and_names_every_row_above_one(tmp_path: Path) -> None:
    """Issue 15 asks of one run at both sizes that every row be at most 1.0 and the
    geomeans at most 0.9: the summary gives each step's geomean over both sizes, its
    highest row, the rows above 1.0 and the rows without a ratio."""
    from bench.models_report import Writer

    info = {"device": "cuda", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "triton", "dtype": "bfloat16", "rounds": 1, "started": "a"}
    w = Writer(tmp_path, "b", info, [], ("default",))
    rows = (("small", "gpt2", "infer", 0.8), ("large", "gpt2", "infer", 1.004), ("small", "bert", "infer", 0.5),
            ("large", "bert", "infer", None), ("small", "gpt2", "train", 0.9))
    for size, model, mode, ratio in rows:
        for variant, ms in (("eager", 3.0), ("inductor", 2.0), ("coil", 2.0 * (ratio or 1.0))):
            r = w.new_record(model=model, size=size, mode=mode, variant=variant, batch=8, seq=256, hidden=512,
                             layers=4, compile_mode="default")
            failed = ratio is None and variant == "coil"
            r.update(status="mismatch" if failed else "ref" if variant == "eager" else "ok", ms=ms, kernels=3)
    w.write()
    md = (tmp_path / "b.md").read_text()
    both = (0.8 * 1.004 * 0.5) ** (1 / 3)
    assert (f"- small and large together, default, infer: coil/Inductor {both:.2f} over 3 rows, the highest 1.00; "
            "above 1.0: large gpt2 1.004; without a ratio (not measured, or a side failed): large bert") in md
    assert "- small and large together, default, train: coil/Inductor 0.90 over 1 rows, the highest 0.90; " \
        "none above 1.0" in md


def test_a_row_both_compilers_fail_alike_is_timed_and_one_coil_alone_fails_is_not(tmp_path: Path) -> None:
    """ResNet's large bfloat16 inference on the GPU fails the accuracy check for
    Inductor and coil with the same RMSE against float64 (3.074x eager's, the same
    numbers from both): its times compare.  Where the RMSEs differ, or coil alone
    fails, the row has no ratio."""
    from bench.models_report import Writer

    info = {"device": "cuda", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "triton", "dtype": "bfloat16", "rounds": 2, "started": "a"}
    w = Writer(tmp_path, "a", info, [], ("default",))
    cases = {("resnet", "large"): (3.074, 3.074), ("convnext", "large"): (3.074, 3.5),
             ("vit", "large"): (None, 3.2), ("gpt2", "small"): (None, None)}
    for (model, size), (ind_rmse, coil_rmse) in cases.items():
        for variant, ms, rmse in (("eager", 4.0, None), ("inductor", 2.0, ind_rmse), ("coil", 1.5, coil_rmse)):
            r = w.new_record(model=model, size=size, mode="infer", variant=variant, batch=8, seq=256, hidden=512,
                             layers=4, compile_mode="default")
            status = "ref" if variant == "eager" else "ok" if rmse is None else "mismatch"
            r.update(status=status, ms=ms, kernels=3, ms_rounds=[ms, ms], rmse_ratio=rmse,
                     mismatch=None if rmse is None else f"RMSE ratio {rmse}")
    w.write()
    md = (tmp_path / "a.md").read_text()
    row = {line.split("|")[1].strip(" *"): line for line in md.splitlines() if line.startswith("| **")}
    assert "| 0.75 | 0.75 (0.75-0.75) |" in row["resnet"]
    assert row["resnet"].endswith("(alike: the same RMSE, so timed) |")
    for model in ("convnext", "vit"):
        assert "| - | - |" in row[model] and "alike" not in row[model]
    assert ("- small and large together, default, infer: coil/Inductor 0.75 over 2 rows, the highest 0.75; none "
            "above 1.0; without a ratio (not measured, or a side failed): large vit, large convnext; both compilers "
            "fail the accuracy check alike (timed, counted): large resnet") in md


def test_the_call_before_timing_says_what_dynamo_compiled_in_it_and_why() -> None:
    """A variant whose next call compiles again (here: a new input size) shows it in
    its record before the timed rounds: the frame and Dynamo's recompile reason."""
    import torch._dynamo

    from bench.models import _call_before_timing

    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False)
    f(torch.ones(3))
    rec: dict[str, object] = {}
    _call_before_timing(lambda: f(torch.ones(3)), torch.device("cpu"), rec)
    assert rec["before_timing_compiles"] == []
    _call_before_timing(lambda: f(torch.ones(5)), torch.device("cpu"), rec)
    compiles = rec["before_timing_compiles"]
    assert isinstance(compiles, list) and len(compiles) == 1 and "size mismatch" in compiles[0], compiles
    assert isinstance(rec["before_timing_s"], float)
    torch._dynamo.reset()


def test_back_to_back_time_is_the_wall_time_of_a_loop() -> None:
    import time

    import torch

    from bench.timing import back_to_back_s, measure

    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.005)

    start = time.perf_counter()
    s = back_to_back_s(step, torch.device("cpu"), target_s=0.1)
    elapsed = time.perf_counter() - start
    # a sleep lasts at least what it asks for; a loaded machine (CI) may stretch every call
    # alike (the full suite beside a census: 20 ms a call), so the bound is the whole run's:
    # a time per call, 1 + 3n calls in all, not the time of a loop of n or 2n calls
    assert len(calls) >= 1 + 3 * 3  # one call to size the loops, then n and 2n
    assert 0.004 <= s < elapsed / 6, (s, elapsed, len(calls))
    assert measure(step, torch.device("cpu"), quick=True, wall=True).wall_s is None  # the CPU's median is wall time


def test_resume_runs_only_what_is_missing(tmp_path: Path) -> None:
    """Eager alone compiles nothing, so this is quick: a first run measures
    inference; a resumed run with both steps measures training only."""
    base = ["--suite", "models", "--device", "cpu", "--size", "tiny", "--only", "bert", "--variants", "eager",
            "--rounds", "1", "--threads", "1", "--out", str(tmp_path), "--name", "r"]
    assert main([*base, "--mode", "infer"]) == 0
    (first,) = json.loads((tmp_path / "r.json").read_text())
    assert main([*base, "--resume"]) == 0
    records = json.loads((tmp_path / "r.json").read_text())
    assert [(r["mode"], r["status"]) for r in records] == [("infer", "ref"), ("train", "ref")]
    assert records[0] == first


def test_errors_keep_the_ops_own_message() -> None:
    """A failed case's error names what failed: Dynamo's fake-tensor failure puts the
    op's own error after a long list of its arguments, and a wrapped error's cause
    is the part that says why."""
    from bench.models import _error

    args = ", ".join(f"FakeTensor(..., device='cuda:0', size=(8, 8, 256, 64), dtype=torch.bfloat16)" for _ in range(6))
    e = RuntimeError(f"Dynamo failed to run FX node with fake tensors: call_function sdpa(*({args}), **{{}}): "
                     "got RuntimeError('Expected attn_mask dtype to be bool or float or to match query dtype')")
    text = _error(e)
    assert text.startswith("RuntimeError: Dynamo failed") and "Expected attn_mask dtype" in text
    try:
        try:
            raise ValueError("the real reason")
        except ValueError as inner:
            raise RuntimeError("x" * 600) from inner
    except RuntimeError as outer:
        assert _error(outer).endswith("caused by ValueError: the real reason")


def test_warm_up_compiles_in_other_processes_and_the_run_finds_the_cache(tmp_path: Path) -> None:
    """--warm-jobs: the cases compile first in spawned processes, into the run's
    caches; the timed run then loads coil's graphs from coil's graph cache (none
    compiled again) and records each variant's cold first call from the warm-up.
    With --warm-chunk 1 each case is warmed just before it is measured, and every
    record says where its case's time went."""
    argv = ["--suite", "models", "--device", "cpu", "--size", "tiny", "--only", "bert,gpt2", "--variants",
            "eager,coil", "--mode", "infer", "--rounds", "1", "--threads", "1", "--out", str(tmp_path), "--name", "w",
            "--warm-jobs", "2", "--warm-chunk", "1"]
    assert main(argv) == 0
    records = json.loads((tmp_path / "w.json").read_text())
    assert {r["model"] for r in records} == {"bert", "gpt2"}
    for coil in (r for r in records if r["variant"] == "coil"):
        assert coil["status"] == "ok", coil.get("error") or coil.get("mismatch")
        assert coil["cold_first_call_s"] > 0 and "warm_up_error" not in coil
        assert coil["coil_graphs"] >= 1 and coil["coil_graphs_cached"] == coil["coil_graphs"]
        assert set(coil["phases_s"]) == {"copy", "warm", "kernels", "peak"}
        phases = {"build", "reference", "prepare", "before_timing", "timing", "late_check", "cleanup"}
        assert phases == set(coil["case_phases_s"])
        assert all(v >= 0 for v in (*coil["phases_s"].values(), *coil["case_phases_s"].values()))
    eager = next(r for r in records if r["variant"] == "eager")
    assert "cold_first_call_s" not in eager
    md = (tmp_path / "w.md").read_text()
    assert "cold first call s I / c" in md and "warm-up" in md


def test_warm_up_compiles_a_compilers_modes_in_one_process() -> None:
    """reduce-overhead compiles the default mode's graphs: one warm-up job a case
    and compiler compiles both modes in order, so the second finds the first's
    graphs cached instead of compiling them cold beside it."""
    from bench.hf_models import SIZES
    from bench.models import VARIANTS, Case, warm_jobs

    cases = [Case(name, SIZES["tiny"], mode, {k: {} for k in VARIANTS}) for name, mode in (("bert", "infer"),
                                                                                           ("gpt2", "train"))]
    assert warm_jobs(cases) == [
        ("bert", SIZES["tiny"], "infer", (("inductor", "default"), ("inductor", "reduce-overhead"))),
        ("bert", SIZES["tiny"], "infer", (("coil", "default"), ("coil", "reduce-overhead"))),
        ("gpt2", SIZES["tiny"], "train", (("inductor", "default"), ("inductor", "reduce-overhead"))),
        ("gpt2", SIZES["tiny"], "train", (("coil", "default"), ("coil", "reduce-overhead"))),
    ]


def test_resume_measures_again_what_another_coil_measured(tmp_path: Path) -> None:
    """A record measured with another coil_source is not taken as done by
    --resume; a merged file marks the rows of an older source."""
    from bench.models_report import Writer

    base = ["--suite", "models", "--device", "cpu", "--size", "tiny", "--only", "bert", "--variants", "eager",
            "--rounds", "1", "--threads", "1", "--out", str(tmp_path), "--name", "r", "--mode", "infer"]
    assert main(base) == 0
    path = tmp_path / "r.json"
    (first,) = json.loads(path.read_text())
    from coil.graph_cache import coil_source_hash

    assert first["coil_source"] == coil_source_hash()[:12]
    path.write_text(json.dumps([dict(first, coil_source="0123456789ab", started="earlier")]))
    assert main([*base, "--resume"]) == 0
    (again,) = json.loads(path.read_text())
    assert again["coil_source"] == first["coil_source"] and again["started"] != "earlier"

    info = {"device": "cpu", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "cpp", "dtype": "float32", "threads": 1, "rounds": 1, "started": "b",
            "coil_source": "new"}
    w = Writer(tmp_path, "m", info, [], ("default",))
    for model, source in (("gpt2", "old"), ("bert", "new")):
        for variant in ("eager", "coil"):
            r = w.new_record(model=model, size="cpu", mode="infer", compile_mode="default", variant=variant,
                             batch=2, seq=64, hidden=128, layers=2)
            r.update(status="ref" if variant == "eager" else "ok", ms=1.0, kernels=3, coil_source=source)
    w.write()
    md = (tmp_path / "m.md").read_text()
    gpt2, bert = (next(ln for ln in md.splitlines() if ln.startswith(f"| **{m}**")) for m in ("gpt2", "bert"))
    assert gpt2.endswith("ok (older coil) |") and bert.endswith("ok |"), md
    assert "measured with another version of coil's source than the last run's (new" in md


def test_rows_show_the_ratio_of_each_round(tmp_path: Path) -> None:
    """`by round`: coil's time over Inductor's in each interleaved round, their
    median and range, and the geomean of the medians."""
    from bench.models_report import Writer

    info = {"device": "cpu", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "cpp", "dtype": "float32", "threads": 1, "rounds": 3, "started": "a"}
    w = Writer(tmp_path, "m", info, [], ("default",))
    for variant, rounds in (("eager", [3.0, 3.0, 3.0]), ("inductor", [1.0, 2.0, 1.0]), ("coil", [0.9, 2.2, 0.8])):
        r = w.new_record(model="gpt2", size="cpu", mode="infer", compile_mode="default", variant=variant, batch=2,
                         seq=64, hidden=128, layers=2)
        r.update(status="ref" if variant == "eager" else "ok", ms=sorted(rounds)[1], ms_rounds=rounds, kernels=3)
    w.write()
    md = (tmp_path / "m.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| **gpt2**"))
    assert "| 0.90 | 0.90 (0.80-1.10) |" in row, row  # the ratio of medians: 0.9 / 1.0
    assert "| **geomean infer** | (1) |  |  |  | 0.90 | 0.90 | 3.00 |" in md, md
    assert "by round (each row's median of its rounds' ratios) 0.90" in md


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_do_bench_times_at_least_min_calls_of_a_slow_step() -> None:
    """A step slower than the pace's repeats (a large model's training step, ~15 ms,
    against 30 ms of repeats) is still timed `min_calls` times a round: do_bench
    alone would have repeated it twice."""
    import time

    from bench import timing

    x = torch.ones(1 << 20, device="cuda")
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.01)  # the host's part of a 10 ms step
        x.add_(1)

    seconds = timing.cuda_median_s(step, warmup_ms=1, rep_ms=1, min_calls=8)
    timed = calls
    assert 0.009 < seconds < 0.1
    calls = 0
    timing.cuda_median_s(step, warmup_ms=1, rep_ms=1)
    # each count has do_bench's 5 estimating calls and one warm-up call in it
    assert timed >= 8 + 5 + 1 and calls <= 5 + 1 + 1 + 1, (timed, calls)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_slow_first_call_does_not_stretch_a_timing() -> None:
    """A variant's first call after another's timing may be slow; the repeats are
    sized from the faster of two calls, so one slow call of 0.3 s does not make
    do_bench repeat a 10 ms step for (min_calls + 1) * 0.3 s."""
    import time

    from bench import timing

    x = torch.ones(1 << 20, device="cuda")
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.3 if calls == 1 else 0.01)
        x.add_(1)

    t0 = time.perf_counter()
    seconds = timing.cuda_median_s(step, warmup_ms=1, rep_ms=1, min_calls=8)
    spent = time.perf_counter() - t0
    assert 0.009 < seconds < 0.05
    # 0.3 s, the second estimating call, do_bench's first, 5 estimating, 1 warm-up and
    # about 9 repeats: about 0.5 s, where an estimate of 0.3 s would repeat for 2.7 s
    assert spent < 1.2, (spent, calls)


def test_the_header_names_the_least_calls_a_timing_makes(tmp_path: Path) -> None:
    from bench.models_report import Writer

    info = {"device": "cuda", "device_name": "x", "torch": "t", "triton": "t", "transformers": "t", "python": "p",
            "coil_target": "triton", "dtype": "bfloat16", "rounds": 9, "rep_ms": 30, "min_calls": 8,
            "started": "a"}
    w = Writer(tmp_path, "h", info, [], ("default",))
    w.write()
    assert "9 rounds (30 ms of do_bench repeats a timing, at least 8 calls)" in (tmp_path / "h.md").read_text()


@pytest.mark.parametrize("name", ["resnet", "vit"])
def test_a_classifier_is_traced_once_for_all_its_training_steps(name: str) -> None:
    """transformers' classification loss settles config.problem_type on its first
    call; make_case settles it first, so the timed steps after the checked one do
    not make Dynamo trace the forward again (it did for ViT and the three conv nets)."""
    import copy

    import torch._dynamo
    from torch._dynamo.utils import counters

    from bench.hf_models import CHECK_STEPS, make_case
    from bench.models import step_call

    torch._dynamo.reset()
    counters.clear()
    model, inputs = make_case(name, "train", "cpu")
    assert model.config.problem_type == "single_label_classification"
    f = torch.compile(copy.deepcopy(model), backend="eager")
    CHECK_STEPS["train"](f, inputs)
    after_check = counters["stats"]["unique_graphs"]
    call = step_call(f, f._orig_mod, inputs, "train", False)
    call()
    call()
    assert after_check >= 1 and counters["stats"]["unique_graphs"] == after_check
    torch._dynamo.reset()


def test_a_model_built_again_is_a_copy_of_the_same_weights_and_random_state() -> None:
    """make_case builds each model once and copies it for the next case (the suite
    asks for every model in inference, then in training): the copy has the weights
    and leaves the random generators as a fresh build does, and shares no storage."""
    import random

    import bench.hf_models as hf

    def case(mode: str) -> tuple[torch.nn.Module, torch.Tensor, object]:
        model, _ = hf.make_case("gpt2", mode, "cpu")
        return model, torch.get_rng_state(), random.getstate()

    hf._BUILT.clear()
    fresh, fresh_rng, fresh_py = case("infer")
    again, again_rng, again_py = case("train")
    assert len(hf._BUILT) == 1 and again.training and not fresh.training
    assert torch.equal(fresh_rng, again_rng) and fresh_py == again_py
    pairs = list(zip(fresh.state_dict().values(), again.state_dict().values(), strict=True))
    assert pairs and all(torch.equal(a, b) for a, b in pairs)
    assert not any(a.data_ptr() == b.data_ptr() for a, b in pairs if a.numel())
    with torch.no_grad():
        next(again.parameters()).add_(1.0)  # the cached model is not the one handed out
    third, _, _ = case("infer")
    assert len(hf._BUILT) == 1 and torch.equal(next(third.parameters()), next(fresh.parameters()))
    hf._BUILT.clear()
