"""Real `transformers` models, built from tiny configs with random weights (nothing
downloaded), compiled by coil and checked against eager PyTorch the way Inductor's
accuracy dashboard checks them.

Shared by `tests/test_hf_models.py` (CI: cpp on the CPU; triton on CUDA when there
is one) and `scripts/hf_models.py` (one line a model and mode, for any device).

A case is a model and a mode:
- `infer`: the model in eval(), under no_grad; every tensor of its output
  (logits, last_hidden_state, ...) is compared;
- `train`: the model in train() with every dropout probability 0 (so eager and
  coil are deterministic), one step: forward with labels, the model's own loss,
  backward; the loss, every parameter's .grad and every buffer (BatchNorm's
  running statistics) are compared.

A float64 copy of the model and inputs, run eagerly, is the reference.  A tensor
passes when it is allclose to eager's at rtol = atol = 1e-3, or else when
RMSE(coil, fp64) <= RMSE_MULTIPLIER * RMSE(eager, fp64) + atol / 10.  The case's
rmse_ratio, RMSE(coil, fp64) / RMSE(eager, fp64) over all its tensors, is reported.

A case also counts what coil did: graphs compiled (forward, backward, inference),
graphs it "ran eagerly" (its warning on the `coil` logger), Dynamo's graphs and
graph breaks.  A case whose graphs ran eagerly has not tested coil, whatever its
numbers say; callers treat it as a failure.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

RTOL = 1e-3
ATOL = 1e-3
# fp32 results: a fused kernel that sums in another order may be off the fp64
# reference by about as much as eager is; twice eager's error leaves room for that,
# while a wrong index or a lost term is off by orders of magnitude.  (Inductor's
# dashboard uses 2 for float32 too and 3 only for bfloat16.)
RMSE_MULTIPLIER = 2.0

BATCH = 2
SEQ = 16
VOCAB = 1000
HIDDEN = 64
LAYERS = 2
HEADS = 4
IMAGE = 32
CLASSES = 10
MODES = ("infer", "train")


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model and its inputs.  `build(attn)` returns the model;
    `inputs(gen, train)` the keyword arguments of its forward (labels in train)."""

    name: str
    build: Callable[[str], torch.nn.Module]
    inputs: Callable[[torch.Generator, bool], dict[str, torch.Tensor]]
    attn: str = "sdpa"


def _auto(kind: str, config: Any, attn: str) -> torch.nn.Module:
    import transformers

    return getattr(transformers, kind).from_config(config, attn_implementation=attn)


def _tokens(gen: torch.Generator, train: bool, labels: bool = True) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    out = {"input_ids": ids, "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}
    if train and labels:
        out["labels"] = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return out


def _pixels(gen: torch.Generator, train: bool) -> dict[str, torch.Tensor]:
    out = {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen)}
    if train:
        out["labels"] = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    return out


MEL_BINS = 16
AUDIO_POSITIONS = 16  # the encoder's convolutions halve 2 * 16 frames to 16 positions


def _audio(gen: torch.Generator, train: bool) -> dict[str, torch.Tensor]:
    out = {"input_features": torch.randn(BATCH, MEL_BINS, 2 * AUDIO_POSITIONS, generator=gen)}
    if train:
        out["labels"] = torch.randint(0, CLASSES, (BATCH,), generator=gen)
    return out


def _classes() -> dict[str, Any]:
    # every config takes it, though not every config's signature names it
    return {"num_labels": CLASSES}


def _tokens_in_vocab() -> dict[str, Any]:
    """Special tokens inside the tiny vocabulary (the defaults are the real models')."""
    return {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "decoder_start_token_id": 0}


def _gpt2(attn: str) -> torch.nn.Module:
    from transformers import GPT2Config

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0,
                     eos_token_id=0)
    model = _auto("AutoModelForCausalLM", cfg, attn)
    # transformers guesses the loss from the class name, and GPT2LMHeadModel's says
    # nothing: its warning (a logging call) would break Dynamo's graph in two
    model.loss_type = "ForCausalLM"
    return model


def _bert(attn: str) -> torch.nn.Module:
    from transformers import BertConfig

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=4 * HIDDEN, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return _auto("AutoModelForMaskedLM", cfg, attn)


def _llama_like(config_name: str, attn: str, **extra: Any) -> torch.nn.Module:
    import transformers

    cfg = getattr(transformers, config_name)(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS // 2, max_position_embeddings=64,
        attention_dropout=0.0, use_cache=False, **extra)
    return _auto("AutoModelForCausalLM", cfg, attn)


