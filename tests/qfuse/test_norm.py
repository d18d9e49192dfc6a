import pytest
import torch

import qfuse


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_hf_rmsnorm_converted_exactly(arch):
    import transformers.models as M

    cls = {
        "llama": M.llama.modeling_llama.LlamaRMSNorm,
        "qwen2": M.qwen2.modeling_qwen2.Qwen2RMSNorm,
        "mistral": M.mistral.modeling_mistral.MistralRMSNorm,
    }[arch]
    hf = cls(96, eps=1e-6).bfloat16()
    with torch.no_grad():
        hf.weight.uniform_(0.5, 1.5)
    q = qfuse.RMSNorm.from_module(hf)
    x = torch.randn(4, 96).bfloat16()
    assert torch.equal(q(x), hf(x))


def test_torch_rmsnorm_default_eps_and_no_affine():
    m = torch.nn.RMSNorm(64, elementwise_affine=False)
    q = qfuse.RMSNorm.from_module(m)
    x = torch.randn(3, 64).half()
    assert torch.allclose(q(x).float(), m(x.float()), atol=2e-3, rtol=2e-3)


def test_rejects_unknown_module():
    with pytest.raises(TypeError, match="cannot convert LayerNorm"):
        qfuse.RMSNorm.from_module(torch.nn.LayerNorm(8))


def test_check_convertible_wants_fp16_or_bf16_weight():
    from qfuse.norm import check_convertible

    check_convertible(torch.nn.RMSNorm(64).bfloat16(), "norm")
    check_convertible(torch.nn.RMSNorm(64, elementwise_affine=False), "norm")  # no weight, no dtype to check
    with pytest.raises(TypeError, match=r"layers.0.norm: RMSNorm weight dtype torch.float32 .*model.to\(torch.bfloat16\)"):
        check_convertible(torch.nn.RMSNorm(64), "layers.0.norm")
