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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_rmsnorm_default_eps_and_no_affine(dtype):
    # eps=None: torch adds float32's eps for fp16 / bf16 inputs too; at inputs of size 0.01 the
    # input dtype's own eps (bf16: 7.8e-3) would shrink the output RMS to about 0.12
    m = torch.nn.RMSNorm(64, elementwise_affine=False)
    q = qfuse.RMSNorm.from_module(m)
    x = (torch.randn(3, 64) * 0.01).to(dtype)
    y = q(x)
    assert torch.allclose(y.float(), m(x).float(), atol=1e-2, rtol=1e-2)
    assert torch.allclose(y.float().pow(2).mean(-1), torch.ones(3), rtol=2e-2)


def test_rejects_unknown_module():
    with pytest.raises(TypeError, match="cannot convert LayerNorm"):
        qfuse.RMSNorm.from_module(torch.nn.LayerNorm(8))


def test_check_convertible_wants_fp16_or_bf16_weight():
    from qfuse.norm import check_convertible

    check_convertible(torch.nn.RMSNorm(64).bfloat16(), "norm")
    check_convertible(torch.nn.RMSNorm(64, elementwise_affine=False), "norm")  # no weight, no dtype to check
    with pytest.raises(TypeError, match=r"layers.0.norm: RMSNorm weight dtype torch.float32 .*model.to\(torch.bfloat16\)"):
        check_convertible(torch.nn.RMSNorm(64), "layers.0.norm")
