"""Triton kernel for the RMSNorm family (math: ops/rms_norm.py), optionally fused with
the residual add before it and the per-token int8 quantization after it.

One kernel, ``_rms_norm_kernel``, with two constexpr switches:

    HAS_RESIDUAL   s = dtype(x + residual) is stored as residual_out and normalized
    QUANT          the normalized row is quantized (codes + scale) instead of stored

so ``rms_norm`` / ``fused_add_rms_norm`` are the unfused kernels and
``rms_norm_quant`` / ``fused_add_rms_norm_quant`` the fused ones. The sum of squares
is the only step whose float result depends on evaluation order (a different order
can move ``mean(x^2)`` by an ulp, hence rsqrt, hence an output bit, hence a code).
Fused and unfused launches run the same code with the same config
(``row_config(H)``: block and warp count fixed by H, never autotuned, so the result
of a row does not depend on the batch size either), the same tile shape and no FMA
contraction (see ``VEC`` below), so
``rms_norm_quant(x) == quant_per_token_int8(rms_norm(x))`` bit for bit on one device.
Against the plain-torch reference the sum order differs (torch's reduction tree,
and CUDA's mean multiplies by fl(1/H) where this kernel and torch's CPU mean divide),
so an output element can differ by up to 2 units in the last place of its dtype
(rare; see ops/rms_norm.py for the measured rate).

Per row (one program each), with f32 = float32 math and dtype(.) = round to x.dtype:

    s     = x                     or dtype(f32(x) + f32(residual))
    inv   = rsqrt(sum(f32(s)^2) / H + eps)
    out   = dtype(f32(w) * f32(dtype(f32(s) * inv)))
    QUANT: scale = max(max|out|, 1e-10) / 127; q = clamp(rne(out / scale), -128, 127)

Rows longer than ``MAX_ROW_BLOCK`` are walked in chunks: pass 1 sums squares, pass 2
(QUANT only) finds the amax, the last pass writes; later passes recompute ``s``
from the inputs rather than re-reading residual_out, so no pass reads what another
thread of the program wrote.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._exact_triton import div_rn, interpreting, per_token_scale, quantize_int8_row, to_act_dtype
from .._launch import launch
from .quant_kernels import MAX_ROW_BLOCK, device_guard, row_config

# Every kernel views a row chunk as a [BLOCK // 8, 8] tile. Why: the float sum of
# squares is grouped by how Triton lays the tile out over threads, and Triton picks
# that layout from the memory ops. A 1-D row let the int8 store of the fused kernel
# (16 codes = 16 bytes a thread) change the grouping from the unfused kernel's
# (8 halves = 16 bytes a thread), and fused != unfused in ~1e-3 of the rows on the
# H200. With an inner dimension of 8, every load and store (16-bit: 16 bytes, int8:
# 8 bytes) asks for the same 8-wide vector, so all four variants compile to the same
# layout and summation order (checked in the TTGIR of each variant, triton 3.7.1,
# sm_90; the GPU tests check the result). The PTX of the sum agrees for every H tested on
# triton 3.7.1, 3.8.0 and 3.9.0 except H = 520 / 1000 / 1016 (multiples of 8 but not 16, one
# 1024 block on 4 warps), where rms_norm_quant without a residual sums in another order
# (tests/ops/test_rms_norm_kernel.py). FMA contraction is switched off for these
# kernels (``enable_fp_fusion=False``) so that whether ``acc + x*x`` becomes an fma
# cannot differ between variants either; it only touches the sum (no other step
# multiplies and adds).
VEC: tl.constexpr = tl.constexpr(8)


@triton.jit
def _row_tile(BLOCK: tl.constexpr):
    """Offsets of a [BLOCK // 8, 8] tile of one row chunk (see ``VEC``)."""
    return tl.arange(0, BLOCK // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]


@triton.jit
def _sum_squares(sf):
    """Sum of squares of a [BLOCK // 8, 8] tile: each group of 8 first, then the groups."""
    return tl.sum(tl.sum(sf * sf, axis=1), axis=0)


@triton.jit
def _load_s(x_ptr, res_ptr, idx, mask, HAS_RESIDUAL: tl.constexpr, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """The row values to normalize: x, or dtype(x + residual)."""
    xv = tl.load(x_ptr + idx, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        rv = tl.load(res_ptr + idx, mask=mask, other=0.0)
        xv = to_act_dtype(xv.to(tl.float32) + rv.to(tl.float32), DTYPE, INTERPRET)
    return xv


@triton.jit
def _normalize(sf, inv, w_ptr, offs, mask, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """``dtype(w * dtype(s * inv))``; the product of two 16-bit floats is exact in fp32."""
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = to_act_dtype(sf * inv, DTYPE, INTERPRET).to(tl.float32)
    return to_act_dtype(w * y, DTYPE, INTERPRET)


@triton.jit
def _inf_row_scale(x_ptr, res_ptr, offs, H, scale, HAS_RESIDUAL: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """The scale of a row whose sum of squares is inf (``inv == 0``): NaN if the row holds a +-inf
    (its output is inf * 0 = NaN, which max.f32 drops from the amax), else ``scale`` (a finite row
    whose squares overflowed: every output 0). Reloads the row, only in this rare case: the check
    on the common path, or NaN-propagating max, reordered the loads before the rsqrt
    (tests/ops/test_rms_norm_kernel.py, sum order)."""
    inf_seen = tl.zeros([BLOCK // VEC], dtype=tl.int32)
    for start in range(0, H, BLOCK):
        idx = start + offs
        sf = _load_s(x_ptr, res_ptr, idx, idx < H, HAS_RESIDUAL, DTYPE, INTERPRET).to(tl.float32)
        inf_seen = tl.maximum(inf_seen, tl.max((tl.abs(sf) == float("inf")).to(tl.int32), axis=1))
    return tl.where(tl.max(inf_seen, axis=0) > 0, float("nan"), scale)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, q_ptr, scale_ptr, H, H_f32, eps,
    HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    base = tl.program_id(0).to(tl.int64) * H
    offs = _row_tile(BLOCK)
    if SINGLE:
        mask = offs < H
        s = _load_s(x_ptr + base, res_ptr + base, offs, mask, HAS_RESIDUAL, DTYPE, INTERPRET)
        if HAS_RESIDUAL:
            tl.store(res_out_ptr + base + offs, s, mask=mask)
        sf = s.to(tl.float32)
        inv = tl.math.rsqrt(div_rn(_sum_squares(sf), H_f32) + eps)
        o = _normalize(sf, inv, w_ptr, offs, mask, DTYPE, INTERPRET)
        if QUANT:
            of = o.to(tl.float32)
            scale = per_token_scale(tl.max(tl.max(tl.abs(of), axis=1), axis=0))
            if inv == 0.0:
                scale = _inf_row_scale(x_ptr + base, res_ptr + base, offs, H, scale, HAS_RESIDUAL, DTYPE, BLOCK, INTERPRET)
            tl.store(q_ptr + base + offs, quantize_int8_row(of, scale, INTERPRET), mask=mask)
            tl.store(scale_ptr + tl.program_id(0), scale)
        else:
            tl.store(out_ptr + base + offs, o, mask=mask)
    else:
        acc = tl.zeros([BLOCK // VEC], dtype=tl.float32)
        for start in range(0, H, BLOCK):
            idx = start + offs
            mask = idx < H
            s = _load_s(x_ptr + base, res_ptr + base, idx, mask, HAS_RESIDUAL, DTYPE, INTERPRET)
            if HAS_RESIDUAL:
                tl.store(res_out_ptr + base + idx, s, mask=mask)
            sf = s.to(tl.float32)
            acc += tl.sum(sf * sf, axis=1)
        inv = tl.math.rsqrt(div_rn(tl.sum(acc, axis=0), H_f32) + eps)
        if QUANT:
            amax = tl.zeros([BLOCK // VEC, VEC], dtype=tl.float32)
            for start in range(0, H, BLOCK):
                idx = start + offs
                mask = idx < H
                sf = _load_s(x_ptr + base, res_ptr + base, idx, mask, HAS_RESIDUAL, DTYPE, INTERPRET).to(tl.float32)
                o = _normalize(sf, inv, w_ptr, idx, mask, DTYPE, INTERPRET)
                amax = tl.maximum(amax, tl.abs(o.to(tl.float32)))
            # max.f32 drops NaN, and amax starts at 0: a row holding NaN (so a NaN sum of squares,
            # and every output NaN) gets a NaN scale as in the reference, not 1e-10 / 127
            scale = tl.where(inv != inv, inv, per_token_scale(tl.max(tl.max(amax, axis=1), axis=0)))
            if inv == 0.0:
                scale = _inf_row_scale(x_ptr + base, res_ptr + base, offs, H, scale, HAS_RESIDUAL, DTYPE, BLOCK, INTERPRET)
            for start in range(0, H, BLOCK):
                idx = start + offs
                mask = idx < H
                sf = _load_s(x_ptr + base, res_ptr + base, idx, mask, HAS_RESIDUAL, DTYPE, INTERPRET).to(tl.float32)
                o = _normalize(sf, inv, w_ptr, idx, mask, DTYPE, INTERPRET)
                tl.store(q_ptr + base + idx, quantize_int8_row(o.to(tl.float32), scale, INTERPRET), mask=mask)
            tl.store(scale_ptr + tl.program_id(0), scale)
        else:
            for start in range(0, H, BLOCK):
                idx = start + offs
                mask = idx < H
                sf = _load_s(x_ptr + base, res_ptr + base, idx, mask, HAS_RESIDUAL, DTYPE, INTERPRET).to(tl.float32)
                tl.store(out_ptr + base + idx, _normalize(sf, inv, w_ptr, idx, mask, DTYPE, INTERPRET), mask=mask)


def _launch(x, residual, weight, eps, quant: bool, max_row_block: int):
    """Allocate the outputs and run ``_rms_norm_kernel``; returns (out, residual_out, xq, scale), unused ones None."""
    x = x.contiguous()
    weight = weight.contiguous()
    residual = residual.contiguous() if residual is not None else None
    h = x.shape[-1]
    m = x.numel() // h
    out = None if quant else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    xq = torch.empty(x.shape, dtype=torch.int8, device=x.device) if quant else None
    scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device) if quant else None
    if m > 0:
        cfg = row_config(h, max_row_block)
        dummy = x  # stands in for pointers a variant never touches
        with device_guard(x):
            launch(_rms_norm_kernel, (m,),
                x, residual if residual is not None else dummy, weight,
                out if out is not None else dummy, res_out if res_out is not None else dummy,
                xq if xq is not None else dummy, scale if scale is not None else dummy,
                h, float(h), float(eps),
                HAS_RESIDUAL=residual is not None, QUANT=quant, BLOCK=cfg["BLOCK"], SINGLE=cfg["SINGLE"],
                INTERPRET=interpreting(), num_warps=cfg["num_warps"],
                enable_fp_fusion=False,  # no fmul+fadd -> fma contraction: the sum's rounding is fixed by the IR alone
            )  # fmt: skip
    return out, res_out, xq, scale


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, max_row_block: int = MAX_ROW_BLOCK) -> torch.Tensor:
    return _launch(x, None, weight, eps, False, max_row_block)[0]


def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, max_row_block: int = MAX_ROW_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    out, res_out, _, _ = _launch(x, residual, weight, eps, False, max_row_block)
    return out, res_out


def rms_norm_quant_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, max_row_block: int = MAX_ROW_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, xq, scale = _launch(x, None, weight, eps, True, max_row_block)
    return xq, scale


def fused_add_rms_norm_quant_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, max_row_block: int = MAX_ROW_BLOCK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _, res_out, xq, scale = _launch(x, residual, weight, eps, True, max_row_block)
    return xq, scale, res_out
