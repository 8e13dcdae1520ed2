"""Verifiers catch hand-corrupted IR and say which pass, node and rule."""

from __future__ import annotations

import attrs
import pytest
import torch

from coil.ir.buffers import ComputedBuffer
from coil.ir.expr import Load, Op, walk
from coil.ir.verify import VerifyError, verify
from tests_helpers import run_until


def _fn(x, y):
    return (x + y).relu().sum(-1), x * 2


def _ir(stage: str):
    return run_until(_fn, [torch.randn(4, 8), torch.randn(4, 8)], stage)


def test_lowered_duplicate_name():
    g = _ir("lower")
    bad = attrs.evolve(g, nodes=g.nodes + (g.nodes[-1],))
    with pytest.raises(VerifyError, match=r"\[lower\].*L1 duplicate node name"):
        verify(bad, "lower")


def test_lowered_load_of_undefined_node():
    g = _ir("lower")
    pw = next(n for n in g.nodes if hasattr(n, "body"))
    broken = attrs.evolve(pw, body=Op("add", (pw.body, Load("nope", (0, 0), torch.float32)), torch.float32))
    bad = attrs.evolve(g, nodes=tuple(broken if n is pw else n for n in g.nodes))
    with pytest.raises(VerifyError, match=f"{pw.name}: L2 loads nope, not defined before it"):
        verify(bad, "lower")


def test_buffers_load_of_later_buffer():
    g = _ir("realize")
    b0 = g.buffers[0]
    assert isinstance(b0, ComputedBuffer)
    later = g.buffers[-1].name
    broken = attrs.evolve(b0, body=Op("add", (b0.body, Load(later, (0, 0), torch.float32)), torch.float32))
    bad = attrs.evolve(g, buffers=(broken,) + g.buffers[1:])
    with pytest.raises(VerifyError, match=f"buf0: B2 loads {later}, not an input or earlier buffer"):
        verify(bad, "realize")


def test_buffers_misnamed():
    g = _ir("realize")
    bad = attrs.evolve(g, buffers=(attrs.evolve(g.buffers[0], name="buf7"),) + g.buffers[1:])
    with pytest.raises(VerifyError, match="B1 expected name buf0"):
        verify(bad, "realize")


def test_buffers_foreign_symbol():
    g = _ir("realize")
    b0 = g.buffers[0]
    broken = attrs.evolve(b0, body=Load("x_1", (0, __import__("sympy").Symbol("r5")), torch.float32))
    bad = attrs.evolve(g, buffers=(broken,) + g.buffers[1:])
    with pytest.raises(VerifyError, match="B4 uses symbol r5 outside its loops"):
        verify(bad, "realize")


def test_schedule_out_of_order():
    g = _ir("extract_deps")
    assert len(g.nodes) >= 2
    bad = attrs.evolve(g, nodes=tuple(reversed(g.nodes)))
    with pytest.raises(VerifyError, match="S1 nodes do not match buffers"):
        verify(bad, "extract_deps")


def test_error_prints_the_ir_around_the_fault():
    g = _ir("realize")
    bad = attrs.evolve(g, buffers=(attrs.evolve(g.buffers[0], rule=""),) + g.buffers[1:])
    with pytest.raises(VerifyError) as info:
        verify(bad, "realize")
    msg = str(info.value)
    assert "B3 no realize rule" in msg and "  | " in msg and "buf0: ComputedBuffer" in msg


def test_wrapper_invariant_failure_is_a_verify_error():
    w = _ir("wrap")
    lines = tuple(ln for ln in w.lines if type(ln).__name__ != "Alloc")
    with pytest.raises(VerifyError, match="used before it is allocated"):
        verify(attrs.evolve(w, lines=lines), "wrap")


def test_buffers_unknown_reduction_type():
    g = run_until(lambda x: x.sum(-1), [torch.randn(4, 8)], "realize")
    bad = attrs.evolve(g, buffers=(attrs.evolve(g.buffers[0], reduction_type="median"),))
    with pytest.raises(VerifyError, match="B5 unknown reduction type 'median'"):
        verify(bad, "realize")


