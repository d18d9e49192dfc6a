"""qfuse: quantized LLM inference that stays fast under torch.compile.

    import qfuse
    qfuse.quantize_model(model, "W4A8")
    model = torch.compile(model)
"""

from . import ops  # registers torch.ops.qfuse.*
from .linear import QuantLinear
from .norm import RMSNorm
from .quantize_model import quantize_model
from .schemes import SCHEMES, Scheme, get_scheme

__all__ = ["QuantLinear", "RMSNorm", "SCHEMES", "Scheme", "get_scheme", "ops", "quantize_model"]
__version__ = "0.1.0"
