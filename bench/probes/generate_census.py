"""Probe: `model.generate` through coil, as people compile text generation.  For
each causal or sequence-to-sequence model type named on the command line
(default: GENERATORS below), built tiny as bench/probes/model_census.py builds it,
greedy generation of NEW tokens after a prompt of PROMPT tokens, batch 2, in two
ways:

- `dynamic`: `model.forward = torch.compile(model.forward, backend="coil")` and the
  default DynamicCache.  The cache grows every step, so Dynamo recompiles with
  the lengths symbolic (automatic dynamic shapes) after the second step.
- `static`: `generate(cache_implementation="static", compile_config=...)`, the
  way transformers' docs compile generation: transformers compiles the decoding
  step itself (backend coil, its options in place of a mode; `_compile_all_devices`
  lets it on the CPU), over a StaticCache that the step updates in place.

Each is compared with eager generation: the tokens must be the same and each
step's scores allclose to eager's (rtol/atol 1e-4, float32).  Prints one line per
model and way: ok (graphs compiled or loaded, graphs coil ran eagerly), `not
compiled` (transformers ran no step through coil), mismatch (the first step that
differs), error, or `eager fails` (not counted).  Run from the repository root.
COIL_TARGET picks the target (default cpp on the CPU), DEVICE=cuda runs on the
GPU (target triton), COMPILE_MODE=reduce-overhead compiles in that mode
(torch.compile then takes no options: the target is coil's default).

Session 30 (2026-12-04, the 2-vCPU VM, torch 2.13, transformers 5.25), 17 models:
at 5793f8c every one of the 34 runs is ok on cpp, each graph compiled (none run
eagerly); six of the models (gpt2 llama mistral gemma2 t5 falcon, both ways) are
ok on triton under TRITON_INTERPRET=1.  Before, at 4ac5bd0, 9 of the 34 ran
graphs eagerly (all ok, by the fallback):
- a size as an operand (`aten.add.Tensor(arange, s7)`: BART's, Bloom's and
  Falcon's positions past the cache), and `torch.sym_sum` of sizes (Falcon);
- a SymInt that may be 0 (Mistral's and Gemma2's sliding-window cache length,
  ranged -oo..4094 by Dynamo): now a `u` symbol bound on entry, its lower bound
  0 an assumption a negative call leaves to eager (SymbolFacts.assumed);
- a static graph computing with a SymInt Dynamo specialized (`Sym(8) + 1`);
- C++ kernels calling std::max, which the prelude does not declare."""
from __future__ import annotations

import copy
import logging
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from bench.probes.model_census import build, eager_fails, run_compiled  # noqa: E402

GENERATORS: tuple[tuple[str, str], ...] = (
    ("gpt2", "AutoModelForCausalLM"),
    ("llama", "AutoModelForCausalLM"),
    ("mistral", "AutoModelForCausalLM"),
    ("qwen2", "AutoModelForCausalLM"),
    ("qwen3", "AutoModelForCausalLM"),
    ("phi", "AutoModelForCausalLM"),
    ("gemma", "AutoModelForCausalLM"),
    ("gemma2", "AutoModelForCausalLM"),
    ("opt", "AutoModelForCausalLM"),
    ("bloom", "AutoModelForCausalLM"),
    ("gpt_neox", "AutoModelForCausalLM"),
    ("falcon", "AutoModelForCausalLM"),
    ("gptj", "AutoModelForCausalLM"),
    ("olmo", "AutoModelForCausalLM"),
    ("mixtral", "AutoModelForCausalLM"),
    ("t5", "AutoModelForSeq2SeqLM"),
    ("bart", "AutoModelForSeq2SeqLM"),
)
BATCH, PROMPT, NEW = 2, 8, 8


def _compile_kwargs(target: str, mode: str | None) -> dict:
    """torch.compile's arguments: coil's options, or a mode (it takes one of the two)."""
    return {"backend": "coil", "mode": mode} if mode else {"backend": "coil", "options": {"target": target}}


def generate(model: torch.nn.Module, way: str, compiled: bool, target: str, mode: str | None = None,
             device: str = "cpu") -> tuple[torch.Tensor, list[torch.Tensor]]:
    from transformers import CompileConfig

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (BATCH, PROMPT), generator=gen).to(device)
    kwargs: dict = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "max_new_tokens": NEW,
                    "min_new_tokens": NEW, "do_sample": False, "output_scores": True,
                    "return_dict_in_generate": True}
    if way == "static":
        kwargs["cache_implementation"] = "static"
        if compiled:
            cfg = CompileConfig(**{"mode": None, **_compile_kwargs(target, mode)})
            cfg._compile_all_devices = True
            kwargs["compile_config"] = cfg
        else:
            kwargs["disable_compile"] = True
    elif compiled:
        model.forward = torch.compile(model.forward, **_compile_kwargs(target, mode))
    with torch.no_grad():
        out = model.generate(**kwargs)
    return out.sequences, list(out.scores)


def one(model_type: str, auto: str, way: str, target: str, mode: str | None = None, device: str = "cpu") -> str:
    try:
        model = build(model_type, auto).eval().to(device)
        model.config.use_cache = True  # the census builds without a cache
        model.generation_config.use_cache = True
        model.generation_config.pad_token_id = 0
        model.generation_config.decoder_start_token_id = 0  # the seq2seq models start their decoder there
        want_ids, want_scores = generate(copy.deepcopy(model), way, False, target, mode, device)
    except Exception as e:  # noqa: BLE001 - the model at this size, not a compiler
        return eager_fails(e)
    ran = run_compiled(lambda: generate(copy.deepcopy(model), way, True, target, mode, device))
    if isinstance(ran, str):
        return ran
    (got_ids, got_scores), counts, took = ran
    ran = counts.compiled + counts.cached  # compiled now, or loaded from coil's graph cache
    graphs = (f"{counts.compiled} graphs compiled, {counts.cached} cached, {counts.dynamo_graphs} Dynamo graphs, "
              f"{len(counts.eager_fallbacks)} run eagerly, {took:.1f} s")
    if ran == 0:
        return f"not compiled ({graphs}): transformers ran no step through coil"
    for step, (g, w) in enumerate(zip(got_scores, want_scores)):
        if not torch.allclose(g, w, rtol=1e-4, atol=1e-4):
            err = (g - w).abs().max().item()
            return f"mismatch ({graphs}): step {step}'s scores differ by up to {err:.3g}"
    if not torch.equal(got_ids, want_ids):
        return f"mismatch ({graphs}): tokens {got_ids.tolist()} against eager's {want_ids.tolist()}"
    if counts.eager_fallbacks:
        return f"ok, with fallbacks ({graphs}): {' '.join(counts.eager_fallbacks[0].split())[:200]}"
    return f"ok ({graphs})"


def main() -> None:
    torch.set_num_threads(1)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    device = os.environ.get("DEVICE", "cpu")
    target = os.environ.get("COIL_TARGET", "cpp" if device == "cpu" else "triton")
    mode = os.environ.get("COMPILE_MODE") or None
    ways = os.environ.get("WAYS", "dynamic,static").split(",")
    wanted = sys.argv[1:]
    for model_type, auto in [r for r in GENERATORS if not wanted or r[0] in wanted]:
        for way in ways:
            print(f"{model_type:12s} {way:8s} {one(model_type, auto, way, target, mode, device)}", flush=True)


if __name__ == "__main__":
    main()
