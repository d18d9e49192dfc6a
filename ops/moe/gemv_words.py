"""The word GEMV of ``wna16_gemm`` (ops/wna16/gemv_words.py) over ``fused_moe``'s (token, expert)
pairs: weight-only experts (W4A16, W8A16) at decode M.

The ``gemv`` family (ops/moe/gemv.py) unpacks 4-bit codes byte by byte and reads Mixtral's
W4A16 experts at 22-27 % of the HBM floor on the H200, while its W8A16 experts reach 54-65 %;
the dense op's word GEMV reads the same byte layout as int32 words (~3 instructions per code,
~2 in its ``HFMA2`` form) and reaches 2.45-2.91x bf16 at M = 1. Here that kernel runs with
``EXPERTS``: program row p takes expert ``experts[p]``'s weight rows and activation row
``p // ROW_DIV``::

    gu[p]  = x[p // top_k] @ w_hat13[e_p].T              float32 [P, 2I]   (one launch)
    h[p]   = dtype(silu(gu[p, :I]) * gu[p, I:])          as the reference (a few elementwise kernels)
    y[p]   = h[p] @ w_hat2[e_p].T * topw[p]              float32 [P, H]    (one launch)
    out[m] = dtype(sum_j y[m * top_k + j])               moe_sum, j order

no sorting (no ops/moe/align.py launches); split-K through the word GEMV's own deterministic
single-launch reduction. The pairs are the kernel's fastest grid axis, so pairs that share an
expert read its tiles from L2. On the H200, Mixtral-8x7B W4A16 (``qfuse bench moe
--every-config``): 72 / 108 / 187 us at M = 1 / 2 / 4, 58-61 % of the HBM floor, against
``gemv``'s 146 / 269 / 485, and 62 / 177 us at M = 1 / 4 with ``FUSED_ACT`` (the activation and
the weighted top-k sum one launch each); at M = 16 each of the 32 pairs dequantizes its expert
again (642 us) and ``grouped_words`` wins.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._autotune import m_bucket
from ..kernel_family import KernelFamily, Problem
from ..wna16.dispatch import accumulate_form, fp32_accumulate
from ..wna16.gemv_words import wna16_gemv_words, words_supported
from .align import fc1_row_div
from .fused_moe import silu_and_mul
from .grouped_gemm import moe_sum, silu_and_mul_rows


def run_moe_gemv_words(
    cfg: dict, x: Tensor, weights: Tensor, experts: Tensor, w13: Tensor, w13_scale, w13_zeros, w13_group_scale,
    w2: Tensor, w2_scale, w2_zeros, w2_group_scale, weight_bits: int, act_bits: int, group_size: int, tile_major: bool = False,
) -> Tensor:  # fmt: skip
    """``fused_moe`` after routing with one word-GEMV config (arguments already checked)."""
    cfg = accumulate_form(cfg)
    top_k = experts.shape[1]
    i = w13.shape[1] // 2
    pairs = experts.reshape(-1).to(torch.int32).contiguous()
    x = x.contiguous()
    gu = wna16_gemv_words(x, w13, w13_scale, w13_zeros, None, weight_bits, group_size, cfg, pairs, fc1_row_div(x, experts), torch.float32, tile_major)
    if cfg.get("FUSED_ACT"):  # one launch each for SiLU-and-mul and the weighted top-k sum (same float ops)
        h = silu_and_mul_rows(gu, x.dtype)
    else:
        h = silu_and_mul(gu[:, :i], gu[:, i:]).to(x.dtype)
    y = wna16_gemv_words(h, w2, w2_scale, w2_zeros, None, weight_bits, group_size, cfg, pairs, 1, torch.float32, tile_major)
    if cfg.get("FUSED_ACT"):
        return moe_sum(y, top_k, x.dtype, weights.reshape(-1).contiguous())
    return moe_sum(y.mul_(weights.reshape(-1, 1)), top_k, x.dtype)


def _supports(p: Problem) -> tuple[bool, str]:
    if p.act_bits != 16 or p.bits not in (4, 8):
        return False, "weight-only quantized experts only (W8A16, W4A16)"
    if m_bucket(p.m) > 16:
        return False, "M bucket > 16 (each expert's rows fill a tensor-core tile)"
    if not (words_supported(p.k, p.bits, p.group_size) and words_supported(p.n, p.bits, p.group_size)):
        return False, "H or I not whole int32 words per group"
    return True, ""


def configs(p: Problem, exhaustive: bool) -> list[dict]:
    """The dense word GEMV's tiles that won at M = 1 on the H200 (BENCHMARKS.md), with and without
    a K split; the packed-bf16 ``HFMA2`` forms for 4-bit experts with bf16 activations (not with
    ``QFUSE_FP32_ACCUMULATE=1``)."""
    tiles = [(64, 32, 4), (32, 64, 4), (128, 16, 4)] if p.bits == 4 else [(128, 32, 4), (64, 64, 4)]
    out = [{"BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": w} for bn, bw, w in tiles for sp in (1, 4)]
    if p.bits == 4 and p.dtype == torch.bfloat16 and not fp32_accumulate():
        out = [{"BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": 4, "HFMA2": 2} for bn, bw in ((16, 256), (32, 128)) for sp in (1, 4)] + out
    # FUSED_ACT: the activation and the routing weights in one launch each instead of ~7 torch
    # kernels between and after the two GEMVs; Mixtral W4A16 on the H200, best config of each form:
    # 61.8 / 176.6 / 329.8 us at M = 1 / 4 / 8 against 71.9 / 187.6 / 345.1 (`bench moe --every-config`)
    return out + [{**c, "FUSED_ACT": True} for c in out]


def _run(cfg, *args):
    return run_moe_gemv_words(cfg, *args)


FAMILY = KernelFamily("gemv_words", "moe/gemv_words", _supports, configs, _run)
