"""Reference kernels of rms_norm, fused_add_rms_norm and their *_quant forms."""

import pytest
import torch

from tests.helpers import ACT_DTYPES, assert_per_token_quant

SHAPES = [(1, 64), (2, 64), (7, 96), (16, 128), (33, 65), (2, 3, 48)]
EPS = 1e-6


def _weight(h, dtype):
    return (1 + 0.2 * torch.randn(h)).to(dtype)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_equals_hf_llama_rmsnorm(shape, dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(shape[-1], eps=EPS).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(_weight(shape[-1], dtype))
    x = (torch.randn(shape) * 4).to(dtype)
    out = torch.ops.qfuse.rms_norm(x, hf.weight.detach(), EPS)
    assert out.dtype == dtype and out.is_contiguous()
    assert torch.equal(out, hf(x).detach())


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_rms_norm_close_to_float64(dtype):
    x = torch.randn(5, 256).to(dtype)
    w = _weight(256, dtype)
    x64 = x.double()
    ref = w.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    out = torch.ops.qfuse.rms_norm(x, w, EPS)
    # two roundings to dtype (normalized value, then the product): 2 ulp of the dtype
    ulp = torch.finfo(dtype).eps
    assert ((out.double() - ref).abs() <= 2 * ulp * ref.abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_all_zero_row_gives_zeros(dtype):
    x = torch.randn(3, 64).to(dtype)
    x[2] = 0
    out = torch.ops.qfuse.rms_norm(x, _weight(64, dtype), EPS)
    assert torch.isfinite(out).all() and (out[2] == 0).all()
    xq, scale = torch.ops.qfuse.rms_norm_quant(x, _weight(64, dtype), EPS)
    assert (xq[2] == 0).all() and torch.isfinite(scale).all()


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_ops_equal_their_composition(shape, dtype):
    x, res = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    w = _weight(shape[-1], dtype)
    q = torch.ops.qfuse
    out, res_out = q.fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(res_out, x + res)
    assert torch.equal(out, q.rms_norm(x + res, w, EPS))
    xq, scale = q.rms_norm_quant(x, w, EPS)
    assert_per_token_quant(xq, scale, q.rms_norm(x, w, EPS))
    xq, scale, res_out = q.fused_add_rms_norm_quant(x, res, w, EPS)
    assert_per_token_quant(xq, scale, out)
    assert torch.equal(res_out, x + res)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 33), (2, 3, 16)])
def test_opcheck(shape, dtype):
    x, res, w = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype), _weight(shape[-1], dtype)
    q = torch.ops.qfuse
    torch.library.opcheck(q.rms_norm.default, (x, w, EPS))
    torch.library.opcheck(q.fused_add_rms_norm.default, (x, res, w, EPS))
    torch.library.opcheck(q.rms_norm_quant.default, (x, w, EPS))
    torch.library.opcheck(q.fused_add_rms_norm_quant.default, (x, res, w, EPS))


def test_rejects_bad_input():
    q = torch.ops.qfuse
    x = torch.randn(4, 32).bfloat16()
    w = torch.ones(32, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="weight must be bfloat16, got float32"):
        q.rms_norm(x, w.float(), EPS)
    with pytest.raises(ValueError, match=r"weight must have shape \(32,\)"):
        q.rms_norm(x, torch.ones(16, dtype=torch.bfloat16), EPS)
    for eps in (-1.0, 0.0, float("inf"), float("nan")):  # inf normalized everything to zeros
        with pytest.raises(ValueError, match="eps must be a positive finite float"):
            q.rms_norm(x, w, eps)
    with pytest.raises(ValueError, match=r"residual must have shape \(4, 32\)"):
        q.fused_add_rms_norm(x, x[:2], w, EPS)
    with pytest.raises(TypeError, match="residual must be bfloat16"):
        q.fused_add_rms_norm_quant(x, x.half(), w, EPS)
    with pytest.raises(TypeError, match="x must be float16 or bfloat16"):
        q.rms_norm_quant(x.float(), w, EPS)
