"""Kernel-family choice and configs for ``wna16_gemm`` on CUDA, keyed by M bucket.

A config is a dict whose ``"kernel"`` names the family:

* ``"gemv_words"`` (4- and 8-bit, M bucket <= 2): CUDA-core GEMV reading int32 words, ~3
  instructions per code (ops/wna16_gemv_words.py); the measured M = 1 choice on the H200
  (W8A16 1.47-1.74x bf16). With ``HFMA2`` (4-bit, bf16; each word pair's products summed in
  bf16 lanes first, ~2 instructions per code) the shipped W4A16 bf16 pick at M = 1 (every group
  size) on all five shapes, and at M = 2 where it measured faster than ``mma_words``: 2.45-2.91x
  bf16 at M = 1, g128 (thirteenth session; ``QFUSE_FP32_ACCUMULATE=1`` turns it off);
* ``"mma_gemv"`` (4-bit, M bucket <= 2, K % 128 == 0, group -1 or a multiple of 128): the
  weights as ``mma.sync``'s A operand by inline PTX (ops/w4a16_mma_gemv.py); opt-in
  (:func:`is_experimental`): right, but slower than the HFMA2 word GEMV on the H200;
* ``"gemv"``  (M bucket <= 4): CUDA-core GEMV with split-K (ops/wna16_gemv.py);
* ``"tiled"`` (any M): tensor-core tiles, split-K for skinny M (ops/wna16_tiled.py);
* ``"tiled_words"`` (any M, K a whole number of int32 words): the same tiles reading the
  weights as int32 words, codes dequantized in place (ops/wna16_tiled_words.py); ``SWAP_AB``
  (BLOCK_M <= 64): the weights as the MMA's A operand; measured best at M = 64 on three of
  the five shapes;
* ``"tiled_planes"`` (4-bit, any M): the weights as the MMA's A operand, dequantized by inline
  PTX on packed registers (magic-exponent LOP3 + one packed FMA per code pair;
  ops/w4a16_tiled_planes.py); measured best at M = 2-32 on every shape timed (M = 16:
  1.34-1.68x bf16, against 1.10-1.24x for the tiled kernels); ``JOIN`` opt-in;
* ``"mma_words"`` (4-bit, M bucket <= 64, K % 128 == 0): the natural packing's int32 words
  straight into wgmma's register A operand, the activations permuted in registers to the words'
  code order (ops/w4a16_mma_words.py): 4.7-5.4 SASS instructions per weight byte at g128, no
  layout shuffle on the weight side; the H200 pick at M = 2-32 on every shape and at M = 64 on
  four of five (M = 16: 1.61-2.13x bf16, against 1.54-1.76x for tiled_planes; BENCHMARKS.md,
  eighth session); ``MAXNREG`` and ``BYTE_PAIRS`` forms opt-in (:func:`is_experimental`);
* ``"tiled_tma"`` (M bucket >= 64, 16-byte weight rows): large weight-major tiles fed by TMA, the
  dequantized weights as wgmma's register A operand (ops/wna16_tma.py); measured best for 4-bit at
  M = 64-2048 on the H200; ``TAIL_SPLIT`` opt-in, ``WORDS`` offered for 64- and 256-token tiles only;
* ``"dequant_mm"`` (M bucket >= 128): dequantize to ``x.dtype`` (one Triton kernel) then
  cuBLAS ``x @ w_hat.T``; a candidate only, chosen where it measured faster.

:func:`pick_config` (ops/_autotune.py) looks up the key
``(M bucket, N, K, group_size, dtype, bits)`` in the user cache, then in the shipped
``ops/tuned/wna16_gemm.NVIDIA_H200.json``; otherwise it measures the candidates below once
(never while a CUDA graph is captured: then the first candidate, the heuristic, runs).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from ._autotune import m_bucket, offered, pick_config, sm_count, split_k_choices, tma_capable
from .w4a16_mma_gemv import mma_gemv_supported
from .w4a16_mma_words import mma_words_supported
from .wna16_gemv_words import tile_words, wna16_gemv_words, words_supported
from .wna16_tiled_words import tiled_words_supported
from .wna16_tma import tma_supported

OP = "wna16_gemm"


def _split_for(tiles: int, k: int, block_k: int, sms: int) -> int:
    """Smallest power-of-two split that puts ~2 programs on every SM, keeping >= 4 K tiles each."""
    split = 1
    while tiles * split < 2 * sms and split < 16 and k // (2 * split * block_k) >= 4:
        split *= 2
    return split


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def candidate_configs(m: int, n: int, k: int, bits: int, group_size: int, sms: int = 132, exhaustive: bool = False,
                      dtype: torch.dtype | None = None) -> list[dict]:
    """Configs to try for this problem, the heuristic choice first; ``dtype``: the activations'
    (bf16 adds the word GEMV's packed-bf16 forms; None: unknown, so not those)."""
    mb = m_bucket(m)
    gk = group_size if group_size > 0 else 256  # BLOCK_K never spans two groups
    cands: list[dict] = []
    if mb <= 4:
        bk = min(256, gk)
        for bn in (64, 32):
            split = _split_for(_cdiv(n, bn), k, bk, sms)
            for sp in sorted({1, split} | ({2 * split} if exhaustive else set()), reverse=True):
                for warps in (4, 8) if exhaustive else (4,):
                    cands.append({"kernel": "gemv", "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sp, "num_warps": warps, "num_stages": 2})
    if mb <= 2 and words_supported(k, bits, group_size):
        # (BLOCK_N, BLOCK_W, warps): 8-32 words per thread and tile. Wide tiles read longer runs of
        # each row (BLOCK_W = 64: 256 / 128 bytes for 4 / 8 bits); a tile may span several groups.
        # Per-channel, H200, M = 1 (BENCHMARKS.md, word GEMV tile width): 28672x4096 4-bit 26.4 us
        # at BLOCK_W = 64 against 29.4 at 16; 8-bit 33.2 against 35.1 at 32.
        shapes = ((128, 16, 4), (64, 16, 4), (64, 32, 4), (32, 32, 4), (32, 64, 4), (64, 64, 8), (128, 32, 8), (16, 128, 4), (32, 128, 8)) if bits == 4 else \
                 ((128, 32, 4), (64, 32, 4), (256, 32, 8), (32, 64, 4), (64, 64, 4), (128, 64, 8), (32, 128, 8))
        for bn, bw, warps in shapes:
            for sp in split_k_choices(k * bits // 32 // tile_words(k, bits, group_size, bw), _cdiv(n, bn) * m, sms):
                cands.append({"kernel": "gemv_words", "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": warps})
        # Opt-in (is_experimental): a register cap for more resident warps. ncu on the H200 put the
        # shipped 28672x4096 4-bit config at 95 registers, 5 blocks of 4 warps per SM and 0.69
        # issued warps per scheduler cycle (BENCHMARKS.md); `qfuse bench sass` with triton 3.6:
        # maxnreg 80 -> 80 registers, no spills, +2 % loop instructions (6 blocks per SM);
        # 64 -> 72 B of spills, +8 %. Timed on the H200 at M = 1 (tenth session run 9): no faster
        # than without a cap on any of 4 shapes x 2 bit widths (e.g. 4-bit 8192x8192 64 x 32
        # split 4: 20.9 us with cap 80 against 19.7), so they stay opt-in.
        if bits == 4 and dtype == torch.bfloat16:
            # HFMA2 = 2: each word pair's 16 products summed in two bf16x2 lanes before float32,
            # the tile loaded as [BLOCK_N, BLOCK_W] blocks: 4.95 SASS instructions per weight byte
            # at 32 x 128 g128 (4.73 per-channel) against 7.4-8.2 for the float32 form (HFMA2 = 1,
            # per word, is the launcher's fallback for tiles of an odd word count)
            plain = [c for c in cands if c["kernel"] == "gemv_words"]
            for bn, bw, warps in ((32, 128, 4), (16, 256, 4), (8, 128, 2), (8, 256, 4), (8, 512, 4), (16, 128, 2)):  # more rows or longer runs per thread
                for sp in split_k_choices(k * bits // 32 // tile_words(k, bits, group_size, bw), _cdiv(n, bn) * m, sms):
                    plain.append({"kernel": "gemv_words", "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": warps})
            cands += [{**c, "HFMA2": 2} for c in plain]
        for bn, bw, warps in shapes[:5]:
            for cap in (80, 64):
                for sp in (4, 1):
                    cands.append({"kernel": "gemv_words", "BLOCK_N": bn, "BLOCK_W": bw, "SPLIT_K": sp, "num_warps": warps, "MAXNREG": cap})
    if mb <= 2 and bits == 4 and mma_gemv_supported(k, group_size):
        # Opt-in (is_experimental): right on the H200 (every config, both dtypes, eleventh session) and
        # 4.2-4.8 SASS instructions per weight byte, but 30-40 % slower there than the HFMA2 word GEMV
        # at M = 1 (e.g. 28672x4096: 30.5 against 21.5 us; BENCHMARKS.md). (row tiles, warps), 2 steps
        # per iteration (1 and 4, and loading one step ahead, measured no faster).
        for rt, warps in ((2, 4), (1, 4), (1, 8)):
            programs = _cdiv(n, 16 * rt * warps) * m
            for sp in split_k_choices(k // 256, programs, sms):
                cands.append({"kernel": "mma_gemv", "ROW_TILES": rt, "STEPS": 2, "SPLIT_K": sp, "num_warps": warps})
    if mb <= 64:
        bm = max(16, min(64, mb))
        for bn in (64, 128):
            for bk in sorted({min(128, gk), min(256, gk)}):
                split = _split_for(_cdiv(m, bm) * _cdiv(n, bn), k, bk, sms)
                for sp in sorted({split, 1} | ({2 * split} if exhaustive else set()), reverse=True):
                    for stages in (3, 4) if exhaustive else (3,):
                        cands.append({"kernel": "tiled", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sp,
                                      "SCALE_AFTER_DOT": bm < bk, "GROUP_M": 8, "num_warps": 4, "num_stages": stages})
    if mb >= 64:
        big = [(64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3)]
        if exhaustive:
            big += [(64, 256, 64, 8, 4), (128, 256, 128, 8, 3), (128, 128, 64, 4, 4), (64, 128, 128, 4, 4)]
        for bm, bn, bk, warps, stages in big:
            if bm > 2 * mb:
                continue
            bk = min(bk, gk)
            cands.append({"kernel": "tiled", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1,
                          "SCALE_AFTER_DOT": False, "GROUP_M": 8, "num_warps": warps, "num_stages": stages})
    if tiled_words_supported(k, bits):
        tiled = [c for c in cands if c["kernel"] == "tiled"]
        swapped = [{**c, "kernel": "tiled_words", "SWAP_AB": True} for c in tiled if c["BLOCK_M"] <= 64]
        cands += swapped
        if bits == 4 and exhaustive:
            cands += [{**c, "HALF_PLANES": True} for c in swapped if c["BLOCK_K"] >= 64]
        cands += [{**c, "kernel": "tiled_words"} for c in tiled]
        if mb >= 64:
            cands += _swap_words_configs(mb, gk, bits, exhaustive)
    if bits == 4:
        cands += _planes_configs(cands, mb, k, gk, exhaustive)
        if mb <= 64:
            cands += _mma_words_configs(m, n, k, group_size, sms, exhaustive)
    if mb >= 16 and tma_supported(k, bits):
        # at M bucket 64 also tiles of 64 tokens with fewer weight rows (more programs); at 16-32
        # tiles of the bucket's tokens (wgmma's N = 16 / 32), asynchronous in SASS since the
        # fifteenth session, against mma_words whose wgmma waits every iteration
        small = [(64, 128, 64, 4, 4), (64, 64, 128, 4, 4), (64, 128, 128, 4, 3)] if mb == 64 else []
        # (5 / 6 stages of these: 0.88-0.98x the best shallower config at M = 64, H200, eighteenth session)
        if mb <= 32:
            small = [(mb, 128, 128, 4, 4), (mb, 64, 128, 4, 4), (mb, 128, 64, 4, 4), (mb, 256, 64, 8, 4)]
        for bm, bn, bk, warps, stages in small + _weight_major_tiles(mb, exhaustive):
            bk = min(bk, gk)
            # split-K where the grid has fewer than ~2 tiles per SM (N = 4096 or 8192 at M = 256)
            # (at most 4, 8 for the decode tiles: each split adds a float32 [M, N] partial to write and reread)
            split = _split_for(_cdiv(m, bm) * _cdiv(n, bn), k, bk, sms)
            for sp in [s for s in (1, 2, 4, 8) if s <= split and (s < 8 or bm <= 32)]:
                cands.append({"kernel": "tiled_tma", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sp, "GROUP_M": 8,
                              "num_warps": warps, "num_stages": stages})
                # the int32 words in wgmma's lane order, the activations permuted to match once per call
                # (ops/wna16_tma.py, WORDS; sm_90 SASS: loop 19-39 % shorter, but a wgmma drain per K tile);
                # offered for the 64-token 128-deep and 256-token 64-deep tiles only (is_experimental)
                if bits == 4 and k % bk == 0:
                    cands.append({**cands[-1], "WORDS": True})
            # opt-in: the tiles past the last whole wave split 2 ways along K, in a second launch (M = 512
            # on 28672x4096: 448 tiles of 256x128 at one program per SM are 3.39 waves); TAIL_WAVE:
            # programs per SM of the tile (sm_90 registers: 256x128 / 8 warps 172 -> 1; 256x64 / 4
            # warps 170 -> 2). H200, eighteenth session, M = 256 / 1024 on the three large shapes:
            # 1.09-1.22x the best config's time where a tail exists (the float32 partials cost more
            # than the idle part of the last wave; split 4 1.17-1.33x), so never picked
            if mb >= 256 and bm == 256:
                cands.append({"kernel": "tiled_tma", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "GROUP_M": 8,
                              "num_warps": warps, "num_stages": stages, "TAIL_SPLIT": 2, "TAIL_WAVE": 1 if warps == 8 else 2})
    if mb >= 128:
        cands.append({"kernel": "dequant_mm"})
    # heuristic first (what runs untuned, e.g. under CUDA-graph capture with no cached config):
    # the family measured fastest on the H200 for this M: at M = 1 a GEMV (the word GEMV where
    # offered); 4-bit at M = 2..32 tiled_planes (fastest at every such point timed, runs E / F);
    # at M >= 64 the TMA tiles; otherwise the tiled kernel, which the list starts with
    if mb == 1:
        first = "gemv_words" if any(c["kernel"] == "gemv_words" for c in cands) else "gemv"
    elif mb <= 32 and any(c["kernel"] == "mma_words" for c in cands):  # best at M = 16 on every shape (eighth session)
        first = "mma_words"
    elif mb <= 32 and any(c["kernel"] == "tiled_planes" for c in cands):
        first = "tiled_planes"
    elif mb >= 64 and any(c["kernel"] == "tiled_tma" for c in cands):
        # best at M = 64-1024: 4-bit since the sixth / seventh sessions, 8-bit since the fifteenth
        # (48 of the shipped 70 8-bit keys from M bucket 64, all of them at M = 64-1024; BENCHMARKS.md)
        first = "tiled_tma"
    else:
        first = "tiled"
    cands.sort(key=lambda c: c["kernel"] != first)  # stable: the family's own order is kept
    if first == "gemv_words" and dtype == torch.bfloat16 and bits == 4:
        # bf16 4-bit: the HFMA2 form leads (faster than the float32 form on every H200 shape, eleventh
        # session); 16 x 256 / 4 warps, split 1: within 16 % of each of the five shapes' pick (run 5)
        lead = next((c for c in cands if c.get("HFMA2") and (c["BLOCK_N"], c["BLOCK_W"], c["SPLIT_K"], c["num_warps"]) == (16, 256, 1, 4)), None)
        if lead is not None:
            cands.remove(lead)
            cands.insert(0, lead)
    return cands


def _weight_major_tiles(mb: int, exhaustive: bool) -> list[tuple[int, int, int, int, int]]:
    """(tokens BLOCK_M, weight rows BLOCK_N, BLOCK_K, warps, stages) of the large weight-major
    tiles for M bucket ``mb`` (tokens up to twice the bucket)."""
    tiles = [(128, 64, 64, 4, 4), (128, 128, 64, 4, 3), (128, 128, 64, 8, 4), (256, 64, 64, 4, 3),
             (256, 128, 64, 8, 3), (128, 128, 128, 8, 3), (64, 256, 64, 8, 4)]
    if exhaustive:
        tiles += [(128, 256, 64, 8, 3), (256, 128, 128, 8, 2), (256, 128, 64, 8, 4), (256, 64, 64, 4, 4)]
    return [t for t in tiles if t[0] <= 2 * mb]


def _swap_words_configs(mb: int, gk: int, bits: int, exhaustive: bool) -> list[dict]:
    """Large ops/wna16_tiled_words.py tiles with the weights as wgmma's register A operand and
    the activations (up to 256 tokens: wgmma's N side) as its shared-memory B operand, group
    scale folded into the weights. Triton keeps that wgmma asynchronous (PTX: ``wait_group 3`` /
    ``7``, the dot split into K = 16 pieces): the next tile's dequantization overlaps the MMAs.
    The non-swapped tiles store the dequantized weights as the B operand to shared memory inside
    the loop, which makes each slice's wgmma synchronous (``wait_group 0``; triton 3.6 / 3.7.1).
    sm_90 registers (triton 3.6, 4-bit, g128): 128-238, no spills, so 4-warp tiles up to
    128 x 128 fit two programs per SM. 4-bit: with and without the PTX half planes."""
    out = []
    for bm, bn, bk, warps, stages in _weight_major_tiles(mb, exhaustive):
        c = {"kernel": "tiled_words", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": min(bk, gk), "SPLIT_K": 1, "SCALE_AFTER_DOT": False,
             "GROUP_M": 8, "SWAP_AB": True, "num_warps": warps, "num_stages": stages}
        if bits == 4:
            out.append({**c, "HALF_PLANES": True})
        if bits == 8 or exhaustive:
            out.append(c)
    return out


def _planes_configs(cands: list[dict], mb: int, k: int, gk: int, exhaustive: bool) -> list[dict]:
    """ops/w4a16_tiled_planes.py configs: each decode / mid-M tiled config with the weights as
    the MMA's A operand, with 4 planes (int16 halves, BLOCK_K >= 64) and 2 planes (bytes);
    for M bucket >= 64 a few large weight-major tiles (wgmma's N side takes up to 256 tokens)."""
    four_ok = k % 4 == 0
    out = []
    for c in cands:
        if c["kernel"] != "tiled" or c["BLOCK_M"] > 64:
            continue
        if four_ok and c["BLOCK_K"] >= 64:
            out.append({**c, "kernel": "tiled_planes", "SWAP_AB": True, "PLANES": 4})
        out.append({**c, "kernel": "tiled_planes", "SWAP_AB": True, "PLANES": 2})
        if exhaustive:
            out.append({**c, "kernel": "tiled_planes", "SWAP_AB": False, "PLANES": 2})
        # JOIN: planes joined back to natural K order, the scale on the weights: one asynchronous
        # wgmma per slice (register A = weights, pipelined shared B = activations); opt-in
        # (is_experimental: ptxas writes registers of wgmmas in flight in some of its tiles)
        join = {**c, "kernel": "tiled_planes", "SWAP_AB": True, "JOIN": True, "SCALE_AFTER_DOT": False}
        out.append({**join, "PLANES": 4 if four_ok and c["BLOCK_K"] >= 64 else 2})
        if exhaustive and four_ok and c["BLOCK_K"] >= 64:
            out.append({**join, "PLANES": 2})
    if mb >= 64:
        for bm, bn, bk, warps, stages in _weight_major_tiles(mb, exhaustive):
            bk = min(bk, gk)
            for planes in (4, 2) if exhaustive else (4,):
                if planes == 2 or (four_ok and bk >= 64):
                    out.append({"kernel": "tiled_planes", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "GROUP_M": 8, "SWAP_AB": True,
                                "JOIN": True, "SCALE_AFTER_DOT": False, "PLANES": planes, "num_warps": warps, "num_stages": stages})
        for bm, bn, bk, warps, stages in ((64, 128, 128, 4, 4), (128, 128, 128, 8, 3), (128, 256, 128, 8, 3)):
            bk = min(bk, gk)
            if bm <= 2 * mb:
                out.append({"kernel": "tiled_planes", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "GROUP_M": 8,
                            "SWAP_AB": True, "PLANES": 4 if four_ok and bk >= 64 else 2, "num_warps": warps, "num_stages": stages})
    return out


def _mma_words_configs(m: int, n: int, k: int, group_size: int, sms: int, exhaustive: bool) -> list[dict]:
    """ops/w4a16_mma_words.py configs for M bucket <= 64 (BLOCK_M tokens: 16, 32 or 64), the
    heuristic pick first: 128 weight rows on 8 warps, 4 stages, ~2 programs per SM. H200, M = 1
    and 16, five shapes (eighth session): 128 rows / 8 warps was the best tile on 9 of 10 points;
    64 rows / 4 warps and 256 / 8 were 0-30 % slower; two or four 128-code tiles per iteration
    (longer runs of each row) were slower everywhere. ``SCALE_W`` (the scale on the weights,
    the reference's rounding) where the group allows it; needed for groups 32 and 64."""
    bm = max(16, min(64, m_bucket(m)))
    forms = [sw for sw in (False, True) if mma_words_supported(k, group_size, sw)]
    # (rows, warps, stages, ptxas register cap): ncu on the shipped M = 16 picks (128 rows, 4 warps,
    # 167 registers) found 3 blocks per SM, 0.57-0.65 waves and under 2 warps per scheduler; a cap
    # of 128 (4 warps) / 80 (8 warps) spills nothing (sm_90 SASS, triton 3.6: loop +1-3 %) and
    # lets 4 / 3 blocks share an SM. Opt-in (is_experimental): right on the GPU, but in the H200
    # tune (eighth session, run 9) they won 2 of 15 keys by <= 2.4 %, and one of those wins
    # (8192x8192 M = 1: 18.6 us) did not hold in the same run's timing pass (20.6 us)
    tiles = ((128, 8, 4, 0), (128, 4, 4, 0), (64, 4, 4, 0), (256, 8, 3, 0), (128, 4, 4, 128), (128, 8, 4, 80))
    if exhaustive:
        tiles += ((128, 8, 3, 0), (128, 4, 3, 0), (64, 4, 3, 0), (128, 4, 3, 128))
    # 6 and 8 stages (more bytes in flight: DRAM 38-43 % busy at M = 16) were never faster on the H200:
    # the best of them 0.91-0.99x the best shallower config at M = 16, five shapes (eighteenth session)
    out = []
    for bn, warps, stages, cap in tiles:
        programs = _cdiv(n, bn) * _cdiv(m, bm)
        first = _split_for(programs, k, 128, sms)
        splits = [first] + [s for s in split_k_choices(k // 128, programs, sms) if s != first]
        for sp in splits if exhaustive or bn == 128 else splits[:1]:
            for sw in forms:
                c = {"kernel": "mma_words", "BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sp, "SCALE_W": sw, "GROUP_M": 8,
                     "num_warps": warps, "num_stages": stages, **({"MAXNREG": cap} if cap else {})}
                out.append(c)
                # opt-in (H200, ninth session: 12-19 % slower than the plain form on 10 fp16 keys): codes
                # paired within a byte, so the activations arrive by 4-byte async copies and the wgmma
                # stays asynchronous where nothing rescales the accumulator in the loop (per-channel,
                # SCALE_W; PTX wait_group 7 instead of 0);
                # +15 % loop instructions (sm_90 SASS, 128 rows / 4 warps, per-channel: 344 against 298);
                # and in 9 of its 12 g128 tiles ptxas writes registers of wgmmas in flight (sixteenth session)
                if bn == 128 and not cap and (sw or group_size == -1):
                    out.append({**c, "BYTE_PAIRS": True})
    return out


def run_config(cfg: dict, x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int) -> Tensor:
    """Run ``wna16_gemm`` with one config (arguments already checked)."""
    kind = cfg["kernel"]
    if kind == "gemv":
        from .wna16_gemv import wna16_gemv

        return wna16_gemv(x, qweight, scales, zeros, bias, bits, group_size, cfg)
    if kind == "gemv_words":
        return wna16_gemv_words(x, qweight, scales, zeros, bias, bits, group_size, cfg)
    if kind == "mma_gemv":
        from .w4a16_mma_gemv import w4a16_mma_gemv

        return w4a16_mma_gemv(x, qweight, scales, zeros, bias, group_size, cfg)
    if kind == "tiled":
        from .wna16_tiled import wna16_tiled

        return wna16_tiled(x, qweight, scales, zeros, bias, bits, group_size, cfg)
    if kind == "tiled_words":
        from .wna16_tiled_words import wna16_tiled_words

        return wna16_tiled_words(x, qweight, scales, zeros, bias, bits, group_size, cfg)
    if kind == "tiled_planes":
        from .w4a16_tiled_planes import w4a16_tiled_planes

        return w4a16_tiled_planes(x, qweight, scales, zeros, bias, group_size, cfg)
    if kind == "mma_words":
        from .w4a16_mma_words import w4a16_mma_words

        return w4a16_mma_words(x, qweight, scales, zeros, bias, group_size, cfg)
    if kind == "tiled_tma":
        from .wna16_tma import wna16_tma

        return wna16_tma(x, qweight, scales, zeros, bias, bits, group_size, cfg)
    if kind == "dequant_mm":
        from ._wna16_common import dequantize_triton

        w_hat = dequantize_triton(qweight, scales, zeros, bits, group_size, x.dtype)
        if bias is not None:
            return torch.addmm(bias, x, w_hat.t())
        return torch.mm(x, w_hat.t())
    raise ValueError(f"qfuse.{OP}: unknown kernel family {kind!r} in config {cfg}")


def usable_configs(m: int, n: int, k: int, bits: int, group_size: int, sms: int = 132, tma: bool = True,
                   dtype: torch.dtype | None = None) -> list[dict]:
    """The candidates the op may pick from: opt-in configs (:func:`is_experimental`) only with
    ``QFUSE_EXPERIMENTAL_KERNELS=1``; the TMA family only with ``tma`` (a Hopper or newer GPU)."""
    every = [c for c in candidate_configs(m, n, k, bits, group_size, sms, dtype=dtype) if tma or c["kernel"] != "tiled_tma"]
    if fp32_accumulate():
        every = [c for c in every if "HFMA2" not in c]
    return offered(every, lambda c: is_experimental(c, bits))


def fp32_accumulate() -> bool:
    """``QFUSE_FP32_ACCUMULATE=1``: never sum products in bf16 (the word GEMV's ``HFMA2`` forms, the
    shipped W4A16 M = 1 picks on the H200). A tuned or shipped ``HFMA2`` pick then runs the same
    tile in float32: the rms error against the exact product goes from 1.4-2.0x the reference
    kernel's own to 0.6-0.85x, and the time up 24-39 % (H200, M = 1; BENCHMARKS.md, eleventh session)."""
    return os.environ.get("QFUSE_FP32_ACCUMULATE", "0") == "1"


def is_experimental(cfg: dict, bits: int) -> bool:
    """Configs kept opt-in (``QFUSE_EXPERIMENTAL_KERNELS=1``): the word GEMV and ``mma_words``
    with a register cap (``MAXNREG``; timed in the sixth and eighth sessions, never clearly the
    fastest), ``mma_words`` with ``BYTE_PAIRS`` (12-19 % slower on the H200), the tensor-core GEMV
    ``mma_gemv`` (30-40 % slower than the word GEMV at M = 1), ``TAIL_SPLIT`` (right on the
    H200, never the fastest) and the TMA tiles' ``WORDS`` form except its 64-token 128-deep and
    256-token 64-deep tiles (:func:`_words_offered`).

    From the seventh to the fourteenth session the 8-bit TMA tiles at 8 warps and with
    ``TAIL_SPLIT`` were not offered: they computed wrong results on the H200. The cause (fifteenth
    session): ptxas wrote registers of wgmmas still in flight; the kernel's 8-bit path changed so
    that it does not (ops/wna16_tma.py), and they are offered like the 4-bit ones.

    ``tiled_planes`` with ``JOIN`` is opt-in since the sixteenth session for the same hazard:
    `qfuse bench sass` over every JOIN config the dispatcher offered (three shapes, M = 2-1024;
    triton 3.6.0, the H200's) found asynchronous wgmmas whose registers ptxas overwrites in flight
    in 5 of 20 at g128 (triton 3.7.1: 9 of 20), 10 of 32 per-channel, 1 of 20 at g64 and none of
    13 at g32 (3-58 such writes per loop, e.g. 16 x 64 x 128 split 2), the rest serialized. It was
    never a shipped pick (0 of the 290 keys; BENCHMARKS.md, sixteenth session). The same sweep
    found such writes in 9 of the 12 opt-in ``mma_words`` ``BYTE_PAIRS`` tiles at g128: they must
    not be offered by default on speed alone."""
    return ("MAXNREG" in cfg or "BYTE_PAIRS" in cfg or cfg["kernel"] == "mma_gemv"
            or (cfg["kernel"] == "tiled_tma" and ("TAIL_SPLIT" in cfg or (bool(cfg.get("WORDS")) and not _words_offered(cfg))))
            or (cfg["kernel"] == "tiled_planes" and bool(cfg.get("JOIN"))))


def _words_offered(cfg: dict) -> bool:
    """The ``WORDS`` TMA tiles offered by default: 64 tokens 128 codes deep (M bucket 64), and 256
    tokens 64 deep (M bucket >= 128). H200 (right in every GPU test since the seventeenth session;
    tunes of g128 bf16 on the three large shapes): at M = 64 the fastest config on all three, 1.19x /
    1.01x / 1.07x the best other (28672x4096: 42.2 against 50.1 us); at M = 16 14-24 % slower than
    ``mma_words``; at M = 256 / 1024 on 28672x4096 the fastest, 1.04x / 1.03x the best other (100.9
    against 105.1 us, 348.0 against 359.6; eighteenth session), on 4096x14336 and 8192x8192 0.83-0.97x
    (the tuner keeps the bytes path there); elsewhere opt-in (BENCHMARKS.md)."""
    return (cfg.get("BLOCK_M") == 64 and cfg.get("BLOCK_K") == 128) or (cfg.get("BLOCK_M") == 256 and cfg.get("BLOCK_K") == 64)


def config_key(m: int, n: int, k: int, bits: int, group_size: int, dtype: torch.dtype) -> tuple:
    return (m_bucket(m), n, k, group_size, str(dtype).removeprefix("torch."), bits)


def wna16_gemm_triton(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, bits: int, group_size: int) -> Tensor:
    """Pick the config for this shape (cache / shipped defaults / one measurement) and run it."""
    m, k = x.shape
    n = qweight.shape[0]
    cands = lambda: usable_configs(m, n, k, bits, group_size, sm_count(x.device), tma_capable(x.device), x.dtype)  # noqa: E731 - built only on a cache miss
    cfg = pick_config(OP, config_key(m, n, k, bits, group_size, x.dtype), cands,
                      lambda c: run_config(c, x, qweight, scales, zeros, bias, bits, group_size), x.device)  # fmt: skip
    if "HFMA2" in cfg and fp32_accumulate():
        cfg = {key: v for key, v in cfg.items() if key != "HFMA2"}
    return run_config(cfg, x, qweight, scales, zeros, bias, bits, group_size)
