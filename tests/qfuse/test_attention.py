"""``qfuse.use_decode_attention``: Hugging Face models on ``qfuse::decode_attention`` at decode.

The bar: decode logits as close to the float32 model's as transformers' SDPA path gets (the op
is float32 inside, like SDPA's), the op actually called at decode and under ``qfuse.compile``,
everything else (long prompts, features the op lacks) left to SDPA, and the real SmolLM2
(3 query heads per KV head) generating SDPA's greedy tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import qfuse
from qfuse.attention import MAX_PACKED_ROWS, NAME, _decode_sized, use_decode_attention
from tests.hf_models import ARCHS, tiny_hf_model


class _CountOp(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.qfuse.decode_attention.default:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _decode_logits(model, prompt, pad_mask, new_tokens):
    """Last-position logits of the prompt's prefill and of each teacher-forced decode step, on a StaticCache."""
    from transformers import StaticCache

    P, T = prompt.shape[1], new_tokens.shape[1]
    cache = StaticCache(config=model.config, max_cache_len=P + T + 5)
    mask = pad_mask
    out = [model(input_ids=prompt, attention_mask=mask, past_key_values=cache, cache_position=torch.arange(P)).logits[:, -1]]
    for i in range(T):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        step = model(input_ids=new_tokens[:, i : i + 1], attention_mask=mask, past_key_values=cache, cache_position=torch.tensor([P + i]))
        out.append(step.logits[:, -1])
    return torch.stack(out, 1).float()


@pytest.mark.parametrize("arch", ARCHS)
def test_decode_logits_as_close_to_float32_as_sdpa(arch):
    model = tiny_hf_model(arch)
    model32 = copy.deepcopy(model).float()
    prompt = torch.randint(0, 256, (3, 9))
    pad_mask = torch.ones_like(prompt)
    pad_mask[1, :3] = 0  # left padding: the mask hides keys in the middle of the batch
    pad_mask[2, :5] = 0
    new = torch.randint(0, 256, (3, 6))
    with torch.inference_mode():
        ref = _decode_logits(model32, prompt, pad_mask, new)
        sdpa = _decode_logits(model, prompt, pad_mask, new)
        use_decode_attention(model)
        with _CountOp() as counter:
            got = _decode_logits(model, prompt, pad_mask, new)
    layers = model.config.num_hidden_layers
    assert counter.calls == layers * (1 + new.shape[1])  # the 9-token prefill packs 18 rows: the op too
    err_sdpa, err_got = (sdpa - ref).abs().max().item(), (got - ref).abs().max().item()
    assert err_got <= 1.5 * err_sdpa + 1e-3, (err_got, err_sdpa)


def test_compiled_decode_step_runs_the_op():
    from torch._inductor.utils import run_and_get_code

    from qfuse.bench.model import DecodeStep

    model = tiny_hf_model("llama")
    qfuse.quantize_model(model, "W4A16", progress=False)
    use_decode_attention(model)
    step = DecodeStep(model, 40, 2)
    ids, pos = torch.randint(0, 256, (2, 1)), torch.tensor([20])
    torch._dynamo.reset()
    with torch.inference_mode(), torch._inductor.config.patch(force_disable_caches=True):  # the code, not a cache hit
        eager = step(ids, pos)
        compiled, code = run_and_get_code(qfuse.compile(step, fullgraph=True, dynamic=False), ids, pos)
    assert any("qfuse.decode_attention" in c for c in code)
    assert "repeat_interleave" not in "".join(code)
    # the same op and kernels, Inductor's own rounding of the surrounding bf16 math
    torch.testing.assert_close(compiled, eager, atol=2e-2, rtol=2e-2)


def _q(B, Hq, L, D=64, dtype=torch.bfloat16):
    return torch.randn(B, Hq, L, D).to(dtype)


class _Module:
    is_causal = True


@pytest.mark.parametrize(
    "q_shape, mask_shape, extra, expected",
    [
        ((2, 8, 1), (2, 1, 1, 30), {}, True),  # a decode step on a static cache
        ((2, 8, 1), None, {}, True),  # a decode step on a dynamic cache: no mask
        ((2, 8, 16), (2, 1, 16, 30), {}, True),  # 64 packed rows: the most the op takes
        ((2, 8, 17), (2, 1, 17, 30), {}, False),  # a prompt: SDPA
        ((2, 8, 4), None, {}, False),  # causal without a mask: SDPA's is_causal
        ((2, 8, 1), (2, 8, 1, 30), {}, False),  # a mask per head
        ((2, 8, 1), (2, 1, 1, 30), {"dropout": 0.1}, False),
        ((2, 8, 1), (2, 1, 1, 30), {"softcap": 30.0}, False),
        ((2, 8, 1), (2, 1, 1, 30), {"s_aux": torch.zeros(8)}, False),
        ((2, 8, 1), (2, 1, 1, 30), {"dtype": torch.float32}, False),
    ],
)
def test_which_calls_take_the_op(q_shape, mask_shape, extra, expected):
    extra = dict(extra)
    dtype = extra.pop("dtype", torch.bfloat16)
    dropout = extra.pop("dropout", 0.0)
    q = _q(*q_shape, dtype=dtype)
    k = torch.randn(2, 2, 30, 64).to(dtype)
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    assert q_shape[2] * 4 <= MAX_PACKED_ROWS or not expected
    assert _decode_sized(_Module(), q, k, k, mask, dropout, None, extra) is expected


