"""Real models that qfuse can load offline, from files that pip packages ship."""

from .smollm2 import SMOLLM2_GGUF, load_smollm2, smollm2_path

__all__ = ["SMOLLM2_GGUF", "load_smollm2", "smollm2_path"]
