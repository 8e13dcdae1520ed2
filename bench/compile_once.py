"""Child process for compile timings: build one workload, compile it with one
variant, time torch.compile and the first call (compile + run), print the result as a JSON line.

    python -m bench.compile_once --suite cpu --workload softmax --variant coil --target cpp
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_once")
    parser.add_argument("--suite", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--variant", required=True, choices=("inductor", "coil"))
    parser.add_argument("--target", default="auto")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    import torch

    from bench.suites import find_workload, get_suite
    from bench.timing import sync
    from bench.variants import make_callable

    import_s = time.perf_counter() - t0
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(get_suite(args.suite).device)
    inst = find_workload(args.suite, args.workload).build(device)
    sync(device)
    t1 = time.perf_counter()
    f = make_callable(args.variant, inst.fn, args.target, args.threads)
    inst.step(f, inst.inputs)
    sync(device)
    first_call_s = time.perf_counter() - t1
    print(json.dumps({"first_call_s": first_call_s, "import_s": import_s}), flush=True)
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (seconds of compile-pool and profiler shutdown)


if __name__ == "__main__":
    sys.exit(main())
