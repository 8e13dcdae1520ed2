"""The command line (`coil demo`, `coil explain`), the report tables and the
debug_dir files, on the seed's function and on a chain that frees and reuses."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import coil
from coil.__main__ import main
from coil.backends import kernel_gen
from coil.report import fmt_bytes, is_vendor_extern, lifetimes, short_kernel_name

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

SEED_FILE = '''
import torch

def fn(a, b, c):
    return ((a + b) * c.relu()).sum(dim=-1)

example_inputs = tuple(torch.randn(64, 128) for _ in range(3))
'''

# three matmuls force the pointwise ops between them into buffers of one size, so
# each new buffer can take the storage of one freed a step before
CHAIN_FILE = '''
import torch

def chain(x, w):
    b = x.sin() @ w
    c = b.cos() @ w
    e = (c.exp() + 1) @ w
    return e.softmax(-1)

def chain_inputs():
    return torch.randn(32, 32), torch.randn(32, 32)
'''


def realize_rows(out: str) -> dict[str, list[str]]:
    """The realize table's rows by FX node: [IR node, realized, buffer, rule...]."""
    block = out.split("FX node  IR node", 1)[1].split("\n\n", 1)[0]
    return {ln.split()[0]: ln.split()[1:] for ln in block.splitlines()[1:]}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5_000, f"{path} is only {len(data)} bytes"


# ---- coil demo -----------------------------------------------------------------------------


def test_demo_reference_shows_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--target", "reference"]) == 0
    out = capsys.readouterr().out
    rows = realize_rows(out)
    for op in ("add", "relu", "mul"):
        assert rows[op][:3] == ["Pointwise", "no", "-"] and rows[op][3:] == ["inlined", "into", "buf0"]
    assert rows["sum_1"] == ["Reduction", "yes", "buf0", "output"]
    for header in ("LoweredGraph", "BufferGraph", "ScheduleGraph", "FusedSchedule", "MemoryPlan",
                   "WrapperProgram", "CompiledModule"):
        assert f"-> {header}" in out
    assert "[coil] register_buffer buf0 (ComputedBuffer)" in out
    assert "reads  = {a_1, b_1, c_1}" in out and "writes = {buf0}" in out
    assert "def call(args):" in out and "def ref_per_fused_add_mul_relu_sum_0(" in out
    assert "result matches eager" in out


def test_demo_default_target(capsys: pytest.CaptureFixture[str]) -> None:
    """`auto`: cpp on CPU tensors, triton (through the interpreter without CUDA)."""
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    expected = "triton" if torch.cuda.is_available() else "cpp"
    assert "falling back" not in out
    assert f"output_code.py (target {expected})" in out and "result matches eager" in out