def _llama(attn: str) -> torch.nn.Module:
    return _llama_like("LlamaConfig", attn)


def _mistral(attn: str) -> torch.nn.Module:
    return _llama_like("MistralConfig", attn, sliding_window=None)


def _t5(attn: str) -> torch.nn.Module:
    from transformers import T5Config

    cfg = T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
                   num_decoder_layers=LAYERS, num_heads=HEADS, relative_attention_num_buckets=8,
                   dropout_rate=0.0, use_cache=False, **_tokens_in_vocab())
    return _auto("AutoModelForSeq2SeqLM", cfg, attn)


def _bart(attn: str) -> torch.nn.Module:
    from transformers import BartConfig

    cfg = BartConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                     encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=2 * HIDDEN,
                     decoder_ffn_dim=2 * HIDDEN, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                     activation_dropout=0.0, classifier_dropout=0.0, use_cache=False)
    return _auto("AutoModelForSeq2SeqLM", cfg, attn)


def _seq2seq_tokens(gen: torch.Generator, train: bool) -> dict[str, torch.Tensor]:
    out = _tokens(gen, train)
    if not train:  # the decoder needs its own tokens when no labels are given
        out["decoder_input_ids"] = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return out


def _vit(attn: str) -> torch.nn.Module:
    from transformers import ViTConfig

    cfg = ViTConfig(image_size=IMAGE, patch_size=8, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                    num_attention_heads=HEADS, intermediate_size=2 * HIDDEN, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, **_classes())
    return _auto("AutoModelForImageClassification", cfg, attn)


def _whisper_encoder(attn: str) -> torch.nn.Module:
    """Whisper's encoder under a classification head (WhisperForAudioClassification
    runs the encoder only)."""
    from transformers import WhisperConfig

    cfg = WhisperConfig(vocab_size=VOCAB, num_mel_bins=MEL_BINS, d_model=HIDDEN, encoder_layers=LAYERS,
                        decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                        encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN,
                        max_source_positions=AUDIO_POSITIONS, max_target_positions=SEQ, dropout=0.0,
                        attention_dropout=0.0, activation_dropout=0.0, classifier_proj_size=HIDDEN,
                        use_cache=False, **_classes(), **_tokens_in_vocab())
    return _auto("AutoModelForAudioClassification", cfg, attn)


def _resnet(attn: str) -> torch.nn.Module:
    from transformers import ResNetConfig

    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                       layer_type="basic", **_classes())
    return _auto("AutoModelForImageClassification", cfg, attn)


MODELS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("gpt2", _gpt2, _tokens),
    ModelSpec("bert", _bert, _tokens),
    ModelSpec("llama", _llama, _tokens),
    ModelSpec("mistral", _mistral, _tokens),
    ModelSpec("t5", _t5, _seq2seq_tokens, attn="eager"),  # T5 has no sdpa attention
    ModelSpec("bart", _bart, _seq2seq_tokens),
    ModelSpec("vit", _vit, _pixels),
    ModelSpec("whisper_encoder", _whisper_encoder, _audio),
    ModelSpec("resnet", _resnet, _pixels, attn="eager"),  # no attention at all
)}


# --- comparing, after Inductor's dashboard ---------------------------------------

@dataclass
class Verdict:
    """The comparison of one case's tensors: passed, and if not why (the first
    tensor that failed); the largest |coil - eager|; and the squared errors of coil
    and of eager against the fp64 reference, summed over every floating tensor,
    from which `rmse_ratio` is RMSE(coil, fp64) / RMSE(eager, fp64) for the whole
    case (a summary for reports; each tensor passes or fails on its own)."""

    passed: bool = True
    reason: str = ""
    max_abs: float = 0.0
    sq_coil: float = 0.0
    sq_eager: float = 0.0
    fp64_error: str = ""

    def fail(self, reason: str) -> None:
        if self.passed:
            self.passed, self.reason = False, reason

    @property
    def rmse_ratio(self) -> float | None:
        if self.sq_eager > 0:
            return math.sqrt(self.sq_coil / self.sq_eager)
        return None if self.sq_coil == 0 else math.inf


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.sqrt(torch.mean(torch.square(a.double() - b.double()))))


