"""quantize_model on tiny random-weight Hugging Face Llama / Qwen2 / Mistral models."""

import copy

import pytest
import torch
from torch import nn

import qfuse
from tests.helpers import rel_err
from tests.hf_models import ARCHS, tiny_hf_model

# Logit error of the quantized model vs the bf16 model, measured on these random-weight
# models (W8: 0.016-0.019, W4: 0.20-0.24); a broken kernel gives ~1.
MAX_REL_ERR = {"W8A16": 0.04, "W8A8": 0.04, "W4A16": 0.33, "W4A16_ASYM": 0.33, "W4A8": 0.33, "W4A8_G128": 0.33}
# Inductor's own bf16 fusions move the unquantized model's logits by 0.76% (rel); a flipped
# rounding before an int8 quant roughly doubles that for W8A8/W4A8 (measured <= 1.5%).
MAX_COMPILE_DIFF = 0.03


@pytest.fixture(scope="module", params=ARCHS)
def hf_base(request):
    model = tiny_hf_model(request.param)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = model(ids, use_cache=False).logits.float()
    return request.param, model, ids, ref


@pytest.mark.parametrize("scheme", list(qfuse.SCHEMES))
def test_quantize_compile_fullgraph(hf_base, scheme):
    arch, base, ids, ref = hf_base
    model = qfuse.quantize_model(copy.deepcopy(base), scheme, progress=False)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, qfuse.QuantLinear)
    assert isinstance(layer.mlp.down_proj, qfuse.QuantLinear)
    assert isinstance(layer.input_layernorm, qfuse.RMSNorm) and isinstance(model.model.norm, qfuse.RMSNorm)
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, qfuse.QuantLinear)
    n_quant = sum(isinstance(m, qfuse.QuantLinear) for m in model.modules())
    assert n_quant == 7 * len(model.model.layers)
    with torch.inference_mode():
        eager = model(ids, use_cache=False).logits.float()
        assert rel_err(eager, ref) < MAX_REL_ERR[scheme], f"{arch} {scheme}: {rel_err(eager, ref):.4f}"
        # fullgraph=True raises on any graph break. aot_eager runs the traced graph op by op:
        # it must reproduce eager exactly.
        torch._dynamo.reset()
        traced = torch.compile(model, fullgraph=True, backend="aot_eager")(ids, use_cache=False).logits.float()
        assert torch.equal(traced, eager)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)(ids, use_cache=False).logits.float()
        assert rel_err(compiled, eager) < MAX_COMPILE_DIFF, f"{arch} {scheme}: {rel_err(compiled, eager):.4f}"


def test_progress_bar_and_return_value(capsys):
    base = tiny_hf_model("llama", layers=1)
    out = qfuse.quantize_model(base, "W8A8")
    assert out is base
    err = capsys.readouterr().err
    assert "qfuse W8A8" in err and "7/7" in err


def test_ignore_patterns():
    model = tiny_hf_model("llama", layers=2)
    qfuse.quantize_model(model, "W4A16", ignore=("lm_head", "down_proj", "model.layers.1.*"), progress=False)
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)
    assert not isinstance(model.model.layers[0].mlp.down_proj, qfuse.QuantLinear)
    assert isinstance(model.model.layers[0].mlp.up_proj, qfuse.QuantLinear)
    assert not any(isinstance(m, qfuse.QuantLinear) for m in model.model.layers[1].modules())


def test_incompatible_layers_leave_model_unchanged():
    model = nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 96), nn.Linear(96, 8)).bfloat16()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"cannot quantize 2 layer\(s\) with W4A16.*\n  1: in_features=64 is not divisible by group_size=128.*\n  2: in_features=96"):
        qfuse.quantize_model(model, "W4A16", progress=False)
    assert all(type(m) is nn.Linear for m in model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    qfuse.quantize_model(model, "W4A16", ignore=("1", "2"), progress=False)  # what the error suggests
    assert isinstance(model[0], qfuse.QuantLinear)


def test_fp32_model_rejected_with_hint():
    with pytest.raises(TypeError, match=r"model.to\(torch.bfloat16\)"):
        qfuse.quantize_model(nn.Sequential(nn.Linear(64, 64)), "W8A8", progress=False)


def test_unknown_scheme():
    with pytest.raises(ValueError, match="valid schemes: W8A16"):
        qfuse.quantize_model(nn.Sequential(nn.Linear(64, 64)), "int3", progress=False)


def test_torch_nn_rmsnorm_converted():
    model = nn.Sequential(nn.RMSNorm(128, eps=1e-5), nn.Linear(128, 128)).bfloat16()
    x = torch.randn(3, 128).bfloat16()
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        ref = model(x)
    qfuse.quantize_model(model, "W8A16", progress=False)
    assert isinstance(model[0], qfuse.RMSNorm)
    with torch.no_grad():
        assert rel_err(model(x), ref) < 0.02
