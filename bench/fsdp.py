"""FSDP2 training step of a transformer, eager against Inductor against coil, on
several processes of one host (issue 18's multi-GPU measurement).

Each rank builds the same Llama (bench/hf_models.py at --size; `large` is hidden
2048 and 8 layers), then for each variant a fresh copy is wrapped as torchtitan
does: every decoder layer compiled by the variant's backend (`torch.compile`),
then `fully_shard`ed, then the root sharded.  In the torch these runs use, FSDP2's
hooks are not traceable (`torch._dynamo.disable`), so its all-gathers and
reduce-scatters run between the compiled layers on FSDP2's own streams; the
compilers differ in the layers' kernels.

Per variant it records the first step (compiles included), the median step of
the timed steps (every rank synchronised, the slowest rank's time), the loss of
every step (checked against eager's: the same data on the same weights), peak
memory, and, on CUDA, from a profiler trace of a few steps on rank 0: the time
of the NCCL kernels a step and the fraction of it during which a compute kernel
ran too (communication hidden under compute).  On the CPU (gloo) there are no
kernels to trace: the fraction is recorded as not measured, with the reason.

`python -m bench.fsdp --world 2` (CUDA when there is one: NCCL, one GPU a rank;
else the CPU with gloo) writes bench/results/<name>.json and .md.  The
tests run it on the CPU at the tiny size (tests/test_bench_fsdp.py); it is never
timed in CI."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
VARIANTS = ("eager", "inductor", "coil")


# ---- the overlap figure ------------------------------------------------------------------------


def union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted intervals covering the same time."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def covered(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """The length of time in both unions a and b (each disjoint and sorted)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(kernels: Sequence[tuple[str, float, float]]) -> dict[str, float | None]:
    """From GPU kernels (name, start, end): the communication kernels' time (NCCL's),
    and the fraction of it during which another kernel ran: the share of the
    communication hidden under compute."""
    comm = union([(s, e) for n, s, e in kernels if "nccl" in n.lower()])
    compute = union([(s, e) for n, s, e in kernels if "nccl" not in n.lower()])
    comm_t = sum(e - s for s, e in comm)
    return {"comm_us": comm_t, "compute_us": sum(e - s for s, e in compute),
            "hidden": covered(comm, compute) / comm_t if comm_t > 0 else None}


def traced_kernels(events: list[Any]) -> list[tuple[str, float, float]]:
    """The device-side events of a profiler run (counting.on_device): (name, start
    µs, end µs)."""
    from bench.counting import on_device

    return [(e.name, float(e.time_range.start), float(e.time_range.start + e.time_range.elapsed_us()))
            for e in on_device(events)]


# ---- one rank ----------------------------------------------------------------------------------


