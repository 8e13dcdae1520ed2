"""realize's triggers, each a named rule stored on the buffer it realizes."""

from __future__ import annotations

import torch

import coil
from coil.ir.buffers import AliasBuffer, ComputedBuffer, ExternBuffer
from coil.ir.kernel import Loop, Update
from coil.backends.reference import run_buffer_graph
from tests_helpers import run_until, trace


def _rules(bg) -> dict[str, str]:
    return {b.name: b.rule for b in bg.buffers}


def _row(bg, fx: str):
    return next(r for r in bg.realize_table if r.fx_node == fx)


def test_two_nontrivial_reads_two_consumers_realized():
    def fn(x, y):
        s = x * y  # two nontrivial reads
        return (s + 1).sum(-1), (s * 2).amax(-1)

    inputs = [torch.randn(8, 16), torch.randn(8, 16)]
    bg = run_until(fn, inputs, "realize")
    row = _row(bg, "mul")
    assert row.realized and row.rule == "reuse"
    assert isinstance(bg.get(row.buffer), ComputedBuffer)
    for got, want in zip(run_buffer_graph(bg, inputs), fn(*inputs)):
        torch.testing.assert_close(got, want)


def test_single_read_inlined_into_both_consumers():
    def fn(x):
        s = x.exp()  # one read: cheap to recompute
        return (s + 1).sum(-1), (s * 2).amax(-1)

    inputs = [torch.randn(8, 16)]
    bg = run_until(fn, inputs, "realize")
    row = _row(bg, "exp")
    assert not row.realized
    # the exp body appears in both reductions
    holders = [b for b in bg.buffers if isinstance(b, ComputedBuffer) and "exp" in b.origins]
    assert len(holders) == 2
    assert row.rule.startswith("inlined into ")
    assert set(row.rule.removeprefix("inlined into ").split(", ")) == {b.name for b in holders}


def test_reduction_with_reader_is_realized():
    def fn(x):
        return x - x.amax(-1, keepdim=True)

    bg = run_until(fn, [torch.randn(4, 8)], "realize")
    assert _row(bg, "amax").rule == "reduction"
    assert _rules(bg)["buf1"] == "output"


def test_extern_input_is_realized():
    def fn(x, w):
        return torch.mm(x.relu(), w)

    bg = run_until(fn, [torch.randn(4, 8), torch.randn(8, 3)], "realize")
    relu = _row(bg, "relu")
    assert relu.realized and relu.rule == "extern_input"
    assert isinstance(bg.get("buf1"), ExternBuffer) and bg.get("buf1").rule == "extern"


def test_opcount_threshold_rule():
    def fn(x):
        y = x
        for _ in range(12):
            y = y.sin() * 1.5 + 0.25
        return y.sum(-1), y.amax(-1)

    inputs = [torch.randn(4, 8)]
    bg = run_until(fn, inputs, "realize", realize_opcount_threshold=10)
    assert "opcount_threshold" in _rules(bg).values()
    bg_default = run_until(fn, inputs, "realize", realize_opcount_threshold=1000)
    assert "opcount_threshold" not in _rules(bg_default).values()


def test_reads_threshold_rule():
    def fn(x):
        y = x[:, 0:1] + x[:, 1:2] + x[:, 2:3] + x[:, 3:4] + x[:, 4:5] + x[:, 5:6]  # six scalar-ish reads
        return y.sum(-1), y.amax(-1)

    inputs = [torch.randn(4, 8)]
    bg = run_until(fn, inputs, "realize", realize_reads_threshold=4)
    assert "reads_threshold" in _rules(bg).values() or "reuse" in _rules(bg).values()


def test_strided_output_view_is_an_alias():
    def fn(x):
        y = x * 2
        return y, y.t()

    inputs = [torch.randn(4, 8)]
    bg = run_until(fn, inputs, "realize")
    alias = [b for b in bg.buffers if isinstance(b, AliasBuffer)]
    assert len(alias) == 1 and alias[0].rule == "output_view" and alias[0].layout.stride == (1, 8)
    for got, want in zip(run_buffer_graph(bg, inputs), fn(*inputs)):
        torch.testing.assert_close(got, want)


