"""Tiny random-weight HF Llama / Qwen2 / Mistral, quantized W8A8 and W4A8, compiled with
fullgraph=True: every quant after a norm or SiLU-and-mul is fused, so exactly one
standalone quant per decoder layer remains (the one before o_proj), and the logits
equal the unfused compile. Weight-only: every residual add goes into its norm."""

import copy

import pytest
import torch

import qfuse
from tests.hf_models import tiny_hf_model

from .helpers import assert_same, count_standalone_quants, fused_vs_unfused

LAYERS = 2


def tiny_hf(arch: str):
    return tiny_hf_model(arch, layers=LAYERS, hidden=128, intermediate=256, vocab=128)


@pytest.fixture(scope="module")
def base_models():
    return {arch: tiny_hf(arch) for arch in ("llama", "qwen2", "mistral")}


# mistral's decoder is llama's with a sliding-window mask (the same norms, SiLU-and-mul and
# Linears, which the passes rewrite): one scheme covers its layout; W8A8 on it runs with `pytest -m slow`
@pytest.mark.parametrize(
    ("arch", "scheme"),
    [
        ("llama", "W8A8"),
        ("llama", "W4A8"),
        ("qwen2", "W8A8"),
        ("qwen2", "W4A8"),
        pytest.param("mistral", "W8A8", marks=pytest.mark.slow),
        ("mistral", "W4A8"),
    ],
)
def test_decoder_has_one_standalone_quant_per_layer(base_models, arch, scheme):
    model = qfuse.quantize_model(copy.deepcopy(base_models[arch]), scheme, progress=False)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))

    def logits(input_ids):
        return model(input_ids).logits

    unfused, fused, counters, rec = fused_vs_unfused(logits, (ids,))
    counts = {k: v for k, v in counters.items() if v}

    # per layer: q/k/v share one quant (2 removed), gate/up share one (1 removed);
    # layer 0's input norm reads the embedding (plain rms_norm), every later norm reads a residual add.
    assert counts == {
        "dedup_quant": 3 * LAYERS,
        "rms_norm_quant": 1,
        "add_rms_norm_quant": 2 * LAYERS - 1,
        "silu_and_mul_quant": LAYERS,
        "add_rms_norm": 1,  # the final norm before the bf16 lm_head
    }
    assert count_standalone_quants(rec.before) == 7 * LAYERS
    assert count_standalone_quants(rec.after) == LAYERS  # the o_proj input (attention output)
    after = rec.after.counts[0]
    assert after.get("qfuse.rms_norm", 0) == 0 and after.get("qfuse.fused_add_rms_norm") == 1  # the final norm
    assert after.get("qfuse.fused_add_rms_norm_quant") == 2 * LAYERS - 1
    assert_same(unfused, fused)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_weight_only_residual_adds_go_into_the_norms(base_models, arch):
    model = qfuse.quantize_model(copy.deepcopy(base_models[arch]), "W4A16", progress=False)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))

    def logits(input_ids):
        return model(input_ids).logits

    unfused, fused, counters, rec = fused_vs_unfused(logits, (ids,))
    # layer 0's input norm reads the embedding; every later norm, and the final one, a residual add
    assert {k: v for k, v in counters.items() if v} == {"add_rms_norm": 2 * LAYERS}
    before, after = rec.before.counts[0], rec.after.counts[0]
    assert after.get("qfuse.fused_add_rms_norm") == 2 * LAYERS and after.get("qfuse.rms_norm") == 1
    assert after.get("aten.add.Tensor", 0) == before.get("aten.add.Tensor", 0) - 2 * LAYERS
    assert torch.equal(unfused, fused)
