"""Reference kernel, checks and fake of ``qfuse::decode_attention`` (ops/decode_attention.py)."""

import pytest
import torch
import torch.nn.functional as F

from qfuse.ops.decode_attention import decode_attention_ref
from tests.helpers import ACT_DTYPES

# (batch, query heads, KV heads, query tokens, keys, head_dim)
SHAPES = [(1, 32, 8, 1, 1024, 128), (2, 9, 3, 1, 65, 64), (7, 4, 4, 1, 33, 80), (16, 8, 1, 1, 17, 64), (3, 6, 2, 3, 40, 32)]


def _inputs(B, Hq, Hkv, L, S, D, dtype):
    q = torch.randn(B, L, Hq, D).to(dtype).transpose(1, 2)  # HF's layout: a transposed view
    k = torch.randn(B, Hkv, S, D).to(dtype)
    v = torch.randn(B, Hkv, S, D).to(dtype)
    return q, k, v


def _random_mask(B, L, S, kind, batch_dim=None):
    visible = torch.rand(batch_dim or B, 1, L, S) > 0.4
    visible[..., 0] = True  # every query sees a key
    if kind == "bool":
        return visible
    return torch.where(visible, torch.randn(visible.shape) * 0.5, float("-inf")).to(kind)


def _sdpa(q, k, v, mask, scale):
    """SDPA (math, float32) on K / V repeated per query head, as transformers does."""
    G = q.shape[1] // k.shape[1]
    m = mask if mask is None or mask.dtype == torch.bool else mask.float()
    return F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1), attn_mask=m, scale=scale)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("mask_kind", [None, "bool", torch.float32, "same"])
@pytest.mark.parametrize("shape", SHAPES)
def test_op_equals_sdpa_on_repeated_kv(shape, mask_kind, dtype):
    B, Hq, Hkv, L, S, D = shape
    q, k, v = _inputs(B, Hq, Hkv, L, S, D, dtype)
    mask = None if mask_kind is None else _random_mask(B, L, S, dtype if mask_kind == "same" else mask_kind)
    out = torch.ops.qfuse.decode_attention(q, k, v, mask, D**-0.5)
    assert out.shape == q.shape and out.dtype == dtype
    assert out.transpose(1, 2).is_contiguous()  # laid out as [B, L, Hq, D] for o_proj
    # one rounding of a float32 result to dtype
    torch.testing.assert_close(out.float(), _sdpa(q, k, v, mask, D**-0.5).to(dtype).float(), atol=2e-3, rtol=torch.finfo(dtype).eps)


def test_broadcast_masks_equal_expanded_ones():
    q, k, v = _inputs(3, 8, 2, 2, 50, 64, torch.bfloat16)
    per_batch = _random_mask(3, 1, 50, "bool")  # [3, 1, 1, 50]: one row for both tokens
    shared = _random_mask(3, 2, 50, "bool", batch_dim=1)  # [1, 1, 2, 50]: one mask for the batch
    for mask in (per_batch, shared):
        expanded = mask.expand(3, 1, 2, 50).contiguous()
        assert torch.equal(torch.ops.qfuse.decode_attention(q, k, v, mask, 0.125), torch.ops.qfuse.decode_attention(q, k, v, expanded, 0.125))


def test_query_with_no_visible_key_gives_zeros():
    q, k, v = _inputs(2, 4, 2, 1, 20, 32, torch.float16)
    mask = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    mask[1] = False
    out = decode_attention_ref(q, k, v, mask, 0.2)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[0].float(), _sdpa(q, k, v, mask, 0.2)[0].half().float())


def test_heads_of_a_group_read_their_own_kv_head():
    """Query head h reads KV head h // G (repeat_kv's order): zeroing V of KV head 1 zeroes exactly heads 4-7."""
    q, k, v = _inputs(1, 8, 2, 1, 10, 16, torch.bfloat16)
    v[:, 1] = 0
    out = torch.ops.qfuse.decode_attention(q, k, v, None, 0.25)
    assert (out[:, 4:] == 0).all() and (out[:, :4] != 0).any()


def test_fake_kernel_and_compile():
    q, k, v = _inputs(2, 8, 2, 1, 30, 64, torch.bfloat16)
    mask = _random_mask(2, 1, 30, "bool")

    def f(q, k, v, mask):
        return torch.ops.qfuse.decode_attention(q, k, v, mask, 0.125).transpose(1, 2).reshape(2, 1, -1)

    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True, dynamic=False, backend="aot_eager")(q, k, v, mask)
    assert torch.equal(out, f(q, k, v, mask))
    for m in (mask, None):
        results = torch.library.opcheck(torch.ops.qfuse.decode_attention.default, (q, k, v, m, 0.125))
        assert set(results.values()) == {"SUCCESS"}, results


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=torch.randn(1, 8, 1, 64)), TypeError, "q must be float16 or bfloat16"),
        (dict(k=torch.randn(1, 2, 30, 64).half()), TypeError, "k must be bfloat16"),
        (dict(q=torch.randn(8, 1, 64).bfloat16()), ValueError, "q must be 4-D"),
        (dict(k=torch.randn(1, 3, 30, 64).bfloat16(), v=torch.randn(1, 3, 30, 64).bfloat16()), ValueError, "not a multiple of k's 3 KV heads"),
        (dict(v=torch.randn(1, 2, 31, 64).bfloat16()), ValueError, "k and v must have one shape"),
        (dict(k=torch.randn(1, 2, 30, 32).bfloat16(), v=torch.randn(1, 2, 30, 32).bfloat16()), ValueError, "head_dim"),
        (dict(mask=torch.ones(1, 8, 1, 30, dtype=torch.bool)), ValueError, "one mask for all heads"),
        (dict(mask=torch.ones(1, 1, 1, 29, dtype=torch.bool)), ValueError, r"mask must have shape \[1 or 1, 1, 1 or 1, 30\]"),
        (dict(mask=torch.ones(1, 1, 1, 30, dtype=torch.int32)), TypeError, "mask must be bool or floating point"),
        (dict(scale=0.0), ValueError, "scale must be a positive finite float"),
        (dict(scale=float("nan")), ValueError, "scale must be a positive finite float"),
        (dict(k=torch.randn(1, 2, 0, 64).bfloat16(), v=torch.randn(1, 2, 0, 64).bfloat16(), mask=None), ValueError, "empty input"),
    ],
)
def test_bad_input_raises_a_clear_error(change, error, match):
    args = dict(
        q=torch.randn(1, 8, 1, 64).bfloat16(), k=torch.randn(1, 2, 30, 64).bfloat16(), v=torch.randn(1, 2, 30, 64).bfloat16(), mask=None, scale=0.125
    )
    args.update(change)
    with pytest.raises(error, match=match):
        torch.ops.qfuse.decode_attention(args["q"], args["k"], args["v"], args["mask"], args["scale"])
