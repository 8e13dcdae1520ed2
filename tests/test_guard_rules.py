"""Sizes that Dynamo's guards make equal (ir/shapes.py: guard_rules, SizeRule).

A size is often spelled two ways in one graph: a slice computes `(s0//8 - 1)//2`
where a broadcast needs `s0//16`, a view's `2*(s0//2)` stands for `s0` once Dynamo
guarded that s0 is even.  Knowing only the symbols' ranges, coil refused such
graphs (`cannot broadcast`, `view: shape ... is invalid`) and ran them eagerly:
Mamba at a second sequence length, group_norm, channel_shuffle and
multi_head_attention_forward under `dynamic=True`.  lower now reads the
equalities Dynamo guarded, solves them into rules, and writes each size one way;
proofs use them too.  The tests run with the eager fallback off, so a graph coil
refuses fails them."""

from __future__ import annotations

import copy

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import sympy
import torch

import coil
from coil.ir.indexing import FloorDiv, ModularIndexing
from coil.ir.shapes import ShapeInfo, SymbolFacts, guard_rules, size_symbol, unbacked_symbol
from tests_helpers import target_available

s0, s1, s2 = size_symbol(0), size_symbol(1), size_symbol(2)


def _info(*facts: tuple[sympy.Symbol, int, int, int | None]) -> ShapeInfo:
    return ShapeInfo(tuple(SymbolFacts(s, hint, lo, hi) for s, hint, lo, hi in facts))


def test_a_chain_of_guarded_equalities_solves_for_the_most_complex_terms():
    """Mamba's: X = 2Y and X = Y + Z give Z = Y, which no single guard states."""
    info = _info((s0, 24, 2, None))
    x, y, z = FloorDiv(FloorDiv(s0, 4) - 1, 2), FloorDiv(s0, 16), FloorDiv(FloorDiv(s0, 8) - 1, 2)
    rules, pins = guard_rules([x - 2 * y, x - y - z], info)
    assert [r.show() for r in rules] == [
        "guard FloorDiv(FloorDiv(s0, 4) - 1, 2) = 2*FloorDiv(s0, 16)",
        "guard FloorDiv(FloorDiv(s0, 8) - 1, 2) = FloorDiv(s0, 16)"]
    assert pins == {}
    info = attrs.evolve(info, rules=rules)
    assert info.known_eq(z, y) and info.reduce(3 * z + s0) == 3 * y + s0
    assert not info.known_eq(z, 2 * y)
    # inside a floor division too, and an expression no rule touches stays as it was
    assert info.reduce(FloorDiv(z + 1, 2)) == FloorDiv(y + 1, 2)
    assert info.reduce((s0 + 1) * (s0 + 2)) == (s0 + 1) * (s0 + 2)


def test_a_divisibility_gives_a_size_rule_and_a_rule_for_proofs_only():
    info = _info((s0, 8, 2, None), (s1, 6, 2, None), (s2, 3, 2, None))
    rules, _ = guard_rules([ModularIndexing(s0, 1, 2), ModularIndexing(s1, 1, s2)], info)
    shown = [r.show() for r in rules]
    assert "guard ModularIndexing(s0, 1, 2) = 0" in shown
    assert "guard FloorDiv(s0, 2) = s0/2 (proofs only)" in shown  # no fraction in a size
    assert "guard s2*FloorDiv(s1, s2) = s1" in shown
    info = attrs.evolve(info, rules=rules)
    assert info.reduce(FloorDiv(s0, 2) + 1) == FloorDiv(s0, 2) + 1  # no fraction in a size
    assert info.reduce(4 * FloorDiv(s0, 2)) == 2 * s0  # a rule for proofs only whose fraction cancels
    assert info.reduce(s0 - FloorDiv(s0, 2)) == FloorDiv(s0, 2)  # or stays: the rule's atom, one spelling
    assert info.reduce(3 * s0 - 4 * FloorDiv(s0, 2) + 1) == s0 + 1
    assert info.known_eq(2 * FloorDiv(s0, 2) * s1, s0 * s1)  # group_norm's view
    assert info.known_eq(s2 * FloorDiv(s1, s2) * s0 ** 2, s1 * s0 ** 2)  # channel_shuffle's
    assert info.known_multiple(s0, 2) and not info.known_multiple(s0, 4)
    assert not _info((s0, 8, 2, None)).known_multiple(s0, 2)  # without the guard: no


def test_an_equality_that_pins_a_symbol_is_returned_apart():
    info = _info((s0, 24, 24, 31))
    f = FloorDiv(s0 - 1, 2)
    rules, pins = guard_rules([s0 - 2 * f - 2, f - 11], info)
    assert pins == {s0: 24}
    assert [r.show() for r in rules] == ["guard FloorDiv(s0 - 1, 2) = s0/2 - 1 (proofs only)"]


