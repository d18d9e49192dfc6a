"""``qfuse.fuse_projections``: q/k/v and gate/up stacked into one layer each, and back.

``QuantLinear.concat`` / ``rows`` first (the stacked layer is the members' buffers side by side),
then whole Hugging Face models: the same logits, fewer GEMMs under ``torch.compile``, members
called alone, checkpoints written under the members' names, and the undo."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import qfuse
from qfuse.fused_projections import ProjectionSlice
from tests.hf_models import ARCHS, tiny_hf_model

SCHEMES = ("W4A16", "W4A16_ASYM", "W8A16", "W8A8", "W4A8", "W4A8_G128")


def _layers(scheme, sizes=(64, 32, 32), k=256, bias=False):
    out = []
    for n in sizes:
        lin = nn.Linear(k, n, bias=bias).to(torch.bfloat16)
        out.append(qfuse.QuantLinear.from_linear(lin, scheme))
    return out


def _exact(scheme: str) -> bool:
    """int8 activations: integer accumulation, so any kernel shape gives the same bits."""
    return qfuse.get_scheme(scheme).act_bits == 8


@pytest.mark.parametrize("scheme", SCHEMES)
def test_concat_computes_the_layers_side_by_side(scheme):
    layers = _layers(scheme, bias=True)
    layers[1].bias = None  # a member without bias: zeros in the stacked bias
    stacked = qfuse.QuantLinear.concat(layers)
    assert stacked.out_features == 128 and stacked.scheme == layers[0].scheme
    x = torch.randn(7, 256).to(torch.bfloat16)
    want = torch.cat([lay(x) for lay in layers], -1)
    got = stacked(x)
    if _exact(scheme):
        assert torch.equal(got, want)
    else:  # float32 accumulation of the same products; the CPU matmul may block N differently
        torch.testing.assert_close(got, want, rtol=8e-3, atol=1e-3)
    start = 0
    for lay in layers:
        part = stacked.rows(start, start + lay.out_features)
        start += lay.out_features
        for name, b in lay.named_buffers():
            assert torch.equal(part.get_buffer(name), b) if b is not None else part.get_buffer(name) is None, name
        assert (part.bias is None and lay.bias is None) or torch.equal(part.bias, lay.bias if lay.bias is not None else torch.zeros_like(part.bias))


def test_concat_repeats_differing_per_tensor_weight_scales():
    layers = _layers("W8A8", sizes=(16, 8))
    for lay, s in zip(layers, (0.01, 0.02)):
        lay.w_scale = torch.tensor([s])  # a per-tensor checkpoint layer
    stacked = qfuse.QuantLinear.concat(layers)
    assert stacked.w_scale.shape == (24,) and torch.equal(stacked.w_scale[:16], torch.full((16,), 0.01))
    x = torch.randn(3, 256).to(torch.bfloat16)
    assert torch.equal(stacked(x), torch.cat([lay(x) for lay in layers], -1))
    same = _layers("W8A8", sizes=(16, 8))
    for lay in same:
        lay.w_scale = torch.tensor([0.01])
    assert qfuse.QuantLinear.concat(same).w_scale.shape == (1,)


def test_concat_refuses_layers_that_differ():
    with pytest.raises(ValueError, match="W8A8 with 256 inputs against W4A16"):
        qfuse.QuantLinear.concat([_layers("W4A16", (32,))[0], _layers("W8A8", (32,))[0]])
    a, b = _layers("W4A16", (32, 32))
    a.act_perm = torch.randperm(256)
    with pytest.raises(ValueError, match="act_perm differ"):
        qfuse.QuantLinear.concat([a, b])
    with pytest.raises(IndexError, match="outside its 32 output features"):
        b.rows(16, 40)


def _gemm_calls(model, ids, op):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):  # the generated code, not a cache hit
        out, code = run_and_get_code(torch.compile(model, fullgraph=True), ids)
    return out, "".join(code).count(f"torch.ops.qfuse.{op}.default(")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("scheme", ["bf16", "W4A16", "W8A8"])
def test_fused_model_gives_the_same_logits(arch, scheme):
    model = tiny_hf_model(arch)  # qwen2: q / k / v with bias
    if scheme != "bf16":
        qfuse.quantize_model(model, scheme, progress=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 256, (2, 6))
    with torch.inference_mode():
        want = model(ids).logits
        assert qfuse.fuse_projections(model) is model
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        assert isinstance(attn.q_proj, ProjectionSlice) and attn.qkv_proj.out_features == 256 + 2 * 128
        assert isinstance(mlp.up_proj, ProjectionSlice) and mlp.gate_up_proj.out_features == 2 * 512
        got = model(ids).logits
        if scheme == "bf16" or _exact(scheme):
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        qfuse.unfuse_projections(model)
        assert not any(isinstance(m, ProjectionSlice) for m in model.modules()) and not hasattr(attn, "qkv_proj")
        after = model.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_compiled_fused_model_runs_two_gemms_where_five_ran():
    model = qfuse.quantize_model(tiny_hf_model("llama"), "W4A16", progress=False)
    ids = torch.randint(0, 256, (2, 4))
    with torch.inference_mode():
        want, unfused = _gemm_calls(model, ids, "wna16_gemm")
        eager = model(ids).logits
        qfuse.fuse_projections(model)
        got, fused = _gemm_calls(model, ids, "wna16_gemm")
    layers = model.config.num_hidden_layers
    assert unfused == 7 * layers and fused == 4 * layers  # lm_head stays bf16
    torch.testing.assert_close(got.logits, eager, rtol=2e-2, atol=2e-2)


def test_member_called_alone_or_with_another_tensor():
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W8A8", progress=False)
    attn = model.model.layers[0].self_attn
    x, y = torch.randn(3, 256).to(torch.bfloat16), torch.randn(3, 256).to(torch.bfloat16)
    want_k, want_v, want_q = attn.k_proj(x), attn.v_proj(y), attn.q_proj(x)
    qfuse.fuse_projections(model)
    # k first (q's block is kept), then v with another tensor (runs the stacked layer again), then q on x
    k = attn.k_proj(x)
    v = attn.v_proj(y)
    q = attn.q_proj(x)
    assert torch.equal(k, want_k) and torch.equal(v, want_v) and torch.equal(q, want_q)


def test_deep_copy_is_independent():
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W4A16", progress=False)
    qfuse.fuse_projections(model)
    twin = copy.deepcopy(model)
    assert twin.model.layers[0].self_attn.q_proj.fused is twin.model.layers[0].self_attn.qkv_proj
    ids = torch.randint(0, 256, (1, 5))
    with torch.inference_mode():
        assert torch.equal(twin(ids).logits, model(ids).logits)


@pytest.mark.parametrize("scheme, ignore", [("W4A16", None), ("W4A8_G128", None), ("W8A8", ["*q_proj", "*k_proj", "*v_proj", "lm_head"])])
def test_save_writes_the_members(scheme, ignore, tmp_path):
    """The same files as the unfused model's, float groups included (q / k / v kept in bf16)."""
    model = qfuse.quantize_model(tiny_hf_model("qwen2", layers=1), scheme, ignore=ignore, progress=False)
    qfuse.save_quantized(model, tmp_path / "plain", progress=False)
    qfuse.fuse_projections(model)
    assert isinstance(model.model.layers[0].self_attn.q_proj, ProjectionSlice)
    qfuse.save_quantized(model, tmp_path / "fused", progress=False)
    plain, fused = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "fused" / "model.safetensors")
    assert fused.keys() == plain.keys() and all(torch.equal(fused[k], plain[k]) for k in plain)
    assert (tmp_path / "fused" / "config.json").read_text() == (tmp_path / "plain" / "config.json").read_text()
    loaded = qfuse.from_pretrained(tmp_path / "fused", progress=False)
    assert isinstance(loaded.model.layers[0].mlp.up_proj, qfuse.QuantLinear)
    assert isinstance(loaded.model.layers[0].self_attn.q_proj, qfuse.QuantLinear if ignore is None else nn.Linear)


