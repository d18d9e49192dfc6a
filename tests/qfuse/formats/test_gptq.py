"""GPTQ checkpoints (AutoGPTQ / GPTQModel, v1 and v2, act-order, dynamic overrides) load
bit-exactly: checkpoints written from the format reference (spec_writers.py)."""

import pytest
import torch

import qfuse
from tests.qfuse.formats.spec_writers import (
    SpecLayer,
    autogptq_unmasked_v1_zeros,
    check_loaded_layer,
    edit_quant_config,
    edit_tensor,
    gptq_stored_zeros,
    model_for,
    natural_g_idx,
    pack_rows,
    random_weight,
    write_gptq,
    write_gptq_layers,
)

# Odd-but-legal shapes: N a multiple of 8 (the packed zero words) but not of 16; K of 2 to 12 groups.
SHAPES = {"layers.0.self_attn.o_proj": (24, 256), "layers.1.mlp.up_proj": (40, 384)}
BIASED = "layers.1.mlp.up_proj"
GROUPS = [32, 64, 128, -1]
# The file-level axes rotate over the group sizes, so that each bits/sym/format/desc_act
# combination meets both config files and both kinds of model.
CONFIG_STYLE = {32: "config.json", 64: "quantize_config.json", 128: "config.json", -1: "quantize_config.json"}
DEVICE = {32: "cpu", 64: "cpu", 128: "meta", -1: "meta"}


def write_model(path, **kwargs):
    """A two-layer GPTQ checkpoint (one layer with a bias) plus an unquantized embedding."""
    weights = {p: random_weight(n, k) for p, (n, k) in SHAPES.items()}
    extra = {"embed_tokens.weight": torch.randn(32, 24).half(), f"{BIASED}.bias": torch.randn(40).half()}
    return write_gptq(path, weights, extra_tensors=extra, **kwargs), extra


def load(path, extra, device="cpu", shapes=SHAPES):
    linears = {p: (n, k, f"{p}.bias" in extra) for p, (n, k) in shapes.items()}
    plain = {name: t for name, t in extra.items() if not name.endswith(".bias")}
    return qfuse.load_quantized(path, model_for(linears, plain, device), progress=False)


def scheme_name(bits, group_size, asym):
    group = "CH" if group_size == -1 else f"G{group_size}"
    name = {(8, "CH", False): "W8A16", (4, "G128", False): "W4A16", (4, "G128", True): "W4A16_ASYM"}
    return name.get((bits, group, asym), f"W{bits}A16_{group}" + ("_ASYM" if asym else ""))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("desc_act", [False, True], ids=["natural", "desc_act"])
@pytest.mark.parametrize("group_size", GROUPS)
def test_load_bit_exact(tmp_path, bits, sym, fmt, desc_act, group_size):
    config_style, device = CONFIG_STYLE[group_size], DEVICE[group_size]
    specs, extra = write_model(tmp_path / "ckpt", bits=bits, group_size=group_size, sym=sym, fmt=fmt, desc_act=desc_act, config_style=config_style)
    model = load(tmp_path / "ckpt", extra, device)
    for prefix, spec in specs.items():
        layer = model.get_submodule(prefix)
        # Symmetric checkpoints store zero points of 2**(bits-1) (v1: minus 1): qfuse drops them.
        assert layer.scheme.name == scheme_name(bits, group_size, not sym)
        check_loaded_layer(layer, spec, extra.get(f"{prefix}.bias"), prefix)
        # A random act-order permutation over more than one group is never monotonic.
        assert (layer.act_perm is not None) == (desc_act and group_size != -1)
        if layer.act_perm is not None:
            check_against_monotonic_checkpoint(tmp_path / f"sorted_{prefix}", layer, spec, fmt, sym)
    assert torch.equal(model.embed_tokens.weight, extra["embed_tokens.weight"])


