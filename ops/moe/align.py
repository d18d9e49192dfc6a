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
block of that. Programs of blocks at or past ``total`` exit at once.

:func:`align_block_size_torch` is the plain-torch form (scatter_add, stable sort, cumsum,
searchsorted), the reference: 29 aten calls (some 25 kernels), 53-54 us of a CUDA-graph replay of
``grouped_words`` on Mixtral at M = 8 / 16 on an H100 (its whole call less its two GEMMs' 335 /
391 us). :func:`align_block_size_triton` computes the same in one launch of one program,
walking the pairs in chunks (each pair's rank among its expert's earlier pairs from a prefix sum
of the chunk's one-hot rows); :func:`align_block_size` takes it up to ``TRITON_MAX_PAIRS`` pairs,
where one program's serial walk stays short. ``qfuse bench moe`` on the H100, Mixtral W4A16 at
M = 16: 442 -> 388 us (BENCHMARKS.md, "One-launch align").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._exact_triton import interpreting
from .._launch import launch
from ..activation.quant_kernels import device_guard

# pairs up to which align_block_size runs the one-program Triton form: M = 256 at top-8,
# 1024 at top-2 (16 chunks of 128 pairs); timed at 16 and 32 pairs only (H100, Mixtral M = 8 / 16)
TRITON_MAX_PAIRS = 2048


def padded_capacity(pairs: int, num_experts: int, block_m: int) -> int:
    """The length of ``sorted_ids``: an upper bound of the padded total for any routing."""
    return pairs + min(num_experts, pairs) * (block_m - 1)


def align_block_size(experts: Tensor, num_experts: int, block_m: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(sorted_ids int32 [cap], expert_ids int32 [cap // block_m rounded up], total int32 [1])``
    for ``experts [M, top_k]`` (module docstring): one Triton launch up to ``TRITON_MAX_PAIRS``
    pairs where Triton runs (CUDA, or the interpreter), else plain torch."""
    if experts.numel() <= TRITON_MAX_PAIRS and (experts.is_cuda or interpreting()):
        return align_block_size_triton(experts, num_experts, block_m)
    return align_block_size_torch(experts, num_experts, block_m)


def align_block_size_torch(experts: Tensor, num_experts: int, block_m: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`align_block_size` in plain torch: the reference."""
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


@triton.jit
def _align_kernel(experts_ptr, sorted_ids_ptr, expert_ids_ptr, total_ptr, P, E, CAP, NB,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    offs_e = tl.arange(0, BLOCK_E)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for p0 in range(0, P, CHUNK):
        offs_p = p0 + tl.arange(0, CHUNK)
        ex = tl.load(experts_ptr + offs_p, mask=offs_p < P, other=-1)
        counts += tl.sum((ex[:, None] == offs_e[None, :]).to(tl.int32), 0)
    padded = (counts + (BLOCK_M - 1)) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    tl.store(total_ptr, tl.sum(padded, 0))
    for c0 in range(0, CAP, CHUNK):  # padding everywhere first; the pairs overwrite their slots below
        offs_c = c0 + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + offs_c, tl.full((CHUNK,), 0, tl.int32) + P, mask=offs_c < CAP)
    tl.debug_barrier()  # the block's global stores above land before the scatter below
    seen = tl.zeros((BLOCK_E,), dtype=tl.int32)  # pairs of each expert in the chunks before
    for p0 in range(0, P, CHUNK):
        offs_p = p0 + tl.arange(0, CHUNK)
        ex = tl.load(experts_ptr + offs_p, mask=offs_p < P, other=-1)
        hot = (ex[:, None] == offs_e[None, :]).to(tl.int32)  # [CHUNK, BLOCK_E]: pair p is expert e's
        before = tl.cumsum(hot, 0) - hot  # earlier pairs of the same expert within the chunk
        slot = tl.sum(hot * (before + (starts + seen)[None, :]), 1)
        tl.store(sorted_ids_ptr + slot, offs_p, mask=offs_p < P)
        seen += tl.sum(hot, 0)
    ends = tl.where(offs_e < E, ends, 2147483647)  # lanes past E are no expert
    for b0 in range(0, NB, CHUNK):
        offs_b = b0 + tl.arange(0, CHUNK)
        # searchsorted(ends, b * BLOCK_M, right=True): the experts whose run ends at or before the block
        eb = tl.sum((ends[None, :] <= (offs_b * BLOCK_M)[:, None]).to(tl.int32), 1)
        tl.store(expert_ids_ptr + offs_b, tl.where(eb < E, eb, -1), mask=offs_b < NB)


def align_block_size_triton(experts: Tensor, num_experts: int, block_m: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`align_block_size` in one launch of one program (CUDA or the interpreter); equal to
    :func:`align_block_size_torch` entry for entry."""
    flat = experts.reshape(-1).to(torch.int32).contiguous()
    pairs = flat.numel()
    cap = padded_capacity(pairs, num_experts, block_m)
    nb = -(-cap // block_m)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=flat.device)
    expert_ids = torch.empty(nb, dtype=torch.int32, device=flat.device)
    total = torch.empty(1, dtype=torch.int32, device=flat.device)
    block_e = triton.next_power_of_2(num_experts)
    chunk = max(16, min(128, 8192 // block_e))  # one-hot tiles of <= 8192 entries
    with device_guard(flat):
        launch(_align_kernel, (1,), flat, sorted_ids, expert_ids, total, pairs, num_experts, cap, nb,
               BLOCK_M=block_m, BLOCK_E=block_e, CHUNK=chunk, num_warps=4)  # fmt: skip
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
