"""SmoothQuant on tiny random-weight HF decoders with activation outlier channels."""

import copy

import pytest
import torch

import qfuse
from qfuse.calibration import SmoothMapping, smooth_model, smoothquant_mappings
from tests.helpers import rel_err
from tests.hf_models import ARCHS, tiny_hf_model

OUTLIER_CHANNELS = (3, 17, 100)
OUTLIER_GAIN = 30.0
# SmoothQuant error / RTN error bound. W8A8's error is mostly the activations' and shrinks
# most; W4A8's is mostly its 4-bit weights' (0.27-0.32 relative on these random weights).
MAX_RATIO = {"W8A8": 0.3, "W4A8": 0.9}  # measured: 0.17-0.16 and 0.72-0.85


def with_outliers(arch):
    """A model whose norm outputs carry a few large channels (as trained LLMs do), while the
    float model computes nearly the same function: the norm weight is raised on those channels
    and the Linears it feeds are lowered on the same input channels."""
    model = tiny_hf_model(arch, layers=2, vocab=256)
    with torch.no_grad():
        for m in smoothquant_mappings(model):
            norm = model.get_submodule(m.norm)
            for j in OUTLIER_CHANNELS:
                norm.weight[j] *= OUTLIER_GAIN
                for name in m.linears:
                    model.get_submodule(name).weight[:, j] /= OUTLIER_GAIN
    return model


def ids(seed, n=4, t=32):
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.inference_mode():
        return model(x, use_cache=False).logits.float()


def test_mappings_of_a_llama():
    model = tiny_hf_model("llama", layers=2)
    maps = smoothquant_mappings(model)
    assert [m.norm for m in maps] == [f"model.layers.{i}.{n}" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")]
    assert maps[0].linears == tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv")
    assert maps[1].linears == ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("scheme", ["W8A8", "W4A8"])
def test_smoothing_keeps_the_float_model_and_lowers_the_quantized_error(arch, scheme):
    base = with_outliers(arch)
    held_out = ids(1)
    ref = logits(base, held_out)
    rtn = logits(qfuse.quantize_model(copy.deepcopy(base), scheme, progress=False), held_out)
    smoothed = copy.deepcopy(base)
    scales = smooth_model(smoothed, [ids(s) for s in range(10, 14)], alpha=0.5, progress=False)
    assert len(scales) == 4 and all(s.shape == (256,) and (s > 0).all() for s in scales.values())
    # the same function up to bf16 rounding of the rescaled weights
    assert rel_err(logits(smoothed, held_out), ref) < 0.02
    sq = logits(qfuse.quantize_model(smoothed, scheme, progress=False), held_out)
    err_rtn, err_sq = rel_err(rtn, ref), rel_err(sq, ref)
    print(f"{arch} {scheme}: RTN {err_rtn:.4f} SmoothQuant {err_sq:.4f}")
    assert err_sq < MAX_RATIO[scheme] * err_rtn, f"{arch} {scheme}: SmoothQuant {err_sq:.4f} vs RTN {err_rtn:.4f}"


def test_outlier_channels_get_the_largest_scales():
    model = with_outliers("llama")
    scales = smooth_model(model, [ids(5)], alpha=0.5, progress=False)
    s = scales["model.layers.0.input_layernorm"]
    assert set(s.topk(len(OUTLIER_CHANNELS)).indices.tolist()) == set(OUTLIER_CHANNELS)


def test_bad_arguments():
    model = tiny_hf_model("llama", layers=1)
    with pytest.raises(ValueError, match=r"alpha must lie in \[0, 1\]"):
        smooth_model(model, [ids(0)], alpha=1.5)
    with pytest.raises(ValueError, match="no `layers` nn.ModuleList"):
        smooth_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), [torch.zeros(1, 4, dtype=torch.long)])
    with pytest.raises(ValueError, match="no norm -> Linear mappings"):
        smooth_model(model, [ids(0)], mappings=[])
    with pytest.raises(ValueError, match="integer token ids"):
        smooth_model(model, [torch.zeros(1, 4)])


