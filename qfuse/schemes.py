"""Quantization schemes: which weights and activations are quantized, and how."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The group sizes each op runs besides -1 (per output channel), largest first.
WNA16_GROUP_SIZES = (128, 64, 32)  # wna16_gemm, 4- and 8-bit weights
W4A8_GROUP_SIZES = (128, 64, 32)  # w4a8_gemm (integer second-level group scale); w8a8_gemm: per channel only


def op_group_sizes(weight_bits: int, act_bits: int) -> tuple[int, ...]:
    """The group sizes (besides -1, per channel) the op for these bits runs, largest first."""
    if act_bits == 16:
        return WNA16_GROUP_SIZES
    return W4A8_GROUP_SIZES if weight_bits == 4 else ()


@dataclass(frozen=True)
class Scheme:
    """A quantization preset.

    weight_bits   8 or 4
    act_bits      16: weight-only (activations stay fp16/bf16); 8: dynamic per-token int8 activations
    group_size    -1 = one scale per output channel, else the number of input features sharing a scale
    symmetric     False: integer zero points per group (AWQ style); weight-only schemes only
    static_act    True: int8 activations use one calibrated per-tensor scale (``input_scale``)
                  instead of a dynamic per-token scale (compressed-tensors static W8A8)
    """

    name: str
    weight_bits: int
    act_bits: int
    group_size: int = -1
    symmetric: bool = True
    description: str = ""
    static_act: bool = False

    def __post_init__(self):
        if self.weight_bits not in (4, 8):
            raise ValueError(f"Scheme {self.name}: weight_bits must be 4 or 8, got {self.weight_bits}")
        if self.act_bits not in (8, 16):
            raise ValueError(f"Scheme {self.name}: act_bits must be 8 or 16, got {self.act_bits}")
        if self.act_bits == 16 and self.group_size not in (-1, *WNA16_GROUP_SIZES):
            raise ValueError(f"Scheme {self.name}: group_size must be -1, 32, 64 or 128, got {self.group_size}")
        if self.act_bits == 8:
            if not self.symmetric:
                raise ValueError(f"Scheme {self.name}: int8-activation schemes are symmetric")
            allowed = (-1, *op_group_sizes(self.weight_bits, self.act_bits))
            if self.group_size not in allowed:
                raise ValueError(f"Scheme {self.name}: group_size must be one of {allowed}, got {self.group_size}")
        elif self.static_act:
            raise ValueError(f"Scheme {self.name}: static_act needs int8 activations (act_bits=8)")

    @property
    def weight_only(self) -> bool:
        return self.act_bits == 16

    @property
    def op(self) -> str:
        """The GEMM op that runs this scheme."""
        if self.weight_only:
            return "wna16_gemm"
        return "w8a8_gemm" if self.weight_bits == 8 else "w4a8_gemm"


W8A16 = Scheme("W8A16", 8, 16, -1, True, "int8 weights per-channel, fp16/bf16 activations")
W4A16 = Scheme("W4A16", 4, 16, 128, True, "int4 weights, group 128, symmetric")
W4A16_ASYM = Scheme("W4A16_ASYM", 4, 16, 128, False, "int4 weights, group 128, zero points (AutoAWQ math)")
W8A8 = Scheme("W8A8", 8, 8, -1, True, "int8 weights per-channel x int8 activations per-token (SmoothQuant)")
W4A8 = Scheme("W4A8", 4, 8, -1, True, "int4 weights per-channel x int8 activations per-token (QQQ)")
W4A8_G128 = Scheme("W4A8_G128", 4, 8, 128, True, "int4 weights group 128 (integer 2nd-level scale) x int8 per-token")
W8A8_STATIC = Scheme(
    "W8A8_STATIC", 8, 8, -1, True, "int8 weights per-channel x int8 activations with one calibrated scale per layer", static_act=True
)

# What quantize_model runs from the weights alone ...
SCHEMES: dict[str, Scheme] = {s.name: s for s in (W8A16, W4A16, W4A16_ASYM, W8A8, W4A8, W4A8_G128)}
# ... and what needs calibration data (quantize_model(..., calibration_data=...)).
CALIBRATED_SCHEMES: dict[str, Scheme] = {W8A8_STATIC.name: W8A8_STATIC}


def make_scheme(weight_bits: int, act_bits: int, group_size: int = -1, symmetric: bool = True, static_act: bool = False) -> Scheme:
    """The scheme with these fields: a preset of :data:`SCHEMES` when one matches, else a
    scheme named after its fields (``W4A16_G64_ASYM``, ``W4A16_CH``, ``W4A8_CH_STATIC``), as
    checkpoints in other formats need. Raises ``ValueError`` for a combination no op runs."""
    for preset in (*SCHEMES.values(), *CALIBRATED_SCHEMES.values()):
        if (preset.weight_bits, preset.act_bits, preset.group_size, preset.symmetric, preset.static_act) == (
            weight_bits,
            act_bits,
            group_size,
            symmetric,
            static_act,
        ):
            return preset
    name = f"W{weight_bits}A{act_bits}" + ("_CH" if group_size == -1 else f"_G{group_size}")
    name += ("" if symmetric else "_ASYM") + ("_STATIC" if static_act else "")
    return Scheme(name, weight_bits, act_bits, group_size, symmetric, "from a checkpoint", static_act)


def get_scheme(scheme: str | Scheme) -> Scheme:
    """Look up a scheme by name (case-insensitive) or pass a :class:`Scheme` through.

    A name is a preset (``W4A16``) or one spelled out the way :func:`make_scheme` names schemes:
    ``W{4,8}A{8,16}`` with ``_G{group}`` or ``_CH`` (per channel), ``_ASYM`` and ``_STATIC`` (int8
    activations with a calibrated scale), e.g. ``W4A16_G64``, ``W4A16_G32_ASYM``, ``W4A8_G64``,
    ``W8A16_G128`` (the group fallback's names), ``W4A8_CH_STATIC`` (as ``qfuse info`` shows it)."""
    if isinstance(scheme, Scheme):
        return scheme
    if isinstance(scheme, str):
        found = SCHEMES.get(scheme.upper()) or CALIBRATED_SCHEMES.get(scheme.upper())
        if found is not None:
            return found
        m = re.fullmatch(r"W(4|8)A(8|16)(?:_G(\d+)|_CH)?(_ASYM)?(_STATIC)?", scheme.upper())
        if m is not None:
            return make_scheme(int(m[1]), int(m[2]), int(m[3]) if m[3] else -1, m[4] is None, m[5] is not None)
    raise ValueError(
        f"unknown quantization scheme {scheme!r}; valid schemes: {', '.join([*SCHEMES, *CALIBRATED_SCHEMES])}, "
        "or one spelled out: W4A16_G64, W4A16_G32_ASYM, W4A8_G64, W8A16_G128, W4A16_CH, ..."
    )
