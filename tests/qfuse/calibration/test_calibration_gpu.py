"""Calibration on the GPU: the calibrated model through the Triton kernels against the
calibration's own fake-quant simulation of the same codes, at SmolLM2-like shapes (K = 576
takes group 64 under W4A16, and W4A8_G128 runs it per channel)."""

import copy
import warnings

import pytest
import torch

from qfuse.quantize_model import quantize_with_simulation
from tests.helpers import rel_err
from tests.hf_models import tiny_hf_model

pytestmark = pytest.mark.gpu

RECIPES = {
    "W8A16": "gptq",
    "W4A16": "awq+gptq",
    "W4A16_ASYM": "awq+gptq",
    "W8A8": "sq+gptq",
    "W4A8": "sq+gptq",
    "W4A8_G128": "sq+gptq",
    "W8A8_STATIC": "sq+gptq",
}
# The int8 kernels are bit-exact to the reference, and the simulation's integer products are
# exact in float32, so int8-activation logits agree up to the float32 order of the scale
# products; weight-only ones differ by the bf16 kernels' accumulation order. A wrong layout,
# scale or lost permutation gives errors near 1.
MAX_REL = 0.02
# Against the float model, the bounds the CPU tests hold round to nearest to (test_quantize_model's
# MAX_REL_ERR; calibration only lowers them) and SmoothQuant's static scales to (test_pipeline.py)
MAX_REL_TO_FLOAT = {"W8A16": 0.04, "W8A8": 0.04, "W8A8_STATIC": 0.05, "W4A16": 0.33, "W4A16_ASYM": 0.33, "W4A8": 0.33, "W4A8_G128": 0.33}


@pytest.mark.parametrize("scheme", list(RECIPES))
def test_kernels_match_the_fake_quant_simulation(scheme):
    base = tiny_hf_model("llama", layers=2, hidden=576, intermediate=1536, vocab=512).cuda()
    data = [torch.randint(0, 512, (8, 128), generator=torch.Generator().manual_seed(s)).cuda() for s in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the group fallback of K = 576
        quantized, simulation = quantize_with_simulation(
            copy.deepcopy(base), scheme, calibration=RECIPES[scheme], calibration_data=data, progress=False
        )
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(9)).cuda()
    with torch.inference_mode():
        a = quantized(ids).logits.float()
        b = simulation(ids).logits.float()
        ref = base(ids).logits.float()
    assert rel_err(a, b) < MAX_REL
    assert rel_err(a, ref) < MAX_REL_TO_FLOAT[scheme], rel_err(a, ref)  # and it is still the model
