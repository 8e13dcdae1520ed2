"""Real `transformers` models, built from configs with random weights (nothing
downloaded), compiled by coil and checked against eager PyTorch the way Inductor's
accuracy dashboard checks them.

Shared by `tests/test_hf_models.py` (CI: cpp on the CPU; triton on CUDA when there
is one), `scripts/hf_models.py` (one line a model and mode, for any device) and the
models suite (`bench/models.py`, `python -m bench --suite models`).  `ALL_MODELS`
holds the suite's 17 models, `MODELS` the ones the tests check; `SIZES` gives every
model's shapes at a size: `tiny` for the tests, `cpu` for the suite on the CPU,
`small` (hidden 512, 4 layers, batch 8, sequence 256) and `large` (hidden 2048,
8 layers) for the suite on a GPU.

A case is a model and a mode:
- `infer`: the model in eval(), under no_grad; every tensor of its output
  (logits, last_hidden_state, ...) is compared;
- `train`: the model in train() with every dropout probability 0 (so eager and
  coil are deterministic), one step: forward with labels, the model's own loss,
  backward; the loss, every parameter's .grad and every buffer (BatchNorm's
  running statistics) are compared.

A float64 copy of the model and inputs, run eagerly, is the reference.  A tensor
passes when it is allclose to eager's at rtol = atol = 1e-3, or else when
RMSE(coil, fp64) <= RMSE_MULTIPLIER * RMSE(eager, fp64) + atol / 10 (the models
suite passes RMSE_MULTIPLIER_BF16 for bfloat16 models, as the dashboard does).  The case's
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
RMSE_MULTIPLIER_BF16 = 3.0

CLASSES = 10
MODES = ("infer", "train")


@dataclass(frozen=True)
class Size:
    """The shapes of every model at one size: the one source of the configs below.
    `conv_*` shape ResNet and ConvNeXt (stage widths and blocks a stage); `wav2vec_convs`
    Wav2Vec2's feature extractor, (channels, kernel, stride) a layer; `wav2vec_pos`
    its positional convolution (kernel, groups)."""

    name: str
    batch: int
    seq: int
    vocab: int
    hidden: int
    layers: int
    heads: int
    image: int
    patch: int
    conv_widths: tuple[int, ...]
    conv_depths: tuple[int, ...]
    resnet_block: str  # "basic" | "bottleneck"
    mel_bins: int
    t5_buckets: int
    wav2vec_convs: tuple[tuple[int, int, int], ...]
    wav2vec_pos: tuple[int, int]

    @property
    def positions(self) -> int:
        return max(64, self.seq)

    @property
    def audio_frames(self) -> int:
        """Whisper's input frames: its encoder's convolutions halve them to `seq` positions."""
        return 2 * self.seq

    @property
    def waveform(self) -> int:
        """Wav2Vec2's input samples, so that its feature extractor gives `seq` frames."""
        n = self.seq
        for _, kernel, stride in reversed(self.wav2vec_convs):
            n = (n - 1) * stride + kernel
        return n


