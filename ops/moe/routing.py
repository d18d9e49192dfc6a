"""Top-k routing of ``fused_moe``: softmax over the router logits in float32, then top-k.

Math (one token row ``m``)::

    p[m, :]            = softmax(float32(router_logits[m, :]))
    (w[m, :], e[m, :]) = topk(p[m, :], top_k)          torch.topk: descending, ties as torch orders them
    renormalize:         w[m, j] = w[m, j] / sum_j' w[m, j']     (float32)

the router of Hugging Face Mixtral (which always renormalizes) and of Qwen2-MoE / Qwen3-MoE
(``norm_topk_prob``) computed with the same torch calls. Plain torch with static shapes: no
host sync, so the CUDA path runs it as is (inside CUDA-graph capture too).
"""

from __future__ import annotations

import torch
from torch import Tensor


def topk_routing(router_logits: Tensor, top_k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """``(weights float32 [M, top_k], experts int64 [M, top_k])`` for logits ``[M, E]``."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts
