"""Reference kernel of silu_and_mul_quant."""

import pytest
import torch

from tests.helpers import ACT_DTYPES, assert_per_token_quant

SHAPES = [(1, 64), (2, 64), (7, 96), (16, 128), (33, 65), (2, 3, 48)]


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_quant_of_hf_mlp_activation(shape, dtype):
    """The codes and scales of per-token int8 quantization, computed here, of what
    LlamaMLP computes before down_proj (``ACT2FN["silu"](gate) * up`` in the activation dtype)."""
    from transformers.activations import ACT2FN

    gate, up = (torch.randn(shape) * 3).to(dtype), torch.randn(shape).to(dtype)
    xq, scale = torch.ops.qfuse.silu_and_mul_quant(gate, up)
    assert xq.shape == shape and scale.shape == (*shape[:-1], 1)
    assert_per_token_quant(xq, scale, ACT2FN["silu"](gate) * up)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_dequantized_result_close_to_float64(dtype):
    gate, up = torch.randn(9, 200).to(dtype), torch.randn(9, 200).to(dtype)
    g64 = gate.double()
    h64 = g64 * torch.sigmoid(g64) * up.double()
    xq, scale = torch.ops.qfuse.silu_and_mul_quant(gate, up)
    err = (xq.double() * scale.double() - h64).abs()
    # half a quantization step, plus the two roundings of h to the dtype
    bound = 0.5 * scale.double() + 2 * torch.finfo(dtype).eps * h64.abs() + 1e-9
    assert (err <= bound).all()


def test_zero_gate_row():
    gate, up = torch.randn(2, 32).half(), torch.randn(2, 32).half()
    gate[0] = 0
    xq, scale = torch.ops.qfuse.silu_and_mul_quant(gate, up)
    assert (xq[0] == 0).all() and torch.isfinite(scale).all()


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_opcheck(dtype):
    for shape in [(1, 64), (7, 33), (2, 3, 16)]:
        args = (torch.randn(shape).to(dtype), torch.randn(shape).to(dtype))
        torch.library.opcheck(torch.ops.qfuse.silu_and_mul_quant.default, args)


def test_rejects_bad_input():
    g = torch.randn(4, 32).half()
    with pytest.raises(ValueError, match=r"up must have shape \(4, 32\)"):
        torch.ops.qfuse.silu_and_mul_quant(g, g[:, :16])
    with pytest.raises(TypeError, match="up must be float16"):
        torch.ops.qfuse.silu_and_mul_quant(g, g.bfloat16())
    with pytest.raises(TypeError, match="gate must be float16 or bfloat16"):
        torch.ops.qfuse.silu_and_mul_quant(g.float(), g.float())
