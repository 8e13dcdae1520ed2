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
not the decompositions'."""
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
        for layout in ("on", "off"):
            opts = {"channels_last": layout, "graph_cache": False}
            variants[f"coil channels_last={layout}"] = (
                lambda o=opts: torch.compile(copy.deepcopy(model), backend="coil", options=o)(**inputs))
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
            print(f"  {label:26s} RMSE against float64 {err:.4g}  ({err / base:.2f} of eager's)", flush=True)


if __name__ == "__main__":
    main()
