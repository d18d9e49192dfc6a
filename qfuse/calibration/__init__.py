"""Calibration: from sample activations, choose weights, scales and codes that make the quantized
model more accurate. ``quantize_model(model, scheme, calibration=..., calibration_data=...)``
runs it layer by layer (:mod:`.pipeline`); ``smooth_model`` applies SmoothQuant alone to a float
model."""

from .awq import AWQ
from .data import calibration_batches, calibration_text
from .fake_quant import FakeQuantLinear
from .gptq import GPTQ
from .recipe import parse_recipe, recipe_name
from .smoothquant import SmoothMapping, SmoothQuant, smooth_model, smoothquant_mappings

__all__ = [
    "AWQ",
    "GPTQ",
    "SmoothMapping",
    "SmoothQuant",
    "calibration_batches",
    "calibration_text",
    "FakeQuantLinear",
    "parse_recipe",
    "recipe_name",
    "smooth_model",
    "smoothquant_mappings",
]
