"""The seed's example through the front half: golden IR per pass and the facts the
seed states (one buffer, realized by the output rule, reading the three inputs)."""

from __future__ import annotations

import torch

import coil
from coil.ir.buffers import ComputedBuffer
from coil.ir.printer import realize_table, show
from coil.ir.schedule import MemoryDep
from golden_util import assert_golden


def test_lowered_graph_golden(seed_graph):
    gm, inputs = seed_graph
    ir = coil.default_pipeline().run(gm, inputs, until="lower")
    assert_golden("seed_lowered.txt", show(ir))


def test_buffer_graph_golden(seed_graph):
    gm, inputs = seed_graph
    ir = coil.default_pipeline().run(gm, inputs, until="realize")
    assert_golden("seed_buffers.txt", show(ir))
    assert_golden("seed_realize_table.txt", realize_table(ir))


def test_schedule_graph_golden(seed_graph):
    gm, inputs = seed_graph
    ir = coil.default_pipeline().run(gm, inputs, until="extract_deps")
    assert_golden("seed_schedule.txt", show(ir))


def test_seed_one_scheduler_node(seed_graph):
    gm, inputs = seed_graph
    sg = coil.default_pipeline().run(gm, inputs, until="extract_deps")
    assert [n.name for n in sg.nodes] == ["buf0"]
    (node,) = sg.nodes
    buf = sg.graph.get("buf0")
    assert isinstance(buf, ComputedBuffer) and buf.rule == "output"
    assert {d.name for d in node.read_writes.reads} == {"a_1", "b_1", "c_1"}
    assert {d.name for d in node.read_writes.writes} == {"buf0"}
    assert all(isinstance(d, MemoryDep) for d in node.read_writes.reads)


def test_seed_realize_table_inlines_pointwise(seed_graph):
    gm, inputs = seed_graph
    bg = coil.default_pipeline().run(gm, inputs, until="realize")
    rows = {r.fx_node: r for r in bg.realize_table}
    for op in ("add", "relu", "mul"):
        assert not rows[op].realized and rows[op].rule == "inlined into buf0"
    assert rows["sum_1"].realized and rows["sum_1"].buffer == "buf0" and rows["sum_1"].rule == "output"
    assert [b.name for b in bg.buffers] == ["buf0"]


def test_seed_reference_matches_eager(seed_graph):
    from coil.backends.reference import run_buffer_graph
    from tests_helpers import seed_eager

    gm, inputs = seed_graph
    bg = coil.default_pipeline().run(gm, inputs, until="realize")
    (out,) = run_buffer_graph(bg, inputs)
    torch.testing.assert_close(out, seed_eager(inputs))
