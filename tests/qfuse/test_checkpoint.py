"""save_quantized -> from_pretrained / load_quantized round trips on tiny Hugging Face models."""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import qfuse
from tests.hf_models import ARCHS, tiny_hf_model


def float32_rotary(model):
    """tiny_hf_model's .to(bf16) also rounds the rotary inv_freq buffers, which a model loaded
    from a checkpoint computes in float32 (as transformers' from_pretrained does): rebuild them."""
    for mod in model.modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "original_inv_freq"):
            fresh = type(mod)(config=model.config)
            mod.inv_freq, mod.original_inv_freq = fresh.inv_freq, fresh.original_inv_freq
    return model


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(3))


def logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("scheme", list(qfuse.SCHEMES))
def test_save_then_from_pretrained_gives_identical_logits(arch, scheme, ids, tmp_path):
    model = qfuse.quantize_model(float32_rotary(tiny_hf_model(arch, layers=1)), scheme, progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    loaded = qfuse.from_pretrained(tmp_path, progress=False)
    assert type(loaded) is type(model)
    for (name, a), (name_b, b) in zip(model.named_modules(), loaded.named_modules(), strict=True):
        assert name == name_b and type(a) is type(b), name
        if isinstance(a, qfuse.QuantLinear):
            assert a.scheme == b.scheme
            assert all(torch.equal(t, b.get_buffer(n)) for n, t in a.named_buffers())
    assert torch.equal(logits(loaded, ids), logits(model, ids))


def test_dtype_defaults_to_the_saved_one_and_can_be_chosen(tmp_path):
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=1, dtype=torch.float16), "W4A16", progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    assert qfuse.from_pretrained(tmp_path, progress=False).model.embed_tokens.weight.dtype == torch.float16
    bf = qfuse.from_pretrained(tmp_path, dtype="bfloat16", progress=False)
    assert bf.model.layers[0].mlp.up_proj.scales.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="float16 or torch.bfloat16"):
        qfuse.from_pretrained(tmp_path, dtype=torch.float32, progress=False)


def test_tied_embeddings_are_stored_once_and_retied(tmp_path, ids):
    base = tiny_hf_model("llama", layers=1)
    base.config.tie_word_embeddings = True
    base.tie_weights()
    model = qfuse.quantize_model(float32_rotary(base), "W8A16", progress=False)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    qfuse.save_quantized(model, tmp_path, progress=False)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()
    loaded = qfuse.from_pretrained(tmp_path, progress=False)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.equal(logits(loaded, ids), logits(model, ids))


