"""Tiled tensor-core kernel for 4-bit ``wna16_gemm`` with the dequantization done by PTX on
packed registers: ~2.75 SASS instructions per weight byte for the dequantization and 5.1-6.5
for the whole decode loop (sm_90, 4 planes, M = 16-64), against 8.1-9.4 for
ops/wna16/tiled_words.py and ~13 for ops/wna16/tiled.py. On the H200 it is the measured
best W4A16 kernel at M = 2-32 (1.34-1.68x bf16 at M = 16; BENCHMARKS.md).

Same tiling, split-K and scale placement as ops/wna16/tiled.py (one program: a
``[BLOCK_M, BLOCK_N]`` output tile over a ``1 / SPLIT_K`` slice of K; ``BLOCK_K <= group``).
Only the weight path differs. A byte holds k = 2j (low nibble) and k = 2j + 1 (high nibble).
Per 32-bit register of 4 loaded bytes ``b0..b3`` (8 codes), in the activation dtype::

    t01 = prmt(b, 0x4140) = b0 | b1 << 16,   t23 = prmt(b, 0x4342)        (2 PRMT)
    lo  = (t & 0x000F000F) | MAGIC           = (M + u_2j, M + u_2j+2)     (LOP3 per pair)
    hi  = ((t >> 4) & 0x000F000F) | MAGIC    = (M + u_2j+1, M + u_2j+3)   (SHF + LOP3 per pair)
    lo, hi -= (M + z, M + z)                 = u - z, exact               (one packed FMA / SUB per pair)

with ``MAGIC`` the dtype's pair of ``M`` = 128.0 (bf16, 7 mantissa bits) or 1024.0 (fp16,
10 bits): a nibble OR'ed into the low mantissa bits is the float ``M + u``. That is 12
instructions per 8 codes (Marlin's trick, kernel_anchors.md section 3), against the
byte-extract / I2F or float32 exponent trick plus an F2F pack per code of the other tiled
kernels. ``lo`` is the even-k plane and ``hi`` the odd-k plane of the weight tile, each
``[BLOCK_N, BLOCK_K / 2]``; the activations are split the same way in registers
(``reshape(x, [.., BLOCK_K / 2, 2])`` + ``split``), so::

    part = lo @ x_even^T + hi @ x_odd^T          (two MMAs, float32 accumulator, exact u - z)
    acc += part * s[n, g]   (grouped, per K tile)      acc *= s[n] after the loop (per-channel)

``PLANES = 4`` (config key): the tile is read as int16 halves (4 codes, k = 4h + t) and a
register of two halves gives plane t directly, ``((r >> 4t) & 0x000F000F) | MAGIC`` then the
packed FMA: 11 instructions per 8 codes and no PRMT; four MMAs of depth BLOCK_K / 4.

The weights reach the MMA as exact small integers and the scale multiplies the float32
partial: no rounding of ``(u - z) * s`` to the activation dtype, so this differs from the
reference (which rounds it once) by that rounding; tolerance in the tests. ``SWAP_AB``:
``acc^T = w @ x^T``, the weight tile as the MMA's A operand (wgmma's 64-row M side; the few
decode tokens are its N side). The Triton interpreter cannot run inline PTX: there
(``ASM=False``) the planes come from integer ops with the same values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._autotune import m_bucket
from .._launch import launch
from .._views import aligned_view
from ..kernel_family import KernelFamily, Problem
from .common import mma, output_buffers, scaled_weights, store_tile, tile_coords, weight_major_tiles
from .tiled import k_plan, tiled_configs

# lop3 immLut 0xEA = (a & b) | c. bf16: sub.bf16x2 needs sm_90, fma.rn.bf16x2 runs from sm_80.
_PLANES_BF16 = tl.constexpr("""{
.reg .b32 t01, t23, v, one;
mov.b32 one, 0x3F803F80;
prmt.b32 t01, $4, 0, 0x4140;
prmt.b32 t23, $4, 0, 0x4342;
lop3.b32 v, t01, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $0, v, one, $5;
lop3.b32 v, t23, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $1, v, one, $6;
shr.u32 t01, t01, 4;
shr.u32 t23, t23, 4;
lop3.b32 v, t01, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $2, v, one, $5;
lop3.b32 v, t23, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $3, v, one, $6;
}""")
_PLANES_FP16 = tl.constexpr("""{
.reg .b32 t01, t23, v;
prmt.b32 t01, $4, 0, 0x4140;
prmt.b32 t23, $4, 0, 0x4342;
lop3.b32 v, t01, 0x000F000F, 0x64006400, 0xEA;
add.f16x2 $0, v, $5;
lop3.b32 v, t23, 0x000F000F, 0x64006400, 0xEA;
add.f16x2 $1, v, $6;
shr.u32 t01, t01, 4;
shr.u32 t23, t23, 4;
lop3.b32 v, t01, 0x000F000F, 0x64006400, 0xEA;
add.f16x2 $2, v, $5;
lop3.b32 v, t23, 0x000F000F, 0x64006400, 0xEA;
add.f16x2 $3, v, $6;
}""")


# compile options of a launch where the config does not set them (``qfuse bench sass`` compiles with the same)
LAUNCH_OPTIONS = {"num_stages": 3}


@triton.jit
def nibble_planes(b, z, dtype: tl.constexpr, ASM: tl.constexpr):
    """Packed bytes ``b`` (uint8 ``[BN, W]``) -> ``(u_lo - z, u_hi - z)`` as ``dtype [BN, W]``
    (exact); ``z``: float32 ``[BN]`` zero points."""
    if ASM:
        if dtype == tl.bfloat16:
            neg = (-(z + 128.0)).to(tl.bfloat16)[:, None]  # -(M + z): exact (|.| <= 143)
            lo, hi = tl.inline_asm_elementwise(_PLANES_BF16, "=r,=r,=r,=r,r,r,r", [b, neg], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        else:
            neg = (-(z + 1024.0)).to(tl.float16)[:, None]
            lo, hi = tl.inline_asm_elementwise(_PLANES_FP16, "=r,=r,=r,=r,r,r,r", [b, neg], dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    else:
        bi = b.to(tl.int32)
        lo = ((bi & 15).to(tl.float32) - z[:, None]).to(dtype)
        hi = ((bi >> 4).to(tl.float32) - z[:, None]).to(dtype)
    return lo, hi


# Two 16-bit halves of a word (h0 = codes 0-3, h1 = codes 4-7) arrive packed in one register
# (``pack=2`` on int16 always makes one 32-bit operand; int32 pairs become one or two operands
# depending on the layout Triton picks). Plane t = (code t of h0, code t of h1), in place:
# SHF + LOP3 + one packed FMA per plane, 11 instructions per 8 codes.
_HALF_PLANES_BF16 = tl.constexpr("""{
.reg .b32 v, one;
mov.b32 one, 0x3F803F80;
lop3.b32 v, $4, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $0, v, one, $5;
shr.u32 v, $4, 4;
lop3.b32 v, v, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $1, v, one, $5;
shr.u32 v, $4, 8;
lop3.b32 v, v, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $2, v, one, $5;
shr.u32 v, $4, 12;
lop3.b32 v, v, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $3, v, one, $5;
}""")
_HALF_PLANES_FP16 = tl.constexpr(
    _HALF_PLANES_BF16.value.replace("0x43004300", "0x64006400").replace("fma.rn.bf16x2", "fma.rn.f16x2").replace("0x3F803F80", "0x3C003C00")
)


@triton.jit
def half_planes(halves, z, dtype: tl.constexpr, ASM: tl.constexpr):
    """int16 halves ``[BN, H]`` (4 codes each, code t in bits 4t..) -> the 4 planes
    ``u_t - z`` as ``dtype [BN, H]`` (exact), plane t holding k = 4h + t."""
    if ASM:
        if dtype == tl.bfloat16:
            neg = (-(z + 128.0)).to(tl.bfloat16)[:, None]
            return tl.inline_asm_elementwise(_HALF_PLANES_BF16, "=r,=r,=r,=r,r,r", [halves, neg], dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2)
        else:
            neg = (-(z + 1024.0)).to(tl.float16)[:, None]
            return tl.inline_asm_elementwise(_HALF_PLANES_FP16, "=r,=r,=r,=r,r,r", [halves, neg], dtype=(tl.float16,) * 4, is_pure=True, pack=2)
    else:
        hv = halves.to(tl.int32)
        zz = z[:, None]
        return (
            (((hv & 15).to(tl.float32) - zz).to(dtype)),
            (((hv >> 4) & 15).to(tl.float32) - zz).to(dtype),
            (((hv >> 8) & 15).to(tl.float32) - zz).to(dtype),
            (((hv >> 12) & 15).to(tl.float32) - zz).to(dtype),
        )


@triton.jit
def planes_in_k_order(b, z, dtype: tl.constexpr, ASM: tl.constexpr, HALVES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``u - z`` as ``dtype [BLOCK_N, BLOCK_K]`` in natural K order (exact), for wgmma's register A
    operand: the planes of :func:`nibble_planes` (bytes ``b``) or, with ``HALVES``, of
    :func:`half_planes` (int16 halves), joined back (``join`` + one PRMT per pair on the GPU)."""
    if HALVES:
        w0, w1, w2, w3 = half_planes(b, z, dtype, ASM)
        return tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (BLOCK_N, BLOCK_K))
    else:
        lo, hi = nibble_planes(b, z, dtype, ASM)
        return tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))


