"""AutoAWQ GEMM checkpoints (``quant_method: awq``, ``version: gemm``): 4-bit, zero points.

Per quantized linear ``<prefix>`` (W is ``[N, K]``, G the group size)::

    qweight  int32 [K, N/8]     codes u, packed along N with the AWQ interleave (packing.AWQ_ORDER)
    qzeros   int32 [K/G, N/8]   zero points z, same packing, stored as they are
    scales   fp16  [K/G, N]
    W[n, k] = (u[k, n] - z[k // G, n]) * scales[k // G, n]

which is exactly ``wna16_gemm``'s math with the codes transposed to [N, K].
"""

from __future__ import annotations

import torch

from ..linear import QuantLinear
from ..schemes import make_scheme
from .base import FLOAT_DTYPES, LayerSpec, optional_bias, wna16_linear
from .files import CheckpointError, CheckpointFiles
from .packing import awq_unpack

NAME = "awq"


def is_awq(qc: dict) -> bool:
    return str(qc.get("quant_method", "")).lower() == "awq"


class AwqCheckpoint:
    """The quantized layers of an AutoAWQ GEMM checkpoint."""

    name = NAME

    def __init__(self, files: CheckpointFiles, qc: dict):
        self.files = files
        # config.json spells them bits / group_size; AutoAWQ's quant_config.json w_bit / q_group_size.
        self.bits = int(qc.get("bits", qc.get("w_bit", 4)))
        self.group_size = int(qc.get("group_size", qc.get("q_group_size", 128)))
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(f"{files.path}: AutoAWQ version {version!r} is not supported (qfuse reads the 'gemm' layout)")
        if self.bits != 4:
            raise CheckpointError(f"{files.path}: AutoAWQ GEMM checkpoints are 4-bit, the config says bits={self.bits}")
        if not qc.get("zero_point", True):
            raise CheckpointError(f"{files.path}: AutoAWQ GEMM without zero points is not a layout AutoAWQ writes")

    def layers(self) -> dict[str, LayerSpec]:
        specs = {}
        for name in self.files.names():
            if not name.endswith(".qweight"):
                continue
            prefix = name.removesuffix(".qweight")
            k, n8 = self.files.shape(name)
            group = self.group_size if self.group_size not in (-1, k) else -1
            try:
                scheme = make_scheme(4, 16, group, symmetric=False)
            except ValueError as e:
                raise CheckpointError(f"{self.files.path}: layer {prefix}: {e}") from None
            tensors = [name, f"{prefix}.qzeros", f"{prefix}.scales"] + ([f"{prefix}.bias"] if f"{prefix}.bias" in self.files else [])
            specs[prefix] = LayerSpec(prefix, scheme, n8 * 8, k, tensors=tensors)
        return specs

    def build(self, spec: LayerSpec, dtype: torch.dtype) -> QuantLinear:
        f, p = self.files, spec.prefix
        n, k = spec.out_features, spec.in_features
        g = k if spec.scheme.group_size == -1 else spec.scheme.group_size
        if k % g:
            raise CheckpointError(f"{f.path}: layer {p}: in_features={k} is not divisible by group_size={g}")
        qweight = f.get(f"{p}.qweight", (torch.int32,), (k, n // 8))
        qzeros = f.get(f"{p}.qzeros", (torch.int32,), (k // g, n // 8))
        scales = f.get(f"{p}.scales", FLOAT_DTYPES, (k // g, n))
        codes = awq_unpack(qweight).t()
        zeros = awq_unpack(qzeros).t()
        return wna16_linear(spec, codes, scales.t(), zeros, optional_bias(f, p, n), None, dtype, f"{f.path}: layer {p}")
