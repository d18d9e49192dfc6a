"""qfuse.compile / qfuse.compile_config: the passes in the options, and ``generate`` compiled.

The SmolLM2 test is the end-to-end check: the real model quantized W4A8_G128 generates the same
greedy tokens eagerly and with its decode steps compiled (fusion passes firing), on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import CompileConfig, GenerationConfig

import qfuse
from qfuse.passes import counters, reset_counters
from qfuse.passes.manager import PassConfig, QfusePostGradPass


class _Recorder(torch.nn.Module):
    """A module with a ``generate`` that records its keyword arguments."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.calls = []

    def forward(self, x):
        return self.lin(x)

    def generate(self, ids, generation_config=None, **kwargs):  # as transformers' generate(inputs, generation_config, ...)
        self.calls.append(kwargs if generation_config is None else {**kwargs, "generation_config": generation_config})
        return ids


def test_compile_config_carries_the_passes():
    cfg = qfuse.compile_config()
    assert isinstance(cfg.options["post_grad_custom_post_pass"], QfusePostGradPass)
    assert (cfg.fullgraph, cfg.dynamic, cfg.mode, cfg.backend) == (True, False, None, "inductor")
    assert cfg._compile_all_devices  # transformers would compile on CUDA only
    folded = qfuse.compile_config(mode="max-autotune-no-cudagraphs")
    assert folded.mode is None and folded.options["max_autotune"] is True  # torch.compile refuses mode with options
    plain = qfuse.compile_config(passes=False)
    assert plain.options is None
    with pytest.raises(ValueError, match="backend='inductor'"):
        qfuse.compile_config(backend="eager")
    assert qfuse.compile_config(passes=False, backend="eager").backend == "eager"  # the A/B call of another backend
    with pytest.raises(TypeError, match="CompileConfig takes no disable"):
        qfuse.compile_config(disable=True)


def test_compiled_models_generate_uses_a_static_cache_and_the_compile_config():
    model = _Recorder()
    compiled = qfuse.compile(model)
    ids = torch.zeros(1, 3, dtype=torch.long)
    assert compiled.generate(ids, max_new_tokens=2) is ids
    kwargs = model.calls[-1]
    assert kwargs["cache_implementation"] == "static" and kwargs["max_new_tokens"] == 2
    assert isinstance(kwargs["compile_config"].options["post_grad_custom_post_pass"], QfusePostGradPass)
    own = object()
    compiled.generate(ids, cache_implementation="dynamic", compile_config=own)  # the caller's choices stand
    assert model.calls[-1]["cache_implementation"] == "dynamic" and model.calls[-1]["compile_config"] is own
    compiled.generate(ids, past_key_values="a cache")  # a cache passed in: no cache_implementation added
    assert "cache_implementation" not in model.calls[-1]
    assert not hasattr(qfuse.compile(torch.nn.Linear(4, 4)), "generate")
    generation_config = GenerationConfig(compile_config=CompileConfig(backend="eager"))  # named in the generation config: stands too
    compiled.generate(ids, generation_config=generation_config)
    assert "compile_config" not in model.calls[-1]
    # the model passed in keeps its own generate, and an A/B compile does not change the first one's
    assert "generate" not in vars(model) and model.generate.__func__ is _Recorder.generate
    qfuse.compile(model, passes=False).generate(ids)
    assert model.calls[-1]["compile_config"].options is None
    compiled.generate(ids)
    assert isinstance(model.calls[-1]["compile_config"].options["post_grad_custom_post_pass"], QfusePostGradPass)
    disabled = qfuse.compile(model, disable=True)  # as torch.compile(disable=True): nothing compiled, generate included
    assert disabled.generate.__func__ is _Recorder.generate


NEAR_TIE = 1.0  # eight bf16 steps at |logit| 16-32


