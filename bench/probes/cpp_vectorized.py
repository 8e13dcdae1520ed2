"""CPU probe: which `omp simd` loops of coil's C++ kernels GCC leaves scalar, in
real models.  For each model named on the command line (bench/hf_models.py names;
default all of them), in $MODE (infer, the default, or train: forward and
backward), the graphs AOTAutograd hands a backend at the `cpu` size are compiled by
coil for the cpp target up to kernel_gen (nothing run), and each module's C++ is
compiled with coil's flags and -fopt-info-vec: every `omp simd` loop GCC did not
vectorize is printed with its kernel, its line and GCC's first reason.  Session 38
found so a softmax over rows of 32000 whose reciprocal's bool guard kept the
dividing loop scalar (10.1 ms a call against eager's 1.3).  Run from the repository
root: `MODE=train python3 bench/probes/cpp_vectorized.py resnet llama`."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.getcwd())

import coil  # noqa: E402
from bench.hf_models import ALL_MODELS  # noqa: E402
from bench.probes.common import aot_graphs  # noqa: E402
from coil.backends.cpp import build, prelude  # noqa: E402
from coil.ir.module import CompiledModule  # noqa: E402


def simd_loops(cpp: str) -> list[tuple[int, int]]:
    """Each `omp simd` loop of a C++ source as (first line, last line), 1-based:
    the `for` after the pragma to its closing brace."""
    lines = cpp.splitlines()
    out = []
    for i, ln in enumerate(lines):
        if "#pragma omp simd" not in ln:
            continue
        depth, j = 0, i + 1
        while j < len(lines):
            depth += lines[j].count("{") - lines[j].count("}")
            if depth <= 0 and "{" in "".join(lines[i + 1:j + 1]):
                break
            j += 1
        out.append((i + 2, j + 1))
    return out


def vectorized(loops: list[tuple[int, int]], report: str) -> set[tuple[int, int]]:
    """The loops GCC's report (-fopt-info-vec) says it vectorized: it names a loop
    by its pragma's line or some line inside it."""
    done = [int(m.group(1)) for m in re.finditer(r":(\d+):\d+: optimized: loop vectorized", report)]
    return {lp for lp in loops if any(lp[0] - 1 <= d <= lp[1] for d in done)}


def gcc_report(source: str, workdir: str, what: str = "all") -> tuple[str, str]:
    """(the C++ of a compiled module's source, GCC's -fopt-info-vec-`what` report on
    it compiled with coil's flags).  -fno-ipa-icf: GCC folds a kernel identical to
    another into a call of it, and reports no loop of the copy."""
    m = re.search(r"_cpp_source = r?'{3}(.*?)'{3}", source, re.S)
    if m is None:
        return "", ""
    cpp = m.group(1)
    path = os.path.join(workdir, "k.cpp")
    with open(path, "w") as f:
        f.write(cpp)
    cmd = [build.compiler(), *build.compile_flags(), "-I", prelude.header_dir(), "-c", path, "-o",
           os.path.join(workdir, "k.o"), f"-fopt-info-vec-{what}", "-fno-ipa-icf"]
    return cpp, subprocess.run(cmd, capture_output=True, text=True, check=False).stderr


def scalar_loops(source: str, workdir: str) -> tuple[int, list[tuple[str, int, str, str]]]:
    """(the module's `omp simd` loops, those left scalar: (kernel, line, the loop's
    first statement, GCC's first reason inside it))."""
    cpp, report = gcc_report(source, workdir)
    if not cpp:
        return 0, []
    missed = [(int(r.group(1)), r.group(2)) for r in re.finditer(r"k\.cpp:(\d+):\d+: missed: (.*)", report)
              if "couldn't vectorize loop" not in r.group(2)]
    loops = simd_loops(cpp)
    done = vectorized(loops, report)
    lines = cpp.splitlines()
    out = []
    for lo, hi in loops:
        if (lo, hi) in done:
            continue
        kernel = next((k.group(1) for ln in reversed(lines[:lo]) if (k := re.match(r'extern "C" void (\w+)\(', ln))),
                      "?")
        reason = next((w for at, w in missed if lo <= at <= hi), "?")
        out.append((kernel, lo, lines[lo].strip()[:90] if lo < len(lines) else "", reason[:120]))
    return len(loops), out


def main() -> None:
    warnings.filterwarnings("ignore")
    mode = os.environ.get("MODE", "infer")
    total = scalar = library = 0
    with tempfile.TemporaryDirectory() as work:
        for name in sys.argv[1:] or list(ALL_MODELS):
            for gi, (gm, ins) in enumerate(aot_graphs(name, mode)):
                module = coil.default_pipeline().run(gm, ins, until="kernel_gen",
                                                     options=coil.Options(target="cpp", graph_cache=False))
                assert isinstance(module, CompiledModule)
                loops, left = scalar_loops(module.source, work)
                # a loop GCC made a memcpy or memset, or one block copy (a copy, an accumulator
                # array's reset or keep) is as fast as a vector loop: counted apart
                calls = [x for x in left if "__builtin_mem" in x[3] or "MEM <unsigned char[" in x[3]]
                left = [x for x in left if x not in calls]
                total, scalar, library = total + loops, scalar + len(left), library + len(calls)
                print(f"{name} {mode} graph {gi}: {loops} simd loops, {len(left)} scalar, "
                      f"{len(calls)} made block copies", flush=True)
                for kernel, line, body, reason in left:
                    print(f"    {kernel} line {line}: {body}\n        {reason}", flush=True)
    print(f"all: {total} simd loops, {scalar} left scalar, {library} made block copies")


if __name__ == "__main__":
    main()
