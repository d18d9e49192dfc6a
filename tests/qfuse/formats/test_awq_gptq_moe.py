"""AutoAWQ and GPTQ checkpoints of sparse-MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE; tiny random
configs) load into :class:`qfuse.moe.QuantMoE` bit-exactly: every expert layer of the checkpoint,
written from the format reference (spec_writers.py) under the Hugging Face names, comes back from
the stacked experts as the format's weight, and the model's logits are the float model's with
those weights. GPTQ act-order (``desc_act``) experts with groups are written as GPTQ writes them: gate
and up read the same input, so their Hessians, and with them their ``g_idx``, are the same.

The checkpoints quantize what AutoAWQ / GPTQModel quantize in these models: the attention
projections, the experts and Qwen2-MoE's shared expert; the router (``gate``), Qwen2-MoE's
``shared_expert_gate`` (one output row), the embeddings and lm_head stay float.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import qfuse
from qfuse.moe import QuantMoE
from tests.qfuse.formats.spec_writers import (
    act_order_g_idx,
    check_loaded_layer,
    gptq_quantize,
    natural_g_idx,
    write_awq,
    write_gptq,
    write_gptq_layers,
)
from tests.qfuse.test_moe import tiny_moe_model

transformers = pytest.importorskip("transformers")

HF_EXPERTS = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2")), "qwen2_moe": ("mlp", ("gate_proj", "up_proj", "down_proj"))}
HF_EXPERTS["qwen3_moe"] = HF_EXPERTS["qwen2_moe"]
EXPERTS = 4


def _float_model(arch: str):
    """2 layers, hidden = expert intermediate = 256 (two groups of 128), 4 experts, top-2, fp16 (the formats' dtype)."""
    return tiny_moe_model(arch, hidden=256, intermediate=256, experts=EXPERTS, layers=2).to(torch.float16)


def _quantized_names(state: dict) -> dict:
    """The ``[N, K]`` weights a quantizer of these formats converts, by layer name."""

    def converted(name: str) -> bool:
        return name.endswith("proj") or ".experts." in name or name.endswith(".shared_expert." + name.rpartition(".")[2])

    return {k[: -len(".weight")]: v for k, v in state.items() if k.endswith(".weight") and v.ndim == 2 and converted(k[: -len(".weight")])}


def _write(tmp_path, arch: str, writer: str, **kw):
    """The float model, and the checkpoint of it written by ``writer`` (awq / gptq) with its layers' SpecLayers."""
    model = _float_model(arch)
    model.save_pretrained(tmp_path / "float")
    state = load_file(str(tmp_path / "float" / "model.safetensors"))
    weights = _quantized_names(state)
    extra = {k: v for k, v in state.items() if k.removesuffix(".weight") not in weights}
    path = tmp_path / writer
    if writer == "awq":
        specs = write_awq(path, weights, kw.pop("group_size"), extra)
    elif writer == "gptq" and kw.get("desc_act") and kw["group_size"] != -1:
        specs = _gptq_act_order(path, weights, extra, **kw)
    else:  # gptq, or gptq_independent: every layer its own random act order
        specs = write_gptq(path, weights, extra_tensors=extra, **kw)
    config = json.loads((tmp_path / "float" / "config.json").read_text())
    quantization = json.loads((path / "config.json").read_text())["quantization_config"]
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    return model, path, specs, state


def _gptq_act_order(path, weights: dict, extra: dict, *, bits: int, group_size: int, sym: bool, fmt: str = "gptq", desc_act: bool = True):
    """A desc_act GPTQ checkpoint whose layers that read one input (an expert's gate and up) share their g_idx."""
    g_idx = {}
    specs = {}
    for prefix, w in weights.items():
        reads = prefix.rpartition(".")[0] if prefix.endswith((".w1", ".w3", ".gate_proj", ".up_proj")) else prefix
        k = w.shape[1]
        g = g_idx.setdefault(reads, act_order_g_idx(k, group_size))
        assert not torch.equal(g, natural_g_idx(k, group_size))
        specs[prefix] = gptq_quantize(w, bits, group_size, sym, g, 1 if fmt == "gptq" and not sym else 0)
    write_gptq_layers(path, specs, bits=bits, group_size=group_size, sym=sym, fmt=fmt, desc_act=desc_act, extra_tensors=extra)
    return specs


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))


