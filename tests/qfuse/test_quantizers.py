"""quantize -> dequantize error bounds per scheme, and AutoAWQ equivalence."""

import pytest
import torch

from qfuse.ops.w4a8_gemm import dequantize_w4a8
from qfuse.ops.wna16_gemm import dequantize_wna16
from qfuse.quantizers import quantize_w4a8, quantize_w8a8, quantize_wna16
from tests.helpers import ACT_DTYPES, decode_uint4


def _groups(t, g):
    n, k = t.shape
    g = k if g == -1 else g
    return t.reshape(n, k // g, g)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_wna16_symmetric_error_within_half_step(bits, group_size, dtype):
    w = torch.randn(32, 256).to(dtype).float()
    t = quantize_wna16(w, bits, group_size, True, dtype)
    w_hat = dequantize_wna16(t["qweight"], t["scales"], None, bits, group_size)
    step = t["scales"].float().repeat_interleave(256 if group_size == -1 else group_size, dim=1)
    # half a step; the row/group max may clip at +qmax by at most one step where the
    # scale was rounded down to the dtype
    err = (w_hat - w).abs()
    assert (err <= 0.5 * step * (1 + 1e-3) + 1e-7).float().mean() > 0.99
    assert (err <= 1.0 * step * (1 + 1e-2)).all()
    rel = ((w_hat - w).norm() / w.norm()).item()
    assert rel < {4: 0.13, 8: 0.008}[bits] * (1.0 if group_size != -1 else 1.3)


@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_wna16_asym_matches_autoawq_pseudo_quantize(group_size, dtype):
    # AutoAWQ awq/quantize/quantizer.py pseudo_quantize_tensor(zero_point=True), transcribed;
    # AutoAWQ computes in the model dtype, so its scale carries that dtype's rounding.
    w = (torch.randn(16, 256) * 0.1 + 0.03).to(dtype).float()
    wg = w.reshape(-1, group_size)
    max_val, min_val = wg.amax(dim=1, keepdim=True), wg.amin(dim=1, keepdim=True)
    scales = ((max_val - min_val).clamp(min=1e-5) / 15).to(dtype).float()
    zeros = (-torch.round(min_val / scales)).clamp_(0, 15)
    awq = ((torch.clamp(torch.round(wg / scales) + zeros, 0, 15) - zeros) * scales).reshape(16, 256)
    t = quantize_wna16(w, 4, group_size, False, dtype)
    ours = dequantize_wna16(t["qweight"], t["scales"], t["zeros"], 4, group_size)
    assert torch.equal(ours, awq)
    assert torch.equal(t["zeros"].reshape(-1, 1).float(), zeros)


def test_wna16_codes_in_range_and_zero_weight_finite():
    w = torch.randn(8, 128)
    w[3] = 0
    for sym in (True, False):
        t = quantize_wna16(w, 4, 64, sym, torch.float16)
        codes = decode_uint4(t["qweight"])
        assert codes.min() >= 0 and codes.max() <= 15
        assert torch.isfinite(t["scales"].float()).all()
        w_hat = dequantize_wna16(t["qweight"], t["scales"], t["zeros"], 4, 64)
        assert (w_hat[3] == 0).all()


def test_w8a8_error_bound():
    w = torch.randn(64, 256)
    t = quantize_w8a8(w)
    w_hat = t["wq"].float() * t["w_scale"].reshape(-1, 1)
    assert ((w_hat - w).abs() <= 0.5 * t["w_scale"].reshape(-1, 1) + 1e-7).all()
    assert t["wq"].abs().max() <= 127


@pytest.mark.parametrize("group_size", [-1, 128])
def test_w4a8_error_bound_and_int8_products(group_size):
    w = torch.randn(64, 512) * torch.linspace(0.1, 3, 512)  # groups with very different ranges
    t = quantize_w4a8(w, group_size)
    w_hat = dequantize_w4a8(t["qweight"], t["w_scale"], t["group_scale"], group_size)
    step = t["w_scale"].reshape(-1, 1) * (1 if group_size == -1 else t["group_scale"].float().repeat_interleave(128, dim=1))
    assert ((w_hat - w).abs() <= 0.5 * step * (1 + 1e-5)).all()
    if group_size == 128:
        gs = t["group_scale"]
        assert gs.min() >= 1 and gs.max() <= 16
        per_channel = dequantize_w4a8(**{k: v for k, v in quantize_w4a8(w, -1).items()}, group_size=-1)
        assert (w_hat - w).norm() < 0.8 * (per_channel - w).norm(), "groups must beat one scale per row here"


QUANTIZERS = {
    "wna16_w8": lambda w: quantize_wna16(w, 8, -1, True, w.dtype),
    "wna16_w4_sym": lambda w: quantize_wna16(w, 4, 128, True, w.dtype),
    "wna16_w4_asym": lambda w: quantize_wna16(w, 4, 64, False, w.dtype),
    "w8a8": quantize_w8a8,
    "w4a8": lambda w: quantize_w4a8(w, -1),
    "w4a8_g128": lambda w: quantize_w4a8(w, 128),
}


@pytest.mark.parametrize("quantizer", list(QUANTIZERS))
def test_meta_weight_gives_the_real_shapes_and_dtypes(quantizer):
    quantize = QUANTIZERS[quantizer]
    w = torch.randn(48, 256).bfloat16()
    real, meta = quantize(w), quantize(w.to("meta"))
    assert real.keys() == meta.keys()
    for name, t in real.items():
        if t is None:
            assert meta[name] is None
        else:
            m = meta[name]
            assert m.is_meta and (m.shape, m.dtype) == (t.shape, t.dtype), name


@pytest.mark.parametrize("quantizer", list(QUANTIZERS))
def test_nan_or_inf_weight_rejected(quantizer):
    w = torch.randn(16, 256)
    w[2, 7] = float("nan")
    w[5, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"weight has 2 NaN/inf value\(s\) of 4096"):
        QUANTIZERS[quantizer](w)


@pytest.mark.parametrize("quantizer", list(QUANTIZERS))
def test_quantized_by_blocks_of_rows_gives_the_same_bits(quantizer, monkeypatch):
    """Every scale is per row or per group within a row: blocks of rows (the last one short)
    give what the whole weight gives, and NaN / inf are counted over the whole weight."""
    import qfuse.quantizers

    quantize = QUANTIZERS[quantizer]
    w = torch.randn(37, 256, generator=torch.Generator().manual_seed(0)).bfloat16()
    whole = quantize(w)
    monkeypatch.setattr(qfuse.quantizers, "CHUNK_ELEMENTS", 5 * 256)  # 8 blocks of 5 rows, the last of 2
    blocks = quantize(w)
    assert whole.keys() == blocks.keys()
    for name, t in whole.items():
        assert (t is None and blocks[name] is None) or torch.equal(t, blocks[name]), name
    w[3, 1], w[36, 255] = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"weight has 2 NaN/inf value\(s\) of 9472"):
        quantize(w)
