"""Real models that qfuse can load offline, from files that pip packages ship."""

from .cast import cast_float_model
from .smollm2 import SMOLLM2_GGUF, load_smollm2, smollm2_path

__all__ = ["SMOLLM2_GGUF", "cast_float_model", "load_smollm2", "smollm2_path"]