def compare(name: str, got: torch.Tensor | None, eager: torch.Tensor | None, ref: torch.Tensor | None,
            verdict: Verdict) -> None:
    """Compare one tensor (coil's `got` against `eager`, both against the float64
    reference `ref`), noting the result in `verdict`."""
    if got is None or eager is None:
        if (got is None) != (eager is None):
            verdict.fail(f"{name}: coil gives {'None' if got is None else 'a tensor'}, eager "
                         f"{'None' if eager is None else 'a tensor'}")
        return
    got, eager = got.detach(), eager.detach()
    if got.shape != eager.shape or got.dtype != eager.dtype:
        verdict.fail(f"{name}: coil gives {got.dtype}{list(got.shape)}, eager {eager.dtype}{list(eager.shape)}")
        return
    if not got.is_floating_point():
        if not torch.equal(got, eager):
            verdict.fail(f"{name}: integer values differ")
        return
    if got.numel():
        diff = (got.double() - eager.double()).abs().nan_to_num(nan=math.inf)
        verdict.max_abs = max(verdict.max_abs, float(diff.max()))
    if ref is not None and ref.shape == got.shape:
        verdict.sq_coil += float(torch.sum(torch.square(got.double() - ref.double())))
        verdict.sq_eager += float(torch.sum(torch.square(eager.double() - ref.double())))
    if torch.allclose(got, eager, rtol=RTOL, atol=ATOL, equal_nan=True):
        return
    if ref is None:
        verdict.fail(f"{name}: not allclose, and no fp64 reference ({verdict.fp64_error or 'not in its outputs'})")
        return
    coil_err, eager_err = _rmse(got, ref), _rmse(eager, ref)
    if not coil_err <= RMSE_MULTIPLIER * eager_err + ATOL / 10:
        verdict.fail(f"{name}: RMSE against fp64 {coil_err:.3g}, eager's {eager_err:.3g} "
                     f"(max |coil - eager| {float((got - eager).abs().max()):.3g})")


# --- counting what coil did --------------------------------------------------------

@dataclass
class Counts:
    compiled: int = 0          # graphs coil compiled (forward, backward, inference)
    cached: int = 0            # Dynamo graphs loaded through the graph cache's link
    eager_fallbacks: list[str] = field(default_factory=list)   # coil's "running it eagerly" warnings
    dynamo_graphs: int = 0
    graph_breaks: int = 0


class _CoilLog(logging.Handler):
    def __init__(self, counts: Counts) -> None:
        super().__init__(logging.DEBUG)
        self.counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "running it eagerly" in msg:
            self.counts.eager_fallbacks.append(msg)
        elif msg.startswith("coil: compiled "):
            self.counts.compiled += 1
        elif "loaded from the graph cache" in msg:
            self.counts.cached += 1


class counting:
    """Within it, coil's log lines and Dynamo's counters are tallied in `counts`."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.handler = _CoilLog(counts)
        self.logger = logging.getLogger("coil")
        self.level = self.logger.level
        self.pinned: list[logging.Logger] = []

    def __enter__(self) -> Counts:
        from torch._dynamo.utils import counters

        counters.clear()
        # the lines counted are DEBUG lines of `coil` itself; its children (coil.trace
        # logs every stage event) keep the level they had, or tracing would slow
        # every compile down
        effective = self.logger.getEffectiveLevel()
        logging.getLogger("coil.trace")  # made now if no module has made it yet, so it is pinned too
        for name, child in list(logging.Logger.manager.loggerDict.items()):
            if name.startswith("coil.") and isinstance(child, logging.Logger) and child.level == logging.NOTSET:
                child.setLevel(effective)
                self.pinned.append(child)
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.DEBUG)
        return self.counts

    def __exit__(self, *exc: object) -> None:
        from torch._dynamo.utils import counters

        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)
        for child in self.pinned:
            child.setLevel(logging.NOTSET)
        self.pinned.clear()
        self.counts.dynamo_graphs += counters["stats"]["unique_graphs"]
        self.counts.graph_breaks += sum(counters["graph_break"].values())


# --- running a case ----------------------------------------------------------------

@dataclass
class CaseResult:
    model: str
    mode: str
    device: str
    target: str
    attn: str
    verdict: Verdict
    counts: Counts
    seconds: float

    @property
    def passed(self) -> bool:
        """Numbers match and every graph went through coil."""
        return self.verdict.passed and not self.counts.eager_fallbacks

    def line(self) -> str:
        ratio = "-" if self.verdict.rmse_ratio is None else f"{self.verdict.rmse_ratio:.2f}"
        c = self.counts
        status = "pass" if self.passed else "FAIL"
        text = (f"{self.model:16s} {self.mode:5s} {status}  attn={self.attn:5s} max_abs={self.verdict.max_abs:.2e} rmse_ratio={ratio} "
                f"graphs={c.compiled}" + (f"+{c.cached} cached" if c.cached else "")
                + f" dynamo={c.dynamo_graphs} breaks={c.graph_breaks} eager={len(c.eager_fallbacks)} "
                f"time={self.seconds:.1f}s")
        if not self.verdict.passed:
            text += f"  [{self.verdict.reason}]"
        elif c.eager_fallbacks:
            text += f"  [ran eagerly: {c.eager_fallbacks[0]}]"
        return text


def seed_all(seed: int = 0) -> None:
    import random

    random.seed(seed)
    torch.manual_seed(seed)


def make_case(name: str, mode: str, device: str, attn: str | None = None
              ) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model (on `device`, in the mode's train/eval state, with attention
    `attn` or the spec's) and its inputs, the same on every call."""
    spec = MODELS[name]
    seed_all(0)
    model = spec.build(attn or spec.attn).to(device)
    model.train(mode == "train")
    gen = torch.Generator().manual_seed(1)
    inputs = {k: v.to(device) for k, v in spec.inputs(gen, mode == "train").items()}
    return model, inputs


