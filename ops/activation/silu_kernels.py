"""Triton kernel for ``silu_and_mul_quant`` (math: ops/silu_and_mul_quant.py), and the
unfused ``silu_and_mul`` it is compared with (same kernel, ``QUANT=False``).

Per row (one program each), f32 = float32 math, dtype(.) = round to the input dtype:

    h     = dtype(f32(dtype(g / (1 + expf(-g)))) * f32(up))     (g = f32(gate))
    QUANT: scale = max(max|h|, 1e-10) / 127; q = clamp(rne(h / scale), -128, 127)

This is torch's CUDA SiLU (``x / (1 + ::exp(-x))`` in float, rounded to the dtype)
followed by the dtype multiply, whose fp32 product of two 16-bit floats is exact and
so rounds once, as torch's does. On the GPU ``expf`` is ``libdevice.exp`` (the
``__nv_expf`` torch's kernel calls) and the division is ``div.rn``, so ``h``
matches torch's CUDA result bit for bit; no reduction precedes the quantization,
so the fused result then equals the reference exactly. Under the interpreter
``expf`` is numpy's, which can differ from torch's CPU (Sleef) expf in the last
fp32 bit; that moves ``h`` by one dtype ulp only when the fp32 SiLU lies within
that bit of a rounding boundary (the tests measure how often).

Rows longer than ``MAX_ROW_BLOCK`` are walked twice in chunks (amax, then quantize),
recomputing ``h`` in the second pass; the CUDA op may also pick that walk for shorter
rows, or split each row over many programs in two launches (``SPLIT_ROW``: chunk ``h`` and
chunk maxima, then the row's scale from the maxima and the chunk's codes), which puts a
decode batch's few rows on many SMs (``quant_candidates``: the codes do not depend on the
config).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._autotune import m_bucket, pick_config
from .._exact_triton import div_rn, exp_f32, interpreting, nan_max, nan_maximum, per_token_scale, quantize_int8_row, to_act_dtype
from .._launch import launch
from .quant_kernels import MAX_ROW_BLOCK, device_guard, row_config


@triton.jit
def _silu_mul(g_ptr, u_ptr, idx, mask, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    g = tl.load(g_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    silu = to_act_dtype(div_rn(g, 1.0 + exp_f32(-g, INTERPRET)), DTYPE, INTERPRET)
    return to_act_dtype(silu.to(tl.float32) * u, DTYPE, INTERPRET)


@triton.jit
def _silu_and_mul_kernel(
    g_ptr, u_ptr, out_ptr, q_ptr, scale_ptr, H, stride_g, stride_u,
    QUANT: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    DTYPE: tl.constexpr = g_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    base = row * H  # the outputs' row
    g_ptr += row * stride_g  # the inputs' rows: views of one gate_up output have a row stride of 2H
    u_ptr += row * stride_u
    offs = tl.arange(0, BLOCK)
    if SINGLE:
        mask = offs < H
        h = _silu_mul(g_ptr, u_ptr, offs, mask, DTYPE, INTERPRET)
        if QUANT:
            hf = h.to(tl.float32)
            scale = per_token_scale(nan_max(tl.abs(hf), 0))
            tl.store(q_ptr + base + offs, quantize_int8_row(hf, scale, INTERPRET), mask=mask)
            tl.store(scale_ptr + tl.program_id(0), scale)
        else:
            tl.store(out_ptr + base + offs, h, mask=mask)
    elif QUANT:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, H, BLOCK):
            idx = start + offs
            mask = idx < H
            amax = nan_maximum(amax, tl.abs(_silu_mul(g_ptr, u_ptr, idx, mask, DTYPE, INTERPRET).to(tl.float32)))
        scale = per_token_scale(nan_max(amax, 0))
        for start in range(0, H, BLOCK):
            idx = start + offs
            mask = idx < H
            hf = _silu_mul(g_ptr, u_ptr, idx, mask, DTYPE, INTERPRET).to(tl.float32)
            tl.store(q_ptr + base + idx, quantize_int8_row(hf, scale, INTERPRET), mask=mask)
        tl.store(scale_ptr + tl.program_id(0), scale)
    else:
        for start in range(0, H, BLOCK):
            idx = start + offs
            mask = idx < H
            tl.store(out_ptr + base + idx, _silu_mul(g_ptr, u_ptr, idx, mask, DTYPE, INTERPRET), mask=mask)


@triton.jit
def _silu_mul_chunk_kernel(g_ptr, u_ptr, h_ptr, amax_ptr, H, S, stride_g, stride_u, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """Split-row pass 1, program (row, s): ``h`` of chunk s (stored in the input dtype) and its amax."""
    DTYPE: tl.constexpr = g_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < H
    h = _silu_mul(g_ptr + row * stride_g, u_ptr + row * stride_u, idx, mask, DTYPE, INTERPRET)  # 0 past H
    tl.store(h_ptr + row * H + idx, h, mask=mask)
    tl.store(amax_ptr + row * S + tl.program_id(1), nan_max(tl.abs(h.to(tl.float32)), 0))


@triton.jit
def _quant_chunk_kernel(h_ptr, amax_ptr, q_ptr, scale_ptr, H, S, BLOCK: tl.constexpr, S_BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """Split-row pass 2, program (row, s): the row's scale from its S chunk maxima (max is exact
    in any order), then chunk s quantized."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, S_BLOCK)
    amax = nan_max(tl.load(amax_ptr + row * S + offs_s, mask=offs_s < S, other=0.0), 0)
    scale = per_token_scale(amax)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < H
    hf = tl.load(h_ptr + row * H + idx, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + row * H + idx, quantize_int8_row(hf, scale, INTERPRET), mask=mask)
    if tl.program_id(1) == 0:
        tl.store(scale_ptr + row, scale)


