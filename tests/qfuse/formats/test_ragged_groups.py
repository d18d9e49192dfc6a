"""Layers whose in_features K the group size does not divide, on a tiny Llama of hidden size
320 = 2 * 128 + 64 (as SmolLM2's 576 = 4 * 128 + 64): q/k/v/o/gate/up have K = 320, down_proj
K = 512.

* qfuse-written: ``quantize_model`` gives the K = 320 layers group 64; ``save_quantized``
  writes them in a config group of their own, targets by exact name (W4A8_G128: every layer
  int8 W8A8 through the extension, whose ``group_sizes`` records the group-64 layers), which compressed-tensors decompresses to the weights qfuse runs, and
  ``from_pretrained`` reloads the model identically.
* compressed-tensors-written with a partial last group (group 128 on K = 320: ceil(320 / 128)
  = 3 scale / zero-point columns, the last covering 64 inputs): qfuse loads it exactly at
  group 64. compressed-tensors 0.20's compressors refuse strategy "group" on such a layer
  (compress and decompress: "tensor column shape must be divisble by the given group_size"),
  so the layers are written by its compressor with strategy "block", block_structure
  [1, 128], whose scales have the same [N, 3] shape and the same meaning (it pads the weight
  to whole blocks), and the config is then relabeled group / group_size 128 (asymmetric
  zero points packed as compressed-tensors packs group zero points, with its own
  ``pack_to_int32``). The reference weight is compressed-tensors' own decompression of the
  block layer.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("compressed_tensors")
transformers = pytest.importorskip("transformers")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStatus,
)
from compressed_tensors.quantization.lifecycle.apply import apply_quantization_config  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import qfuse  # noqa: E402
from qfuse import QuantLinear  # noqa: E402
from qfuse.formats.compressed_tensors import EXTENSION_KEY  # noqa: E402
from tests.hf_models import tiny_hf_model  # noqa: E402
from tests.qfuse.formats.test_compressed_tensors import _ct_decompress_files, _read_tensors  # noqa: E402

BF16 = torch.bfloat16
RAGGED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")  # K = 320
TOL_WEIGHT_ONLY = 1e-2  # qfuse's logits against F.linear with the same weights (bf16 GEMM rounding only)


def _tiny_model(hidden: int = 320, layers: int = 2) -> nn.Module:
    """A bf16 random Llama with a float32 rotary inv_freq (as from_pretrained builds it)."""
    model = tiny_hf_model("llama", layers=layers, hidden=hidden, intermediate=512)
    rot = model.model.rotary_emb
    model.model.rotary_emb = type(rot)(config=model.config)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits.float()


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _quant_layers(model: nn.Module) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def _assert_same_qfuse_model(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert {n: m.scheme for n, m in _quant_layers(a).items()} == {n: m.scheme for n, m in _quant_layers(b).items()}


# ----------------------------------------------------------------------------- written by qfuse


FALLBACK = {"W4A16": "W4A16_G64", "W4A16_ASYM": "W4A16_G64_ASYM", "W4A8_G128": "W4A8_G64"}


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")
@pytest.mark.parametrize("scheme", list(FALLBACK))
def test_fallback_layers_save_in_their_own_config_group_and_reload_identically(scheme, tmp_path):
    with pytest.warns(UserWarning, match=rf"12 of 14 layer\(s\) .* \({FALLBACK[scheme]}, e.g. model.layers.0.self_attn.q_proj\)"):
        model = qfuse.quantize_model(_tiny_model(), scheme, progress=False)
    layers = _quant_layers(model)
    ragged = sorted(n for n in layers if n.rpartition(".")[2] in RAGGED)
    assert len(ragged) == 12 and {layers[n].scheme.name for n in ragged} == {FALLBACK[scheme]}
    assert {layers[n].scheme.name for n in layers if n not in ragged} == {scheme}
    qfuse.save_quantized(model, tmp_path, progress=False)

    config = json.loads((tmp_path / "config.json").read_text())
    qc = config["quantization_config"]
    groups = list(qc["config_groups"].values())
    s = qfuse.get_scheme(scheme)
    if not s.weight_only:  # every layer a standard int8 W8A8 one (the extension), the groups in its group_sizes
        (entry,) = groups
        assert (entry["weights"]["num_bits"], entry["weights"]["strategy"]) == (8, "channel")
        assert sorted(config[EXTENSION_KEY]["layers"]) == sorted(layers)
        assert config[EXTENSION_KEY]["group_sizes"] == dict.fromkeys(ragged, 64)
    else:  # one config group per scheme, each naming its layers exactly
        assert len(groups) == 2
        (fallback,) = [g for g in groups if sorted(g["targets"]) == ragged]
        (other,) = [g for g in groups if g is not fallback]
        assert sorted(other["targets"]) == sorted(set(layers) - set(ragged))
        assert (fallback["weights"]["strategy"], fallback["weights"]["group_size"]) == ("group", 64)
        assert (other["weights"]["strategy"], other["weights"]["group_size"]) == ("group", 128)
        assert fallback["weights"]["symmetric"] == other["weights"]["symmetric"] == s.symmetric
        assert qc["format"] == "pack-quantized"
    QuantizationConfig.model_validate(qc)

    # compressed-tensors' compressors decompress every layer to the weights qfuse runs
    ct_weights = _ct_decompress_files(tmp_path)
    assert set(ct_weights) == set(layers)
    for name, layer in layers.items():
        assert torch.equal(ct_weights[name], layer.dequantized_weight()), name

    # qfuse reloads the per-layer groups, and the model, identically
    q = qfuse.from_pretrained(tmp_path, progress=False)
    _assert_same_qfuse_model(q, model)
    assert {layer.scheme.name for n, layer in _quant_layers(q).items() if n in ragged} == {FALLBACK[scheme]}
    ids = _ids()
    assert torch.equal(_logits(q, ids), _logits(model, ids))


# ----------------------------------------------------------------------------- written by compressed-tensors


@torch.no_grad()
def _write_ragged_checkpoint(path: Path, bits: int, symmetric: bool, hidden: int = 320, group: int = 128, packed_zero_points: bool = True) -> dict:
    """A pack-quantized checkpoint of group ``group`` over layers whose K it does not divide
    (see the module doc); returns compressed-tensors' decompressed weights per layer."""
    model = _tiny_model(hidden, layers=1)
    block = QuantizationArgs(type="int", num_bits=bits, symmetric=symmetric, strategy="block", block_structure=[1, group])
    qconfig = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=block)}, ignore=["lm_head"])
    apply_quantization_config(model, qconfig, show_progress=False)
    quantized = {n: m for n, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None}
    assert len(quantized) == 7
    for m in quantized.values():
        chunks = m.weight.split(group, dim=1)  # min-max per block of 1 x group (the last one partial)
        lo, hi = (torch.stack([fn(c, dim=1) for c in chunks], dim=1) for fn in (torch.amin, torch.amax))
        scale, zp = calculate_qparams(lo, hi, block)
        assert m.weight_scale.shape == scale.shape == (m.out_features, -(-m.in_features // group))
        m.weight_scale.data.copy_(scale)
        m.weight_zero_point.data.copy_(zp)
        m.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    decompressed = copy.deepcopy(model)
    model.save_pretrained(path)
    compressor.update_config(path)
    compressor.decompress_model(decompressed)
    ref = {n: decompressed.get_submodule(n).weight.detach().clone() for n in quantized}

    # relabel: strategy "group", group_size ``group``, zero points packed along N (>= 0.9.4)
    config = json.loads((path / "config.json").read_text())
    (weights,) = [g["weights"] for g in config["quantization_config"]["config_groups"].values()]
    assert (weights["strategy"], weights["block_structure"]) == ("block", [1, group])
    weights.update(strategy="group", group_size=group, block_structure=None)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(path / "model.safetensors")
    for name in [n for n in tensors if n.endswith(".weight_zero_point")]:
        zp = tensors[name]
        assert zp.dtype == torch.int8 and zp.shape == tensors[name.replace("zero_point", "scale")].shape
        if packed_zero_points:
            tensors[name] = pack_to_int32(zp, bits, packed_dim=0).contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return ref


CT_CASES = {  # case -> (bits, symmetric, packed zero points, scheme of the K = 320 layers, of down_proj)
    "w4_sym": (4, True, True, "W4A16_G64", "W4A16"),
    "w4_asym": (4, False, True, "W4A16_G64_ASYM", "W4A16_ASYM"),
    "w4_asym_unpacked_zp": (4, False, False, "W4A16_G64_ASYM", "W4A16_ASYM"),  # before compressed-tensors 0.9.4
    "w8_sym": (8, True, True, "W8A16_G64", "W8A16_G128"),
}


@pytest.mark.parametrize("case", list(CT_CASES))
def test_partial_last_group_loads_exactly_at_a_smaller_group(case, tmp_path):
    bits, symmetric, packed, ragged_scheme, down_scheme = CT_CASES[case]
    path = tmp_path / "ct"
    ref = _write_ragged_checkpoint(path, bits, symmetric, packed_zero_points=packed)
    tensors = _read_tensors(path)
    q_name = "model.layers.0.self_attn.q_proj"
    assert tensors[f"{q_name}.weight_scale"].shape == (320, 3)  # ceil(320 / 128), the last group 64 inputs wide
    assert tensors[f"{q_name}.weight_shape"].tolist() == [320, 320]
    if not symmetric:
        assert tensors[f"{q_name}.weight_zero_point"].shape == ((40, 3) if packed else (320, 3))
    qc = QuantizationConfig.model_validate(json.loads((path / "config.json").read_text())["quantization_config"])
    (group_scheme,) = qc.config_groups.values()
    assert (group_scheme.weights.strategy, group_scheme.weights.group_size) == ("group", 128)

    # compressed-tensors 0.20 does not decompress the group layer itself; a release that does must agree
    local = {k.rpartition(".")[2]: v for k, v in tensors.items() if k.startswith(q_name + ".")}
    try:
        own = PackedQuantizationCompressor.decompress(local, group_scheme)["weight"] if packed else None
    except ValueError as e:
        assert "tensor column shape must be divis" in str(e)
    else:
        assert own is None or torch.equal(own, ref[q_name])

    q = qfuse.from_pretrained(path, progress=False)
    layers = _quant_layers(q)
    assert set(layers) == set(ref)
    for name, layer in layers.items():
        want = ragged_scheme if name.rpartition(".")[2] in RAGGED else down_scheme
        assert layer.scheme.name == want, name
        assert layer.act_perm is None
        dq = layer.dequantized_weight()
        assert dq.dtype == BF16 and torch.equal(dq, ref[name]), name
    # the kernels run those weights: logits as F.linear with compressed-tensors' weights
    plain = _tiny_model(layers=1)
    for name, w in ref.items():
        plain.get_submodule(name).weight.data = w.clone()
    ids = _ids()
    assert _rel_err(_logits(q, ids), _logits(plain, ids)) < TOL_WEIGHT_ONLY

    # into a model built elsewhere, and saved back (group 64, which compressed-tensors reads itself)
    q2 = qfuse.load_quantized(path, _tiny_model(layers=1), progress=False)
    _assert_same_qfuse_model(q2, q)
    out = tmp_path / "saved"
    qfuse.save_quantized(q, out, progress=False)
    ct_weights = _ct_decompress_files(out)
    for name, layer in layers.items():
        assert torch.equal(ct_weights[name], ref[name]), name
    _assert_same_qfuse_model(qfuse.from_pretrained(out, progress=False), q)


def test_partial_last_group_without_an_exact_smaller_group_is_refused(tmp_path):
    # hidden 336 = 2 * 128 + 80: no group of 128, 64 or 32 divides both 128 and 336
    path = tmp_path / "ct"
    _write_ragged_checkpoint(path, 4, True, hidden=336)
    with pytest.raises(
        qfuse.CheckpointError,
        match=r"model.safetensors: layer model.layers.0.[\w.]+: in_features=336 is not divisible by "
        r"group_size=128 \(a partial last group\), and no group size qfuse's kernels run "
        r"\(128, 64, 32\) divides both",
    ):
        qfuse.from_pretrained(path, progress=False)


def test_partial_last_group_refusals(tmp_path):
    path = tmp_path / "ct"
    _write_ragged_checkpoint(path, 4, False)
    config_text = (path / "config.json").read_text()

    # act-order: the stored groups are permuted, not re-expressible by repeating columns
    config = json.loads(config_text)
    for g in config["quantization_config"]["config_groups"].values():
        g["weights"]["actorder"] = "group"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        qfuse.CheckpointError,
        match=r"in_features=320 is not divisible by group_size=128 \(a partial last group\), "
        r"which qfuse re-expresses only in layers without act-order",
    ):
        qfuse.from_pretrained(path, progress=False)

    # per-group tensors of the wrong shape: the message says why 3 groups are expected
    (path / "config.json").write_text(config_text)
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.0.mlp.up_proj"
    tensors[f"{name}.weight_zero_point"] = tensors[f"{name}.weight_zero_point"][:, :2].contiguous()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        qfuse.CheckpointError,
        match=rf"layer {name}: in_features=320 is not divisible by group_size=128 \(a partial last group\): "
        r"weight_zero_point has shape \[64, 2\], expected \[64, 3\]",
    ):
        qfuse.from_pretrained(path, progress=False)


@pytest.mark.parametrize(
    ("group_sizes", "match"), [({"model.layers.0.self_attn.q_proj": 96}, "group size in"), ({"model.not_a_layer": 64}, "is not a listed layer")]
)
def test_extension_group_sizes_are_checked(tmp_path, group_sizes, match):
    """A W4A8 extension ``group_sizes`` entry must name a listed layer and a group w4a8_gemm runs."""
    with pytest.warns(UserWarning):
        model = qfuse.quantize_model(_tiny_model(), "W4A8_G128", progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config[EXTENSION_KEY]["group_sizes"] = group_sizes
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(qfuse.CheckpointError, match=match):
        qfuse.from_pretrained(tmp_path, progress=False)
