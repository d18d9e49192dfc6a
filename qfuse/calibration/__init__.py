"""Calibration: transforms of a float model, computed from sample activations, that make its
quantized form more accurate. Each runs before ``quantize_model``."""

from .smoothquant import SmoothMapping, smooth_model, smoothquant_mappings

__all__ = ["SmoothMapping", "smooth_model", "smoothquant_mappings"]
