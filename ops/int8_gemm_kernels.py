"""Triton kernel for the int8-activation GEMMs ``w8a8_gemm`` and ``w4a8_gemm``.

One kernel, specialised by constexprs, computes (the math of ops/w8a8_gemm.py and
ops/w4a8_gemm.py)::

    acc[m, n] = sum_k int32(xq[m, k]) * w_int[n, k]                       exact int32
    out[m, n] = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

with ``w_int = wq`` (W8A8) or ``w_int = (u - 8) * group_scale[n, k // 128]`` (W4A8,
group_scale = 1 per-channel), a value in [-128, 112] that fits int8 exactly, so the
main loop is one int8 x int8 -> int32 ``tl.dot`` per tile in both cases.

Design (why, with the numbers behind it in BENCHMARKS.md):

* **Weight-major tiles** (Machete's "swap A and B"): a program computes
  ``acc^T[BLOCK_N, BLOCK_M] = w_int[BLOCK_N, BLOCK_K] @ xq^T[BLOCK_K, BLOCK_M]``.
  The weight, the big operand, is the MMA's M side (64/128 rows, what Hopper's
  wgmma wants) and the few decode tokens are its N side (16 is legal), so decode does
  not pad M to 64; for W4A8 the dequantized weight tile comes from registers.
* **int4 unpack in registers**: a tile of packed bytes ``[BLOCK_N, BLOCK_K // 2]`` is
  loaded contiguously (16-byte vectors), ``s = int8(p ^ 0x88)`` turns both nibbles into
  two's-complement ``u - 8``, ``lo = (s << 4) >> 4`` and ``hi = s >> 4`` sign-extend them,
  and ``join + reshape`` interleaves them back to ``k = 2j, 2j + 1``. With group 128 the
  tile's K range lies in one group (BLOCK_K divides 128), so the second-level scale is a
  ``[BLOCK_N]`` int8 vector: ``w_int = q * gs`` is exact in int8 (|q * gs| <= 128).
  On the GPU (``UNPACK_ASM``, a tuned candidate) the unpack is inline PTX on four codes
  per 32-bit register, about half the instructions of the int8 ops (which stay as the
  interpreter's path). Measured alternative, not kept: two dots over the nibble planes
  (``lo @ xq[even k]^T + hi @ xq[odd k]^T``) was 2-9% slower at M = 1 and 18-52% slower
  at M = 4096 on the H200 (BENCHMARKS.md, int8_gemm).
* **Split-K** (SPLIT_K > 1 in the config, for decode shapes with too few output tiles for 132 SMs):
  each split adds its exact int32 partial into a zeroed int32 workspace with
  ``atomic_add``; the program that bumps the tile's counter last reads the complete
  int32 sum, zeroes the sums and the counter again (the workspace is persistent,
  ``zeroed_int32``: no memset per call) and runs the float epilogue. Integer addition is associative, so the
  result is bit-identical to SPLIT_K = 1 whatever order the splits land in.
  |acc| <= K * 2**14 holds for every partial and for the sum, so int32 is exact for
  K <= 131071 (the ops' MAX_K); at K = 131072, all-(-128) x all-(-128) gives 2**31, one past int32.
* **Group scale as an int32 partial** (``GS_PARTIAL``, a W4A8 group-128 candidate): the
  tile's dot of the unscaled codes ``(u - 8) @ xq^T`` times its ``[BLOCK_N]`` group scale,
  added to the accumulator (exact: integer, |partial * gs| <= 2**14 * 128 * 16), instead of
  the int8 multiply ``q * gs`` per weight element. sm_90 SASS of the decode loop, instructions
  per weight byte (triton 3.7.1, PTX unpack): 16x128x128 15.4 -> 6.5, 16x64x128 17.0 -> 7.5,
  16x32x128 27.1 -> 8.4 (per-channel 5.7-6.7); at 256x128x128 the [BLOCK_N, BLOCK_M] partial
  spills (352 B of stack), so large M keeps the per-element product.
* **Other kernels** a config can name (``KERNEL``): ``"gemv"``, the dp4a GEMV of
  ops/w4a8_gemv.py (W4A8, M <= 8); ``"mma_words"``, ops/w4a8_mma_words.py (W4A8, M <= 64: the
  packed bytes straight into the int8 wgmma's register A operand, K permuted to their order;
  on the H200 the pick at almost every W4A8 key at M = 4-64, ninth session; at M = 1-2 the
  GEMV's lane tiles took over, tenth session); ``"w8"``, an int4 -> int8 weight pass
  (ops/w4a8_int8_weight.py) followed by this kernel in its W8A8 form (W4A8, M > 64);
  ``"gemv8"``, the dp4a GEMV of ops/w8a8_gemv.py (W8A8, M <= 8). Measured on the H200
  (BENCHMARKS.md, int8_gemm): the W4A8 GEMV wins M = 1 on all five shapes (8.1-31.0 us
  against 9.5-35.8 for the best tile config), GS_PARTIAL wins group 128 at M = 4-16
  (g128 / per-channel 0.79-0.93, against 0.48-0.53 before), the int8 weight pass wins
  M >= 1024 (1.10-1.43x bf16, against 0.97-1.12x); the W8A8 GEMV lost to the tile kernel
  at every point (10.8-50.6 us against 9.0-36.3 at M = 1), so it stays opt-in. A config
  with ``TMA`` runs ops/int8_gemm_tma.py (W8A8, or W4A8 with the unpack fused; also behind
  ``"w8"``): on the H200 it won W8A8 at 15 of 25 decode and 14 of 15 M >= 1024 points, and
  W4A8 at M = 256 on every shape and per-channel M = 1024 on three of five (BENCHMARKS.md,
  fifth session).
* **Epilogue order**: ``(acc * x_scale) * w_scale + bias`` in float32, as the
  reference; the launcher passes ``enable_fp_fusion=False`` so no FMA contracts the
  last two steps, which makes the output bit-identical to the reference (the GPU
  tests assert equality).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from ._zeroed_workspace import zeroed_int32


@triton.jit(do_not_specialize=["M"])  # M = 1 would otherwise compile its own copy of every config
def _int8_gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, gs_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr,
    M, N, K, K_HALF,
    W4: tl.constexpr, GROUPED: tl.constexpr, GROUP_SIZE: tl.constexpr, UNPACK_ASM: tl.constexpr, GS_PARTIAL: tl.constexpr,
    X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, GROUP_N: tl.constexpr, EVEN_K: tl.constexpr,
):
    # SPLIT (constexpr) says whether K is split; how many ways is the grid's second axis,
    # so split counts share one compiled kernel.
    # ---- tile order: GROUP_N weight-row tiles x all token tiles run together (L2 reuse)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_n, pid_m = tile_of(tl.program_id(0), num_pid_n, tl.cdiv(M, BLOCK_M), GROUP_N)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    rows_n = tl.where(mask_n, offs_n, 0)  # clamped row indices keep unmasked loads in bounds
    rows_m = tl.where(mask_m, offs_m, 0)

    # ---- this split's range of K tiles
    k_tiles = tl.cdiv(K, BLOCK_K)
    split_k = tl.num_programs(1)
    tiles_per_split = tl.cdiv(k_tiles, split_k)
    k_begin = pid_k * tiles_per_split * BLOCK_K
    k_end = tl.minimum(k_begin + tiles_per_split * BLOCK_K, K)

    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows_m[None, :].to(tl.int64) * K + (k_begin + offs_k)[:, None]  # xq^T tile [BK, BM]
    if W4:
        offs_kp = tl.arange(0, BLOCK_K // 2)
        # ``K_HALF`` is its own argument (not ``K // 2``) and the K offset is a product of
        # BLOCK_K // 2, so Triton sees 16-byte aligned rows and contiguous bytes and issues
        # vector loads (``k_begin // 2`` here compiled to one ld.global.b8 per byte)
        k_off = pid_k * tiles_per_split * (BLOCK_K // 2) + offs_kp
        w_ptrs = w_ptr + rows_n[:, None].to(tl.int64) * K_HALF + k_off[None, :]
    else:
        w_ptrs = w_ptr + rows_n[:, None].to(tl.int64) * K + (k_begin + offs_k)[None, :]
    if GROUPED:
        gs_rows = gs_ptr + rows_n.to(tl.int64) * (K // GROUP_SIZE)

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        if EVEN_K:
            xt = tl.load(x_ptrs)
        else:
            xt = tl.load(x_ptrs, mask=(k0 + offs_k)[:, None] < K, other=0)
        if W4:
            if EVEN_K:
                p = tl.load(w_ptrs)
            else:
                p = tl.load(w_ptrs, mask=(k0 // 2 + offs_kp)[None, :] < K_HALF, other=0)
            w = unpack_w4(p, 1, UNPACK_ASM, False)  # not the folded group-scale PTX: see unpack_w4
            if GROUPED and not GS_PARTIAL:  # BLOCK_K divides the group, so the whole tile lies in one group
                w = w * tl.load(gs_rows + k0 // GROUP_SIZE)[:, None]  # |q * gs| <= 8 * 16 = 128: exact in int8
            w_ptrs += BLOCK_K // 2
        else:
            if EVEN_K:
                w = tl.load(w_ptrs)
            else:
                w = tl.load(w_ptrs, mask=(k0 + offs_k)[None, :] < K, other=0)
            w_ptrs += BLOCK_K
        if GROUPED and GS_PARTIAL and W4:
            # the tile's exact int32 partial times its integer group scale: BLOCK_N x BLOCK_M
            # multiplies per tile instead of BLOCK_N x BLOCK_K int8 ones; |partial| <= 2**14 * 64
            # ... and the sum is the same integer as with w_int = q * gs (associativity)
            part = tl.dot(w, xt, out_dtype=tl.int32)
            acc += part * tl.load(gs_rows + k0 // GROUP_SIZE).to(tl.int32)[:, None]
        else:
            acc = tl.dot(w, xt, acc, out_dtype=tl.int32)
        x_ptrs += BLOCK_K

    mask = mask_n[:, None] & mask_m[None, :]
    finish_tile(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr, pid_m * num_pid_n + pid_n, offs_m, offs_n,
                rows_m, rows_n, mask, N, split_k, SPLIT, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)


@triton.jit
def finish_tile(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, acc_ws_ptr, count_ptr, tile, offs_m, offs_n, rows_m, rows_n, mask, N, split_k,
                SPLIT: tl.constexpr, X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The output of a tile from its exact int32 ``acc`` (``out^T`` ``[BLOCK_N, BLOCK_M]``): the float
    epilogue, or with SPLIT the exact int32 reduction of the partials first, finished by the
    program that arrives last at the tile's counter ``count_ptr + tile``."""
    if SPLIT:
        ws_ptrs = acc_ws_ptr + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial is issued before the counter moves
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == split_k - 1:
            acc = take_split_sum(ws_ptrs, mask, count_ptr + tile)
            _epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, rows_m, rows_n, mask, N,
                      X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)
    else:
        _epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, rows_m, rows_n, mask, N,
                  X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)


