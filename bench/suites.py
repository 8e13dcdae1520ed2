"""The named suites: which workloads, at which sizes, on which device, through which
variants."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench import workloads as w

VARIANTS: tuple[str, ...] = ("eager", "inductor", "coil")

bf16 = torch.bfloat16
f32 = torch.float32


@dataclass(frozen=True)
class Suite:
    name: str
    device: str  # "cuda" | "cpu"
    workloads: tuple[w.Workload, ...]
    variants: tuple[str, ...] = VARIANTS
    compile_times: bool = True  # cold/warm compile timings in fresh processes
    compile_variants: tuple[str, ...] = ("inductor", "coil")
    quick: bool = False  # shorter timing loops, a smaller copy, cold compile timing only


def gpu() -> Suite:
    return Suite("gpu", "cuda", (
        w.seed(32768, 4096, f32),
        w.softmax(32768, 4096, bf16),
        w.layer_norm(32768, 4096, bf16),
        w.rms_norm(32768, 4096, bf16),
        w.gelu_bias_residual(32768, 4096, bf16),
        w.cross_entropy(16384, 32000, bf16),
        w.silu_mul(32768, 8192, bf16),
        w.add_transpose(8192, f32),
        w.transformer(8, 1024, 1024, 16, bf16),
        w.chain(1024, 1024),
    ))


def cpu() -> Suite:
    return Suite("cpu", "cpu", (
        w.seed(4096, 1024, f32),
        w.softmax(4096, 1024, f32),
        w.layer_norm(4096, 1024, f32),
        w.rms_norm(4096, 1024, f32),
        w.gelu_bias_residual(4096, 1024, f32),
        w.cross_entropy(1024, 8000, f32),
        w.silu_mul(4096, 1024, f32),
        w.add_transpose(2048, f32),
        w.transformer(4, 128, 256, 4, f32),
        w.chain(64, 256),
    ))


def smoke() -> Suite:
    """Tiny and quick: used by tests/test_bench_smoke.py.  Inductor's cold C++ build
    takes tens of seconds on a small CPU and a fresh process about ten, so the smoke
    suite leaves out Inductor and the compile timings."""
    return Suite("smoke", "cpu", (w.seed(64, 128, f32),), variants=("eager", "coil"), compile_times=False,
                 quick=True)


SUITES = {"gpu": gpu, "cpu": cpu, "smoke": smoke}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise SystemExit(f"unknown suite {name!r}; known: {sorted(SUITES)}")
    return SUITES[name]()


def find_workload(suite: str, name: str) -> w.Workload:
    for wl in get_suite(suite).workloads:
        if wl.name == name:
            return wl
    raise SystemExit(f"suite {suite!r} has no workload {name!r}")
