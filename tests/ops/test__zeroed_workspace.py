"""ops/_zeroed_workspace.py: the persistent zeroed int32 workspace (CPU: a fresh zeros tensor;
the CUDA buffer reuse, growth and capture rules are exercised by the split-K GPU tests)."""

from __future__ import annotations

import torch

from qfuse.ops._zeroed_workspace import zeroed_int32


def test_cpu_gives_fresh_zeros():
    a = zeroed_int32(torch.device("cpu"), 37)
    assert a.shape == (37,) and a.dtype == torch.int32 and not a.any()
    a += 1  # a kernel that did not clean up on the CPU cannot leak into the next call
    assert not zeroed_int32(torch.device("cpu"), 37).any()
