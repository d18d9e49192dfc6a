"""AutoAWQ GEMM checkpoints load bit-exactly: checkpoints written from the format reference
(spec_writers.py), cross-checked against compressed-tensors' own AutoAWQ converter."""

import pytest
import torch

import qfuse
from tests.qfuse.formats.spec_writers import (
    SpecLayer,
    awq_pack,
    awq_quantize,
    check_loaded_layer,
    edit_quant_config,
    model_for,
    natural_g_idx,
    random_weight,
    write_awq,
    write_awq_layers,
)

# Odd-but-legal shapes: N a multiple of 8 (AutoAWQ packs along N) but not of 16; K of 2 to 12 groups.
SHAPES = {"layers.0.self_attn.q_proj": (24, 256), "layers.0.mlp.down_proj": (40, 384)}
BIASED = "layers.0.self_attn.q_proj"


def write_model(tmp_path, group_size, config_style="config.json"):
    """A two-layer AWQ checkpoint (one layer with a bias) plus an unquantized embedding."""
    weights = {p: random_weight(n, k) for p, (n, k) in SHAPES.items()}
    extra = {"embed_tokens.weight": torch.randn(32, 24).half(), f"{BIASED}.bias": torch.randn(24).half()}
    specs = write_awq(tmp_path, weights, group_size, extra, config_style)
    return specs, extra


def load(path, extra, device="cpu", shapes=SHAPES):
    """``load_quantized`` into a matching model (an ``nn.Embedding`` for each unquantized tensor)."""
    linears = {p: (n, k, f"{p}.bias" in extra) for p, (n, k) in shapes.items()}
    plain = {name: t for name, t in extra.items() if not name.endswith(".bias")}
    return qfuse.load_quantized(path, model_for(linears, plain, device), progress=False)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("config_style", ["config.json", "quant_config.json"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_load_bit_exact(tmp_path, group_size, config_style, device):
    specs, extra = write_model(tmp_path, group_size, config_style)
    model = load(tmp_path, extra, device)
    for prefix, spec in specs.items():
        layer = model.get_submodule(prefix)
        assert layer.scheme.name == {128: "W4A16_ASYM", -1: "W4A16_CH_ASYM"}.get(group_size, f"W4A16_G{group_size}_ASYM")
        check_loaded_layer(layer, spec, extra.get(f"{prefix}.bias"), prefix)
    assert torch.equal(model.embed_tokens.weight, extra["embed_tokens.weight"])


def test_writer_interleave_matches_reference():
    """Guards the oracle itself: logical columns 0..7 holding the values 0..7 pack to the word
    whose nibble i is AWQ_ORDER[i] (reference 1.4), i.e. 0x75316420."""
    assert awq_pack(torch.arange(8).reshape(1, 8)).item() == 0x75316420
    # A code of 15 in the top nibble makes the stored int32 negative: still one code.
    top = torch.zeros(1, 8, dtype=torch.int64)
    top[0, 7] = 15
    assert awq_pack(top).item() == 0xF0000000 - 2**32


def test_zero_point_extremes(tmp_path):
    """Zero points 0 and 15 and codes 0 and 15 everywhere a nibble can sit."""
    n, k, g = 16, 64, 32
    codes = torch.randint(0, 16, (k, n))
    codes[:2] = torch.tensor([0, 15]).repeat(n // 2)
    zeros = torch.tensor([[0, 15] * (n // 2), [15, 0] * (n // 2)])
    spec = SpecLayer(codes, zeros, (torch.rand(2, n) * 0.01 + 1e-3).half(), natural_g_idx(k, g), 4, g)
    write_awq_layers(tmp_path, {"proj": spec}, g)
    model = load(tmp_path, {}, shapes={"proj": (n, k)})
    check_loaded_layer(model.proj, spec, None, "proj")


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_matches_compressed_tensors_converter(tmp_path, group_size):
    """compressed-tensors converts AutoAWQ tensors with its own unpacking (AutoAWQConverter)
    and dequantizes them with its own code: its weight must equal qfuse's, bit for bit."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import load_file

    specs, extra = write_model(tmp_path, group_size)
    stored = load_file(str(tmp_path / "model.safetensors"))
    converted = AutoAWQConverter(bits=4, group_size=group_size, zero_point=True).process(dict(stored))
    # The scheme AutoAWQConverter declares for what it wrote (its _build_quant_config); for
    # group -1 it declares "group" with group_size -1, which compressed-tensors spells "channel".
    if group_size == -1:
        weights = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="channel")
    else:
        weights = QuantizationArgs(num_bits=4, type="int", symmetric=False, group_size=group_size, strategy="group")
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    model = load(tmp_path, extra)
    for prefix, spec in specs.items():
        local = {name: converted[f"{prefix}.{name}"] for name in ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")}
        ct_weight = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
        ours = model.get_submodule(prefix).dequantized_weight()
        assert ct_weight.dtype == ours.dtype == torch.float16
        assert torch.equal(ct_weight, ours), f"{prefix}: {int((ct_weight != ours).sum())} weights differ"
        assert torch.equal(ct_weight, spec.weight)


def test_quantized_weight_is_close_to_float(tmp_path):
    """Sanity of the writer's quantization (not of the loader): AutoAWQ 4-bit RTN error."""
    w = random_weight(24, 256)
    spec = awq_quantize(w, 64)
    err = (spec.weight.float() - w.float()).abs().max() / w.float().abs().max()
    assert err < 0.1


def test_gemv_version_rejected(tmp_path):
    _, extra = write_model(tmp_path, 128)
    edit_quant_config(tmp_path, version="gemv")
    with pytest.raises(qfuse.CheckpointError, match="version 'gemv' is not supported"):
        load(tmp_path, extra)


def test_group_size_not_dividing_k(tmp_path):
    """K=320 written with group 64; a config claiming group 128 (320 = 2.5 groups) must fail
    naming the layer, not read scales of the wrong length."""
    spec = awq_quantize(random_weight(16, 320), 64)
    write_awq_layers(tmp_path, {"proj": spec}, 64)
    edit_quant_config(tmp_path, group_size=128)
    with pytest.raises(qfuse.CheckpointError, match=r"layer proj: in_features=320 is not divisible by group_size=128"):
        load(tmp_path, {}, shapes={"proj": (16, 320)})


def test_eight_bit_awq_rejected(tmp_path):
    _, extra = write_model(tmp_path, 128, "quant_config.json")
    edit_quant_config(tmp_path, w_bit=8)
    with pytest.raises(qfuse.CheckpointError, match="AutoAWQ GEMM checkpoints are 4-bit, the config says bits=8"):
        load(tmp_path, extra)
