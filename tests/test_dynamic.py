"""Dynamic shapes: torch.compile(dynamic=True) and automatic dynamic compile one
graph for every size, run coil's kernels (not eager) at each size, and match eager.

Each case is called at three batch sizes and three sequence lengths; the counters
Dynamo and coil keep (torch._dynamo.utils.counters) say how many graphs were
captured, compiled and left eager."""

from __future__ import annotations

from typing import Any, Callable

import attrs
import pytest
import sympy
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import coil
from coil.ir.shapes import EMPTY, ShapeInfo, SymbolFacts, py_size, size_symbol
from coil.options import Options
from tests_helpers import compiled_counted

HAS_CUDA = torch.cuda.is_available()
CUDA = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
# (target, device): triton on CPU tensors runs under TRITON_INTERPRET=1 (CI), on CUDA compiled
TARGETS = [("cpp", "cpu"), ("reference", "cpu"), ("triton", "cpu"), pytest.param(("triton", "cuda"), marks=CUDA)]
SIZES = [(2, 3), (5, 17), (16, 64)]  # (batch, sequence): three of each


def _on(device: str, args: Any) -> Any:
    return tuple(a.to(device) for a in args) if isinstance(args, tuple) else args.to(device)


def _seed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (torch.relu(x) + y).sum(-1) * 2


CASES: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[torch.Tensor, ...]]]] = {
    "seed": (_seed, lambda b, s: (torch.randn(b, s), torch.randn(b, s))),
    "softmax": (lambda x: torch.softmax(x, -1), lambda b, s: (torch.randn(b, s),)),
    "layer_norm": (lambda x, w, bias: F.layer_norm(x, (32,), w, bias),
                   lambda b, s: (torch.randn(b, s, 32), torch.randn(32), torch.randn(32))),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda b, s: (torch.randn(b, s), torch.randint(0, s, (b,)))),
}


_compiled = compiled_counted


@pytest.mark.parametrize("where", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_true_compiles_one_graph_for_every_size(case: str, where: tuple[str, str]) -> None:
    target, device = where
    fn, make = CASES[case]
    f = _compiled(fn, target, dynamic=True)
    for b, s in SIZES:
        args = _on(device, make(b, s))
        torch.testing.assert_close(f(*args), fn(*args))
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["symbolic"] == 1
    assert counters["coil"]["eager"] == 0


@pytest.mark.parametrize("where", TARGETS)
def test_training_forward_and_backward_compile_once(where: tuple[str, str]) -> None:
    target, device = where

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1) * x

    f = _compiled(fn, target, dynamic=True)
    for b, s in SIZES:
        x = torch.randn(b, s, device=device)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref = f(x1), fn(x2)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad)
    assert counters["coil"]["compiled"] == 2 and counters["coil"]["eager"] == 0  # forward and backward


@pytest.mark.parametrize("where", TARGETS)
def test_automatic_dynamic_serves_later_sizes(where: tuple[str, str]) -> None:
    """The default mode: the first size compiles a static graph, the first change
    a symbolic one, which serves every later size without compiling again."""
    target, device = where
    fn, make = CASES["softmax"]
    f = _compiled(fn, target)
    for b, s in [(8, 16), (16, 16), (13, 16), (3, 16)]:
        args = _on(device, make(b, s))
        torch.testing.assert_close(f(*args), fn(*args))
    assert counters["coil"]["compiled"] == 2 and counters["coil"]["symbolic"] == 1
    assert counters["coil"]["eager"] == 0


