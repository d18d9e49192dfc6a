"""The reference kernels' exact int8 product, against int32 arithmetic, K = 1 included."""

import pytest
import torch

from qfuse.ops._int_matmul import int8_matmul_nt


@pytest.mark.parametrize("k", [1, 2, 3, 17, 1100])
def test_int8_matmul_nt_is_exact(k):
    g = torch.Generator().manual_seed(k)
    a = torch.randint(-128, 128, (7, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (5, k), dtype=torch.int8, generator=g)
    expected = (a.to(torch.int64)[:, None, :] * b.to(torch.int64)[None]).sum(-1).to(torch.int32)
    for _ in range(3):  # uninitialized memory differs between calls
        assert torch.equal(int8_matmul_nt(a, b), expected)
