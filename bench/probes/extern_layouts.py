"""Device probe: which extern results arrive in another layout than the one coil
planned from their meta functions, so that the wrapper's ensure_layout copies them
on every call.  For each model named on the command line (bench/hf_models.py
names; default llama, gpt2, bert, vit, mobilenet_v2), at the models suite's
`small` size in bf16, in $MODE (infer, the default, or train): coil's graphs are
compiled, ensure_layout is wrapped to record every call that converts or copies
(the buffer, planned and actual size, strides and dtype), and for each such buffer
the line of output_code.py that made it is printed.  Run from the repository root
on a CUDA machine."""
import os
import sys
from collections import Counter

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

import coil.backends.runtime as rt  # noqa: E402
from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402
from bench.variants import Capture, record_coil_graphs  # noqa: E402

seen: Counter = Counter()
plain = rt.ensure_layout


def recording(t, size, stride, dtype, name=""):  # type: ignore[no-untyped-def]
    out = plain(t, size, stride, dtype, name)
    if out is not t:
        seen[(name, tuple(size), tuple(stride), str(dtype), tuple(t.stride()), str(t.dtype))] += 1
    return out


rt.ensure_layout = recording


def main() -> None:
    names = sys.argv[1:] or ["llama", "gpt2", "bert", "vit", "mobilenet_v2"]
    mode = os.environ.get("MODE", "infer")
    for name in names:
        seen.clear()
        model, inputs = make_case(name, mode, "cuda", size=SIZES["small"], dtype=torch.bfloat16)
        f = compile_model("coil", "default", model, "triton", None)
        call = step_call(f, model, inputs, mode, False)
        cap = Capture()
        with record_coil_graphs(cap):
            call()
        seen.clear()
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print(f"== {name} {mode}: {sum(seen.values()) // 3} extern results converted or copied a call", flush=True)
        sources = [g.source for g in cap.coil_graphs if g is not None]
        for (buf, size, stride, dtype, got_stride, got_dtype), n in sorted(seen.items()):
            print(f"  {buf}: {n // 3} a call; planned {size} {stride} {dtype}, got strides {got_stride} {got_dtype}")
            for src in sources:
                line = next((ln.strip() for ln in src.splitlines() if ln.strip().startswith(f"{buf} = ")), None)
                if line:
                    print(f"    {line[:300]}")
                    break


if __name__ == "__main__":
    main()
