"""Block-aligned token sorting of fused_moe (ops/moe/align.py) against its definition, checked pair by pair."""

import pytest
import torch

from qfuse.ops.moe.align import align_block_size, fc1_row_div, padded_capacity, pair_rows


def check_alignment(experts: torch.Tensor, num_experts: int, block_m: int) -> None:
    sorted_ids, expert_ids, total = align_block_size(experts, num_experts, block_m)
    flat = experts.reshape(-1).tolist()
    pairs = len(flat)
    cap = padded_capacity(pairs, num_experts, block_m)
    assert sorted_ids.dtype == expert_ids.dtype == total.dtype == torch.int32
    assert sorted_ids.shape == (cap,) and expert_ids.shape == (-(-cap // block_m),) and total.shape == (1,)
    counts = [flat.count(e) for e in range(num_experts)]
    padded = [-(-c // block_m) * block_m for c in counts]
    assert total.item() == sum(padded) <= cap
    ids, blocks, pos = sorted_ids.tolist(), expert_ids.tolist(), 0
    for e in range(num_experts):
        run = ids[pos : pos + padded[e]]
        assert run[: counts[e]] == [p for p in range(pairs) if flat[p] == e]  # this expert's pairs, in pair order
        assert run[counts[e] :] == [pairs] * (padded[e] - counts[e])  # then padding
        assert blocks[pos // block_m : (pos + padded[e]) // block_m] == [e] * (padded[e] // block_m)
        pos += padded[e]
    assert ids[pos:] == [pairs] * (cap - pos)
    assert blocks[pos // block_m :] == [-1] * (len(blocks) - pos // block_m)


@pytest.mark.parametrize("m,top_k,num_experts,block_m", [(1, 2, 8, 16), (2, 1, 4, 16), (7, 2, 4, 16), (16, 3, 5, 4), (33, 8, 64, 16), (5, 2, 3, 1)])
def test_random_routing(m, top_k, num_experts, block_m):
    experts = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(m)])
    check_alignment(experts, num_experts, block_m)


def test_all_tokens_to_one_expert_and_empty_experts():
    check_alignment(torch.full((9, 1), 2), 4, 4)  # experts 0, 1, 3 get nothing; 9 rows pad to 12
    check_alignment(torch.tensor([[3, 0]] * 16), 6, 16)  # two full blocks, four empty experts


def test_capacity_is_tight_for_decode():
    # M = 1, top-8 of 64 experts: 8 pairs in 8 blocks, not 64 experts' worth of padding
    assert padded_capacity(8, 64, 16) == 8 + 8 * 15
    check_alignment(torch.randperm(64)[:8].reshape(1, 8), 64, 16)


def test_pair_rows_gathers_each_token_in_its_experts_order():
    m, top_k, e, h = 5, 3, 4, 16
    x = torch.randn(m, h).to(torch.bfloat16)
    experts = torch.stack([torch.randperm(e)[:top_k] for _ in range(m)])
    perm = torch.stack([torch.randperm(h) for _ in range(e)])
    rows = pair_rows(x, experts, perm)
    assert rows.shape == (m * top_k, h) and rows.dtype == x.dtype
    for t in range(m):
        for j in range(top_k):
            assert torch.equal(rows[t * top_k + j], x[t, perm[experts[t, j]]])
    assert fc1_row_div(x, experts) == top_k and fc1_row_div(rows, experts) == 1
    assert fc1_row_div(x, experts[:, :1]) == 1  # top_k = 1: one row per token is one per pair
