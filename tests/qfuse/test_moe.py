"""QuantMoE against the Hugging Face sparse-MoE blocks (tiny random configs, CPU reference ops),
quantize_model on MoE models, and torch.compile(fullgraph=True) through fused_moe's fake kernel."""

import warnings

import pytest
import torch

import qfuse
from qfuse.linear import QuantLinear
from qfuse.moe import QuantExperts, QuantMoE
from tests.helpers import linear_of, rel_err

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")


def tiny_moe_model(arch: str, hidden: int = 128, intermediate: int = 128, experts: int = 4, top_k: int = 2, layers: int = 1, norm_topk_prob=False):
    """A ``<Arch>ForCausalLM`` with random weights scaled so the expert outputs are O(1) and the
    router separates the experts (HF's init gives outputs ~1e-3 and near-uniform routing)."""
    import transformers as tf

    common = dict(
        vocab_size=64, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64
    )
    if arch == "mixtral":
        cfg = tf.MixtralConfig(**common, intermediate_size=intermediate, num_local_experts=experts, num_experts_per_tok=top_k)
        cls = tf.MixtralForCausalLM
    else:
        moe = dict(moe_intermediate_size=intermediate, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm_topk_prob)
        if arch == "qwen2_moe":
            cfg, cls = (
                tf.Qwen2MoeConfig(**common, **moe, intermediate_size=2 * intermediate, shared_expert_intermediate_size=intermediate),
                tf.Qwen2MoeForCausalLM,
            )
        else:
            cfg, cls = tf.Qwen3MoeConfig(**common, **moe, intermediate_size=2 * intermediate), tf.Qwen3MoeForCausalLM
    torch.manual_seed(0)
    model = cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "experts." in name:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn_like(p))
    return model.to(torch.bfloat16).eval()


def _block(model):
    return model.model.layers[0].mlp