CASES = [  # (arch, format, format arguments, the experts' qfuse scheme)
    ("mixtral", "awq", {"group_size": 128}, "W4A16_ASYM"),
    ("qwen2_moe", "awq", {"group_size": 64}, "W4A16_G64_ASYM"),
    ("qwen3_moe", "gptq", {"bits": 4, "group_size": 128, "sym": True}, "W4A16"),
    ("mixtral", "gptq", {"bits": 4, "group_size": 32, "sym": False}, "W4A16_G32_ASYM"),
    ("qwen2_moe", "gptq", {"bits": 8, "group_size": -1, "sym": True, "fmt": "gptq_v2"}, "W8A16"),
    ("mixtral", "gptq", {"bits": 4, "group_size": -1, "sym": True, "desc_act": True}, "W4A16_CH"),  # act-order without groups: no permutation
    ("mixtral", "gptq", {"bits": 4, "group_size": 32, "sym": True, "desc_act": True}, "W4A16_G32"),  # act-order groups
    ("qwen2_moe", "gptq", {"bits": 8, "group_size": 64, "sym": False, "desc_act": True, "fmt": "gptq_v2"}, "W8A16_G64_ASYM"),
]


@pytest.mark.parametrize(("arch", "writer", "kw", "scheme"), CASES, ids=[f"{a}-{f}-{s}" for a, f, _, s in CASES])
def test_experts_load_bit_exactly(tmp_path, arch, writer, kw, scheme):
    float_model, path, specs, state = _write(tmp_path, arch, writer, **kw)
    model = qfuse.from_pretrained(path, progress=False)
    block, names = HF_EXPERTS[arch]
    moes = {n: m for n, m in model.named_modules() if isinstance(m, QuantMoE)}
    assert len(moes) == 2
    for name, moe in moes.items():
        assert moe.experts.scheme.name == scheme and moe.experts.num_experts == EXPERTS
        disk = name.rpartition(".")[0] + "." + block
        for e in range(EXPERTS):
            for j, layer in enumerate(moe.experts.expert_layers(e)):
                prefix = f"{disk}.experts.{e}.{names[j]}"
                check_loaded_layer(layer, specs[prefix], None, prefix)
    # the whole model: the float model holding the format's weights, loaded by transformers from its checkpoint names
    save_file({**state, **{f"{p}.weight": spec.weight for p, spec in specs.items()}}, str(tmp_path / "float" / "model.safetensors"))
    reference = type(float_model).from_pretrained(tmp_path / "float", dtype=torch.float16).eval()
    with torch.inference_mode():
        got = model(_ids(), use_cache=False).logits.float()
        want = reference(_ids(), use_cache=False).logits.float()
    assert got.dtype == want.dtype and ((got - want).norm() / want.norm()).item() < 1e-2


def test_act_order_experts_keep_their_order_through_save_and_reload(tmp_path):
    """A loaded act-order block runs gate / up in down's order; saved, each expert layer is the checkpoint's
    again (bit for bit, its act_perm kept), and the reload gives the same logits."""
    _, path, specs, _ = _write(tmp_path, "mixtral", "gptq", bits=4, group_size=32, sym=True, desc_act=True)
    model = qfuse.from_pretrained(path, progress=False)
    experts = model.model.layers[1].mlp.experts
    assert experts.w13_act_perm.shape == (EXPERTS, 256) and experts.w2_act_perm.shape == (EXPERTS, 256)
    gate_up, down = experts.dequantized_weights()
    for e in range(EXPERTS):
        prefix = f"model.layers.1.block_sparse_moe.experts.{e}"
        assert torch.equal(gate_up[e], torch.cat([specs[f"{prefix}.w1"].weight, specs[f"{prefix}.w3"].weight]))
        assert torch.equal(down[e], specs[f"{prefix}.w2"].weight)
    saved = qfuse.save_quantized(model, tmp_path / "saved", progress=False)
    again = qfuse.from_pretrained(saved, progress=False)
    for e in range(EXPERTS):
        for got, want in zip(again.model.layers[1].mlp.experts.expert_layers(e), experts.expert_layers(e)):
            assert torch.equal(got.dequantized_weight(), want.dequantized_weight()) and torch.equal(got.act_perm, want.act_perm)
    with torch.inference_mode():
        assert torch.equal(again(_ids(), use_cache=False).logits, model(_ids(), use_cache=False).logits)


def test_gate_and_up_in_different_act_orders_are_refused_by_name(tmp_path):
    """GPTQ gives gate and up one order (one input); a checkpoint where they differ cannot share fused_moe's gather."""
    _, path, _, _ = _write(tmp_path, "mixtral", "gptq_independent", bits=4, group_size=32, sym=True, desc_act=True)
    with pytest.raises(qfuse.CheckpointError, match=r"block_sparse_moe\.experts\.0: gate and up read the same input but have different act-order"):
        qfuse.from_pretrained(path, progress=False)
