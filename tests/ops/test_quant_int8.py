"""Reference kernels of quant_per_token_int8 / quant_per_tensor_int8: math, opcheck, errors."""

import pytest
import torch

from tests.helpers import ACT_DTYPES

SHAPES = [(1, 64), (2, 64), (7, 33), (16, 128), (33, 65), (3, 5, 48)]


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_per_token_matches_float64_math(shape, dtype):
    x = (torch.randn(shape) * 3).to(dtype)
    xq, scale = torch.ops.qfuse.quant_per_token_int8(x)
    assert xq.dtype == torch.int8 and xq.shape == x.shape and xq.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (*shape[:-1], 1)
    x64 = x.double()
    amax = x64.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(scale.double(), amax / 127, rtol=1e-7, atol=0)
    # Each code is the nearest integer to x / scale (ties aside), never beyond 127 in magnitude.
    dist = (xq.double() - x64 / scale.double()).abs()
    assert dist.max() <= 0.5 + 1e-6
    assert xq.abs().max() <= 127
    assert (xq.abs() == 127).any(-1).all(), "the row max must map to +-127"


def test_per_token_rounds_half_to_even():
    # amax 127 -> scale exactly 1.0; x = k + 0.5 are exact ties in bf16.
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0]], dtype=torch.bfloat16)
    xq, scale = torch.ops.qfuse.quant_per_token_int8(x)
    assert scale.item() == 1.0
    assert xq.tolist() == [[127, 0, 2, 2, 0, -2, -2, 3]]


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_per_token_all_zero_row_is_finite(dtype):
    x = torch.randn(3, 40).to(dtype)
    x[1] = 0
    xq, scale = torch.ops.qfuse.quant_per_token_int8(x)
    assert torch.isfinite(scale).all() and scale[1].item() > 0
    assert (xq[1] == 0).all()
    assert (xq[0] != 0).any()


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_per_tensor_matches_math(shape, dtype):
    x = (torch.randn(shape) * 2).to(dtype)
    scale = torch.tensor([x.float().abs().max().item() / 100], dtype=torch.float32)  # some values clip
    xq = torch.ops.qfuse.quant_per_tensor_int8(x, scale)
    expect = torch.round(x.double() / scale.double()).clamp(-128, 127)
    # float32 vs float64 division can differ only at exact .5 ties; allow none away from ties
    mismatch = xq.double() != expect
    near_tie = ((x.double() / scale.double()).abs() % 1 - 0.5).abs() < 1e-5
    assert not (mismatch & ~near_tie).any()
    big = torch.tensor([1e-3], dtype=torch.float32)
    assert torch.ops.qfuse.quant_per_tensor_int8(x, big).abs().max() >= 127  # clamps


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 33), (2, 3, 16)])
def test_opcheck(shape, dtype):
    x = torch.randn(shape).to(dtype)
    torch.library.opcheck(torch.ops.qfuse.quant_per_token_int8.default, (x,))
    torch.library.opcheck(torch.ops.qfuse.quant_per_tensor_int8.default, (x, torch.tensor([0.05])))


def test_rejects_bad_input():
    with pytest.raises(TypeError, match="x must be float16 or bfloat16, got float32"):
        torch.ops.qfuse.quant_per_token_int8(torch.randn(2, 8))
    with pytest.raises(ValueError, match="non-empty last dimension"):
        torch.ops.qfuse.quant_per_token_int8(torch.randn(2, 0).half())
    x = torch.randn(2, 8).half()
    with pytest.raises(ValueError, match=r"scale must have shape \(1,\)"):
        torch.ops.qfuse.quant_per_tensor_int8(x, torch.tensor([0.1, 0.2]))
    with pytest.raises(TypeError, match="scale must be float32"):
        torch.ops.qfuse.quant_per_tensor_int8(x, torch.tensor([0.1], dtype=torch.float64))
    with pytest.raises(ValueError, match="scale is on meta but x is on cpu"):
        torch.ops.qfuse.quant_per_tensor_int8(x, torch.empty(1, device="meta"))


@pytest.mark.parametrize("bad", (0.0, -0.0, -0.05, float("nan"), float("inf"), float("-inf")))
def test_per_tensor_rejects_bad_scale(bad):
    """A scale <= 0 flips or zeroes codes and NaN/inf ones zero them: rejected on the reference path."""
    x = torch.randn(4, 32).half()
    with pytest.raises(ValueError, match=rf"scale must be finite and > 0, got {bad}"):
        torch.ops.qfuse.quant_per_tensor_int8(x, torch.tensor([bad]))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_per_tensor_rejects_nan_activation(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=gen).to(dtype)
    count = int(torch.randint(1, 10, (), generator=gen))
    x.view(-1)[torch.randperm(x.numel(), generator=gen)[:count]] = float("nan")
    with pytest.raises(ValueError, match=rf"quant_per_tensor_int8: x: {count} NaN values \(of 240\)"):
        torch.ops.qfuse.quant_per_tensor_int8(x, torch.tensor([0.05]))


@pytest.mark.parametrize("tiny", (1e-30, 1e-45))  # 1e-45 rounds to the smallest float32 subnormal
def test_per_tensor_accepts_tiny_scale_and_inf(tiny):
    """Valid edges: a tiny positive scale saturates every nonzero code, and +-inf in x saturates."""
    x = torch.randn(3, 16).half()
    x[0, :3] = torch.tensor([0.0, float("inf"), float("-inf")])
    xq = torch.ops.qfuse.quant_per_tensor_int8(x, torch.tensor([tiny]))
    expect = torch.where(x > 0, 127, torch.where(x < 0, -128, 0)).to(torch.int8)
    assert torch.equal(xq, expect)
    xq1 = torch.ops.qfuse.quant_per_tensor_int8(x, torch.tensor([1.0]))
    assert xq1[0, :3].tolist() == [0, 127, -128]


def test_check_static_scale_helper():
    from qfuse.ops.quant_int8 import check_static_scale

    check_static_scale(torch.tensor([1e-30]))
    check_static_scale(0.05)  # a plain float from calibration
    with pytest.raises(ValueError, match="scale must be finite and > 0, got nan"):
        check_static_scale(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="scale must be finite and > 0, got -2.0"):
        check_static_scale(-2.0)
    with pytest.raises(ValueError, match=r"got 0.0 \(2 of 3 values bad\)"):
        check_static_scale(torch.tensor([1.0, 0.0, float("inf")]))
