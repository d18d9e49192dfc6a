"""QuantLinear: from_linear, forward vs dequantized_weight, state_dict, dtype handling."""

import re

import pytest
import torch
from torch import nn

import qfuse
from tests.helpers import linear_of, rel_err


@pytest.mark.parametrize("scheme", list(qfuse.SCHEMES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_matches_dequantized_weight(scheme, dtype):
    lin = nn.Linear(256, 96, bias=True).to(dtype)
    q = qfuse.QuantLinear.from_linear(lin, scheme)
    x = torch.randn(2, 5, 256).to(dtype)
    y = q(x)
    assert y.shape == (2, 5, 96) and y.dtype == dtype
    w = q.dequantized_weight().float()
    s = qfuse.get_scheme(scheme)
    if s.weight_only:
        ref = x.float() @ w.T + lin.bias.float()
        assert rel_err(y, ref) < 4e-3
    else:  # activations are quantized per token too: compare with the fake-quant model
        xq, xs = torch.ops.qfuse.quant_per_token_int8(x.reshape(-1, 256))
        ref = (xq.float() * xs) @ w.T + lin.bias.float()
        assert rel_err(y.reshape(-1, 96), ref) < 4e-3
    assert rel_err(y, lin(x).detach()) < (0.02 if s.weight_bits == 8 else 0.15)


def test_state_dict_round_trip():
    lin = nn.Linear(256, 64).bfloat16()
    q = qfuse.QuantLinear.from_linear(lin, "W4A16_ASYM")
    sd = q.state_dict()
    assert set(sd) == {"qweight", "scales", "zeros", "bias"}
    empty = qfuse.QuantLinear(
        256, 64, "W4A16_ASYM", {k: torch.empty_like(v) for k, v in sd.items() if k != "bias"}, torch.empty(64, dtype=torch.bfloat16)
    )
    empty.load_state_dict(sd)
    x = torch.randn(3, 256).bfloat16()
    assert torch.equal(empty(x), q(x))


def test_module_to_half_keeps_working():
    lin = nn.Linear(128, 32).bfloat16()
    for scheme in ("W4A16", "W8A8"):
        q = qfuse.QuantLinear.from_linear(lin, scheme).to(torch.float16)
        y = q(torch.randn(2, 128).half())
        assert y.dtype == torch.float16 and torch.isfinite(y).all()


@pytest.mark.parametrize("scheme", ["W8A8", "W4A8", "W4A8_G128", "W8A8_STATIC"])
@pytest.mark.parametrize("to", [torch.bfloat16, torch.float16])
def test_module_to_dtype_keeps_the_float32_scales(scheme, to):
    """The int8 paths' scales are exact float32 values: Module.to(dtype) rounded them (bf16 by up to
    2^-9), changing every output even where the module was bf16 already."""
    w = torch.randn(64, 256).bfloat16() * 0.01
    if scheme == "W8A8_STATIC":
        from qfuse.quantizers import quantize_w8a8

        q = qfuse.QuantLinear(256, 64, scheme, {**quantize_w8a8(w), "input_scale": torch.tensor([0.0123456])}, None)
    else:
        q = qfuse.QuantLinear.from_linear(linear_of(w), scheme)
    scales = {n: b.clone() for n, b in q.named_buffers() if b.dtype == torch.float32}
    assert scales
    x = torch.randn(3, 256).to(to)
    ref = q(x)
    q = q.to(to)
    for n, b in scales.items():
        assert q.get_buffer(n).dtype == torch.float32 and torch.equal(q.get_buffer(n), b), n
    assert torch.equal(q(x), ref)


def test_input_of_another_width_is_refused():
    q = qfuse.QuantLinear.from_linear(nn.Linear(256, 64).bfloat16(), "W8A16")
    for shape in ([4, 128], [0, 128], [2, 512], []):  # [0, 128] reshaped to [0, 256] and ran before
        with pytest.raises(ValueError, match=rf"input of shape {re.escape(str(shape))} does not end in 256"):
            q(torch.zeros(shape, dtype=torch.bfloat16))


def test_weight_bytes():
    lin = nn.Linear(256, 64, bias=False).bfloat16()
    assert qfuse.QuantLinear.from_linear(lin, "W4A16").weight_bytes() == 64 * 128 + 64 * 2 * 2
    assert qfuse.QuantLinear.from_linear(lin, "W8A8").weight_bytes() == 64 * 256 + 64 * 4


def test_from_linear_errors():
    with pytest.raises(TypeError, match="not supported; qfuse runs fp16/bf16 models"):
        qfuse.QuantLinear.from_linear(nn.Linear(128, 8), "W8A16")
    with pytest.raises(ValueError, match="in_features=100 is not divisible by group_size=128"):
        qfuse.QuantLinear.from_linear(nn.Linear(100, 8).half(), "W4A8_G128")
    with pytest.raises(ValueError, match="in_features=129 must be even"):
        qfuse.QuantLinear.from_linear(nn.Linear(129, 8).half(), "W4A8")
    wide = nn.Linear(131072, 8, bias=False, device="meta", dtype=torch.bfloat16)  # past the int8 ops' MAX_K
    for scheme in ("W8A8", "W4A8"):
        with pytest.raises(ValueError, match="in_features=131072 exceeds 131071"):
            qfuse.quantize_model(nn.Sequential(wide), scheme, progress=False)
    qfuse.quantize_model(nn.Sequential(wide), "W8A16", progress=False)  # weight-only: no int32 accumulator


@pytest.mark.parametrize("scheme", ["W4A16_ASYM", "W8A8", "W4A8_G128"])
def test_take_rows_is_the_outputs_in_that_order(scheme):
    torch.manual_seed(0)
    q = qfuse.QuantLinear.from_linear(nn.Linear(256, 96, bias=True).to(torch.bfloat16), scheme)
    q.act_perm = torch.randperm(256)
    index = torch.randperm(96)[:40]
    taken = q.take_rows(index)
    assert (taken.in_features, taken.out_features, taken.scheme) == (256, 40, q.scheme) and taken.act_perm is q.act_perm
    assert torch.equal(taken.dequantized_weight(), q.dequantized_weight()[index])
    x = torch.randn(3, 256).to(torch.bfloat16)
    assert torch.equal(taken(x), q(x)[:, index])