def test_mutation_realizes_reader_that_is_still_needed():
    def fn(x, y):
        z = x + y  # reads x; read again after x is mutated
        torch.ops.aten.mul_.Tensor(x, 2.0)
        return z * 3, x

    inputs = [torch.randn(4, 8), torch.randn(4, 8)]
    gm = trace(fn, *[t.clone() for t in inputs])
    bg = coil.default_pipeline().run(gm, inputs, until="realize", options=coil.Options(target="reference"))
    assert _row(bg, "add").rule == "mutation"
    ref_inputs = [t.clone() for t in inputs]
    got = run_buffer_graph(bg, ref_inputs)
    want = fn(*[t.clone() for t in inputs])
    torch.testing.assert_close(got[0], want[0])


def test_views_fold_into_index():
    def fn(x):
        return (x.t()[1:, ::2] * 2).sum(0)

    inputs = [torch.randn(6, 8)]
    bg = run_until(fn, inputs, "realize")
    assert len(bg.buffers) == 1
    assert _row(bg, "t").rule.startswith("index_remap")


def _batch_norm_backward(dy, x, w, mean, rstd):
    """BatchNorm's input gradient as torch decomposes it: x - mean read by a
    per-channel reduction and by the elementwise gradient."""
    sub = x - mean[None, :, None, None]
    s1, s2 = dy.sum((0, 2, 3)), (dy * sub).sum((0, 2, 3))
    n = x.numel() // x.shape[1]
    a, b = (s1 / n)[None, :, None, None], (s2 / n * rstd * rstd)[None, :, None, None]
    return (dy - sub * b - a) * (rstd * w)[None, :, None, None], s2 * rstd, s1


