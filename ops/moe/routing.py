"""Top-k routing of ``fused_moe``: softmax over the router logits in float32, then top-k.

Math (one token row ``m``)::

    p[m, :]            = softmax(float32(router_logits[m, :]))
    (w[m, :], e[m, :]) = topk(p[m, :], top_k)          descending, the lowest expert index first among ties
    renormalize:         w[m, j] = w[m, j] / sum_j' w[m, j']     (float32)

the router of Hugging Face Mixtral (which always renormalizes) and of Qwen2-MoE / Qwen3-MoE
(``norm_topk_prob``) computed with the same torch calls: :func:`topk_routing`, the reference.

:func:`topk_routing_triton`, the CUDA path's: the same math in one launch, one program per token
(the four to five torch kernels cost 10-15 us of a 70-200 us Mixtral decode call on the H200:
``qfuse bench moe``'s op rows against its ``--every-config`` rows, which take the routing as
given). It sums the softmax in its own order (float32: weights within a few ulps of torch's), takes
the top k by repeated max with the lowest expert index among exact ties, and returns the experts
as int32.

Ties are common: bf16 router logits (``F.linear`` in the model's dtype) take few distinct values,
and with 64 experts and top-8, 2.6 % of random tokens have a tie at the k-th place. Both paths
therefore break ties by the lowest index (``torch.topk`` has no defined order: on the CPU it
returned the highest). A row whose softmax is NaN (a NaN or +inf logit, or all -inf) ranks its
NaNs first, as ``torch.sort`` does, and keeps them as its weights: that token's output is NaN
on both paths, and its experts are the lowest indices, never one past E.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._exact_triton import div_rn, exp_f32, interpreting
from .._launch import launch
from ..activation.quant_kernels import device_guard


def topk_routing(router_logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """``(weights float32 [M, top_k], experts int64 [M, top_k])`` for logits ``[M, E]``."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.sort(probs, dim=-1, descending=True, stable=True)  # ties: the lowest index first
    weights, experts = weights[:, :top_k], experts[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


@triton.jit
def _topk_routing_kernel(logits_ptr, w_ptr, e_ptr, E, stride_m, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr):  # fmt: skip
    m = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    x = tl.load(logits_ptr + m * stride_m + offs, mask=offs < E, other=-float("inf")).to(tl.float32)
    p = exp_f32(x - tl.max(x, 0), INTERPRET)  # expf and IEEE division, as torch's softmax
    p = div_rn(p, tl.sum(p, 0))
    # a NaN (the row's softmax is NaN) ranks above every probability (<= 1), as in torch.sort, and
    # is stored back as NaN; p == NaN never holds, so idx would be BLOCK_E; padding is out of the max
    p = tl.where(offs < E, tl.where(p != p, 2.0, p), -1.0)
    slots = tl.arange(0, BLOCK_K)
    w = tl.zeros((BLOCK_K,), dtype=tl.float32)
    e = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, 0)
        idx = tl.min(tl.where(p == best, offs, BLOCK_E), 0)  # the lowest index among exact ties
        w = tl.where(slots == j, tl.where(best > 1.0, float("nan"), best), w)
        e = tl.where(slots == j, idx, e)
        p = tl.where(offs == idx, -1.0, p)  # probabilities are >= 0: out of the next max
    if RENORMALIZE:
        w = div_rn(w, tl.sum(w, 0))  # slots past TOP_K hold 0
    tl.store(w_ptr + m * TOP_K + slots, w, mask=slots < TOP_K)
    tl.store(e_ptr + m * TOP_K + slots, e, mask=slots < TOP_K)


def topk_routing_triton(router_logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """``(weights float32 [M, top_k], experts int32 [M, top_k])`` for logits ``[M, E]`` in one launch
    (module docstring); any float dtype, rows of any stride."""
    m, e = router_logits.shape
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    weights = torch.empty((m, top_k), dtype=torch.float32, device=router_logits.device)
    experts = torch.empty((m, top_k), dtype=torch.int32, device=router_logits.device)
    if m == 0:
        return weights, experts
    with device_guard(router_logits):
        launch(_topk_routing_kernel, (m,), router_logits, weights, experts, e, router_logits.stride(0),
               TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k), INTERPRET=interpreting(),
               num_warps=1 if e <= 256 else 4)  # fmt: skip
    return weights, experts