def test_a_batch_tensor_is_one_batch():
    """``[B, T]`` ids, as quantize_model's calibration_data takes them (calibration_batches' output): one
    batch, the same scales as the list holding it (it was iterated row by row into 1-D inputs)."""
    batch = ids(3)
    as_tensor = smooth_model(tiny_hf_model("llama", layers=1), batch, progress=False)
    as_list = smooth_model(tiny_hf_model("llama", layers=1), [batch], progress=False)
    assert as_tensor.keys() == as_list.keys() and all(torch.equal(as_tensor[k], as_list[k]) for k in as_list)


def test_smoothed_model_saves_and_reloads(tmp_path):
    """Smoothing is folded into the weights: the checkpoint is a plain W8A8 one."""
    model = with_outliers("llama")
    for mod in model.modules():  # float32 rotary buffers, as a loaded model computes them
        if hasattr(mod, "original_inv_freq"):
            fresh = type(mod)(config=model.config)
            mod.inv_freq, mod.original_inv_freq = fresh.inv_freq, fresh.original_inv_freq
    smooth_model(model, [ids(7)], alpha=0.8, progress=False)
    qfuse.quantize_model(model, "W8A8", progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    assert torch.equal(logits(qfuse.from_pretrained(tmp_path, progress=False), ids(8)), logits(model, ids(8)))


def test_a_channel_never_active_keeps_its_norm_weight():
    """A hidden channel that is 0 on every calibration token (a zero embedding column) has nothing to
    smooth: s = 1 there (the formula's clamp, 1e-5, gives an fp16 norm weight of inf and NaN logits)."""
    base = tiny_hf_model("llama", dtype=torch.float16, layers=1, vocab=256)
    with torch.no_grad():
        base.model.embed_tokens.weight[:, 5] = 0
    norm = base.model.layers[0].input_layernorm.weight[5].item()
    ref = logits(base, ids(1))
    smoothed = copy.deepcopy(base)
    scales = smooth_model(smoothed, [ids(2)], progress=False)
    assert scales["model.layers.0.input_layernorm"][5] == 1 and smoothed.model.layers[0].input_layernorm.weight[5].item() == norm
    assert rel_err(logits(smoothed, ids(1)), ref) < 0.02
    quantized = qfuse.quantize_model(copy.deepcopy(base), "W8A8", calibration="sq", calibration_data=[ids(2)], progress=False)
    assert quantized.model.layers[0].input_layernorm.weight[5].item() == norm
    out = logits(quantized, ids(1))
    assert torch.isfinite(out).all() and rel_err(out, ref) < 0.1


def test_a_norm_split_over_two_mappings_is_refused():
    """Two mappings of one norm fold two scale vectors into it while each Linear takes only its own:
    the float model would change (0.87 relative logit error here) without an error."""
    model = tiny_hf_model("llama", layers=1)
    p = "model.layers.0."
    split = [
        SmoothMapping(f"{p}input_layernorm", (f"{p}self_attn.q_proj", f"{p}self_attn.k_proj")),
        SmoothMapping(f"{p}input_layernorm", (f"{p}self_attn.v_proj",)),
    ]
    weight = model.model.layers[0].input_layernorm.weight.clone()
    with pytest.raises(ValueError, match=r"norm model\.layers\.0\.input_layernorm is in more than one mapping"):
        smooth_model(model, [ids(0)], mappings=split, progress=False)
    twice = [
        SmoothMapping(f"{p}input_layernorm", (f"{p}self_attn.q_proj",)),
        SmoothMapping(f"{p}post_attention_layernorm", (f"{p}self_attn.q_proj",)),
    ]
    with pytest.raises(ValueError, match=r"Linear model\.layers\.0\.self_attn\.q_proj is in more than one mapping"):
        smooth_model(model, [ids(0)], mappings=twice, progress=False)
    assert torch.equal(model.model.layers[0].input_layernorm.weight, weight)