@pytest.mark.parametrize("where", [("cpp", "cpu"), ("reference", "cpu"), pytest.param(("triton", "cuda"), marks=CUDA)])
def test_transformer_block_forward_and_backward(where: tuple[str, str]) -> None:
    """A transformer encoder layer in training (attention, layer norms, the MLP):
    one forward and one backward graph for every batch size and sequence length,
    outputs and every parameter's gradient as eager's."""
    import copy

    target, device = where
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(device)
    ref = copy.deepcopy(layer)
    f = _compiled(layer, target, dynamic=True)
    for b, s in SIZES:
        x = torch.randn(b, s, 32, device=device)
        out, want = f(x), ref(x)
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        out.sum().backward()
        want.sum().backward()
        for p, q in zip(layer.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 2 and counters["coil"]["eager"] == 0


@pytest.mark.parametrize("where", [("cpp", "cpu"), pytest.param(("triton", "cuda"), marks=CUDA)])
def test_hf_gpt2_from_config(where: tuple[str, str]) -> None:
    """GPT-2 (random weights from a config) in inference: one graph for three
    batch sizes and three sequence lengths."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=256, n_positions=128,
                                  bos_token_id=0, eos_token_id=0)
    target, device = where
    model = transformers.GPT2LMHeadModel(cfg).eval().to(device)
    f = _compiled(model, target, dynamic=True)
    with torch.no_grad():
        for b, s in SIZES:
            ids = torch.randint(0, 256, (b, s), device=device)
            torch.testing.assert_close(f(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def test_option_off_runs_symbolic_graphs_eagerly() -> None:
    fn, make = CASES["softmax"]
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(fn, backend="coil", options={"target": "cpp", "dynamic": False}, dynamic=True)
    args = make(4, 8)
    torch.testing.assert_close(f(*args), fn(*args))
    assert counters["coil"]["eager"] == 1 and counters["coil"]["compiled"] == 0


@pytest.mark.parametrize("case", ["softmax", "cross_entropy"])
def test_no_guards_added(case: str) -> None:
    """coil decides by proofs over the ranges and by hints, never by guarding: the
    ShapeEnv holds as many guards after coil compiled the graph as before (the
    cross_entropy's nll_loss is lowered from its decomposition, traced on the
    graph's fake tensors)."""
    from torch._dynamo.backends.common import aot_autograd

    seen: list[tuple[int, int]] = []

    def inner(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        env = next(a for a in example_inputs if isinstance(a, torch.SymInt)).node.shape_env
        before = len(env.guards)
        compiled = coil.compile_graph(gm, example_inputs, Options(target="cpp"), kind="inference")
        seen.append((before, len(env.guards)))
        return lambda *args: compiled.call_boxed(list(args))

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        return aot_autograd(fw_compiler=inner, inference_compiler=inner)(gm, example_inputs)

    torch._dynamo.reset()
    fn, make = CASES[case]
    f = torch.compile(fn, backend=backend, dynamic=True)
    with torch.no_grad():
        args = make(6, 10)
        torch.testing.assert_close(f(*args), fn(*args))
    assert seen and all(a == b for a, b in seen)


def test_symbolic_cross_entropy_never_writes_its_log_softmax() -> None:
    """nll_loss_forward over symbolic sizes is lowered from its decomposition (a
    gather of each row's target), as over static ones, not run as an Extern that
    reads a float32 log_softmax the size of the logits: the kernels keep it in
    registers and write only a max and a sum per row (with the Extern, the H200's
    dynamic cross_entropy of 32000 classes ran 2.86x its static time)."""
    from coil.ir.lowered import Extern
    from coil.ir.wrapper import Alloc, ExternCall
    from tests_helpers import capture_aot

    fn, make = CASES["cross_entropy"]
    gm, example = capture_aot(fn, make(8, 16))
    for target in ("cpp", "triton"):
        lowered = coil.default_pipeline().run(gm, example, until="lower", options=Options(target=target))
        assert not [n.name for n in lowered.nodes if isinstance(n, Extern)]
        w = coil.default_pipeline().run(gm, example, until="wrap", options=Options(target=target))
        assert not any(isinstance(ln, ExternCall) for ln in w.lines)
        assert [ln.layout.size for ln in w.lines if isinstance(ln, Alloc)] == [(size_symbol(0), 1)] * 2 + [()]


@pytest.mark.parametrize("target", ["cpp", "reference", "triton"])
def test_symbolic_index_checks_raise_eagers_errors(target: str) -> None:
    """An index out of range in a symbolic graph raises eager's error on every
    target; a device assert (Triton) names the size by its symbol, whose value its
    constant message cannot carry."""
    cases = [(lambda x, i: x.gather(1, i), lambda s: (torch.randn(4, s), torch.full((4, 2), s + 3)),
              RuntimeError, "out of bounds for dimension 1 with size"),
             (lambda x, t: F.cross_entropy(x, t), lambda s: (torch.randn(4, s), torch.full((4,), s + 3)),
              IndexError, "Target .*out of bounds")]
    for fn, make, exc, message in cases:
        f = _compiled(fn, target, dynamic=True)
        x, i = make(10)
        torch.testing.assert_close(f(x, torch.zeros_like(i)), fn(x, torch.zeros_like(i)))
        for s in (10, 12):
            with pytest.raises(exc, match=message):
                fn(*make(s))
            with pytest.raises(exc, match=message):
                f(*make(s))
        assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def test_wrapper_binds_symbols_and_passes_them_to_kernels() -> None:
    """The printed wrapper of a symbolic softmax: each symbol's facts, where call
    reads it, and every kernel taking the symbols it uses."""
    from coil.ir.printer import show
    from tests_helpers import capture_aot

    gm, example = capture_aot(lambda x: torch.softmax(x, -1), (torch.randn(8, 16),))
    w = coil.default_pipeline().run(gm, example, until="wrap", options=Options(target="cpp"))
    text = show(w)
    assert "# size s0 in [2, oo] hint 8" in text and "# size s1 in [2, oo] hint 16" in text
    assert "s0 = arg0_1" in text and "s1 = arg1_1" in text
    calls = [ln for ln in text.splitlines() if ln.strip().startswith("cpp_fused")]
    assert calls and all(ln.rstrip(")").endswith("s0, s1") for ln in calls)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_symbolic_cuda_launches_skip_tritons_binding() -> None:
    """On CUDA a symbolic graph's kernels launch through SizedLaunchers: Triton's
    binding runs once a specialization (rows a multiple of 16, or not), and
    every other size is one call of the bound launcher; each matches eager.  A
    misaligned input goes through the keyed path and is right too."""
    from coil.backends.runtime import load_module
    from coil.backends.triton.runtime import SizedLauncher
    from tests_helpers import capture_aot

    fn = lambda x: torch.softmax(x, -1) * x.sum(-1, keepdim=True)  # noqa: E731
    module = coil.default_pipeline().run(*capture_aot(fn, (torch.randn(32, 48, device="cuda"),)),
                                         options=Options(target="triton"))
    compiled = load_module(module)
    launchers = [v for v in compiled.namespace.values() if isinstance(v, SizedLauncher)]
    assert launchers and all(f.keyed.enabled for f in launchers), module.source
    for rows, cols in [(32, 48), (64, 48), (48, 96), (33, 48), (35, 50), (160, 48), (64, 48)]:
        x = torch.randn(rows, cols, device="cuda")
        (got,) = compiled(rows, cols, x)
        torch.testing.assert_close(got, fn(x), atol=1e-4, rtol=1e-4)
    shifted = torch.randn(33 * 48 + 1, device="cuda")[1:].view(33, 48)
    torch.testing.assert_close(compiled(33, 48, shifted)[0], fn(shifted), atol=1e-4, rtol=1e-4)
    # (multiple of 16, not) for rows and columns as launched: (32|64|48|160 rows, 48|96 cols), (33|35, 48|50)
    # (a kernel with a persistent variant launches one of the two at each size)
    assert all(len(f.bound) <= 3 for f in launchers) and any(f.bound for f in launchers), \
        [(list(f.bound), f.rule) for f in launchers]
    assert all(f.rule.startswith("bound") for f in launchers if f.bound), [f.rule for f in launchers]


def _fake_symbolic_cuda(fn: Callable[..., Any], *sizes: int) -> str:
    """output_code.py of fn on a fake CUDA tensor of symbolic sizes (nothing runs)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    syms = [env.create_symintnode(env.create_symbol(h, ConstantSource(f"d{i}"), dynamic_dim=DimDynamic.DYNAMIC),
                                  hint=h) for i, h in enumerate(sizes)]
    with FakeTensorMode(shape_env=env):
        x = torch.empty(*syms, device="cuda")
    gm = make_fx(lambda *a: fn(a[-1]), tracing_mode="fake")(*syms, x)
    out = coil.default_pipeline().run(gm, [*syms, x], until="kernel_gen",
                                      options=Options(target="triton", graph_cache=False))
    return str(out.source)


def test_symbolic_cuda_source_launches_through_sized_launchers() -> None:
    """Generated for a fake CUDA tensor of symbolic sizes: every launch is a
    SizedLauncher's, given the stream (None when the input is not 16-byte
    aligned), the grid and the sizes this call computes; both kernels of a
    persistent-or-looped choice have one, and so do their int64 twins."""
    text = _fake_symbolic_cuda(lambda x: (torch.softmax(x, -1) * x.sum(-1, keepdim=True),), 32, 48)
    assert "stream0 = None if (" in text and "& 15 else raw_stream(0)" in text, text
    defs = [ln.split(" = ")[0] for ln in text.splitlines() if " = SizedLauncher(" in ln]
    kernels = ["triton_per_fused_amax_div_exp_mul_sub_sum_0", "triton_red_fused_amax_div_exp_mul_sub_sum_0"]
    tiers = [f"launch_{kernels[0]}{w}_r{rb}" for w in ("", "_i64") for rb in (128, 256, 512, 1024, 2048, 4096, 8192)]
    assert sorted(defs) == sorted([f"launch_{k}{w}" for k in kernels for w in ("", "_i64")] + tiers), text
    calls = [ln.strip() for ln in text.split("def call", 1)[1].splitlines() if ln.strip().startswith("launch_triton_")]
    assert len(calls) == 18 and all(c.split("(", 1)[1].startswith("stream0, grid(s0, ") for c in calls), calls
    # a tier's launcher: the persistent kernel at a longer row's RBLOCK
    assert (f"launch_{kernels[0]}_r1024 = SizedLauncher({kernels[0]}, {{'XBLOCK': 4, 'RBLOCK': 1024, "
            "'num_warps': 4})") in text, text
    assert "        if s0*s1 < 2147483648:\n            if s1 <= 64:\n" in text, text
    assert all("(s0, s1, s0, s1), " in c for c in calls), calls
    assert not any(ln.endswith(")") and "= fast_launch(" in ln for ln in text.splitlines()), text


def test_int64_twins_where_offsets_pass_int32() -> None:
    """A symbolic Triton kernel whose offsets fit int32 at the hints but not in
    its ranges computes in int32 and has an int64 twin (KernelSpec.wide), printed
    with its test; the call launches the twin where an offset reaches 2**31.
    Here the test is made false in the source (2**31 elements will not fit a CPU
    test): the twins run every kernel and match eager.  Bounded sizes get no twin."""
    from coil.backends.runtime import load_module
    from tests_helpers import capture_aot

    fn = lambda x, w: (torch.softmax(x, -1) * w, (x * w).sum(-1))  # noqa: E731
    gm, example = capture_aot(fn, (torch.randn(8, 48), torch.randn(48)))
    module = coil.default_pipeline().run(gm, example, options=Options(target="triton", graph_cache=False))
    specs = module.program.specs
    assert specs and all(k.wide is not None and not k.wide_index for k in specs), [k.wide for k in specs]
    assert all(v.wide_index for k in specs for v in k.wide_twin().variants)
    assert module.source.count(" < 2147483648:") == len(specs)
    twins = load_module(attrs.evolve(module, source=module.source.replace(" < 2147483648:", " < 0:")))
    for rows, cols in [(8, 48), (13, 48), (5, 100)]:
        x, w = torch.randn(rows, cols), torch.randn(cols)
        for got, want in zip(twins(rows, cols, x, w), fn(x, w)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    launched = [ln.split("[")[0].strip() for ln in module.source.split("def call", 1)[1].splitlines() if "](" in ln]
    assert any(name.endswith("_i64") for name in launched) and any(not n.endswith("_i64") for n in launched)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_a_batch_past_int32_offsets_launches_the_int64_twin() -> None:
    """Compiled at a small batch, called with one whose tensor has more than 2**31
    elements (4 GiB of bfloat16): the int64 twin runs and matches eager."""
    f = compiled_counted(lambda x: (x.float() * 2).sum(-1), "triton", dynamic=True)
    for rows in (64, 96):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(f(x), (x.float() * 2).sum(-1), atol=1e-2, rtol=1e-4)
    big = torch.ones(2**31 // 4096 + 16, 4096, device="cuda", dtype=torch.bfloat16)
    got = f(big)
    assert got.shape == (big.shape[0],) and bool((got == 8192.0).all()), got[-4:]
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def _padded_slice_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    return F.pad(x * 2, (0, 16 - n % 16))[:, :n] @ w


def test_a_slice_of_a_padded_row_reaches_an_extern_as_a_view() -> None:
    """A symbolic slice of a padded tensor (what scaled_dot_product_attention makes
    of a mask for memory-efficient attention) is an alias of the padded buffer, its
    row stride an expression of the sizes, not a contiguous copy: memory-efficient
    attention refuses a mask whose rows are not aligned (GPT-2 on CUDA)."""
    from coil.ir.buffers import AliasBuffer, ExternBuffer
    from tests_helpers import capture_aot

    gm, example = capture_aot(_padded_slice_mm, (torch.randn(8, 9), torch.randn(9, 4)))
    bg = coil.default_pipeline().run(gm, example, until="realize", options=Options(target="cpp"))
    mm = next(b for b in bg.buffers if isinstance(b, ExternBuffer) and b.kernel == "aten.mm.default")
    arg = next(b for b in bg.buffers if b.name == mm.args[0].name)
    assert isinstance(arg, AliasBuffer), arg
    assert not isinstance(arg.layout.stride[0], int) and "16" in str(arg.layout.stride[0]), arg.layout


def _padded_mask_attention(q: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """GPT-2's mask as scaled_dot_product_attention hands it to memory-efficient
    attention: padded to a multiple of 8, sliced back, expanded over the heads."""
    b, h, n, _ = q.shape
    mask = F.pad(m.unsqueeze(1) * 2, (0, 8 - n % 8))[..., :n].expand(b, h, n, n)
    return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_an_expanded_slice_of_a_padded_mask_reaches_attention_as_a_view() -> None:
    from coil.ir.buffers import AliasBuffer, ExternBuffer
    from tests_helpers import capture_aot

    gm, example = capture_aot(_padded_mask_attention, (torch.randn(2, 4, 9, 16), torch.randn(2, 9, 9)))
    bg = coil.default_pipeline().run(gm, example, until="realize", options=Options(target="cpp"))
    attn = next(b for b in bg.buffers if isinstance(b, ExternBuffer) and "scaled_dot_product" in b.kernel)
    mask = next(b for b in bg.buffers if b.name == dict(attn.kwargs)["attn_mask"].name)
    assert isinstance(mask, AliasBuffer), mask
    assert mask.layout.stride[1] == 0 and "8" in str(mask.layout.stride[2]), mask.layout
    f = _compiled(_padded_mask_attention, "cpp", dynamic=True)
    for b, n in [(2, 9), (3, 17), (2, 32)]:
        q, m = torch.randn(b, 4, n, 16), torch.randn(b, n, n)
        torch.testing.assert_close(f(q, m), _padded_mask_attention(q, m), atol=1e-4, rtol=1e-4)
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


@pytest.mark.parametrize("where", TARGETS)
def test_padded_slices_compile_once_and_match(where: tuple[str, str]) -> None:
    target, device = where
    f = _compiled(_padded_slice_mm, target, dynamic=True)
    for rows, n in [(8, 9), (5, 17), (16, 33)]:
        x, w = torch.randn(rows, n, device=device), torch.randn(n, 4, device=device)
        torch.testing.assert_close(f(x, w), _padded_slice_mm(x, w), atol=1e-4, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def test_a_full_reduction_of_symbolic_length_is_configured_for_long_rows() -> None:
    """cross_entropy's mean over the batch is one row as long as the batch: at the
    hint (16) it would get one warp looping over a row that grows with the batch;
    it is configured for rows of few_rows_block, and says so."""
    from coil.options import TRITON_LAUNCH
    from tests_helpers import capture_aot

    gm, example = capture_aot(F.cross_entropy, (torch.randn(16, 100), torch.randint(0, 100, (16,))))
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="triton"))
    (full,) = [k for k in kp.specs if k.group[0] == 1]
    (ln,) = full.launches  # the looped kernel's (a choice's persistent variant keeps the hint)
    assert ln.config.rblock == TRITON_LAUNCH.few_rows_block, ln
    assert f"configured for {TRITON_LAUNCH.few_rows_block}" in ln.why, ln.why
    rows = [k for k in kp.specs if k.group[0] != 1]
    assert rows and all("configured for" not in ln.why for k in rows for ln in k.launches)


def test_shape_info_proves_over_ranges_and_hints_for_speed() -> None:
    s0, s1 = size_symbol(0), size_symbol(1)
    info = ShapeInfo((SymbolFacts(s0, 8, 2, None), SymbolFacts(s1, 16, 2, 512)))
    assert info.hint(s0 * s1 + 3) == 131
    assert info.known_le(s1, 512) and not info.known_le(s0, 512)
    assert info.known_eq(s0 * s1, s1 * s0) and not info.known_eq(s0, s1)
    assert info.known_multiple(4 * s0 + 8, 4) and not info.known_multiple(4 * s0 + 2, 4)
    assert info.bounds(4 * s1) == (8, 2048) and info.bounds(s0) == (2, None)
    assert not EMPTY and EMPTY.hint(7) == 7
    from coil.ir.indexing import FloorDiv, ModularIndexing

    assert py_size(FloorDiv(s0 * s1, 2) + s0) == "s0 + ((s0*s1) // 2)"
    # a floor division by a number moves with its numerator: s0 - s0 // 2 is at least 1 (the
    # second half of a row: a rotary embedding's slice), which intervals alone lose
    assert info.known_le(FloorDiv(s0, 2), s0) and info.bounds(s0 - FloorDiv(s0, 2)) == (1, None)
    assert info.bounds(s0 - 2 * FloorDiv(s0, 2)) == (0, 1) and info.bounds(ModularIndexing(s0, 1, 4)) == (0, 3)
    assert info.bounds(3 * FloorDiv(s1, 3) - s1) == (-2, 0) and not info.known_le(FloorDiv(s0, 2) + 1, s0 - 2)
    for e in (FloorDiv(s0, 2 * s1), ModularIndexing(s0 + s1, s1, 3), FloorDiv(s0 + 127, 128) * s1,
              (FloorDiv(s1 - 1, 2) + 1) ** 2 * 16):  # a conv's output area: (((s1 - 1) // 2) + 1) ** 2
        # each side of // and % whole: the printed size is the expression's value
        assert eval(py_size(e), {"s0": 12, "s1": 3}) == int(e.xreplace({s0: 12, s1: 3}))
    assert isinstance(sympy.expand(s0 - s0), sympy.Integer)


def test_graph_cache_serves_another_batch_size(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph cache keys a symbolic graph by its code, its inputs' symbolic
    sizes and their ranges, not the sizes of the first call: compiled at batch 8,
    the entry serves batch 13 after a reset, without running the pipeline."""
    from coil.passes.pipeline import Pipeline

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1) * 2

    opts = {"target": "cpp", "cache_dir": str(tmp_path), "eager_fallback": False}
    torch._dynamo.reset()
    with torch.no_grad():
        x = torch.randn(8, 40)
        torch.testing.assert_close(torch.compile(fn, backend="coil", dynamic=True, options=opts)(x), fn(x))

    def forbid(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the pipeline ran: the cache missed")

    monkeypatch.setattr(Pipeline, "run", forbid)
    torch._dynamo.reset()
    with torch.no_grad():
        x = torch.randn(13, 40)
        torch.testing.assert_close(torch.compile(fn, backend="coil", dynamic=True, options=opts)(x), fn(x))
    torch._dynamo.reset()


def test_graph_cache_keys_symbol_ranges() -> None:
    """A graph compiled for a bounded range (mark_dynamic's max) has another key
    than the same graph over an unbounded one."""
    from coil.graph_cache import _symbol_ranges
    from tests_helpers import capture_aot

    _, unbounded = capture_aot(lambda x: x * 2, (torch.randn(8, 4),))
    x = torch.randn(8, 4)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    _, bounded = capture_aot(lambda x: x * 2, (x,))
    assert _symbol_ranges(unbounded) != _symbol_ranges(bounded)
    assert any("[2, 64]" in r for r in _symbol_ranges(bounded))


def _even_rows(x: torch.Tensor) -> torch.Tensor:
    torch._check(x.shape[0] % 2 == 0)  # a guard on the size: s0 even
    return x * 2


def test_graph_cache_keys_the_rules_of_dynamos_guards() -> None:
    """Two graphs of the same symbols whose guards differ (one knows s0 is even)
    compile to different code (guard_rules: masks dropped, sizes rewritten), and
    one must not serve the other from the cache."""
    from coil.graph_cache import _symbol_ranges
    from tests_helpers import capture_aot

    _, plain = capture_aot(lambda x: x * 2, (torch.randn(8, 4),))
    _, even = capture_aot(_even_rows, (torch.randn(8, 4),))
    assert _symbol_ranges(plain) == ["s0 in [2, oo]", "s1 in [2, oo]"]
    assert _symbol_ranges(even)[:2] == _symbol_ranges(plain)
    assert "guard ModularIndexing(s0, 1, 2) = 0" in _symbol_ranges(even)


def test_symbolic_inputs_are_checked_at_their_sizes() -> None:
    """A compiled symbolic graph called directly checks each input against its
    layout at the sizes the call binds: right sizes run, a tensor that disagrees
    with the bound sizes is refused with both the expression and its value."""
    from tests_helpers import capture_aot

    gm, example = capture_aot(lambda x, y: x + y, (torch.randn(8, 16), torch.randn(8, 16)))
    compiled = coil.compile_graph(gm, example, Options(target="cpp"))
    n_sizes = sum(isinstance(e, torch.SymInt) for e in example)
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    torch.testing.assert_close(compiled(*([5, 7][:n_sizes]), x, y)[0], x + y)
    with pytest.raises(coil.CoilError, match=r"here, called with size \[5, 6\]"):
        compiled(*([5, 7][:n_sizes]), x, torch.randn(5, 6))


def test_peak_is_an_expression_and_the_report_evaluates_it_at_the_hints() -> None:
    """plan_memory's peak of a symbolic graph is an expression of its sizes whose
    value at the hints is peak_bytes, as the wrapper's replay finds it; the memory
    report (debug_dir's memory_plan.txt) prints both."""
    from coil.ir.invariants import replay_peak_expr
    from coil.passes.plan_memory import peak_expression
    from coil.report import peak_report
    from tests_helpers import capture_aot

    gm, example = capture_aot(lambda x: torch.softmax(x, -1).exp() * x, (torch.randn(8, 16),))
    plan = coil.default_pipeline().run(gm, example, until="plan_memory", options=Options(target="cpp"))
    peak = peak_expression(plan)
    assert isinstance(peak, sympy.Expr) and plan.shapes.hint(peak) == plan.peak_bytes
    w = coil.default_pipeline().run(gm, example, until="wrap", options=Options(target="cpp"))
    assert sympy.expand(replay_peak_expr(w) - peak) == 0
    text = peak_report(plan)
    assert f"peak {peak} bytes, at the hints (s0=8, s1=16)" in text and f"peak {plan.peak_bytes} bytes" in text


class _ConvNeXtBlock(torch.nn.Module):
    """A strided convolution, a depthwise one, a LayerNorm over channels through
    permutes and a residual: sizes like ((s1 - 1) // 2 + 1) ** 2 and FloorDiv(s1, 4)
    squared in indices, as ResNet's and ConvNeXt's (from the HF models under
    dynamic=True, which once printed them with the wrong precedence)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.dw = torch.nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(self.stem(x), 2)
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        return x + torch.nn.functional.gelu(self.fc(y)).permute(0, 3, 1, 2)


@pytest.mark.parametrize("name", ["convnext", "resnet"])
def test_hf_vision_models_with_symbolic_spatial_sizes(name: str) -> None:
    """HF ConvNeXt and ResNet (bench.hf_models' tiny size) under dynamic=True on cpp:
    their indices divide by squared spatial sizes, which were once printed with
    the wrong precedence (wrong results at the second size)."""
    pytest.importorskip("transformers")
    import dataclasses

    from bench.hf_models import ALL_MODELS, SIZES

    spec, base = ALL_MODELS[name], SIZES["tiny"]
    torch.manual_seed(0)
    model = spec.build(base, spec.attn).eval()
    f = _compiled(model, "cpp", dynamic=True)
    with torch.no_grad():
        for batch in (base.batch, base.batch + 1):
            kw = spec.inputs(dataclasses.replace(base, batch=batch), torch.Generator().manual_seed(batch), False)
            torch.testing.assert_close(f(**kw).logits, model(**kw).logits, atol=1e-3, rtol=1e-3)
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_convolutions_with_symbolic_spatial_sizes(target: str) -> None:
    torch.manual_seed(0)
    m = _ConvNeXtBlock().eval()
    f = _compiled(m, target, dynamic=True)
    with torch.no_grad():
        for b, hw in ((2, 32), (3, 42), (5, 20)):
            x = torch.randn(b, 3, hw, hw)
            torch.testing.assert_close(f(x), m(x), atol=1e-4, rtol=1e-4)
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def test_hf_t5_trains_with_symbolic_sizes() -> None:
    """T5 (bench.hf_models' tiny size) trains under dynamic=True on cpp: its relative
    position buckets made a loop nest of s0*s1 - s0 that the kernel verifier once
    compared with the group s0*(s1 - 1) structurally and refused; loss and every
    gradient match eager at two sizes, all four graphs compiled."""
    pytest.importorskip("transformers")
    import copy
    import dataclasses

    from bench.hf_models import ALL_MODELS, SIZES

    spec, base = ALL_MODELS["t5"], SIZES["tiny"]
    torch.manual_seed(0)
    model = spec.build(base, spec.attn).train()
    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
    ref = copy.deepcopy(model)
    f = _compiled(model, "cpp", dynamic=True)
    for batch, seq in ((base.batch, base.seq), (base.batch + 1, base.seq + 5)):
        kw = spec.inputs(dataclasses.replace(base, batch=batch, seq=seq), torch.Generator().manual_seed(1), True)
        model.zero_grad()
        ref.zero_grad()
        got, want = f(**kw).loss, ref(**kw).loss
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for p, q in zip(model.parameters(), ref.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3)
    assert counters["coil"]["compiled"] == 4 and counters["coil"]["eager"] == 0


def _empty_batch(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return F.pad(x, (1, 2), mode="circular"), F.unfold(y, 2, 1, 0, 1)


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_an_empty_dim_beside_symbolic_ones_compiles(target: str) -> None:
    """A dim of 0 (Dynamo specializes it) beside symbolic ones: each position's
    index took a modulo by that 0 (OpInfo's circular pad and unfold samples under
    dynamic=True ran eagerly: `integer modulo by zero`)."""
    torch._dynamo.reset()
    g = torch.compile(_empty_batch, backend="coil", dynamic=True, options={"target": target})
    for n in (3, 5):
        args = (torch.randn(0, 3, n), torch.randn(0, 1, n, n))
        for got, want in zip(g(*args), _empty_batch(*args)):
            torch.testing.assert_close(got, want)


def _split_then_read(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x * 2
    a, b = torch.chunk(y, 2, 0)  # a symbolic dim: aten's split, an Extern returning views of y
    return x + a.sum(), b * 3


def test_an_externs_views_keep_their_base_alive() -> None:
    """aten.split (an Extern for a symbolic dim) returns views of its argument: the
    argument's storage lives until the last reader of any of its pieces.  Memory
    planning freed it at the split and gave its storage to a later buffer of the
    same size, while a piece was still read (ProphetNet's decoder at a symbolic
    length: logits off by 2e-3, on every target)."""
    from coil.ir.lowered import extern_tensor_names
    from coil.ir.schedule import viewed_storages
    from tests_helpers import capture_aot

    gm, ins = capture_aot(_split_then_read, (torch.randn(8, 8),))
    plan = coil.default_pipeline().run(gm, ins, until="plan_memory", options=coil.Options(target="reference"))
    bg = plan.buffer_graph
    (split,) = [b for b in bg.buffers if getattr(b, "kernel", "") == "aten.split.Tensor"]
    (y,) = extern_tensor_names((split.args, ()))
    pieces = [b.name for b in bg.buffers if getattr(b, "extern", None) == split.name]
    assert pieces and all(y in viewed_storages(bg, p) for p in pieces)
    dies = next(i for i, ps in enumerate(plan.steps) if y in ps.last_usage)
    last_read = max(i for i, ps in enumerate(plan.steps) for p in pieces
                    if p in {d.name for n in ps.step.nodes for d in plan.schedule_graph.node(n).read_writes.reads})
    assert dies >= last_read


def _pieces_returned(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 2
    a, b = torch.chunk(y, 2, 0)  # aten's split at a symbolic dim: pieces that are views of y
    return a, b, x * a.sum()


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_pieces_of_an_extern_that_are_outputs_keep_their_base(target: str) -> None:
    """A returned piece of aten.split's result lies in the split's argument: that
    storage is an output's, and no later buffer may take it.  Memory planning gave
    it to `x * a.sum()` (the same byte size) once `a` was read, and the returned
    pieces came back overwritten (JetMoE's training forward, which returns the
    experts' rows for the backward: a weight's gradient off by 1e-2)."""
    from coil.ir.schedule import viewed_storages
    from tests_helpers import capture_aot

    x = torch.randn(8, 8)
    gm, ins = capture_aot(_pieces_returned, (x,))
    plan = coil.default_pipeline().run(gm, ins, until="plan_memory", options=coil.Options(target=target))
    bg = plan.buffer_graph
    (split,) = [b for b in bg.buffers if getattr(b, "kernel", "") == "aten.split.Tensor"]
    (base,) = viewed_storages(bg, split.name)
    assert not any(base in ps.last_usage or base in ps.frees for ps in plan.steps)
    assert not any(old == base for ps in plan.steps for _, old in ps.reuses)
    torch._dynamo.reset()
    got = torch.compile(_pieces_returned, backend="coil", dynamic=True, options={"target": target})(x)
    for g, w in zip(got, _pieces_returned(x)):
        torch.testing.assert_close(g, w)


def _bag(w: torch.Tensor, idx: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor) -> torch.Tensor:
    return F.embedding_bag(idx, w, offsets, mode="sum", per_sample_weights=psw)


def test_a_backward_input_only_externs_read_is_taken_at_its_real_size() -> None:
    """bf16 embedding_bag's offset2bag, saved for the backward, comes back empty
    on the CPU where its meta function says one row per index: the backward
    graph's check refused the call (`compiled for size [s1] = [5] here, called
    with size [0]`, OpInfo under dynamic=True with gradients).  Only externs read
    it and no symbol is read from it, so it is taken as eager takes it."""
    torch.manual_seed(0)
    w = torch.randn(10, 5, dtype=torch.bfloat16, requires_grad=True)
    idx, offsets = torch.tensor([1, 4, 2, 7, 0]), torch.tensor([0, 3])
    psw = torch.randn(5, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 5, dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(_bag, backend="coil", dynamic=True, options={"target": "cpp"})
    got = compiled(w, idx, offsets, psw)
    got_grads = torch.autograd.grad(got, (w, psw), g)
    want = _bag(w, idx, offsets, psw)
    want_grads = torch.autograd.grad(want, (w, psw), g)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)


def test_a_symbolic_float_sum_runs_in_blocks_and_stays_near_eager() -> None:
    """A float sum over a row of symbolic length runs in blocks on the cpp target
    (LoopNest.rblock with symbolic sizes too: a row may be longer than its hint),
    the blocks folded in double.  Without them, one add chain a lane: x.sum() of
    2^22 values of 0.1 through dynamic=True was 2.5e-3 off, relative (eager
    1.5e-7), outside assert_close's tolerance of eager."""
    from tests_helpers import capture_aot

    gm, example = capture_aot(lambda x: x.sum(-1), (torch.randn(4, 3000),))
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="cpp"))
    (k,) = kp.specs
    assert k.nest is not None and not all(isinstance(s, int) for s in k.nest.rsizes) and k.nest.rblock == 1024
    f = _compiled(lambda x: x.sum(), "cpp", dynamic=True)
    for n in (1 << 12, 1 << 22):
        x = torch.full((n,), 0.1)
        exact = torch.tensor(0.1).double() * n
        ours, eagers = abs(f(x).double() - exact).item(), abs(x.sum().double() - exact).item()
        assert ours <= max(8 * eagers, 4 * torch.finfo(torch.float32).eps * exact.item()), (n, ours, eagers)


def test_symbolic_rows_hoist_their_invariants_and_keep_row_scratch() -> None:
    """softmax over rows of symbolic length divides by the row's sum through its
    reciprocal, computed once a row (invariants hoisted only where the ranges prove
    a row is never empty), and keeps exp of the row in a scratch array chosen at
    the row's hint and sized at run time (coil_row_scratch: a buffer per thread,
    grown to the longest row met).  Before: the division ran in the loop (dynamic
    softmax over (3000, 4096) on one thread 33 ms, static 28), then exp ran twice
    a row (over (256, 4096) 1.03 ms, static 0.75; now 0.76)."""
    from coil.ir.printer_kernel import show_scratch
    from tests_helpers import capture_aot

    gm, example = capture_aot(lambda x: torch.softmax(x, -1), (torch.randn(16, 300),))
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="cpp"))
    (k,) = kp.specs
    assert k.hoisted and any(h.reciprocals for h in k.hoisted), k
    (row,) = k.scratch
    assert show_scratch(row, k.nest, "") == "scratch row0: float32[s1] holds buf1.t3 (exp), stored in loop 1, read up to loop 2"
    f = _compiled(lambda x: torch.softmax(x, -1), "cpp", dynamic=True)
    # rows shorter and longer than the hint: the buffer grows; (64, 20000) runs on every thread
    for shape in ((3, 50), (7, 300), (64, 20000), (5, 70)):
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), torch.softmax(x, -1))


def test_a_symbolic_channels_last_sum_reads_memory_in_order_in_one_loop() -> None:
    """x.sum() of a channels-last tensor with symbolic sizes: the reduced dims are
    ordered by the hints of eager's strides (reductions.memory_order), and loops
    whose symbolic steps make them contiguous merge (nest._mergeable), so the
    kernel is one contiguous loop as the static one is.  Before: a strided walk in
    logical order, (1, 64, 32, 32) through dynamic=True on one thread 0.081 ms a call;
    in memory order but three loops, 0.036; now 0.023 (static 0.005, eager 0.004)."""
    from tests_helpers import capture_aot

    x = torch.randn(2, 6, 5, 7).to(memory_format=torch.channels_last)
    gm, example = capture_aot(lambda x: x.sum(), (x,))
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="cpp"))
    (k,) = kp.specs
    assert k.nest.xsizes == (1,) and [str(r) for r in k.nest.rsizes] == ["s0*s1*s2*s3"], k.nest
    source = str(coil.default_pipeline().run(gm, example, until="kernel_gen", options=Options(target="cpp")).source)
    assert "in_ptr0[ir0]" in source and "ir1" not in source, source
    f = _compiled(lambda x: x.sum(), "cpp", dynamic=True)
    for shape in ((2, 6, 5, 7), (3, 16, 9, 4), (1, 64, 32, 32)):
        y = torch.randn(shape).to(memory_format=torch.channels_last)
        exact = y.double().sum().item()
        assert abs(f(y).item() - exact) <= 4 * abs(y.sum().item() - exact) + 1e-4, shape


def test_a_long_symbolic_sum_is_split_among_threads() -> None:
    """x.sum() of a long vector with a symbolic length: its row is dealt out in
    parts among threads, as a static one is (threads.py's split, its parts judged at
    the hint; a run shorter than the parts leaves some empty).  Before, the one row
    ran on one thread: 2^24 values on two threads 2.56 ms, now 1.28; its distance
    from float64 was 1.12, now 0.25, the static kernel's (the parts fold in double)."""
    from coil.ir.kernel import Split
    from tests_helpers import capture_aot

    gm, example = capture_aot(lambda x: x.sum(), (torch.full((1 << 20,), 0.1),))
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="cpp"))
    (k,) = kp.specs
    assert isinstance(k.space, Split) and k.space.parts == 64 and str(k.space.chunk) == "FloorDiv(s0 + 63, 64)", k.space
    assert k.nest.parallel is not None and k.nest.parallel.iterations == 64, k.nest
    # rows of a symbolic count are not split: few at the hint, they may be many at a call
    gm, example = capture_aot(lambda x: x.sum(-1), (torch.rand(3, 1 << 18),))
    (rows,) = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="cpp")).specs
    assert not isinstance(rows.space, Split), rows.space
    f = _compiled(lambda x: x.sum(), "cpp", dynamic=True)
    for n in ((1 << 20) + 7, 5, 100, 3 << 16):
        x = torch.rand(n)
        exact = x.double().sum().item()
        assert abs(f(x).item() - exact) <= max(2 * abs(x.sum().item() - exact), 1e-5 * abs(exact)), n


@pytest.mark.parametrize("case", ["mean_loss", "sum", "var", "column_sum", "argmax"])
def test_a_long_symbolic_row_splits_on_triton_at_its_hint(case: str) -> None:
    """A reduction of few rows whose length is symbolic (a loss's mean over the
    tokens, x.sum() of a dynamic batch, x.sum(0) of 64 columns down a dynamic count
    of rows, a block of neighbouring columns a program) is split as a static one of
    its hint's length is: a number of parts, so the grid
    and workspaces are static, each reducing RBLOCK * FloorDiv(r + parts*RBLOCK - 1,
    parts*RBLOCK) elements.  Calls longer and shorter than the hint (parts left
    empty) match eager.  Before, such a kernel ran one program a row: dynamic
    cross_entropy's mean over 16384 rows 19.5 µs on the H200 against 4.0 for the
    static kernel, which splits.  argmax is not split (an empty part's index)."""
    from coil.ir.kernel import Split
    from coil.ir.indexing import FloorDiv
    from tests_helpers import capture_aot

    fns: dict[str, tuple[Callable[..., Any], Callable[[int], tuple[torch.Tensor, ...]]]] = {
        "mean_loss": (F.cross_entropy, lambda n: (torch.randn(n, 3), torch.randint(0, 3, (n,)))),
        "sum": (lambda x: x.sum(), lambda n: (torch.randn(n),)),
        "var": (lambda x: torch.var_mean(x), lambda n: (torch.randn(n) + 3,)),
        # 64 columns whatever the length (a dynamic dim of its own would make them symbolic)
        "column_sum": (lambda x: x.view(-1, 64).sum(0), lambda n: (torch.randn(64 * n),)),
        "argmax": (lambda x: x.argmax(), lambda n: (torch.randn(n),)),
    }
    fn, make = fns[case]
    hint = 20000
    gm, example = capture_aot(fn, make(hint))
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="triton"))
    long = [k for k in kp.specs if not isinstance(k.group[1], int) and k.group[0] in (1, 64)]
    assert long, [k.group for k in kp.specs]
    k = long[-1]
    if case == "argmax":
        assert not isinstance(k.space, Split), k.space
        return
    assert isinstance(k.space, Split) and k.space.parts > 1, k.space
    r, rblock = k.group[1], k.launches[0].config.rblock
    assert sympy.simplify(k.space.chunk - rblock * FloorDiv(r + k.space.parts * rblock - 1,
                                                            k.space.parts * rblock)) == 0, k.space
    if case == "column_sum":  # a block of neighbouring columns a program (kernel_model.reads_down_columns)
        assert k.space.columns and k.space.xblock > 1, k.space
    if case == "sum":  # the verifier refuses chunks that may leave the row's end out, or cross a step
        from coil.ir.verify_kernel import verify_kernel_program

        verify_kernel_program(kp, "schedule_kernels")
        p = k.space.parts
        for chunk in (rblock * FloorDiv(r, p * rblock), 2 * rblock * FloorDiv(r + p * rblock - 1, 2 * p * rblock) // 2,
                      (rblock // 2) * FloorDiv(r + p * rblock // 2 - 1, p * rblock // 2)):
            bad = attrs.evolve(k, space=attrs.evolve(k.space, chunk=chunk))
            with pytest.raises(coil.CoilError, match="K7"):
                verify_kernel_program(attrs.evolve(kp, specs=tuple(bad if s is k else s for s in kp.specs)),
                                      "schedule_kernels")
    f = _compiled(fn, "triton", dynamic=True)
    for n in (hint, 3 * hint + 17, 777, 3):
        args = make(n)
        torch.testing.assert_close(f(*args), fn(*args), atol=1e-4, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["coil"]["compiled"] == 1 and counters["coil"]["eager"] == 0


def test_a_symbolic_column_sum_reads_blocks_of_columns_on_triton() -> None:
    """x.sum(0) of a row-major x, both sizes symbolic, and a LayerNorm's weight
    gradient under dynamic=True: on Triton each program reduces a block of
    neighbouring columns, every step a coalesced tile, as a static kernel does
    (kernel_model.reads_down_columns judges the steps, the stride s1, and the run at
    the hints).  Before, a symbolic one ran one column a program, one element of
    every sector it fetched.  Sizes other than the hints, and a single column, match
    eager."""
    from coil.ir.kernel import Rows
    from tests_helpers import capture_aot

    gm, example = capture_aot(lambda x: x.sum(0), (torch.randn(300, 96),))
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="triton"))
    (k,) = kp.specs
    assert isinstance(k.space, Rows) and k.space.columns, k.space
    (ln,) = k.launches
    assert ln.config.xblock > 1 and "columns" in ln.why, ln
    f = _compiled(lambda x: x.sum(0), "triton", dynamic=True)
    for shape in ((300, 96), (517, 130), (2, 3), (1000, 1)):
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), x.sum(0), atol=1e-4, rtol=1e-4)

    # the LayerNorm's backward graph, as dynamic=True hands it over: its weight's
    # gradient sums 48 columns down s0 rows
    from torch._dynamo import reset
    from torch._dynamo.backends.common import aot_autograd

    got: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def keep(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        got.append((gm, list(example)))
        return gm.forward

    reset()
    norm = torch.nn.LayerNorm(48)
    torch.compile(norm, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), dynamic=True)(
        torch.randn(64, 48, requires_grad=True)).square().sum().backward()
    reset()
    backward = coil.default_pipeline().run(*got[-1], until="schedule_kernels", options=Options(target="triton"))
    assert any(isinstance(k.space, Rows) and k.space.columns and str(k.group[1]) == "s0" for k in backward.specs), \
        [(k.group, k.space) for k in backward.specs]
    f = _compiled(norm, "triton", dynamic=True)
    for rows in (64, 130, 7):
        x = torch.randn(rows, 48)
        norm.zero_grad()
        f(x).square().sum().backward()
        mine = norm.weight.grad.clone()
        norm.zero_grad()
        norm(x).square().sum().backward()
        torch.testing.assert_close(mine, norm.weight.grad, atol=1e-3, rtol=1e-3)


def test_a_symbolic_column_sum_runs_in_lanes() -> None:
    """x.sum(0) of a row-major x with symbolic sizes reads down the columns: on the
    cpp target a block of neighbouring columns runs in lanes, as a static one does
    (a symbolic stride counts as a step the ranges prove above 1).  On rows, each
    column's read strided the whole matrix: (65536, 64) through dynamic=True, one
    thread, 26.8 ms against eager's 1.1 (now 1.2)."""
    from coil.ir.kernel import Rows
    from tests_helpers import capture_aot

    x = torch.randn(3000, 48)
    gm, example = capture_aot(lambda x: x.sum(0), (x,))  # both sizes symbolic: the stride s1
    kp = coil.default_pipeline().run(gm, example, until="schedule_kernels", options=Options(target="cpp"))
    (k,) = kp.specs
    assert isinstance(k.space, Rows) and k.space.lanes == 64, k.space
    f = _compiled(lambda x: x.sum(0), "cpp", dynamic=True)
    for shape in ((3000, 48), (517, 130), (2, 3)):
        x = torch.randn(shape)
        exact = x.double().sum(0)
        # as the static kernel: within a few times eager's distance from float64 (its
        # blocks of rows add in another order than eager's cascade)
        ours, eagers = (f(x).double() - exact).abs().max().item(), (x.sum(0).double() - exact).abs().max().item()
        assert ours <= max(4 * eagers, 2 * torch.finfo(torch.float32).eps * exact.abs().max().item()), (ours, eagers)


@pytest.mark.parametrize("target", ["cpp", "reference"])
def test_views_of_an_input_at_symbolic_offsets_are_views_under_dynamic(target: str) -> None:
    """The last piece of a split with its sizes passed in (torch.Size: symbols, one
    of them s0 - 2) starts at (s0 - 1)*s0**2, an offset that bounds nothing as
    expanded: it must still be returned as a view of the input, since AOTAutograd
    rebuilds an output aliasing an input from the output's strides and offset (a
    copy came back as the input's first piece: the OpInfo sweep's split and select
    under dynamic=True, session 42)."""
    from tests_helpers import compiled_counted

    split = compiled_counted(lambda x, s: torch.split(x, s), target, dynamic=True)
    for n in (5, 7):
        x = torch.arange(float(n ** 3)).view(n, n, n)
        got = split(x, torch.Size([1, n - 2, 1]))
        for g, w in zip(got, torch.split(x, [1, n - 2, 1])):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
            assert g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            assert g.storage_offset() == w.storage_offset()
    select = compiled_counted(lambda x, d, i: torch.select(x, d, i), target, dynamic=True)
    for n in (5, 6):
        x = torch.randn(n, n, n)
        torch.testing.assert_close(select(x, 1, -1), x.select(1, -1), rtol=0, atol=0)
    assert counters["stats"]["unique_graphs"] >= 1
