"""Real `transformers` models through `torch.compile(backend="coil")`, checked in
inference and one training step against eager at Inductor's dashboard tolerance
(bench/hf_models.py builds the models from tiny configs with random weights,
nothing downloaded, and compares).

On the CPU the target is cpp.  The `cuda` cases run the same models with target
triton on a GPU; run them without the interpreter:
    TRITON_INTERPRET=0 python -m pytest -q -m cuda tests/test_hf_models.py

A case passes only when coil compiled its graphs: a graph that coil "ran eagerly"
fails the case unless EXPECTED_FAILURES says why.  Expected failures are strict: once
the defect is fixed the case passes, pytest reports XPASS as a failure, and the entry
must go.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.hf_models import MODELS, MODES, Counts, Verdict, compare, counting, run_case  # noqa: E402

# (model, mode) -> (the exception it raises, why), e.g. (CoilError, "..."): known
# coil defects, the same on every device.  Empty now: T5 and BART training raised CoilError "[lower] (node
# _tensor_constant0) get_attr nodes are not supported" until 2652b43 made tensor
# constants inputs of the compiled module.
EXPECTED_FAILURES: dict[tuple[str, str], tuple[type[BaseException], str]] = {}

# attention written out in torch ops (matmul, softmax, masks) rather than one
# scaled_dot_product_attention call, which coil runs as an Extern: models whose
# attention code differs (GPT-2's Conv1D and causal where, BERT's bidirectional
# mask, Llama's rotary embedding and grouped KV heads)
EAGER_ATTENTION = ("gpt2", "bert", "llama")

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device"),
        pytest.mark.skipif(INTERPRET, reason="real Triton kernels on CUDA need TRITON_INTERPRET=0"),
    ]),
]
TARGETS = {"cpu": "cpp", "cuda": "triton"}


def _cases() -> list[Any]:
    params: list[Any] = []
    variants = [(name, None) for name in MODELS] + [(name, "eager") for name in EAGER_ATTENTION]
    for name, attn in variants:
        for mode in MODES:
            marks = []
            if (name, mode) in EXPECTED_FAILURES:
                exc, reason = EXPECTED_FAILURES[(name, mode)]
                marks.append(pytest.mark.xfail(strict=True, raises=exc, reason=reason))
            ident = f"{name}-{mode}" + (f"-{attn}_attn" if attn else "")
            params.append(pytest.param(name, mode, attn, id=ident, marks=marks))
    return params


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, mode, attn", _cases())
def test_model(name: str, mode: str, attn: str | None, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if device == "cuda":
        # cuDNN may take TF32 for float32 convolutions (torch's default): measured on the
        # H200 (2026-12-02), ResNet's channels-last weight gradient of its first
        # convolution comes out of a TF32 algorithm (RMSE against float64 4.6e-3) where
        # eager's contiguous one does not (3.2e-8); with TF32 off both are float32-exact,
        # channels-last or not.  Each side is judged at float32 precision.
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    result = run_case(name, mode, device, TARGETS[device], attn=attn)
    print(result.line())
    c = result.counts
    assert not c.eager_fallbacks, f"coil ran a graph eagerly: {c.eager_fallbacks}"
    assert c.compiled + c.cached > 0, "coil compiled no graph"
    if mode == "train":  # a backward graph for each forward (a graph none of whose outputs needs a
        # gradient, as BART's mask graphs between its graph breaks, compiles for inference only)
        assert c.forward >= 1 and c.backward == c.forward, c
    assert result.verdict.passed, result.verdict.reason


@pytest.mark.parametrize("name", ["modernbert", "llama", "phi"])
@pytest.mark.parametrize("mode", MODES)
def test_rotary_tables_are_computed_once_with_many_heads(name: str, mode: str, caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """With 16 heads a rotary table's cos and sin (128 positions) are read by 16
    times their elements and more: realize's broadcast rule makes them buffers (at
    the tests' 4 heads, and the small size's 8, they stay inlined but ModernBERT's,
    whose table has no batch dim).  The model still matches
    eager, and no graph runs eagerly."""
    from dataclasses import replace

    from bench.hf_models import TINY

    with caplog.at_level(logging.DEBUG, logger="coil.trace"):
        # no graph cache: a graph an earlier run cached would load without realizing anything
        result = run_case(name, mode, "cpu", "cpp", options={"graph_cache": False},
                          size=replace(TINY, heads=16, seq=128))
    print(result.line())
    assert not result.counts.eager_fallbacks and result.verdict.passed, result.verdict.reason
    realized = [m for m in caplog.messages if m.startswith("realize ") and m.endswith("rule broadcast")]
    assert realized, "no node realized by the broadcast rule"


# --- the checker itself ------------------------------------------------------------

def test_compare_passes_through_the_fp64_reference_when_eager_is_as_far_off() -> None:
    """coil and eager both off the fp64 reference by noise of the same size (as
    sums in another order are): not allclose, but as good as eager."""
    ref = torch.randn(1000, dtype=torch.float64)
    eager = (ref + 0.01 * torch.randn(1000, dtype=torch.float64)).float()
    got = (ref + 0.01 * torch.randn(1000, dtype=torch.float64)).float()
    assert not torch.allclose(got, eager, rtol=1e-3, atol=1e-3)
    v = Verdict()
    compare("t", got, eager, ref, v)
    assert v.passed and v.rmse_ratio is not None and 0.5 < v.rmse_ratio < 2


def test_compare_fails_a_wrong_tensor() -> None:
    eager = torch.randn(64, 64)
    got = eager.clone()
    got[3, 5] += 0.1
    v = Verdict()
    compare("t", got, eager, eager.double(), v)
    assert not v.passed and v.reason.startswith("t: RMSE against fp64")
    assert abs(v.max_abs - 0.1) < 1e-6


def test_compare_fails_on_shape_dtype_and_missing_grad() -> None:
    for got, eager in ((torch.zeros(2, 3), torch.zeros(3, 2)), (torch.zeros(2), torch.zeros(2, dtype=torch.float64)),
                       (None, torch.zeros(2))):
        v = Verdict()
        compare("t", got, eager, None, v)
        assert not v.passed


def test_counting_sees_a_graph_coil_ran_eagerly() -> None:
    """A graph with symbolic shapes and Options.dynamic off is one coil runs eagerly
    (with a warning): the count must see it, so a model that only passes that way
    does not pass."""
    import torch._dynamo

    torch._dynamo.reset()
    fn = torch.compile(lambda x: (x * 2).sum(), backend="coil", options={"target": "cpp", "dynamic": False},
                       dynamic=True)
    counts = Counts()
    level = logging.getLogger("coil").level
    with counting(counts):
        fn(torch.randn(5))
    torch._dynamo.reset()
    assert len(counts.eager_fallbacks) == 1 and counts.compiled == 0 and counts.dynamo_graphs == 1
    assert logging.getLogger("coil").level == level