def test_a_modulos_identity_alone_leaves_sizes_as_they_are():
    """`a mod k = a - k*(a//k)` is no guard: it gives a rule for proofs only, and
    a size keeps its modulo (a rule rewriting `s0 mod 256` inside sizes left
    Dynamo's rules, written with the modulo, unmatched: Mamba2)."""
    info = _info((s0, 300, 2, None))
    m = ModularIndexing(s0, 1, 256)
    p = s0 + ModularIndexing(256 - m, 1, 256)
    rules, _ = guard_rules([FloorDiv(p, 256) - 2], info)
    assert all(r.integral is False for r in rules if r.atom in (m, FloorDiv(s0, 256)))
    info = attrs.evolve(info, rules=rules)
    assert info.reduce(m + 1) == m + 1
    assert info.reduce(3 * FloorDiv(p, 256)) == 6


def test_rules_are_written_as_sizes_are_reduced():
    """A rule whose atom holds another rule's atom is rewritten by it, so a size
    reduced from the inside out still meets it."""
    info = _info((s0, 24, 2, None))
    inner, outer = FloorDiv(s0 - 1, 2), FloorDiv(FloorDiv(s0 - 1, 2) + 5, 4)
    rules, _ = guard_rules([inner - FloorDiv(s0, 2) + 1, outer - 4], info)
    info = attrs.evolve(info, rules=rules)
    assert info.reduce(FloorDiv(inner + 5, 4)) == 4
    assert info.reduce(FloorDiv(FloorDiv(s0, 2) + 4, 4)) == 4


def test_a_rule_the_others_imply_is_left_out_once():
    """Swin's padding test comes back inside larger sizes (`(2*(s0//8) + pad)//4`
    with `pad = (4 - 2*(s0//8) mod 4) mod 4`, guarded 0): a rule for such a size
    says nothing the padding's rule does not, and every reduction walked it.  Of
    two copies of one rule, one stays."""
    info = _info((s0, 48, 2, None))
    half = FloorDiv(s0, 2)
    pad = ModularIndexing(4 - ModularIndexing(half, 1, 4), 1, 4)
    big = FloorDiv(half + pad, 4)
    rules, _ = guard_rules([pad, big - FloorDiv(half, 4), pad], info)
    # the rest (the padding 0, the test's own 4 - (s0//2) mod 4 over 4 = 1, the larger
    # size) follow from the multiple of 4, which the divisor rules write over s0//8; the
    # code before kept five rules, the larger size's and the padding's among them
    assert [r.show() for r in rules] == ["guard FloorDiv(s0, 2) = 4*FloorDiv(s0, 8)"]
    from coil.ir.shapes import SizeRule, _canonical

    twice = [SizeRule(FloorDiv(s0, 2), 4 * FloorDiv(s0, 8), True)] * 2
    assert _canonical(list(twice)) == twice[:1]
    info = attrs.evolve(info, rules=rules)
    assert info.reduce(big) == info.reduce(FloorDiv(half, 4))  # still one spelling
    assert info.reduce(pad) == 0


def test_rules_false_at_the_hints_are_dropped_whole():
    """Each rule must hold at the call being compiled; one that does not means
    the equalities were misread, and none is kept."""
    info = _info((s0, 9, 2, None))
    assert guard_rules([ModularIndexing(s0, 1, 2)], info) == ((), {})
    assert guard_rules([s0 - 2 * FloorDiv(s0 - 1, 2) - 2, FloorDiv(s0 - 1, 2) - 11], info) == ((), {})


def test_rules_print_with_the_facts():
    rules, _ = guard_rules([ModularIndexing(s0, 1, 4)], _info((s0, 8, 2, None)))
    info = attrs.evolve(_info((s0, 8, 2, None)), rules=rules)
    assert info.show() == ["s0 in [2, oo] hint 8", "guard FloorDiv(s0, 4) = s0/4 (proofs only)",
                           "guard ModularIndexing(s0, 1, 4) = 0",
                           "guard FloorDiv(s0, 2) = 2*FloorDiv(s0, 4)"]  # a multiple of 4 is one of 2


def _compile(fn, target, **options):
    if not target_available(target):
        pytest.skip(f"{target} not available")
    torch._dynamo.reset()
    return torch.compile(fn, backend="coil", dynamic=True, options={"target": target, **options})


def _halves(x):
    # (s0 + 1)//2 and s0//2 rows, added: torch guards that they are equal (s0 even)
    return x[::2] + x[1::2] * 2


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
def test_slices_of_sizes_equal_under_the_guards_broadcast(target):
    g = _compile(_halves, target)
    for n in (8, 12, 30):
        x = torch.randn(n, 3)
        torch.testing.assert_close(g(x), _halves(x))


