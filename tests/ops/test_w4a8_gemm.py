"""Reference kernel of w4a8_gemm: exact int32 accumulator, per-channel and group-128."""

import pytest
import torch

from qfuse.quantizers import quantize_w4a8
from tests.helpers import ACT_DTYPES, DECODE_AND_ODD_M, decode_uint4, random_int8


def _w_int64(qweight, group_scale, group_size):
    q = decode_uint4(qweight) - 8
    if group_scale is not None:
        q = q * group_scale.to(torch.int64)[:, torch.arange(q.shape[1]) // group_size]
    return q


@pytest.mark.parametrize("group_size", [-1, 128, 64, 32])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("per_token", [True, False])
def test_reference_matches_float64(group_size, dtype, per_token):
    n, k = 40, 384
    t = quantize_w4a8(torch.randn(n, k), group_size)
    qw, ws, gs = t["qweight"], t["w_scale"], t["group_scale"]
    for m in DECODE_AND_ODD_M:
        xq = random_int8(m, k)
        xs = torch.rand(m, 1) * 0.02 + 1e-3 if per_token else torch.tensor([0.013])
        b = torch.randn(n).to(dtype) if m % 2 else None
        out = torch.ops.qfuse.w4a8_gemm(xq, xs, qw, ws, gs, b, group_size, dtype)
        assert out.shape == (m, n) and out.dtype == dtype
        # fake-quant reference: dequantize the weight in float64, then matmul
        w64 = _w_int64(qw, gs, group_size).double() * ws.double().reshape(-1, 1)
        ref = (xq.double() * xs.double().reshape(-1, 1)) @ w64.T + (b.double() if b is not None else 0)
        tol = torch.finfo(dtype).eps * ref.abs() + 1e-6 * ref.abs().max()
        assert ((out.double() - ref).abs() <= tol).all()


def test_accumulator_exact_at_extremes():
    # all codes at -8 times group scale 16 (w_int = -128) against x = -128: the largest
    # magnitude products; with unit scales the fp32 epilogue keeps the int exactly (< 2**24).
    n, k, m = 8, 512, 3
    qw = torch.zeros(n, k // 2, dtype=torch.uint8)  # u = 0 -> q = -8
    gs = torch.full((n, k // 128), 16, dtype=torch.int8)
    xq = torch.full((m, k), -128, dtype=torch.int8)
    out = torch.ops.qfuse.w4a8_gemm(xq, torch.ones(1), qw, torch.ones(n), gs, None, 128, torch.bfloat16)
    assert out.float().unique().tolist() == [float(k * 128 * 128)]  # 2**23: exact in bf16
    from qfuse.ops._int_matmul import int8_matmul_nt
    from qfuse.ops.w4a8_gemm import w4a8_int_weight

    assert (int8_matmul_nt(xq, w4a8_int_weight(qw, gs, 128)) == k * 128 * 128).all()


@pytest.mark.parametrize("group_size", [-1, 128, 32])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("m", DECODE_AND_ODD_M)
def test_opcheck(group_size, dtype, m):
    n, k = 24, 256
    t = quantize_w4a8(torch.randn(n, k), group_size)
    xs = torch.rand(m, 1) if m % 2 else torch.rand(1)
    b = torch.randn(n).to(dtype) if m % 3 else None
    args = (random_int8(m, k), xs, t["qweight"], t["w_scale"], t["group_scale"], b, group_size, dtype)
    torch.library.opcheck(torch.ops.qfuse.w4a8_gemm.default, args)


def test_rejects_bad_input():
    op = torch.ops.qfuse.w4a8_gemm
    t = quantize_w4a8(torch.randn(8, 256), 128)
    qw, ws, gs = t["qweight"], t["w_scale"], t["group_scale"]
    xq, xs, hf = random_int8(2, 256), torch.rand(2, 1), torch.float16
    with pytest.raises(ValueError, match="group_size must be -1 .per-channel., 128, 64 or 32"):
        op(xq, xs, qw, ws, gs, None, 96, hf)
    with pytest.raises(ValueError, match="w_scale must be contiguous"):
        op(xq, xs, qw, ws.repeat(2)[::2], gs, None, 128, hf)
    with pytest.raises(ValueError, match="bias must be contiguous"):
        op(xq, xs, qw, ws, gs, torch.zeros(16, dtype=hf)[::2], 128, hf)
    with pytest.raises(ValueError, match=r"group_scale must have shape \(8, 4\)"):
        op(xq, xs, qw, ws, gs, None, 64, hf)
    with pytest.raises(ValueError, match="needs group_scale"):
        op(xq, xs, qw, ws, None, None, 128, hf)
    with pytest.raises(ValueError, match="group_scale must be None for per-channel"):
        op(xq, xs, qw, ws, gs, None, -1, hf)
    with pytest.raises(TypeError, match="group_scale must be int8"):
        op(xq, xs, qw, ws, gs.float(), None, 128, hf)
    with pytest.raises(ValueError, match=r"qweight must have shape \(8, 128\)"):
        op(xq, xs, qw[:, :64].contiguous(), ws, gs, None, 128, hf)
    with pytest.raises(ValueError, match="K=255 must be even"):
        op(random_int8(2, 255), xs, qw, ws, gs, None, 128, hf)
    with pytest.raises(ValueError, match="K=320 is not divisible by group_size=128"):
        op(random_int8(2, 320), xs, torch.zeros(8, 160, dtype=torch.uint8), ws, torch.ones(8, 2, dtype=torch.int8), None, 128, hf)
    with pytest.raises(ValueError, match=r"group_scale values must lie in \[1, 16\]; 16 of 16 do not \(min 17, max 17\)"):
        op(xq, xs, qw, ws, torch.full_like(gs, 17), None, 128, hf)
    one_zero = gs.clone()
    one_zero[3, 1] = 0
    with pytest.raises(ValueError, match=r"; 1 of 16 do not \(min 0, max"):
        op(xq, xs, qw, ws, one_zero, None, 128, hf)
