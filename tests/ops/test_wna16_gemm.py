"""Reference kernel of wna16_gemm (W8A16 / W4A16) against float64 dequantize-then-matmul."""

import itertools

import pytest
import torch

from qfuse.quantizers import quantize_wna16
from tests.helpers import ACT_DTYPES, DECODE_AND_ODD_M, decode_uint4

GROUPS = (-1, 32, 64, 128)


def _dequant64(qweight, scales, zeros, bits, group_size):
    """Independent float64 decode of the documented layout."""
    codes = decode_uint4(qweight) if bits == 4 else qweight.to(torch.int64)
    n, k = codes.shape
    g = k if group_size == -1 else group_size
    gidx = torch.arange(k) // g
    z = torch.full((n, k), 2 ** (bits - 1), dtype=torch.int64) if zeros is None else zeros.to(torch.int64)[:, gidx]
    return (codes - z).double() * scales.double()[:, gidx]


def _make(n, k, bits, group_size, symmetric, dtype, bias):
    w = torch.randn(n, k) * 0.05
    t = quantize_wna16(w, bits, group_size, symmetric, dtype)
    b = torch.randn(n).to(dtype) if bias else None
    return t["qweight"], t["scales"], t["zeros"], b


CASES = list(itertools.product((4, 8), GROUPS, (True, False)))


@pytest.mark.parametrize("bits,group_size,symmetric", CASES)
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_reference_matches_float64(bits, group_size, symmetric, dtype):
    n, k = 48, 256
    for m, bias in ((1, False), (7, True), (33, False)):
        qw, s, z, b = _make(n, k, bits, group_size, symmetric, dtype, bias)
        x = torch.randn(m, k).to(dtype)
        out = torch.ops.qfuse.wna16_gemm(x, qw, s, z, b, bits, group_size)
        assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()
        w64 = _dequant64(qw, s, z, bits, group_size).to(dtype).double()  # the weight, rounded as documented
        ref = x.double() @ w64.T + (b.double() if b is not None else 0)
        # float32 accumulation + one rounding of the output to the dtype
        tol = torch.finfo(dtype).eps * ref.abs() + 1e-4 * ref.abs().max()
        assert ((out.double() - ref).abs() <= tol).all()


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 128, True), (4, 32, False), (8, -1, True), (8, 64, False)])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("m", DECODE_AND_ODD_M)
def test_opcheck(bits, group_size, symmetric, dtype, m):
    qw, s, z, b = _make(24, 128, bits, group_size, symmetric, dtype, bias=m % 2 == 1)
    x = torch.randn(m, 128).to(dtype)
    torch.library.opcheck(torch.ops.qfuse.wna16_gemm.default, (x, qw, s, z, b, bits, group_size))


def test_rejects_bad_input():
    op = torch.ops.qfuse.wna16_gemm
    qw, s, z, b = _make(16, 128, 4, 64, False, torch.float16, bias=True)
    x = torch.randn(3, 128).half()
    with pytest.raises(ValueError, match="K=96 is not divisible by group_size=64"):
        qw2, s2, z2, _ = _make(16, 96, 4, 32, False, torch.float16, bias=False)
        op(torch.randn(3, 96).half(), qw2, s2[:, :1].contiguous(), None, None, 4, 64)
    with pytest.raises(ValueError, match="group_size must be one of"):
        op(x, qw, s, z, b, 4, 48)
    with pytest.raises(TypeError, match="qweight must be uint8, got int8"):
        op(x, qw.view(torch.int8), s, z, b, 4, 64)
    with pytest.raises(TypeError, match="scales must be float16, got bfloat16"):
        op(x, qw, s.bfloat16(), z, b, 4, 64)
    with pytest.raises(ValueError, match=r"qweight must have shape \(16, 64\) \(4-bit codes for K=128 from x\)"):
        op(x, torch.zeros(16, 128, dtype=torch.uint8), s, z, b, 4, 64)
    with pytest.raises(ValueError, match="x must be 2-D"):
        op(x[None], qw, s, z, b, 4, 64)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        op(x, qw, s, z, b, 3, 64)
    with pytest.raises(ValueError, match=r"zeros must have shape \(16, 2\)"):
        op(x, qw, s, z[:, :1], b, 4, 64)
    with pytest.raises(ValueError, match="must be contiguous"):
        op(x, qw.t().contiguous().t(), s, z, b, 4, 64)
    with pytest.raises(ValueError, match=r"bias must have shape \(16,\)"):
        op(x, qw, s, z, b[:8], 4, 64)
    with pytest.raises(ValueError, match="bias must be contiguous"):  # the CUDA kernels read it with unit stride
        op(x, qw, s, z, b.repeat(2)[::2], 4, 64)
    with pytest.raises(TypeError, match="x must be float16 or bfloat16, got float32"):
        op(x.float(), qw, s, z, b, 4, 64)
    with pytest.raises(ValueError, match="scales is on meta but x is on cpu"):
        op(x, qw, s.to("meta"), z, b, 4, 64)


