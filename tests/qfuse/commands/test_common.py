"""Helpers shared by the CLI commands (qfuse/commands/common.py)."""

import torch

import qfuse
from qfuse.commands.common import linear_weight_bytes
from tests.qfuse.test_moe import tiny_moe_model


def test_linear_weight_bytes_counts_the_experts():
    """``qfuse quantize`` reports weight memory before / after: sparse-MoE experts (Hugging Face's fused
    ``gate_up_proj`` / ``down_proj``, then QuantExperts' buffers) count with the Linears, once each."""
    model = tiny_moe_model("mixtral", hidden=128, intermediate=128, experts=4, layers=2)
    total = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    linears = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))
    before, other = linear_weight_bytes(model)
    assert before == experts + linears and other == total - before
    qfuse.quantize_model(model, "W4A16", progress=False)
    after, other_after = linear_weight_bytes(model)
    quantized = sum(layer.mlp.experts.weight_bytes() for layer in model.model.layers) + sum(
        m.weight_bytes() for m in model.modules() if isinstance(m, qfuse.QuantLinear)
    )
    kept = model.lm_head.weight.numel() * 2  # bf16 head, kept float by default
    assert after == quantized + kept and other_after == other
    assert before / after > 3.5  # 4-bit experts with bf16 scales per 128 inputs