SIZES: dict[str, Size] = {s.name: s for s in (
    # the tests' size (CI: every model, both modes, in seconds)
    Size("tiny", batch=2, seq=16, vocab=1000, hidden=64, layers=2, heads=4, image=32, patch=8, conv_widths=(16, 32),
         conv_depths=(1, 1), resnet_block="basic", mel_bins=16, t5_buckets=8,
         wav2vec_convs=((32, 8, 4), (32, 4, 4)), wav2vec_pos=(16, 4)),
    # the models suite on the CPU (one thread)
    Size("cpu", batch=2, seq=64, vocab=8000, hidden=128, layers=2, heads=4, image=64, patch=8,
         conv_widths=(16, 32, 64, 128), conv_depths=(1, 1, 1, 1), resnet_block="basic", mel_bins=32, t5_buckets=32,
         wav2vec_convs=((64, 10, 5), (64, 4, 4), (64, 4, 4)), wav2vec_pos=(32, 8)),
    # the models suite on a GPU: ResNet-18's stages at `small`, ResNet-50's at `large`;
    # Wav2Vec2's own feature extractor (512 channels, 320 samples a frame)
    Size("small", batch=8, seq=256, vocab=32000, hidden=512, layers=4, heads=8, image=224, patch=16,
         conv_widths=(64, 128, 256, 512), conv_depths=(2, 2, 2, 2), resnet_block="basic", mel_bins=80,
         t5_buckets=32, wav2vec_convs=((512, 10, 5),) + ((512, 3, 2),) * 4 + ((512, 2, 2),) * 2,
         wav2vec_pos=(128, 16)),
    Size("large", batch=8, seq=256, vocab=32000, hidden=2048, layers=8, heads=16, image=224, patch=16,
         conv_widths=(256, 512, 1024, 2048), conv_depths=(3, 4, 6, 3), resnet_block="bottleneck", mel_bins=80,
         t5_buckets=32, wav2vec_convs=((512, 10, 5),) + ((512, 3, 2),) * 4 + ((512, 2, 2),) * 2,
         wav2vec_pos=(128, 16)),
)}
TINY = SIZES["tiny"]


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model and its inputs at a size.  `build(size, attn)` returns
    the model; `inputs(size, gen, train)` the keyword arguments of its forward
    (labels in train)."""

    name: str
    build: Callable[[Size, str], torch.nn.Module]
    inputs: Callable[[Size, torch.Generator, bool], dict[str, torch.Tensor]]
    attn: str = "sdpa"


def _auto(kind: str, config: Any, attn: str) -> torch.nn.Module:
    import transformers

    return getattr(transformers, kind).from_config(config, attn_implementation=attn)


def _tokens(s: Size, gen: torch.Generator, train: bool, labels: bool = True) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, s.vocab, (s.batch, s.seq), generator=gen)
    out = {"input_ids": ids, "attention_mask": torch.ones(s.batch, s.seq, dtype=torch.long)}
    if train and labels:
        out["labels"] = torch.randint(0, s.vocab, (s.batch, s.seq), generator=gen)
    return out


def _pixels(s: Size, gen: torch.Generator, train: bool) -> dict[str, torch.Tensor]:
    out = {"pixel_values": torch.randn(s.batch, 3, s.image, s.image, generator=gen)}
    if train:
        out["labels"] = torch.randint(0, CLASSES, (s.batch,), generator=gen)
    return out


def _audio(s: Size, gen: torch.Generator, train: bool) -> dict[str, torch.Tensor]:
    out = {"input_features": torch.randn(s.batch, s.mel_bins, s.audio_frames, generator=gen)}
    if train:
        out["labels"] = torch.randint(0, CLASSES, (s.batch,), generator=gen)
    return out


def _waveform(s: Size, gen: torch.Generator, train: bool) -> dict[str, torch.Tensor]:
    out = {"input_values": torch.randn(s.batch, s.waveform, generator=gen)}
    if train:
        out["labels"] = torch.randint(0, CLASSES, (s.batch,), generator=gen)
    return out


def _classes() -> dict[str, Any]:
    # every config takes it, though not every config's signature names it
    return {"num_labels": CLASSES}


def _tokens_in_vocab(decoder: bool = True) -> dict[str, Any]:
    """Special tokens inside the small vocabularies (the defaults are the real models')."""
    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    return {**ids, "decoder_start_token_id": 0} if decoder else ids


def _causal_lm(cfg: Any, attn: str) -> torch.nn.Module:
    model = _auto("AutoModelForCausalLM", cfg, attn)
    # transformers guesses the loss from the class name, and some classes' names
    # (GPT2LMHeadModel) say nothing: its warning (a logging call) would break
    # Dynamo's graph in two
    model.loss_type = "ForCausalLM"
    return model


def _gpt2(s: Size, attn: str) -> torch.nn.Module:
    from transformers import GPT2Config

    cfg = GPT2Config(vocab_size=s.vocab, n_positions=s.positions, n_embd=s.hidden, n_layer=s.layers, n_head=s.heads,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0,
                     eos_token_id=0)
    return _causal_lm(cfg, attn)


def _bert(s: Size, attn: str) -> torch.nn.Module:
    from transformers import BertConfig

    cfg = BertConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                     intermediate_size=4 * s.hidden, max_position_embeddings=s.positions, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return _auto("AutoModelForMaskedLM", cfg, attn)


def _distilbert(s: Size, attn: str) -> torch.nn.Module:
    from transformers import DistilBertConfig

    cfg = DistilBertConfig(vocab_size=s.vocab, dim=s.hidden, n_layers=s.layers, n_heads=s.heads,
                           hidden_dim=4 * s.hidden, max_position_embeddings=s.positions, dropout=0.0,
                           attention_dropout=0.0, qa_dropout=0.0, seq_classif_dropout=0.0, pad_token_id=0)
    return _auto("AutoModelForMaskedLM", cfg, attn)


def _modernbert(s: Size, attn: str) -> torch.nn.Module:
    """ModernBERT: global attention every third layer, local (a sliding window of
    half the sequence, at most 128 tokens) in between; gated GELU MLP."""
    from transformers import ModernBertConfig

    cfg = ModernBertConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=3 * s.hidden // 2,
                           num_hidden_layers=s.layers, num_attention_heads=s.heads,
                           max_position_embeddings=s.positions, local_attention=min(128, s.seq // 2),
                           attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0, classifier_dropout=0.0,
                           pad_token_id=0, eos_token_id=0, bos_token_id=0, cls_token_id=0, sep_token_id=0)
    return _auto("AutoModelForMaskedLM", cfg, attn)


def _llama_like(config_name: str, s: Size, attn: str, ffn: int = 2, kv_heads: int | None = None,
                **extra: Any) -> torch.nn.Module:
    import transformers

    cfg = getattr(transformers, config_name)(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=ffn * s.hidden, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=kv_heads or s.heads // 2,
        max_position_embeddings=s.positions, attention_dropout=0.0, use_cache=False, **extra)
    return _causal_lm(cfg, attn)


def _llama(s: Size, attn: str) -> torch.nn.Module:
    return _llama_like("LlamaConfig", s, attn)


def _mistral(s: Size, attn: str) -> torch.nn.Module:
    return _llama_like("MistralConfig", s, attn, sliding_window=None)


def _qwen2(s: Size, attn: str) -> torch.nn.Module:
    return _llama_like("Qwen2Config", s, attn, use_sliding_window=False, **_tokens_in_vocab(False))


def _phi(s: Size, attn: str) -> torch.nn.Module:
    """Phi (phi-2's layout): parallel attention and GELU MLP, partial rotary embedding."""
    return _llama_like("PhiConfig", s, attn, ffn=4, kv_heads=s.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                       **_tokens_in_vocab(False))


def _gemma(s: Size, attn: str) -> torch.nn.Module:
    return _llama_like("GemmaConfig", s, attn, kv_heads=1, head_dim=s.hidden // s.heads, **_tokens_in_vocab(False))


def _t5(s: Size, attn: str) -> torch.nn.Module:
    from transformers import T5Config

    cfg = T5Config(vocab_size=s.vocab, d_model=s.hidden, d_kv=s.hidden // s.heads, d_ff=2 * s.hidden,
                   num_layers=s.layers, num_decoder_layers=s.layers, num_heads=s.heads,
                   relative_attention_num_buckets=s.t5_buckets, dropout_rate=0.0, use_cache=False,
                   **_tokens_in_vocab())
    return _auto("AutoModelForSeq2SeqLM", cfg, attn)


def _bart(s: Size, attn: str) -> torch.nn.Module:
    from transformers import BartConfig

    cfg = BartConfig(vocab_size=s.vocab, d_model=s.hidden, encoder_layers=s.layers, decoder_layers=s.layers,
                     encoder_attention_heads=s.heads, decoder_attention_heads=s.heads, encoder_ffn_dim=2 * s.hidden,
                     decoder_ffn_dim=2 * s.hidden, max_position_embeddings=s.positions, dropout=0.0,
                     attention_dropout=0.0, activation_dropout=0.0, classifier_dropout=0.0, use_cache=False)
    return _auto("AutoModelForSeq2SeqLM", cfg, attn)


def _seq2seq_tokens(s: Size, gen: torch.Generator, train: bool) -> dict[str, torch.Tensor]:
    out = _tokens(s, gen, train)
    if not train:  # the decoder needs its own tokens when no labels are given
        out["decoder_input_ids"] = torch.randint(0, s.vocab, (s.batch, s.seq), generator=gen)
    return out


def _vit(s: Size, attn: str) -> torch.nn.Module:
    from transformers import ViTConfig

    cfg = ViTConfig(image_size=s.image, patch_size=s.patch, hidden_size=s.hidden, num_hidden_layers=s.layers,
                    num_attention_heads=s.heads, intermediate_size=2 * s.hidden, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, **_classes())
    return _auto("AutoModelForImageClassification", cfg, attn)


def _whisper_encoder(s: Size, attn: str) -> torch.nn.Module:
    """Whisper's encoder under a classification head (WhisperForAudioClassification
    runs the encoder only)."""
    from transformers import WhisperConfig

    cfg = WhisperConfig(vocab_size=s.vocab, num_mel_bins=s.mel_bins, d_model=s.hidden, encoder_layers=s.layers,
                        decoder_layers=s.layers, encoder_attention_heads=s.heads, decoder_attention_heads=s.heads,
                        encoder_ffn_dim=2 * s.hidden, decoder_ffn_dim=2 * s.hidden, max_source_positions=s.seq,
                        max_target_positions=s.seq, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                        classifier_proj_size=s.hidden, use_cache=False, **_classes(), **_tokens_in_vocab())
    return _auto("AutoModelForAudioClassification", cfg, attn)


def _wav2vec2(s: Size, attn: str) -> torch.nn.Module:
    """Wav2Vec2 under a sequence classification head (mean pooling, cross entropy);
    no SpecAugment masking and no layer drop, which draw random numbers in train()."""
    from transformers import Wav2Vec2Config

    dims, kernels, strides = zip(*s.wav2vec_convs)
    cfg = Wav2Vec2Config(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                         num_attention_heads=s.heads, intermediate_size=4 * s.hidden, conv_dim=dims,
                         conv_kernel=kernels, conv_stride=strides, num_conv_pos_embeddings=s.wav2vec_pos[0],
                         num_conv_pos_embedding_groups=s.wav2vec_pos[1], hidden_dropout=0.0, activation_dropout=0.0,
                         attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
                         apply_spec_augment=False, mask_time_prob=0.0, classifier_proj_size=s.hidden,
                         **_classes(), pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return _auto("AutoModelForAudioClassification", cfg, attn)


def _resnet(s: Size, attn: str) -> torch.nn.Module:
    from transformers import ResNetConfig

    embedding = s.conv_widths[0] if s.resnet_block == "basic" else s.conv_widths[0] // 4
    cfg = ResNetConfig(num_channels=3, embedding_size=embedding, hidden_sizes=list(s.conv_widths),
                       depths=list(s.conv_depths), layer_type=s.resnet_block, **_classes())
    return _auto("AutoModelForImageClassification", cfg, attn)


def _convnext(s: Size, attn: str) -> torch.nn.Module:
    from transformers import ConvNextConfig

    cfg = ConvNextConfig(num_channels=3, num_stages=len(s.conv_widths), hidden_sizes=list(s.conv_widths),
                         depths=list(s.conv_depths), drop_path_rate=0.0, image_size=s.image, **_classes())
    return _auto("AutoModelForImageClassification", cfg, attn)


def _mobilenet_v2(s: Size, attn: str) -> torch.nn.Module:
    """MobileNetV2, its widths scaled by hidden / 512 (1.0 at `small`)."""
    from transformers import MobileNetV2Config

    cfg = MobileNetV2Config(num_channels=3, image_size=s.image, depth_multiplier=s.hidden / 512,
                            classifier_dropout_prob=0.0, **_classes())
    return _auto("AutoModelForImageClassification", cfg, attn)


# Every model of the suite, in the order.  `MODELS`, the ones
# tests/test_hf_models.py checks on every commit, is a subset.
ALL_MODELS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("gpt2", _gpt2, _tokens),
    ModelSpec("bert", _bert, _tokens),
    ModelSpec("distilbert", _distilbert, _tokens),
    ModelSpec("modernbert", _modernbert, _tokens),
    ModelSpec("llama", _llama, _tokens),
    ModelSpec("mistral", _mistral, _tokens),
    ModelSpec("qwen2", _qwen2, _tokens),
    ModelSpec("phi", _phi, _tokens),
    ModelSpec("gemma", _gemma, _tokens),
    ModelSpec("t5", _t5, _seq2seq_tokens, attn="eager"),  # T5 has no sdpa attention
    ModelSpec("bart", _bart, _seq2seq_tokens),
    ModelSpec("vit", _vit, _pixels),
    ModelSpec("whisper_encoder", _whisper_encoder, _audio),
    ModelSpec("wav2vec2", _wav2vec2, _waveform),
    ModelSpec("resnet", _resnet, _pixels, attn="eager"),  # no attention at all
    ModelSpec("convnext", _convnext, _pixels, attn="eager"),
    ModelSpec("mobilenet_v2", _mobilenet_v2, _pixels, attn="eager"),
)}
TESTED = ("gpt2", "bert", "llama", "mistral", "t5", "bart", "vit", "whisper_encoder", "resnet")
MODELS: dict[str, ModelSpec] = {name: ALL_MODELS[name] for name in TESTED}


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
            verdict: Verdict, multiplier: float = RMSE_MULTIPLIER) -> None:
    """Compare one tensor (coil's `got` against `eager`, both against the float64
    reference `ref`), noting the result in `verdict`; `got` passes within
    `multiplier` times eager's RMSE against `ref`."""
    if got is None or eager is None:
        if (got is None) != (eager is None):
            verdict.fail(f"{name}: compiled gives {'None' if got is None else 'a tensor'}, eager "
                         f"{'None' if eager is None else 'a tensor'}")
        return
    got, eager = got.detach(), eager.detach()
    if got.shape != eager.shape or got.dtype != eager.dtype:
        verdict.fail(f"{name}: compiled gives {got.dtype}{list(got.shape)}, eager {eager.dtype}{list(eager.shape)}")
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
    if not coil_err <= multiplier * eager_err + ATOL / 10:
        verdict.fail(f"{name}: RMSE against fp64 {coil_err:.3g}, eager's {eager_err:.3g} "
                     f"(max |compiled - eager| {float((got - eager).abs().max()):.3g})")


