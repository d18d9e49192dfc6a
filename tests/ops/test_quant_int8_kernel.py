"""Triton kernels of quant_per_token_int8 / quant_per_tensor_int8 against the reference kernel.

CPU (CI): the launchers run under the Triton interpreter on CPU tensors; codes and
scales must equal the reference bit for bit (no float reduction is involved: amax is
exact in any order, the division is IEEE, rounding is half-to-even).
GPU (``-m gpu``): the registered CUDA op against the reference kernel run on the GPU.
"""

import pytest
import torch

from qfuse.ops.activation.quant_kernels import quant_per_tensor_int8_triton, quant_per_token_int8_triton, row_config
from qfuse.ops.quant_int8 import quant_per_tensor_int8_ref, quant_per_token_int8_ref
from tests.helpers import ACT_DTYPES

# (shape, max_row_block): a small max_row_block forces the chunked two-pass path.
CPU_CASES = [
    ((1, 64), 32768),
    ((2, 576), 32768),
    ((7, 4097), 32768),
    ((16, 257), 32768),
    ((3, 5, 48), 32768),
    ((2, 14336), 32768),
    ((3, 1000), 512),  # 8 chunks of 128
    ((1, 130), 64),  # chunk of 16 with a ragged tail
]


def _assert_same(got, ref):
    (q, s), (qr, sr) = got, ref
    assert q.dtype == torch.int8 and q.shape == qr.shape and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == sr.shape
    assert torch.equal(s, sr), f"scales differ in {(s != sr).sum().item()} rows"
    assert torch.equal(q, qr), f"codes differ at {(q != qr).sum().item()} of {q.numel()} (max |diff| {(q.int() - qr.int()).abs().max().item()})"


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape,max_row_block", CPU_CASES)
def test_per_token_kernel_equals_reference(shape, max_row_block, dtype):
    x = (torch.randn(shape) * 4).to(dtype)
    _assert_same(quant_per_token_int8_triton(x, max_row_block), quant_per_token_int8_ref(x))


@pytest.mark.parametrize("max_row_block", [32768, 16])
def test_per_token_kernel_rounds_half_to_even(max_row_block):
    # amax 127 -> scale exactly 1.0, so x / scale hits exact .5 ties; round-half-up would give 1, 3, -1, -3.
    row = [127.0, 0.5, 2.5, -0.5, -2.5, 1.5, -1.5, 3.0] * 5
    x = torch.tensor([row], dtype=torch.bfloat16)
    q, s = quant_per_token_int8_triton(x, max_row_block)
    assert s.item() == 1.0
    assert q[0, :8].tolist() == [127, 0, 2, 0, -2, 2, -2, 3]


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("max_row_block", [32768, 64])
def test_per_token_kernel_all_zero_row(dtype, max_row_block):
    x = torch.randn(4, 300).to(dtype)
    x[2] = 0
    q, s = quant_per_token_int8_triton(x, max_row_block)
    _assert_same((q, s), quant_per_token_int8_ref(x))
    assert torch.isfinite(s).all() and s[2].item() > 0 and (q[2] == 0).all()


def test_per_token_kernel_tiny_and_huge_magnitudes():
    # A row near the 1e-10 floor, one of subnormal-ish fp16 values, one at the fp16 max.
    x = torch.randn(3, 96).half()
    x[0] *= 1e-8
    x[1] = torch.randn(96).half() * 6e-5
    x[2, 0] = 65504.0
    _assert_same(quant_per_token_int8_triton(x), quant_per_token_int8_ref(x))


def test_per_token_kernel_non_contiguous_input():
    x = torch.randn(40, 24).bfloat16().t()  # [24, 40], strides (1, 24)
    _assert_same(quant_per_token_int8_triton(x), quant_per_token_int8_ref(x))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 4097), (3, 5, 48)])