def test_load_into_a_given_model_float_or_meta(tmp_path, ids):
    model = qfuse.quantize_model(float32_rotary(tiny_hf_model("qwen2", layers=2)), "W4A8", progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    real = float32_rotary(tiny_hf_model("qwen2", layers=2))
    assert qfuse.load_quantized(tmp_path, real, progress=False) is real
    assert torch.equal(logits(real, ids), logits(model, ids))
    assert isinstance(real.model.norm, qfuse.RMSNorm)


def test_save_needs_a_quantized_model(tmp_path):
    with pytest.raises(ValueError, match="no qfuse.QuantLinear"):
        qfuse.save_quantized(tiny_hf_model("llama", layers=1), tmp_path)


def test_mixed_schemes_get_one_config_group_each(tmp_path, ids):
    model = float32_rotary(tiny_hf_model("llama", layers=2))
    qfuse.quantize_model(model.model.layers[0], "W4A16_ASYM", progress=False)
    qfuse.quantize_model(model.model.layers[1], "W8A8", progress=False)
    with pytest.warns(UserWarning, match="2 config groups .* transformers' compressed-tensors loader"):
        qfuse.save_quantized(model, tmp_path, progress=False)
    import json

    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision" and len(qc["config_groups"]) == 2
    targets = sorted(t for g in qc["config_groups"].values() for t in g["targets"])
    assert len(targets) == 14 and all(t.startswith("model.layers.") for t in targets)
    loaded = qfuse.from_pretrained(tmp_path, progress=False)
    assert loaded.model.layers[0].self_attn.q_proj.scheme.name == "W4A16_ASYM"
    assert loaded.model.layers[1].mlp.down_proj.scheme.name == "W8A8"
    assert torch.equal(logits(loaded, ids), logits(model, ids))


def test_act_order_layer_runs_the_gathered_activations():
    """QuantLinear.act_perm: stored input channel i is the model's channel act_perm[i]; each
    call gathers x[:, act_perm]. Per-channel scales, so any permutation is a valid layout."""
    from qfuse.ops.int4_packing import pack_int4, unpack_int4

    lin = nn.Linear(256, 48, bias=True).to(torch.bfloat16)
    ref = qfuse.QuantLinear.from_linear(lin, qfuse.schemes.make_scheme(4, 16, -1))
    perm = torch.randperm(256)
    stored = {"qweight": pack_int4(unpack_int4(ref.qweight)[:, perm].contiguous()), "scales": ref.scales, "zeros": None}
    permuted = qfuse.QuantLinear(256, 48, ref.scheme, stored, ref.bias, act_perm=perm)
    assert torch.equal(permuted.dequantized_weight(), ref.dequantized_weight())
    for m in (1, 2, 7, 16):
        x = torch.randn(m, 256, dtype=torch.bfloat16)
        # the same products summed in another order: equal up to float32 rounding, then bf16
        torch.testing.assert_close(permuted(x), ref(x), rtol=1e-2, atol=1e-2)


PEAK_SCRIPT = textwrap.dedent("""
    import sys, torch, transformers, qfuse
    qfuse.from_pretrained(sys.argv[2], progress=False)  # a tiny checkpoint first: every lazy import before the baseline

    def status(key):  # kB
        return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(key)))

    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
    base = status("VmRSS:")
    model = qfuse.from_pretrained(sys.argv[1], progress=False)
    peak = status("VmHWM:")
    held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    print((peak - base) * 1024, held)
""")


def test_from_pretrained_peak_memory_is_about_the_quantized_size(tmp_path):
    """A 4-layer, 2048-wide Llama (411 MB of bf16 linear weights): loading its W4A16
    checkpoint raises the peak RSS by about the quantized size, never by the float size."""
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak")
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=128,
    )
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(cfg)
    float_bytes = sum(m.weight.numel() * 2 for n, m in skeleton.named_modules() if isinstance(m, nn.Linear) and n != "lm_head")
    # quantize layer by layer from small random float tensors, never holding the whole float model
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": 1})).to(torch.bfloat16)
    qfuse.quantize_model(model, "W4A16", progress=False)
    layer = model.model.layers[0]
    model.model.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(4)])
    model.config.num_hidden_layers = 4
    qfuse.save_quantized(model, tmp_path / "big", progress=False)
    tiny = tmp_path / "tiny"
    qfuse.save_quantized(qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W4A16", progress=False), tiny, progress=False)
    # A fixed mmap threshold: glibc's adaptive one keeps freed temporaries of up to 32 MB in the
    # heap, so RSS would count memory that is free (measured: 185-500 MB for the same load).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17), "MALLOC_ARENA_MAX": "2"}
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path / "big"), str(tiny)], capture_output=True, text=True, check=True, env=env)
    peak, held = (int(v) for v in out.stdout.split())
    print(f"float {float_bytes / 1e6:.0f} MB, held {held / 1e6:.0f} MB, peak rise {peak / 1e6:.0f} MB")
    # measured: held 108 MB, peak rise 159-161 MB (the held tensors, plus one layer's unpacking
    # temporaries and the mapped file pages of the tensor being read); materializing the float
    # weights would add their 411 MB
    assert held < 0.3 * float_bytes
    assert peak < 0.5 * float_bytes