def _wrap(model: torch.nn.Module, variant: str, mesh: Any, target: str) -> torch.nn.Module:
    """torchtitan's order: each decoder layer compiled, then sharded; then the root."""
    from torch.distributed.fsdp import fully_shard

    layers = model.model.layers  # type: ignore[union-attr]
    for i in range(len(layers)):
        layer = layers[i]
        if variant == "inductor":
            layer = torch.compile(layer)
        elif variant == "coil":
            layer = torch.compile(layer, backend="coil", options={"target": target})
        layers[i] = layer
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _sync(device: torch.device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def run_variant(variant: str, size_name: str, device: torch.device, dtype: torch.dtype, mesh: Any,
                steps: int, target: str, profile_steps: int) -> dict[str, Any]:
    import torch.distributed as dist

    from bench.hf_models import SIZES, make_case
    from bench.models import model_loss

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # this variant's compiles and graph breaks only
    model, inputs = make_case("llama", "train", str(device), size=SIZES[size_name], dtype=dtype)
    model = _wrap(model, variant, mesh, target)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model_loss(model(**inputs))
        loss.backward()
        opt.step()
        return loss.detach()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t0 = time.perf_counter()
    losses = [step()]
    _sync(device)
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        losses.append(step())
        _sync(device)
        times.append(time.perf_counter() - t0)
    # the slowest rank's time of each step
    mine = torch.tensor(times, dtype=torch.float64, device=device)  # NCCL reduces CUDA tensors only
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    rec: dict[str, Any] = {
        "variant": variant, "first_step_s": round(first_s, 3),
        "step_ms": round(statistics.median(mine.tolist()) * 1e3, 3),
        "losses": [float(x) for x in losses],
        "peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None,
    }
    if device.type == "cuda" and profile_steps > 0:
        from bench.counting import profiled_events

        ov = overlap(traced_kernels(profiled_events(step, profile_steps)))
        rec["comm_ms_per_step"] = round(ov["comm_us"] / profile_steps / 1e3, 3)  # type: ignore[operator]
        rec["compute_ms_per_step"] = round(ov["compute_us"] / profile_steps / 1e3, 3)  # type: ignore[operator]
        rec["hidden"] = None if ov["hidden"] is None else round(ov["hidden"], 3)
        rec["hidden_why"] = "" if ov["hidden"] is not None else "no NCCL kernel in the trace"
    else:
        rec["hidden"] = None
        rec["hidden_why"] = "not measured: no GPU kernels to trace on the CPU (gloo)"
    counters = torch._dynamo.utils.counters
    rec["coil_counts"] = dict(counters["coil"]) if variant == "coil" else {}
    rec["graph_breaks"] = sum(counters["graph_break"].values())
    del model, opt
    torch._dynamo.reset()
    return rec


def worker(rank: int, world: int, store: str, cfg: dict[str, Any]) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(cfg.get("threads") or 1)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    mesh = init_device_mesh(cfg["device"], (world,))
    dtype = torch.bfloat16 if cuda else torch.float32
    records = []
    for variant in cfg["variants"]:
        try:
            records.append(run_variant(variant, cfg["size"], device, dtype, mesh, cfg["steps"], cfg["target"],
                                       cfg["profile_steps"]))
        except Exception as e:  # noqa: BLE001 - recorded, the other variants still run
            records.append({"variant": variant, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
        dist.barrier()
    if rank == 0:
        with open(cfg["out_json"], "w") as f:
            json.dump(records, f)
    dist.destroy_process_group()


# ---- the run -----------------------------------------------------------------------------------


def check(records: list[dict[str, Any]], rtol: float) -> None:
    """Each compiled variant's losses against eager's, step by step."""
    eager = next((r for r in records if r["variant"] == "eager" and "losses" in r), None)
    for r in records:
        if r["variant"] == "eager" or "losses" not in r:
            r.setdefault("check", "error" if "error" in r else "ok")
            continue
        if eager is None:
            r["check"] = "no eager run to compare with"
            continue
        worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], eager["losses"]))
        r["loss_rel_err"] = worst
        r["check"] = "ok" if worst <= rtol else f"loss off by {worst:.3g} (relative) from eager's"


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# FSDP2 training step: {meta['world']} ranks ({meta['device']}), Llama at `{meta['size']}`",
             "", f"torch {meta['torch']}; {meta['dtype']}; {meta['steps']} timed steps; {meta['when']}.", "",
             "Each decoder layer compiled by the variant, then `fully_shard`ed (torchtitan's order); "
             "step: zero_grad, forward with labels, backward, SGD. `step ms`: median over the timed steps of "
             "the slowest rank's time; `hidden`: the share of the NCCL kernels' time during which a compute "
             "kernel ran (rank 0, profiler).", "",
             "| variant | step ms | vs Inductor | first step s | peak MiB | comm ms / step | hidden | check |",
             "|---|--:|--:|--:|--:|--:|--:|---|"]
    ind = next((r.get("step_ms") for r in records if r["variant"] == "inductor"), None)
    for r in records:
        if "error" in r:
            lines.append(f"| {r['variant']} | | | | | | | error: {r['error']} |")
            continue
        rel = f"{r['step_ms'] / ind:.2f}" if ind else "-"
        hid = f"{r['hidden']:.2f}" if r.get("hidden") is not None else "-"
        lines.append(f"| {r['variant']} | {r['step_ms']} | {rel} | {r['first_step_s']} | {r.get('peak_mib') or '-'} "
                     f"| {r.get('comm_ms_per_step', '-')} | {hid} | {r['check']} |")
    why = {r.get("hidden_why") for r in records if r.get("hidden_why")}
    if why:
        lines += ["", *(f"- {w}" for w in sorted(why))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fsdp", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="processes (one GPU each on CUDA)")
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda when there is one")
    p.add_argument("--size", default=None, help="bench/hf_models.py size (default: large on CUDA, tiny on the CPU)")
    p.add_argument("--steps", type=int, default=20, help="timed steps after the first")
    p.add_argument("--profile-steps", type=int, default=3, help="steps traced on CUDA for the overlap figure")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--target", default="auto", help="coil's target")
    p.add_argument("--rtol", type=float, default=None, help="losses' relative tolerance against eager's "
                   "(default: 2e-2 in bfloat16, 1e-4 in float32)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--name", default=None, help="result file name (default: <device>-fsdp)")
    a = p.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and torch.cuda.device_count() < a.world:
        p.error(f"--world {a.world} needs as many GPUs; this host has {torch.cuda.device_count()}")
    if a.world < 2:
        p.error("--world must be at least 2")
    variants = [v for v in a.variants.split(",") if v]
    if bad := [v for v in variants if v not in VARIANTS]:
        p.error(f"unknown variants {bad}; known: {', '.join(VARIANTS)}")
    size = a.size or ("large" if device == "cuda" else "tiny")
    a.out.mkdir(parents=True, exist_ok=True)
    name = a.name or f"{device}-fsdp"
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"device": device, "size": size, "steps": a.steps, "variants": variants, "target": a.target,
               "profile_steps": a.profile_steps, "out_json": os.path.join(tmp, "records.json")}
        mp.spawn(worker, args=(a.world, os.path.join(tmp, "store"), cfg), nprocs=a.world, join=True)
        with open(cfg["out_json"]) as f:
            records = json.load(f)
    dtype = "bfloat16" if device == "cuda" else "float32"
    check(records, a.rtol if a.rtol is not None else (2e-2 if device == "cuda" else 1e-4))
    meta = {"world": a.world, "device": device, "size": size, "torch": torch.__version__, "dtype": dtype,
            "steps": a.steps, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (a.out / f"{name}.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    md = markdown(records, meta)
    (a.out / f"{name}.md").write_text(md)
    print(md)
    return 0 if all(r.get("check") == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
