"""CPU probe: the models suite's models under `torch.compile(dynamic=True)`, each
compiled once and called at three shapes, against eager.

For each model named on the command line (bench/hf_models.py names; default all
17) and each step (infer and one training step, the models suite's), the model is
built at the tiny size, compiled with coil (cpp, or $TARGET) with `dynamic=True`,
and called at (sequence 16, batch 2), (24, 3) and (40, 2): models built from the
same seed have the same weights at every shape, so one compiled copy serves them
all, judged at each shape against an eager copy stepped through the shapes before
it (a training step moves BatchNorm's running statistics).  Each call is judged as tests/test_hf_models.py judges (against eager and
float64), and the probe prints per shape ok / FAIL / ERROR, the graphs coil
compiled and those it ran eagerly.  BACKEND=eager or aot_eager runs Dynamo's
backends instead, to tell coil's defects from the harness's or Dynamo's.  A model
whose weights depend on the sequence length (Whisper's position table) cannot be
called at a second shape: its ERROR says so.

Session 39: every model and step ok at all three shapes, no graph eager, but
ModernBERT's inference at the second and third (RMSE 2.7e-4 against eager's 3e-8),
which BACKEND=eager gives the same: not coil's, nor Dynamo's.  An eager ModernBERT
called at one shape and then another gives those logits too (0.0015 from a fresh
model with the same weights): the model keeps state from its first call.

Session 40: ResNet's and MobileNetV2's training failed at the second and third
shapes (a BatchNorm's running mean, RMSE against float64 0.0016 where eager's is
4e-10), with Dynamo's `eager` and `aot_eager` backends too, and at the code of
session 39's run: the reference was a fresh model at each shape, the compiled copy
one stepped through the shapes before.  The reference is stepped too now: both
pass at all three shapes, and ModernBERT's inference too (the state it keeps from
earlier calls is the reference's as well).  AOTAutograd's cache (backends/aot_cache.py)
under dynamic=True: the 17 run twice in two processes with the same cache folders
and COIL_AOT_CACHE_NODES=0 gave the same verdicts, the second loading its symbolic
training graphs through the cache (Llama 2 of 2, T5 4, ResNet 4, Wav2Vec2 12 of 13
and one through the graph cache's link).  Run from the repository root:
`python3 bench/probes/dynamic_models.py llama t5`.

Session 49 (`IMAGES=32,48,64 python bench/probes/dynamic_models.py mobilenet_v2`):
inference ok at all three, training ok at 32 and 48 and FAIL at 64 on the stem
convolution's weight gradient (RMSE against float64 0.00338, eager's 0.0012).  A
sweep without `dynamic=True` (automatic dynamic: static at 2x32, then one dynamic
graph) failed the same gradient at 3x48 by far more (0.212 against 0.0012); the
same sweep with Inductor failed it at 2x32 (0.0589 against 0.02) and at 3x48 as
coil did (0.211 against 0.0012): both compilers give that gradient alike, away
from eager's, so it is no defect of coil's alone."""
from __future__ import annotations

import copy
import dataclasses
import os
import sys
import warnings

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

from bench.hf_models import ALL_MODELS, CHECK_STEPS, SIZES, Counts, counting, expected, judge, make_case, seed_all  # noqa: E402

SHAPES = ((16, 2), (24, 3), (40, 2))  # (sequence, batch)
# IMAGES=32,48,64: the image models' side at each shape too (else the tiny size's 32)
IMAGES = tuple(int(v) for v in os.environ.get("IMAGES", "").split(",") if v)


def sweep(name: str, mode: str, target: str, backend: str) -> tuple[list[str], Counts]:
    torch._dynamo.reset()
    counts, compiled, verdicts = Counts(), None, []
    stepped: torch.nn.Module | None = None  # the eager reference, stepped through the shapes as the compiled copy is
    for i, (seq, batch) in enumerate(SHAPES):
        size = dataclasses.replace(SIZES["tiny"], seq=seq, batch=batch)
        if IMAGES:
            size = dataclasses.replace(size, image=IMAGES[i])
        try:
            model, inputs = make_case(name, mode, "cpu", size=size)
            if compiled is None:
                stepped = copy.deepcopy(model)
                options = {"options": {"target": target}} if backend == "coil" else {}
                compiled = torch.compile(copy.deepcopy(model), backend=backend, dynamic=True, **options)
            elif any(a.shape != b.shape for a, b in zip(model.state_dict().values(),
                                                          compiled.state_dict().values())):
                verdicts.append("ERROR its weights depend on the shape")
                break
            assert stepped is not None
            # a training step moves BatchNorm's running statistics: the reference at this
            # shape is the model after the earlier shapes' steps, as the compiled copy is
            want = expected(stepped, inputs, mode)
            CHECK_STEPS[mode](stepped, inputs)
            seed_all(0)
            with counting(counts):
                got = CHECK_STEPS[mode](compiled, inputs)
            v = judge(got, want)
            verdicts.append("ok" if v.passed else "FAIL " + v.reason[:120])
        except Exception as e:  # a probe: report it and go on
            verdicts.append("ERROR " + (str(e).splitlines() or [type(e).__name__])[0][:160])
            break
    torch._dynamo.reset()
    return verdicts, counts


def main() -> None:
    warnings.filterwarnings("ignore")
    torch._dynamo.config.cache_size_limit = 64
    target, backend = os.environ.get("TARGET", "cpp"), os.environ.get("BACKEND", "coil")
    for name in sys.argv[1:] or list(ALL_MODELS):
        for mode in CHECK_STEPS:
            verdicts, counts = sweep(name, mode, target, backend)
            eager = [m[:140] for m in counts.eager_fallbacks]
            aot = f" (through AOTAutograd's cache: {counts.aot_cached})" if counts.aot_cached else ""
            print(f"{name:16s} {mode}: {verdicts} compiled={counts.compiled}{aot} cached={counts.cached} "
                  f"eager={eager}", flush=True)


if __name__ == "__main__":
    main()
