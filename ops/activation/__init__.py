"""The Triton kernels of the activation-side ops: int8 quantization (ops/quant_int8.py), RMSNorm with an
optional residual add and quantization (ops/rms_norm.py), SiLU-and-mul + quantization (ops/silu_and_mul_quant.py)."""
