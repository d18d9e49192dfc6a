"""ops/_views.py: word views of packed bytes (the kernels' unaligned-storage tests run them end to end)."""

from __future__ import annotations

import torch

from qfuse.ops._views import aligned_view


def test_aligned_bytes_are_viewed_and_a_misaligned_slice_copied():
    buf = torch.arange(16, dtype=torch.uint8).view(2, 8)
    words = aligned_view(buf, torch.int32)
    assert words.shape == (2, 2) and words.data_ptr() == buf.data_ptr()
    for offset, dtype in ((1, torch.int16), (2, torch.int32)):
        view = torch.arange(17, dtype=torch.uint8)[offset : offset + 8].view(2, 4)
        out = aligned_view(view, dtype)
        assert out.storage_offset() == 0 and torch.equal(out.view(torch.uint8), view)
    assert aligned_view(torch.arange(18, dtype=torch.uint8)[2:10], torch.int16).storage_offset() == 1  # 2-byte aligned: a view
