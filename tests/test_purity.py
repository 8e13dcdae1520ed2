"""Every pass is pure: equal input gives equal output (names included), and the
input is not changed (its printed form is the same afterwards; IR nodes are frozen)."""

from __future__ import annotations

import attrs
import pytest
import torch

import coil
from coil.ir.printer import show
from coil.passes.lower import FxGraph
from tests_helpers import trace


def _model(x, w):
    h = torch.softmax(x, -1) + torch.mm(x, w).sum(-1, keepdim=True)
    return h.t()[:, ::2].contiguous(), torch.var_mean(x, dim=0)


def _stages():
    inputs = [torch.randn(6, 8), torch.randn(8, 4)]
    gm = trace(_model, *inputs)
    opts = coil.Options(target="reference")
    p = coil.default_pipeline()
    irs = [FxGraph(gm, tuple(inputs))]
    for name, fn in p.passes:
        irs.append(fn(irs[-1], opts))
    return p, irs, opts


def test_each_pass_is_deterministic():
    p, irs, opts = _stages()
    for (name, fn), before, after in zip(p.passes, irs, irs[1:]):
        again = fn(before, opts)
        assert show(again) == show(after), f"{name} is not deterministic"


def test_no_pass_mutates_its_input():
    p, irs, opts = _stages()
    for (name, fn), before in zip(p.passes[1:], irs[1:]):
        text = show(before)
        fn(before, opts)
        assert show(before) == text, f"{name} changed its input"


def test_ir_nodes_are_frozen():
    _, irs, _ = _stages()
    bg = irs[2]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        bg.buffers[0].rule = "x"  # type: ignore[misc]
    sg = irs[3]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        sg.nodes[0].read_writes = None  # type: ignore[misc]
    assert isinstance(sg.nodes[0].read_writes.reads, frozenset)


def test_pipeline_replace_and_insert_after_return_new_pipelines():
    p = coil.default_pipeline()
    assert p.stages == ("lower", "realize", "extract_deps", "fuse", "overlap", "plan_memory", "schedule_kernels", "wrap",
                        "kernel_gen")
    seen = []

    def check(plan, options):
        seen.append(plan.peak_bytes)
        return plan

    q = p.insert_after("plan_memory", check, "my_check")
    assert "my_check" in q.stages and "my_check" not in p.stages
    inputs = [torch.randn(4, 4)]
    q.run(trace(lambda x: x.sin(), *inputs), inputs, options=coil.Options(target="reference"))
    assert seen and seen[0] > 0
    from coil.passes.fuse import fuse

    r = p.replace("fuse", lambda g, o: fuse(g, o.replace(max_fusion_size=1)))
    gm = trace(lambda x: torch.softmax(x, -1), *inputs)
    unfused = r.run(gm, inputs, until="fuse", options=coil.Options(target="reference"))
    fused = p.run(gm, inputs, until="fuse", options=coil.Options(target="reference"))
    assert len(fused.kernels) == 1
    assert len(unfused.kernels) == len(unfused.graph.nodes) > 1
