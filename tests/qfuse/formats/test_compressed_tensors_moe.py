"""compressed-tensors checkpoints of sparse-MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE; tiny random
configs): ``save_quantized`` writes each expert of a ``QuantMoE`` as one quantized Linear per expert
and projection under the Hugging Face checkpoint names, the same tensors and config group as a
dense layer of the scheme; ``from_pretrained`` / ``load_quantized`` stack them back into the
very buffers that were saved.

Checked against the installed packages: the names against transformers' own ``save_pretrained``
of the float model, each expert layer against compressed-tensors' compressor classes (their
``decompress``, as in test_compressed_tensors.py), and for symmetric pack-quantized experts the
whole checkpoint through transformers + compressed-tensors. transformers 5.24's decompression of
fused experts (``CompressedTensorsDequantize``) reads ``weight_packed`` / ``weight_scale`` /
``weight_shape`` only, so it refuses asymmetric (``weight_zero_point``) and int-quantized
(``weight``) experts and float experts in a compressed-tensors checkpoint; those are checked layer
by layer only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("compressed_tensors")
transformers = pytest.importorskip("transformers")

from compressed_tensors.quantization import QuantizationConfig  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import qfuse  # noqa: E402
from qfuse.formats.compressed_tensors import EXTENSION_KEY  # noqa: E402
from qfuse.moe import QuantMoE  # noqa: E402
from tests.qfuse.formats.test_compressed_tensors import _ct_decompress_files, _read_tensors  # noqa: E402
from tests.qfuse.test_checkpoint import float32_rotary  # noqa: E402
from tests.qfuse.test_moe import tiny_moe_model  # noqa: E402

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
# Hugging Face checkpoint names: arch -> (the block's last name component, gate / up / down of expert e)
HF_EXPERTS = {
    "mixtral": ("block_sparse_moe", ("w1", "w3", "w2")),
    "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
    "qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
}
# every MoE scheme once, every arch at least twice; hidden = intermediate = 128, so group 128 applies to experts and dense layers
CASES = [
    ("W8A16", "mixtral"),
    ("W4A16", "mixtral"),
    ("W4A16", "qwen2_moe"),
    ("W4A16_ASYM", "qwen3_moe"),
    ("W8A8", "qwen2_moe"),
    ("W4A8", "qwen3_moe"),
    ("W4A8_G128", "mixtral"),
    ("W4A8_G128", "qwen2_moe"),
]
DENSE = "model.layers.0.self_attn.o_proj"  # [128, 128]: the experts' scheme, no group fallback
EXPERTS, HIDDEN, INTER = 4, 128, 128


def _model(arch: str, **kw) -> torch.nn.Module:
    """2 layers, hidden 128, 4 experts of intermediate 128, top-2, with float32 rotary buffers (as loaded)."""
    return float32_rotary(tiny_moe_model(arch, **{"hidden": HIDDEN, "intermediate": INTER, "experts": EXPERTS, "layers": 2, **kw}))


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def _logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(_ids(), use_cache=False).logits


def _moes(model) -> dict[str, QuantMoE]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantMoE)}


def _hf_block(name: str, arch: str) -> str:
    return name.rpartition(".")[0] + "." + HF_EXPERTS[arch][0]


def _assert_same_model(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    for name, moe in _moes(b).items():
        got = a.get_submodule(name)
        assert isinstance(got, QuantMoE) and got.block_type == moe.block_type, name
        x, y = got.experts, moe.experts
        assert (x.scheme, x.num_experts, x.hidden_size, x.intermediate_size, x.top_k, x.renormalize) == (
            y.scheme,
            y.num_experts,
            y.hidden_size,
            y.intermediate_size,
            y.top_k,
            y.renormalize,
        ), name
        assert [b is None for b in x._buffers.values()] == [b is None for b in y._buffers.values()], name  # zeros, group scales


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cache = {}

    def get(arch: str, scheme: str) -> tuple[torch.nn.Module, Path]:
        if (arch, scheme) not in cache:
            model = qfuse.quantize_model(_model(arch), scheme, progress=False)
            path = qfuse.save_quantized(model, tmp_path_factory.mktemp(f"{arch}_{scheme}"), progress=False)
            cache[arch, scheme] = model, path
        return cache[arch, scheme]

    return get


@pytest.mark.parametrize(("scheme", "arch"), CASES)
def test_experts_reload_bit_exactly(saved, scheme, arch):
    model, path = saved(arch, scheme)
    assert len(_moes(model)) == 2 and all(m.experts.scheme.name == scheme for m in _moes(model).values())
    loaded = qfuse.from_pretrained(path, progress=False)
    _assert_same_model(loaded, model)
    assert torch.equal(_logits(loaded), _logits(model))

    # into a float model built elsewhere (Hugging Face blocks with real weights)
    skeleton = _model(arch)
    assert qfuse.load_quantized(path, skeleton, progress=False) is skeleton
    _assert_same_model(skeleton, model)


@pytest.mark.parametrize(("scheme", "arch"), CASES)
def test_experts_are_dense_compressed_tensors_layers(saved, scheme, arch):
    """Each expert projection has exactly the tensors (names, dtypes) of a dense layer of the scheme,
    sits in the dense layers' config group, and compressed-tensors' compressor decompresses it to
    exactly the expert weight qfuse runs."""
    model, path = saved(arch, scheme)
    config = json.loads((path / "config.json").read_text())
    qc = QuantizationConfig.model_validate(config["quantization_config"])
    (group,) = qc.config_groups.values()
    assert group.targets == ["Linear"]
    tensors = _read_tensors(path)
    decompressed = _ct_decompress_files(path)

    def local(prefix: str) -> dict[str, torch.dtype]:
        return {k[len(prefix) + 1 :]: t.dtype for k, t in tensors.items() if k.startswith(f"{prefix}.")}

    dense = local(DENSE)
    assert "weight_scale" in dense
    experts = []
    for name, moe in _moes(model).items():
        gate_up, down = moe.experts.dequantized_weights()
        for e in range(EXPERTS):
            for prefix, w in zip(
                (f"{_hf_block(name, arch)}.experts.{e}.{p}" for p in HF_EXPERTS[arch][1]), (gate_up[e, :INTER], gate_up[e, INTER:], down[e])
            ):
                assert local(prefix) == dense, prefix
                assert decompressed[prefix].dtype == w.dtype and torch.equal(decompressed[prefix], w), prefix
                experts.append(prefix)
    assert not [n for n in tensors if ".experts.gate_up_proj" in n or n.endswith(".experts.w13")]
    routers = [f"{_hf_block(n, arch)}.gate" for n in _moes(model)]
    shared_gates = [f"{_hf_block(n, arch)}.shared_expert_gate" for n in _moes(model) if arch == "qwen2_moe"]  # kept float by default
    assert sorted(qc.ignore) == sorted(["lm_head", *routers, *shared_gates])
    ext = config.get(EXTENSION_KEY)
    if scheme == "W4A8_G128":  # int8 W8A8 tensors on disk, listed in the extension like dense layers, reloaded 4-bit
        assert set(experts) | {DENSE} <= set(ext["layers"])
        assert tensors[f"{experts[0]}.weight"].dtype == torch.int8
    else:
        assert ext is None


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_names_are_the_hugging_face_names(saved, arch, tmp_path):
    """The names transformers' save_pretrained gives the float model, a quantized layer's
    weight_packed / weight_scale / ... standing for its weight."""
    _model(arch).save_pretrained(tmp_path)
    hf_names = set(load_file(tmp_path / "model.safetensors"))
    scheme = next(s for s, a in CASES if a == arch)
    names = set(_read_tensors(saved(arch, scheme)[1]))
    quantized = {n.rpartition(".")[0] for n in names if n.endswith(".weight_scale")}
    assert any(".experts.3." in p for p in quantized)
    as_float = {f"{p}.weight" if p in quantized and leaf.startswith("weight") else n for n in names for p, _, leaf in [n.rpartition(".")]}
    assert as_float == hf_names


def test_experts_in_a_config_group_of_their_own(tmp_path):
    """Experts of intermediate size 64 take group 64 (W4A16_G64) where the dense layers take 128: two
    config groups, each listing its layers by name, the experts by their checkpoint names."""
    with pytest.warns(UserWarning, match="experts run W4A16_G64"):
        model = qfuse.quantize_model(_model("mixtral", intermediate=64), "W4A16", progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    qc = QuantizationConfig.model_validate(json.loads((tmp_path / "config.json").read_text())["quantization_config"])
    by_group = {g.weights.group_size: sorted(g.targets) for g in qc.config_groups.values()}
    experts = sorted(f"model.layers.{n}.block_sparse_moe.experts.{e}.{p}" for n in range(2) for e in range(EXPERTS) for p in ("w1", "w2", "w3"))
    assert by_group[64] == experts and DENSE in by_group[128]
    decompressed = _ct_decompress_files(tmp_path)
    gate_up, down = model.model.layers[1].mlp.experts.dequantized_weights()
    assert torch.equal(decompressed["model.layers.1.block_sparse_moe.experts.3.w2"], down[3])
    loaded = qfuse.from_pretrained(tmp_path, progress=False)
    _assert_same_model(loaded, model)
    assert loaded.model.layers[0].mlp.experts.scheme.name == "W4A16_G64"


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`")
@pytest.mark.parametrize(("scheme", "arch"), [("W4A16", "qwen2_moe"), ("W8A16", "mixtral")])
def test_transformers_and_compressed_tensors_load_the_experts(saved, scheme, arch):
    model, path = saved(arch, scheme)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    for name, moe in _moes(model).items():
        block = hf.get_submodule(name)
        gate_up, down = moe.experts.dequantized_weights()
        assert block.experts.gate_up_proj.dtype == gate_up.dtype == torch.bfloat16
        assert torch.equal(block.experts.gate_up_proj, gate_up) and torch.equal(block.experts.down_proj, down), name
        assert torch.equal(block.gate.weight, moe.gate.weight), name
    assert torch.equal(hf.get_submodule(DENSE).weight, model.get_submodule(DENSE).dequantized_weight())


def test_float_experts_of_an_ignored_block(tmp_path):
    """A block kept in floating point is written one .weight per expert and projection (listed in
    ignore), and loads back into the Hugging Face block; a float QuantMoE writes the same tensors."""
    model = qfuse.quantize_model(_model("mixtral"), "W8A16", ignore=["lm_head", "model.layers.0.mlp"], progress=False)
    block = model.model.layers[0].mlp
    assert not isinstance(block, QuantMoE) and isinstance(model.model.layers[1].mlp, QuantMoE)
    qfuse.save_quantized(model, tmp_path / "a", progress=False)
    tensors = _read_tensors(tmp_path / "a")
    ignore = json.loads((tmp_path / "a" / "config.json").read_text())["quantization_config"]["ignore"]
    for e in range(EXPERTS):
        for p, w in zip(
            ("w1", "w3", "w2"), (block.experts.gate_up_proj[e, :INTER], block.experts.gate_up_proj[e, INTER:], block.experts.down_proj[e])
        ):
            name = f"model.layers.0.block_sparse_moe.experts.{e}.{p}"
            assert torch.equal(tensors[f"{name}.weight"], w) and name in ignore
            assert f"{name}.weight_scale" not in tensors
    loaded = qfuse.from_pretrained(tmp_path / "a", progress=False)
    _assert_same_model(loaded, model)
    assert torch.equal(_logits(loaded), _logits(model))

    model.model.layers[0].mlp = QuantMoE.from_block(block, None)
    qfuse.save_quantized(model, tmp_path / "b", progress=False)
    again = _read_tensors(tmp_path / "b")
    assert again.keys() == tensors.keys() and all(torch.equal(again[k], tensors[k]) for k in tensors)


def test_sharded_checkpoint_reloads_bit_exactly(saved, tmp_path):
    model, _ = saved("qwen2_moe", "W4A16")
    qfuse.save_quantized(model, tmp_path, max_shard_size="60KB", progress=False)
    assert len(list(tmp_path.glob("*.safetensors"))) >= 3
    _assert_same_model(qfuse.from_pretrained(tmp_path, progress=False), model)


# ----------------------------------------------------------------- bad checkpoints


def _edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _drop(*names: str):
    def edit(tensors):
        for n in [n for n in tensors if n.startswith(names)]:
            del tensors[n]

    return edit


EXPERT = "model.layers.1.block_sparse_moe.experts.2.w3"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop(f"{EXPERT}."), f"for e in 0..3\\): 11 of 12 expert layers are quantized; no quantized layer {EXPERT}"),
        (_drop(f"{EXPERT}.weight_scale"), f"'{EXPERT}.weight_(packed|shape)' .* is quantized data, but there is no '{EXPERT}.weight_scale'"),
        (_drop(f"{EXPERT}.weight_shape"), f"tensor '{EXPERT}.weight_shape' is missing"),
        (_drop("model.layers.1.block_sparse_moe.experts."), "block model.layers.1.mlp .*: the checkpoint has no expert tensors"),
        (
            lambda t: t.update({n.replace(".w1.", ".gate_proj."): t.pop(n) for n in [n for n in t if ".experts.0.w1." in n]}),
            "quantized layer model.layers.0.block_sparse_moe.experts.0.gate_proj.*has 4 experts, stored as "
            r"model.layers.0.block_sparse_moe.experts.<e>.w1 / w3 / w2 for e in 0..3",
        ),
        (
            lambda t: t.update(
                {f"{EXPERT}.weight_shape": torch.tensor([INTER, 64]), f"{EXPERT}.weight_packed": t[f"{EXPERT}.weight_packed"][:, :8].clone()}
            ),
            rf"expert layer {EXPERT} is \[128, 64\], block model.layers.1.mlp needs \[128, 128\]",
        ),
    ],
    ids=["expert_layer_missing", "weight_scale_missing", "weight_shape_missing", "no_experts", "qwen_names_in_mixtral", "wrong_shape"],
)
def test_bad_expert_tensors_are_named(saved, tmp_path, edit, message):
    _, path = saved("mixtral", "W4A16")
    bad = _edited(path, tmp_path / "bad", edit)
    with pytest.raises(qfuse.CheckpointError, match=message):
        qfuse.from_pretrained(bad, progress=False)
    skeleton = _model("mixtral")
    before = {k: v.clone() for k, v in skeleton.state_dict().items()}
    with pytest.raises(qfuse.CheckpointError, match=message):
        qfuse.load_quantized(bad, skeleton, progress=False)
    assert not _moes(skeleton) and skeleton.state_dict().keys() == before.keys()  # nothing loaded half-way
    assert all(torch.equal(v, before[k]) for k, v in skeleton.state_dict().items())


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(experts=2), "quantized layer model.layers.0.block_sparse_moe.experts.2.w1.* has 2 experts"),
        (dict(intermediate=64), r"expert layer model.layers.0.block_sparse_moe.experts.0.w1 is \[128, 128\], .* needs \[64, 128\]"),
    ],
    ids=["fewer_experts", "smaller_experts"],
)
def test_checkpoint_not_matching_the_model(saved, kw, message):
    _, path = saved("mixtral", "W4A16")
    with pytest.raises(qfuse.CheckpointError, match=message):
        qfuse.load_quantized(path, _model("mixtral", **kw), progress=False)