@triton.jit
def _split4(xt, BM: tl.constexpr, BH4: tl.constexpr):
    """``[BM, 4 * BH4]`` -> its 4 column planes ``x[:, 4h + t]`` (``[BM, BH4]`` each)."""
    a, b = tl.split(tl.reshape(xt, (BM, BH4, 2, 2)))  # t0 = 0 / 1: [BM, BH4, t1]
    p0, p2 = tl.split(a)
    p1, p3 = tl.split(b)
    return p0, p1, p2, p3


@triton.jit
def _acc4(acc, w0, w1, w2, w3, x0, x1, x2, x3, SWAP_AB: tl.constexpr, DOT_F32: tl.constexpr):
    """acc + sum_t plane_t(w) @ plane_t(x)^T (SWAP_AB) or sum_t plane_t(x) @ plane_t(w)^T."""
    if SWAP_AB:
        acc = mma(w0, tl.trans(x0), acc, DOT_F32)
        acc = mma(w1, tl.trans(x1), acc, DOT_F32)
        acc = mma(w2, tl.trans(x2), acc, DOT_F32)
        acc = mma(w3, tl.trans(x3), acc, DOT_F32)
    else:
        acc = mma(x0, tl.trans(w0), acc, DOT_F32)
        acc = mma(x1, tl.trans(w1), acc, DOT_F32)
        acc = mma(x2, tl.trans(w2), acc, DOT_F32)
        acc = mma(x3, tl.trans(w3), acc, DOT_F32)
    return acc


