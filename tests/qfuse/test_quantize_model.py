"""quantize_model on tiny random-weight Hugging Face Llama / Qwen2 / Mistral models."""

import copy
import functools

import pytest
import torch
from torch import nn

import qfuse
from qfuse.schemes import make_scheme
from tests.helpers import rel_err
from tests.hf_models import ARCHS, tiny_hf_model

# Logit error of the quantized model vs the bf16 model, measured on these random-weight
# models (W8: 0.016-0.019, W4: 0.20-0.24); a broken kernel gives ~1.
MAX_REL_ERR = {"W8A16": 0.04, "W8A8": 0.04, "W4A16": 0.33, "W4A16_ASYM": 0.33, "W4A8": 0.33, "W4A8_G128": 0.33}
# Inductor's own bf16 fusions move the unquantized model's logits by 0.76% (rel); a flipped
# rounding before an int8 quant roughly doubles that for W8A8/W4A8 (measured <= 1.5%).
MAX_COMPILE_DIFF = 0.03


@pytest.fixture(scope="module")
def hf_bases():
    """arch -> (arch, float model, ids, its logits), each built on first use."""

    @functools.cache
    def build(arch):
        model = tiny_hf_model(arch)
        ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            ref = model(ids, use_cache=False).logits.float()
        return arch, model, ids, ref

    return build


# Every scheme on llama and on qwen2 (whose q/k/v Linears have biases: each scheme's GEMM with
# bias). Mistral's decoder is llama's with a sliding-window mask (its Linears and norms, what
# quantize_model swaps and each scheme's ops run in, are the same, without bias): two schemes
# cover its layout, one weight-only and one quantizing activations; the other four repeat
# llama's paths and run with ``pytest -m slow``.
MISTRAL_SCHEMES = ("W4A16", "W8A8")
COMPILE_CASES = [
    pytest.param(arch, scheme, marks=() if arch != "mistral" or scheme in MISTRAL_SCHEMES else (pytest.mark.slow,), id=f"{arch}-{scheme}")
    for arch in ARCHS
    for scheme in qfuse.SCHEMES
]


def _aot_eager_and_inductor(run_with: dict):
    """A torch.compile backend that hands the one Dynamo graph to both aot_eager and Inductor (one
    Dynamo trace of the model instead of two, ~2 s of each case); a call runs the graph through
    ``run_with["backend"]``: "aot_eager" (the traced graph op by op) or "inductor"."""
    from torch._dynamo.backends.debugging import aot_eager
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        compiled = {"aot_eager": aot_eager(gm, example_inputs)}  # first: Inductor's passes may rewrite gm in place
        compiled["inductor"] = compile_fx(gm, example_inputs)  # what torch.compile's default backend runs
        run_with["graphs"] = run_with.get("graphs", 0) + 1

        def run(*args):  # Dynamo calls a backend's function as it calls either of these
            return compiled[run_with["backend"]](*args)

        return run

    return backend


@pytest.mark.parametrize(("arch", "scheme"), COMPILE_CASES)
def test_quantize_compile_fullgraph(hf_bases, arch, scheme):
    arch, base, ids, ref = hf_bases(arch)
    model = qfuse.quantize_model(copy.deepcopy(base), scheme, progress=False)
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, qfuse.QuantLinear)
    assert isinstance(layer.mlp.down_proj, qfuse.QuantLinear)
    assert isinstance(layer.input_layernorm, qfuse.RMSNorm) and isinstance(model.model.norm, qfuse.RMSNorm)
    assert isinstance(model.lm_head, nn.Linear) and not isinstance(model.lm_head, qfuse.QuantLinear)
    n_quant = sum(isinstance(m, qfuse.QuantLinear) for m in model.modules())
    assert n_quant == 7 * len(model.model.layers)
    with torch.inference_mode():
        eager = model(ids, use_cache=False).logits.float()
        assert rel_err(eager, ref) < MAX_REL_ERR[scheme], f"{arch} {scheme}: {rel_err(eager, ref):.4f}"
        # fullgraph=True raises on any graph break. aot_eager runs the traced graph op by op:
        # it must reproduce eager exactly. Inductor compiles the same traced graph.
        torch._dynamo.reset()
        run_with = {"backend": "aot_eager"}
        compiled_model = torch.compile(model, fullgraph=True, backend=_aot_eager_and_inductor(run_with))
        traced = compiled_model(ids, use_cache=False).logits.float()
        assert torch.equal(traced, eager)
        run_with["backend"] = "inductor"
        compiled = compiled_model(ids, use_cache=False).logits.float()
        assert run_with["graphs"] == 1  # the second call ran the same compiled graph
        assert rel_err(compiled, eager) < MAX_COMPILE_DIFF, f"{arch} {scheme}: {rel_err(compiled, eager):.4f}"


def test_progress_bar_and_return_value(capsys):
    base = tiny_hf_model("llama", layers=1)
    out = qfuse.quantize_model(base, "W8A8")
    assert out is base
    err = capsys.readouterr().err
    assert "qfuse W8A8" in err and "7/7" in err


def test_ignore_patterns():
    model = tiny_hf_model("llama", layers=2)
    qfuse.quantize_model(model, "W4A16", ignore=("lm_head", "down_proj", "model.layers.1.*"), progress=False)
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.Linear)
    assert not isinstance(model.model.layers[0].mlp.down_proj, qfuse.QuantLinear)
    assert isinstance(model.model.layers[0].mlp.up_proj, qfuse.QuantLinear)
    assert not any(isinstance(m, qfuse.QuantLinear) for m in model.model.layers[1].modules())


def test_ignore_adds_to_the_kept_head():
    """An ignore list replaced the defaults, and lm_head was quantized (int8 activations into the
    logits with W8A8) though lm_head=None says the head stays in floating point."""
    model = tiny_hf_model("llama", layers=1)
    with pytest.warns(UserWarning, match="'nosuchlayer' matches no"):
        qfuse.quantize_model(model, "W8A8", ignore=["nosuchlayer"], progress=False)
    assert type(model.lm_head) is nn.Linear
    model = tiny_hf_model("llama", layers=1)
    qfuse.quantize_model(model, "W8A8", ignore=["down_proj"], lm_head="W8A16", progress=False)
    assert model.lm_head.scheme.name == "W8A16" and type(model.model.layers[0].mlp.down_proj) is nn.Linear


def test_incompatible_layers_leave_model_unchanged():
    model = nn.Sequential(nn.Linear(256, 64), nn.Linear(64, 96), nn.Linear(96, 8)).bfloat16()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError,
        match=r"cannot quantize 2 layer\(s\) with W4A16.*\n  1: in_features=64 is not divisible by group_size=128 of W4A16\n  2: in_features=96",
    ):
        qfuse.quantize_model(model, "W4A16", progress=False, group_fallback=False)
    assert all(type(m) is nn.Linear for m in model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    qfuse.quantize_model(model, "W4A16", ignore=("1", "2"), progress=False, group_fallback=False)  # what the error suggests
    assert isinstance(model[0], qfuse.QuantLinear)


def test_fp32_model_rejected_with_hint():
    with pytest.raises(TypeError, match=r"model.to\(torch.bfloat16\)"):
        qfuse.quantize_model(nn.Sequential(nn.Linear(64, 64)), "W8A8", progress=False)


def test_unknown_scheme():
    with pytest.raises(ValueError, match="valid schemes: W8A16"):
        qfuse.quantize_model(nn.Sequential(nn.Linear(64, 64)), "int3", progress=False)


def test_torch_nn_rmsnorm_converted():
    model = nn.Sequential(nn.RMSNorm(128, eps=1e-5), nn.Linear(128, 128)).bfloat16()
    x = torch.randn(3, 128).bfloat16()
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        ref = model(x)
    qfuse.quantize_model(model, "W8A16", progress=False)
    assert isinstance(model[0], qfuse.RMSNorm)
    with torch.no_grad():
        assert rel_err(model(x), ref) < 0.02


def _module_types(model):
    return {name: type(m) for name, m in model.named_modules()}


def _assert_unchanged(model, types, state):
    assert _module_types(model) == types
    torch.testing.assert_close(dict(model.state_dict()), dict(state), rtol=0, atol=0, equal_nan=True)


def test_ignore_str_is_one_pattern(recwarn):
    model = tiny_hf_model("llama", layers=1)
    qfuse.quantize_model(model, "W8A16", ignore="lm_head", progress=False)
    assert type(model.lm_head) is nn.Linear
    assert isinstance(model.model.layers[0].mlp.up_proj, qfuse.QuantLinear)
    assert not recwarn.list


def test_ignore_entry_matching_nothing_warns():
    model = tiny_hf_model("llama", layers=1)
    with pytest.warns(UserWarning) as record:
        qfuse.quantize_model(model, "W8A16", ignore=["lm_head", "mlp", "q_prj"], progress=False)
    assert sorted(str(w.message).split("'")[1] for w in record) == ["mlp", "q_prj"]
    assert "matches no nn.Linear or RMSNorm layer" in str(record[0].message)
    assert record[0].filename == __file__  # points at the caller's line
    assert isinstance(model.model.layers[0].mlp.up_proj, qfuse.QuantLinear)


def test_default_ignore_does_not_warn_without_lm_head(recwarn):
    qfuse.quantize_model(nn.Sequential(nn.Linear(64, 64)).bfloat16(), "W8A16", progress=False)
    assert not recwarn.list
    # the same entry given explicitly is the caller's pattern: it warns
    with pytest.warns(UserWarning, match="ignore entry 'lm_head' matches no"):
        qfuse.quantize_model(nn.Sequential(nn.Linear(64, 64)).bfloat16(), "W8A16", ignore=("lm_head",), progress=False)


def test_ignore_keeps_a_norm():
    model = tiny_hf_model("llama", layers=1)
    qfuse.quantize_model(model, "W8A16", ignore=("lm_head", "model.norm"), progress=False)
    assert type(model.model.norm).__name__ == "LlamaRMSNorm"
    assert isinstance(model.model.layers[0].input_layernorm, qfuse.RMSNorm)


@pytest.mark.parametrize("second", ["W8A8", "W4A16"])
def test_second_call_raises_naming_the_schemes(second):
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W4A16", progress=False)
    types, state = _module_types(model), copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"already quantized \(7 W4A16 QuantLinear layer\(s\)\).*start again from the float model"):
        qfuse.quantize_model(model, second, ignore=(), progress=False)
    _assert_unchanged(model, types, state)


def test_mixed_schemes_through_submodules():
    model = tiny_hf_model("llama", layers=2)
    qfuse.quantize_model(model, "W4A16", ignore=("lm_head", "model.layers.1.*"), progress=False)
    qfuse.quantize_model(model.model.layers[1], "W8A8", progress=False)  # what the error above suggests
    assert model.model.layers[1].mlp.down_proj.scheme.name == "W8A8"
    with pytest.raises(ValueError, match=r"\(7 W4A16 QuantLinear, 7 W8A8 QuantLinear layer"):
        qfuse.quantize_model(model, "W8A16", progress=False)


def test_a_fake_quant_model_is_refused_too():
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W8A8", fake_quant=True, progress=False)
    with pytest.raises(ValueError, match=r"already quantized \(7 W8A8 FakeQuantLinear layer"):
        qfuse.quantize_model(model, "W8A16", lm_head="W8A16", progress=False)


