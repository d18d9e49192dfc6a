import dataclasses

import pytest

import qfuse
from qfuse.schemes import Scheme, get_scheme, make_scheme


def test_presets():
    assert list(qfuse.SCHEMES) == ["W8A16", "W4A16", "W4A16_ASYM", "W8A8", "W4A8", "W4A8_G128"]
    s = qfuse.get_scheme("w4a16")
    assert (s.weight_bits, s.act_bits, s.group_size, s.symmetric) == (4, 16, 128, True)
    assert qfuse.get_scheme("W4A16_ASYM").symmetric is False
    assert qfuse.get_scheme("W4A8_G128").group_size == 128
    assert [qfuse.get_scheme(n).op for n in ("W8A16", "W8A8", "W4A8")] == ["wna16_gemm", "w8a8_gemm", "w4a8_gemm"]
    assert qfuse.get_scheme(s) is s


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        qfuse.get_scheme("W8A8").group_size = 128


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown quantization scheme 'W3A16'; valid schemes: W8A16, W4A16, W4A16_ASYM, W8A8, W4A8, W4A8_G128"):
        qfuse.get_scheme("W3A16")
    with pytest.raises(ValueError, match="valid schemes"):
        qfuse.get_scheme(42)


@pytest.mark.parametrize(
    ("name", "bits", "act", "group", "sym"),
    [("W4A16_G64", 4, 16, 64, True), ("w4a16_g32_asym", 4, 16, 32, False), ("W4A8_G64", 4, 8, 64, True), ("W8A16_G128", 8, 16, 128, True)],
)
def test_spelled_out_names(name, bits, act, group, sym):
    """The names the group fallback's warning and save_quantized use can be asked for."""
    s = qfuse.get_scheme(name)
    assert (s.weight_bits, s.act_bits, s.group_size, s.symmetric) == (bits, act, group, sym)
    assert qfuse.get_scheme(s.name) == s
    assert qfuse.get_scheme("W8A16_CH") is qfuse.get_scheme("W8A16")  # a preset's fields give the preset
    with pytest.raises(ValueError, match="group_size must be one of"):
        qfuse.get_scheme("W8A8_G128")


def test_invalid_combinations():
    with pytest.raises(ValueError, match="weight_bits must be 4 or 8"):
        Scheme("X", 3, 16)
    with pytest.raises(ValueError, match="int8-activation schemes are symmetric"):
        Scheme("X", 4, 8, 128, symmetric=False)
    with pytest.raises(ValueError, match="group_size must be one of"):
        Scheme("X", 8, 8, 128)


@pytest.mark.parametrize(
    "static", [make_scheme(4, 8, -1, static_act=True), make_scheme(4, 8, 128, static_act=True), make_scheme(4, 8, 64, static_act=True)]
)
def test_static_scheme_names_round_trip(static):
    """The names make_scheme gives static-activation checkpoint layers (qfuse info prints them) are accepted back."""
    assert get_scheme(static.name) == static and get_scheme(static.name.lower()) == static


def test_a_static_weight_only_name_is_refused():
    with pytest.raises(ValueError, match="static_act needs int8 activations"):
        get_scheme("W4A16_STATIC")
