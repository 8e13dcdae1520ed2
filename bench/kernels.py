"""`python -m bench.kernels --suite gpu [--only NAME] [--target triton]`: print the
generated output_code.py of each workload without running it (inputs on the meta
device), so codegen for the GPU sizes can be read on a machine without a GPU.  The
cpp target's kernels do run once, on the CPU inputs: they cannot skip meta tensors."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from bench.suites import get_suite


def dump(suite: str, only: list[str], target: str, out: Path | None) -> int:
    import coil  # noqa: F401 - registers the backend

    for wl in get_suite(suite).workloads:
        if only and wl.name not in only:
            continue
        inst = wl.build(torch.device("cpu"))  # generators need a real device; then to meta
        inputs = inst.inputs
        if target != "cpp":  # C++ kernels run on the CPU inputs (CPU sizes are small): a meta data_ptr is 0
            inputs = tuple(t.to("meta") for t in inst.inputs)
            if isinstance(inst.fn, torch.nn.Module):
                inst.fn.to("meta")
        d = Path(tempfile.mkdtemp(prefix=f"coil-{wl.name}-")) if out is None else out / wl.name
        torch._dynamo.reset()
        fn = torch.compile(inst.fn, backend="coil", options={"target": target, "debug_dir": str(d)})
        try:
            inst.step(fn, inputs)
        except Exception:  # noqa: BLE001 - meta tensors cannot run; the code is written by then
            pass
        codes = sorted(d.rglob("output_code.py"))
        print(f"# ===== {wl.name}: {wl.description} ({len(codes)} graphs, {d})")
        for c in codes:
            print(c.read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels")
    p.add_argument("--suite", default="gpu")
    p.add_argument("--only", action="append", default=[])
    p.add_argument("--target", default="triton")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    only = [n for o in a.only for n in o.split(",")]
    return dump(a.suite, only, a.target, a.out)


if __name__ == "__main__":
    sys.exit(main())