def test_bare_linear_returns_a_quantlinear():
    linear = nn.Linear(256, 64).bfloat16()
    x = torch.randn(3, 256).bfloat16()
    q = qfuse.quantize_model(linear, "W4A16", progress=False)
    assert isinstance(q, qfuse.QuantLinear) and q.scheme.name == "W4A16"
    assert type(linear) is nn.Linear  # a module cannot replace itself: the return value is the result
    with torch.no_grad():
        assert rel_err(q(x), linear(x)) < 0.2


def test_fp32_norms_rejected_up_front():
    model = nn.Sequential(nn.RMSNorm(128), nn.Linear(128, 128))
    types, state = _module_types(model), copy.deepcopy(model.state_dict())
    with pytest.raises(
        TypeError, match=r"cannot quantize 2 layer\(s\).*\n  1: weight dtype torch.float32.*\n  0: RMSNorm weight dtype torch.float32"
    ):
        qfuse.quantize_model(model, "W8A16", progress=False)
    _assert_unchanged(model, types, state)
    # bf16 Linears, a norm kept in float32: only the norm is named, and ignore keeps it as it is
    model[1].bfloat16()
    with pytest.raises(TypeError, match=r"cannot quantize 1 layer\(s\) with W8A16 .*\n  0: RMSNorm weight dtype torch.float32"):
        qfuse.quantize_model(model, "W8A16", progress=False)
    qfuse.quantize_model(model, "W8A16", ignore="0", progress=False)
    assert type(model[0]) is nn.RMSNorm and isinstance(model[1], qfuse.QuantLinear)


def test_nothing_to_quantize_raises():
    model = nn.Sequential(nn.RMSNorm(128), nn.Linear(128, 128))
    types, state = _module_types(model), copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError,
        match=r"nothing to quantize \(model left unchanged\): all 1 nn.Linear layer\(s\) are matched by ignore=\('1', 'lm_head', 'shared_expert_gate'\)",
    ):
        qfuse.quantize_model(model, "W8A16", ignore="1", progress=False)
    _assert_unchanged(model, types, state)
    with pytest.raises(ValueError, match="nothing to quantize.*: Sequential contains no nn.Linear"):
        qfuse.quantize_model(nn.Sequential(nn.RMSNorm(128)).bfloat16(), "W8A16", progress=False)


def _copy_non_persistent_buffers(dst, src):
    # Not in a state_dict (rotary inv_freq): a meta-built model recomputes them on a real
    # device, as accelerate's init_empty_weights keeps buffers off the meta device.
    persistent = dst.state_dict().keys()
    for name, buf in src.named_buffers():
        if name not in persistent:
            parent, _, leaf = name.rpartition(".")
            setattr(dst.get_submodule(parent), leaf, buf.clone())


@pytest.mark.parametrize("scheme", list(qfuse.SCHEMES))
def test_meta_skeleton_matches_real_and_loads_state_dict(scheme):
    real = qfuse.quantize_model(tiny_hf_model("llama", layers=1), scheme, progress=False)
    with torch.device("meta"):
        skeleton = tiny_hf_model("llama", layers=1)
    skeleton = qfuse.quantize_model(skeleton, scheme, progress=False)
    layout = lambda m: [(n, tuple(b.shape), b.dtype) for n, b in m.named_buffers()]  # noqa: E731
    assert layout(skeleton) == layout(real)
    quant_bufs = [b for m in skeleton.modules() if isinstance(m, qfuse.QuantLinear) for b in m.buffers()]
    assert quant_bufs and all(b.is_meta for b in quant_bufs)
    skeleton.load_state_dict(real.state_dict(), assign=True)
    _copy_non_persistent_buffers(skeleton, real)
    assert not any(t.is_meta for t in [*skeleton.parameters(), *skeleton.buffers()])
    ids = torch.randint(0, 256, (2, 8))
    with torch.inference_mode():
        assert torch.equal(skeleton(ids, use_cache=False).logits, real(ids, use_cache=False).logits)


