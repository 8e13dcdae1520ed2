"""The two-process side of tests/test_collectives.py: each rank runs every case
once (compiling with coil and running eagerly), and writes what it saw to
`<out>/rank<r>.json` for the test module to judge.  On device "cpu" the ranks
talk through gloo and coil compiles for the cpp and reference targets; on
"cuda" each rank takes GPU `rank`, the ranks talk through NCCL and coil compiles
for triton."""

from __future__ import annotations

import datetime
import glob
import json
import os
import traceback
from typing import Any, Callable

import torch


def _group() -> Any:
    import torch.distributed as dist

    return dist.group.WORLD


def _api_fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Through the public functional API: waits come right after each collective."""
    import torch.distributed._functional_collectives as fc

    g = _group()
    y = x * 2 + 1
    a = fc.all_reduce(y, "sum", g)
    gathered = fc.all_gather_tensor(a + x.sin(), 0, g)
    r = fc.reduce_scatter_tensor(gathered.cos() * 3, "sum", 0, g)
    t = fc.all_to_all_single(r + 1, None, None, g)
    b = fc.broadcast(t * y, 1, g)
    return b + r, gathered.sum(0)


def _ops_fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The _c10d_functional ops themselves, with compute between each collective
    and its wait."""
    c = torch.ops._c10d_functional
    name = _group().group_name
    y = x * 2 + 1
    a = c.all_reduce(y, "sum", name)
    z = x.sin() * w  # while all_reduce is in flight
    g = c.all_gather_into_tensor(w + 1, 2, name)  # w + 1 in flight too
    a = c.wait_tensor(a)
    u = (a + z).relu()  # while all_gather is in flight
    g = c.wait_tensor(g)
    r = c.reduce_scatter_tensor(g * u.repeat(2, 1), "sum", 2, name)
    v = z.exp()
    r = c.wait_tensor(r)
    return r + v, u.sum(1)


def _collectives_in(debug_dir: str) -> int:
    n = 0
    for path in glob.glob(os.path.join(debug_dir, "**", "output_code.py"), recursive=True):
        with open(path) as f:
            n += sum(1 for ln in f if "_c10d_functional." in ln and "wait_tensor" not in ln and "=" in ln)
    return n


def _fresh_dynamo() -> None:
    """A fresh Dynamo with coil's and Dynamo's counters cleared, before a case."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def _outcome(got: Any, want: Any) -> dict[str, Any]:
    """A case's largest difference from eager and what Dynamo and coil counted."""
    from torch._dynamo.utils import counters

    return {
        "max_err": max(float((a - b).abs().max()) for a, b in zip(got, want)),
        "eager": counters["coil"].get("eager", 0),
        "compiled": counters["coil"].get("compiled", 0),
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs": counters["stats"].get("unique_graphs", 0),
    }


def _targets(device: str) -> tuple[str, ...]:
    return ("triton",) if device == "cuda" else ("cpp", "reference")


def _options(device: str, **more: Any) -> dict[str, Any]:
    """coil's options for a case: its device's first target, no graph cache, and
    sanitize and verify on (a buffer freed while a collective or a reader of its
    wait still needs it gives a wrong result)."""
    return {"target": _targets(device)[0], "graph_cache": False, "sanitize": True, "verify": True, **more}


def _compiled_case(fn: Callable[..., Any], inputs: list[torch.Tensor], target: str, debug_dir: str) -> dict[str, Any]:
    _fresh_dynamo()
    want = fn(*inputs)
    # sanitize: every free poisons its storage, so a buffer freed while a collective or
    # a reader of its wait still needs it gives a wrong result
    cf = torch.compile(fn, backend="coil", options={"target": target, "graph_cache": False, "debug_dir": debug_dir,
                                                    "sanitize": True, "verify": True})
    got = cf(*inputs)
    return {**_outcome(got, want), "collectives_in_wrapper": _collectives_in(debug_dir)}


def _mlp(device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    # the middle weight alone fills a 1 MiB bucket (DDPOptimizer's least first bucket)
    return torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.Tanh(),
                               torch.nn.Linear(512, 4)).to(_device(device))