@triton.jit
def tile_of(tile, num_pid_n, num_pid_m, GROUP_N: tl.constexpr):
    """(pid_n, pid_m) of linear tile index ``tile``: GROUP_N weight-row tiles x every token tile
    per group, so a weight tile is re-read by all token tiles while it is in L2."""
    per_group = GROUP_N * num_pid_m
    first_n = (tile // per_group) * GROUP_N
    group_n = tl.minimum(num_pid_n - first_n, GROUP_N)
    return first_n + (tile % per_group) % group_n, (tile % per_group) // group_n


@triton.jit
def take_split_sum(ws_ptrs, mask, counter):
    """For the split that arrived last at ``counter``: the tile's complete int32 sums, leaving the
    persistent workspace (``zeroed_int32``) zero again: the sums and the counter."""
    total = tl.load(ws_ptrs, mask=mask, other=0, cache_modifier=".cg")  # L2, not a stale L1 line
    # every thread has read its sums before any is zeroed: the zeros' store may take another
    # thread-to-element layout than the load (without the barrier the GPU tests saw wrong sums)
    tl.debug_barrier()
    tl.store(ws_ptrs, tl.zeros_like(total), mask=mask)
    tl.store(counter, 0)
    return total


@triton.jit
def unpack_w4(p, gs, UNPACK_ASM: tl.constexpr, GROUPED: tl.constexpr):
    """Packed bytes ``p`` (uint8 ``[BN, BK / 2]``, k = 2j low nibble, 2j + 1 high) -> the int8
    operand ``(u - 8) * gs`` ``[BN, BK]`` in natural K order; ``gs``: the rows' int8 group scales
    ``[BN]`` for the tile's group (GROUPED), else unused (1).

    With UNPACK_ASM and GROUPED the scale is folded into the PTX (:func:`_scaled_nibbles`), which
    takes the first of each register's four bytes' scales for all four: right only where Triton
    lays ``p`` out with a register's four bytes along K in one row. The TMA kernel's
    shared-memory load does (16 bytes along K a thread; its GPU tests run every W4 config bit
    for bit, and CI checks the layout of an sm_90 compile with the installed Triton:
    tests/ops/_tma_w4_layout_sm90.py); the tile kernel's register-A operand does not (pairs of
    bytes from rows r and r + 8: about half its outputs came out wrong on the H200), so that
    kernel unpacks and multiplies by ``gs`` per element."""
    if UNPACK_ASM and GROUPED:
        g = gs.to(tl.int32)[:, None]
        c = (128 - 8 * g) * 0x01010101  # the bias 128 - 8 gs in every byte
        lo = _scaled_nibbles(p, g, c, 0)
        hi = _scaled_nibbles(p, g, c, 4)
        return tl.join(lo, hi).reshape(p.shape[0], 2 * p.shape[1])
    if UNPACK_ASM:
        lo = _nibbles_minus_8(p, 0)
        hi = _nibbles_minus_8(p, 4)
    else:
        s = (p ^ 0x88).to(tl.int8, bitcast=True)  # each nibble now holds u - 8 in two's complement
        lo = (s << 4) >> 4  # sign-extended low nibble: even k
        hi = s >> 4  # sign-extended high nibble: odd k
    w = tl.join(lo, hi).reshape(p.shape[0], 2 * p.shape[1])
    if GROUPED:  # |(u - 8) * gs| <= 8 * 16 = 128: exact in int8
        w = w * gs[:, None]
    return w


@triton.jit
def _scaled_nibbles(p, g, c, SHIFT: tl.constexpr):
    """``int8((((p >> SHIFT) & 15) - 8) * g)`` for uint8 ``p``, four bytes per 32-bit register (GPU only).

    Per byte, u in [0, 15] and g in [1, 16]: ``u * g + (128 - 8 g) = (u - 8) g + 128`` lies in
    [0, 240], so one 32-bit multiply-add of the four masked bytes by ``g`` plus ``c`` (that bias
    in every byte) never carries between bytes, and ``^ 0x80`` makes each ``(u - 8) g`` in two's
    complement: 3-4 instructions for four codes instead of an unpack plus an int8 multiply per
    code. ``g``, ``c``: int32 per row, broadcast (the four bytes of a register share a row).
    """
    g = tl.broadcast_to(g, p.shape)
    c = tl.broadcast_to(c, p.shape)
    if SHIFT == 0:
        q = tl.inline_asm_elementwise(
            "{ .reg .b32 t; and.b32 t, $1, 0x0F0F0F0F; mad.lo.u32 t, t, $2, $6; xor.b32 $0, t, 0x80808080; }",
            "=r,r,r,r,r,r,r,r,r,r", [p, g, c], dtype=tl.int8, is_pure=True, pack=4)
    else:
        q = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shr.u32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; mad.lo.u32 t, t, $2, $6; xor.b32 $0, t, 0x80808080; }",
            "=r,r,r,r,r,r,r,r,r,r", [p, g, c], dtype=tl.int8, is_pure=True, pack=4)
    return q


