"""GPTQ checkpoints (AutoGPTQ, GPTQModel, transformers): 4- and 8-bit, v1 and v2 zero points,
act-order.

Per quantized linear ``<prefix>`` (W is ``[N, K]``, b bits, pf = 32 / b codes per word)::

    qweight  int32 [K / pf, N]      codes u, packed along K, natural order
    qzeros   int32 [groups, N / pf] zero points, packed along N; v1 (``gptq``) stores z - 1,
                                    v2 (``gptq_v2``) stores z
    scales   fp16  [groups, N]
    g_idx    int32 [K]              scale group of each input channel (act-order: not k // G)
    W[n, k] = (u[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]

v1 zero points are unpacked one nibble at a time and ``(nibble + 1) & (2**b - 1)``: AutoGPTQ
wrote ``z - 1`` masked per nibble, so a per-word add would carry into the next nibble.
A ``g_idx`` that is not ``k // G`` (``desc_act``) is applied once at load: the input channels
are sorted by group and the layer gathers its activations through ``act_perm``.
GPTQModel's ``dynamic`` overrides (``"-:regex"`` = left in floating point, ``"+:regex"`` or a
bare regex = other bits / group_size for matching layers; the first matching rule decides)
are honoured.
"""

from __future__ import annotations

import re

import torch

from ..linear import QuantLinear
from ..schemes import make_scheme
from .base import FLOAT_DTYPES, LayerSpec, optional_bias, wna16_linear
from .files import CheckpointError, CheckpointFiles
from .packing import unpack_int32

NAME = "gptq"
# Per-layer quantization args (with their defaults) that a ``dynamic`` override may change.
LAYER_ARGS = {"bits": 4, "group_size": 128, "sym": True, "desc_act": False}


def is_gptq(qc: dict) -> bool:
    return str(qc.get("quant_method", qc.get("method", ""))).lower() == "gptq"


def checkpoint_format(qc: dict) -> str:
    """``gptq`` (v1) or ``gptq_v2``: GPTQModel writes ``format``, older tools ``checkpoint_format``."""
    fmt = str(qc.get("format") or qc.get("checkpoint_format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise CheckpointError(f"GPTQ checkpoint_format {fmt!r} is not supported (qfuse reads 'gptq' and 'gptq_v2')")
    return fmt


class GptqCheckpoint:
    """The quantized layers of a GPTQ checkpoint."""

    name = NAME

    def __init__(self, files: CheckpointFiles, qc: dict):
        self.files = files
        self.qc = qc
        try:
            self.format = checkpoint_format(qc)
        except CheckpointError as e:
            raise CheckpointError(f"{files.path}: {e}") from None
        if qc.get("is_marlin_format"):  # AutoGPTQ's Marlin repack: B / s / workspace tensors, not qweight
            raise CheckpointError(
                f"{files.path}: AutoGPTQ's Marlin layout (is_marlin_format: true) is not supported; load the GPTQ checkpoint it was converted from"
            )
        self.name = self.format
        self.dynamic = qc.get("dynamic") or {}

    def _args(self, prefix: str) -> dict:
        """The quantization args of one layer: the config's, updated by its ``dynamic`` override.

        As GPTQModel (``dynamic_get``) and vLLM (``get_dynamic_override``) read ``dynamic``, the
        *first* pattern that ``re.match``es the layer decides, so a specific rule listed before a
        catch-all wins over it; a ``"-:"`` rule that decides means "left in floating point"."""
        args = {key: self.qc.get(key, default) for key, default in LAYER_ARGS.items()}
        for pattern, override in self.dynamic.items():
            negative = pattern.startswith("-:")
            regex = pattern[2:] if pattern[:2] in ("-:", "+:") else pattern
            if not re.match(regex, prefix):
                continue
            if negative:
                raise CheckpointError(f"{self.files.path}: layer {prefix} has a qweight but the config's dynamic {pattern!r} leaves it unquantized")
            args.update({key: override[key] for key in args if key in override})
            break
        return args

    def layers(self) -> dict[str, LayerSpec]:
        specs = {}
        for name in self.files.names():
            if not name.endswith(".qweight"):
                continue
            prefix = name.removesuffix(".qweight")
            args = self._args(prefix)
            bits, group = int(args["bits"]), int(args["group_size"])
            where = f"{self.files.path}: layer {prefix}"
            if bits not in (4, 8):
                raise CheckpointError(f"{where}: {bits}-bit GPTQ is not supported (qfuse runs 4- and 8-bit weights)")
            rows, n = self.files.shape(name)
            k = rows * 32 // bits
            try:
                scheme = make_scheme(bits, 16, -1 if group in (-1, k) else group, symmetric=bool(args["sym"]))
            except ValueError as e:
                raise CheckpointError(f"{where}: {e}") from None
            tensors = [name] + [f"{prefix}.{t}" for t in ("qzeros", "scales", "g_idx", "bias") if f"{prefix}.{t}" in self.files]
            specs[prefix] = LayerSpec(prefix, scheme, n, k, act_order=bool(args["desc_act"]), tensors=tensors)
        return specs

    def build(self, spec: LayerSpec, dtype: torch.dtype) -> QuantLinear:
        f, p = self.files, spec.prefix
        bits = spec.scheme.weight_bits
        pf, mask = 32 // bits, (1 << bits) - 1
        n, k = spec.out_features, spec.in_features
        g = k if spec.scheme.group_size == -1 else spec.scheme.group_size
        where = f"{f.path}: layer {p}"
        if k % g or n % pf:
            raise CheckpointError(f"{where}: a [{n}, {k}] weight does not fit group_size={g} and {bits}-bit zero points")
        groups = k // g
        qweight = f.get(f"{p}.qweight", (torch.int32,), (k // pf, n))
        qzeros = f.get(f"{p}.qzeros", (torch.int32,), (groups, n // pf))
        scales = f.get(f"{p}.scales", FLOAT_DTYPES, (groups, n))
        g_idx = None
        if spec.act_order and groups > 1 and f"{p}.g_idx" not in f:  # natural order would be silently wrong
            raise CheckpointError(f"{where}: desc_act is true but the checkpoint has no {p}.g_idx (each input's group)")
        if f"{p}.g_idx" in f:
            g_idx = f.get(f"{p}.g_idx", (torch.int32, torch.int64), (k,))
            if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
                raise CheckpointError(f"{where}: g_idx values must lie in [0, {groups}), got [{int(g_idx.min())}, {int(g_idx.max())}]")
        codes = unpack_int32(qweight, bits, dim=0).t()
        zeros = unpack_int32(qzeros, bits, dim=1)
        if self.format == "gptq":
            zeros = ((zeros.to(torch.int32) + 1) & mask).to(torch.uint8)
        return wna16_linear(spec, codes, scales.t(), zeros.t(), optional_bias(f, p, n), g_idx, dtype, where)
