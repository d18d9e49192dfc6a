"""compressed-tensors checkpoints against compressed-tensors' own code (the installed package,
0.20 when written): checkpoints that its compressors write (as llm-compressor saves them) load
into qfuse with exactly the weights its decompressors give, and checkpoints that qfuse writes
decompress, with its compressor classes and through transformers, to exactly the weights
qfuse runs.

Exactness conventions (compressed-tensors dequantizes in the dtype of ``weight_scale``):

* weight-only layers: ``dequantized_weight()`` is in the scales' dtype (bf16 here), the
  same dtype compressed-tensors computes in; compared with ``torch.equal`` directly.
* int8-activation layers: ``dequantized_weight()`` is float32 ``w_scale * q``. A checkpoint
  written by compressed-tensors has bf16 scales, so its decompressed weight is bf16 and is
  compared with qfuse's value cast to bf16; a checkpoint written by qfuse has float32
  ``weight_scale``, and the float32 values are compared as they are.

compressed-tensors 0.20 removed ``actorder: "group"`` (its QuantizationArgs refuses it and its
compressors ignore ``weight_g_idx``), which older releases (and llm-compressor's GPTQ) wrote.
The act-order checkpoint below is therefore written by compressed-tensors' compressors from a
model whose input channels were permuted into group order, then re-laid out as those releases
stored it (codes in the model's input order, ``weight_g_idx``, ``actorder: "group"``); its
reference weight is compressed-tensors' decompression of the permuted layer, un-permuted,
which is what the old g_idx dequantization (``scale[:, g_idx[k]]`` for input k) computes.
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

from compressed_tensors.compressors import BaseCompressor, ModelCompressor  # noqa: E402
from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    QuantizationStatus,
)
from compressed_tensors.quantization.lifecycle.apply import apply_quantization_config  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402
from compressed_tensors.utils.match import match_name, match_targets  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import qfuse  # noqa: E402
from qfuse import QuantLinear  # noqa: E402
from qfuse.formats.compressed_tensors import EXTENSION_KEY, EXTENSION_NAME  # noqa: E402
from tests.hf_models import tiny_hf_model  # noqa: E402

BF16 = torch.bfloat16
# Loose bounds for qfuse's logits against compressed-tensors' fake-quant model (relative
# Frobenius error over all logits). Weight-only: same weights, only bf16 GEMM rounding
# differs. int8 activations: compressed-tensors' per-token scale is amax/127.5 and qfuse's
# amax/127, and it fake-quantizes in bf16, so activation codes round differently.
# Seen: weight-only <= 5e-3 (mostly 0), int8 activations 1.6e-2 (dynamic) and 2.4e-2 (static).
TOL_WEIGHT_ONLY = 1e-2
TOL_INT8_ACT = 5e-2


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _tiny_model() -> nn.Module:
    """A 1-layer bf16 random Llama with a float32 rotary inv_freq (as from_pretrained builds it;
    tiny_hf_model's .to(bf16) rounds inv_freq)."""
    model = tiny_hf_model("llama", layers=1)
    rot = model.model.rotary_emb
    model.model.rotary_emb = type(rot)(config=model.config)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits.float()


def _quant_layers(model: nn.Module) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory (one file, or shards listed in the index)."""
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(path / f))
    return out


def _ct_decompress_files(path: Path) -> dict[str, torch.Tensor]:
    """Each quantized layer's weight as compressed-tensors decompresses it from the files:
    the config validated by its QuantizationConfig, each layer's scheme picked as
    apply_quantization_config picks it, its compressor class's ``decompress``."""
    config = json.loads((path / "config.json").read_text())
    qc = QuantizationConfig.model_validate(config["quantization_config"])
    target_to_scheme = {t: s for s in qc.config_groups.values() for t in s.targets}
    tensors = _read_tensors(path)
    prefixes = sorted({n.rpartition(".")[0] for n in tensors if n.endswith(".weight_scale")})
    out = {}
    for p in prefixes:
        assert not any(match_name(p, t) for t in qc.ignore), p
        targets = match_targets(p, nn.Linear(1, 1), target_to_scheme)
        assert targets, f"no config group targets {p}"
        scheme = target_to_scheme[targets[0]]
        compressor = BaseCompressor.get_value_from_registry(scheme.format or qc.format)
        assert issubclass(compressor, (PackedQuantizationCompressor, NaiveQuantizationCompressor)), compressor
        local = {n[len(p) + 1 :]: t for n, t in tensors.items() if n.startswith(p + ".") and "." not in n[len(p) + 1 :]}
        out[p] = compressor.decompress(local, scheme)["weight"]
    return out


# ----------------------------------------------------------------- checkpoints by compressed-tensors


def _args(**kw) -> QuantizationArgs:
    return QuantizationArgs(type="int", **kw)


TOKEN_DYNAMIC = dict(num_bits=8, symmetric=True, strategy="token", dynamic=True)
TENSOR_STATIC = dict(num_bits=8, symmetric=True, strategy="tensor", dynamic=False)

LINEAR = ["Linear"]
G128_SYM = dict(num_bits=4, symmetric=True, strategy="group", group_size=128)
G128_ASYM = dict(num_bits=4, symmetric=False, strategy="group", group_size=128)
CHANNEL8 = dict(num_bits=8, symmetric=True, strategy="channel")

# case -> ({config group: (targets, weights args, input-activation args or None)}, the qfuse
# scheme name expected for every layer, or by the layer name's last component)
CT_CASES = {
    "W4A16_g128_sym": ({"group_0": (LINEAR, G128_SYM, None)}, "W4A16"),
    "W4A16_g128_asym": ({"group_0": (LINEAR, G128_ASYM, None)}, "W4A16_ASYM"),
    "W4A16_g64_asym": ({"group_0": (LINEAR, dict(G128_ASYM, group_size=64), None)}, "W4A16_G64_ASYM"),
    "W8A16_channel": ({"group_0": (LINEAR, CHANNEL8, None)}, "W8A16"),
    "W4A16_channel": ({"group_0": (LINEAR, dict(num_bits=4, symmetric=True, strategy="channel"), None)}, "W4A16_CH"),
    "W8A8_dynamic_token": ({"group_0": (LINEAR, CHANNEL8, TOKEN_DYNAMIC)}, "W8A8"),
    "W8A8_channel_weights_static": ({"group_0": (LINEAR, CHANNEL8, TENSOR_STATIC)}, "W8A8_STATIC"),
    "W4A16_actorder_group": ({"group_0": (LINEAR, G128_SYM, None)}, "W4A16"),
    # actorder "weight" (0.20's replacement) only reorders during calibration: no g_idx
    "W4A16_actorder_weight": ({"group_0": (LINEAR, dict(G128_SYM, actorder="weight"), None)}, "W4A16"),
    "W8A8_tensor_weights_static": ({"group_0": (LINEAR, dict(CHANNEL8, strategy="tensor"), TENSOR_STATIC)}, "W8A8_STATIC"),
    # one zero point per layer (stored unpacked): qfuse drops one that is 0 (the symmetric path computes the same)
    "W4A16_tensor_asym": ({"group_0": (LINEAR, dict(num_bits=4, symmetric=False, strategy="tensor"), None)}, ("W4A16_CH_ASYM", "W4A16_CH")),
    "W4A8_channel": ({"group_0": (LINEAR, dict(num_bits=4, symmetric=True, strategy="channel"), TOKEN_DYNAMIC)}, "W4A8"),
    # mixed-precision: an exact name beats a regex, a regex beats a class name, whatever the group order
    "mixed_precision": (
        {
            "group_0": (["re:.*mlp.*"], G128_ASYM, None),
            "group_1": (["model.layers.0.mlp.down_proj"], CHANNEL8, TOKEN_DYNAMIC),
            "group_2": (LINEAR, G128_SYM, None),
        },
        {
            "down_proj": "W8A8",
            "gate_proj": "W4A16_ASYM",
            "up_proj": "W4A16_ASYM",
            "q_proj": "W4A16",
            "k_proj": "W4A16",
            "v_proj": "W4A16",
            "o_proj": "W4A16",
        },
    ),
}
ACTORDER = "W4A16_actorder_group"
# compressed-tensors' W4A8 preset: float group scales, which qfuse's W4A8 kernels cannot run exactly
CT_REFUSED = {"W4A8_g128": ({"group_0": (LINEAR, G128_SYM, TOKEN_DYNAMIC)}, None)}


def _weight_minmax(w: torch.Tensor, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """Min/max per group ([N, K/G]) or per channel ([N, 1]), as llm-compressor's min-max observer reduces."""
    n, k = w.shape
    if args.strategy == "group":
        wg = w.reshape(n, k // args.group_size, args.group_size)
        return wg.amin(-1), wg.amax(-1)
    if args.strategy == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    return w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)


@torch.no_grad()
def _input_amax(model: nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per Linear, the absolute max of its input over a calibration batch."""
    amax, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            hooks.append(m.register_forward_pre_hook(lambda mod, args, name=name: amax.__setitem__(name, args[0].abs().amax())))
    model(ids)
    for h in hooks:
        h.remove()
    return amax


def _relayout_act_order(path: Path, perms: dict[str, torch.Tensor], group_size: int) -> None:
    """Turn the pack-quantized checkpoint of a model whose layers got input order ``perm``
    (column j of the stored layer is model input perm[j]) into the act-order layout older
    compressed-tensors wrote: codes in the model's input order plus ``weight_g_idx``."""
    assert sorted(p.name for p in path.glob("*.safetensors")) == ["model.safetensors"]
    tensors = load_file(path / "model.safetensors")
    for prefix, perm in perms.items():
        shape = tensors[f"{prefix}.weight_shape"]
        q = unpack_from_int32(tensors[f"{prefix}.weight_packed"], 4, shape)  # signed codes, permuted order
        q_model = torch.empty_like(q)
        q_model[:, perm] = q
        tensors[f"{prefix}.weight_packed"] = pack_to_int32(q_model, 4)
        g_idx = torch.empty(perm.numel(), dtype=torch.int32)
        g_idx[perm] = torch.arange(perm.numel(), dtype=torch.int32) // group_size
        tensors[f"{prefix}.weight_g_idx"] = g_idx
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    for group in config["quantization_config"]["config_groups"].values():
        group["weights"]["actorder"] = "group"
    (path / "config.json").write_text(json.dumps(config, indent=2))


@torch.no_grad()
def _write_ct_checkpoint(case: str, path: Path) -> dict:
    """A checkpoint written the way llm-compressor saves one; returns the reference weights
    (compressed-tensors' own decompression of the compressed model) and fake-quant logits."""
    groups, _ = {**CT_CASES, **CT_REFUSED}[case]
    ids = _ids()
    model = _tiny_model()
    perms = {}
    if case == ACTORDER:  # a random non-monotonic g_idx: store each layer's inputs in group order
        gen = torch.Generator().manual_seed(2)
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear) and name != "lm_head":
                perms[name] = torch.randperm(m.in_features, generator=gen)
                m.weight.data = m.weight.data[:, perms[name]].contiguous()
    static = any(a is not None and not a["dynamic"] for _, _, a in groups.values())
    amax = _input_amax(model, ids) if static else {}
    qconfig = QuantizationConfig(
        config_groups={
            g: QuantizationScheme(targets=t, weights=_args(**w), input_activations=_args(**a) if a else None) for g, (t, w, a) in groups.items()
        },
        ignore=["lm_head"],
    )
    apply_quantization_config(model, qconfig, show_progress=False)
    quantized = {n: m for n, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None}
    assert len(quantized) == 7
    for name, m in quantized.items():
        args = m.quantization_scheme.weights
        scale, zp = calculate_qparams(*_weight_minmax(m.weight, args), args)
        m.weight_scale.data.copy_(scale)
        m.weight_zero_point.data.copy_(zp)
        if hasattr(m, "input_scale"):
            m.input_scale.data.copy_((amax[name] / 127).reshape(1))
        m.quantization_status = QuantizationStatus.FROZEN
    fake_quant_logits = None if perms else _logits(model, ids)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    decompressed = copy.deepcopy(model)  # a compressed copy, decompressed after the config is written
    model.save_pretrained(path)
    compressor.update_config(path)
    compressor.decompress_model(decompressed)
    ref = {n: m.weight.detach().clone() for n, m in decompressed.named_modules() if n in quantized}
    if perms:
        _relayout_act_order(path, perms, groups["group_0"][1]["group_size"])
        ref = {n: torch.empty_like(w).index_copy_(1, perms[n], w) for n, w in ref.items()}  # model input order
        plain = _tiny_model()  # compressed-tensors' fake-quant forward of weight-only layers = F.linear with these weights
        for n, w in ref.items():
            plain.get_submodule(n).weight.data = w.clone()
        fake_quant_logits = _logits(plain, ids)
    static_scales = {n: m.input_scale.detach().clone() for n, m in quantized.items() if hasattr(m, "input_scale")}
    return {"path": path, "ref": ref, "logits": fake_quant_logits, "ids": ids, "perms": perms, "input_scale": static_scales}


_CT_CACHE: dict[str, dict] = {}


@pytest.fixture(scope="module")
def ct_checkpoints(tmp_path_factory):
    def get(case: str) -> dict:
        if case not in _CT_CACHE:
            _CT_CACHE[case] = _write_ct_checkpoint(case, tmp_path_factory.mktemp(case))
        return _CT_CACHE[case]

    yield get
    _CT_CACHE.clear()


def _expected_schemes(expect: str | tuple | dict, name: str) -> tuple[str, ...]:
    if isinstance(expect, dict):
        expect = expect[name.rpartition(".")[2]]
    return (expect,) if isinstance(expect, str) else expect


def _assert_matches_ct_reference(q: nn.Module, ck: dict, expect: str | dict) -> None:
    layers = _quant_layers(q)
    assert set(layers) == set(ck["ref"])
    for name, layer in layers.items():
        ref = ck["ref"][name]
        assert layer.scheme.name in _expected_schemes(expect, name), name
        assert ref.dtype == BF16  # compressed-tensors decompresses in the scale dtype (the model's bf16 here)
        dq = layer.dequantized_weight()
        if layer.scheme.weight_only:
            assert dq.dtype == BF16
        else:
            assert dq.dtype == torch.float32
            dq = dq.to(ref.dtype)  # w_scale * q in float32, compared in compressed-tensors' bf16
        assert torch.equal(dq, ref), name


@pytest.mark.parametrize("case", list(CT_CASES))
def test_compressed_tensors_checkpoint_loads_exactly(ct_checkpoints, case):
    ck = ct_checkpoints(case)
    groups, expect = CT_CASES[case]
    q = qfuse.from_pretrained(ck["path"], progress=False)
    _assert_matches_ct_reference(q, ck, expect)
    if case == "W4A16_tensor_asym":
        assert any(layer.zeros is not None for layer in _quant_layers(q).values())
    assert isinstance(q.lm_head, nn.Linear) and q.lm_head.weight.dtype == BF16
    for name, layer in _quant_layers(q).items():
        assert (layer.act_perm is not None) == (case == ACTORDER), name
        if case == ACTORDER:
            assert not torch.equal(layer.act_perm, torch.arange(layer.in_features)), name
        assert layer.scheme.static_act == case.endswith("_static"), name
        if layer.scheme.static_act:
            assert layer.input_scale.dtype == torch.float32
            assert torch.equal(layer.input_scale, ck["input_scale"][name].float().reshape(1)), name
        else:
            assert getattr(layer, "input_scale", None) is None
    logits = _logits(q, ck["ids"])
    int8_act = any(a is not None for _, _, a in groups.values())
    tol = TOL_INT8_ACT if int8_act else TOL_WEIGHT_ONLY
    assert _rel_err(logits, ck["logits"]) < tol

    # the same checkpoint into a float model built elsewhere
    skeleton = _tiny_model()
    q2 = qfuse.load_quantized(ck["path"], skeleton, progress=False)
    assert q2 is skeleton
    _assert_matches_ct_reference(q2, ck, expect)
    assert torch.equal(_logits(q2, ck["ids"]), logits)


@pytest.mark.parametrize("case", [c for c in CT_CASES if c != ACTORDER])
def test_compressed_tensors_checkpoint_saves_back(ct_checkpoints, case, tmp_path):
    """Loaded into qfuse and saved again (several config groups for mixed precision), the
    checkpoint decompresses with compressed-tensors' compressors to the original weights."""
    ck = ct_checkpoints(case)
    q = qfuse.from_pretrained(ck["path"], progress=False)
    qfuse.save_quantized(q, tmp_path, progress=False)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert (qc["format"] == "mixed-precision") == (case == "mixed_precision")
    ct_weights = _ct_decompress_files(tmp_path)
    assert set(ct_weights) == set(ck["ref"])
    for name, layer in _quant_layers(q).items():
        assert torch.equal(ct_weights[name], layer.dequantized_weight()), name
        assert torch.equal(ct_weights[name].to(BF16), ck["ref"][name]), name
    q2 = qfuse.from_pretrained(tmp_path, progress=False)
    _assert_same_qfuse_model(q2, q)


def test_load_quantized_into_meta_skeleton(ct_checkpoints):
    ck = ct_checkpoints("W4A16_g128_sym")
    config = transformers.AutoConfig.from_pretrained(ck["path"])
    del config.quantization_config
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    q = qfuse.load_quantized(ck["path"], skeleton, progress=False)
    _assert_matches_ct_reference(q, ck, "W4A16")
    assert not [n for n, b in q.named_buffers() if b.is_meta]
    assert torch.equal(_logits(q, ck["ids"]), _logits(qfuse.from_pretrained(ck["path"], progress=False), ck["ids"]))


def test_w4a8_with_float_group_scales_is_refused(ct_checkpoints):
    ck = ct_checkpoints("W4A8_g128")
    with pytest.raises(qfuse.CheckpointError, match="W4A8 with floating-point group scales"):
        qfuse.from_pretrained(ck["path"], progress=False)


def test_unpacked_int8_zero_points_of_older_releases(ct_checkpoints, tmp_path):
    """compressed-tensors < 0.9.4 stored asymmetric zero points unpacked (int8 [N, groups])."""
    ck = ct_checkpoints("W4A16_g64_asym")
    old = tmp_path / "old"
    old.mkdir()
    tensors = load_file(ck["path"] / "model.safetensors")
    for name in [n for n in tensors if n.endswith(".weight_zero_point")]:
        prefix = name.rpartition(".")[0]
        n = int(tensors[f"{prefix}.weight_shape"][0])
        groups = tensors[f"{prefix}.weight_scale"].shape[1]
        tensors[name] = unpack_from_int32(tensors[name], 4, torch.Size([n, groups]), packed_dim=0).to(torch.int8).contiguous()
    save_file(tensors, old / "model.safetensors", metadata={"format": "pt"})
    (old / "config.json").write_text((ck["path"] / "config.json").read_text())
    _assert_matches_ct_reference(qfuse.from_pretrained(old, progress=False), ck, "W4A16_G64_ASYM")


def test_zero_points_of_symmetric_int8_layers_from_older_releases(ct_checkpoints, tmp_path):
    """Releases before mid 2024 also stored all-zero weight/input zero points of symmetric
    layers; they load as without them. A non-zero one (asymmetric activations) is refused."""
    ck = ct_checkpoints("W8A8_channel_weights_static")
    tensors = load_file(ck["path"] / "model.safetensors")
    for prefix in ck["ref"]:
        tensors[f"{prefix}.weight_zero_point"] = torch.zeros(tensors[f"{prefix}.weight_scale"].shape, dtype=torch.int8)
        tensors[f"{prefix}.input_zero_point"] = torch.zeros(1, dtype=torch.int8)
    for name, zp in (("with_zeros", 0), ("asymmetric", 3)):
        d = tmp_path / name
        d.mkdir()
        tensors["model.layers.0.mlp.up_proj.input_zero_point"] = torch.full((1,), zp, dtype=torch.int8)
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
        (d / "config.json").write_text((ck["path"] / "config.json").read_text())
        if zp == 0:
            q = qfuse.from_pretrained(d, progress=False)
            _assert_matches_ct_reference(q, ck, "W8A8_STATIC")
        else:
            with pytest.raises(qfuse.CheckpointError, match="up_proj: input_zero_point is not zero"):
                qfuse.from_pretrained(d, progress=False)


# ----------------------------------------------------------------- checkpoints by qfuse


@pytest.fixture(scope="module")
def qfuse_saved(tmp_path_factory):
    cache = {}

    def get(scheme: str) -> dict:
        if scheme not in cache:
            model = qfuse.quantize_model(_tiny_model(), scheme, progress=False)
            path = qfuse.save_quantized(model, tmp_path_factory.mktemp(scheme), progress=False)
            cache[scheme] = {"model": model, "path": path}
        return cache[scheme]

    return get


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")
@pytest.mark.parametrize("scheme", list(qfuse.SCHEMES))
def test_qfuse_checkpoint_decompresses_with_compressed_tensors(qfuse_saved, scheme):
    saved = qfuse_saved(scheme)
    model, path = saved["model"], saved["path"]
    layers = _quant_layers(model)
    config = json.loads((path / "config.json").read_text())

    # (a) the written config is a valid compressed-tensors QuantizationConfig
    qc = QuantizationConfig.model_validate(config["quantization_config"])
    assert qc.quantization_status == QuantizationStatus.COMPRESSED
    assert qc.ignore == ["lm_head"]
    weight_only = qfuse.SCHEMES[scheme].weight_only
    assert qc.format == ("pack-quantized" if weight_only else "int-quantized")

    # (b) compressed-tensors' compressor classes give exactly the weights qfuse runs
    ct_weights = _ct_decompress_files(path)
    assert set(ct_weights) == set(layers)
    for name, layer in layers.items():
        dq = layer.dequantized_weight()
        assert ct_weights[name].dtype == dq.dtype == (BF16 if weight_only else torch.float32), name
        assert torch.equal(ct_weights[name], dq), name

    # (c) transformers + compressed-tensors (decompressed on load) holds the same weights
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=transformers.CompressedTensorsConfig(run_compressed=False))
    for name, layer in layers.items():
        w = hf.get_submodule(name).weight.detach()
        assert w.dtype == BF16  # transformers casts the decompressed weight to the model's dtype
        assert torch.equal(w, layer.dequantized_weight().to(BF16)), name
    assert torch.equal(hf.lm_head.weight, model.lm_head.weight)
    del hf

    # (d) qfuse reloads it with identical logits
    q = qfuse.from_pretrained(path, progress=False)
    ids = _ids()
    assert torch.equal(_logits(q, ids), _logits(model, ids))
    reloaded = _quant_layers(q)
    for name, layer in layers.items():
        assert reloaded[name].scheme.name == scheme
        assert torch.equal(reloaded[name].dequantized_weight(), layer.dequantized_weight()), name

    # (e) W4A8_G128: plain int8 W8A8 tensors on disk, listed in the extension, reloaded 4-bit
    ext = config.get(EXTENSION_KEY)
    tensors = _read_tensors(path)
    if scheme != "W4A8_G128":
        assert ext is None
        return
    assert ext["name"] == EXTENSION_NAME and sorted(ext["layers"]) == sorted(layers)
    (group,) = qc.config_groups.values()
    assert (group.weights.num_bits, group.weights.strategy, group.weights.symmetric) == (8, "channel", True)
    assert (group.input_activations.num_bits, group.input_activations.strategy, group.input_activations.dynamic) == (8, "token", True)
    for name, layer in reloaded.items():
        assert tensors[f"{name}.weight"].dtype == torch.int8 and tensors[f"{name}.weight"].shape == (layer.out_features, layer.in_features)
        assert tensors[f"{name}.weight_scale"].shape == (layer.out_features, 1)
        assert f"{name}.weight_packed" not in tensors and f"{name}.input_scale" not in tensors
        assert layer.qweight.dtype == torch.uint8 and layer.qweight.shape == (layer.out_features, layer.in_features // 2)
        assert layer.group_scale.shape == (layer.out_features, layer.in_features // 128)
        assert layer.group_scale.dtype == torch.int8 and 1 <= int(layer.group_scale.min()) <= int(layer.group_scale.max()) <= 16
        # the 4-bit split may differ from the original's, the int8 product may not
        assert torch.equal(layer.dequantized_weight(), layers[name].dequantized_weight()), name


# ----------------------------------------------------------------- sharding


def _assert_same_qfuse_model(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def test_sharded_save_reloads_identically_and_replaces_stale_shards(qfuse_saved, tmp_path):
    saved = qfuse_saved("W4A16")
    model = saved["model"]
    single = qfuse.from_pretrained(saved["path"], progress=False)

    qfuse.save_quantized(model, tmp_path, max_shard_size="200KB", progress=False)
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    n = len(shards)
    assert n >= 3 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    tensors = _read_tensors(tmp_path)
    assert set(index["weight_map"]) == set(tensors)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    sharded = qfuse.from_pretrained(tmp_path, progress=False)
    _assert_same_qfuse_model(sharded, single)
    ids = _ids()
    assert torch.equal(_logits(sharded, ids), _logits(model, ids))
    ct_weights = _ct_decompress_files(tmp_path)
    for name, layer in _quant_layers(model).items():
        assert torch.equal(ct_weights[name], layer.dequantized_weight()), name

    # more, smaller shards: the old ones are replaced
    qfuse.save_quantized(model, tmp_path, max_shard_size="100KB", progress=False)
    more = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    m = len(more)
    assert m > n and more == [f"model-{i:05d}-of-{m:05d}.safetensors" for i in range(1, m + 1)]
    _assert_same_qfuse_model(qfuse.from_pretrained(tmp_path, progress=False), single)

    # one file again: no shard and no index left behind
    qfuse.save_quantized(model, tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]
    assert not (tmp_path / "model.safetensors.index.json").exists()
    _assert_same_qfuse_model(qfuse.from_pretrained(tmp_path, progress=False), single)


def test_save_keeps_other_safetensors_files_and_warns(qfuse_saved, tmp_path):
    """Only the model checkpoint's own files are replaced: an adapter or a shard an old index
    lists under another name is the user's data (the first form deleted every *.safetensors)."""
    from safetensors.torch import save_file

    model = qfuse_saved("W4A16")["model"]
    save_file({"a": torch.ones(2)}, tmp_path / "adapter_model.safetensors")
    save_file({"b": torch.ones(2)}, tmp_path / "weights-part1.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"b": "weights-part1.safetensors"}}))
    save_file({"c": torch.ones(2)}, tmp_path / "model-00002-of-00009.safetensors")
    with pytest.warns(UserWarning, match=r"also holds adapter_model\.safetensors, kept"):
        qfuse.save_quantized(model, tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["adapter_model.safetensors", "model.safetensors"]
    assert not (tmp_path / "model.safetensors.index.json").exists()
    _assert_same_qfuse_model(qfuse.from_pretrained(tmp_path, progress=False), qfuse.from_pretrained(qfuse_saved("W4A16")["path"], progress=False))


# ----------------------------------------------------------------- act-order round trip


def test_act_order_layers_save_with_g_idx_and_reload_identically(ct_checkpoints, tmp_path):
    ck = ct_checkpoints(ACTORDER)
    q = qfuse.from_pretrained(ck["path"], progress=False)
    layers = _quant_layers(q)
    assert all(layer.act_perm is not None for layer in layers.values())
    qfuse.save_quantized(q, tmp_path, progress=False)

    config = json.loads((tmp_path / "config.json").read_text())
    qc_dict = config["quantization_config"]
    for group in qc_dict["config_groups"].values():
        assert group["weights"]["actorder"] == "group" and group["weights"]["group_size"] == 128
        assert group["format"] == "pack-quantized"
    # everything but actorder="group" (removed in compressed-tensors 0.20) validates
    stripped = copy.deepcopy(qc_dict)
    for group in stripped["config_groups"].values():
        group["weights"]["actorder"] = None
    QuantizationConfig.model_validate(stripped)

    # the layout compressed-tensors wrote before 0.20, tensor for tensor
    written, original = _read_tensors(tmp_path), _read_tensors(ck["path"])
    for name in layers:
        for t in ("weight_packed", "weight_scale", "weight_shape", "weight_g_idx"):
            assert torch.equal(written[f"{name}.{t}"], original[f"{name}.{t}"]), f"{name}.{t}"
        assert f"{name}.weight_zero_point" not in written
        # old compressed-tensors' g_idx dequantization, through compressed-tensors' code on the
        # channels sorted by group: w[n, k] = q[n, k] * scale[n, g_idx[k]]
        g_idx = written[f"{name}.weight_g_idx"].long()
        perm = torch.sort(g_idx, stable=True).indices
        q_codes = unpack_from_int32(written[f"{name}.weight_packed"], 4, written[f"{name}.weight_shape"])
        args = _args(num_bits=4, symmetric=True, strategy="group", group_size=128)
        w_sorted = dequantize(q_codes[:, perm], written[f"{name}.weight_scale"], None, args)
        w = torch.empty_like(w_sorted).index_copy_(1, perm, w_sorted)
        assert torch.equal(w, ck["ref"][name]), name
        assert torch.equal(w, layers[name].dequantized_weight()), name

    q2 = qfuse.from_pretrained(tmp_path, progress=False)
    _assert_same_qfuse_model(q2, q)
    assert torch.equal(_logits(q2, ck["ids"]), _logits(q, ck["ids"]))
