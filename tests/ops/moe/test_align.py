"""Block-aligned token sorting of fused_moe (ops/moe/align.py) against its definition, checked pair by
pair, in both forms: plain torch and the one-program Triton kernel (the interpreter on CPU)."""

import pytest
import torch

from qfuse.ops.moe import align
from qfuse.ops.moe.align import align_block_size_torch, align_block_size_triton, fc1_row_div, padded_capacity, pair_rows

FORMS = pytest.mark.parametrize("align_fn", [align_block_size_torch, align_block_size_triton], ids=["torch", "triton"])


def check_alignment(align_fn, experts: torch.Tensor, num_experts: int, block_m: int) -> None:
    sorted_ids, expert_ids, total = align_fn(experts, num_experts, block_m)
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


# (300, 8, 128, 16): 2400 pairs in chunks of 64 (128 experts), past TRITON_MAX_PAIRS; (70, 2, 8, 32): 140 pairs, two chunks
@FORMS
@pytest.mark.parametrize(
    "m,top_k,num_experts,block_m",
    [(1, 2, 8, 16), (2, 1, 4, 16), (7, 2, 4, 16), (16, 3, 5, 4), (33, 8, 64, 16), (5, 2, 3, 1), (70, 2, 8, 32), (300, 8, 128, 16)],
)
def test_random_routing(align_fn, m, top_k, num_experts, block_m):
    experts = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(m)])
    check_alignment(align_fn, experts, num_experts, block_m)


@FORMS
def test_all_tokens_to_one_expert_and_empty_experts(align_fn):
    check_alignment(align_fn, torch.full((9, 1), 2), 4, 4)  # experts 0, 1, 3 get nothing; 9 rows pad to 12
    check_alignment(align_fn, torch.tensor([[3, 0]] * 16), 6, 16)  # two full blocks, four empty experts
    check_alignment(align_fn, torch.full((200, 1), 0), 3, 16)  # one expert's run over two chunks


@FORMS
def test_capacity_is_tight_for_decode(align_fn):
    # M = 1, top-8 of 64 experts: 8 pairs in 8 blocks, not 64 experts' worth of padding
    assert padded_capacity(8, 64, 16) == 8 + 8 * 15
    check_alignment(align_fn, torch.randperm(64)[:8].reshape(1, 8), 64, 16)


def test_triton_form_equals_torch_form_and_dispatch_by_size(monkeypatch):
    experts = torch.randint(0, 6, (40, 2), dtype=torch.int32)
    for a, b in zip(align_block_size_triton(experts, 6, 16), align_block_size_torch(experts, 6, 16)):
        assert torch.equal(a, b)
    calls = []
    monkeypatch.setattr(align, "align_block_size_triton", lambda *a: calls.append("triton"))
    monkeypatch.setattr(align, "align_block_size_torch", lambda *a: calls.append("torch"))
    align.align_block_size(torch.zeros(align.TRITON_MAX_PAIRS // 2, 2, dtype=torch.int32), 4, 16)
    align.align_block_size(torch.zeros(align.TRITON_MAX_PAIRS // 2 + 1, 2, dtype=torch.int32), 4, 16)
    assert calls == ["triton", "torch"]


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


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "top_k", "num_experts", "block_m"), [(1, 2, 8, 16), (16, 2, 8, 16), (64, 8, 64, 16), (256, 8, 128, 32), (1024, 2, 8, 64)]
)
def test_gpu_triton_form_equals_torch_form(m, top_k, num_experts, block_m):
    # on the GPU the padding stores and the pairs' stores to the same slots come from different threads
    for trial in range(5):
        experts = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(m)]).cuda()
        if trial == 4:
            experts[:] = 0  # one expert's run over every chunk
        got = align_block_size_triton(experts, num_experts, block_m)
        for a, b in zip(got, align_block_size_torch(experts, num_experts, block_m)):
            assert torch.equal(a, b)
