"""Bit-exact float helpers for the Triton activation kernels (norm, SiLU, int8 quantize).

The reference kernels are plain torch; a Triton kernel that must give the *same
bits* has to reproduce each rounding step of torch's CUDA/CPU kernels:

* ``div_rn``: torch's ``a / b`` on float32 tensors is IEEE division; Triton's
  ``/`` compiles to an approximate division on CUDA, ``tl.math.div_rn`` to
  ``div.rn.f32`` (and to ``np.divide`` under the interpreter).
* ``round_half_even``: ``torch.round``. On the GPU ``libdevice.rint``
  (``cvt.rni``); the interpreter has no libdevice, so there the fp32 magic-number
  trick ``(y + 1.5 * 2**23) - 1.5 * 2**23``, exact round-half-to-even for
  ``|y| < 2**22`` (callers clamp to [-128, 127] first, which commutes with
  rounding because both bounds are integers).
* ``exp_f32``: torch's CUDA SiLU calls ``expf`` (``x / (1 + expf(-x))``); on the
  GPU ``libdevice.exp`` is the same ``__nv_expf``. ``tl.exp`` would lower to the
  approximate ``ex2.approx`` path and is used only under the interpreter (numpy).
* ``to_act_dtype``: fp32 -> fp16/bf16 with round-to-nearest-even. On the GPU a
  plain cast (``cvt.rn``). The Triton 3.7 interpreter truncates fp32 -> bf16
  (and its "rtne" mode rounds ties away from zero), so there bf16 is rounded with
  integer bit arithmetic first, which makes the truncating cast exact.

Every kernel takes a constexpr ``INTERPRET`` (see :func:`interpreting`) and passes
it down; the GPU branch is what production runs (covered by the ``gpu`` tests),
the other branch is what CI's interpreter tests run.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

# 1.5 * 2**23: adding it to |y| < 2**22 leaves no fraction bits, so the fp32 add
# rounds y to an integer with the FPU's round-half-to-even.
_MAGIC_RNE = 12582912.0


def interpreting() -> bool:
    """True when the Triton kernels run under the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(n)


@triton.jit
def div_rn(a, b):
    """IEEE round-to-nearest float32 division (torch's ``a / b``)."""
    return tl.math.div_rn(a, b)


@triton.jit
def round_half_even(y, INTERPRET: tl.constexpr):
    """``torch.round`` for float32 ``y`` with ``|y| < 2**22``."""
    if INTERPRET:
        r = (y + _MAGIC_RNE) - _MAGIC_RNE
    else:
        r = libdevice.rint(y)
    return r


@triton.jit
def exp_f32(x, INTERPRET: tl.constexpr):
    """``expf`` as torch's CUDA kernels call it."""
    if INTERPRET:
        e = tl.exp(x)
    else:
        e = libdevice.exp(x)
    return e


@triton.jit
def silu_mul_f32(g, u, INTERPRET: tl.constexpr):
    """``g / (1 + exp(-g)) * u`` in float32, the ops the MoE reference runs (``fused_moe.silu_and_mul``)."""
    return div_rn(g, 1.0 + exp_f32(-g, INTERPRET)) * u


@triton.jit
def bf16_rne_f32(x):
    """float32 ``x`` rounded to the nearest bf16 (ties to even), still as float32: integer bit
    ops, so the interpreter rounds as the GPU's ``cvt.rn`` / ``fma.rn.bf16x2`` do."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + (((bits >> 16) & 1) + 0x7FFF)
    return (bits & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def to_act_dtype(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 -> ``DTYPE`` (fp16 / bf16) with round-to-nearest-even, like torch's ``.to``."""
    if INTERPRET and DTYPE == tl.bfloat16:
        x = bf16_rne_f32(x)
    return x.to(DTYPE)


@triton.jit
def quantize_int8(v, scale, INTERPRET: tl.constexpr):
    """``clamp(round(v / scale), -128, 127)`` as int8, bit-exact to the torch reference."""
    y = div_rn(v, scale)
    y = tl.minimum(tl.maximum(y, -128.0), 127.0)
    return round_half_even(y, INTERPRET).to(tl.int8)


@triton.jit
def quantize_int8_row(v, scale, INTERPRET: tl.constexpr):
    """:func:`quantize_int8` for a row whose ``scale`` is ``per_token_scale(amax)`` of its own
    ``|v| <= amax`` (so ``|v / scale| <= 127 (1 + 2**-23)``), with three FP instructions per element
    instead of an IEEE division (~9 plus a slow-path check on sm_90). With ``inv = RN(1 / scale)``
    once per row (Markstein's correction)::

        q = RN(v * inv);   r = fma(-q, scale, v) (exact);   y = fma(r, inv, q)

    ``y`` equals ``RN(v / scale)`` for every normal ``v``; it can differ only where ``r`` is a
    subnormal (``|v / scale| < 2**-70``), whose code is 0 either way. Checked exhaustively on
    the CPU (tests/ops/test_exact_triton.py, a float64 model of the three steps: every finite
    bf16 / fp16 ``v`` with every finite bf16 / fp16 ``amax >= |v|``, ~1e9 pairs each: 0 codes
    differ) and on the GPU. An infinite ``scale`` (a row holding inf) gives ``inv = 0`` and
    the finite clamp ``FLT_MAX`` in ``r``, so ``y = 0`` for finite ``v`` and NaN for infinite ``v``,
    as ``v / inf``. The interpreter has no fused FMA (it rounds the product): there ``div_rn``."""
    if INTERPRET:
        y = div_rn(v, scale)
    else:
        inv = div_rn(1.0, scale)
        q = v * inv
        y = tl.fma(tl.fma(-q, tl.minimum(scale, 3.4028234663852886e38), v), inv, q)
    y = tl.minimum(tl.maximum(y, -128.0), 127.0)
    return round_half_even(y, INTERPRET).to(tl.int8)


@triton.jit
def nan_maximum(a, b):
    """``torch.maximum``: NaN if either is NaN. ``tl.maximum`` and ``tl.max`` default to PTX
    ``max.f32``, which returns the other operand: a NaN activation would get a finite scale."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def nan_max(x, axis):
    """``torch.amax`` over ``axis``: NaN if any element is NaN (see :func:`nan_maximum`)."""
    return tl.reduce(x, axis, nan_maximum)


@triton.jit
def per_token_scale(amax):
    """``max(amax, 1e-10) / 127`` in float32 with IEEE division; a NaN ``amax`` stays NaN (as the
    reference's ``clamp(min=1e-10)``), so a row holding NaN gets a NaN scale and NaN outputs."""
    return tl.where(amax != amax, amax, div_rn(tl.maximum(amax, 1e-10), 127.0))