def test_error_half_way_leaves_model_unchanged(monkeypatch):
    model = tiny_hf_model("llama", layers=1)
    types, state = _module_types(model), copy.deepcopy(model.state_dict())
    real_from_linear = qfuse.QuantLinear.from_linear
    calls = []

    def fail_on_third(linear, scheme):
        calls.append(linear)
        if len(calls) == 3:
            raise RuntimeError("out of memory (simulated)")
        return real_from_linear(linear, scheme)

    monkeypatch.setattr(qfuse.QuantLinear, "from_linear", staticmethod(fail_on_third))
    with pytest.raises(RuntimeError, match="simulated"):
        qfuse.quantize_model(model, "W8A8", progress=False)
    assert len(calls) == 3
    _assert_unchanged(model, types, state)


def test_nan_or_inf_weight_named():
    model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 8)).bfloat16()
    with torch.no_grad():
        model[1].weight[3, 5] = float("nan")
        model[2].weight[0, :2] = float("inf")
    types, state = _module_types(model), copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError, match=r"cannot quantize 2 layer\(s\) with W4A8_G128.*\n  1: weight has 1 NaN/inf value\(s\).*\n  2: weight has 2 NaN/inf"
    ):
        qfuse.quantize_model(model, "W4A8_G128", progress=False)
    _assert_unchanged(model, types, state)


# ----------------------------------------------------------------------------- K not a multiple of the group size

# hidden 320 = 2 * 128 + 64 (as SmolLM2's 576 = 4 * 128 + 64): q/k/v/o/gate/up have K = 320,
# down_proj K = 512; 4 heads of 80
RAGGED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")
FALLBACK = {"W4A16": "W4A16_G64", "W4A16_ASYM": "W4A16_G64_ASYM", "W4A8_G128": "W4A8_G64"}


def _hidden_320(**kw):
    return tiny_hf_model("llama", layers=2, hidden=320, intermediate=512, **kw)


