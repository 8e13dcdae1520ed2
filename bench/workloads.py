"""The workloads: module-level functions (so a fresh process rebuilds them exactly)
and builders that make their inputs on a device, deterministically.

A `Workload` is a name, a description, tolerances and `build(device) -> Instance`;
an `Instance` is what the harness compiles (`fn`), its inputs, and how one call runs
(`step`: a plain call, or a training step that runs forward and backward)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F

Step = Callable[[Callable[..., Any], tuple[torch.Tensor, ...]], Any]


def call_plain(f: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> Any:
    return f(*inputs)


@dataclass(frozen=True)
class Instance:
    fn: Callable[..., Any]  # what torch.compile receives: a function or an nn.Module
    inputs: tuple[torch.Tensor, ...]
    step: Step = call_plain
    extra_reads: tuple[torch.Tensor, ...] = ()  # tensors a call reads besides inputs (parameters)


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable[[torch.device], Instance]
    rtol: float
    atol: float  # times the reference output's largest magnitude
    tags: frozenset[str] = field(default_factory=frozenset)  # "slow_compile": compile timings start first


def _tol(dtype: torch.dtype) -> tuple[float, float]:
    return (2e-2, 1e-2) if dtype in (torch.bfloat16, torch.float16) else (1e-3, 1e-4)


def _short(dtype: torch.dtype) -> str:
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}.get(dtype, str(dtype))


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _gen(device: torch.device, seed: int = 0) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ---- the functions -------------------------------------------------------------


def seed_fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return ((a + b) * c.relu()).sum(-1)


def softmax_fn(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.float(), -1).to(x.dtype)


def layer_norm_fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def rms_norm_fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)


def gelu_bias_residual_fn(x: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b, approximate="tanh") + r


def cross_entropy_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target)


def silu_mul_fn(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def add_transpose_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y.t()


CHAIN_STEPS = 1000  # two FX nodes each (amax, then mul-sub): a 2,000-node graph


def chain_fn(y: torch.Tensor) -> torch.Tensor:
    for _ in range(CHAIN_STEPS):
        y = y - y.amax(-1, keepdim=True) * 0.5
    return y


class Block(torch.nn.Module):
    """Pre-norm transformer block: LayerNorm, causal attention (SDPA), MLP with GELU."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.fc1 = torch.nn.Linear(d_model, 4 * d_model)
        self.fc2 = torch.nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return out


def train_step(model: Callable[..., Any], inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """One forward+backward step; returns the loss and every parameter's gradient."""
    module = cast(torch.nn.Module, getattr(model, "_orig_mod", model))
    params = list(module.parameters())
    for p in params:
        p.grad = None
    loss = model(*inputs).float().pow(2).mean()
    loss.backward()
    return (loss.detach(), *(p.grad for p in params if p.grad is not None))


# ---- builders --------------------------------------------------------------------


def _rows(name: str, fn: Callable[..., Any], text: str, rows: int, cols: int, dtype: torch.dtype,
          vectors: int = 0, matrices: int = 1) -> Workload:
    """A row-wise workload: `matrices` (rows, cols) inputs, then `vectors` (cols,) inputs."""

    def build(device: torch.device) -> Instance:
        g = _gen(device)
        mats = tuple(_randn((rows, cols), dtype, device, g) for _ in range(matrices))
        vecs = tuple(_randn((cols,), dtype, device, g) for _ in range(vectors))
        return Instance(fn, mats + vecs)

    return Workload(name, f"{text} {_short(dtype)} {rows}x{cols}", build, *_tol(dtype))


def seed(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> Workload:
    return _rows("seed", seed_fn, "((a + b) * c.relu()).sum(-1)", rows, cols, dtype, matrices=3)


def softmax(rows: int, cols: int, dtype: torch.dtype) -> Workload:
    return _rows("softmax", softmax_fn, "softmax(x.float(), -1).to(dtype)", rows, cols, dtype)


def layer_norm(rows: int, cols: int, dtype: torch.dtype) -> Workload:
    def build(device: torch.device) -> Instance:
        g = _gen(device)
        x, w, b = _randn((rows, cols), dtype, device, g), _randn((cols,), dtype, device, g), _randn((cols,), dtype, device, g)
        return Instance(layer_norm_fn, (x, w, b))

    return Workload("layer_norm", f"layer_norm(x, w, b) {_short(dtype)} {rows}x{cols}", build, *_tol(dtype))


def rms_norm(rows: int, cols: int, dtype: torch.dtype) -> Workload:
    def build(device: torch.device) -> Instance:
        g = _gen(device)
        return Instance(rms_norm_fn, (_randn((rows, cols), dtype, device, g), _randn((cols,), dtype, device, g)))

    return Workload("rms_norm", f"RMSNorm in f32 math {_short(dtype)} {rows}x{cols}", build, *_tol(dtype))


def gelu_bias_residual(rows: int, cols: int, dtype: torch.dtype) -> Workload:
    def build(device: torch.device) -> Instance:
        g = _gen(device)
        x, b, r = _randn((rows, cols), dtype, device, g), _randn((cols,), dtype, device, g), _randn((rows, cols), dtype, device, g)
        return Instance(gelu_bias_residual_fn, (x, b, r))

    return Workload("gelu_bias_residual", f'gelu(x + b, "tanh") + r {_short(dtype)} {rows}x{cols}', build, *_tol(dtype))


def cross_entropy(rows: int, classes: int, dtype: torch.dtype) -> Workload:
    def build(device: torch.device) -> Instance:
        g = _gen(device)
        logits = _randn((rows, classes), dtype, device, g)
        target = torch.randint(0, classes, (rows,), generator=g, device=device, dtype=torch.int64)
        return Instance(cross_entropy_fn, (logits, target))

    return Workload("cross_entropy", f"cross_entropy(logits.float(), t) {_short(dtype)} {rows}x{classes}", build, *_tol(dtype))


def silu_mul(rows: int, cols: int, dtype: torch.dtype) -> Workload:
    return _rows("silu_mul", silu_mul_fn, "silu(g) * u", rows, cols, dtype, matrices=2)


def add_transpose(n: int, dtype: torch.dtype = torch.float32) -> Workload:
    return _rows("add_transpose", add_transpose_fn, "x + y.t()", n, n, dtype, matrices=2)


def chain(rows: int, cols: int) -> Workload:
    def build(device: torch.device) -> Instance:
        return Instance(chain_fn, (_randn((rows, cols), torch.float32, device, _gen(device)),))

    text = f"{CHAIN_STEPS}x y = y - y.amax(-1, keepdim=True) * 0.5 (2,000 nodes) f32 {rows}x{cols}"
    return Workload("graph_2000", text, build, 1e-3, 1e-4, frozenset({"slow_compile"}))


def transformer(batch: int, seq: int, d_model: int, heads: int, dtype: torch.dtype) -> Workload:
    def build(device: torch.device) -> Instance:
        torch.manual_seed(0)
        model = Block(d_model, heads).to(device=device, dtype=dtype)
        x = _randn((batch, seq, d_model), dtype, device, _gen(device))
        return Instance(model, (x,), train_step, tuple(model.parameters()))

    rtol, atol = (5e-2, 2e-2) if dtype == torch.bfloat16 else (1e-2, 1e-3)
    text = f"transformer block fwd+bwd {_short(dtype)} b{batch} s{seq} d{d_model} h{heads}"
    return Workload("transformer_block", text, build, rtol, atol, frozenset({"slow_compile"}))