@pytest.mark.parametrize("arch", ARCHS)
def test_float_experts_equal_the_hf_block(arch):
    block = _block(tiny_moe_model(arch, hidden=64, intermediate=32, experts=8, top_k=2, norm_topk_prob=arch == "qwen3_moe"))
    x = torch.randn(2, 5, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = block(x)
        out = QuantMoE.from_block(block, None)(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    # HF rounds gate, up, SiLU, the product and each top-k partial sum to bf16; fused_moe rounds h and the sum once
    assert (out.float() - ref.float()).abs().max() <= 8 * torch.finfo(torch.bfloat16).eps * ref.float().abs().max()


# relative error against the float block: 1.5x what these configs measured (Gaussian experts: int4 round to
# nearest moves each weight by ~12 % RMS, and an expert applies two of them)
BOUNDS = {"W8A16": 0.02, "W4A16": 0.33, "W4A16_ASYM": 0.28, "W8A8": 0.035, "W4A8": 0.33, "W4A8_G128": 0.33}


@pytest.mark.parametrize("scheme", BOUNDS)
def test_quantized_experts_close_to_the_hf_block(scheme):
    arch = ("mixtral", "qwen2_moe")[len(scheme) % 2]
    hidden = 256 if scheme == "W4A8_G128" else 128  # two groups per w13 row (one group is per channel)
    block = _block(tiny_moe_model(arch, hidden=hidden))
    x = torch.randn(7, hidden).to(torch.bfloat16)
    with torch.no_grad():
        ref = block(x[None])[0]
        qmoe = QuantMoE.from_block(block, scheme)
        out = qmoe(x)
    err = rel_err(out, ref)
    assert err <= BOUNDS[scheme], f"{scheme} on {arch}: relative error {err:.3f}"
    experts = qmoe.experts
    if experts.scheme.weight_only:  # the kernel multiplies by exactly the dequantized weights
        w13, w2 = experts.dequantized_weights()
        float_experts = QuantExperts(4, hidden, 128, 2, experts.renormalize, None, {"w13": w13, "w2": w2})
        with torch.no_grad():
            logits = torch.nn.functional.linear(x, qmoe.gate.weight)
            assert torch.equal(experts(x, logits), float_experts(x, logits))


def test_state_dict_round_trips():
    block = _block(tiny_moe_model("mixtral"))
    qmoe = QuantMoE.from_block(block, "W4A8_G128")
    fresh = QuantMoE.from_block(_block(tiny_moe_model("mixtral")), "W4A8_G128")
    for b in fresh.experts.buffers():
        b.zero_()
    fresh.load_state_dict(qmoe.state_dict())
    x = torch.randn(3, 128).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(fresh(x), qmoe(x))
    assert set(qmoe.state_dict()) >= {"gate.weight", "experts.w13", "experts.w13_scale", "experts.w13_group_scale", "experts.w2"}
    assert qmoe.experts.weight_bytes() < block.experts.gate_up_proj.numel() * 2 * 0.5 * 1.5


@pytest.mark.parametrize("scheme", ["W4A16", "W8A16", "W4A8_G128"])
def test_weight_only_codes_tile_major(scheme):
    """W4A16 experts hold their codes tile-major by default (W8A16 ones when asked) and give them back
    natural (expert_layers, dequantized_weights, state_dict); the op reads them so and gives the natural
    layout's bits; int8-activation experts keep the natural packing."""
    from qfuse.ops.moe.tile_major import to_tile_major

    w13, w2 = (torch.randn(4, 512, 256) / 16).bfloat16(), (torch.randn(4, 256, 256) / 16).bfloat16()  # H = I = 256: 2+ tiles per row
    natural = QuantExperts.from_weights(w13, w2, 2, True, scheme, tile_major=False)
    assert QuantExperts.from_weights(w13, w2, 2, True, scheme).tile_major == (scheme == "W4A16")
    experts = QuantExperts.from_weights(w13, w2, 2, True, scheme, tile_major=None if scheme == "W4A8_G128" else True)
    assert not natural.tile_major and experts.tile_major == (scheme != "W4A8_G128")
    assert torch.equal(experts.natural_codes("w13"), natural.w13) and torch.equal(experts.natural_codes("w2"), natural.w2)
    if experts.tile_major:
        assert torch.equal(experts.w13, to_tile_major(natural.w13)) and not torch.equal(experts.w13, natural.w13)
        assert "tile_major=True" in repr(experts)
    for e in range(4):
        for a, b in zip(experts.expert_layers(e), natural.expert_layers(e)):
            assert torch.equal(a.qweight, b.qweight)
    rebuilt = QuantExperts.from_expert_layers([natural.expert_layers(e) for e in range(4)], 2, True, scheme, tile_major=experts.tile_major)
    assert torch.equal(rebuilt.w13, experts.w13) and torch.equal(rebuilt.w2, experts.w2)
    x, logits = torch.randn(5, 256).bfloat16(), torch.randn(5, 4)
    assert torch.equal(experts(x, logits), natural(x, logits))
    if scheme == "W4A16":  # the layout flag is a constant of the compiled graph
        assert torch.equal(torch.compile(experts, fullgraph=True)(x, logits), natural(x, logits))
    for a, b in zip(experts.dequantized_weights(), natural.dequantized_weights()):
        assert torch.equal(a, b)
    saved = experts.state_dict()
    assert saved.keys() == natural.state_dict().keys() and all(torch.equal(saved[k], v) for k, v in natural.state_dict().items() if v is not None)
    fresh = QuantExperts.from_weights(torch.zeros_like(w13), torch.zeros_like(w2), 2, True, scheme, tile_major=experts.tile_major)
    fresh.load_state_dict(natural.state_dict())  # a natural state_dict into a tile-major module
    assert torch.equal(fresh.w13, experts.w13) and torch.equal(fresh.w2, experts.w2)
    plain = QuantExperts.from_weights(torch.zeros_like(w13), torch.zeros_like(w2), 2, True, scheme, tile_major=False)
    plain.load_state_dict(saved)  # and a tile-major module's into a natural one
    assert torch.equal(plain.w13, natural.w13)


def test_tile_major_refused_where_the_tiles_are_not_whole():
    w13, w2 = torch.randn(2, 192, 96).bfloat16(), torch.randn(2, 96, 96).bfloat16()  # 48 bytes per row at 4 bits
    assert not QuantExperts.from_weights(w13, w2, 1, True, "W4A16_G32").tile_major
    with pytest.raises(ValueError, match="tile-major codes need weight-only experts with 2I, H and each row's bytes multiples of 64"):
        QuantExperts.from_weights(w13, w2, 1, True, "W4A16_G32", tile_major=True)
    with pytest.raises(ValueError, match="got W8A8 experts"):
        QuantExperts.from_weights(torch.randn(2, 512, 256).bfloat16(), torch.randn(2, 256, 256).bfloat16(), 1, True, "W8A8", tile_major=True)


@pytest.mark.parametrize("scheme", ["W8A8", "W4A8_G128"])
def test_module_to_dtype_keeps_the_experts_float32_scales(scheme):
    qmoe = QuantMoE.from_block(_block(tiny_moe_model("mixtral")), scheme)
    scales = {n: b.clone() for n, b in qmoe.experts.named_buffers() if b.dtype == torch.float32}
    assert {"w13_scale", "w2_scale"} <= set(scales)
    x = torch.randn(3, 128).to(torch.bfloat16)
    with torch.no_grad():
        ref = qmoe(x)
        qmoe.to(torch.bfloat16)  # a no-op for a bf16 block, which rounded the scales
        assert all(torch.equal(qmoe.experts.get_buffer(n), b) for n, b in scales.items())
        assert torch.equal(qmoe(x), ref)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_quantize_model_converts_moe_blocks(arch):
    model = tiny_moe_model(arch, layers=2)
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        ref = model(ids).logits
        qfuse.quantize_model(model, "W8A16", progress=False)
        out = model(ids).logits
    for layer in model.model.layers:
        assert isinstance(layer.mlp, QuantMoE) and layer.mlp.experts.scheme.name == "W8A16"
        if arch == "qwen2_moe":  # the shared expert's Linears are converted inside the new block
            assert isinstance(layer.mlp.shared_expert.down_proj, QuantLinear) and not isinstance(layer.mlp.shared_expert_gate, QuantLinear)
    assert rel_err(out, ref) < 0.1  # measured 0.04-0.05; 0.03-0.07 with the MoE blocks ignored (attention alone)


def test_an_ignored_qwen2_moe_block_keeps_its_shared_expert_float():
    model = tiny_moe_model("qwen2_moe", layers=2)
    qfuse.quantize_model(model, "W8A16", ignore=["model.layers.0.mlp"], progress=False)
    kept, converted = model.model.layers[0].mlp, model.model.layers[1].mlp
    assert not isinstance(kept, QuantMoE) and type(kept.shared_expert.down_proj) is torch.nn.Linear
    assert isinstance(converted, QuantMoE) and isinstance(converted.shared_expert.down_proj, QuantLinear)
    model = tiny_moe_model("qwen2_moe", layers=1)  # <block>.experts keeps the routed experts only
    qfuse.quantize_model(model, "W8A16", ignore=["model.layers.0.mlp.experts"], progress=False)
    assert isinstance(model.model.layers[0].mlp.shared_expert.down_proj, QuantLinear)


def test_ignore_as_an_iterator_keeps_the_moe_block_it_names():
    model = tiny_moe_model("mixtral", layers=2)
    qfuse.quantize_model(model, "W8A16", ignore=iter(["model.layers.0.mlp", "q_proj"]), progress=False)
    layer = model.model.layers[0]
    assert not isinstance(layer.mlp, QuantMoE) and type(layer.self_attn.q_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[1].mlp, QuantMoE)


def test_a_model_with_quantized_experts_only_is_refused_a_second_time():
    model = tiny_moe_model("mixtral", layers=1)
    qfuse.quantize_model(model, "W8A16", ignore=["*_proj", "lm_head"], progress=False)  # the experts alone
    with pytest.raises(ValueError, match=r"already quantized \(1 W8A16 QuantMoE layer"):
        qfuse.quantize_model(model, "W4A16", progress=False)


def test_quantize_model_ignore_and_group_fallback():
    model = tiny_moe_model("mixtral", hidden=128, intermediate=64, layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a block name is a valid ignore entry: no "matches nothing" warning
        qfuse.quantize_model(model, "W8A16", ignore=["model.layers.0.mlp", "lm_head"], progress=False)
    assert not isinstance(model.model.layers[0].mlp, QuantMoE) and isinstance(model.model.layers[1].mlp, QuantMoE)
    model = tiny_moe_model("mixtral", hidden=128, intermediate=64)
    with pytest.warns(UserWarning, match="experts run W4A16_G64"):  # I = 64: group 128 does not divide it
        qfuse.quantize_model(model, "W4A16", progress=False)
    assert model.model.layers[0].mlp.experts.scheme.group_size == 64


def test_quantize_model_experts_only():
    """Every nn.Linear ignored (Mixtral's routers are not Linears): the experts alone are quantized."""
    model = tiny_moe_model("mixtral", layers=2)
    qfuse.quantize_model(model, "W4A16", ignore=["model.layers.*.self_attn.*"], progress=False)
    assert all(isinstance(layer.mlp, QuantMoE) and type(layer.self_attn.q_proj) is torch.nn.Linear for layer in model.model.layers)
    with pytest.raises(ValueError, match="nothing to quantize"):  # the blocks ignored too: nothing is left
        qfuse.quantize_model(tiny_moe_model("mixtral"), "W4A16", ignore=["model.layers.*.self_attn.*", "model.layers.*.mlp"], progress=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_output_router_logits_are_recorded(arch):
    """``output_router_logits=True`` (fine-tuned MoE configs set it): transformers records the router
    module's output by a forward hook, and its load-balancing loss reads one tensor per layer."""
    model = tiny_moe_model(arch, layers=2)
    model.config.output_router_logits = True
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        ref = model(ids)
        qfuse.quantize_model(model, "W8A16", ignore=["model.layers.*.self_attn.*"], progress=False)
        out = model(ids)
        plain = model(ids, output_router_logits=False)
    assert len(out.router_logits) == len(ref.router_logits) == 2
    torch.testing.assert_close(out.router_logits[0], ref.router_logits[0], rtol=0, atol=0)  # layer 0: the same router input
    assert torch.isfinite(out.aux_loss) and abs(out.aux_loss - ref.aux_loss) < 0.1 * ref.aux_loss
    assert plain.router_logits is None
    torch.testing.assert_close(plain.logits, out.logits, rtol=0, atol=0)


def test_output_router_logits_under_compile():
    """The same through qfuse.compile(fullgraph=True): transformers' recorder is a plain global while
    Dynamo traces (it cannot trace a ContextVar), and the graph records one tensor per layer."""
    model = tiny_moe_model("mixtral", layers=2)
    model.config.output_router_logits = True
    ids = torch.randint(0, 64, (2, 6))
    qfuse.quantize_model(model, "W8A16", progress=False)
    torch._dynamo.reset()
    compiled = qfuse.compile(model, fullgraph=True)
    with torch.no_grad():
        eager, out = model(ids), compiled(ids)
    assert len(out.router_logits) == 2 and torch.isfinite(out.aux_loss)
    assert abs(out.aux_loss - eager.aux_loss) < 1e-2 * eager.aux_loss


def test_refusals():
    block = _block(tiny_moe_model("mixtral", hidden=64, intermediate=32))
    with pytest.raises(TypeError, match="qfuse runs fp16/bf16 models"):
        QuantMoE.from_block(block.float(), "W8A16")
    with pytest.raises(ValueError, match="static activation scales"):
        QuantMoE.from_block(block.bfloat16(), "W8A8_STATIC")
    with pytest.raises(ValueError, match="group_size=128 of W4A16 must divide hidden size 64"):
        QuantMoE.from_block(block, "W4A16")
    with pytest.raises(TypeError, match="not a supported sparse-MoE block"):
        QuantMoE.from_block(torch.nn.Linear(4, 4), None)
    model = tiny_moe_model("mixtral", hidden=64, intermediate=32)
    with pytest.raises(ValueError, match="do not cover sparse-MoE experts"):
        qfuse.quantize_model(model, "W8A16", fake_quant=True, progress=False)
    assert not isinstance(_block(model), QuantMoE)  # left unchanged


def test_blocks_that_cannot_take_the_scheme_are_named_together_before_any_work():
    model = tiny_moe_model("mixtral", hidden=96, intermediate=80, layers=2)  # no group of fused_moe divides 80 and 96
    with pytest.raises(ValueError, match=r"2 sparse-MoE block\(s\) cannot take W4A16 \(model\.layers\.0\.mlp, model\.layers\.1\.mlp\).*ignore="):
        qfuse.quantize_model(model, "W4A16", progress=False)
    assert not any(isinstance(m, (QuantMoE, QuantLinear)) for m in model.modules())  # left unchanged


def test_meta_block_gives_meta_buffers():
    with torch.device("meta"):
        block = _block(tiny_moe_model("qwen3_moe"))
    experts = QuantMoE.from_block(block, "W4A16").experts
    assert experts.w13.is_meta and experts.w13.shape == (4, 256, 64) and experts.w2_scale.shape == (4, 128, 1)


def test_compile_fullgraph_matches_eager():
    """torch.compile on the CPU: the graph holds fused_moe (its fake kernel traced) and matches eager."""
    qmoe = QuantMoE.from_block(_block(tiny_moe_model("qwen2_moe")), "W4A8_G128")
    qfuse.quantize_model(qmoe.shared_expert, "W4A8_G128", progress=False)
    torch._dynamo.reset()
    compiled = torch.compile(qmoe, fullgraph=True)
    x = torch.randn(1, 5, 128).to(torch.bfloat16)
    with torch.no_grad():
        eager, out = qmoe(x), compiled(x)
    assert out.shape == eager.shape
    # Inductor fuses the shared expert's sigmoid gate and the add without bf16 roundings between them
    assert (out.float() - eager.float()).abs().max() <= 4 * torch.finfo(torch.bfloat16).eps * eager.float().abs().max()


def _act_order_layer(weight: torch.Tensor, perm: torch.Tensor, scheme: str) -> QuantLinear:
    """A layer quantized in input order ``perm`` (groups of consecutive permuted columns), as act-order checkpoints store it."""
    stored = QuantLinear.from_linear(linear_of(weight[:, perm]), scheme)
    stored.act_perm = perm
    return stored


def test_act_order_expert_layers_stack_and_round_trip():
    """Experts 1 and 3 in act order (gate / up sharing one input order, down its own), 0 and 2 natural: the
    stacked experts compute what the float experts of their dequantized weights do, and hand the layers back."""
    torch.manual_seed(0)
    e, h, i = 4, 256, 256
    gate_up = (torch.randn(e, 2 * i, h) / h**0.5).to(torch.bfloat16)
    down = (torch.randn(e, h, i) / i**0.5).to(torch.bfloat16)
    layers = []
    for k in range(e):
        if k % 2:
            p13, p2 = torch.randperm(h), torch.randperm(i)
            layers.append(
                (
                    _act_order_layer(gate_up[k, :i], p13, "W4A16"),
                    _act_order_layer(gate_up[k, i:], p13, "W4A16"),
                    _act_order_layer(down[k], p2, "W4A16"),
                )
            )
        else:
            layers.append(tuple(QuantLinear.from_linear(linear_of(w), "W4A16") for w in (gate_up[k, :i], gate_up[k, i:], down[k])))
    experts = QuantExperts.from_expert_layers(layers, 2, True, "W4A16")
    assert torch.equal(experts.w13_act_perm[0], torch.arange(h)) and torch.equal(experts.w13_act_perm[1], layers[1][0].act_perm)
    assert torch.equal(experts.w2_act_perm[3], layers[3][2].act_perm)
    for k in range(e):
        for got, want in zip(experts.expert_layers(k), layers[k]):
            assert torch.equal(got.dequantized_weight(), want.dequantized_weight())
            assert (got.act_perm is None) == (want.act_perm is None) and (want.act_perm is None or torch.equal(got.act_perm, want.act_perm))
    w13, w2 = experts.dequantized_weights()
    for k in range(e):
        assert torch.equal(w13[k], torch.cat([layers[k][0].dequantized_weight(), layers[k][1].dequantized_weight()]))
        assert torch.equal(w2[k], layers[k][2].dequantized_weight())
    float_experts = QuantExperts(e, h, i, 2, True, None, {"w13": w13, "w2": w2})
    x = torch.randn(9, h).to(torch.bfloat16)
    logits = torch.randn(9, e).to(torch.bfloat16)
    with torch.no_grad():
        out, ref = experts(x, logits), float_experts(x, logits)
    assert (out.float() - ref.float()).abs().max() <= 4 * torch.finfo(torch.bfloat16).eps * ref.float().abs().max()


def test_act_order_experts_must_be_weight_only():
    block = _block(tiny_moe_model("mixtral"))
    experts = QuantMoE.from_block(block, "W8A8").experts
    layers = [list(experts.expert_layers(k)) for k in range(experts.num_experts)]
    layers[2][2].act_perm = torch.randperm(128)
    with pytest.raises(ValueError, match="experts: act-order experts must be weight-only, not W8A8"):
        QuantExperts.from_expert_layers(layers, 2, True, "W8A8")