def test_quantized_lm_head_round_trips(ids, tmp_path):
    model = qfuse.quantize_model(float32_rotary(tiny_hf_model("llama", layers=1)), "W4A16", lm_head="W8A16", progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    loaded = qfuse.from_pretrained(tmp_path, progress=False)
    assert isinstance(loaded.lm_head, qfuse.QuantLinear) and loaded.lm_head.scheme == model.lm_head.scheme
    assert all(torch.equal(t, loaded.lm_head.get_buffer(n)) for n, t in model.lm_head.named_buffers())
    assert torch.equal(logits(loaded, ids), logits(model, ids))


def _tied_model():
    base = tiny_hf_model("llama", layers=1)
    base.config.tie_word_embeddings = True
    base.tie_weights()
    return float32_rotary(base)


def test_quantized_tied_head_unties_the_config_and_reloads_into_a_tied_model(ids, tmp_path):
    """A quantized head no longer shares the embedding: the config (in memory and on disk) says so,
    and loading into a model built tied leaves no float weight on the quantized head."""
    model = qfuse.quantize_model(_tied_model(), "W4A16", lm_head="W8A16", progress=False)
    assert model.config.tie_word_embeddings is False
    qfuse.save_quantized(model, tmp_path, progress=False)
    import json

    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
    tied = _tied_model()
    qfuse.load_quantized(tmp_path, tied, progress=False)
    assert isinstance(tied.lm_head, qfuse.QuantLinear) and "weight" not in dict(tied.lm_head.named_buffers())
    assert tied.config.tie_word_embeddings is False
    assert torch.equal(logits(tied, ids), logits(model, ids))


def test_separate_head_into_a_tied_model_is_refused(tmp_path):
    """Both stored tensors would be assigned to the one tied tensor, the last silently winning."""
    model = qfuse.quantize_model(float32_rotary(tiny_hf_model("llama", layers=1)), "W8A16", progress=False)
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    qfuse.save_quantized(model, tmp_path, progress=False)
    tied = _tied_model()
    with pytest.raises(qfuse.CheckpointError, match="stores lm_head.weight and model.embed_tokens.weight with different values"):
        qfuse.load_quantized(tmp_path, tied, progress=False)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and not any(isinstance(m, qfuse.QuantLinear) for m in tied.modules())


def test_compiled_model_saves_and_loads_under_the_module_names(ids, tmp_path):
    """qfuse.compile / torch.compile wrap the model: its state_dict names gain an _orig_mod. prefix
    that no reader knows."""
    model = qfuse.quantize_model(float32_rotary(tiny_hf_model("llama", layers=1)), "W8A16", progress=False)
    qfuse.save_quantized(qfuse.compile(model), tmp_path, progress=False)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and not any(k.startswith("_orig_mod") for k in f.keys())
    target = float32_rotary(tiny_hf_model("llama", layers=1))
    compiled = torch.compile(target)
    assert qfuse.load_quantized(tmp_path, compiled, progress=False) is compiled
    assert isinstance(target.model.layers[0].mlp.up_proj, qfuse.QuantLinear)
    assert torch.equal(logits(target, ids), logits(model, ids))


def test_a_dtype_name_it_does_not_know_is_named(tmp_path):
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=1), "W8A16", progress=False)
    qfuse.save_quantized(model, tmp_path, progress=False)
    with pytest.raises(ValueError, match="float16 or bfloat16, got 'fp16'"):
        qfuse.from_pretrained(tmp_path, dtype="fp16", progress=False)


def test_a_missing_directory_is_named_as_such(tmp_path):
    """It was reported as a directory without config.json / without a quantization config."""
    for call in (lambda p: qfuse.from_pretrained(p, progress=False), lambda p: qfuse.load_quantized(p, nn.Linear(2, 2), progress=False)):
        with pytest.raises(qfuse.CheckpointError, match="none: no such directory"):
            call(tmp_path / "none")
        (tmp_path / "file").write_text("")
        with pytest.raises(qfuse.CheckpointError, match="file: not a directory"):
            call(tmp_path / "file")


def test_a_model_built_with_other_heads_is_refused(tmp_path):
    """Same tensor shapes, other heads: the weights loaded and gave other logits without an error."""
    import transformers

    def llama(heads, kv_heads):
        cfg = transformers.LlamaConfig(
            vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads
        )
        return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)

    qfuse.save_quantized(qfuse.quantize_model(llama(4, 2), "W8A16", progress=False), tmp_path, progress=False)
    other = llama(8, 4)  # head_dim 32 instead of 64: q / k / v / o keep their shapes
    with pytest.raises(qfuse.CheckpointError, match="num_attention_heads: config.json 4, the model 8"):
        qfuse.load_quantized(tmp_path, other, progress=False)
    assert not any(isinstance(m, qfuse.QuantLinear) for m in other.modules())
    qfuse.load_quantized(tmp_path, llama(4, 2), progress=False)


def test_a_rounded_rotary_inv_freq_is_named_when_saving(tmp_path):
    """Module.to(bf16) rounds inv_freq; a reloaded model computes it in float32 (logits differ)."""
    model = tiny_hf_model("llama", layers=1)
    model.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq.bfloat16()
    qfuse.quantize_model(model, "W8A16", progress=False)
    with pytest.warns(UserWarning, match=r"rotary inv_freq \(model.rotary_emb.inv_freq\) is bfloat16"):
        qfuse.save_quantized(model, tmp_path, progress=False)
