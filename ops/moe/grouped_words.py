"""The tensor-core word kernel of ``wna16_gemm`` (ops/wna16/mma_words.py) over ``fused_moe``'s
expert-sorted blocks: W4A16 experts at M of a few rows per expert.

At decode the ``gemv_words`` family (ops/moe/gemv_words.py) runs one program per (token, expert)
pair, so an expert chosen by r tokens has its weights dequantized r times: on the H200 it
reaches 58-61 % of the HBM floor on Mixtral-8x7B at M = 1-4 but 26 % at M = 16 (32 pairs
on 8 experts; 642 us, against 387 us, 44 %, here). Here the pairs are sorted by expert in blocks of ``BLOCK_M`` rows (ops/moe/align.py),
and one program reads a ``BLOCK_N``-row tile of its block's expert once, as int32 words
straight into wgmma's A operand (the dense kernel's loop step, ``words_mma_step``), against the
block's activation rows::

    e = expert_ids[b]; ids = sorted_ids[b * BLOCK_M ...]        (pairs p; P = padding)
    g, u   = x[p // top_k] @ w_hat13[e][gate rows, up rows].T   float32, two accumulators
    h[p]   = dtype(g / (1 + exp(-g)) * u)                       fc1's epilogue, as the reference
    y[s, p] = (h[p] @ w_hat2[e].T over K slice s) * topw[p]      float32 [SPLIT_K, P, H]
    out[m] = dtype(sum_j sum_s y[s, m * top_k + j])              moe_sum: fixed order

``SPLIT_K`` splits fc2 only (H / BLOCK_N tiles per block: 32 on Mixtral, 256 programs at
M = 16 for 132 SMs); fc1 has I / BLOCK_N programs per block, each over a gate and an up tile,
and its epilogue is not linear. The scale multiplies each 128-code tile's partial dot (per
channel: after the loop), or with ``SCALE_W`` the weight, as in the dense kernel (its docstring
has the math and tolerances).
Needs 4-bit weights, H and I multiples of 128, and a group of 128's multiple or per channel
(``SCALE_W``: any multiple of 32).

The codes may be tile-major (``tile_major``, ops/moe/tile_major.py; ``QuantExperts``' W4A16 layout): a program's step over its 128
rows then reads two 4 KB runs per weight instead of 64 bytes from each of 128 rows 2 KB (fc1) or
7 KB (fc2) apart. On an H100 (Mixtral, bench moe's seed-0 routing, the shipped 128-row / 8-warp /
4-stage tile; CUDA-graph medians) the whole call went 389.9 -> 304.9 us at M = 16 (fc1 252.0 ->
198.0, fc2 135.7 -> 103.9) and 340.2 -> 280.2 us at M = 8, though a plain read of the same bytes
differs by 4 % between the two layouts (2.94 / 3.05 TB/s).

Opt-in forms for the M = 8-16 gap, none faster than the plain form on an H100 (Mixtral, CUDA-graph
medians of the whole call; ``qfuse bench moe_forms`` for the first): ``X_WORDS`` (x permuted once
into the MMA's k order by ``word_order_triton``, h stored by fc1 in that order: each tile loads its
activations as they are; bit-equal under the interpreter) within 1 % (fc2 1-2 % faster, fc1 the
same), ``FOLD_ZERO`` (the zero point folded out of the dequantization, ops/wna16/mma_words.py
``words_mma_step``) 8 % slower and ``MAXNREG`` 80 (3 blocks per SM, 3 stages) 10 % slower at
M = 16 (480 / 491 us against 444).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket
from .._exact_triton import interpreting, silu_mul_f32, to_act_dtype
from .._launch import launch
from .._views import aligned_view
from ..activation.quant_kernels import device_guard
from ..kernel_family import KernelFamily, Problem
from ..wna16.mma_words import LAUNCH_OPTIONS, mma_words_supported, words_mma_step, words_neg_zero
from ..wna16.tma import word_order_triton
from .align import align_block_size, fc1_row_div
from .grouped_gemm import moe_sum


@triton.jit
def _moe_mma_words_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, topw_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr, total_ptr, xs_ptr,
    P, N, KW, G, stride_xm, ROW_DIV, W_PER_SPLIT,
    GATED: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, SCALE_W: tl.constexpr, X_WORDS: tl.constexpr, FOLD_ZERO: tl.constexpr,
    TILED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ASM: tl.constexpr, DOT_F32: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)  # fastest: the programs in flight share their block's activation rows
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    dtype = x_ptr.dtype.element_ty
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = ids < P
    rm = tl.where(valid, ids // ROW_DIV, 0)  # padding rows read row 0; their results are not stored
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N
    w_rows = 2 * N if GATED else N  # rows of one expert's weight: gate then up for fc1
    qw_e = qw_ptr + e * w_rows * KW
    s_e = s_ptr + e * w_rows * G
    z_e = z_ptr + e * w_rows * G
    neg = words_neg_zero(z_e, rn, dtype, GROUP, HAS_ZEROS, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if GATED:
        neg_up = words_neg_zero(z_e, rn + N, dtype, GROUP, HAS_ZEROS, BLOCK_N)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    w_start = pid_k * W_PER_SPLIT
    for it in range(0, W_PER_SPLIT // 16):
        w0 = w_start + it * 16
        xs = tl.load(xs_ptr + rm * (KW // 16) + w0 // 16) if FOLD_ZERO else None
        acc = words_mma_step(acc, neg, w0, qw_e, s_e, z_e, x_ptr, rn, rm, KW, G, stride_xm,
                             dtype, GROUP, HAS_ZEROS, SCALE_W, False, X_WORDS, BLOCK_M, BLOCK_N, ASM, DOT_F32, FOLD_ZERO, xs, TILED)  # fmt: skip
        if GATED:
            acc_up = words_mma_step(acc_up, neg_up, w0, qw_e, s_e, z_e, x_ptr, rn + N, rm, KW, G, stride_xm,
                                    dtype, GROUP, HAS_ZEROS, SCALE_W, False, X_WORDS, BLOCK_M, BLOCK_N, ASM, DOT_F32, FOLD_ZERO, xs, TILED)  # fmt: skip
    if GROUP == -1:
        acc = acc * tl.load(s_e + rn).to(tl.float32)[:, None]
        if GATED:
            acc_up = acc_up * tl.load(s_e + rn + N).to(tl.float32)[:, None]
    mask = valid[:, None] & (offs_n < N)[None, :]
    cols = offs_n
    if GATED and X_WORDS:  # h in the k' order fc2 reads (word_order): natural 32c + 8q + 4e + 2sl + h'
        t = offs_n % 128
        cols = offs_n - t + ((t >> 3) & 3) * 32 + ((t >> 1) & 1) * 16 + (t & 1) * 8 + (t >> 5) * 2 + ((t >> 2) & 1)
    out = out_ptr + pid_k * P * N + ids[:, None] * N + cols[None, :]
    if GATED:
        h = silu_mul_f32(tl.trans(acc), tl.trans(acc_up), INTERPRET)
        tl.store(out, to_act_dtype(h, dtype, INTERPRET), mask=mask)
    else:
        topw = tl.load(topw_ptr + ids, mask=valid, other=0.0)
        tl.store(out, tl.trans(acc) * topw[:, None], mask=mask)


def moe_mma_words(
    x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, topw: Tensor | None, group_size: int, cfg: dict,
    route: tuple[Tensor, Tensor, Tensor], pairs: int, row_div: int, split_k: int, tiled: bool = False,
) -> Tensor:  # fmt: skip
    """One launch over ``route = align_block_size(experts, E, cfg["BLOCK_M"])`` for 4-bit
    ``qweight`` (the natural packing, or tile-major with ``tiled``), ``scales`` / ``zeros`` ``[E, rows, G]``: fc1 (``topw``
    None, ``w13 [E, 2I, H / 2]``): ``h [pairs, I]`` in x's dtype, ``h[p] = silu(g) * u`` of
    ``x[p // row_div]``'s gate and up rows; fc2: float32 ``[split_k, pairs, N]``, slice s of row p
    ``(x[p] @ w_hat[e_p].T over K slice s) * topw[p]``."""
    gated = topw is None
    n, k = qweight.shape[1] // (2 if gated else 1), x.shape[1]
    kw = k // 8
    while split_k > 1 and kw % (16 * split_k):  # whole 16-word tiles per split
        split_k -= 1
    sorted_ids, expert_ids, total = route
    fold = bool(cfg.get("FOLD_ZERO", False))
    if fold and (cfg.get("SCALE_W") or group_size <= 0 or group_size % 128):
        raise ValueError(f"moe_mma_words: FOLD_ZERO needs groups of a multiple of 128 and no SCALE_W; got group_size={group_size}, {cfg}")
    # FOLD_ZERO: float32 sums of each 128-code tile of a row (two torch kernels; the permutation of
    # X_WORDS stays within a tile, so the sums are the same)
    xs = x.float().view(x.shape[0], -1, 128).sum(-1) if fold else None
    out = torch.empty((pairs, n) if gated else (split_k, pairs, n), dtype=x.dtype if gated else torch.float32, device=x.device)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), expert_ids.numel(), split_k)
    cap = {"maxnreg": cfg["MAXNREG"]} if "MAXNREG" in cfg and x.is_cuda else {}  # a compile option; the interpreter has none
    with device_guard(x):
        launch(_moe_mma_words_kernel, grid,
            x, aligned_view(qweight, torch.int32), scales, zeros if zeros is not None else scales, topw if topw is not None else scales,
            out, sorted_ids, expert_ids, total, xs if xs is not None else scales, pairs, n, kw, scales.shape[-1], x.stride(0), row_div, kw // split_k,
            GATED=gated, GROUP=group_size, HAS_ZEROS=zeros is not None, SCALE_W=bool(cfg.get("SCALE_W", False)), X_WORDS=bool(cfg.get("X_WORDS", False)), FOLD_ZERO=fold, TILED=tiled,
            BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], ASM=x.is_cuda, DOT_F32=not x.is_cuda, INTERPRET=interpreting(),
            num_warps=cfg.get("num_warps", 8), num_stages=cfg.get("num_stages", LAUNCH_OPTIONS["num_stages"]), **cap,
        )  # fmt: skip
    return out


def run_moe_grouped_words(
    cfg: dict, x: Tensor, weights: Tensor, experts: Tensor, w13: Tensor, w13_scale, w13_zeros, w13_group_scale,
    w2: Tensor, w2_scale, w2_zeros, w2_group_scale, weight_bits: int, act_bits: int, group_size: int, tile_major: bool = False,
) -> Tensor:  # fmt: skip
    """``fused_moe`` after routing with one config (arguments already checked; 4-bit, float activations)."""
    top_k = experts.shape[1]
    pairs = experts.numel()
    route = align_block_size(experts, w13.shape[0], cfg["BLOCK_M"])
    x = word_order_triton(x, 128) if cfg.get("X_WORDS") else x.contiguous()
    h = moe_mma_words(x, w13, w13_scale, w13_zeros, None, group_size, cfg, route, pairs, fc1_row_div(x, experts), 1, tile_major)
    y = moe_mma_words(
        h, w2, w2_scale, w2_zeros, weights.reshape(-1).contiguous(), group_size, cfg, route, pairs, 1, cfg.get("SPLIT_K", 1), tile_major
    )
    return moe_sum(y, top_k, x.dtype)


def _supports(p: Problem) -> tuple[bool, str]:
    if p.act_bits != 16 or p.bits != 4:
        return False, "W4A16 experts only"
    if m_bucket(p.m) > 64:
        return False, "M bucket > 64 (experts' blocks of 16-32 rows)"
    if not any(mma_words_supported(p.k, p.group_size, sw) and mma_words_supported(p.n, p.group_size, sw) for sw in (False, True)):
        return False, "H and I multiples of 128, and a group of 128's multiple or per channel (SCALE_W: of 32)"
    return True, ""


def configs(p: Problem, exhaustive: bool) -> list[dict]:
    """The dense kernel's tiles (ops/wna16/mma_words.py: 128 weight rows on 8 warps, 4 stages, was
    the best tile on 9 of 10 H200 points at M = 1 and 16), blocks of 16 rows (32 too at M bucket
    >= 32), with and without a K split of 4 for fc2's few output tiles (H / BLOCK_N per block).
    256 rows on 8 warps: its loop takes 4.12 / 4.47 SASS instructions per weight byte in fc1 / fc2
    against 128 rows' 4.80 / 5.59 (g128, sm_90, triton 3.7.1, ``qfuse bench sass moe_grouped_words``),
    fc2's per-iteration activation staging spread over twice the weight rows; the dense op's
    256-row tile was 0-30 % slower than its 128-row one at M = 1 and 16, so it stays last."""
    bms = (16,) if m_bucket(p.m) <= 16 else (16, 32)
    forms = [sw for sw in (False, True) if mma_words_supported(p.k, p.group_size, sw) and mma_words_supported(p.n, p.group_size, sw)]
    # a fifth stage on the 128-row / 8-warp tile was slower on an H100 (Mixtral, tile-major codes):
    # 301.8-303.3 against 276.4-280.3 us at M = 8, 338.1-338.6 against 311.1-314.3 at M = 16 (split 1 and 4)
    tiles = [(128, 8, 4), (128, 4, 4), (64, 4, 4), (256, 8, 3)]
    out = [
        {"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sp, "SCALE_W": sw, "num_warps": w, "num_stages": st}
        for bm in bms
        for bn, w, st in tiles
        for sp in (1, 4)
        for sw in forms
    ]
    # opt-in: slower or no faster than the plain form on an H100 (module docstring), though their
    # sm_90 SASS per weight byte in fc1 / fc2 (g128 bf16, 128 rows / 8 warps, triton 3.7.1) is no
    # higher: X_WORDS 4.78 / 5.91, FOLD_ZERO 4.20 / 5.62 against 4.80 / 5.59. The loop stalls rather
    # than issues (ncu, H100, M = 16: 0.35 instructions issued and 0.6 warps eligible per scheduler
    # cycle; fc1 40 % of its stall on L1TEX data, fc2 33-37 % at CTA barriers); loading each tile's
    # scales an iteration ahead did not move it (fc1 213 -> 218 us).
    # X_WORDS only where each tile's scale keeps the wgmma synchronous (groups of 128's multiples,
    # no SCALE_W): per channel or with SCALE_W its wgmmas run asynchronously and ptxas writes the
    # register operands of ones in flight (5-35 such writes per loop; a CPU test checks the SASS
    # of every opt-in config)
    plain = [c for c in out if c["BLOCK_M"] == bms[0] and c["BLOCK_N"] != 256 and not c["SCALE_W"]]
    if p.group_size > 0 and p.group_size % 128 == 0:
        folds = [{**c, "FOLD_ZERO": True} for c in plain]
        out += [{**c, "X_WORDS": True} for c in plain] + folds + [{**c, "X_WORDS": True} for c in folds]
    out += [{**c, "num_stages": 3, "MAXNREG": 80} for c in plain if c["BLOCK_N"] == 128 and c["num_warps"] == 8]
    return out


def _opt_in(cfg: dict) -> str:
    forms = [k for k in ("X_WORDS", "FOLD_ZERO", "MAXNREG") if k in cfg]
    return f"{' + '.join(forms)}: no faster than the plain form on an H100 (Mixtral, M = 8 / 16)" if forms else ""


def _run(cfg, *args):
    return run_moe_grouped_words(cfg, *args)


FAMILY = KernelFamily("grouped_words", "moe/grouped_words", _supports, configs, _run, opt_in=_opt_in)