def check_against_monotonic_checkpoint(path, layer, spec, fmt, sym):
    """An act-order layer must compute what a plain GPTQ layer computes on permuted inputs.

    The reference is a second checkpoint holding the same codes (and bias) with their input
    channels stored in ``layer.act_perm`` order, so that its ``g_idx`` is ``k // G``: qfuse
    loads it without ``act_perm``, and ``layer(x)`` must equal ``reference(x[:, act_perm])``
    exactly (same kernel, same operands). That ``act_perm`` sorts the channels by group is
    checked first, so that the reference is a legal checkpoint."""
    perm = layer.act_perm.cpu()
    natural = natural_g_idx(spec.in_features, spec.group_size)
    assert torch.equal(torch.sort(perm).values, torch.arange(spec.in_features))
    assert torch.equal(spec.g_idx[perm], natural)
    sorted_spec = SpecLayer(spec.codes[perm], spec.zeros, spec.scales, natural, spec.bits, spec.group_size)
    bias = {} if layer.bias is None else {"proj.bias": layer.bias}
    write_gptq_layers(path, {"proj": sorted_spec}, bits=spec.bits, group_size=spec.group_size, sym=sym, fmt=fmt, desc_act=False, extra_tensors=bias)
    model = model_for({"proj": (spec.out_features, spec.in_features, bool(bias))})
    reference = qfuse.load_quantized(path, model, progress=False).proj
    assert reference.act_perm is None
    assert torch.equal(reference.dequantized_weight(), spec.weight[:, perm])
    for m in (1, 7):
        x = torch.randn(m, spec.in_features).half()
        assert torch.equal(layer(x), reference(x[:, perm]))


def test_writer_matches_reference_words():
    """Guards the oracle itself against the reference's stated words (2.4, 2.5)."""
    # v1 symmetric 4-bit: every stored zero nibble is 7 (z = 8).
    assert gptq_stored_zeros(torch.full((1, 8), 8), 4, "gptq").item() == 0x77777777
    assert gptq_stored_zeros(torch.full((1, 4), 128), 8, "gptq").item() == 0x7F7F7F7F
    assert gptq_stored_zeros(torch.full((1, 8), 8), 4, "gptq_v2").item() == 0x88888888 - 2**32
    # qweight packs along K: input channel 8r + j of column n is nibble j of word [r, n].
    codes = torch.arange(8).reshape(8, 1)
    assert pack_rows(codes, 4).item() == 0x76543210
    assert pack_rows(torch.tensor([[1], [2], [3], [255]]), 8).item() == 0xFF030201 - 2**32


def test_v1_zero_point_zero(tmp_path):
    """v1 stores z - 1: a zero point of 0 is the reference's lossy AutoGPTQ case (2.5).

    Masked per code (what a correct writer stores: z - 1 & 0xF = 15 in its own nibble) it
    decodes exactly: qfuse adds 1 per code, not per word, so nothing carries into the
    neighbouring zero points. AutoGPTQ's unmasked OR (``-1`` as uint32) instead sets every
    higher nibble of the word; that damage is in the file and cannot be undone by a reader:
    the reference's example zeros [0, 5, 3, 8, 1, 0, 2, 7] become one all-ones word, read as
    eight zero points of 0, which is what qfuse then loads."""
    n, k, g = 16, 64, 32
    zeros = torch.tensor([[0, 5, 3, 8, 1, 0, 2, 7] * 2, [15, 0, 0, 14, 0, 1, 0, 15] * 2])
    codes = torch.randint(0, 16, (k, n))
    spec = SpecLayer(codes, zeros, (torch.rand(2, n) * 0.01 + 1e-3).half(), natural_g_idx(k, g), 4, g)
    write_gptq_layers(tmp_path / "masked", {"proj": spec}, bits=4, group_size=g, sym=False, fmt="gptq", desc_act=False)
    model = qfuse.load_quantized(tmp_path / "masked", model_for({"proj": (n, k, False)}), progress=False)
    check_loaded_layer(model.proj, spec, None, "proj")
    # 8-bit: z = 0 is stored as 255, and 255 + 1 wraps to 0 within its byte.
    spec8 = SpecLayer(torch.randint(0, 256, (k, n)), torch.tensor([[0, 255, 1, 128] * 4] * 2), spec.scales, spec.g_idx, 8, g)
    write_gptq_layers(tmp_path / "masked8", {"proj": spec8}, bits=8, group_size=g, sym=False, fmt="gptq", desc_act=False)
    model = qfuse.load_quantized(tmp_path / "masked8", model_for({"proj": (n, k, False)}), progress=False)
    check_loaded_layer(model.proj, spec8, None, "proj")

    broken = autogptq_unmasked_v1_zeros(zeros, 4)
    assert broken[0, 0].item() == -1  # 0xFFFFFFFF
    edit_tensor(tmp_path / "masked", "proj.qzeros", broken)
    model = qfuse.load_quantized(tmp_path / "masked", model_for({"proj": (n, k, False)}), progress=False)
    # Both words of group 0 start with a 0: all ones, eight zeros each. Group 1's words hold
    # z=15 then z=0: 0xFFFFFFFE, so position 0 survives and positions 1..7 all read 0.
    read_zeros = torch.tensor([[0] * 16, [15, 0, 0, 0, 0, 0, 0, 0] * 2])
    read = SpecLayer(codes, read_zeros, spec.scales, spec.g_idx, 4, g)
    assert torch.equal(model.proj.dequantized_weight(), read.weight)
    assert not torch.equal(read.weight, spec.weight)


