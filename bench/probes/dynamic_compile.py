"""CPU probe: compile time of a graph Dynamo recompiles with symbolic sizes.

A model is called at one size, then at a second: Dynamo recompiles the second
call's graph with symbolic sizes, and its guards (Swin's: about 260) are what
coil's lower reads into size rules (passes/symbolic.py: SizeMap.of).  For each
model named on the command line (swin, gpt2; default both) the probe builds it
from a tiny config (random weights, nothing downloaded), compiles it with
$BACKEND (coil, the default, or inductor) with fresh cache folders
(COIL_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR: nothing compiled before is found), and prints
the wall time of the first and second calls, one thread.  With $OF=1 (coil only)
it first captures the second graph's inputs and times SizeMap.of on them three
times (the first with coil's caches cold; the graph cache's two keys and lower
each map a graph's sizes once).  Give each model its own process for cold
figures: the second model's compile finds the first's caches warm.

    python3 bench/probes/dynamic_compile.py swin gpt2
    BACKEND=inductor python3 bench/probes/dynamic_compile.py swin

Session 51 (this VM, one thread, each run its own process, back to back):
Swin's second call 54.9 s at 21b0536 and 36.7 s after e76dd95 (a rule the others
imply left out, each guard's equality read once per ShapeEnv); Inductor 84.8 s
(its first call 16.6 s against coil's 3.4; 28.4 s for the second with its caches
kept from an earlier run).  GPT-2's second call 1.93-1.97 s either way.  With OF=1,
SizeMap.of on Swin's 48-pixel graph: 8.1 s cold and 1.5 s again before, 3.4 s and
0.0 s after.

Session 52 (the same VM, the census running on the other core): SizeMap.of summed
over Swin's recompile (the link's key, the AOT graph's key, lower) 4.93 + 4.19 + 0.08
s at 7c18ec6, 4.99 + 0.08 s at 5d6159f (the link keyed by the guards as Dynamo holds
them, 5322b7d; guard_rules 1.96-2.27 -> 1.36-1.59 s on its equalities, 5d6159f).
The whole second call took 38-50 s on either side in eight runs: this VM's noise is
larger than the 4 s saved.  With nothing else running (two runs a side): SizeMap.of
9.42 and 8.95 s at 7c18ec6, 5.48 and 4.63 s at a4a582f; the call 41.2-43.2 s and
37.3-45.4 s.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.getcwd())
os.environ.setdefault("COIL_CACHE_DIR", tempfile.mkdtemp(prefix="coil-dyn-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-dyn-"))
os.environ.setdefault("COIL_EAGER_FALLBACK", "0")
import torch  # noqa: E402
import transformers  # noqa: E402

import coil  # noqa: E402,F401  (registers the backend)


def build(name: str) -> tuple[torch.nn.Module, list[Any], Callable[[torch.nn.Module, Any], Any]]:
    torch.manual_seed(0)
    if name == "swin":
        cfg = transformers.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                      window_size=4)
        model = transformers.SwinModel(cfg).eval()
        return model, [torch.randn(2, 3, s, s) for s in (32, 48)], lambda m, x: m(pixel_values=x).last_hidden_state
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=100, n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg).eval()
        return model, [torch.randint(0, 100, (2, s)) for s in (8, 13)], lambda m, x: m(input_ids=x).logits
    raise SystemExit(f"unknown model {name!r}: swin or gpt2")


def time_size_map(model: torch.nn.Module, inputs: list[Any], call: Callable[[torch.nn.Module, Any], Any]) -> None:
    from coil.passes.symbolic import SizeMap

    graphs: list[list[Any]] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(list(example_inputs))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        for x in inputs:
            call(compiled, x)
    for k in range(3):
        start = time.perf_counter()
        SizeMap.of(graphs[-1])
        print(f"  SizeMap.of, call {k + 1}: {time.perf_counter() - start:.2f} s")


def main() -> None:
    torch.set_num_threads(1)
    backend = os.environ.get("BACKEND", "coil")
    for name in sys.argv[1:] or ["swin", "gpt2"]:
        model, inputs, call = build(name)
        if backend == "coil" and os.environ.get("OF") == "1":
            time_size_map(model, inputs, call)  # first: coil's caches are cold in a fresh process
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend)
        with torch.no_grad():
            for k, x in enumerate(inputs):
                start = time.perf_counter()
                got = call(compiled, x)
                took = time.perf_counter() - start
                torch.testing.assert_close(got, call(model, x), atol=1e-4, rtol=1e-4)
                print(f"{name} {backend} call {k + 1} {tuple(x.shape)}: {took:.2f} s")


if __name__ == "__main__":
    main()
