"""The header every coil translation unit includes, and the dtype tables.

The C++ a kernel body calls beyond plain operators (libm under one overloaded name
per function, half-type conversions, NaN-propagating max/min, Python-style integer
division, the run-time checks' error channel, transposed tiles, streaming stores,
the OpenMP reductions `omp simd` cannot express with built-in operators) is
hand-written C++ in include/coil_prelude.h, shipped as package data.  A translation
unit starts with INCLUDE; build.py compiles with -I of the header's folder,
precompiles the header once per build cache, and keys every library on its hash.
The functions here spell, for each dtype, the types and conversions a body uses.
"""

from __future__ import annotations

import os

import torch

from coil.errors import CoilError

# How each dtype lives in memory (the pointer's element type).
STORAGE_TYPES: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "uint16_t",
    torch.bfloat16: "uint16_t",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.bool: "bool",
}

HALF_TYPES = frozenset({torch.float16, torch.bfloat16})

HEADER = "coil_prelude.h"
# the first lines of every translation unit: no code before the #include, which a
# precompiled header requires
INCLUDE = f'// coil C++ kernels: one translation unit per compiled graph.\n#include "{HEADER}"\n'


def header_dir() -> str:
    """The folder of coil_prelude.h in the installed package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def header_text() -> bytes:
    """coil_prelude.h as it is installed (read on each use: a few microseconds, and
    an edited header is seen without a restart)."""
    with open(os.path.join(header_dir(), HEADER), "rb") as f:
        return f.read()


def storage_type(dtype: torch.dtype) -> str:
    if dtype not in STORAGE_TYPES:
        raise CoilError(f"the cpp target does not support dtype {dtype}", stage="kernel_gen")
    return STORAGE_TYPES[dtype]


def compute_type(dtype: torch.dtype) -> str:
    """The C++ type a value of `dtype` is computed in: half types widen to float
    and are rounded only where they are stored (or cast)."""
    return "float" if dtype in HALF_TYPES else storage_type(dtype)


def load_value(dtype: torch.dtype, ref: str) -> str:
    """A stored element as its compute type."""
    if dtype == torch.float16:
        return f"coil_f16_to_f32({ref})"
    if dtype == torch.bfloat16:
        return f"coil_bf16_to_f32({ref})"
    return ref


def store_value(dtype: torch.dtype, value: str) -> str:
    """A computed value as the element stored for `dtype` (round-to-nearest-even)."""
    if dtype == torch.float16:
        return f"coil_f32_to_f16({value})"
    if dtype == torch.bfloat16:
        return f"coil_f32_to_bf16({value})"
    if dtype == torch.bool:
        return f"static_cast<bool>({value})"
    return f"static_cast<{storage_type(dtype)}>({value})"


def round_value(dtype: torch.dtype, value: str) -> str:
    """What a value reads back as after a store of `dtype` (used for values kept in
    registers, so they equal what a load from memory would give)."""
    if dtype == torch.float16:
        return f"coil_round_f16({value})"
    if dtype == torch.bfloat16:
        return f"coil_round_bf16({value})"
    if dtype == torch.bool:
        return f"static_cast<bool>({value})"
    return f"static_cast<{storage_type(dtype)}>({value})"