@triton.jit
def _w4a16_tiled_planes_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, KB, G, stride_xm, K_PER_SPLIT,
    GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr, HALVES: tl.constexpr, JOIN: tl.constexpr, ASM: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    pid_k, offs_m, offs_n, rm, rn, k_start = tile_coords(M, N, K_PER_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    dtype = x_ptr.dtype.element_ty
    BH: tl.constexpr = BLOCK_K // 2
    BH4: tl.constexpr = BLOCK_K // 4

    if HAS_ZEROS:
        z = tl.load(z_ptr + rn * G + (tl.minimum(k_start // GROUP, G - 1) if GROUP != -1 else 0)).to(tl.float32)
    else:
        z = tl.full((BLOCK_N,), 8.0, tl.float32)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K_PER_SPLIT, BLOCK_K)):
        k0 = k_start + kt * BLOCK_K
        if GROUP != -1:
            g = tl.minimum(k0 // GROUP, G - 1)  # clamp: masked tail tiles past K
            s_raw = tl.load(s_ptr + rn * G + g)  # dtype
            s = s_raw.to(tl.float32)
            if HAS_ZEROS:
                z = tl.load(z_ptr + rn * G + g).to(tl.float32)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :]
        if HALVES:  # 4 planes k = 4h + t from int16 halves (a whole number of halves per tile)
            offs_h = k0 // 4 + tl.arange(0, BH4)
            w_ptrs = qw_ptr + rn[:, None] * (KB // 2) + offs_h[None, :]
            w_mask = (offs_h < KB // 2)[None, :]
        else:  # 2 planes k = 2j, 2j + 1 from bytes
            offs_j = k0 // 2 + tl.arange(0, BH)
            w_ptrs = qw_ptr + rn[:, None] * KB + offs_j[None, :]
            w_mask = (offs_j < KB)[None, :]
        if EVEN_K:
            xt = tl.load(x_ptrs, eviction_policy="evict_last")
            b = tl.load(w_ptrs, eviction_policy="evict_first")
        else:  # past K: activations 0, so the (u - z) of the padding codes add nothing
            xt = tl.load(x_ptrs, mask=(offs_k < K)[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=w_mask, other=0)
        if JOIN:  # planes back in natural K order: acc^T += (w * s) @ x^T, nothing else in the loop
            # (opt-in, ops/wna16_dispatch.is_experimental: in some tiles' sm_90 SASS ptxas loads the next
            # codes into the A registers of a wgmma still in flight, e.g. 16 x 64 x 128 split 2)
            w = planes_in_k_order(b, z, dtype, ASM, HALVES, BLOCK_N, BLOCK_K)
            if GROUP != -1:
                w = scaled_weights(w, s_raw, dtype, DOT_F32)
            acc = mma(w, tl.trans(xt), acc, DOT_F32)
        else:
            if SWAP_AB:
                part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32) if GROUP != -1 else acc
            else:
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) if GROUP != -1 else acc
            if HALVES:
                w0, w1, w2, w3 = half_planes(b, z, dtype, ASM)
                x0, x1, x2, x3 = _split4(xt, BLOCK_M, BH4)
                part = _acc4(part, w0, w1, w2, w3, x0, x1, x2, x3, SWAP_AB, DOT_F32)
            else:
                lo, hi = nibble_planes(b, z, dtype, ASM)  # [BLOCK_N, BH] each: even / odd k
                x_even, x_odd = tl.split(tl.reshape(xt, (BLOCK_M, BH, 2)))  # [BLOCK_M, BH] each
                if SWAP_AB:  # acc^T [BLOCK_N, BLOCK_M] = w @ x^T: the weights are the MMA's A operand
                    part = mma(hi, tl.trans(x_odd), mma(lo, tl.trans(x_even), part, DOT_F32), DOT_F32)
                else:
                    part = mma(x_odd, tl.trans(hi), mma(x_even, tl.trans(lo), part, DOT_F32), DOT_F32)
            if GROUP != -1:
                acc += part * (s[:, None] if SWAP_AB else s[None, :])
            else:
                acc = part

    if SWAP_AB:
        acc = tl.trans(acc)
    store_tile(acc, s_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr, rn, offs_m, offs_n, pid_k, M, N, G, GROUP, HAS_BIAS, SPLIT_K)


def w4a16_tiled_planes(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None, bias: Tensor | None, group_size: int, cfg: dict) -> Tensor:
    """Launch with config ``cfg`` (keys of the tiled kernel: BLOCK_M / N / K, SPLIT_K, SWAP_AB,
    GROUP_M, num_warps, num_stages; arguments already checked; 4-bit, so K is even)."""
    m, k = x.shape
    n = qweight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()
    block_k, split_k, k_per_split, even_k = k_plan(k, cfg, group_size)
    halves = cfg.get("PLANES", 2) == 4
    join = bool(cfg.get("JOIN", False))
    if halves and (block_k < 64 or k % 4):
        raise ValueError(f"w4a16_tiled_planes: 4 planes need BLOCK_K >= 64 (16-deep MMAs per plane) and K % 4 == 0; got BLOCK_K={block_k}, K={k}")
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split_k)
    out, ws, counts = output_buffers(x, n, split_k, grid[0])
    launch(_w4a16_tiled_planes_kernel, grid,
        x, aligned_view(qweight, torch.int16) if halves else qweight, scales, zeros if zeros is not None else qweight,
        bias if bias is not None else scales, out, ws, counts, m, n, k, qweight.shape[1], scales.shape[1], x.stride(0), k_per_split,
        GROUP=group_size, HAS_ZEROS=zeros is not None, HAS_BIAS=bias is not None, SPLIT_K=split_k, EVEN_K=even_k,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k, GROUP_M=cfg.get("GROUP_M", 8),
        SWAP_AB=bool(cfg.get("SWAP_AB", False)) or join, HALVES=halves, JOIN=join, ASM=x.is_cuda, DOT_F32=not x.is_cuda,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", LAUNCH_OPTIONS["num_stages"]),
    )  # fmt: skip
    return out


def _configs(p: Problem, exhaustive: bool) -> list[dict]:
    gk = p.group_size if p.group_size > 0 else 256
    return _planes_configs(tiled_configs(p, exhaustive), m_bucket(p.m), p.k, gk, exhaustive)


def _planes_configs(tiled: list[dict], mb: int, k: int, gk: int, exhaustive: bool) -> list[dict]:
    """ops/wna16/tiled_planes.py configs: each decode / mid-M ``tiled`` config with the weights as
    the MMA's A operand, with 4 planes (int16 halves, BLOCK_K >= 64) and 2 planes (bytes);
    for M bucket >= 64 a few large weight-major tiles (wgmma's N side takes up to 256 tokens)."""
    four_ok = k % 4 == 0
    out = []
    for c in tiled:
        if c["BLOCK_M"] > 64:
            continue
        if four_ok and c["BLOCK_K"] >= 64:
            out.append({**c, "SWAP_AB": True, "PLANES": 4})
        out.append({**c, "SWAP_AB": True, "PLANES": 2})
        if exhaustive:
            out.append({**c, "SWAP_AB": False, "PLANES": 2})
        # JOIN: planes joined back to natural K order, the scale on the weights: one asynchronous
        # wgmma per slice (register A = weights, pipelined shared B = activations); opt-in
        # (_planes_opt_in: ptxas writes registers of wgmmas in flight in some of its tiles)
        join = {**c, "SWAP_AB": True, "JOIN": True, "SCALE_AFTER_DOT": False}
        out.append({**join, "PLANES": 4 if four_ok and c["BLOCK_K"] >= 64 else 2})
        if exhaustive and four_ok and c["BLOCK_K"] >= 64:
            out.append({**join, "PLANES": 2})
    if mb >= 64:
        for bm, bn, bk, warps, stages in weight_major_tiles(mb, exhaustive):
            bk = min(bk, gk)
            for planes in (4, 2) if exhaustive else (4,):
                if planes == 2 or (four_ok and bk >= 64):
                    out.append(
                        {
                            "BLOCK_M": bm,
                            "BLOCK_N": bn,
                            "BLOCK_K": bk,
                            "SPLIT_K": 1,
                            "GROUP_M": 8,
                            "SWAP_AB": True,
                            "JOIN": True,
                            "SCALE_AFTER_DOT": False,
                            "PLANES": planes,
                            "num_warps": warps,
                            "num_stages": stages,
                        }
                    )
        for bm, bn, bk, warps, stages in ((64, 128, 128, 4, 4), (128, 128, 128, 8, 3), (128, 256, 128, 8, 3)):
            bk = min(bk, gk)
            if bm <= 2 * mb:
                out.append(
                    {
                        "BLOCK_M": bm,
                        "BLOCK_N": bn,
                        "BLOCK_K": bk,
                        "SPLIT_K": 1,
                        "GROUP_M": 8,
                        "SWAP_AB": True,
                        "PLANES": 4 if four_ok and bk >= 64 else 2,
                        "num_warps": warps,
                        "num_stages": stages,
                    }
                )
    return out


def _opt_in(cfg: dict) -> str:
    if cfg.get("JOIN"):
        return (
            "JOIN: ptxas overwrites registers of wgmmas in flight in 5 of 20 g128 and 10 of 32 per-channel tiles "
            "(triton 3.6.0, qfuse bench sass); never a shipped pick"
        )
    return ""


def _run(cfg, x, qweight, scales, zeros, bias, bits, group_size):
    return w4a16_tiled_planes(x, qweight, scales, zeros, bias, group_size, cfg)


FAMILY = KernelFamily(
    "tiled_planes", "wna16/tiled_planes", lambda p: (True, "") if p.bits == 4 else (False, "4-bit only"), _configs, _run, opt_in=_opt_in
)