def _device(device: str) -> torch.device:
    """The rank's device: the CPU, or its own GPU (set by worker)."""
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def _ddp_train(compiled: bool, rank: int, device: str, steps: int = 3) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    # 1 MiB buckets: several all-reduces, so Dynamo's DDPOptimizer splits the graph
    # the inner module compiled (torch.compile of the DDP module itself graph-breaks at
    # DDP's _inside_ddp_forward in this torch, and nothing compiles): Dynamo sees the
    # active DDP module and its DDPOptimizer splits the graph at the buckets
    inner = _mlp(device)
    dev = _device(device)
    model = DDP(torch.compile(inner, backend="coil", options=_options(device)) if compiled else inner,
                bucket_cap_mb=1, device_ids=[dev.index] if dev.type == "cuda" else None)
    run = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data: the gradients' all-reduce matters
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=gen).to(dev), torch.randn(8, 4, generator=gen).to(dev)
        loss = torch.nn.functional.mse_loss(run(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _ddp_case(rank: int, device: str) -> dict[str, Any]:
    _fresh_dynamo()
    eager = _ddp_train(False, rank, device)
    got = _ddp_train(True, rank, device)
    start = [p.detach() for p in _mlp(device).parameters()]
    return {**_outcome(got, eager), "moved": max(float((a - b).abs().max()) for a, b in zip(eager, start))}


def _tp_train(compiled: bool, rank: int, device: str, debug_dir: str, steps: int = 3) -> list[torch.Tensor]:
    """A tensor-parallel MLP (DTensor): the first Linear split by columns, the second
    by rows, whose partial sums an all_reduce in the forward graph adds up."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    dev = _device(device)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).to(dev)
    parallelize_module(model, init_device_mesh(dev.type, (2,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    run = torch.compile(model, backend="coil", options=_options(device, debug_dir=debug_dir)) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        loss = run(torch.randn(8, 16, generator=gen).to(dev)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _fsdp2_train(compiled: bool, rank: int, device: str, steps: int = 3) -> list[torch.Tensor]:
    """FSDP2 as torchtitan applies it: each layer compiled, then sharded.  In this
    torch FSDP2's hooks are never traced (torch._dynamo.disable), so its all-gathers
    and reduce-scatters run eagerly between the compiled layers."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    dev = _device(device)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).to(dev)
    mesh = init_device_mesh(dev.type, (2,))
    for i in (0, 2):
        if compiled:
            model[i] = torch.compile(model[i], backend="coil", options=_options(device))
        fully_shard(model[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        loss = model(torch.randn(8, 16, generator=gen).to(dev)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _fsdp2_case(rank: int, device: str) -> dict[str, Any]:
    _fresh_dynamo()
    eager = _fsdp2_train(False, rank, device)
    got = _fsdp2_train(True, rank, device)
    return _outcome(got, eager)


def _tp_case(rank: int, device: str, debug_dir: str) -> dict[str, Any]:
    _fresh_dynamo()
    eager = _tp_train(False, rank, device, debug_dir)
    got = _tp_train(True, rank, device, debug_dir)
    return {**_outcome(got, eager), "collectives_in_wrapper": _collectives_in(debug_dir)}


def worker(rank: int, world: int, store: str, out: str, device: str = "cpu") -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    dev = _device(device)
    gen = torch.Generator().manual_seed(rank)
    x, w = torch.randn(4, 6, generator=gen).to(dev), torch.randn(4, 6, generator=gen).to(dev)
    cases: dict[str, Callable[[], dict[str, Any]]] = {}
    for target in _targets(device):
        cases[f"api_{target}"] = lambda t=target: _compiled_case(_api_fn, [x], t, os.path.join(out, f"dbg_api_{t}_{rank}"))
        cases[f"ops_{target}"] = lambda t=target: _compiled_case(_ops_fn, [x, w], t, os.path.join(out, f"dbg_ops_{t}_{rank}"))
    cases["ddp"] = lambda: _ddp_case(rank, device)
    cases["fsdp2"] = lambda: _fsdp2_case(rank, device)
    cases["tp"] = lambda: _tp_case(rank, device, os.path.join(out, f"dbg_tp_{rank}"))
    results: dict[str, Any] = {}
    for name, case in cases.items():
        try:
            results[name] = case()
        except Exception:
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