def test_per_tensor_kernel_equals_reference(shape, dtype):
    x = (torch.randn(shape) * 3).to(dtype)
    x.view(-1)[:2] = torch.tensor([9.0, -9.0])
    scale = torch.tensor([9.0 / 200])  # the two planted values clip at 127 / -128
    q = quant_per_tensor_int8_triton(x, scale)
    assert torch.equal(q, quant_per_tensor_int8_ref(x, scale))
    assert q.max() == 127 and q.min() == -128
    ties = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 1e30, -1e30], dtype=torch.float32).to(dtype)
    qt = quant_per_tensor_int8_triton(ties, torch.tensor([1.0]))
    assert qt.tolist() == quant_per_tensor_int8_ref(ties, torch.tensor([1.0])).tolist()
    assert qt.tolist()[:5] == [0, 2, 2, 0, -2]


def test_row_config_is_a_function_of_hidden_size():
    assert row_config(4096) == {"BLOCK": 4096, "SINGLE": True, "num_warps": 8}
    assert row_config(14336) == {"BLOCK": 16384, "SINGLE": True, "num_warps": 16}
    assert row_config(40000)["SINGLE"] is False
    assert row_config(1000, 512) == {"BLOCK": 128, "SINGLE": False, "num_warps": 4}


def test_cuda_entry_checks_arguments_before_any_kernel():
    from qfuse.ops.quant_int8 import _quant_per_tensor_int8_cuda, _quant_per_token_int8_cuda

    with pytest.raises(TypeError, match="x must be float16 or bfloat16"):
        _quant_per_token_int8_cuda(torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"scale must have shape \(1,\)"):
        _quant_per_tensor_int8_cuda(torch.randn(2, 8).half(), torch.tensor([0.1, 0.2]))


# ---------------------------------------------------------------- GPU grid
GPU_M = (1, 2, 7, 16, 33, 64, 128, 512, 2048, 4096)
GPU_H = (4096, 14336, 4097, 576)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("h", GPU_H)
@pytest.mark.parametrize("m", GPU_M)
def test_gpu_per_token_equals_reference(m, h, dtype):
    x = (torch.randn(m, h, device="cuda") * 4).to(dtype)
    x[0, : h // 2] = 0
    if m > 2:
        x[1] = 0
    _assert_same(torch.ops.qfuse.quant_per_token_int8(x), quant_per_token_int8_ref(x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("h", (40000, 32768 + 3))  # chunked path
@pytest.mark.parametrize("m", (1, 7, 256))
def test_gpu_per_token_long_rows(m, h, dtype):
    x = (torch.randn(m, h, device="cuda") * 4).to(dtype)
    _assert_same(torch.ops.qfuse.quant_per_token_int8(x), quant_per_token_int8_ref(x))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("h", GPU_H)
@pytest.mark.parametrize("m", (1, 16, 4096))
def test_gpu_per_tensor_equals_reference(m, h, dtype):
    x = (torch.randn(m, h, device="cuda") * 3).to(dtype)
    scale = (x.float().abs().amax() / 100).reshape(1)
    q = torch.ops.qfuse.quant_per_tensor_int8(x, scale)
    assert torch.equal(q, quant_per_tensor_int8_ref(x, scale))


@pytest.mark.gpu
def test_gpu_per_token_cuda_graph_capture():
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    torch.ops.qfuse.quant_per_token_int8(x)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q, s = torch.ops.qfuse.quant_per_token_int8(x)
    x.copy_(torch.randn(16, 4096, device="cuda").bfloat16())
    g.replay()
    _assert_same((q, s), quant_per_token_int8_ref(x))


@pytest.mark.gpu
@pytest.mark.parametrize("h", (4096, 4097, 40000))  # one block, a ragged block, the chunked path
def test_gpu_per_token_nan_row_gets_a_nan_scale(h):
    """PTX max.f32 (Triton's default max) returns the other operand of a NaN: the row's scale must
    stay NaN, as the reference's, so the GEMM after it gives NaN instead of finite garbage."""
    x = torch.randn(3, h, device="cuda").to(torch.bfloat16)
    x[1, h // 3] = float("nan")
    q, s = torch.ops.qfuse.quant_per_token_int8(x)
    qr, sr = quant_per_token_int8_ref(x)
    assert torch.isnan(s[1]).all() and torch.isnan(sr[1]).all()
    assert torch.equal(s[[0, 2]], sr[[0, 2]]) and torch.equal(q[[0, 2]], qr[[0, 2]])