def test_demo_triton(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--target", "triton"]) == 0
    out = capsys.readouterr().out
    assert "falling back" not in out and "@triton.jit" in out and "result matches eager" in out


def test_demo_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--target", "reference", "--size", "8", "24"]) == 0
    out = capsys.readouterr().out
    assert "float32[8, 24]" in out and "result matches eager" in out


def test_demo_falls_back_to_reference_when_backend_is_missing(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(kernel_gen.BACKENDS, "cpp", ("coil.backends.cpp.no_such_module", "CppBackend"))
    assert main(["demo", "--target", "cpp"]) == 0
    out = capsys.readouterr().out
    assert "the cpp backend cannot be imported" in out and "falling back to --target reference" in out
    assert "target reference" in out and "result matches eager" in out


def test_python_m_coil_demo(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "coil", "demo", "--target", "reference"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "result matches eager" in done.stdout


# ---- coil explain --------------------------------------------------------------------------


def test_explain_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, "seed.py", SEED_FILE)
    out_dir = tmp_path / "report"
    assert main(["explain", f"{src}:fn", "--target", "reference", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert realize_rows(out)["mul"][:2] == ["Pointwise", "no"]
    assert "reads  = {a_1, b_1, c_1}" in out
    assert "(no pair was considered: nothing to fuse)" in out
    step0 = re.search(r"^0  ref_per_fused_add_mul_relu_sum_0 .*$", out, re.M)
    assert step0 is not None
    assert "{a_1, b_1, c_1}" in step0.group(0) and "a_1, b_1, c_1" in step0.group(0)
    assert "peak 98560 bytes (0.094 MiB) at step 0" in out
    assert "order strategy: original" in out
    kernels = out.split("== kernels (schedule_kernels): space, stages, accumulators, launches and why ==", 1)[1]
    assert "  ref_per_fused_add_mul_relu_sum_0: persistent group=(64, 128) cpu" in kernels
    assert "      loop 0: buf" in kernels and "launches: chosen by the target's renderer" in kernels
    png = out_dir / "lifetimes.png"
    assert f"lifetime chart: {png}" in out
    check_png(png)


def test_explain_chain_fusion_and_reuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, "chain.py", CHAIN_FILE)
    assert main(["explain", f"{src}:chain", "--target", "reference", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    fusion = out.split("== fusion decisions (fuse) ==", 1)[1].split("resulting steps", 1)[0]
    assert re.search(r"vertical\s+buf\d+ \+ buf\d+\s+fused\s+\d+\s+saves \d+ bytes", fusion)
    assert "buf2 = buf1  # in place, saves 4 KiB" in out  # the cos kernel writes over b, its last reader
    # the softmax's kernel reads the last matmul's result in its loops and writes its
    # output after them, at the same elements: in place too (it once reused buf0,
    # held dead through every step since the first)
    assert "step 6 (ref_per_fused_amax_div_exp_sub_sum_3): buf9 = buf5  # in place, saves 4 KiB" in out
    assert "kernel-internal buffers (kept in registers, never allocated): {" in out
    check_png(tmp_path / "lifetimes.png")


EXTERNS_FILE = """
import torch
import torch.nn.functional as F

def fn(x, w, k):
    y = F.conv2d(x, k, padding=1)                      # convolution: kept on purpose
    z = torch.cat((-y[..., 4:], y[..., :4]), -1)        # lowered: no extern
    s = torch.cumprod(z, -1)                            # no lowering: splits fusion
    return (s.flatten(1) @ w).relu(), torch.sort(s, -1).values

example_inputs = (torch.randn(2, 3, 8, 8), torch.randn(256, 16), torch.randn(4, 3, 3, 3))
"""


def test_explain_lists_externs_that_split_fusion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The externs table names every aten call kept whole but matmul, convolution
    and attention, with its buffer and FX origin; a graph with none says so."""
    src = write(tmp_path, "externs.py", EXTERNS_FILE)
    assert main(["explain", f"{src}:fn", "--target", "cpp", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    body = out.split("== externs that split fusion (not matmul, convolution or attention) ==\n", 1)[1]
    rows = [ln.split() for ln in body.split("\n\n", 1)[0].splitlines()]
    assert rows[0] == ["extern", "aten", "op", "origin"]
    ops = {r[1]: r for r in rows[1:]}
    assert set(ops) == {"aten.cumprod.default", "aten.sort.default"}, rows
    assert ops["aten.cumprod.default"][2] == "cumprod" and re.fullmatch(r"buf\d+", ops["aten.cumprod.default"][0])
    # run, but not listed (the convolution's input is a channels-last copy first on cpp)
    assert re.search(r"extern convolution -> buf\d+", out) and "extern mm -> " in out
    src = write(tmp_path, "seed.py", SEED_FILE)
    assert main(["explain", f"{src}:fn", "--target", "reference", "--out", str(tmp_path)]) == 0
    assert ("externs that split fusion (not matmul, convolution or attention) ==\n"
            "none: every op but matmul, convolution and attention was lowered to kernels") in capsys.readouterr().out


@pytest.mark.parametrize("kernel, vendor", [
    ("aten.mm.default", True), ("aten.addmm.default", True), ("aten._int_mm.default", True),
    ("aten.convolution.default", True), ("aten.convolution_backward.default", True),
    ("aten._scaled_dot_product_flash_attention_for_cpu.default", True),
    ("aten._efficient_attention_backward.default", True),
    ("aten.cumprod.default", False), ("aten.constant_pad_nd.default", False),
    ("prims.convert_element_type.default", False), ("aten.mmm_like.default", False),
])
def test_vendor_externs(kernel: str, vendor: bool) -> None:
    assert is_vendor_extern(kernel) is vendor


LAUNCH_FILE = """
import torch

def fn(y, big, sq, u, v, tall, short):
    for _ in range(6):
        y = y - y.amax(-1, keepdim=True) * 0.5
    return y.softmax(-1), big.sum(), sq + sq.t(), u.t() + v, tall.sum(0), short.amax(0)

example_inputs = (torch.randn(64, 1024), torch.randn(40000), torch.randn(96, 96), torch.randn(80, 96),
                  torch.randn(96, 80), torch.randn(3000, 40), torch.randn(600, 70))
"""


def test_explain_triton_launches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the triton target the last table gives each launch and the rule behind it;
    other targets print no such table."""
    src = write(tmp_path, "launch.py", LAUNCH_FILE)
    assert main(["explain", f"{src}:fn", "--target", "triton", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    launches = out.split("== launches (schedule_kernels, as triton launches them): grid, config and why ==", 1)[1]
    rows = {ln.split()[0]: ln for ln in launches.strip().splitlines()[1:] if ln.startswith("triton_")}
    by_kind = {ln.split()[1]: ln for ln in rows.values()}
    assert set(by_kind) == {"persistent", "split", "combine", "tiled", "columns"}, rows
    # tall.sum(0): a column split; short.amax(0): one looped kernel, 32 columns a program
    assert sum("40 columns reduced down 3000 rows: 24 programs a block of 32 columns" in ln
               for ln in rows.values()) == 1, rows
    assert sum("one program a block of 32 columns merges its partials" in ln for ln in rows.values()) == 1, rows
    assert "reduced down the columns of what it reads: 32 neighbouring columns a program" in by_kind["columns"]
    tiled = sorted(ln for ln in rows.values() if ln.split()[1] == "tiled")
    # sq + sq.t() (row-major out), u.t() + v (column-major out, walked in memory order): each
    # tile's programs start along the output in memory
    assert len(tiled) == 2, tiled
    assert sum("programs start along the rows" in ln for ln in tiled) == 2, tiled
    assert "grid(64, 1) XBLOCK=1, RBLOCK=1024, num_warps=1" in by_kind["persistent"]
    assert "8 chained row reductions (>= 8): one row a program" in by_kind["persistent"]
    assert sum("1 row(s) (<= 128) of 40000 (>= 16384): 157 programs a row" in ln for ln in rows.values()) == 1
    assert "a transposed read: 64x64 tiles" in by_kind["tiled"]
    kernels = out.split("== kernels (schedule_kernels)", 1)[1].split("== wrapper", 1)[0]
    assert "space: split 1 row(s) x 40000 into 157 parts of 256" in kernels  # big.sum()
    assert "space: rows 70 x 600, looped, down the columns" in kernels  # short.amax(0)
    assert "max accumulator, lanes" in kernels
    assert main(["explain", f"{src}:fn", "--target", "cpp", "--out", str(tmp_path)]) == 0
    assert "== launches" not in capsys.readouterr().out


@pytest.mark.parametrize("spec, message", [
    ("seed.py:nope", "no function 'nope' in"),
    ("missing.py:fn", "no such file"),
    ("seed.py", "expected FILE.py:FUNCTION"),
    ("noinputs.py:fn", "no example inputs for fn"),
])
def test_explain_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, message: str) -> None:
    write(tmp_path, "seed.py", SEED_FILE)
    write(tmp_path, "noinputs.py", "def fn(a):\n    return a + 1\n")
    assert main(["explain", str(tmp_path / spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coil explain: error:") and message in err
    assert not (tmp_path / "out").exists()


# ---- the report's pieces -------------------------------------------------------------------


def test_lifetimes_of_the_seed(seed_graph: tuple[torch.fx.GraphModule, list[torch.Tensor]]) -> None:
    gm, inputs = seed_graph
    plan = coil.default_pipeline().run(gm, inputs, until="plan_memory", options=coil.Options(target="reference"))
    lives = {lt.name: lt for lt in lifetimes(plan)}
    assert [(lt.kind, lt.born, lt.freed, lt.nbytes) for lt in lives.values()] == [
        ("input", -1, 0, 32768), ("input", -1, 0, 32768), ("input", -1, 0, 32768), ("output", 0, None, 256),
    ]
    assert list(lives) == ["a_1", "b_1", "c_1", "buf0"]


def test_short_names_and_bytes() -> None:
    assert short_kernel_name("triton_red_fused_mean_tanh_2") == "red_fused_mean_tanh_2"
    long = short_kernel_name("triton_per_fused_add_amax_div_exp_mul_relu_sub_sum_0")
    assert long.startswith("per_fused_add_") and long.endswith("…_0") and len(long) <= 26
    assert [fmt_bytes(n) for n in (256, 98560, 1310720)] == ["256 B", "96.2 KiB", "1.25 MiB"]


# ---- debug_dir -----------------------------------------------------------------------------


def test_debug_dir_of_a_graph_without_buffers(tmp_path: Path) -> None:
    """A graph of no inputs and no results (what AOTAutograd hands over for sdpa
    under OpInfo, its work past a graph break): its lifetime chart has nothing to
    draw a legend of, and it raised in numpy's array_split."""
    from torch.fx.experimental.proxy_tensor import make_fx

    compiled = coil.compile_graph(make_fx(lambda: ())(), [],
                                  options=coil.Options(target="cpp", debug_dir=str(tmp_path)))
    assert compiled() == ()
    check_png(tmp_path / "0_graph" / "lifetimes.png")


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
def test_debug_dir_files_and_standalone_output_code(
        tmp_path: Path, seed_graph: tuple[torch.fx.GraphModule, list[torch.Tensor]], target: str) -> None:
    gm, inputs = seed_graph
    compiled = coil.compile_graph(gm, inputs, options=coil.Options(target=target, debug_dir=str(tmp_path / "debug")))
    debug = tmp_path / "debug" / "0_graph"  # each graph's files in a folder of their own
    stages = coil.default_pipeline().stages
    for i, name in enumerate(stages):
        assert (debug / f"{i:02d}_{name}.txt").read_text().strip()
    assert "inlined into buf0" in (debug / "realize_table.txt").read_text()
    assert "nothing to fuse" in (debug / "fusion_log.txt").read_text()
    assert (debug / "output_code.py").read_text() == compiled.source
    check_png(debug / "lifetimes.png")
    # conftest set TRITON_INTERPRET=1, which the child inherits: triton runs on the CPU there too
    run = subprocess.run([sys.executable, "output_code.py"], cwd=debug, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"\d+\.\d+ ms per call\n", run.stdout)