@pytest.mark.parametrize("scheme", [None, "W4A16", "W4A8_G128"])
def test_state_dict_speaks_the_members_names(scheme, tmp_path):
    """A fused model's state_dict holds q / k / v / gate / up entries, as the unfused architecture
    does: transformers' save_pretrained then from_pretrained gives the same logits (the stacked
    entries were unexpected keys, and the members left random), and a state_dict of either form
    loads into a fused model."""
    make = lambda: tiny_hf_model("llama") if scheme is None else qfuse.quantize_model(tiny_hf_model("llama"), scheme, progress=False)  # noqa: E731
    model = make()
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        ref = model(ids).logits
    keys = sorted(model.state_dict())
    plain = copy.deepcopy(model.state_dict())
    qfuse.fuse_projections(model)
    state = model.state_dict()
    assert sorted(state) == keys and all(torch.equal(state[k], plain[k]) for k in keys)
    if scheme is None:
        model.save_pretrained(tmp_path)
        reloaded = type(model).from_pretrained(tmp_path, dtype=torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(reloaded(ids).logits, ref)
    for source in (state, plain):
        twin = qfuse.fuse_projections(make())
        with torch.no_grad():
            for t in twin.state_dict(keep_vars=True).values():  # every stored tensor overwritten below
                t.zero_()
        twin.load_state_dict(copy.deepcopy(source))
        assert all(torch.equal(a, b) for a, b in zip(twin.state_dict().values(), model.state_dict().values()))
    assert sorted(qfuse.unfuse_projections(model).state_dict()) == keys


def test_a_meta_fused_skeleton_takes_the_members_by_assignment():
    model = tiny_hf_model("llama", layers=1)
    state = model.state_dict()
    with torch.device("meta"):
        skeleton = qfuse.fuse_projections(tiny_hf_model("llama", layers=1))
    skeleton.load_state_dict(state, assign=True)
    attn = skeleton.model.layers[0].self_attn
    stacked = torch.cat([state[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    assert not attn.qkv_proj.weight.is_meta and torch.equal(attn.qkv_proj.weight, stacked)


def test_members_without_a_bias_stay_without_one():
    """q alone with a bias: the stack has zeros for k and v, which neither unfuse nor the
    state_dict turn into biases of their own."""
    model = tiny_hf_model("llama", layers=1)
    attn = model.model.layers[0].self_attn
    attn.q_proj.bias = nn.Parameter(torch.randn(attn.q_proj.out_features).to(torch.bfloat16))
    keys = sorted(model.state_dict())
    qfuse.fuse_projections(model)
    assert sorted(model.state_dict()) == keys
    qfuse.unfuse_projections(model)
    assert sorted(model.state_dict()) == keys and attn.k_proj.bias is None and attn.q_proj.bias is not None


def test_quantize_and_load_refuse_a_fused_model_and_nothing_to_fuse_warns(tmp_path):
    model = qfuse.fuse_projections(tiny_hf_model("llama", layers=1))
    with pytest.raises(ValueError, match="fuse after quantize_model"):
        qfuse.quantize_model(model, "W4A16", progress=False)
    qfuse.save_quantized(qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W4A16", progress=False), tmp_path, progress=False)
    with pytest.raises(ValueError, match="load into the unfused model and fuse after loading"):
        qfuse.load_quantized(tmp_path, model)
    with pytest.warns(UserWarning, match="no q/k/v or gate/up group"):
        qfuse.fuse_projections(nn.Sequential(nn.Linear(4, 4)))


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["W8A8", "W4A16"])
def test_gpu_fused_model_eager_replays_and_compiled(scheme):
    """On CUDA: the fused model's eager calls (stacked layers and MLP blocks replayed as CUDA graphs
    from the second call of a shape) and its compiled step against the unfused model."""
    model = qfuse.quantize_model(tiny_hf_model("llama").cuda(), scheme, progress=False)
    ids = torch.randint(0, 256, (16, 1), device="cuda")
    with torch.inference_mode():
        want = model(ids).logits
        qfuse.fuse_projections(model)
        calls = [model(ids).logits for _ in range(3)]  # plain, captured, replayed
        assert all(torch.equal(c, calls[0]) for c in calls)
        if _exact(scheme):
            assert torch.equal(calls[0], want)
        else:
            torch.testing.assert_close(calls[0], want, rtol=2e-2, atol=2e-2)
        torch._dynamo.reset()
        compiled = qfuse.compile(model, fullgraph=True)(ids).logits
    torch.testing.assert_close(compiled, want, rtol=2e-2, atol=2e-2)


def test_fusion_passes_fire_on_a_fused_int8_model():
    """W8A8: the norm / SiLU-and-mul quantizations fold as in the unfused model; the quantizations
    that dedup_quant merged there (q, k, v and gate, up each quantizing one input) are one each now."""
    from qfuse.passes import counters, reset_counters

    fired = {}
    for fuse in (False, True):
        model = qfuse.quantize_model(tiny_hf_model("llama"), "W8A8", progress=False)
        if fuse:
            qfuse.fuse_projections(model)
        torch._dynamo.reset()
        reset_counters()
        with torch.inference_mode(), torch._inductor.config.patch(force_disable_caches=True):
            qfuse.compile(model, fullgraph=True)(torch.randint(0, 256, (2, 4)))
        fired[fuse] = dict(counters)
    layers = 2
    assert fired[False].pop("dedup_quant") == 3 * layers and "dedup_quant" not in fired[True]
    assert fired[True] == fired[False] and fired[True]["add_rms_norm_quant"] == 2 * layers - 1
