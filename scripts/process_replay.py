"""Process replay, as tinygrad does it: dump the generated output_code.py of every
graph the tests and the bench workloads compile, on every target, then compare two
dumps.  A change meant to move code without changing behaviour must come out with
every source byte-identical; a change of policy shows its differences, to be
reviewed one by one.

    python scripts/process_replay.py dump OUT [--tests PATH ...] [--no-tests] [--no-bench] [-n 2]
    python scripts/process_replay.py compare A B [--show 5]

`dump` runs pytest on the tests (default: the whole tests/ folder) with
COIL_DUMP_SOURCES=OUT/sources, so that every compiled module's source is written
there, named by its graph, inputs and options (Options.dump_sources), and the graph
cache in a fresh folder at a fixed path; then it compiles the bench workloads without running them: the CPU
suite for the cpp, reference and triton targets, and the GPU suite for triton on
CUDA, traced with fake CUDA tensors so that no GPU is needed.  `compare` counts the
sources that are identical, that differ and that only one dump has, and prints the
first lines of the first differences; it exits 1 when any source differs or is
missing from either side.  The folder a C++ module loads its library from (the
run's cache, a test's temporary folder) is not code and is compared as one
placeholder.  Run it from the repository root.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def dump(out: Path, tests: list[str], run_tests: bool, bench: bool, workers: int) -> int:
    sources = out / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    # a fresh graph cache (a source is dumped where the pipeline runs, which a hit in an
    # older cache would skip; the tests of the cache need it on), at the same path for
    # every dump: the cpp target's sources name it
    cache = Path(tempfile.gettempdir()) / "coil-process-replay-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "COIL_DUMP_SOURCES": str(sources.resolve()), "COIL_CACHE_DIR": str(cache),
           "TRITON_INTERPRET": "1"}
    rc = 0
    if run_tests:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), *tests]
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, env=env)
        print(f"pytest exited {rc}", flush=True)
    if bench:
        code = subprocess.call([sys.executable, __file__, "_bench"], env=env)
        rc = rc or code
    n = len(list(sources.glob("*.py")))
    print(f"{n} sources in {sources}")
    return rc


def dump_bench() -> int:
    """Compile every workload of the CPU suite for each CPU target and of the GPU
    suite for triton on CUDA (fake tensors), until kernel_gen: the module's source
    is dumped by Options.dump_sources."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    sys.path.insert(0, os.getcwd())
    import coil
    from bench import suites

    pipeline = coil.default_pipeline()
    count = 0
    for wl in suites.cpu().workloads:
        inst = wl.build(torch.device("cpu"))
        gm = make_fx(inst.fn)(*inst.inputs)
        for target in ("cpp", "reference", "triton"):
            pipeline.run(gm, list(inst.inputs), "kernel_gen", coil.Options.from_env().replace(target=target))
            count += 1
    for wl in suites.gpu().workloads:  # built on the CPU, traced with fake tensors, compiled for fake CUDA ones
        inst = wl.build(torch.device("cpu"))
        with FakeTensorMode(allow_non_fake_inputs=True):
            cuda = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")
                    if isinstance(x, torch.Tensor) else x for x in inst.inputs]
        try:
            try:
                gm = make_fx(inst.fn, tracing_mode="fake")(*inst.inputs)
            except AssertionError:  # a module's real parameters inside: traced for real, on the CPU
                gm = make_fx(inst.fn)(*inst.inputs)
            pipeline.run(gm, cuda, "kernel_gen", coil.Options.from_env().replace(target="triton"))
            count += 1
        except Exception as e:  # noqa: BLE001 - a workload this CPU build cannot trace for CUDA: said, not hidden
            print(f"bench: gpu {wl.name} not dumped: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del inst
    print(f"bench: {count} modules compiled", flush=True)
    return 0


# where a cpp module loads its library from: the cache folder of the run (a test's
# temporary folder), not code; compared as one placeholder
_CACHE_PATH = re.compile(r"load_library\(_cpp_source, '[^']*'\)")


def _code(path: Path) -> str:
    return _CACHE_PATH.sub("load_library(_cpp_source, <cache>)", path.read_text())


def compare(a: Path, b: Path, show: int) -> int:
    sa = {p.name: p for p in (a / "sources").glob("*.py")}
    sb = {p.name: p for p in (b / "sources").glob("*.py")}
    same, differ = [], []
    for name in sorted(sa.keys() & sb.keys()):
        (same if _code(sa[name]) == _code(sb[name]) else differ).append(name)
    only_a, only_b = sorted(sa.keys() - sb.keys()), sorted(sb.keys() - sa.keys())
    print(f"identical {len(same)}, different {len(differ)}, only in {a}: {len(only_a)}, only in {b}: {len(only_b)}")
    for name in differ[:show]:
        diff = difflib.unified_diff(sa[name].read_text().splitlines(), sb[name].read_text().splitlines(),
                                    str(sa[name]), str(sb[name]), lineterm="", n=1)
        print("\n".join(list(diff)[:40]))
    return 1 if differ or only_a or only_b else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["_bench"]:
        return dump_bench()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="dump every generated source")
    d.add_argument("out", type=Path)
    d.add_argument("--tests", nargs="*", default=["tests"], help="pytest paths (default: tests)")
    d.add_argument("--no-tests", action="store_true")
    d.add_argument("--no-bench", action="store_true")
    d.add_argument("-n", type=int, default=2, help="pytest workers")
    c = sub.add_parser("compare", help="compare two dumps")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--show", type=int, default=5, help="differences to print")
    a = p.parse_args(args)
    if a.cmd == "dump":
        return dump(a.out, a.tests, not a.no_tests, not a.no_bench, a.n)
    return compare(a.a, a.b, a.show)


if __name__ == "__main__":
    sys.exit(main())
