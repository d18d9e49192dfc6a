"""ops/moe/routing.py: the one-launch Triton routing against the torch reference (interpreter on
the CPU, and on the GPU): the same experts in the same slots, weights within a few float32 ulps;
E not a power of two, top_k 1 to E, bf16 / float32 logits, strided rows, exact ties, NaN rows."""

from __future__ import annotations

import pytest
import torch

from qfuse.ops.moe.routing import topk_routing, topk_routing_triton


def check(logits, top_k, renormalize):
    w_ref, e_ref = topk_routing(logits, top_k, renormalize)
    w, e = topk_routing_triton(logits, top_k, renormalize)
    assert w.dtype == torch.float32 and e.dtype == torch.int32 and w.shape == e.shape == (logits.shape[0], top_k)
    assert torch.equal(e.long().cpu(), e_ref.cpu())
    torch.testing.assert_close(w.cpu(), w_ref.cpu(), rtol=1e-6, atol=1e-9, equal_nan=True)  # ~8 ulps: the softmax sums in another order


@pytest.mark.parametrize(("m", "e", "top_k"), [(1, 8, 2), (7, 8, 1), (16, 64, 8), (5, 60, 4), (3, 6, 6)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch(m, e, top_k, renormalize, dtype):
    g = torch.Generator().manual_seed(m * e + top_k)
    check(torch.randn(m, e, generator=g).mul(3).to(dtype), top_k, renormalize)  # bf16: ties within rows


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
    check(logits, 3, True)  # the reference breaks ties the same way


def test_bf16_router_ties_pick_the_same_experts():
    """bf16 logits take few values: 64 experts, top-8, about 2.6 % of rows tie at the 8th place."""
    logits = torch.randn(400, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    p = torch.softmax(logits.float(), -1).sort(-1, descending=True).values
    assert (p[:, 7] == p[:, 8]).any()  # the case this test is for
    check(logits, 8, True)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "all -inf"])
def test_nan_rows_pick_experts_in_range_and_give_nan_weights(bad):
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    if bad == "all -inf":
        logits[1] = -float("inf")
    else:
        logits[1, 4] = bad
    for renormalize in (True, False):
        w_ref, e_ref = topk_routing(logits, 2, renormalize)
        w, e = topk_routing_triton(logits, 2, renormalize)
        assert e.tolist() == e_ref.tolist() and e[1].tolist() == [0, 1]
        assert w[1].isnan().all() and w_ref[1].isnan().all()
        torch.testing.assert_close(w[[0, 2]], w_ref[[0, 2]], rtol=1e-6, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "e", "top_k"), [(1, 8, 2), (16, 8, 2), (257, 64, 8), (64, 60, 4), (3, 128, 8)])
def test_gpu_matches_torch(m, e, top_k):
    g = torch.Generator().manual_seed(m + e)
    logits = torch.randn(m, e, generator=g).mul(3)
    logits[0, 1] = float("nan")
    for renormalize in (True, False):
        check(logits.cuda(), top_k, renormalize)
        check(logits.bfloat16().cuda(), top_k, renormalize)  # ties within rows
