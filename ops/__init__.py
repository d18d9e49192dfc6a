"""qfuse.ops: the quantized ops, registered under ``torch.ops.qfuse``.

One module per op family; each holds the math (docstring), the plain-torch
reference kernel (the op's definition, registered for CPU), the fake kernel
and the CUDA registration. Importing this package registers every op once.
"""

if __name__ != "qfuse.ops":  # pragma: no cover - guard against a second import root
    raise ImportError(
        f"this package must be imported as 'qfuse.ops', not {__name__!r}: importing it under "
        "two names would register the torch ops twice. Install qfuse (pip install -e .) "
        "and `import qfuse.ops`."
    )

# Importing the op modules registers the ops. The modules share their names with the
# ops they define, so the ops themselves are reached as torch.ops.qfuse.<name>
# (the module attributes stay modules: `from qfuse.ops import rms_norm` is the module).
from . import decode_attention, quant_int8, rms_norm, silu_and_mul_quant, w4a8_gemm, w8a8_gemm, wna16_gemm  # noqa: E402,F401
from .moe import fused_moe  # noqa: E402,F401

OP_NAMES = (
    "quant_per_token_int8",
    "quant_per_tensor_int8",
    "rms_norm",
    "fused_add_rms_norm",
    "rms_norm_quant",
    "fused_add_rms_norm_quant",
    "silu_and_mul_quant",
    "wna16_gemm",
    "w8a8_gemm",
    "w4a8_gemm",
    "fused_moe",
    "decode_attention",
)