@triton.jit
def _nibbles_minus_8(p, SHIFT: tl.constexpr):
    """``int8(((p >> SHIFT) & 15) - 8)`` for uint8 ``p``, four bytes per 32-bit register (GPU only).

    Per byte, u in [0, 15]: ``(u + 0x78) ^ 0x80`` is ``u - 8`` in two's complement, and
    ``u + 0x78 <= 0x87`` never carries into the next byte, so one and/add/xor (plus a
    shift) handles four codes: 4 instructions instead of ~4 per code with int8 ops.
    """
    if SHIFT == 0:
        q = tl.inline_asm_elementwise(
            "{ .reg .b32 t; and.b32 t, $1, 0x0F0F0F0F; add.u32 t, t, 0x78787878; xor.b32 $0, t, 0x80808080; }",
            "=r,r", [p], dtype=tl.int8, is_pure=True, pack=4)
    else:
        q = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shr.u32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; add.u32 t, t, 0x78787878; xor.b32 $0, t, 0x80808080; }",
            "=r,r", [p], dtype=tl.int8, is_pure=True, pack=4)
    return q


@triton.jit
def _epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, rows_m, rows_n, mask, N,
              X_PER_TOKEN: tl.constexpr, W_PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr):
    """``out^T[n, m] = out_dtype((float32(acc) * x_scale[m]) * w_scale[n] + float32(bias[n]))``."""
    if X_PER_TOKEN:
        xs = tl.load(xs_ptr + rows_m)[None, :]
    else:
        xs = tl.load(xs_ptr)
    if W_PER_CHANNEL:
        ws = tl.load(ws_ptr + rows_n)[:, None]
    else:
        ws = tl.load(ws_ptr)
    y = acc.to(tl.float32) * xs
    y = y * ws
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rows_n).to(tl.float32)[:, None]
    out_ptrs = out_ptr + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    if out_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(out_ptrs, _bf16_rne(y), mask=mask)
    else:
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bf16_rne(y):
    """float32 -> bfloat16, round half to even, as torch's ``.to(torch.bfloat16)``.

    Spelled out in integer ops because the Triton interpreter's cast truncates (the
    GPU cast rounds to nearest even); both paths then give torch's bits.
    """
    bits = y.to(tl.uint32, bitcast=True)
    bits = bits + (0x7FFF + ((bits >> 16) & 1))
    out = (bits >> 16).to(tl.uint16)
    out = tl.where(y != y, 0x7FC0, out)  # NaN stays NaN (the carry above could reach the sign bit)
    return out.to(tl.bfloat16, bitcast=True)


