"""Probe: how far a convolution model's inference lands from float64, by layout and
compiler.  The models suite's accuracy check fails the large ResNet's inference on
a GPU for Inductor and coil alike (bfloat16, RMSE against float64 about 3x eager's),
while on the CPU coil passes (0.95x eager's) and Inductor does not (3.27x).  For each
model named on the command line (bench/hf_models.py names; default resnet), at the
models suite's $SIZE (default large) in bfloat16 on $DEVICE (default cuda if there is
one), this prints the logits' RMSE against the float64 model for: eager as built
(NCHW), eager with the model and input channels-last, coil with its channels-last
layout on and off (`Options.channels_last`), Inductor, and AOTAutograd running
eager kernels (`aot_eager`, and `aot_eager_decomp_partition`: Inductor's
decompositions).  Each line gives the RMSE and its ratio to eager's, the ratio the
suite's check bounds by 2.  Run from the repository root:
`python3 bench/probes/conv_accuracy.py resnet`.

H100, session 47 (before the two AOTAutograd lines): eager 0.0894 in both layouts,
coil with either layout and Inductor 0.2749.  CPU (DEVICE=cpu): eager NCHW 0.0793,
channels-last 0.0750, coil 0.0750 / 0.0793 by layout, Inductor 0.2594, aot_eager and
aot_eager_decomp_partition 0.0793: on the CPU Inductor's error is its own kernels',
not the decompositions'.  What makes it: a half value's round trip between fused
ops.  Eager rounds every bfloat16 op's result; coil's C++ target rounds each one as
eager does; Inductor (emulate_precision_casts off, its default) and coil's Triton
target (Options.emulate_precision_casts, off by default) keep float32 between
fused ops.  ResNet-50's stages at 64 x 64, batch 2, on the CPU with coil's Triton
target under the interpreter: eager 0.0692, Triton 0.1472 (Inductor's C++ 0.1472
too), Triton with emulate_precision_casts 0.0586; the error grows stage by stage
(0.0008, 0.0040, 0.0178, 0.1523, 0.2657 against eager's 0.0008, 0.0038, 0.0156,
0.1048, 0.1623), and one bottleneck block drifts by a mean of -2.5e-4 where eager's
is +9e-6.  The `coil emulate_precision_casts` line shows it on a GPU."""
from __future__ import annotations

import copy
import os
import sys
import warnings
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402


def logits(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.sqrt(torch.mean(torch.square(a.double() - b.double()))))


def main() -> None:
    warnings.filterwarnings("ignore")
    device = os.environ.get("DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
    size = SIZES[os.environ.get("SIZE", "large")]
    for name in sys.argv[1:] or ["resnet"]:
        model, inputs = make_case(name, "infer", device, size=size, dtype=torch.bfloat16)
        ref_model = copy.deepcopy(model).double()
        with torch.no_grad():
            ref = logits(ref_model(**{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}))
        del ref_model
        cl = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in inputs.items()}
        variants: dict[str, Callable[[], Any]] = {
            "eager NCHW": lambda: model(**inputs),
            "eager channels-last": lambda: copy.deepcopy(model).to(memory_format=torch.channels_last)(**cl),
        }
        coil_runs: dict[str, dict[str, Any]] = {
            "coil channels_last=on": {"channels_last": "on"},
            "coil channels_last=off": {"channels_last": "off"},
            # Triton: every half intermediate rounded as eager rounds it (the C++ target always does)
            "coil emulate_precision_casts": {"emulate_precision_casts": True},
        }
        for label, extra in coil_runs.items():
            opts = {"graph_cache": False, **extra}
            variants[label] = lambda o=opts: torch.compile(copy.deepcopy(model), backend="coil", options=o)(**inputs)
        variants["inductor"] = lambda: torch.compile(copy.deepcopy(model))(**inputs)
        # AOTAutograd with eager kernels: as traced, and through Inductor's decompositions
        for backend in ("aot_eager", "aot_eager_decomp_partition"):
            variants[backend] = lambda b=backend: torch.compile(copy.deepcopy(model), backend=b)(**inputs)
        base = None
        print(f"== {name} infer, {device}, bfloat16, batch {size.batch}", flush=True)
        for label, run in variants.items():
            torch._dynamo.reset()
            with torch.no_grad():
                err = rmse(logits(run()), ref)
            base = err if base is None else base
            print(f"  {label:30s} RMSE against float64 {err:.4g}  ({err / base:.2f} of eager's)", flush=True)


if __name__ == "__main__":
    main()