@pytest.mark.parametrize("format_keys", [("format",), ("format", "checkpoint_format")])
def test_gptqmodel_format_key(tmp_path, format_keys):
    """GPTQModel writes ``format`` (and the legacy ``checkpoint_format`` alias): v2 zero points
    are read as stored; read as v1 they would all be off by one."""
    specs, extra = write_model(tmp_path, bits=4, group_size=64, sym=False, fmt="gptq_v2", format_key=format_keys[0])
    if len(format_keys) > 1:
        edit_quant_config(tmp_path, **{format_keys[1]: "gptq_v2"})
    model = load(tmp_path, extra)
    for prefix, spec in specs.items():
        check_loaded_layer(model.get_submodule(prefix), spec, extra.get(f"{prefix}.bias"), prefix)


# ----------------------------------------------------------------- GPTQModel dynamic


def test_dynamic_positive_override(tmp_path):
    """``"+:regex"`` gives matching layers other bits and group size (8-bit, group 32 here),
    the rest keep the config's 4-bit group 128."""
    dynamic = {r"+:.*\.mlp\..*": {"bits": 8, "group_size": 32}}
    specs, extra = write_model(
        tmp_path, bits=4, group_size=128, sym=False, fmt="gptq_v2", dynamic=dynamic, overrides={BIASED: {"bits": 8, "group_size": 32}}
    )
    model = load(tmp_path, extra)
    assert model.get_submodule(BIASED).scheme.name == "W8A16_G32_ASYM"
    assert model.get_submodule("layers.0.self_attn.o_proj").scheme.name == "W4A16_ASYM"
    for prefix, spec in specs.items():
        check_loaded_layer(model.get_submodule(prefix), spec, extra.get(f"{prefix}.bias"), prefix)


def test_dynamic_first_match_wins(tmp_path):
    """GPTQModel's ``dynamic_get`` and vLLM's ``get_dynamic_override`` stop at the first
    pattern that matches: a specific rule before a catch-all (and a bare regex is positive)."""
    dynamic = {r".*\.mlp\..*": {"bits": 8, "group_size": 32}, r"+:.*": {"bits": 4, "group_size": 64}, r"-:.*\.mlp\..*": {}}
    overrides = {BIASED: {"bits": 8, "group_size": 32}, "layers.0.self_attn.o_proj": {"bits": 4, "group_size": 64}}
    specs, extra = write_model(tmp_path, bits=4, group_size=128, sym=True, fmt="gptq", desc_act=True, dynamic=dynamic, overrides=overrides)
    model = load(tmp_path, extra)
    for prefix, spec in specs.items():
        check_loaded_layer(model.get_submodule(prefix), spec, extra.get(f"{prefix}.bias"), prefix)


