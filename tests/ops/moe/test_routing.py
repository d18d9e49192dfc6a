"""ops/moe/routing.py: the one-launch Triton routing against the torch reference (interpreter on
the CPU, and on the GPU): the same experts in the same slots, weights within a few float32 ulps;
E not a power of two, top_k 1 to E, bf16 / float32 logits, strided rows, exact ties."""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.moe.routing import topk_routing, topk_routing_triton


def check(logits, top_k, renormalize):
    w_ref, e_ref = topk_routing(logits, top_k, renormalize)
    w, e = topk_routing_triton(logits, top_k, renormalize)
    assert w.dtype == torch.float32 and e.dtype == torch.int32 and w.shape == e.shape == (logits.shape[0], top_k)
    assert torch.equal(e.long().cpu(), e_ref.cpu())
    torch.testing.assert_close(w.cpu(), w_ref.cpu(), rtol=1e-6, atol=1e-9)  # ~8 ulps: the softmax sums in another order


@pytest.mark.parametrize(("m", "e", "top_k"), [(1, 8, 2), (7, 8, 1), (16, 64, 8), (5, 60, 4), (3, 6, 6)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(m, e, top_k, renormalize, dtype):
    g = torch.Generator().manual_seed(m * e + top_k)
    if dtype == torch.bfloat16:  # distinct values (random bf16 logits tie, and torch.topk orders ties its own way)
        logits = torch.stack([torch.randperm(e, generator=g) for _ in range(m)]).mul(0.1).sub(3).to(dtype)
    else:
        logits = torch.randn(m, e, generator=g).mul(3)
    check(logits, top_k, renormalize)


def test_strided_rows_and_a_dominant_expert():
    logits = torch.randn(9, 32, generator=torch.Generator().manual_seed(1))[:, :16]  # rows 32 apart
    logits[:, 3] = 30.0
    check(logits, 2, True)


def test_exact_ties_take_the_lowest_index():
    logits = torch.zeros(2, 8)
    logits[0, [2, 5]] = 1.0
    logits[1] = torch.tensor([0.0, 3.0, 1.0, 3.0, 1.0, 3.0, 0.0, 0.0])
    w, e = topk_routing_triton(logits, 3, False)
    assert e.tolist() == [[2, 5, 0], [1, 3, 5]]
    assert w[1, 0] == w[1, 1] == w[1, 2]


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "e", "top_k"), [(1, 8, 2), (16, 8, 2), (257, 64, 8), (64, 60, 4), (3, 128, 8)])
def test_gpu_matches_torch(m, e, top_k):
    g = torch.Generator().manual_seed(m + e)
    distinct = torch.stack([torch.randperm(e, generator=g) for _ in range(m)]).mul(0.1).sub(3)  # no ties in bf16
    for renormalize in (True, False):
        check(torch.randn(m, e, generator=g).mul(3).cuda(), top_k, renormalize)
        check(distinct.bfloat16().cuda(), top_k, renormalize)
