"""Device probe: what is live at the peak of a real model's training step, for
Inductor and coil.  For each model named on the command line (bench/hf_models.py
names; default qwen2), at the models suite's $SIZE (small, the default, or large)
in bf16: the step's peak (torch.cuda.max_memory_allocated above what was
allocated before it), the bytes the forward saves for the backward (a
saved_tensors_hooks pack hook, parameters left out), and from the CUDA caching
allocator's memory history the blocks live at the peak, grouped by the line of
generated code (coil's output_code.py, Inductor's module) or model code that
allocated them, largest first ($TOP lines, default 30), with the line whose
allocation reached the peak and the bytes live then by module.  The generated modules that allocated blocks are
copied to $OUT (unless $COPY_MODULES is 0).  Run from the repository root on a CUDA machine."""
from __future__ import annotations

import os
import shutil
import sys
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.hf_models import SIZES, make_case  # noqa: E402
from bench.hf_models import _loss as model_loss  # noqa: E402
from bench.models import compile_model, step_call  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
MiB = 2**20


def saved_bytes(f: Any, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(bytes, tensors) the forward saves for the backward: distinct storages that
    are not parameters."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    for p in model.parameters():
        p.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model_loss(f(**inputs))
    loss.backward()
    return sum(seen.values()), len(seen)


def _where(frames: list[dict[str, Any]], copied: dict[str, str]) -> str:
    """The generated-code line that allocated a block, else the first model or
    torch frame."""
    for fr in frames:
        fn = fr.get("filename", "")
        generated = "torchinductor" in fn or os.path.basename(os.path.dirname(fn)).startswith("coil-")
        if generated and fn.endswith(".py") and os.path.exists(fn):
            if fn not in copied:
                copied[fn] = f"gen{len(copied)}_{os.path.basename(fn)}"
                if os.environ.get("COPY_MODULES", "1") == "1":
                    shutil.copy(fn, os.path.join(OUT, copied[fn]))
            try:
                with open(fn) as fh:
                    text = fh.readlines()[fr["line"] - 1].strip()
            except (OSError, IndexError):
                text = "?"
            return f"{copied[fn]}:{fr['line']} {text[:150]}"
    for fr in frames:
        fn = fr.get("filename", "")
        if "transformers" in fn or "bench/" in fn:
            return f"{os.path.basename(fn)}:{fr['line']} {fr.get('name', '')}"
    return " < ".join(f"{os.path.basename(fr.get('filename', ''))}:{fr.get('name', '')}" for fr in frames[:3]) or "?"


def live_at_peak(snapshot: dict[str, Any], copied: dict[str, str]
                 ) -> tuple[int, list[tuple[int, int, str]], str, list[tuple[int, str]]]:
    """(peak bytes over the recording, [(bytes, blocks, where)] live then, where the
    allocation that reached the peak was made, [(bytes, module)] live then by the
    generated module or other code that allocated them)."""
    live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    peak_frames: list[dict[str, Any]] = []
    for dev in snapshot["device_traces"]:
        for ev in dev:
            act = ev["action"]
            if act == "alloc":
                live[ev["addr"]] = (ev["size"], ev.get("frames", []))
                total += ev["size"]
                if total > peak:
                    peak, at_peak, peak_frames = total, dict(live), ev.get("frames", [])
            elif act == "free_completed" and ev["addr"] in live:
                total -= live.pop(ev["addr"])[0]
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    modules: dict[str, int] = defaultdict(int)
    for size, frames in at_peak.values():
        where = _where(frames, copied)
        g = groups[where]
        g[0] += size
        g[1] += 1
        modules[where.split(":")[0] if where.startswith("gen") else "other"] += size
    return (peak, sorted(((b, n, w) for w, (b, n) in groups.items()), reverse=True), _where(peak_frames, copied),
            sorted(((b, m) for m, b in modules.items()), reverse=True))


def main() -> None:
    names = sys.argv[1:] or ["qwen2"]
    size = SIZES[os.environ.get("SIZE", "small")]
    copied: dict[str, str] = {}
    for name in names:
        for v in ("inductor", "coil"):
            model, inputs = make_case(name, "train", "cuda", size=size, dtype=torch.bfloat16)
            f = compile_model(v, "default", model, "triton", None)
            call = step_call(f, model, inputs, "train", False)
            for _ in range(3):
                call()
            sb, sn = saved_bytes(f, model, inputs)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            call()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            torch.cuda.memory._record_memory_history(max_entries=200000)
            call()
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            hist_peak, groups, reached, modules = live_at_peak(snap, copied)
            print(f"== {name} {v}: step peak {peak / MiB:.1f} MiB above {base / MiB:.1f}; saved for backward "
                  f"{sb / MiB:.1f} MiB in {sn} tensors; recorded peak {hist_peak / MiB:.1f} MiB", flush=True)
            print(f"  the peak was reached by: {reached}")
            print("  live at the peak by module: " + ", ".join(f"{m} {b / MiB:.1f} MiB" for b, m in modules))
            for b, n, w in groups[:int(os.environ.get("TOP", 30))]:
                print(f"  {b / MiB:9.1f} MiB {n:4d}  {w}")
            del f, call, model, inputs, snap
            torch._dynamo.reset()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