def quant_candidates(h: int, m: int = 1) -> list[dict]:
    """Configs for the fused kernel. Its result does not depend on the config (no float
    reduction precedes the quantization: max is exact), so it is tuned per M bucket:
    the register-resident row, the same with twice the warps, a two-pass chunked walk with few
    registers, many programs per SM and the second pass served from L2, and split rows. The
    first is what runs untuned (``QFUSE_AUTOTUNE=0``, a CUDA-graph capture with no stored
    pick): split rows past H = 2048, the H200's pick at H = 14336 for every M bucket measured
    (1, 16: 1024-wide chunks; 256, 4096: 2048-wide), else the register-resident row (its pick
    at H = 4096)."""
    first = row_config(h)
    cands = [first]
    if first["SINGLE"] and first["num_warps"] < 32 and first["BLOCK"] >= 2048:
        cands.append({**first, "num_warps": first["num_warps"] * 2})
    if h > 2048:
        cands.append({"BLOCK": 2048, "SINGLE": False, "num_warps": 4})
    # split rows (two launches, chunks of one row on many SMs): at decode M the one-program-per-row
    # kernel leaves all but M SMs idle; H = 14336, M = 1 took 5.8 us on one SM (BENCHMARKS.md)
    if h > 2048:
        split = [{"BLOCK": b, "SPLIT_ROW": True, "num_warps": 4} for b in (1024, 2048)]
        cands = (split if m_bucket(m) <= 16 else split[::-1]) + cands
    return cands


def _run(gate, up, out, xq, scale, m, h, quant, cfg):
    dummy = gate  # stands in for pointers a variant never touches
    if cfg.get("SPLIT_ROW"):  # a quant_candidates config: the fused op only
        assert quant, cfg
        chunks = triton.cdiv(h, cfg["BLOCK"])
        hbuf = torch.empty((m, h), dtype=gate.dtype, device=gate.device)
        amax = torch.empty((m, chunks), dtype=torch.float32, device=gate.device)
        launch(_silu_mul_chunk_kernel, (m, chunks),
               gate, up, hbuf, amax, h, chunks, gate.stride(0), up.stride(0), BLOCK=cfg["BLOCK"], INTERPRET=interpreting(), num_warps=cfg["num_warps"])  # fmt: skip
        launch(_quant_chunk_kernel, (m, chunks),
               hbuf, amax, xq, scale, h, chunks, BLOCK=cfg["BLOCK"], S_BLOCK=max(2, triton.next_power_of_2(chunks)),
               INTERPRET=interpreting(), num_warps=cfg["num_warps"])  # fmt: skip
        return
    launch(_silu_and_mul_kernel, (m,),
        gate, up, out if out is not None else dummy, xq if xq is not None else dummy,
        scale if scale is not None else dummy, h, gate.stride(0), up.stride(0),
        QUANT=quant, BLOCK=cfg["BLOCK"], SINGLE=cfg["SINGLE"], INTERPRET=interpreting(), num_warps=cfg["num_warps"],
    )  # fmt: skip


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t [..., H]`` as ``[M, H]`` rows of unit element stride, copied only where no such view
    exists. The gate and up halves of a stacked gate_up projection's output are views with a row
    stride of 2H: a copy of each cost 74 us a layer at a 2048-token prefill (H 14336, H100)."""
    h = t.shape[-1]
    if t.stride(-1) == 1 or h == 1:
        try:
            return t.view(-1, h)
        except RuntimeError:  # leading dimensions that no single row stride spans
            pass
    return t.contiguous().view(-1, h)


def _launch(gate: torch.Tensor, up: torch.Tensor, quant: bool, max_row_block: int, tune: bool = False):
    shape = gate.shape
    gate, up = _rows(gate), _rows(up)
    h = gate.shape[-1]
    m = gate.shape[0]
    out = None if quant else torch.empty(shape, dtype=gate.dtype, device=gate.device)
    xq = torch.empty(shape, dtype=torch.int8, device=gate.device) if quant else None
    scale = torch.empty((*shape[:-1], 1), dtype=torch.float32, device=gate.device) if quant else None
    if m > 0:
        cfg = row_config(h, max_row_block)
        with device_guard(gate):
            if tune:
                cfg = pick_config(
                    "silu_and_mul_quant", (m_bucket(m), h, str(gate.dtype)), quant_candidates(h, m),
                    lambda c: _run(gate, up, out, xq, scale, m, h, quant, c), gate.device,
                )  # fmt: skip
            _run(gate, up, out, xq, scale, m, h, quant, cfg)
    return out, xq, scale


def silu_and_mul_triton(gate: torch.Tensor, up: torch.Tensor, max_row_block: int = MAX_ROW_BLOCK) -> torch.Tensor:
    """``silu(gate) * up`` in the input dtype (the unfused first half; not a registered op)."""
    return _launch(gate, up, False, max_row_block)[0]


def silu_and_mul_quant_triton(
    gate: torch.Tensor, up: torch.Tensor, max_row_block: int = MAX_ROW_BLOCK, tune: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel. ``tune=True`` (the CUDA op) picks the config per (M bucket, H, dtype)
    with ``pick_config``; otherwise the fixed ``row_config`` (tests, interpreter)."""
    _, xq, scale = _launch(gate, up, True, max_row_block, tune)
    return xq, scale