@pytest.mark.parametrize("scheme", list(FALLBACK))
def test_group_fallback_for_in_features_not_a_multiple_of_the_group(scheme):
    base = _hidden_320()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = base(ids, use_cache=False).logits.float()
    with pytest.warns(UserWarning) as record:
        model = qfuse.quantize_model(copy.deepcopy(base), scheme, progress=False)
    assert len(record) == 1  # one warning per call, whatever the number of layers
    assert str(record[0].message) == (
        f"quantize_model: 12 of 14 layer(s) have in_features not divisible by group_size=128 of {scheme} and use the largest "
        f"group its op runs that divides them instead: 12 with group 64 ({FALLBACK[scheme]}, e.g. model.layers.0.self_attn.q_proj); "
        "pass group_fallback=False to refuse these layers"
    )
    assert record[0].filename == __file__
    s = qfuse.get_scheme(scheme)
    fallback = make_scheme(s.weight_bits, s.act_bits, 64, s.symmetric)
    assert fallback.name == FALLBACK[scheme]
    layers = {n: m for n, m in model.named_modules() if isinstance(m, qfuse.QuantLinear)}
    assert len(layers) == 14
    for name, layer in layers.items():
        want = fallback if name.rpartition(".")[2] in RAGGED else s
        assert layer.scheme == want, name
        if want.weight_only:
            assert layer.scales.shape == (layer.out_features, layer.in_features // want.group_size), name
        elif want.group_size == -1:
            assert layer.group_scale is None, name
    with torch.inference_mode():
        out = model(ids, use_cache=False).logits.float()
    assert rel_err(out, ref) < MAX_REL_ERR[scheme], f"{scheme}: {rel_err(out, ref):.4f}"

    # a meta skeleton takes the same per-layer schemes and buffer shapes
    with torch.device("meta"):
        skeleton = _hidden_320()
    with pytest.warns(UserWarning, match="12 of 14 layer"):
        skeleton = qfuse.quantize_model(skeleton, scheme, progress=False)
    layout = lambda m: [(n, tuple(b.shape), b.dtype) for n, b in m.named_buffers()]  # noqa: E731
    assert layout(skeleton) == layout(model)

    # opted out: the layers are refused, as before the fallback
    again = copy.deepcopy(base)
    types, state = _module_types(again), copy.deepcopy(again.state_dict())
    refused = (
        rf"cannot quantize 12 layer\(s\) with {scheme} .*\n"
        rf"  model.layers.0.self_attn.q_proj: in_features=320 is not divisible by group_size=128 of {scheme}\n"
    )
    with pytest.raises(ValueError, match=refused):
        qfuse.quantize_model(again, scheme, progress=False, group_fallback=False)
    _assert_unchanged(again, types, state)


def test_group_fallback_picks_the_largest_group_dividing_k():
    # K = 192 = 128 + 64 -> 64; K = 64 -> 64; K = 96 and 160 -> 32; K = 256 keeps 128
    model = nn.Sequential(nn.Linear(192, 64), nn.Linear(64, 96), nn.Linear(96, 160), nn.Linear(160, 256), nn.Linear(256, 8)).bfloat16()
    x = torch.randn(3, 192).bfloat16()
    with torch.no_grad():
        ref = model(x)
    with pytest.warns(UserWarning) as record:
        qfuse.quantize_model(model, "W4A16_ASYM", progress=False)
    assert len(record) == 1
    assert "4 of 5 layer(s) have in_features not divisible by group_size=128 of W4A16_ASYM" in str(
        record[0].message
    ) and ": 2 with group 64 (W4A16_G64_ASYM, e.g. 0), 2 with group 32 (W4A16_G32_ASYM, e.g. 2);" in str(record[0].message)
    assert [m.scheme.name for m in model] == ["W4A16_G64_ASYM", "W4A16_G64_ASYM", "W4A16_G32_ASYM", "W4A16_G32_ASYM", "W4A16_ASYM"]
    assert [m.scheme.group_size for m in model] == [64, 64, 32, 32, 128]
    with torch.no_grad():
        assert rel_err(model(x), ref) < 0.2
    # a scheme of group 64 falls back to 32 only
    with pytest.warns(UserWarning, match=r"1 of 1 layer\(s\) .* group_size=64 of W4A16_G64 .*: 1 with group 32 \(W4A16_G32, e.g. model\)"):
        q = qfuse.quantize_model(nn.Linear(96, 8).bfloat16(), make_scheme(4, 16, 64), progress=False)
    assert q.scheme.name == "W4A16_G32"


def test_no_group_dividing_k_still_raises_and_leaves_model_unchanged(recwarn):
    # K = 80 and 48: no group of 128, 64 or 32 divides them; K = 77 is odd (4-bit); K = 192 could fall back
    model = nn.Sequential(nn.Linear(192, 80), nn.Linear(80, 48), nn.Linear(48, 77), nn.Linear(77, 8)).bfloat16()
    types, state = _module_types(model), copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError,
        match=r"cannot quantize 3 layer\(s\) with W4A16 .*\n"
        r"  1: in_features=80 is not divisible by group_size=128 of W4A16, nor by a smaller group size wna16_gemm runs \(64, 32\)\n"
        r"  2: in_features=48 is not divisible .*\(64, 32\)\n  3: in_features=77 must be even for 4-bit weights\n",
    ):
        qfuse.quantize_model(model, "W4A16", progress=False)
    _assert_unchanged(model, types, state)
    assert not recwarn.list  # nothing fell back: the call raised before
    # W4A8_G128 runs group 64 or 32 where 128 does not divide K, else per channel; an odd K is still refused
    with pytest.raises(ValueError, match=r"cannot quantize 1 layer\(s\) with W4A8_G128 .*\n  3: in_features=77 must be even"):
        qfuse.quantize_model(model, "W4A8_G128", progress=False)
    _assert_unchanged(model, types, state)
    with pytest.warns(UserWarning, match=r"3 of 3 layer\(s\) .*: 1 with group 64 \(W4A8_G64, e.g. 0\), 2 per channel \(W4A8, e.g. 1\)"):
        qfuse.quantize_model(model, "W4A8_G128", ignore="3", progress=False)
    assert [m.scheme.name for m in model[:3]] == ["W4A8_G64", "W4A8", "W4A8"]  # K = 192, 80, 48


