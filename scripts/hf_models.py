"""Run the `transformers` model suite (bench/hf_models.py) through coil and print one
line a model and mode, then a summary.  Nothing is downloaded: every model is built
from a tiny config with random weights.

    python scripts/hf_models.py                              # cpu, target cpp
    python scripts/hf_models.py --device cuda                # target triton
    python scripts/hf_models.py --only gpt2,t5 --mode train --attn eager

Exit status 0 when every case passed (numbers within the dashboard's tolerance and
no graph run eagerly), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    from bench.hf_models import MODELS, MODES, run_case

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--target", default=None, help="coil target (default: triton on cuda, cpp on cpu)")
    ap.add_argument("--only", default="", help="comma-separated model names: " + ",".join(MODELS))
    ap.add_argument("--mode", default="", help="infer or train (default both)")
    ap.add_argument("--attn", default=None, help="attention implementation for every model: sdpa or eager "
                    "(default: sdpa where the model has it)")
    ap.add_argument("--traceback", action="store_true", help="print the traceback of a case that raised")
    args = ap.parse_args(argv)

    target = args.target or ("triton" if args.device.startswith("cuda") else "cpp")
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {list(MODELS)}")
    modes = [args.mode] if args.mode else list(MODES)

    passed = {m: 0 for m in modes}
    total = {m: 0 for m in modes}
    for name in names:
        for mode in modes:
            total[mode] += 1
            try:
                result = run_case(name, mode, args.device, target, attn=args.attn)
            except Exception as e:
                msg = " ".join(f"{type(e).__name__}: {e}".split())
                print(f"{name:16s} {mode:5s} FAIL  raised {msg[:400]}", flush=True)
                if args.traceback:
                    traceback.print_exc()
                continue
            passed[mode] += result.passed
            print(result.line(), flush=True)

    by_mode = ", ".join(f"{m} {passed[m]}/{total[m]}" for m in modes)
    n_pass, n_total = sum(passed.values()), sum(total.values())
    print(f"hf models: {n_pass}/{n_total} passed ({by_mode}) on {target} {args.device}")
    return 0 if n_pass == n_total else 1


if __name__ == "__main__":
    sys.exit(main())
