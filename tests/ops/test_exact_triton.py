"""ops/_exact_triton.py: the per-row quantization without a per-element IEEE division.

``quantize_int8_row`` replaces ``RN(v / scale)`` by ``q = RN(v * inv)``, ``r = fma(-q, scale, v)``,
``y = fma(r, inv, q)`` with ``inv = RN(1 / scale)`` on the GPU. CPU: a float64 model of those
three steps (each fma rounded once, exactly) against numpy's IEEE float32 division, for every
finite bf16 / fp16 ``v`` with ``|v| <= amax`` and every positive finite ``amax`` (~1e9 pairs
per dtype). GPU: the CUDA op on rows holding every finite value clamped to ``+-amax``, for
every positive finite ``amax``.
"""

import numpy as np
import pytest
import torch

from qfuse.ops.quant_int8 import quant_per_token_int8_ref
from tests.helpers import ACT_DTYPES

f32, f64 = np.float32, np.float64


def _finite_values(dtype: torch.dtype) -> np.ndarray:
    """Every finite value of a 16-bit float type, as float32."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    vals = bits.view(dtype).float().numpy()
    return np.unique(vals[np.isfinite(vals)])


def _fma_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """RN32(a + b) for float64 ``a``, ``b`` whose exact sum need not fit a float64: TwoSum
    gives the exact error, which decides the float32 rounding where ``a + b`` fell on a tie."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    y = s.astype(f32)
    y64 = y.astype(f64)
    other = np.nextafter(y, np.where(s > y64, f32(np.inf), f32(-np.inf))).astype(f64)
    tie = (s == (y64 + other) / 2) & (err != 0)
    fixed = np.where(err > 0, np.maximum(y64, other), np.minimum(y64, other))
    return np.where(tie, fixed, y64).astype(f32)


def _markstein_quotient(v: np.ndarray, scale: f32) -> np.ndarray:
    inv = f32(f32(1.0) / scale)
    q = (v.astype(f64) * f64(inv)).astype(f32)  # the product of two floats is exact in float64
    r = (v.astype(f64) - q.astype(f64) * f64(scale)).astype(f32)  # exact before the one rounding
    return _fma_sum(r.astype(f64) * f64(inv), q.astype(f64))


def _codes(y: np.ndarray) -> np.ndarray:
    return np.clip(np.round(y), -128, 127)  # np.round: half to even, as torch.round


def _check(dtype: torch.dtype, amaxes: np.ndarray) -> None:
    vals = _finite_values(dtype)
    for amax in amaxes:
        scale = f32(max(f32(amax), f32(1e-10)) / f32(127))  # IEEE float32 division, as the op
        v = vals[np.abs(vals) <= amax]
        ref = v / np.full_like(v, scale)
        y = _markstein_quotient(v, scale)
        assert np.array_equal(_codes(y), _codes(ref)), f"codes differ at amax={amax}"
        normal = np.abs(ref) >= 2.0**-60  # below, r can be subnormal: y may differ, the code is 0
        assert np.array_equal(y[normal], ref[normal]), f"quotients differ at amax={amax}"


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_row_quotient_model_equals_ieee_division(dtype):
    """Every finite v against every 16th positive finite amax and every amax of the binades where
    the float32 scale stops scaling with amax: at the 1e-10 floor, the smallest and the largest."""
    vals = _finite_values(dtype)
    amaxes = vals[vals > 0]
    edges = (amaxes < 4e-10) | (amaxes >= amaxes[-1] / 4) | (amaxes <= amaxes[0] * 4)
    _check(dtype, np.unique(np.concatenate([amaxes[::16], amaxes[edges]])))


@pytest.mark.slow  # ~1e9 (v, amax) pairs, 30-40 s per dtype on CI's cores: `pytest -m slow`
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_row_quotient_model_equals_ieee_division_exhaustively(dtype):
    vals = _finite_values(dtype)
    _check(dtype, vals[vals > 0])  # every positive finite amax


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_gpu_per_token_codes_every_value_pair(dtype):
    """Rows of every finite value clamped to +-amax, one row per positive finite amax: every
    (v, amax) pair the op can meet, through the CUDA kernel (chunked path: the rows are long)."""
    vals = torch.from_numpy(_finite_values(dtype)).cuda()
    amaxes = vals[vals > 0]
    for chunk in amaxes.split(2048):
        x = torch.maximum(torch.minimum(vals[None, :], chunk[:, None]), -chunk[:, None]).to(dtype)
        q, s = torch.ops.qfuse.quant_per_token_int8(x)
        qr, sr = quant_per_token_int8_ref(x)
        assert torch.equal(s, sr)
        assert torch.equal(q, qr), f"codes differ at {(q != qr).sum().item()} of {q.numel()}"


@pytest.mark.gpu
def test_gpu_per_token_row_with_inf():
    """A row holding inf has scale inf: its finite values quantize to 0, as ``v / inf`` does."""
    x = torch.randn(3, 4096, device="cuda").bfloat16()
    x[1, 7] = float("inf")
    q, s = torch.ops.qfuse.quant_per_token_int8(x)
    qr, sr = quant_per_token_int8_ref(x)
    assert torch.equal(s, sr) and s[1].item() == float("inf")
    finite = torch.isfinite(x)
    assert torch.equal(q[finite], qr[finite]) and (q[1][finite[1]] == 0).all()
