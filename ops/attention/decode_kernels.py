"""Triton kernels of ``decode_attention`` (math: ops/decode_attention.py): split-KV attention
with the query heads of each KV head packed as the rows of one tile.

Grid ``(B * Hkv, row blocks, splits)``. A program takes ``BLOCK_M`` packed rows of one KV head
(row ``r = g * L + l``: query head ``kvh * G + g``, query token ``l``), walks its share of the
key blocks with the online softmax of flash attention, and either writes the normalized output
(one split) or its partial ``(acc, m, l)`` for ``_decode_attention_combine_kernel`` to merge. Each K / V
block is read once per program for all G heads: Hugging Face's path first copies K and V G
times (``repeat_kv``), which on the H200 took 92 of the 170 us of attention per Llama-3-8B
layer at batch 16, context 1024 (BENCHMARKS "Where the time goes").

Scores are kept in base 2 (``s * scale * log2(e)``, ``exp2``), float32; P is rounded to the
input dtype for the P @ V product, as in flash attention. A key block whose mask is False (or
-inf) for every row of the tile is skipped without reading K or V: the unfilled tail of a
static KV cache costs only its mask.

A masked score is -inf and the running max starts at ``NO_MAX`` (finite), so a block or a
split with no visible key adds nothing (p = 0, l = 0), and a row with no visible key at all
ends with l = 0 and is written as zeros.

The split count fills about two waves of the GPU (``splits_for``); BLOCK_N = 64, 4 warps (8 for
tiles past 32 x 128, ``warps_for``, where 4 spill) and 2 stages are the flash-decoding defaults,
not tuned on the H200 (as they are, the op took 0.29 ms off the 32-layer Llama-3-8B W4A16 step at
batch 1: BENCHMARKS "End to end").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._autotune import sm_count
from .._exact_triton import interpreting, next_power_of_2, to_act_dtype
from .._launch import launch
from ..activation.quant_kernels import device_guard
from ..wna16.common import mma

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # scores are kept in base 2
NO_MAX: tl.constexpr = tl.constexpr(-1.0e30)
BLOCK_N = 64
MAX_BLOCK_M = 64
INTERPRET = interpreting()
LAUNCH_OPTIONS = {"num_stages": 2}
# Programs per SM the split count aims at: two waves hide the tail of one.
WAVES = 2


@triton.jit
def _packed_rows(Hkv, G, L, BLOCK_M: tl.constexpr):
    """This program's batch, KV head and ``BLOCK_M`` packed rows (grid axes 0 and 1): each row's
    validity, query head and query token (row ``r = g * L + l``)."""
    bh = tl.program_id(0)
    b = (bh // Hkv).to(tl.int64)
    kvh = (bh % Hkv).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    return b, kvh, rows, rows < G * L, kvh * G + rows // L, rows % L


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    Hkv, G, L, S, D, n_splits, blocks_per_split, scale_log2e,
    sq_b, sq_h, sq_l, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_l, sm_s, so_b, so_h, so_l,
    MASK_KIND: tl.constexpr,  # 0: none, 1: bool (nonzero: attend), 2: additive float
    DIRECT: tl.constexpr,  # one split: write the normalized output, no partials
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    INTERPRET: tl.constexpr,  # the CPU interpreter: bf16 dot operands upcast (see ``mma``)
):  # fmt: skip
    DTYPE: tl.constexpr = q_ptr.dtype.element_ty
    bh = tl.program_id(0)
    split = tl.program_id(2)
    R = G * L
    b, kvh, rows, row_ok, head, lq = _packed_rows(Hkv, G, L, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(
        q_ptr + b * sq_b + head[:, None] * sq_h + lq[:, None] * sq_l + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], NO_MAX, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + b * sk_b + kvh * sk_h
    v_base = v_ptr + b * sv_b + kvh * sv_h
    m_base = mask_ptr + b * sm_b + lq[:, None] * sm_l

    n_blocks = tl.cdiv(S, BLOCK_N)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, n_blocks)
    for blk in range(first, last):
        n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < S
        visible = row_ok[:, None] & n_ok[None, :]
        if MASK_KIND == 1:
            mv = tl.load(m_base + n[None, :] * sm_s, mask=visible, other=0)
            visible = visible & (mv != 0)
            bias = tl.where(visible, 0.0, float("-inf"))
        elif MASK_KIND == 2:
            mv = tl.load(m_base + n[None, :] * sm_s, mask=visible, other=float("-inf")).to(tl.float32)
            visible = visible & (mv > float("-inf"))
            # finite masks as transformers builds them (finfo.min, -3.4e38 in float32) times log2(e)
            # overflow to -inf, and a row whose keys all carry it would see none (output 0, where the
            # reference averages them); clamped above NO_MAX the row's keys stay comparable
            bias = tl.where(visible, tl.maximum(mv, -1.0e29) * LOG2E, float("-inf"))
        else:
            bias = tl.where(visible, 0.0, float("-inf"))
        if tl.max(visible.to(tl.int32)) > 0:
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(k_base + n[:, None] * sk_s + d[None, :], mask=kv_mask, other=0.0)
            s = mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], tl.float32), INTERPRET) * scale_log2e + bias
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + n[:, None] * sv_s + d[None, :], mask=kv_mask, other=0.0)
            acc = mma(to_act_dtype(p, DTYPE, INTERPRET), v, acc * alpha[:, None], INTERPRET)
            m_i = m_new

    if DIRECT:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + b * so_b + head[:, None] * so_h + lq[:, None] * so_l + d[None, :],
            to_act_dtype(out, DTYPE, INTERPRET),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        part = (bh.to(tl.int64) * n_splits + split) * R + rows
        tl.store(part_acc_ptr + part[:, None] * D + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        n_parts = tl.num_programs(0).to(tl.int64) * n_splits * R
        tl.store(part_ml_ptr + part, m_i, mask=row_ok)
        tl.store(part_ml_ptr + n_parts + part, l_i, mask=row_ok)


@triton.jit
def _decode_attention_combine_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr,
    Hkv, G, L, D, n_splits, n_parts, so_b, so_h, so_l,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """out = sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M), M the running max over splits."""
    bh = tl.program_id(0)
    R = G * L
    b, kvh, rows, row_ok, head, lq = _packed_rows(Hkv, G, L, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    tile_ok = row_ok[:, None] & (d < D)[None, :]

    m_run = tl.full([BLOCK_M], NO_MAX, tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for split in range(0, n_splits):
        part = (bh.to(tl.int64) * n_splits + split) * R + rows
        m_s = tl.load(part_ml_ptr + part, mask=row_ok, other=NO_MAX)
        l_s = tl.load(part_ml_ptr + n_parts + part, mask=row_ok, other=0.0)
        acc_s = tl.load(part_acc_ptr + part[:, None] * D + d[None, :], mask=tile_ok, other=0.0)
        m_new = tl.maximum(m_run, m_s)
        old = tl.exp2(m_run - m_new)
        new = tl.exp2(m_s - m_new)
        l_run = l_run * old + l_s * new
        acc = acc * old[:, None] + acc_s * new[:, None]
        m_run = m_new

    out = acc / tl.where(l_run > 0.0, l_run, 1.0)[:, None]
    tl.store(
        out_ptr + b * so_b + head[:, None] * so_h + lq[:, None] * so_l + d[None, :],
        to_act_dtype(out, out_ptr.dtype.element_ty, INTERPRET),
        mask=tile_ok,
    )


def warps_for(block_m: int, block_d: int) -> int:
    """4 warps up to a 32 x 128 (rows x head_dim) tile, 8 above, where 4 spill (sm_90, triton 3.7.1,
    registers / stack bytes per thread: 64 x 128 with 4 warps 255 / 16, with 8 199 / 0; 32 x 128
    with 4 208 / 0; 16 x 256 with 4 222 / 0; 32 x 256 with 4 255 / 112, with 8 180 / 0)."""
    return 8 if block_m * block_d > 32 * 128 else 4


def block_rows(rows: int, head_dim: int) -> int:
    """Packed rows per tile: the rows rounded up to a power of two, 16 to 64; at most 32 past head_dim
    128 (a 64 x 256 tile spills even with 8 warps: 255 registers and a 280-byte stack)."""
    return min(MAX_BLOCK_M if head_dim <= 128 else MAX_BLOCK_M // 2, max(16, next_power_of_2(rows)))


def splits_for(programs: int, key_blocks: int, device: torch.device) -> int:
    """KV splits so that ``programs * splits`` is about ``WAVES`` programs per SM (at most one
    key block per split): Llama-3-8B at context 1024 (16 key blocks, 8 KV heads) gets 16 splits
    at batch 1 and 3 at batch 16 on an H200's 132 SMs."""
    want = triton.cdiv(WAVES * sm_count(device), programs)
    return max(1, min(key_blocks, want))


