"""Triton helpers shared by the int8-activation GEMM kernels (``w8a8_gemm``, ``w4a8_gemm``):
tile order, the split-K finish, the int4 unpack and the float epilogue.

Every kernel of the family computes the ops' math (ops/w8a8_gemm.py, ops/w4a8_gemm.py)::

    acc[m, n] = sum_k int32(xq[m, k]) * w_int[n, k]                       exact int32
    out[m, n] = out_dtype( float32(acc) * x_scale[m] * w_scale[n] + float32(bias[n]) )

and ends in :func:`epilogue` (FMA contraction off at launch, bf16 rounded to nearest even), so
each is bit-identical to the reference. Split-K partials are exact int32 sums added into a
persistent zeroed workspace (ops/_zeroed_workspace.py); the split that arrives last at the tile's
counter reads the total (:func:`take_split_sum`), so the result does not depend on arrival order.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def finish_tile(
    acc,
    xs_ptr,
    ws_ptr,
    bias_ptr,
    out_ptr,
    acc_ws_ptr,
    count_ptr,
    tile,
    offs_m,
    offs_n,
    rows_m,
    rows_n,
    mask,
    N,
    split_k,
    SPLIT: tl.constexpr,
    X_PER_TOKEN: tl.constexpr,
    W_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
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
            epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, rows_m, rows_n, mask, N, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)
    else:
        epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, rows_m, rows_n, mask, N, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)


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

    With UNPACK_ASM and GROUPED the scale is folded into the PTX (:func:`scaled_nibbles`), which
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
        lo = scaled_nibbles(p, g, c, 0)
        hi = scaled_nibbles(p, g, c, 4)
        return tl.join(lo, hi).reshape(p.shape[0], 2 * p.shape[1])
    if UNPACK_ASM:
        lo = nibbles_minus_8(p, 0)
        hi = nibbles_minus_8(p, 4)
    else:
        s = (p ^ 0x88).to(tl.int8, bitcast=True)  # each nibble now holds u - 8 in two's complement
        lo = (s << 4) >> 4  # sign-extended low nibble: even k
        hi = s >> 4  # sign-extended high nibble: odd k
    w = tl.join(lo, hi).reshape(p.shape[0], 2 * p.shape[1])
    if GROUPED:  # |(u - 8) * gs| <= 8 * 16 = 128: exact in int8
        w = w * gs[:, None]
    return w


@triton.jit
def scaled_nibbles(p, g, c, SHIFT: tl.constexpr):
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
            "=r,r,r,r,r,r,r,r,r,r",
            [p, g, c],
            dtype=tl.int8,
            is_pure=True,
            pack=4,
        )
    else:
        q = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shr.u32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; mad.lo.u32 t, t, $2, $6; xor.b32 $0, t, 0x80808080; }",
            "=r,r,r,r,r,r,r,r,r,r",
            [p, g, c],
            dtype=tl.int8,
            is_pure=True,
            pack=4,
        )
    return q


@triton.jit
def nibbles_minus_8(p, SHIFT: tl.constexpr):
    """``int8(((p >> SHIFT) & 15) - 8)`` for uint8 ``p``, four bytes per 32-bit register (GPU only).

    Per byte, u in [0, 15]: ``(u + 0x78) ^ 0x80`` is ``u - 8`` in two's complement, and
    ``u + 0x78 <= 0x87`` never carries into the next byte, so one and/add/xor (plus a
    shift) handles four codes: 4 instructions instead of ~4 per code with int8 ops.
    """
    if SHIFT == 0:
        q = tl.inline_asm_elementwise(
            "{ .reg .b32 t; and.b32 t, $1, 0x0F0F0F0F; add.u32 t, t, 0x78787878; xor.b32 $0, t, 0x80808080; }",
            "=r,r",
            [p],
            dtype=tl.int8,
            is_pure=True,
            pack=4,
        )
    else:
        q = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shr.u32 t, $1, 4; and.b32 t, t, 0x0F0F0F0F; add.u32 t, t, 0x78787878; xor.b32 $0, t, 0x80808080; }",
            "=r,r",
            [p],
            dtype=tl.int8,
            is_pure=True,
            pack=4,
        )
    return q


@triton.jit
def epilogue(
    acc,
    xs_ptr,
    ws_ptr,
    bias_ptr,
    out_ptr,
    offs_m,
    offs_n,
    rows_m,
    rows_n,
    mask,
    N,
    X_PER_TOKEN: tl.constexpr,
    W_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
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
        tl.store(out_ptrs, bf16_rne(y), mask=mask)
    else:
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bf16_rne(y):
    """float32 -> bfloat16, round half to even, as torch's ``.to(torch.bfloat16)``.

    Spelled out in integer ops because the Triton interpreter's cast truncates (the
    GPU cast rounds to nearest even); both paths then give torch's bits.
    """
    bits = y.to(tl.uint32, bitcast=True)
    bits = bits + (0x7FFF + ((bits >> 16) & 1))
    out = (bits >> 16).to(tl.uint16)
    out = tl.where(y != y, 0x7FC0, out)  # NaN stays NaN (the carry above could reach the sign bit)
    return out.to(tl.bfloat16, bitcast=True)


@triton.jit
def dp4a_s(a, b, c, ASM: tl.constexpr):
    """``c + sum_i sbyte_i(a) * sbyte_i(b)`` (int32)."""
    if ASM:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32, is_pure=True, pack=1)
    else:
        for i in tl.static_range(4):
            c += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
        return c


@triton.jit
def finish_token(
    acc,
    m,
    xs_ptr,
    ws_ptr,
    bias_ptr,
    out_ptr,
    acc_ws_ptr,
    counter,
    offs_n,
    rn,
    M,
    N,
    split_k,
    SPLIT: tl.constexpr,
    X_PER_TOKEN: tl.constexpr,
    W_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Row ``m`` of the output from its int32 lanes: sum, split-K reduction, float epilogue."""
    res = tl.sum(acc, axis=1)[:, None]  # [BLOCK_N, 1] exact int32
    offs_m = tl.full((1,), 0, tl.int32) + m
    rows_m = tl.minimum(offs_m, M - 1)
    mask = (offs_n < N)[:, None] & (offs_m < M)[None, :]
    if SPLIT:
        ws_ptrs = acc_ws_ptr + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.atomic_add(ws_ptrs, res, mask=mask, sem="relaxed")
        tl.debug_barrier()  # every thread's partial is issued before the counter moves
        arrived = tl.atomic_add(counter, 1, sem="acq_rel")  # one counter per (weight tile, token)
        if arrived == split_k - 1:
            res = take_split_sum(ws_ptrs, mask, counter)
            epilogue(res, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, rows_m, rn, mask, N, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)
    else:
        epilogue(res, xs_ptr, ws_ptr, bias_ptr, out_ptr, offs_m, offs_n, rows_m, rn, mask, N, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS)


