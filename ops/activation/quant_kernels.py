"""Triton kernels for ``quant_per_token_int8`` and ``quant_per_tensor_int8`` (math: ops/quant_int8.py).

Per token: one program per row. A row of up to ``MAX_ROW_BLOCK`` elements is held
in registers (one load, amax, quantize, one store); a longer row is walked twice in
chunks (amax, then quantize). ``max`` is exact in any order, so the codes and
scales equal the reference bit for bit whatever the block shape.

Per tensor: elementwise over the flattened input, ``BLOCK`` elements a program.

Row launch configs are a fixed function of the row length (:func:`row_config`),
not autotuned: the norm kernels share it, and there the float sum of squares
depends on the block shape and warp count, so a fused kernel equals its unfused
composition only if both use the same config.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .._exact_triton import interpreting, nan_max, nan_maximum, next_power_of_2, per_token_scale, quantize_int8, quantize_int8_row
from .._launch import launch

# Rows up to this many elements stay in registers: 32768 fp32 over 32 warps is
# 32 values a thread. Longer rows are processed in LOOP_BLOCK chunks.
MAX_ROW_BLOCK = 32768
LOOP_BLOCK = 4096
PER_TENSOR_BLOCK = 4096


def row_config(h: int, max_row_block: int = MAX_ROW_BLOCK) -> dict:
    """Launch config for a one-program-per-row kernel over rows of ``h`` elements.

    ``max_row_block`` exists for tests: a small value forces the chunked path at small ``h``.
    """
    block = max(16, next_power_of_2(h))  # >= 16: the norm kernels tile a chunk as [BLOCK // 8, 8]
    single = block <= max_row_block
    if not single:
        block = min(LOOP_BLOCK, max(16, max_row_block // 4))
    if block <= 1024:
        warps = 4
    elif block <= 4096:
        warps = 8
    elif block <= 16384:
        warps = 16
    else:
        warps = 32
    return {"BLOCK": block, "SINGLE": single, "num_warps": warps}


def device_guard(t: torch.Tensor):
    """Launch on ``t``'s GPU (Triton launches on the current device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@triton.jit
def _quant_per_token_kernel(x_ptr, q_ptr, scale_ptr, H, BLOCK: tl.constexpr, SINGLE: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * H
    q_row = q_ptr + row * H
    offs = tl.arange(0, BLOCK)
    if SINGLE:
        mask = offs < H
        v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        scale = per_token_scale(nan_max(tl.abs(v), 0))
        tl.store(q_row + offs, quantize_int8_row(v, scale, INTERPRET), mask=mask)
    else:
        amax_acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, H, BLOCK):
            mask = start + offs < H
            v = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
            amax_acc = nan_maximum(amax_acc, tl.abs(v))
        scale = per_token_scale(nan_max(amax_acc, 0))
        for start in range(0, H, BLOCK):
            mask = start + offs < H
            v = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_row + start + offs, quantize_int8_row(v, scale, INTERPRET), mask=mask)
    tl.store(scale_ptr + row, scale)


@triton.jit
def _quant_per_tensor_kernel(x_ptr, scale_ptr, q_ptr, N, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < N
    scale = tl.load(scale_ptr)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + offs, quantize_int8(v, scale, INTERPRET), mask=mask)


def quant_per_token_int8_triton(x: torch.Tensor, max_row_block: int = MAX_ROW_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the per-token kernel; arguments already checked. Returns ``(xq, scale)``."""
    x = x.contiguous()
    h = x.shape[-1]
    m = x.numel() // h
    xq = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    if m > 0:
        cfg = row_config(h, max_row_block)
        with device_guard(x):
            launch(_quant_per_token_kernel, (m,),
                x, xq, scale, h, BLOCK=cfg["BLOCK"], SINGLE=cfg["SINGLE"], INTERPRET=interpreting(), num_warps=cfg["num_warps"]
            )  # fmt: skip
    return xq, scale


def quant_per_tensor_int8_triton(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Launch the per-tensor kernel; arguments already checked."""
    x = x.contiguous()
    xq = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    n = x.numel()
    if n > 0:
        with device_guard(x):
            launch(_quant_per_tensor_kernel, (triton.cdiv(n, PER_TENSOR_BLOCK),),
                x, scale, xq, n, BLOCK=PER_TENSOR_BLOCK, INTERPRET=interpreting(), num_warps=8
            )  # fmt: skip
    return xq