def test_rejects_out_of_range_zero_points():
    """4-bit zero points of 16..255 (a uint8 holds them) are rejected on the reference path."""
    gen = torch.Generator().manual_seed(0)
    qw, s, z, b = _make(32, 256, 4, 64, False, torch.float16, bias=True)
    x = torch.randn(5, 256).half()
    bad = z.clone()
    flat = bad.view(-1)
    idx = torch.randperm(flat.numel(), generator=gen)[:3]
    flat[idx] = torch.randint(16, 256, (3,), dtype=torch.uint8, generator=gen)
    top = int(bad.max())
    msg = rf"qfuse\.wna16_gemm: zeros: 3 values outside \[0, 16\) for bits=4 \(max {top}\)"
    with pytest.raises(ValueError, match=msg):
        torch.ops.qfuse.wna16_gemm(x, qw, s, bad, b, 4, 64)


@pytest.mark.parametrize("bits", (4, 8))
def test_accepts_edge_zero_points(bits):
    """z = 0 and z = 2**bits - 1 are valid and follow the documented math."""
    qw, s, _, _ = _make(16, 128, bits, 32, False, torch.bfloat16, bias=False)
    x = torch.randn(3, 128).bfloat16()
    z = torch.randint(0, 2, s.shape, dtype=torch.uint8) * (2**bits - 1)  # only the two edge values
    out = torch.ops.qfuse.wna16_gemm(x, qw, s, z, None, bits, 32)
    ref = x.double() @ _dequant64(qw, s, z, bits, 32).to(torch.bfloat16).double().T
    tol = torch.finfo(torch.bfloat16).eps * ref.abs() + 1e-4 * ref.abs().max()
    assert ((out.double() - ref).abs() <= tol).all()


def test_check_wna16_zeros_helper():
    from qfuse.ops.wna16_gemm import check_wna16_zeros

    check_wna16_zeros(None, 4)  # symmetric
    check_wna16_zeros(torch.tensor([[0, 15]], dtype=torch.uint8), 4)
    check_wna16_zeros(torch.tensor([[0, 255]], dtype=torch.uint8), 8)  # every uint8 fits 8 bits
    check_wna16_zeros(torch.randint(0, 16, (8, 4), dtype=torch.int32), 4)  # before the cast to uint8
    with pytest.raises(ValueError, match=r"zeros: 1 values outside \[0, 16\) for bits=4 \(max 200\)"):
        check_wna16_zeros(torch.tensor([[3, 200]], dtype=torch.uint8), 4)
    # values a cast to uint8 would wrap into range (256 -> 0, -1 -> 255)
    with pytest.raises(ValueError, match=r"zeros: 2 values outside \[0, 256\) for bits=8 \(min -1, max 256\)"):
        check_wna16_zeros(torch.tensor([[-1, 7, 256]]), 8)
    with pytest.raises(TypeError, match="zeros must be an integer tensor, got float16"):
        check_wna16_zeros(torch.zeros(2, 2, dtype=torch.float16), 4)
    with pytest.raises(ValueError, match="bits must be 4 or 8, got 3"):
        check_wna16_zeros(None, 3)