# --- counting what coil did --------------------------------------------------------

@dataclass
class Counts:
    compiled: int = 0          # graphs coil compiled (forward, backward, inference)
    forward: int = 0           # of those, forward graphs of training
    backward: int = 0          # and backward graphs
    cached: int = 0            # Dynamo graphs loaded through the graph cache's link
    aot_cached: int = 0        # of `compiled`, graphs loaded through AOTAutograd's cache (backends/aot_cache.py)
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
            self.counts.forward += msg.startswith("coil: compiled forward ")
            self.counts.backward += msg.startswith("coil: compiled backward ")
        elif msg.startswith("coil: loaded ") and "through AOTAutograd's cache" in msg:
            self.counts.compiled += 1
            self.counts.aot_cached += 1
            self.counts.forward += msg.startswith("coil: loaded forward ")
            self.counts.backward += msg.startswith("coil: loaded backward ")
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
                f"graphs={c.compiled}" + (f" ({c.aot_cached} through AOTAutograd's cache)" if c.aot_cached else "")
                + (f"+{c.cached} cached" if c.cached else "")
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


def make_case(name: str, mode: str, device: str, attn: str | None = None, size: Size = TINY,
              dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The model (on `device`, in `dtype`, in the mode's train/eval state, with
    attention `attn` or the spec's) and its inputs at `size`, the same on every
    call.  Every dropout module's probability is 0 (the configs say so too)."""
    spec = ALL_MODELS[name]
    model = _built(name, size, attn or spec.attn).to(device=device, dtype=dtype)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model.train(mode == "train")
    gen = torch.Generator().manual_seed(1)
    inputs = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
              for k, v in spec.inputs(size, gen, mode == "train").items()}
    _settle_problem_type(model, inputs.get("labels"))
    return model, inputs


# the last model built (make_case): its key, the model as built, and the random states after its build
_BUILT: dict[tuple[str, Size, str], tuple[torch.nn.Module, Any, torch.Tensor]] = {}


def _built(name: str, size: Size, attn: str) -> torch.nn.Module:
    """A copy of the model as `seed_all(0)` then its spec's build make it (on the CPU,
    in float32), with the random states that build leaves.  The last model built is
    kept and copied: the models suite asks for each model twice in a row (inference,
    then training), and a large model's build took 5-16 s here (GPT-2 11.7, T5 16.1:
    its random initialisation, on one CPU thread), where the copy takes about one."""
    import random

    key = (name, size, attn)
    if key not in _BUILT:
        _BUILT.clear()
        seed_all(0)
        model = ALL_MODELS[name].build(size, attn)
        _BUILT[key] = (model, random.getstate(), torch.get_rng_state())
    model, py_state, torch_state = _BUILT[key]
    seed_all(0)  # the other generators torch.manual_seed sets, as the build left them
    random.setstate(py_state)
    torch.set_rng_state(torch_state)
    return copy.deepcopy(model)


def _settle_problem_type(model: torch.nn.Module, labels: torch.Tensor | None) -> None:
    """Set the config's `problem_type` the way transformers' classification losses
    set it on their first call.  Left to that call, it changes the config between
    a compiled model's first and second training steps, and Dynamo, which guards
    on it, traces and compiles the whole forward again at the second step (the
    conv nets' first timed steps took 2-13 s on an H100)."""
    config = getattr(model, "config", None)
    if labels is None or config is None or getattr(config, "problem_type", "") is not None:
        return
    if config.num_labels == 1:
        config.problem_type = "regression"
    elif labels.dtype in (torch.long, torch.int):
        config.problem_type = "single_label_classification"
    else:
        config.problem_type = "multi_label_classification"


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


def _loss(out: Any) -> torch.Tensor:
    """The model's own loss, or else the sum of its outputs."""
    if isinstance(out, dict) and out.get("loss") is not None:
        return out["loss"]
    first, *rest = _output_tensors(out).values()
    total = first.sum()
    for v in rest:
        total = total + v.sum()
    return total


def _train_step(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, torch.Tensor | None]:
    """One training step's loss, parameter gradients and buffers after the step."""
    model.zero_grad(set_to_none=True)
    loss = _loss(model(**inputs))
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


Step = Callable[[torch.nn.Module, dict[str, Any]], dict[str, Any]]
# what a case compares: the outputs under no_grad, or one training step's loss,
# gradients and buffers
CHECK_STEPS: dict[str, Step] = {"infer": _infer, "train": _train_step}


@dataclass
class Expected:
    """What every compiled run of a case is compared with: eager's tensors and the
    float64 reference's (empty, with the reason, when the model cannot run in
    float64)."""

    eager: dict[str, Any]
    reference: dict[str, Any]
    fp64_error: str = ""


def expected(model: torch.nn.Module, inputs: dict[str, torch.Tensor], mode: str) -> Expected:
    """Run copies of `model` eagerly, as it is and in float64."""
    step = CHECK_STEPS[mode]
    seed_all(0)
    eager = step(copy.deepcopy(model), inputs)
    seed_all(0)
    try:
        return Expected(eager, step(*_as_fp64(model, inputs)))
    except Exception as e:  # a model that cannot run in float64: allclose must do
        return Expected(eager, {}, f"{type(e).__name__}: {e}")


def judge(got: dict[str, Any], want: Expected, multiplier: float = RMSE_MULTIPLIER) -> Verdict:
    """Every tensor of a compiled run against eager's and the reference's."""
    verdict = Verdict(fp64_error=want.fp64_error)
    if set(got) != set(want.eager):
        verdict.fail(f"compiled outputs {sorted(got)} differ from eager's {sorted(want.eager)}")
    for key in want.eager:
        compare(key, got.get(key), want.eager[key], want.reference.get(key), verdict, multiplier)
    return verdict


def run_case(name: str, mode: str, device: str = "cpu", target: str = "cpp",
             options: dict[str, Any] | None = None, attn: str | None = None, size: Size = TINY) -> CaseResult:
    """Build, run eagerly, compile with coil and run, compare.  `attn` overrides
    the model's attention implementation ("sdpa", "eager"); `size` the tests' size.  An exception while
    compiling or running coil's model propagates as the CoilError behind it when
    there is one."""
    import torch._dynamo

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    start = time.perf_counter()
    model, inputs = make_case(name, mode, device, attn, size)
    step = CHECK_STEPS[mode]
    want = expected(model, inputs, mode)

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

    return CaseResult(name, mode, device, target, attn or ALL_MODELS[name].attn, judge(got, want), counts,
                      time.perf_counter() - start)


def cases() -> Iterator[tuple[str, str]]:
    for name in MODELS:
        for mode in MODES:
            yield name, mode