@pytest.mark.parametrize("head", ["W8A16", "W4A16"])
def test_lm_head_takes_its_own_scheme(head):
    base = tiny_hf_model("llama", layers=1)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref = base(ids, use_cache=False).logits.float()
        body_only = qfuse.quantize_model(copy.deepcopy(base), "W4A8", progress=False)(ids, use_cache=False).logits.float()
        model = qfuse.quantize_model(base, "W4A8", lm_head=head, progress=False)
        out = model(ids, use_cache=False).logits.float()
    assert isinstance(model.lm_head, qfuse.QuantLinear) and model.lm_head.scheme.name == head
    assert model.model.layers[0].mlp.down_proj.scheme.name == "W4A8"
    assert rel_err(out, ref) < MAX_REL_ERR["W4A8"] and not torch.equal(out, body_only)
    # the head's own error: W8 leaves the logits within W8's error of the body-only model
    if head == "W8A16":
        assert rel_err(out, body_only) < MAX_REL_ERR["W8A16"]


def test_lm_head_tied_to_the_embedding_is_untied():
    base = tiny_hf_model("llama", layers=1)
    base.config.tie_word_embeddings = True
    base.lm_head.weight = base.model.embed_tokens.weight
    embed = base.model.embed_tokens.weight.detach().clone()
    model = qfuse.quantize_model(base, "W4A16", lm_head="W8A16", progress=False)
    assert isinstance(model.lm_head, qfuse.QuantLinear)
    assert torch.equal(model.model.embed_tokens.weight, embed)
    torch.testing.assert_close(model.lm_head.dequantized_weight().float(), embed.float(), rtol=0.02, atol=0.02)


def test_lm_head_with_a_ragged_group_falls_back_and_warns():
    base = tiny_hf_model("llama", layers=1, hidden=192, intermediate=384)  # 192 = 128 + 64
    with pytest.warns(UserWarning, match="W4A16_G64"):
        model = qfuse.quantize_model(base, "W8A16", lm_head="W4A16", progress=False)
    assert model.lm_head.scheme.name == "W4A16_G64"


def test_lm_head_errors():
    with pytest.raises(ValueError, match="ignore=.*keeps it in floating point"):
        qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W4A16", lm_head="W8A16", ignore=["lm_head"], progress=False)
    with pytest.raises(ValueError, match="no nn.Linear named lm_head"):
        qfuse.quantize_model(nn.Sequential(nn.Linear(64, 64).bfloat16()), "W4A16", lm_head="W8A16", progress=False)
    with pytest.raises(ValueError, match="static activation scale"):
        qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W4A16", lm_head="W8A8_STATIC", progress=False)
    with pytest.raises(ValueError, match="unknown|scheme"):
        qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W4A16", lm_head="W3A16", progress=False)


def test_a_quantized_model_runs_in_grad_mode():
    """qfuse's ops have no backward: quantize_model leaves no parameter requiring grad (the embedding
    and the kept head did, so ``model(ids)`` outside no_grad raised at the first qfuse op)."""
    from tests.hf_models import tiny_hf_model

    model = tiny_hf_model("llama", layers=1, vocab=64)
    model.requires_grad_(True)
    qfuse.quantize_model(model, "W8A8", progress=False)
    assert not any(p.requires_grad for p in model.parameters())
    out = model(torch.randint(0, 64, (1, 5))).logits
    assert out.shape == (1, 5, 64) and not out.requires_grad
    lin = qfuse.quantize_model(torch.nn.Linear(64, 32, dtype=torch.bfloat16), "W8A16", progress=False)
    assert not lin(torch.randn(2, 64, dtype=torch.bfloat16)).requires_grad