# ---------------------------------------------------------------- launcher and configs

def _config(bm, bn, bk, split_k=1, warps=4, stages=4, group_n=8, unpack_asm=0, gs_partial=0):
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split_k,
           "GROUP_N": group_n, "num_warps": warps, "num_stages": stages, "UNPACK_ASM": unpack_asm}
    return dict(cfg, GS_PARTIAL=1) if gs_partial else cfg


def _split_for(m, n, k, bm, bn, bk, sms):
    """Smallest power-of-two split giving >= 2 programs per SM, keeping >= 4 K tiles per split."""
    tiles = -(-m // bm) * -(-n // bn)
    split = 1
    while tiles * split < 2 * sms and k // (bk * split * 2) >= 4 and split < 16:
        split *= 2
    return split


@functools.lru_cache(maxsize=4096)  # pure in its arguments: 45 us -> 0.35 us of Python per call (CPU box)
def candidate_configs(m: int, n: int, k: int, group_size: int, sms: int, w4_asm: bool = False,
                      w8_gemv: bool = False) -> list[dict]:
    """Every config of :func:`_tile_configs`, and with ``w4_asm`` (W4A8 on a GPU) each also with
    the inline-PTX nibble unpack (which the Triton interpreter cannot run) and the other W4A8
    kernels, the heuristic first: the dp4a GEMV's first lane tile at M <= 2, ``mma_words`` up to
    M = 64; with ``w8_gemv`` (W8A8 on a GPU)
    the TMA kernel's and the dp4a GEMV's configs too. The first config is what runs untuned."""
    base = _tile_configs(m, n, k, group_size, sms)
    if w8_gemv:  # W8A8 on a GPU: the TMA kernel and the dp4a GEMV (ops/w8a8_gemv.py) after the measured configs
        from .w8a8_gemv import gemv8_configs

        return base + tma_configs(m, k) + gemv8_configs(m, n, k, sms, asm=True)
    if not w4_asm:
        return base
    from .w4a8_gemv import gemv_configs
    from .w4a8_mma_words import mma_words_configs

    asm = [dict(c, UNPACK_ASM=1) for c in base]
    # after the tile configs: the int32-partial group scale (group 128, M <= 64) and the CUDA-core GEMV (M <= 8)
    partial = [dict(c, GS_PARTIAL=1) for c in asm if group_size != -1 and m <= 64]
    # M > 64: int4 -> int8 weight pass (ops/w4a8_int8_weight.py), then the W8A8 kernel's configs
    w8 = [dict(c, KERNEL="w8") for c in _tile_configs(m, n, k, -1, sms) + tma_configs(m, k)] if m > 64 and k % 8 == 0 else []
    tma = [dict(c, UNPACK_ASM=1) for c in tma_configs(m, k, group_size, w4=True)]  # M > 64: unpack into the B operand
    # M <= 64 (K % 128 == 0): the packed bytes straight into the MMA's A registers; first where
    # offered from M = 3 (the heuristic, untuned pick): on the H200 it won 33 of the 40 keys at
    # M = 1-64 (BENCHMARKS.md, ninth session), and the tile kernel below otherwise
    words = mma_words_configs(m, n, k, sms, group_size)
    gemv = gemv_configs(m, n, k, group_size, sms, asm=True)
    if m <= 2 and gemv:  # 1-2 tokens: the GEMV's lane tiles first (on the H200 1.1-1.5x faster than mma_words at M = 1)
        return gemv[:1] + words + base + asm + partial + gemv[1:] + tma + w8
    return words[:1] + base + asm + partial + gemv + words[1:] + tma + w8


def _tile_configs(m: int, n: int, k: int, group_size: int, sms: int) -> list[dict]:
    """Configs to try for one problem, heuristic choice first (used when tuning is off).

    Token tile BLOCK_M by M; weight tile BLOCK_N x BLOCK_K sized for wgmma (64/128 rows);
    BLOCK_K <= the group (128, 64 or 32) so one tile reads one group's scales. The split count
    is a launch-grid size, not a compile-time constant, so split variants cost no compile.
    """
    if group_size not in (-1, 128):  # groups of 64 / 32 (layers whose K 128 does not divide): the same tiles, shallower
        deeper = _tile_configs(m, n, k, 128, sms)
        return list({str(c): c for c in (dict(c, BLOCK_K=min(c["BLOCK_K"], group_size)) for c in deeper)}.values())
    kmax = 128 if group_size == 128 else 256
    if m <= 16:
        out = []
        for bm, bn, bk, w, s in ((16, 64, kmax, 4, 6), (16, 32, kmax, 4, 6), (16, 128, kmax, 4, 4)):
            base = _split_for(m, n, k, bm, bn, bk, sms)
            for sk in dict.fromkeys((base, max(1, base // 2), 1)):
                out.append(_config(bm, bn, bk, sk, w, s))
        return list({str(c): c for c in out}.values())
    if m <= 64:
        bm = 32 if m <= 32 else 64
        return [_config(bm, 128, 128, _split_for(m, n, k, bm, 128, 128, sms), 4, 4),
                _config(bm, 64, kmax, _split_for(m, n, k, bm, 64, kmax, sms), 4, 5),
                _config(bm, 128, 128, 1, 4, 4)]
    if m <= 512:
        return [_config(64, 128, 128, 1, 4, 4), _config(128, 128, 128, 1, 8, 4), _config(128, 128, 128, 1, 4, 3)]
    # the rest: the TMA kernel's sync-wgmma remedies (tma_configs) for this kernel too
    out = [_config(256, 128, 128, 1, 8, 3), _config(128, 128, 128, 1, 8, 4), _config(128, 256, 128, 1, 8, 3),
           _config(128, 128, 128, 1, 4, 3), _config(256, 128, kmax, 1, 8, 2), _config(128, 256, kmax, 1, 8, 2),
           _config(64, 128, 128, 1, 4, 4), _config(64, 128, 128, 1, 4, 3), _config(128, 64, 128, 1, 4, 3)]
    return list({str(c): c for c in out}.values())


def tma_configs(m: int, k: int, group_size: int = -1, w4: bool = False) -> list[dict]:
    """Configs of the TMA-fed kernel (ops/int8_gemm_tma.py; no split-K; none where K is too
    ragged for a descriptor). ``PERSISTENT``: programs per SM, 0 = one program per tile.
    ``w4``: its W4A8 form (M > 64 only: it unpacks into wgmma's B operand, whose M side is the
    tokens), BLOCK_K within the group of 128.

    Triton keeps a wgmma with an int32 accumulator synchronous (a ``wait 0`` after every K
    slice; only float32 accumulators are pipelined, checked in the PTX with triton 3.7.1), so
    the tensor cores idle while each slice's MMAs drain. The large-M tiles therefore include
    BLOCK_K = 256 (half the drains per MAC) and tiles of one warpgroup small enough for two or
    three programs per SM (128 x 128 x 128, 3 stages: 96 KB of shared memory, 159 registers a
    thread), whose drains (and epilogues) the other programs' MMAs fill: on the H200 that tile
    took W8A8 4096 x 4096 x 1024 from 35.1 to 26.9 us (BENCHMARKS.md, fifth session). Two
    stages (64 KB, 160 registers) fit three programs per SM: 6144 x 4096 x 1024's 384 tiles of
    128 x 128 in one wave of 396 instead of 1.45 waves of 264.
    """
    from .int8_gemm_tma import tma_supported

    if not tma_supported(k, w4) or (w4 and (m <= 64 or group_size not in (-1, 128))):  # its W4 form reads groups of 128
        return []
    # persistent variants only where the sm_90 compile keeps the loop in registers (triton 3.7.1:
    # the tile loop made e.g. 128 x 256 x 128 and 128 x 128 x 128 / 4 warps spill 320 B of stack)
    if w4:
        tiles = ((128, 128, 128, 4, 3, (0,)), (128, 128, 128, 8, 4, (0,)), (256, 128, 128, 8, 3, (0,)), (64, 128, 128, 4, 4, (0,)),
                 (64, 128, 128, 4, 3, (0,)), (128, 64, 128, 4, 3, (0,)), (128, 64, 128, 4, 2, (0,)))
    elif m <= 16:
        tiles = ((16, 64, 256, 4, 6, (0, 1)), (16, 128, 256, 4, 4, (0, 1)), (16, 64, 128, 4, 8, (0, 1)))
    elif m <= 64:
        tiles = ((32, 128, 128, 4, 4, (0, 1)),) if m <= 32 else ((64, 128, 128, 4, 4, (0,)),)
    elif m <= 512:
        tiles = ((64, 128, 128, 4, 4, (0,)), (128, 128, 128, 8, 4, (0, 1)), (128, 128, 128, 4, 3, (0,)),
                 (128, 256, 128, 8, 3, (0,)))
    else:
        tiles = ((256, 128, 128, 8, 3, (0, 1)), (128, 256, 128, 8, 3, (0,)), (256, 128, 128, 8, 4, (0, 1)),
                 (128, 128, 128, 4, 3, (0,)), (256, 128, 256, 8, 2, (0, 1)), (128, 256, 256, 8, 2, (0,)),
                 (64, 128, 128, 4, 4, (0,)), (64, 128, 128, 4, 3, (0,)), (128, 64, 128, 4, 3, (0,)),
                 (128, 128, 128, 4, 2, (0,)), (128, 128, 64, 4, 3, (0,)))
    kmax = 128 if group_size == 128 else 256
    out = [dict(_config(bm, bn, min(bk, kmax), 1, w, s), TMA=1, PERSISTENT=p) for bm, bn, bk, w, s, ps in tiles for p in ps]
    return list({str(c): c for c in out}.values())


def run_int8_gemm(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, *, w4: bool, config: dict):
    """Launch the kernel with ``config``; arguments already checked by the op. Returns [M, N]."""
    import torch

    m, k = xq.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        raise ValueError("run_int8_gemm: K must be positive (the ops send K == 0 to their reference)")
    if config.get("KERNEL") == "gemv8":
        from .w8a8_gemv import run_w8a8_gemv

        return run_w8a8_gemv(xq, x_scale, w, w_scale, bias, out_dtype, config=config)
    if config.get("KERNEL") == "gemv":
        from .w4a8_gemv import run_w4a8_gemv

        return run_w4a8_gemv(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, config=config)
    if config.get("KERNEL") == "mma_words":
        from .w4a8_mma_words import run_w4a8_mma_words

        return run_w4a8_mma_words(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, config=config)
    if config.get("KERNEL") == "w8":
        from .w4a8_int8_weight import w4_to_int8

        w8_cfg = {key: v for key, v in config.items() if key != "KERNEL"}
        return run_int8_gemm(xq, x_scale, w4_to_int8(w, group_scale), w_scale, None, bias, out_dtype, w4=False, config=w8_cfg)
    if config.get("TMA"):
        from ._autotune import sm_count
        from .int8_gemm_tma import run_int8_gemm_tma

        return run_int8_gemm_tma(xq, x_scale, w, w_scale, group_scale, bias, out, config, sm_count(xq.device), w4=w4)
    cfg = dict(config)
    bm, bn, bk, split = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K"), cfg.pop("SPLIT_K")
    group_n, warps, stages = cfg.pop("GROUP_N"), cfg.pop("num_warps"), cfg.pop("num_stages")
    unpack_asm = bool(cfg.pop("UNPACK_ASM", 0)) and w4
    gs_partial = bool(cfg.pop("GS_PARTIAL", 0))
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if split > 1:
        buf = zeroed_int32(xq.device, m * n + tiles)  # partial sums + arrival counters, left zeroed
        acc_ws, counts = buf[: m * n], buf[m * n:]
    else:
        acc_ws = counts = out  # never touched when SPLIT_K == 1
    xq = xq.contiguous()
    xs = x_scale.reshape(-1).contiguous()
    _int8_gemm_kernel[(tiles, split)](
        xq, xs, w, w_scale, group_scale if group_scale is not None else w_scale,
        bias if bias is not None else w_scale, out, acc_ws, counts,
        m, n, k, k // 2,
        W4=w4, GROUPED=group_scale is not None, GROUP_SIZE=k // group_scale.shape[1] if group_scale is not None else 1,
        UNPACK_ASM=unpack_asm, GS_PARTIAL=gs_partial,
        X_PER_TOKEN=x_scale.dim() == 2,  # [M, 1] per-token, [1] per-tensor
        W_PER_CHANNEL=w_scale.numel() != 1,  # [N] per-channel (N == 1 reads the same value)
        HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split > 1, GROUP_N=group_n,
        EVEN_K=k % bk == 0,
        num_warps=warps, num_stages=stages, enable_fp_fusion=False,
    )
    return out


def is_experimental(config: dict) -> bool:
    """Families kept opt-in (``QFUSE_EXPERIMENTAL_KERNELS=1``): the W8A8 dp4a GEMV, correct on
    the H200 grid but slower there than the tile kernel at every measured point; the stream-K
    form of W4A8 ``mma_words`` (``STREAM``), bit-exact on the H200 but slower than its split-K
    grid (W4A8 per-channel M = 1: 25.7 against 24.0 us on 28672x4096, 16.0 against 13.6 on
    4096x14336 at the best of 1-8 programs per SM; ninth session)."""
    return config.get("KERNEL") == "gemv8" or bool(config.get("STREAM"))


# Decode buckets up to here take the eager pick outside CUDA-graph capture (see int8_gemm).
EAGER_MAX_M = 64


def int8_gemm(op, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, *, w4: bool, group_size: int = -1):
    """Pick a config (ops/_autotune.py: cache, shipped defaults, or a measurement) and run.

    Configs are ranked by CUDA-graph time, which leaves out the host's launch cost. A TMA
    launch costs more of it (two host descriptors encoded per call: on the H200 24-48 us of
    Python and driver per launch at M = 1-16 against 11-12 us for the pointer kernel, whose
    graph time is only 0.3-1.7 us longer there), and a decode GEMM outside a graph waits on
    the host. So when the pick for an M bucket <= EAGER_MAX_M is a TMA config and no CUDA graph
    is being captured, the op takes the best config without TMA instead (its own key,
    ``<op>_eager``: shipped, cached or measured like any other). Both compute the same bits.
    """
    from ._autotune import _capturing, m_bucket, offered, pick_config, sm_count, tma_capable

    m, k = xq.shape
    n = w.shape[0]
    key = (m_bucket(m), n, k) if not w4 else (m_bucket(m), n, k, group_size)
    on_gpu = xq.device.type == "cuda"

    def cands() -> list[dict]:  # built only on a cache miss (pick_config); opt-in families: see is_experimental
        every = candidate_configs(m, n, k, group_size, sm_count(xq.device), w4_asm=w4 and on_gpu, w8_gemv=not w4 and on_gpu)
        if not tma_capable(xq.device):  # before Hopper: no TMA configs (their W4A8 "w8" forms included)
            every = [c for c in every if not c.get("TMA")]
        return offered(every, is_experimental)

    def run(c):
        return run_int8_gemm(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4=w4, config=c)

    cfg = pick_config(op, key, cands, run, xq.device)
    if cfg.get("TMA") and key[0] <= EAGER_MAX_M and not _capturing():
        cfg = pick_config(op + "_eager", key, lambda: [c for c in cands() if not c.get("TMA")], run, xq.device)
    return run(cfg)
