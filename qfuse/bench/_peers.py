"""gemlite 0.6, the Triton peer: its layers built from qfuse's codes, for ``bench gemm`` and ``bench model``.

gemlite's ``A16Wn`` dequantizes HQQ-style, ``w = (q - z) * s`` per group; qfuse's symmetric codes
are unsigned ``u = q + 2**(bits-1)`` with no zero point, so ``z = 2**(bits-1)`` gives gemlite the
very weights qfuse runs. gemlite ships configs for the H100 and none for the H200; those are loaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn


def setup_gemlite(log, autotune: str = "fast") -> str | None:
    """Import gemlite, set its autotune level and load its H100 configs: its version, or None (logged) where it is unavailable."""
    try:
        import gemlite

        cfg = Path(gemlite.__file__).with_name("configs") / "h100.json"
        gemlite.set_autotune(autotune)
        gemlite.load_config(str(cfg))
        return gemlite.__version__
    except Exception as e:  # optional peer
        log(f"gemlite unavailable: {type(e).__name__}: {e}")
        return None


def gemlite_layer(codes: Tensor, scales: Tensor, group: int, dtype: torch.dtype, bits: int, bias: Tensor | None = None) -> nn.Module:
    """gemlite ``A16Wn`` of unsigned symmetric ``codes`` [N, K] (uint8) and ``scales`` [N, K // group]."""
    from gemlite.helper import A16Wn

    zeros = torch.full_like(scales, 1 << (bits - 1))
    return A16Wn(device="cuda", dtype=dtype).from_weights(codes, scales, zeros, W_nbits=bits, group_size=group, bias=bias)


def gemlite_codes(weight: Tensor, bits: int, group: int) -> tuple[Tensor, Tensor]:
    """``(codes [N, K] uint8, scales [N, K // group])`` of ``weight`` [N, K] by qfuse's symmetric quantizer
    (``quantize_model``'s ``W{bits}A16``), unpacked for :func:`gemlite_layer`."""
    from qfuse.ops.int4_packing import unpack_int4
    from qfuse.quantizers import quantize_wna16

    q = quantize_wna16(weight, bits, group, True, weight.dtype)
    codes = unpack_int4(q["qweight"]) if bits == 4 else q["qweight"]
    return codes, q["scales"]


def gemlite_linears(model: nn.Module, bits: int, group: int, skip=("lm_head",)) -> int:
    """Every ``nn.Linear`` of ``model`` whose name does not end in ``skip`` becomes a gemlite ``A16Wn`` layer
    of its weight quantized by :func:`gemlite_codes` (bias kept); returns how many."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and not n.endswith(skip)]
    for name in names:
        parent, _, attr = name.rpartition(".")
        linear = model.get_submodule(name)
        codes, scales = gemlite_codes(linear.weight.detach(), bits, group)
        bias = None if linear.bias is None else linear.bias.detach()
        layer = gemlite_layer(codes, scales, group, linear.weight.dtype, bits, bias)
        setattr(model.get_submodule(parent) if parent else model, attr, layer)
    return len(names)