@triton.jit
def finish_tokens(
    acc0,
    acc1,
    acc2,
    acc3,
    m0,
    xs_ptr,
    ws_ptr,
    bias_ptr,
    out_ptr,
    acc_ws_ptr,
    counters,
    offs_n,
    rn,
    M,
    N,
    split_k,
    BLOCK_M: tl.constexpr,
    SPLIT: tl.constexpr,
    X_PER_TOKEN: tl.constexpr,
    W_PER_CHANNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Rows ``m0 .. m0 + BLOCK_M - 1`` (1, 2 or 4 tokens) of the output from their int32 lanes
    (``acc1..3`` unused below BLOCK_M); ``counters``: the tile's first split-K arrival counter."""
    finish_token(
        acc0, m0, xs_ptr, ws_ptr, bias_ptr, out_ptr, acc_ws_ptr, counters, offs_n, rn, M, N, split_k, SPLIT, X_PER_TOKEN, W_PER_CHANNEL, HAS_BIAS
    )
    if BLOCK_M > 1:
        finish_token(
            acc1,
            m0 + 1,
            xs_ptr,
            ws_ptr,
            bias_ptr,
            out_ptr,
            acc_ws_ptr,
            counters + 1,
            offs_n,
            rn,
            M,
            N,
            split_k,
            SPLIT,
            X_PER_TOKEN,
            W_PER_CHANNEL,
            HAS_BIAS,
        )
    if BLOCK_M > 2:
        finish_token(
            acc2,
            m0 + 2,
            xs_ptr,
            ws_ptr,
            bias_ptr,
            out_ptr,
            acc_ws_ptr,
            counters + 2,
            offs_n,
            rn,
            M,
            N,
            split_k,
            SPLIT,
            X_PER_TOKEN,
            W_PER_CHANNEL,
            HAS_BIAS,
        )
        finish_token(
            acc3,
            m0 + 3,
            xs_ptr,
            ws_ptr,
            bias_ptr,
            out_ptr,
            acc_ws_ptr,
            counters + 3,
            offs_n,
            rn,
            M,
            N,
            split_k,
            SPLIT,
            X_PER_TOKEN,
            W_PER_CHANNEL,
            HAS_BIAS,
        )