def test_grad_mode_takes_sdpa():
    """The op has no backward: a padded batch in grad mode (training, or a model called without
    no_grad) goes to SDPA, and its loss backpropagates."""
    q = _q(2, 8, 1, dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(2, 2, 30, 64).to(torch.bfloat16)
    mask = torch.ones(2, 1, 1, 30, dtype=torch.bool)
    assert not _decode_sized(_Module(), q, k, k, mask, 0.0, None, {})
    with torch.no_grad():
        assert _decode_sized(_Module(), q, k, k, mask, 0.0, None, {})
    model = use_decode_attention(tiny_hf_model("llama", layers=1))
    ids = torch.randint(0, 256, (2, 5))
    attention_mask = torch.ones(2, 5, dtype=torch.long)
    attention_mask[1, :2] = 0  # left padding: a 4-D mask
    model(ids, attention_mask=attention_mask, labels=ids).loss.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None


def test_switch_and_undo():
    model = tiny_hf_model("qwen2")
    assert use_decode_attention(model) is model and model.config._attn_implementation == NAME
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(TypeError, match="expected a transformers PreTrainedModel"):
        use_decode_attention(torch.nn.Linear(4, 4))


NEAR_TIE = 1.0  # as tests/qfuse/test_compile.py: eight bf16 steps at |logit| 16-32


def test_smollm2_generates_sdpas_tokens(smollm2):
    """The real SmolLM2-135M (9 query heads on 3 KV heads), quantized W4A16: the same greedy tokens
    as with SDPA, eager and with ``qfuse.compile``'s compiled decode steps, up to the first step
    where SDPA's two best logits lie within NEAR_TIE."""
    float_model, tok = smollm2
    model = qfuse.models.cast_float_model(copy.deepcopy(float_model), torch.bfloat16)
    qfuse.quantize_model(model, "W4A16", progress=False)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    kwargs = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
    with torch.inference_mode():
        sdpa = model.generate(ids, output_logits=True, return_dict_in_generate=True, **kwargs)
        use_decode_attention(model)
        with _CountOp() as counter:
            got = model.generate(ids, **kwargs)[0, ids.shape[1] :]
        compiled = qfuse.compile(model).generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
    assert counter.calls == 7 * model.config.num_hidden_layers  # the 7 decode steps after the prefill
    new = sdpa.sequences[0, ids.shape[1] :]
    assert "Paris" in tok.decode(new)
    top2 = [logits[0].float().topk(2).values for logits in sdpa.logits]
    tied = [i for i, v in enumerate(top2) if v[0] - v[1] < NEAR_TIE]
    same = tied[0] if tied else len(new)
    assert same >= 5, f"SDPA's logits nearly tie at step {same}: the test prompt no longer tells anything"
    assert torch.equal(got[:same], new[:same]), (tok.decode(new), tok.decode(got))
    assert torch.equal(compiled[:same], new[:same]), (tok.decode(new), tok.decode(compiled))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_gpu_decode_step_compiled_and_captured(batch):
    """CUDA: a Llama-shaped decode step on a 1000-token StaticCache (GQA 32 / 8, head_dim 128), qfuse's
    decode attention eager, compiled, and replayed as a captured CUDA graph, against the float32 model:
    no further off than bf16 SDPA's step (logits differ by up to ~0.04 of ~1.3 from bf16 rounding)."""
    import transformers

    from qfuse.bench.model import DecodeStep

    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=4096, intermediate_size=512, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    reference = copy.deepcopy(model).float()
    fill = [torch.randint(0, 256, (batch, 100), device="cuda") for _ in range(7)]
    ids, pos = torch.randint(0, 256, (batch, 1), device="cuda"), torch.tensor([700], device="cuda")

    def filled_step(m):
        step = DecodeStep(m, 1000, batch)
        for i, tokens in enumerate(fill):  # 700 cached tokens
            step(tokens, torch.arange(100 * i, 100 * i + 100, device="cuda"))
        return step

    with torch.inference_mode():
        ref = filled_step(reference)(ids, pos).float()
        step = filled_step(model)
        want = step(ids, pos)
        use_decode_attention(model)
        with _CountOp() as counter:
            eager = step(ids, pos)
        assert counter.calls == 2
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, dynamic=False)
        compiled(ids, pos)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(ids, pos)
        graph.replay()
    err_sdpa = (want.float() - ref).abs().max().item()
    for name, got in (("eager", eager), ("compiled", out)):
        err = (got.float() - ref).abs().max().item()
        assert err <= 1.5 * err_sdpa + 1e-3, (name, err, err_sdpa)