def _masked(body, mask):
    """Every load of x_1 in `body` masked by `mask`."""
    from coil.ir.expr import rewrite

    return rewrite(body, lambda e: attrs.evolve(e, mask=mask) if isinstance(e, Load) and e.name == "x_1" else None)


def test_lowered_mask_that_is_not_bool():
    from coil.ir.expr import IndexExpr, xsym

    g = _ir("lower")
    pw = next(n for n in g.nodes if hasattr(n, "body") and any(
        isinstance(e, Load) and e.name == "x_1" for e in walk(n.body)))
    broken = attrs.evolve(pw, body=_masked(pw.body, IndexExpr(xsym(0))))
    bad = attrs.evolve(g, nodes=tuple(broken if n is pw else n for n in g.nodes))
    with pytest.raises(VerifyError, match=f"{pw.name}: L5 masks its load of x_1 with a int64 value, not bool"):
        verify(bad, "lower")
    # the same load under a bool mask is valid
    fine = attrs.evolve(pw, body=_masked(pw.body, Op("lt", (IndexExpr(xsym(0)), IndexExpr(2)), torch.bool)))
    verify(attrs.evolve(g, nodes=tuple(fine if n is pw else n for n in g.nodes)), "lower")


def test_buffers_mask_that_is_not_bool_or_uses_foreign_symbols():
    from coil.ir.expr import Constant, IndexExpr, xsym
    import sympy

    g = _ir("realize")
    b0 = g.buffers[0]
    assert isinstance(b0, ComputedBuffer)
    broken = attrs.evolve(b0, body=_masked(b0.body, Constant(1.0, torch.float32)))
    bad = attrs.evolve(g, buffers=(broken,) + g.buffers[1:])
    with pytest.raises(VerifyError, match="buf0: B6 masks its load of x_1 with a float32 value, not bool"):
        verify(bad, "realize")
    foreign = Op("lt", (IndexExpr(sympy.Symbol("r5", integer=True, nonnegative=True)), IndexExpr(xsym(0))), torch.bool)
    bad = attrs.evolve(g, buffers=(attrs.evolve(b0, body=_masked(b0.body, foreign)),) + g.buffers[1:])
    with pytest.raises(VerifyError, match="buf0: B4 uses symbol r5 outside its loops"):
        verify(bad, "realize")


def test_every_language_of_the_chain_has_a_printer_and_a_verifier():
    """The registry is one explicit table: each language a default stage returns
    has its row there, whatever modules happen to have been imported."""
    from coil.ir.registry import LANGUAGES, PRINTERS, VERIFIERS
    from coil.passes.pipeline import stage_languages

    # a stage may keep its language (overlap: FusedSchedule -> FusedSchedule)
    assert [lang.cls for lang in LANGUAGES] == list(dict.fromkeys(stage_languages()[1].values()))
    assert set(PRINTERS) == set(VERIFIERS) == {lang.cls for lang in LANGUAGES}


def test_kinds_verdicts_and_rules_are_enums_of_the_seeds_words():
    """Kinds, verdicts, orders and rules are StrEnums: closed sets (an unknown word is
    refused when a node is built) whose members print, compare and hash as the
    words the printed IR and users' code use."""
    from coil.ir.buffers import Rule
    from coil.ir.fused import FusedKernel, KernelKind, Verdict
    from coil.ir.memory import Order
    from coil.ir.schedule import NodeKind
    from coil.ir.wrapper import Free, FreeKind

    w = _ir("wrap")
    assert all(type(b.rule) is Rule for b in w.buffers)
    assert all(type(n.kind) is NodeKind for n in w.schedule_graph.nodes)
    assert all(type(k.kind) is KernelKind for k in w.kernels) and w.kernels
    assert all(type(d.verdict) is Verdict for d in w.schedule.fusion_log) and w.schedule.fusion_log
    assert type(w.plan.strategy) is Order
    assert all(type(ln.kind) is FreeKind for ln in w.lines if isinstance(ln, Free))
    assert f"{Verdict.FUSED} {KernelKind.PERSISTENT}" == "fused persistent" and Rule.REUSE == "reuse"
    with pytest.raises(ValueError):
        FusedKernel("k", ("buf0",), "looped", (4, 8))
    with pytest.raises(ValueError):
        Free("buf0", "tensor")
