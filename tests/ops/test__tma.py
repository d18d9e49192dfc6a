"""ops/_tma.py: descriptor bases (the kernels' unaligned-view tests run them end to end)."""

from __future__ import annotations

import torch

from qfuse.ops._tma import tma_aligned


def test_aligned_tensor_is_kept_and_a_misaligned_view_copied():
    buf = torch.arange(64, dtype=torch.uint8)
    assert tma_aligned(buf) is buf
    view = buf[1:33]
    copy = tma_aligned(view)
    assert copy.data_ptr() % 16 == 0 and copy is not view and torch.equal(copy, view)
