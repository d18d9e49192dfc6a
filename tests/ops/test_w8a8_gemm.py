"""Reference kernel of w8a8_gemm: exact int32 accumulator, all four scale variants."""

import pytest
import torch

from qfuse.ops import _int_matmul
from qfuse.ops._int_matmul import int8_matmul_nt
from tests.helpers import ACT_DTYPES, DECODE_AND_ODD_M, random_int8

SCALE_VARIANTS = [("token", "channel"), ("token", "tensor"), ("tensor", "channel"), ("tensor", "tensor")]


def _scales(m, n, x_kind, w_kind):
    xs = torch.rand(m, 1) * 0.02 + 1e-3 if x_kind == "token" else torch.tensor([0.011])
    ws = torch.rand(n) * 0.01 + 1e-3 if w_kind == "channel" else torch.tensor([0.007])
    return xs.float(), ws.float()


def test_int8_accumulator_is_exact():
    a, b = random_int8(9, 3000), random_int8(17, 3000)
    a[0], b[0] = -128, -128  # the extreme product, summed 3000 times: 49,152,000 > 2**24
    exact = a.long() @ b.long().T
    assert torch.equal(int8_matmul_nt(a, b).long(), exact)
    # the chunked float32 path the reference uses off-CPU, run here on CPU tensors
    old = _int_matmul._EXACT_FP32_CHUNK
    acc = torch.zeros(9, 17, dtype=torch.int32)
    for k0 in range(0, 3000, old):
        acc += (a[:, k0 : k0 + old].float() @ b[:, k0 : k0 + old].float().T).to(torch.int32)
    assert torch.equal(acc.long(), exact)


@pytest.mark.parametrize("x_kind,w_kind", SCALE_VARIANTS)
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_reference_matches_float64(x_kind, w_kind, dtype, bias):
    n, k = 40, 200
    for m in DECODE_AND_ODD_M:
        xq, wq = random_int8(m, k), random_int8(n, k)
        xs, ws = _scales(m, n, x_kind, w_kind)
        b = torch.randn(n).to(dtype) if bias else None
        out = torch.ops.qfuse.w8a8_gemm(xq, xs, wq, ws, b, dtype)
        assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()
        ref = (xq.long() @ wq.long().T).double() * xs.double().reshape(-1, 1) * ws.double().reshape(1, -1)
        if b is not None:
            ref = ref + b.double()
        tol = torch.finfo(dtype).eps * ref.abs() + 1e-6 * ref.abs().max()  # one rounding to dtype
        assert ((out.double() - ref).abs() <= tol).all()


@pytest.mark.parametrize("x_kind,w_kind", SCALE_VARIANTS)
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("m", DECODE_AND_ODD_M)
def test_opcheck(x_kind, w_kind, dtype, m):
    n, k = 24, 64
    xs, ws = _scales(m, n, x_kind, w_kind)
    b = torch.randn(n).to(dtype) if m % 2 else None
    torch.library.opcheck(torch.ops.qfuse.w8a8_gemm.default, (random_int8(m, k), xs, random_int8(n, k), ws, b, dtype))


def test_rejects_bad_input():
    op = torch.ops.qfuse.w8a8_gemm
    xq, wq = random_int8(4, 32), random_int8(8, 32)
    xs, ws = torch.rand(4, 1), torch.rand(8)
    bf = torch.bfloat16
    with pytest.raises(ValueError, match=r"x_scale must have shape \(4, 1\) \(per-token\) or \(1,\)"):
        op(xq, torch.rand(4), wq, ws, None, bf)
    with pytest.raises(ValueError, match=r"w_scale must have shape \(8,\) \(per-channel\) or \(1,\)"):
        op(xq, xs, wq, torch.rand(8, 1), None, bf)
    with pytest.raises(TypeError, match="x_scale must be float32"):
        op(xq, xs.half(), wq, ws, None, bf)
    with pytest.raises(ValueError, match=r"wq must have shape \(8, 32\)"):
        op(xq, xs, random_int8(8, 16), ws, None, bf)
    with pytest.raises(TypeError, match="xq must be int8"):
        op(xq.to(torch.uint8), xs, wq, ws, None, bf)
    with pytest.raises(TypeError, match="out_dtype must be float16 or bfloat16"):
        op(xq, xs, wq, ws, None, torch.float32)
    with pytest.raises(TypeError, match="bias must be bfloat16, got float16"):
        op(xq, xs, wq, ws, torch.zeros(8, dtype=torch.float16), bf)
    with pytest.raises(ValueError, match="K=131072 exceeds 131071"):
        op(torch.empty(1, 131072, dtype=torch.int8), torch.rand(1, 1), torch.empty(8, 131072, dtype=torch.int8), ws, None, bf)
    with pytest.raises(ValueError, match="must be contiguous"):
        op(xq, xs, random_int8(32, 8).t(), ws, None, bf)
    # the CUDA kernels read scales and bias with unit stride: a strided or expanded one read wrong values
    with pytest.raises(ValueError, match="w_scale must be contiguous"):
        op(xq, xs, wq, torch.rand(1).expand(8), None, bf)
    with pytest.raises(ValueError, match="w_scale must be contiguous"):
        op(xq, xs, wq, torch.rand(16)[::2], None, bf)
    with pytest.raises(ValueError, match="bias must be contiguous"):
        op(xq, xs, wq, ws, torch.zeros(16, dtype=bf)[::2], bf)


@pytest.mark.parametrize(("m", "n"), [(0, 24), (3, 0)])
def test_empty_problems_stay_out_of_config_selection(m, n, monkeypatch):
    """M = 0 or N = 0 returns the empty product before any config is picked: the int8 families
    launch nothing for it, so a pick measured on it was a no-op timing stored as the M-bucket-1 (or
    N = 0) pick. The CUDA entry points are called with CPU tensors and the dispatcher refusing."""
    from qfuse.ops.int8 import dispatch
    from qfuse.ops.w4a8_gemm import _w4a8_gemm_cuda
    from qfuse.ops.w8a8_gemm import _w8a8_gemm_cuda

    def refuse(*args, **kwargs):
        raise AssertionError("an empty problem reached config selection")

    monkeypatch.setattr(dispatch, "int8_gemm", refuse)

    xq, xs = random_int8(m, 64), torch.rand(m, 1)
    out = _w8a8_gemm_cuda(xq, xs, random_int8(n, 64), torch.rand(n), None, torch.bfloat16)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    qw = torch.zeros(n, 32, dtype=torch.uint8)
    out = _w4a8_gemm_cuda(xq, xs, qw, torch.rand(n), None, None, -1, torch.bfloat16)
    assert out.shape == (m, n)