def decode_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, splits: int | None = None
) -> torch.Tensor:
    """Launch ``decode_attention`` (inputs already checked by the op). ``splits``: KV splits
    (default ``splits_for``); tests set it to reach the one-split and many-split paths."""
    # the head dimension is read as unit-stride vectors (general strides there cost 255 registers
    # and a stack; unit stride: 128-166, no spill; sm_90, triton 3.7.1)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    R = G * L
    BLOCK_D = max(16, next_power_of_2(D))
    BLOCK_M = block_rows(R, BLOCK_D)
    row_blocks = triton.cdiv(R, BLOCK_M)
    key_blocks = triton.cdiv(S, BLOCK_N)
    if splits is None:
        splits = splits_for(B * Hkv * row_blocks, key_blocks, q.device)
    blocks_per_split = triton.cdiv(key_blocks, max(1, min(splits, key_blocks)))
    splits = triton.cdiv(key_blocks, blocks_per_split)

    out = torch.empty((B, L, Hq, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    if mask is None:
        mask_kind, m, m_strides = 0, q, (0, 0, 0)
    else:
        m = mask.expand(B, 1, L, S)
        mask_kind = 1 if m.dtype == torch.bool else 2
        if mask_kind == 1:
            m = m.view(torch.uint8)
        m_strides = (m.stride(0), m.stride(2), m.stride(3))
    direct = splits == 1
    if direct:
        part_acc = part_ml = out  # not read
    else:
        part_acc = torch.empty((B * Hkv, splits, R, D), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((2, B * Hkv, splits, R), dtype=torch.float32, device=q.device)
    with device_guard(q):
        launch(
            _decode_attention_kernel,
            (B * Hkv, row_blocks, splits),
            q, k, v, m, out, part_acc, part_ml,
            Hkv, G, L, S, D, splits, blocks_per_split, scale * LOG2E.value,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *m_strides, *out.stride()[:3],
            MASK_KIND=mask_kind, DIRECT=direct, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, INTERPRET=INTERPRET,
            num_warps=warps_for(BLOCK_M, BLOCK_D), **LAUNCH_OPTIONS,
        )  # fmt: skip
        if not direct:
            launch(
                _decode_attention_combine_kernel,
                (B * Hkv, row_blocks),
                part_acc, part_ml, out,
                Hkv, G, L, D, splits, B * Hkv * splits * R,
                *out.stride()[:3],
                BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D, INTERPRET=INTERPRET, num_warps=4,
            )  # fmt: skip
    return out