def test_a_broadcast_read_is_trivial_for_reuse():
    """BatchNorm's backward: x - mean has two readers (a per-channel reduction and
    the elementwise gradient) and one read of a full-size tensor; the mean, 1/576
    of it, is trivial where the target says so (Triton's reuse_broadcasts_trivial),
    so there x - mean is recomputed in both readers under either setting of
    realize_reuse: two kernels, not three.  The reference target (as the C++ one)
    counts the mean and keeps x - mean a buffer."""
    x = torch.randn(8, 16, 12, 12)
    inputs = [torch.randn_like(x), x, torch.randn(16), x.mean((0, 2, 3)), torch.rand(16) + 0.5]
    for reuse in ("on", "off"):
        bg = run_until(_batch_norm_backward, inputs, "realize", realize_reuse=reuse, target="triton")
        assert _row(bg, "sub").rule.startswith("inlined into")
        for got, want in zip(run_buffer_graph(bg, inputs), _batch_norm_backward(*inputs)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert len(run_until(_batch_norm_backward, inputs, "fuse", realize_reuse=reuse, target="triton").kernels) == 2
    assert _row(run_until(_batch_norm_backward, inputs, "realize"), "sub").rule == "reuse"


def _shifted_backward(dy, x, z):
    """BatchNorm's backward shape with a full-size shift: x - z reads two tensors of
    its own size, and both readers read it whole."""
    sub = x - z
    s = (dy * sub).sum((0, 2, 3))
    return dy - sub * s[None, :, None, None], s


def test_realize_reuse_off_recomputes_in_every_reader():
    """Options.realize_reuse: on (every target's default), x - z (two nontrivial
    reads, two readers) is a buffer and the graph three kernels; off (what Inductor
    does on a GPU), it is recomputed in both readers: two kernels, the same values.
    A looped softmax keeps its online max and sum either way."""
    x = torch.randn(8, 16, 12, 12)
    inputs = [torch.randn_like(x), x, torch.randn_like(x)]
    kernels = {}
    for reuse in ("on", "off"):
        bg = run_until(_shifted_backward, inputs, "realize", realize_reuse=reuse)
        assert (_row(bg, "sub").rule == "reuse") == (reuse == "on")
        for got, want in zip(run_buffer_graph(bg, inputs), _shifted_backward(*inputs)):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        kernels[reuse] = len(run_until(_shifted_backward, inputs, "fuse", realize_reuse=reuse).kernels)
    assert kernels == {"on": 3, "off": 2}
    soft = run_until(lambda a: torch.softmax(a, -1), [torch.randn(12, 40)], "kernel_gen", target="triton",
                     realize_reuse="off", persistent_reduction_threshold=16)
    (k,) = soft.program.specs
    first, second = (st for st in k.stages if isinstance(st, Loop))
    # the max and the sum of exp read the row once, in the first loop, each the other's partner
    row_max, online_sum = first.accumulators
    assert (row_max.update, online_sum.update) == (Update.ROW_MAX, Update.ONLINE_SUM)
    assert (row_max.partner, online_sum.partner) == (online_sum.node, row_max.node) and not second.accumulators


def _relu_grad_stats(dy, y):
    """A bfloat16 ReLU gradient taken to float32 (as torch's BatchNorm backward
    takes its grad_out), read whole by a reduction and by the elementwise result."""
    g = torch.where(y > 0, dy, torch.zeros((), dtype=dy.dtype)).float()
    s = (g * y.float()).sum(0)
    return (g * 2 + s).to(dy.dtype), s


def test_a_widening_cast_is_stored_narrow():
    """The float32 ReLU gradient is realized (reuse: two readers, two full-size
    reads), but its value is a bfloat16 one widened: the buffer holds the bfloat16
    value (half the bytes written and read back), the readers widen it, the row
    says so, and the results are eager's (the sum's order aside)."""
    inputs = [torch.randn(64, 32).bfloat16(), torch.randn(64, 32).bfloat16()]
    bg = run_until(_relu_grad_stats, inputs, "realize")
    row = _row(bg, "_to_copy")
    assert row.realized and row.rule == "reuse; stored as torch.bfloat16, its readers widen it to torch.float32"
    assert bg.get(row.buffer).layout.dtype == torch.bfloat16
    for got, want in zip(run_buffer_graph(bg, inputs), _relu_grad_stats(*inputs)):
        torch.testing.assert_close(got, want)
    # an output keeps its own dtype: nothing is narrowed for it
    out = run_until(lambda dy, y: torch.where(y > 0, dy, torch.zeros((), dtype=dy.dtype)).float(), inputs, "realize")
    assert out.get(out.outputs[0]).layout.dtype == torch.float32


def _bn_relu6_pad(x, m, s, w, b, pad):
    y = ((x - m[None, :, None, None]) * s[None, :, None, None] * w[None, :, None, None] + b[None, :, None, None])
    return (torch.nn.functional.pad(y.clamp(0, 6), pad),)


def test_loads_that_stay_inside_their_buffer_inline_unmasked_under_a_pad():
    """A pad inlines BatchNorm + ReLU6 under its mask (MobileNetV2's TF padding):
    the shifted read of x may fall outside x and stays masked; the per-channel
    values read at x1 < 48 lie inside their buffers wherever the pad's loops
    run, and inline with no mask (a masked read of them kept GCC from
    vectorising the C++ loop: 233 against 40 us).  Only where the padding
    reaches before the data, or past it, does the shifted read keep its mask;
    every target matches eager either way."""
    from coil.ir.expr import Load, walk

    for pad in [(0, 1, 0, 1), (1, 1, 1, 1)]:
        inputs = [torch.randn(2, 48, 8, 8)] + [torch.randn(48) for _ in range(4)]
        fn = lambda *a: _bn_relu6_pad(*a, pad=pad)  # noqa: E731
        bg = run_until(fn, inputs, "realize")
        (out,) = [b for b in bg.buffers if isinstance(b, ComputedBuffer)]
        loads = [e for e in walk(out.body) if isinstance(e, Load)]
        by_name = {}
        for ld in loads:
            by_name.setdefault(ld.name, set()).add(ld.mask is not None)
        big = [n for n in by_name if bg.layout(n).size == (2, 48, 8, 8)]
        assert len(big) == 1 and by_name[big[0]] == {True}, by_name
        assert all(by_name[n] == {False} for n in by_name if n not in big), by_name
        for target in ("cpp", "reference"):
            compiled = coil.compile_graph(trace(fn, *inputs), inputs, coil.Options(target=target, graph_cache=False))
            torch.testing.assert_close(compiled(*inputs)[0], fn(*inputs)[0])


def test_a_load_that_may_fall_outside_keeps_the_pads_mask():
    """A per-row value read at a shifted position (x[i - 1] under the pad's mask
    of i >= 1) may fall outside its buffer where the mask is false: it keeps
    the mask, and the padded positions still read nothing."""
    from coil.ir.expr import Load, walk

    def fn(x, v):
        return (torch.nn.functional.pad(x * v[:, None], (0, 0, 1, 0)),)

    inputs = [torch.randn(6, 4), torch.randn(6)]
    bg = run_until(fn, inputs, "realize")
    (out,) = [b for b in bg.buffers if isinstance(b, ComputedBuffer)]
    assert all(ld.mask is not None for ld in walk(out.body) if isinstance(ld, Load))
    compiled = coil.compile_graph(trace(fn, *inputs), inputs, coil.Options(target="cpp", graph_cache=False))
    torch.testing.assert_close(compiled(*inputs)[0], fn(*inputs)[0])


def _rotate_half_backward(g, a, sin):
    """rotate_half's gradient as autograd writes it: (g + a) * sin read by its two
    halves, each a slice scattered back into the other half."""
    t = (g + a) * sin
    lo, hi = t[..., :16], t[..., 16:]
    z = torch.zeros_like(t)
    return (torch.slice_scatter(z, -hi, -1, 0, 16) + torch.slice_scatter(z, lo, -1, 16, 32),)


def test_a_node_its_readers_read_in_disjoint_slices_is_inlined():
    """Two readers that read (g + a) * sin in disjoint halves read each of its
    elements once between them: inlining it recomputes nothing, so it is no buffer
    (RoPE's backward: one kernel for the query's gradient, not two).  Slices that
    overlap read some elements twice: the reuse rule realizes it."""
    inputs = [torch.randn(4, 8, 32), torch.randn(4, 8, 32), torch.randn(8, 32)]
    bg = run_until(_rotate_half_backward, inputs, "realize")
    row = _row(bg, "mul")
    assert not row.realized and row.rule.startswith("inlined into "), row
    for got, want in zip(run_buffer_graph(bg, inputs), _rotate_half_backward(*inputs)):
        torch.testing.assert_close(got, want)
    assert len(run_until(_rotate_half_backward, inputs, "fuse").kernels) == 1

    def overlapping(g, a, sin):
        t = (g + a) * sin
        return (t[..., :20].sum(-1), t[..., 12:].amax(-1))

    bg = run_until(overlapping, inputs, "realize")
    assert _row(bg, "mul").rule == "reuse"
    for got, want in zip(run_buffer_graph(bg, inputs), overlapping(*inputs)):
        torch.testing.assert_close(got, want)


def test_the_reads_of_slices_are_counted_against_the_size_of_what_they_slice():
    """Inlining computes as many elements as its readers read; realizing computes
    every element once and writes it.  q, k and v sliced from one tensor read it
    once over; one third of it read by two readers is two thirds of it (the rest is
    never computed): both inline.  A reader of the whole and one of a third read
    4/3 of it: the reuse rule realizes it."""
    inputs = [torch.randn(6, 48), torch.randn(6, 48)]

    def qkv(x, b):
        t = x * b
        q, k, v = t.split(16, -1)
        return (q.sum(-1) + k.amax(-1) + v.mean(-1),)

    def third_twice(x, b):
        t = x * b
        return (t[:, :16].sum(-1) + t[:, :16].amax(-1),)

    def whole_and_third(x, b):
        t = x * b
        return (t.sum(-1) + t[:, :16].amax(-1),)

    for fn, realized in ((qkv, False), (third_twice, False), (whole_and_third, True)):
        bg = run_until(fn, inputs, "realize")
        assert _row(bg, "mul").realized == realized, fn.__name__
        assert realized == (_row(bg, "mul").rule == "reuse"), fn.__name__
        torch.testing.assert_close(run_buffer_graph(bg, inputs)[0], fn(*inputs)[0])


def test_inner_orders_forced_on_a_target_without_the_trait() -> None:
    """Options.inner_orders="on" where the target's trait is off (the reference and
    C++ targets): the ReLU gradient is ordered for the per-channel sums and runs in
    their kernel, and the values are eager's (kernel_model's inner role is the one
    model every target's kernels follow)."""
    from test_triton_target import _relu_batch_norm_backward
    from tests_helpers import target_available

    cl, shape = torch.channels_last, (4, 16, 6, 6)
    inputs = [torch.randn(shape).to(memory_format=cl).bfloat16(), torch.randn(shape).to(memory_format=cl).bfloat16(),
              torch.randn(16), torch.randn(16) * 0.1, torch.rand(16) + 0.5]
    for target in ("reference", "cpp"):
        if not target_available(target):
            continue
        for orders, kernels in (("auto", 3), ("on", 2)):
            compiled = coil.compile_graph(trace(_relu_batch_norm_backward, *inputs), inputs,
                                          coil.Options(target=target, inner_orders=orders))
            for got, want in zip(compiled(*inputs), _relu_batch_norm_backward(*inputs)):
                torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
            assert len(compiled.module.kernels) == kernels, (target, orders)
            assert any(getattr(b, "inner_order", ()) for b in compiled.module.buffers) == (orders == "on")


def _narrowed_early(a, idx, src, w, x, y):
    h = (x @ y).index_add(0, idx, src)  # float32, written by an extern: buf2
    early = a + h.to(torch.bfloat16)  # the last reader of h, which it narrows
    for _ in range(24):  # 72 nodes before early's reader
        w = torch.sin(w) * 1.01 + 0.5
    return early + w.sum().to(torch.bfloat16)


def _narrowed_early_inputs() -> list[torch.Tensor]:
    return [torch.randn(64, 32).bfloat16(), torch.randint(0, 64, (16,)), torch.randn(16, 32), torch.randn(4),
            torch.randn(64, 8), torch.randn(8, 32)]


def test_a_node_read_far_later_is_realized_where_it_frees_what_it_narrows():
    """lifetime: `early` is the last reader of a float32 buffer (8 KiB) and is read
    only 75 nodes later.  Inlined into that reader, it would hold the float32 buffer
    until then (the last step); realized where it stands (4 KiB of bfloat16), the
    float32 one is freed there, and fuse keeps it out of its reader's kernel (fused, it would run
    as late).  T5's tied embedding gradient: 250 MiB held through the encoder's
    backward at the large size."""
    inputs = _narrowed_early_inputs()
    bg = run_until(_narrowed_early, inputs, "realize")
    row = _row(bg, "add")
    assert row.realized and row.rule == "lifetime; frees buf2 (8192 bytes) 75 nodes before its first reader"
    assert bg.get(row.buffer).rule == "lifetime"
    for got, want in zip(run_buffer_graph(bg, inputs), [_narrowed_early(*inputs)]):
        torch.testing.assert_close(got, want)
    assert not _row(run_until(_narrowed_early, inputs, "realize", realize_lifetime=False), "add").realized

    fused = run_until(_narrowed_early, inputs, "fuse")
    refused = [d for d in fused.fusion_log if d.reason.startswith("lifetime: buf3")]
    assert refused and all({d.node1, d.node2} & {"buf3"} for d in refused)
    assert "buf3" in fused.step_of("buf3").nodes and len(fused.step_of("buf3").nodes) == 1

    on = run_until(_narrowed_early, inputs, "plan_memory")
    off = run_until(_narrowed_early, inputs, "plan_memory", realize_lifetime=False)
    at = next(ps for ps in on.steps if "buf3" in ps.step.nodes)
    assert "buf1" in at.frees and at is not on.steps[-1]  # the storage buf2 names (index_add_ wrote into buf1)
    assert "buf1" in off.steps[-1].frees  # inlined: held until the last kernel


def test_no_lifetime_realization_where_the_reader_is_near_or_nothing_dies():
    """The rule needs both: a reader far away, and inputs that die at the node
    holding at least twice its bytes."""
    def near(a, x, y):
        return (a + (x @ y).to(torch.bfloat16)) * 2

    def keeps(a, x, y, w):
        h = x @ y
        early = a + h.to(torch.bfloat16)
        for _ in range(24):
            w = torch.sin(w) * 1.01 + 0.5
        return early + w.sum().to(torch.bfloat16), h  # h is an output: it dies nowhere

    a, x, y = torch.randn(64, 32).bfloat16(), torch.randn(64, 8), torch.randn(8, 32)
    assert not _row(run_until(near, [a, x, y], "realize"), "add").realized
    assert not _row(run_until(keeps, [a, x, y, torch.randn(4)], "realize"), "add").realized


def _rotary(x, pos):
    """A rotary table's cos and sin over (sequence, dim), read by every head and row."""
    freqs = pos[:, None] * torch.arange(1, 9, dtype=torch.float32)[None, :]
    return x * freqs.cos() + x.flip(-1) * freqs.sin()


def test_a_costly_table_read_over_many_more_elements_is_realized():
    """The broadcast rule: a table's cos and sin (32 x 8) read by a node over
    (4, 8, 32, 8), 32 times their elements, are computed once into buffers; inlined,
    the reader would compute them again for each of its elements.  A cheap table
    (a product), a costly one read over fewer than BROADCAST_READ times its
    elements, and a costly one of fewer than BROADCAST_MIN elements stay inlined."""
    from coil.passes.realize import BROADCAST_MIN, BROADCAST_READ

    x, pos = torch.randn(4, 8, 32, 8), torch.arange(32, dtype=torch.float32)
    bg = run_until(_rotary, [x, pos], "realize")
    for fx in ("cos", "sin"):
        row = _row(bg, fx)
        assert row.realized and row.rule == "broadcast", row
        assert bg.get(row.buffer).layout.size == (32, 8)
    (out,) = [b for b in bg.buffers if isinstance(b, ComputedBuffer) and b.rule == "output"]
    assert not any(isinstance(e, coil.ir.expr.Op) and e.name in ("cos", "sin") for e in coil.ir.expr.walk(out.body))
    torch.testing.assert_close(run_buffer_graph(bg, [x, pos])[0], _rotary(x, pos))
    # fewer rows and heads: 2 x 4 = 8 < BROADCAST_READ reads of each table element
    assert 2 * 4 < BROADCAST_READ
    few = run_until(_rotary, [torch.randn(2, 4, 32, 8), pos], "realize")
    assert not _row(few, "cos").realized and not _row(few, "sin").realized
    # a small table: 16 x 8 < BROADCAST_MIN elements, read 32 times each
    assert 16 * 8 < BROADCAST_MIN
    small = run_until(_rotary, [torch.randn(4, 8, 16, 8), pos[:16]], "realize")
    assert not _row(small, "cos").realized
    # a cheap table: inlined, whatever the ratio
    cheap = run_until(lambda x, pos: x * (pos[:, None] * 2.0), [x, pos], "realize")
    assert not _row(cheap, "mul").realized
    # with the reuse rules off (Options.realize_reuse), inlined as before
    off = run_until(_rotary, [x, pos], "realize", realize_reuse="off")
    assert not _row(off, "cos").realized


def test_a_realized_rotary_table_compiles_and_matches_eager():
    """End to end, on the reference and C++ targets: the same values as eager."""
    x, pos = torch.randn(4, 8, 32, 8), torch.arange(32, dtype=torch.float32)
    for target in ("reference", "cpp"):
        f = torch.compile(_rotary, backend="coil", options={"target": target, "graph_cache": False})
        torch.testing.assert_close(f(x, pos), _rotary(x, pos))


def _relative_shift(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Wav2Vec2-Conformer's relative shift (pad one column, view as one more row,
    drop the first row, view back) over a length made by strided convolutions, so
    that the sizes are nested floor divisions of the input's length."""
    import torch.nn.functional as F

    h = x
    for k, s in ((80, 80), (4, 2), (3, 2)):
        h = F.conv1d(h, w[..., :k], stride=s)
    b = torch.cat([h, h[..., 1:]], -1)
    scores = h.unsqueeze(-1) * b.unsqueeze(-2)  # (2, 4, T, 2T - 1)
    n, heads, t, p = scores.shape
    shifted = torch.nn.functional.pad(scores, (1, 0)).view(n, heads, p + 1, t)
    return shifted[:, :, 1:].view(n, heads, t, p)[..., :t] * 0.5


def _captured_with_a_symbolic_length(fn, inputs):
    """The inference graph and example inputs Dynamo hands a backend with the first
    input's last dim marked dynamic (the other sizes static)."""
    from torch._dynamo.backends.common import aot_autograd

    got = []

    def keep(gm, example_inputs):
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch._dynamo.mark_dynamic(inputs[0], 2)
    with torch.no_grad():
        torch.compile(fn, backend=aot_autograd(fw_compiler=keep, inference_compiler=keep))(*inputs)
    torch._dynamo.reset()
    return got[0]


def test_a_view_whose_index_grows_past_the_threshold_realizes_its_base():
    """A reshape of a padded reshape over nested floor divisions: inlined, each view
    nests the other's index again (Wav2Vec2-Conformer's inference at a symbolic
    length read a buffer at an index of 33 477 sympy ops, a C++ line of 2.7 MB, and
    took 70 s of passes; 9484 ops and 31 s with session 58's index simplification
    alone); past realize_index_ops_threshold the view's base is realized (rule
    index_ops_threshold) and the reads stay small.  The results
    match eager at two lengths through one compiled graph."""
    from coil.passes.realize import index_ops

    x, w = torch.randn(2, 4, 80 * 40), torch.randn(4, 4, 80)
    gm, example = _captured_with_a_symbolic_length(_relative_shift, [x, w])

    def realized(threshold):
        opts = coil.Options(target="cpp", realize_index_ops_threshold=threshold)
        bg = coil.default_pipeline().run(gm, example, until="realize", options=opts)
        rows = [r for r in bg.realize_table if r.rule == "index_ops_threshold"]
        return rows, max(index_ops(b.body) for b in bg.buffers if isinstance(b, ComputedBuffer))

    rows, ops = realized(1000)
    assert len(rows) == 1 and rows[0].realized and ops < 200, (rows, ops)
    rows, off = realized(10**9)  # the rule off: the nested index (its view read at over 1000 ops,
    assert not rows and off > 3 * ops, (off, ops)  # the buffer's body at 497 once simplified, against 137)
    torch._dynamo.reset()
    f = torch.compile(_relative_shift, backend="coil", options={"target": "cpp", "graph_cache": False})
    for n in (80 * 40, 80 * 56):
        xn = torch.randn(2, 4, n)
        torch._dynamo.mark_dynamic(xn, 2)
        torch.testing.assert_close(f(xn, w), _relative_shift(xn, w))
    torch._dynamo.reset()


def _conv_group_norm(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Wav2Vec2's first feature layer: a strided conv1d, a GroupNorm of a group a
    channel, GELU; then a second strided conv1d and GELU."""
    import torch.nn.functional as F

    h = F.conv1d(x, w, stride=5)
    h = F.gelu(F.group_norm(h, 8, g, g))
    return F.gelu(F.conv1d(h, w[:, :, :3].repeat(1, 8, 1)[:, :8], stride=2))


def test_a_group_norm_over_a_symbolic_conv_length_reads_its_rows_without_division():
    """The GroupNorm's rows are `FloorDiv(s0, 5) - 1` long (s0 the input's length):
    its reduction reads them at `row*L + r0`, not at `((row*L + r0) // L) % 8 ...`,
    which divided by L four times an element (Wav2Vec2-Conformer's at a symbolic
    length: 52 ms a call on one thread, 1.6 after).  Results match eager at two
    lengths through the one graph."""
    from coil.ir.indexing import FloorDiv, ModularIndexing

    x, w, g = torch.randn(2, 1, 400), torch.randn(8, 1, 10), torch.randn(8)
    gm, example = _captured_with_a_symbolic_length(_conv_group_norm, [x, w, g])
    bg = coil.default_pipeline().run(gm, example, until="realize", options=coil.Options(target="cpp"))
    reductions = [b for b in bg.buffers if isinstance(b, ComputedBuffer) and b.reduction_type is not None]
    assert reductions
    for b in reductions:
        for ld in coil.ir.expr.walk(b.body):
            if isinstance(ld, coil.ir.expr.Load):
                assert not any(i.has(FloorDiv, ModularIndexing) for i in ld.index), (b.name, ld)
    torch._dynamo.reset()
    f = torch.compile(_conv_group_norm, backend="coil", options={"target": "cpp", "graph_cache": False})
    for n in (400, 730):
        xn = torch.randn(2, 1, n)
        torch._dynamo.mark_dynamic(xn, 2)
        torch.testing.assert_close(f(xn, w, g), _conv_group_norm(xn, w, g), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
