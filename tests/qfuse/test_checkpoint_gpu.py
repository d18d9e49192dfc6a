"""Checkpoints on the GPU: loaded straight to CUDA, every scheme's logits match the CPU
reference kernels; act-order layers (gather + Triton kernel) at real shapes and decode M."""

import pytest
import torch

import qfuse
from qfuse.schemes import make_scheme
from tests.helpers import rel_err
from tests.hf_models import tiny_hf_model

pytestmark = pytest.mark.gpu

# GPU kernels and CPU reference differ by accumulation order and (W4A16 decode) bf16 pair
# sums: weight-only logits measured within 0.02. With int8 activations such a difference can
# also flip an activation code, which the next layer carries on: 0.022-0.024 measured at
# M = 33. A wrong layout or a lost permutation gives a relative error near 1.
MAX_REL = {"W8A16": 0.02, "W4A16": 0.02, "W4A16_ASYM": 0.02, "W8A8": 0.04, "W4A8": 0.04, "W4A8_G128": 0.04}


@pytest.mark.parametrize("scheme", list(qfuse.SCHEMES))
def test_from_pretrained_to_cuda_matches_the_cpu_reference(scheme, tmp_path):
    model = tiny_hf_model("llama", layers=2, hidden=1024, intermediate=2816, vocab=512)
    qfuse.quantize_model(model, scheme, progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    cpu = qfuse.from_pretrained(tmp_path, progress=False)
    gpu = qfuse.from_pretrained(tmp_path, device="cuda", progress=False)
    assert all(b.is_cuda for b in gpu.model.layers[0].mlp.down_proj.buffers())
    for m in (1, 7, 33):
        ids = torch.randint(0, 512, (1, m))
        with torch.inference_mode():
            ref = cpu(ids, use_cache=False).logits.float()
            out = gpu(ids.cuda(), use_cache=False).logits.float().cpu()
        assert rel_err(out, ref) < MAX_REL[scheme], f"{scheme} M={m}: {rel_err(out, ref):.4f}"


@pytest.mark.parametrize("n,k", [(4096, 4096), (4000, 4096), (14336, 4096), (4096, 14336)])
@pytest.mark.parametrize("bits", [4, 8])
def test_act_order_layer_on_cuda(n, k, bits):
    """A layer whose input channels are stored in group order (as a GPTQ desc_act checkpoint
    loads) against its definition: x @ dequantized_weight().T, in the model's channel order."""
    g = torch.Generator().manual_seed(n + k + bits)
    scheme = make_scheme(bits, 16, 128, symmetric=False)
    from qfuse.ops.int4_packing import pack_int4

    codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, generator=g)
    tensors = {
        "qweight": pack_int4(codes) if bits == 4 else codes,
        "scales": (torch.rand(n, k // 128, generator=g) * 0.02 + 0.001).to(torch.bfloat16),
        "zeros": torch.randint(0, 2**bits, (n, k // 128), dtype=torch.uint8, generator=g),
    }
    perm = torch.randperm(k, generator=g)
    layer = qfuse.QuantLinear(k, n, scheme, tensors, None, act_perm=perm).cuda()
    w = layer.dequantized_weight().float()  # on the GPU, in the model's channel order
    for m in (1, 2, 7, 16, 33, 128):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16).cuda()
        ref = (x.float() @ w.t()).cpu()
        out = layer(x).float().cpu()
        assert rel_err(out, ref) < 0.01, f"M={m}: {rel_err(out, ref):.4f}"


def test_act_order_layer_captures_in_a_cuda_graph():
    scheme = make_scheme(4, 16, 128)
    k, n = 4096, 4096
    tensors = {
        "qweight": torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
        "scales": torch.rand(n, k // 128).to(torch.bfloat16) * 0.01,
        "zeros": None,
    }
    layer = qfuse.QuantLinear(k, n, scheme, tensors, None, act_perm=torch.randperm(k)).cuda()
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        eager = layer(x)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(x)  # warm-up (autotune, allocations) outside the capture
            with torch.cuda.graph(graph):
                out = layer(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)
