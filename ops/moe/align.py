"""Token-to-expert sorting with block alignment, for the grouped GEMM of ``fused_moe``.

The P = M * top_k (token, slot) pairs are numbered ``p = m * top_k + j``. The grouped GEMM
runs one program per block of ``block_m`` rows that all belong to one expert, so the pairs are
sorted by expert (stable: pair order within an expert) and each expert's run is padded to a
whole number of blocks::

    count[e]       = #{p : expert[p] = e}
    padded[e]      = ceil(count[e] / block_m) * block_m
    start[e]       = padded[0] + ... + padded[e - 1]
    sorted_ids[start[e] + r] = the r-th pair of expert e (r < count[e]);  P (no pair) in the padding
    expert_ids[b]  = the expert of rows b * block_m ... (b + 1) * block_m - 1;  -1 past the last block
    total          = start[E - 1] + padded[E - 1]          (int32 [1], on the device)

Sizes are fixed by the shapes alone, so nothing reads the data on the host: ``sorted_ids``
holds ``P + min(E, P) * (block_m - 1)`` entries, an upper bound of ``total`` (at most
min(E, P) experts are non-empty and each pads by < block_m); ``expert_ids`` one entry per
block of that. Programs of blocks at or past ``total`` exit at once. Plain torch (scatter_add,
stable sort, cumsum, searchsorted): capturable in a CUDA graph.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padded_capacity(pairs: int, num_experts: int, block_m: int) -> int:
    """The length of ``sorted_ids``: an upper bound of the padded total for any routing."""
    return pairs + min(num_experts, pairs) * (block_m - 1)


def align_block_size(experts: Tensor, num_experts: int, block_m: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(sorted_ids int32 [cap], expert_ids int32 [cap // block_m rounded up], total int32 [1])``
    for ``experts [M, top_k]`` (module docstring)."""
    flat = experts.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + (block_m - 1)) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.sort(flat, stable=True).indices  # pair ids grouped by expert, in pair order within one
    by_expert = flat[order]
    first = torch.cumsum(counts, 0) - counts  # where each expert's pairs begin in ``order``
    rank = torch.arange(pairs, device=device) - first[by_expert]
    cap = padded_capacity(pairs, num_experts, block_m)
    sorted_ids = torch.full((cap,), pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, starts[by_expert] + rank, order.to(torch.int32))
    block_starts = torch.arange(0, cap, block_m, device=device)
    block_expert = torch.searchsorted(ends, block_starts, right=True)  # E for blocks past the last expert
    expert_ids = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    total = ends[-1:].to(torch.int32)
    return sorted_ids, expert_ids, total


def pair_rows(x: Tensor, experts: Tensor, act_perm: Tensor) -> Tensor:
    """``[P, H]``: row ``p = m * top_k + j`` is ``x[m, act_perm[experts[m, j]]]``, token m's activations
    in the input order of its j-th expert's fc1 (act-order experts, ``fused_moe``'s ``w13_act_perm``)."""
    m, top_k = experts.shape
    order = act_perm[experts.to(torch.int64)]  # [M, top_k, H]
    return x.unsqueeze(1).expand(m, top_k, x.shape[1]).gather(2, order).reshape(m * top_k, x.shape[1])  # one gather, no copy of x


def fc1_row_div(x: Tensor, experts: Tensor) -> int:
    """fc1's pair -> activation row divisor: ``top_k`` when ``x`` holds one row per token, 1 when it
    holds one row per pair (:func:`pair_rows`); the two agree at top_k = 1."""
    m, top_k = experts.shape
    return top_k if x.shape[0] == m else 1