def test_smollm2_generates_the_same_tokens_eager_and_compiled(smollm2):
    """Greedy tokens, eager against compiled, up to the first step where eager's two best logits lie
    within NEAR_TIE: Inductor's fused kernels round bf16 differently from eager's ops (by CPU: AMX
    and AVX-512 machines differ), which may swap a near tie (seen on a Sapphire Rapids core: top-2
    margins 3.4, 3.8, 6.5, 2.5, 3.1, 3.6, 0.125, 0.375 at logits ~20, where a bf16 step is 0.125;
    the 8th token then came out 'with' eager and 'which' compiled; in another run of the whole suite
    eager said 'which' and compiled 'France' with no step under a margin of 0.25 before it: from the
    first step on, the two KV caches differ by such roundings, so the margins drift apart too)."""
    check_same_greedy_tokens(*smollm2, "W4A8_G128", "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["W4A16", "W4A8_G128"])  # W8A8 and W8A16: eager's first two logits within 0.5 (CPU)
def test_gpu_smollm2_generates_the_same_tokens_eager_and_compiled(request, scheme):
    """The same check on the GPU: eager is qfuse's Triton kernels (decode calls replayed as CUDA graphs),
    compiled is Inductor's code around them. The GGUF file (98 MB) is more than one call to the GPU
    machine carries: skipped there unless it was brought in parts and named by $QFUSE_SMOLLM2_GGUF,
    with the gguf and accelerate wheels installed."""
    from qfuse.models.smollm2 import _check_loader_packages, smollm2_path

    try:
        smollm2_path()
        _check_loader_packages()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"SmolLM2 cannot load here: {e}")
    check_same_greedy_tokens(*request.getfixturevalue("smollm2"), scheme, "cuda")


def check_same_greedy_tokens(float_model, tok, scheme: str, device: str) -> None:
    """SmolLM2 quantized with ``scheme`` on ``device``: greedy tokens of ``generate`` eager and through
    ``qfuse.compile(model).generate`` (decode steps compiled, passes on) agree before the first near tie."""
    model = qfuse.models.cast_float_model(copy.deepcopy(float_model), torch.bfloat16).to(device)
    qfuse.quantize_model(model, scheme, progress=False)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt")
    ids = (ids if isinstance(ids, torch.Tensor) else ids["input_ids"]).to(device)
    kwargs = dict(max_new_tokens=8, do_sample=False)
    with torch.inference_mode(), torch._inductor.config.patch(force_disable_caches=True):  # a cached graph runs no pass
        eager = model.generate(ids, cache_implementation="static", output_logits=True, return_dict_in_generate=True, **kwargs)
        reset_counters()
        compiled = qfuse.compile(model).generate(ids, **kwargs)
    assert hasattr(model, "_compiled_call")  # transformers ran the decode steps through the compiled forward
    if qfuse.get_scheme(scheme).act_bits == 8:
        assert counters["add_rms_norm_quant"] > 0 and counters["silu_and_mul_quant"] > 0  # with the passes
    new = eager.sequences[0, ids.shape[1] :]
    assert len(new) == 8 and "Paris" in tok.decode(new)
    top2 = [logits[0].float().topk(2).values for logits in eager.logits]
    tied = [i for i, v in enumerate(top2) if v[0] - v[1] < NEAR_TIE]
    same = tied[0] if tied else len(new)  # the tokens before the first near tie
    assert same >= 5, f"eager's logits nearly tie at step {same}: the test prompt no longer tells anything"
    got = compiled[0, ids.shape[1] :]
    margins = [round((v[0] - v[1]).item(), 3) for v in top2]
    assert torch.equal(got[:same], new[:same]), (tok.decode(new), tok.decode(got), margins)


def test_passes_off_takes_any_backend():
    model = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    out = qfuse.compile(model, passes=False, backend="eager")(x)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="backend='inductor'"):
        qfuse.compile(model, backend="eager")


def test_generate_defaults_stand_aside_for_a_cache_or_a_positional_config():
    model = _Recorder()
    compiled = qfuse.compile(model)
    ids = torch.zeros(1, 3, dtype=torch.long)
    compiled.generate(ids, cache="a cache")  # transformers 5's name for past_key_values
    assert "cache_implementation" not in model.calls[-1]
    own = GenerationConfig(cache_implementation="dynamic", compile_config=CompileConfig(backend="eager"))
    compiled.generate(ids, own)  # positionally, as generate(inputs, generation_config)
    assert model.calls[-1] == {"generation_config": own}


def test_compile_configs_of_the_same_settings_are_equal():
    """transformers compiles generate's step again when the call's CompileConfig differs from the
    last one: a qfuse.compile_config() made per call must equal the previous one."""
    assert qfuse.compile_config() == qfuse.compile_config()
    assert QfusePostGradPass() == QfusePostGradPass() and hash(QfusePostGradPass()) == hash(QfusePostGradPass())
    assert qfuse.compile_config() != qfuse.compile_config(passes=False)
    assert qfuse.compile_config(pass_config=PassConfig(dedup_quant=False)) != qfuse.compile_config()