def _as_fp64(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, dict[str, Any]]:
    return (copy.deepcopy(model).double(),
            {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()})


def _output_tensors(out: Any) -> dict[str, torch.Tensor]:
    """The tensor fields of a ModelOutput (or a tensor, or a tuple of them)."""
    if isinstance(out, torch.Tensor):
        return {"output": out}
    if isinstance(out, dict):
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
    if isinstance(out, (tuple, list)):
        return {f"output[{i}]": v for i, v in enumerate(out) if isinstance(v, torch.Tensor)}
    raise TypeError(f"cannot compare a model output of type {type(out).__name__}")


def _infer(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {k: v.detach().clone() for k, v in _output_tensors(model(**inputs)).items()}


def _train_step(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, torch.Tensor | None]:
    """One training step's loss, parameter gradients and buffers after the step."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    loss = out["loss"] if isinstance(out, dict) and out.get("loss") is not None else \
        sum(v.sum() for v in _output_tensors(out).values())
    loss.backward()
    result: dict[str, torch.Tensor | None] = {"loss": loss.detach().clone()}
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the same parameters
    for n, p in model.named_parameters():
        result[f"grad {n}"] = None if p.grad is None else p.grad.detach().clone()
    for n, b in model.named_buffers():
        result[f"buffer {n}"] = b.detach().clone()
    return result


def _coil_root(e: BaseException) -> BaseException:
    """The CoilError behind an exception Dynamo wrapped (BackendCompilerFailed), or
    the exception itself."""
    from coil import CoilError

    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, CoilError):
            return cur
        seen.add(id(cur))
        cur = getattr(cur, "inner_exception", None) or cur.__cause__ or cur.__context__
    return e


def run_case(name: str, mode: str, device: str = "cpu", target: str = "cpp",
             options: dict[str, Any] | None = None, attn: str | None = None) -> CaseResult:
    """Build, run eagerly, compile with coil and run, compare.  `attn` overrides
    the model's attention implementation ("sdpa", "eager").  An exception while
    compiling or running coil's model propagates as the CoilError behind it when
    there is one."""
    import torch._dynamo

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    start = time.perf_counter()
    model, inputs = make_case(name, mode, device, attn)
    step: Callable[[torch.nn.Module, dict[str, Any]], dict[str, Any]] = _infer if mode == "infer" else _train_step
    seed_all(0)
    eager = step(copy.deepcopy(model), inputs)

    seed_all(0)
    try:
        reference = step(*_as_fp64(model, inputs))
        fp64_error = ""
    except Exception as e:  # a model that cannot run in float64: allclose must do
        reference, fp64_error = {}, f"{type(e).__name__}: {e}"

    torch._dynamo.reset()
    counts = Counts()
    compiled = torch.compile(copy.deepcopy(model), backend="coil", options={"target": target, **(options or {})})
    seed_all(0)
    try:
        with counting(counts):
            got = step(compiled, inputs)
    except Exception as e:
        root = _coil_root(e)
        if root is e:
            raise
        raise root from e
    finally:
        torch._dynamo.reset()

    verdict = Verdict(fp64_error=fp64_error)
    if set(got) != set(eager):
        verdict.fail(f"coil's outputs {sorted(got)} differ from eager's {sorted(eager)}")
    for key in eager:
        compare(key, got.get(key), eager[key], reference.get(key), verdict)
    return CaseResult(name, mode, device, target, attn or MODELS[name].attn, verdict, counts,
                      time.perf_counter() - start)


def cases() -> Iterator[tuple[str, str]]:
    for name in MODELS:
        for mode in MODES:
            yield name, mode
