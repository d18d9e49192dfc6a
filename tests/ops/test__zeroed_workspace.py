"""ops/_zeroed_workspace.py: the persistent zeroed int32 workspace (CPU: a fresh zeros tensor;
the CUDA buffer reuse, growth and capture rules are exercised by the split-K GPU tests)."""

from __future__ import annotations

import torch

from qfuse.ops import _zeroed_workspace
from qfuse.ops._zeroed_workspace import zeroed_int32


def test_cpu_gives_fresh_zeros():
    a = zeroed_int32(torch.device("cpu"), 37)
    assert a.shape == (37,) and a.dtype == torch.int32 and not a.any()
    a += 1  # a kernel that did not clean up on the CPU cannot leak into the next call
    assert not zeroed_int32(torch.device("cpu"), 37).any()


def test_rezero_workspaces_clears_what_a_wrong_kernel_left(monkeypatch):
    """The tuner's reset after a wrong candidate: every persistent buffer (eager, graph, and the
    retired ones an older captured graph may still use) is zero again, in place (a captured graph
    keeps pointing at the same memory)."""
    left = {(0, 7): torch.arange(5, dtype=torch.int32), (0, "graph"): torch.full((3,), -2, dtype=torch.int32)}
    retired = [torch.full((2,), 9, dtype=torch.int32)]
    same = {k: v.data_ptr() for k, v in left.items()}
    monkeypatch.setattr(_zeroed_workspace, "_zeroed", left)
    monkeypatch.setattr(_zeroed_workspace, "_retired", retired)
    _zeroed_workspace.rezero_workspaces()
    assert all(not v.any() and v.data_ptr() == same[k] for k, v in left.items())
    assert not retired[0].any()
