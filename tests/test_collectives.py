"""Asynchronous collectives (torch.distributed._functional_collectives) in coil's IR.

One-process tests trace functional collectives under a gloo group of world size 1
and pin the printed IR: each collective is an Extern paired with its wait_tensor,
and what it touches stays alive (never freed, reused or taken in place) until the
wait.  Two-process tests (gloo, torch.multiprocessing) compile functions calling
collectives, and DDP training, and compare with eager on both ranks."""

from __future__ import annotations

import os
import re
import tempfile

import attrs
import pytest
import torch

import coil
from coil.ir.buffers import Collective, CollectiveRole, ExternBuffer
from coil.ir.printer import show
from coil.ir.verify import VerifyError, verify

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def world1():
    """A one-process gloo group: functional collectives trace and run (on itself)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    path = tempfile.mktemp(prefix="coil-pg-")
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


def _overlapped(group: str):
    def fn(x, w):
        y = x * 2 + 1
        a = c10d.all_reduce(y, "sum", group)
        z = x.sin() * w  # between the collective and its wait
        a = c10d.wait_tensor(a)
        g = c10d.all_gather_into_tensor(a + z, 1, group)
        g = c10d.wait_tensor(g)
        return g * 3, z

    return fn


def _trace(group: str, stage: str, **options):
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(4, 3), torch.randn(4, 3)
    fn = _overlapped(group)
    gm = make_fx(fn)(x, w)
    opts = coil.Options(**{"target": "cpp", "graph_cache": False, "verify": True, **options})
    return coil.default_pipeline().run(gm, [x, w], until=stage, options=opts), fn, gm, (x, w)


def test_buffer_graph_pairs_collectives_with_waits(world1):
    g, *_ = _trace(world1, "realize")
    lines = [ln.strip() for ln in show(g).splitlines() if "ExternBuffer" in ln]
    assert [re.sub(r"^(buf\d+): ExternBuffer (\S+)\(.*\)(.*)  origins=\[\w+\]  (.*)$", r"\1 \2 \4", ln) for ln in lines] == [
        "buf1 _c10d_functional.all_reduce.default collective waited_by=[buf3]",
        "buf3 _c10d_functional.wait_tensor.default wait completes=[buf1]",
        "buf5 _c10d_functional.all_gather_into_tensor.default collective waited_by=[buf6]",
        "buf6 _c10d_functional.wait_tensor.default wait completes=[buf5]",
    ]
    # the collectives stay whole, reading the realized tensors they send
    assert lines[0].startswith(f"buf1: ExternBuffer _c10d_functional.all_reduce.default(buf0, 'sum', '{world1}')")
    assert lines[2].startswith(f"buf5: ExternBuffer _c10d_functional.all_gather_into_tensor.default(buf4, 1, '{world1}')")


def _replace(g, name, **changes):
    return attrs.evolve(g, buffers=tuple(attrs.evolve(b, **changes) if b.name == name else b for b in g.buffers))


def test_verifier_rejects_broken_pairing(world1):
    g, *_ = _trace(world1, "realize")
    verify(g, "realize")
    with pytest.raises(VerifyError, match=r"buf1: B7 _c10d_functional.all_reduce.default is not marked"):
        verify(_replace(g, "buf1", collective=None), "realize")
    with pytest.raises(VerifyError, match=r"buf1: B7 paired with buf6, which is not a later wait naming it back"):
        verify(_replace(g, "buf1", collective=Collective(CollectiveRole.ISSUE, ("buf6",))), "realize")
    with pytest.raises(VerifyError, match=r"buf1: B7 paired with buf3, which is not a later wait naming it back"):
        verify(_replace(g, "buf3", collective=Collective(CollectiveRole.WAIT, ())), "realize")
    with pytest.raises(VerifyError, match=r"buf3: B7 marked wait but aten.mm.default is not a wait"):
        verify(_replace(g, "buf3", kernel="aten.mm.default"), "realize")