def test_dynamic_negative_on_quantized_layer(tmp_path):
    _, extra = write_model(tmp_path, bits=4, group_size=128, sym=True, dynamic={r"-:.*\.mlp\..*": {}})
    with pytest.raises(qfuse.CheckpointError, match=r"layer layers\.1\.mlp\.up_proj has a qweight but .*leaves it unquantized"):
        load(tmp_path, extra)


# ----------------------------------------------------------------- malformed checkpoints


def test_three_bit_rejected_naming_the_layer(tmp_path):
    _, extra = write_model(tmp_path, bits=4, group_size=128, sym=True, config_style="quantize_config.json")
    edit_quant_config(tmp_path, bits=3)
    with pytest.raises(qfuse.CheckpointError, match=r"layer layers\.\d\.\S+: 3-bit GPTQ is not supported"):
        load(tmp_path, extra)


def test_group_size_not_dividing_k(tmp_path):
    """K=320 written with group 64; a config claiming group 128 (2.5 groups) must fail."""
    shapes = {"proj": (16, 320)}
    write_gptq(tmp_path, {"proj": random_weight(16, 320)}, bits=4, group_size=64, sym=False, fmt="gptq_v2")
    edit_quant_config(tmp_path, group_size=128)
    with pytest.raises(qfuse.CheckpointError, match=r"layer proj: a \[16, 320\] weight does not fit group_size=128"):
        load(tmp_path, {}, shapes=shapes)


@pytest.mark.parametrize("bad", [-1, 3], ids=["negative", "past_last_group"])
def test_g_idx_out_of_range(tmp_path, bad):
    specs, extra = write_model(tmp_path, bits=4, group_size=128, sym=True, desc_act=True)
    g_idx = specs[BIASED].g_idx.to(torch.int32).clone()
    g_idx[5] = bad  # K=384 has groups 0..2
    edit_tensor(tmp_path, f"{BIASED}.g_idx", g_idx)
    with pytest.raises(qfuse.CheckpointError, match=r"layer layers\.1\.mlp\.up_proj: g_idx values must lie in \[0, 3\)"):
        load(tmp_path, extra)


def test_g_idx_with_unequal_groups(tmp_path):
    """In range, but one group gets G+1 channels and another G-1: no sort can make the
    stored group layout, so the checkpoint is corrupt."""
    specs, extra = write_model(tmp_path, bits=4, group_size=128, sym=True)
    g_idx = specs[BIASED].g_idx.to(torch.int32).clone()
    g_idx[0] = 1
    edit_tensor(tmp_path, f"{BIASED}.g_idx", g_idx)
    with pytest.raises(qfuse.CheckpointError, match="g_idx does not put exactly 128 input channels in each of 3 groups"):
        load(tmp_path, extra)


def test_desc_act_without_g_idx_is_refused(tmp_path):
    """Loaded in natural order the act-order layer's weights would be wrong (max 0.07 apart, logits 0.33)."""
    _, extra = write_model(tmp_path, bits=4, group_size=64, sym=True, desc_act=True)
    edit_tensor(tmp_path, f"{BIASED}.g_idx", None)
    with pytest.raises(qfuse.CheckpointError, match=r"layer layers\.1\.mlp\.up_proj: desc_act is true but the checkpoint has no .*g_idx"):
        load(tmp_path, extra)


def test_autogptq_marlin_layout_is_refused_by_name(tmp_path):
    _, extra = write_model(tmp_path, bits=4, group_size=128, sym=True, config_style="quantize_config.json")
    edit_quant_config(tmp_path, is_marlin_format=True)
    with pytest.raises(qfuse.CheckpointError, match="AutoGPTQ's Marlin layout .* is not supported"):
        load(tmp_path, extra)


def test_stored_rotary_inv_freq_is_skipped(tmp_path):
    """transformers before 4.31 saved each attention layer's rotary inv_freq; the model computes it."""
    _, extra = write_model(tmp_path, bits=4, group_size=128, sym=True)
    edit_tensor(tmp_path, "layers.0.self_attn.rotary_emb.inv_freq", torch.rand(8))
    model = load(tmp_path, extra)
    assert not any("inv_freq" in n for n, _ in model.named_buffers())