def _rotary(x):
    # a table of frequencies over every other column, repeated twice to the columns: torch
    # guards s1 = 2*((s1 + 1)//2), a rule for proofs only, whose fraction cancels in the size
    # 2*((s1 + 1)//2) of the repeat (before: `cannot broadcast`, and the graph ran eagerly)
    freqs = 1.0 / (10000 ** (torch.arange(0, x.shape[1], 2).float() / x.shape[1]))
    return x * torch.outer(torch.arange(x.shape[0]).float(), freqs).cos().repeat(1, 2)


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
def test_a_rule_for_proofs_only_whose_fraction_cancels_makes_sizes_broadcast(target):
    g = _compile(_rotary, target)
    for n, d in ((8, 16), (12, 32), (5, 10)):
        x = torch.randn(n, d)
        torch.testing.assert_close(g(x), _rotary(x))


def _glu(x):
    # glu's halves x[:, :s1//2] and x[:, s1//2:] (torch guards s1 even): sizes s1//2 and
    # s1 - s1//2, one size under the rules (before: `cannot broadcast`, and the graph ran eagerly)
    return torch.nn.functional.glu(x, -1) + x[:, : x.shape[1] // 2] * x[:, x.shape[1] // 2:]


@pytest.mark.parametrize("target", ["reference", "cpp", "triton"])
def test_glu_halves_of_a_symbolic_dim_broadcast_forward_and_backward(target):
    g = _compile(_glu, target)
    for n, d in ((4, 8), (6, 12), (8, 10)):
        x = torch.randn(n, d, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        want, got = _glu(x), g(x2)
        torch.testing.assert_close(got, want)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(x2.grad, x.grad)


def _group_norm(x):
    return torch.nn.functional.group_norm(x, 4)


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_group_norm_with_symbolic_channels_compiles(target):
    g = _compile(_group_norm, target)
    for shape in ((2, 8, 5), (3, 12, 7), (1, 16, 3)):
        x = torch.randn(shape)
        torch.testing.assert_close(g(x), _group_norm(x))


def test_the_rules_print_and_the_lowered_graph_spells_each_size_one_way():
    from coil.ir.printer import show
    from tests_helpers import capture_aot

    gm, ins = capture_aot(_halves, (torch.randn(8, 3),))
    lowered = coil.default_pipeline().run(gm, ins, until="lower", options=coil.Options(target="cpp"))
    # s0 at least 4: Dynamo guards the halves' length Ne(s0//2, 1) (it specializes sizes 1)
    assert lowered.sizes.shapes.show() == ["s0 in [4, oo] hint 8", "s1 in [2, oo] hint 3",
                                           "guard FloorDiv(s0 + 1, 2) = FloorDiv(s0, 2)"]
    text = show(lowered)
    # the even rows' slice is `(s0 + 1)//2` long; an identity view spells it s0//2
    assert "slice_1 = View[float32[FloorDiv(s0 + 1, 2), s1]] of arg2_1[2*x0, x1]" in text
    assert "slice_1__1 = View[float32[FloorDiv(s0, 2), s1]] of slice_1[x0, x1]" in text
    assert "add_9 = Pointwise[float32[FloorDiv(s0, 2), s1]]" in text


def test_a_views_minus_one_is_a_whole_size():
    """A view's -1 over symbolic sizes is numel // known, never a size with
    fractions: a polynomial, a number, or a floor division (a length padded to a
    multiple of 256, as torch spells it, which Mamba2's expand then compares)."""
    from coil.passes.lowerings.views import infer_size

    pad = s0 + ModularIndexing(256 - s0, 1, 256)
    info = _info((s0, 300, 2, None), (s1, 4, 2, None))
    assert infer_size([2, -1, 256], 2 * pad, info) == (2, FloorDiv(pad, 256), 256)
    assert infer_size([-1, s0], 128 * s0, info) == (128, s0)
    assert infer_size([s1, -1], 64 * s0 * s1, info) == (s1, 64 * s0)


def test_sizes_computed_in_the_graph_are_simplified_as_input_sizes_are():
    """A `sym_min` of sizes in the graph (MiniMax's sliding window, min(256, s0)
    where Dynamo narrowed s0 to at most 256) is s0, as SizeMap writes the sizes it
    reads; and the guard rules reduce such sizes too (lower's `_size_op`)."""
    import operator

    from coil.passes.lower import _size_op
    from coil.passes.lowerings.registry import LowerCtx
    from coil.passes.symbolic import SizeMap

    rules, _ = guard_rules([FloorDiv(s1 + 1, 2) - FloorDiv(s1, 2)], _info((s0, 24, 2, 256), (s1, 8, 2, None)))
    sm = SizeMap(shapes=attrs.evolve(_info((s0, 24, 2, 256), (s1, 8, 2, None)), rules=rules))
    assert sm.simplify(sympy.Min(256, s0)) == s0
    assert sm.simplify(sympy.Max(s1, 1) + FloorDiv(s1 + 1, 2)) == s1 + FloorDiv(s1, 2)
    assert sm.simplify(sympy.Min(s0, s1)) == sympy.Min(s0, s1)  # neither is provably the smaller
    ctx = LowerCtx("", "", "cpu")
    ctx.sizes = sm
    assert _size_op(ctx, torch.sym_min, (256, s0)) == s0
    assert _size_op(ctx, operator.floordiv, (s1 + 1, 2)) == FloorDiv(s1, 2)



def test_a_linear_equality_of_plain_symbols_solves_for_its_last_symbol():
    """Dynamo leaves `u0 + u1 + u2 + 18 = 64` unreplaced (the split sizes of
    JetMoE's experts, summed to the rows): solved for the last symbol with a unit
    coefficient, substituted into later rows and earlier solutions; a row with no
    unit coefficient, or a product of symbols, gives nothing."""
    from coil.ir.shapes import symbol_solutions

    u0, u1, u2 = (unbacked_symbol(i) for i in range(3))
    info = ShapeInfo(tuple(SymbolFacts(u, h, 0, None, backed=False) for u, h in ((u0, 14), (u1, 15), (u2, 17))))
    rules, solved = guard_rules([u0 + u1 + u2 + 18 - 64], info)
    assert rules == () and solved == {u2: 46 - u0 - u1}
    # a chain: s1 = s0 + 1 and s2 = s1 + s0 give s2 = 2*s0 + 1, in terms of s0 alone
    info3 = _info((s0, 4, 2, None), (s1, 5, 2, None), (s2, 9, 2, None))
    _, solved = guard_rules([s1 - s0 - 1, s2 - s1 - s0], info3)
    assert solved == {s1: s0 + 1, s2: 2 * s0 + 1}
    assert symbol_solutions([{s0: 2, s1: 2, sympy.Integer(1): -8}]) == {}  # 2*s0 + 2*s1 = 8: no unit coefficient
    # ... until a later row solves s1 = s0: then 4*s0 = 8 pins s0, and s1 with it
    assert symbol_solutions([{s0: 2, s1: 2, sympy.Integer(1): -8}, {s1: 1, s0: -1}]) == {s0: 2, s1: 2}
    assert symbol_solutions([{s0 * s1: 1, s2: -1}]) == {}  # s0*s1 = s2: a product
    # false at the hints: none at all
    assert guard_rules([s1 - s0 - 2], info3) == ((), {})


def _experts(x, sizes):
    # JetMoE's experts: rows split by counts (ints Dynamo makes symbolic after a
    # recompile, but for one that stays 18), then joined and added to the rows
    parts = x.split(sizes, 0)
    return torch.cat([p * (i + 1) for i, p in enumerate(parts)]) + x


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_split_sizes_that_a_guard_sums_to_the_rows_broadcast_against_them(target):
    """Refused before (`cannot broadcast sizes [(u0 + u1 + u2 + 18, 8), (64, 8)]`)."""
    if not target_available(target):
        pytest.skip(f"{target} not available")
    torch._dynamo.reset()
    g = torch.compile(_experts, backend="coil", options={"target": target})
    for sizes in ([14, 18, 15, 17], [13, 18, 17, 16], [12, 18, 20, 14], [20, 18, 6, 20]):
        x = torch.randn(64, 8)
        torch.testing.assert_close(g(x, sizes), _experts(x, sizes))


@st.composite
def _linear_system(draw):
    """Hints for three symbols and equalities over them that hold at the hints
    (`sum c_i*s_i = sum c_i*hint_i`), as Dynamo's guards do at the call."""
    syms = (s0, s1, s2)
    hints = [draw(st.integers(2, 40)) for _ in syms]
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        cs = [draw(st.integers(-2, 2)) for _ in syms]
        rows.append(sum(c * s for c, s in zip(cs, syms)) - sum(c * h for c, h in zip(cs, hints)))
    return hints, rows


@settings(max_examples=200, deadline=None)
@given(_linear_system())
def test_symbol_solutions_hold_at_the_hints_and_satisfy_the_equalities(drawn):
    """Every solution is true at the hints, writes its symbol with integer
    coefficients in terms of symbols left unsolved, and each equality with the
    solutions substituted is 0 or a row no unit coefficient solves."""
    hints, rows = drawn
    info = _info(*((s, h, 2, None) for s, h in zip((s0, s1, s2), hints)))
    rules, solved = guard_rules(rows, info)
    assert rules == ()
    at = dict(zip((s0, s1, s2), hints))
    for s, v in solved.items():
        v = sympy.sympify(v)
        assert v.xreplace(at) == at[s]
        assert not (v.free_symbols & set(solved))
        assert all(c.is_Integer for c in sympy.Poly(v, *sorted(v.free_symbols, key=str) or [s0]).coeffs())
    for e in rows:
        left = sympy.expand(sympy.sympify(e).xreplace({k: sympy.sympify(v) for k, v in solved.items()}))
        if left != 0:  # two symbols or more left, none with a unit coefficient
            terms = {m: c for m, c in left.as_coefficients_dict().items() if m != 1}
            assert len(terms) >= 2 and not any(abs(c) == 1 for c in terms.values()), left


def test_an_equality_of_two_products_of_symbols_is_a_rule():
    """cross_entropy of logits flattened to (B*S, V) against labels of their own
    batch and length flattened to B'*S': Dynamo guards s0*s1 = s2*s3, which no
    substitution of one symbol states.  The later product is written as the
    earlier one, in sizes and as a factor of their terms."""
    s3 = size_symbol(3)
    info = _info((s0, 2, 2, None), (s1, 5, 2, None), (s2, 2, 2, None), (s3, 5, 2, None))
    rules, pins = guard_rules([s0 * s1 - s2 * s3], info)
    assert [r.show() for r in rules] == ["guard s2*s3 = s0*s1"] and pins == {}
    info = attrs.evolve(info, rules=rules)
    assert info.reduce(10 * s2 * s3 + s2) == 10 * s0 * s1 + s2
    assert info.known_eq(s0 * s1, s2 * s3) and not info.known_eq(s0, s2)
    assert guard_rules([s0 * s1 - s2 * s3], _info((s0, 2, 2, None), (s1, 5, 2, None), (s2, 3, 2, None),
                                                  (s3, 5, 2, None))) == ((), {})  # false at the hints


def _flat_cross_entropy(w, ids, labels):
    return torch.nn.functional.cross_entropy(w[ids].view(-1, w.shape[1]), labels.view(-1))


def test_a_product_equal_to_a_multiple_of_a_symbol_is_a_rule():
    """Where the model fixed the sequence length (a Python loop over it: Mamba's
    slow scan, Funnel's pooling) while the labels keep theirs symbolic, the guard
    is 7*s0 = s1*s2: the product is written as 7*s0."""
    info = _info((s0, 3, 2, None), (s1, 3, 2, None), (s2, 7, 2, None))
    rules, _ = guard_rules([7 * s0 - s1 * s2], info)
    assert [r.show() for r in rules] == ["guard s1*s2 = 7*s0"]
    assert guard_rules([2 * s0 - 3 * s1 * s2], info) == ((), {})  # no whole multiple: no rule
    # rows of 4 reshaped by two int arguments (u0, u1): 4*s0 = 4*u0*u1, guarded twice
    u0, u1 = unbacked_symbol(0), unbacked_symbol(1)
    ints = ShapeInfo((SymbolFacts(s0, 6, 2, None), SymbolFacts(u0, 2, 0, None, backed=False),
                      SymbolFacts(u1, 3, 0, None, backed=False)))
    rules, _ = guard_rules([4 * s0 - 4 * u0 * u1] * 2, ints)
    assert [r.show() for r in rules] == ["guard u0*u1 = s0"]
    assert attrs.evolve(ints, rules=rules).known_eq(4 * u0 * u1, 4 * s0)


def _reshaped_by_ints(x, b, s):
    return (x * 2).reshape(b, s, 4).sum(1)


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_a_reshape_by_int_arguments_compiles(target):
    """Rows reshaped by ints the caller passes (Mixtral's loop experts after a graph
    break): Dynamo guards 4*s0 = 4*u0*u1.  That graph ran eagerly before (`view:
    shape [u0, u1, 4] is invalid for input of size 4*s0`)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    g = torch.compile(_reshaped_by_ints, backend="coil", dynamic=True, options={"target": target, "graph_cache": False})
    for b, s in ((2, 3), (3, 5), (4, 7)):
        x = torch.randn(b * s, 4)
        torch.testing.assert_close(g(x, b, s), _reshaped_by_ints(x, b, s))
    assert counters["coil"]["eager"] == 0 and counters["coil"]["compiled"] >= 1, dict(counters["coil"])


def _fixed_length_cross_entropy(w, ids, labels):
    logits = w[ids]
    for _ in range(ids.shape[1]):  # specializes the length
        logits = logits + 0.0
    return torch.nn.functional.cross_entropy(logits.view(-1, w.shape[1]), labels.view(-1))


@pytest.mark.parametrize("target", ["reference", "cpp"])
@pytest.mark.parametrize("fn", [_flat_cross_entropy, _fixed_length_cross_entropy], ids=["products", "multiple"])
def test_cross_entropy_of_separately_sized_labels_compiles_forward_and_backward(fn, target):
    """Refused before in the backward, which then ran eagerly at every new size:
    `cannot broadcast sizes [(s0*s1, 10), (s2*s3, 1)]`, and where the model fixed
    the length (Mamba's slow scan, Funnel's pooling: found at a second size in
    their training) `[(7*s0, 10), (s1*s2, 1)]`."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    g = torch.compile(fn, backend="coil", options={"target": target})
    w = torch.randn(50, 10, requires_grad=True)
    for b, s in ((2, 5), (3, 7), (4, 3)):
        ids, labels = torch.randint(0, 50, (b, s)), torch.randint(0, 10, (b, s))
        got = g(w, ids, labels)
        (gw,) = torch.autograd.grad(got, w)
        want = fn(w, ids, labels)
        (ew,) = torch.autograd.grad(want, w)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(gw, ew)
    assert counters["coil"]["eager"] == 0 and counters["coil"]["symbolic"] >= 2, dict(counters["coil"])


def test_a_common_factor_of_a_floor_division_cancels():
    """(128*s0) // 512 is s0 // 4, the spelling of a guard's atom: a reshape's size
    as Dynamo passes it against `8*(s0//4) = 2*s0` (Reformer's chunks)."""
    assert FloorDiv(128 * s0, 512) == FloorDiv(s0, 4)
    assert FloorDiv(6 * s0 + 4 * s1, 8) == FloorDiv(3 * s0 + 2 * s1, 4)
    assert isinstance(FloorDiv(6 * s0 + 3, 8), FloorDiv) and FloorDiv(6 * s0 + 3, 8).args[1] == 8  # gcd 1
    for n in range(40):  # the fold keeps the value
        assert FloorDiv(6 * s0 + 4, 8).subs(s0, n) == (6 * n + 4) // 8


def test_a_rule_for_proofs_only_is_used_inside_a_floor_division():
    """LongT5's blocks of a length that is a multiple of 9: with s0//9 = s0/9,
    s0 // (s0//9) is 9, so its reshape's 1944*(s0//9) elements equal the input's
    24*(s0//9)*(s0//(s0//9))**2.  The rule goes inside the function for proofs
    only; a size keeps its spelling."""
    info = _info((s0, 27, 18, None))
    blocks = FloorDiv(s0, FloorDiv(s0, 9))
    rules, _ = guard_rules([FloorDiv(s0, 9) * blocks - s0, ModularIndexing(s0, 1, 9)], info)
    info = attrs.evolve(info, rules=rules)
    assert info.known_eq(blocks, 9) and not info.known_eq(blocks, 8)
    assert info.known_eq(24 * FloorDiv(s0, 9) * blocks ** 2, 1944 * FloorDiv(s0, 9))
    assert not info.known_eq(24 * FloorDiv(s0, 9) * blocks ** 2, 1944 * FloorDiv(s0, 9) + 1)
    assert not _info((s0, 27, 18, None)).known_eq(blocks, 9)  # without the guards: no
    assert info.reduce(blocks + 1) == blocks + 1


def _chunked(x):
    # Reformer's local attention: a length padded to a multiple of 8 where it is not one,
    # heads split, then chunks of 8 by a reshape with -1 (the branch without the pad
    # ran eagerly before: `view: shape [2, 2, FloorDiv(128*s0, 512), 8, 16] is invalid`)
    if x.shape[1] % 8 != 0:
        x = torch.nn.functional.pad(x, (0, 0, 0, -x.shape[1] % 8))
    h = x.view(2, -1, 2, 16).transpose(1, 2)
    return h.reshape(2, 2, -1, 8, 16).sum(3)


def _blocks_of_nine(x):
    # LongT5's local attention at a length that is a multiple of its blocks of 9: the
    # rows split into s0//9 blocks by a reshape with -1 (a block of s0//(s0//9) rows),
    # each block's scores against three blocks, viewed with the literal block sizes
    # (before: the view's check, its own guard `9*(s0//9) = s0` unused on 72*(s0//9),
    # fell to samples that divided by s0//9 = 0: `ZeroDivisionError`, and it ran eagerly)
    n = x.shape[1] // 9
    q = x.reshape(2, n, -1, 4)
    k = torch.cat([q, q, q], dim=2)
    return torch.einsum("bnqd,bnkd->bnqk", q, k).view(2, n, 1, 9, 27) * 2


@pytest.mark.parametrize("fn", [_chunked, _blocks_of_nine], ids=["chunks", "blocks"])
@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_reshapes_equal_under_divisibility_guards_compile(fn, target):
    from torch._dynamo.utils import counters

    if not target_available(target):
        pytest.skip(f"{target} not available")
    torch._dynamo.reset()
    counters.clear()
    g = torch.compile(fn, backend="coil", options={"target": target, "graph_cache": False, "eager_fallback": False})
    for s in (32, 20, 24, 27, 36):
        x = torch.randn(2, s, 64) if fn is _chunked else torch.randn(2, s // 9 * 9, 4)
        torch.testing.assert_close(g(x), fn(x))
    assert counters["coil"]["eager"] == 0 and counters["coil"]["compiled"] >= 2, dict(counters["coil"])


def _windows(x):
    # Swin's window attention at a size: padded to a multiple of the window (4) when it is
    # not one (a Python `if` on sizes: Dynamo guards `Mod(4 - Mod(H, 4), 4) <= 0`, an
    # inequality that says the padding is 0), windows of 4x4 in a view, then unpadded
    b, h, w, c = x.shape
    pad_h, pad_w = (4 - h % 4) % 4, (4 - w % 4) % 4
    x = torch.nn.functional.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    hp, wp = x.shape[1], x.shape[2]
    win = x.view(b, hp // 4, 4, wp // 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, c)
    win = win.softmax(1) * 2
    out = win.view(b, hp // 4, wp // 4, 4, 4, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
    if pad_h > 0 or pad_w > 0:
        out = out[:, :h, :w, :].contiguous()
    # the merge of 2x2 patches: (h + 1)//2 of an h a guard made a multiple of 4
    merged = out.view(b, (h + 1) // 2, 2, (w + 1) // 2, 2, c).sum((2, 4))
    return out.view(b, h * w, c), merged


@pytest.mark.parametrize("target", ["reference", "cpp"])
def test_windows_of_a_size_an_inequality_guard_keeps_unpadded(target):
    """A guard that the padding is at most 0 (a remainder, so exactly 0) is an
    equality, taken apart to `h//4 = h/4`; the windows' view and the merged
    patches' then check (before: `view: shape ... is invalid`, run eagerly)."""
    g = _compile(_windows, target, eager_fallback=False)
    for h, w in ((8, 8), (12, 16), (16, 8), (24, 20)):
        x = torch.randn(2, h, w, 3)
        got, want = g(x), _windows(x)
        torch.testing.assert_close(got, want)


def test_a_zero_remainder_of_a_padding_is_the_sizes_own():
    """`Mod(4 - Mod(s0//2, 4), 4) = 0` (no padding needed) gives `Mod(s0//2, 4) =
    0`, and with s0 even the divisions of s0 by 2, 4 and 8 are written over s0//8."""
    pad = ModularIndexing(4 - ModularIndexing(FloorDiv(s0, 2), 1, 4), 1, 4)
    rules, _ = guard_rules([ModularIndexing(s0, 1, 2), pad], _info((s0, 48, 32, None)))
    info = attrs.evolve(_info((s0, 48, 32, None)), rules=rules)
    assert info.reduce(FloorDiv(s0, 2)) == 4 * FloorDiv(s0, 8)
    assert info.reduce(FloorDiv(s0, 4)) == 2 * FloorDiv(s0, 8)
    assert info.reduce(pad) == 0
    assert info.known_eq(FloorDiv(s0, 8) * 16, 2 * s0) and info.known_eq(FloorDiv(s0, 4) * 4, s0)
    assert not info.known_eq(FloorDiv(s0, 16) * 16, s0)
    # without the padding's guard, s0 is only even
    rules, _ = guard_rules([ModularIndexing(s0, 1, 2)], _info((s0, 48, 32, None)))
    assert not attrs.evolve(_info((s0, 48, 32, None)), rules=rules).known_eq(FloorDiv(s0, 4) * 4, s0)


def test_size_folds_of_whole_multiples_plus_a_constant():
    assert FloorDiv(4 * FloorDiv(s0, 8) + 1, 2) == 2 * FloorDiv(s0, 8)
    assert FloorDiv(4 * FloorDiv(s0, 8) + 3, 2) == 2 * FloorDiv(s0, 8) + 1
    assert ModularIndexing(4 * FloorDiv(s0, 8) + 1, 1, 4) == 1
    assert ModularIndexing(8 * s0, 2, 4) == 0
    assert isinstance(FloorDiv(4 * FloorDiv(s0, 8) + s1, 2), FloorDiv)  # a rest that is no constant


def test_a_max_the_ranges_decide_is_its_larger_side_after_the_rules():
    info = attrs.evolve(_info((s0, 48, 32, None)),
                        rules=(coil.ir.shapes.SizeRule(FloorDiv(s0, 2), 4 * FloorDiv(s0, 8), True),))
    assert info.reduce(sympy.Max(1, FloorDiv(s0, 2) // 4)) == FloorDiv(s0, 8)
    assert info.reduce(sympy.Max(1, FloorDiv(s0, 2)) * 2 - 8 * FloorDiv(s0, 8)) == 0


def test_samples_skip_points_the_rules_rule_out_and_need_enough_left():
    from coil.ir.shapes import SizeRule, equal_at_samples

    multiple = (SizeRule(ModularIndexing(s0, 1, 16), sympy.Integer(0), True),)
    info = _info((s0, 48, 32, None))
    a, b = 16 * FloorDiv(s0, 16), s0  # equal only where s0 is a multiple of 16
    assert not equal_at_samples(a, b, info)
    assert equal_at_samples(a, b, attrs.evolve(info, rules=multiple))
    assert not equal_at_samples(a, b + 1, attrs.evolve(info, rules=multiple))
    # a rule that few samples but the hint pass (s0 < 49) proves nothing, though they agree
    few = attrs.evolve(info, rules=(SizeRule(FloorDiv(s0, 49), sympy.Integer(0), True),))
    assert not equal_at_samples(sympy.Integer(0), FloorDiv(s0, 49), few)


def test_the_least_size_the_guards_on_one_symbol_admit():
    from torch.utils._sympy.functions import FloorDiv as TorchFloorDiv, Mod as TorchMod

    from coil.passes.symbolic import _guarded_least, _relations

    s = sympy.Symbol("s58", integer=True, positive=True)
    t = sympy.Symbol("s68", integer=True, positive=True)
    guards = (sympy.Eq(TorchMod(s, 2), 0), sympy.Ne(TorchFloorDiv(s, 4), 1),
              sympy.Gt(sympy.Min(TorchFloorDiv(s, 2), TorchFloorDiv(t, 2)), 4))
    rels = [r for g in guards for r in _relations(g)]
    assert _guarded_least(rels, s, 2, 48) == 10  # even, s//4 != 1, s//2 > 4
    assert _guarded_least(rels, s, 2, 6) == 2  # a hint that fails a guard: a guard misread, nothing taken
    assert _guarded_least([], s, 2, 48) == 2
    # the Ne alone: 4..7 have s//4 = 1
    ne = [r for r in _relations(sympy.Ne(TorchFloorDiv(s, 4), 1))]
    assert _guarded_least(ne, s, 4, 48) == 8


def test_the_guards_read_once_for_a_shape_env_give_the_same_map():
    """SizeMap.of remembers each guard's equality for its ShapeEnv (the graph
    cache's keys and lower map a graph's sizes three times); a second map, and
    one made with the memory cleared, are the first's."""
    from coil.passes import symbolic
    from tests_helpers import capture_aot

    _, ins = capture_aot(_halves, (torch.randn(8, 3),))
    env = symbolic.shape_env(ins)
    symbolic._EQUALITIES.pop(env, None)
    symbolic._rules_of.cache_clear()
    first = symbolic.SizeMap.of(ins)
    assert symbolic._EQUALITIES.get(env)  # remembered
    again = symbolic.SizeMap.of(ins)
    symbolic._EQUALITIES.pop(env, None)
    symbolic._rules_of.cache_clear()
    fresh = symbolic.SizeMap.of(ins)
    assert first.shapes.show() == again.shapes.show() == fresh.shapes.show()
    assert "guard FloorDiv(s0 + 1, 2) = FloorDiv(s0, 2)" in first.shapes.show()
    assert first.names == again.names == fresh.names


def test_swin_trains_at_a_second_image_size():
    """Swin at 32 then 48 pixels (windows of 4, two stages): the second call's
    forward and backward compile with symbolic sizes (before: its windows' view
    was refused and they ran eagerly), and the step's gradients match eager's.
    (_windows above is the same in inference, cheaper.)"""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                  window_size=4, num_labels=3, drop_path_rate=0.0)
    torch.manual_seed(0)
    model = transformers.SwinForImageClassification(cfg).train()
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="coil",
                             options={"target": "cpp", "eager_fallback": False})
    for size in (32, 48):
        x, labels = torch.randn(2, 3, size, size), torch.tensor([0, 2])
        model.zero_grad()
        compiled.zero_grad()
        model(pixel_values=x, labels=labels).loss.backward()
        compiled(pixel_values=x, labels=labels).loss.backward()
        for (name, p), q in zip(model.named_parameters(), compiled.parameters()):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-3, msg=name)


_S0, _S1, _S2 = (size_symbol(k) for k in range(3))
_FACTORS = [_S0, _S1, _S2, FloorDiv(_S0, 2), FloorDiv(_S0, _S2), ModularIndexing(_S1, 1, 4)]
_monomials = st.builds(
    lambda c, powers: sympy.Integer(c) * sympy.Mul(*(f ** p for f, p in zip(_FACTORS, powers))),
    st.sampled_from([1, 2, 3, 9]), st.lists(st.integers(0, 2), min_size=len(_FACTORS), max_size=len(_FACTORS)))


@settings(max_examples=300, deadline=None)
@given(_monomials, _monomials)
def test_a_term_whose_bases_lack_an_atoms_never_divides_by_it(m: sympy.Expr, a: sympy.Expr) -> None:
    """`_reduce` skips dividing a term by a rule's atom where the atom has a base
    the term lacks (`_bases`): exact, since such a base stays in the quotient's
    denominator, so neither a whole quotient nor one over an integer is lost."""
    from coil.ir.shapes import _bases

    if a.is_number:
        return
    num, den = sympy.fraction(m / a)
    if den == 1 or den.is_Integer:
        assert _bases(a) <= _bases(m), (m, a, m / a)
