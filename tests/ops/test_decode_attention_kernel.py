"""Triton kernels of ``decode_attention`` (ops/attention/decode_kernels.py) against the reference.

CPU (CI): the launcher under the Triton interpreter. ``-m gpu``: the registered CUDA op at
Llama-3-8B's decode shapes. The kernel rounds P to the input dtype before P @ V (as flash
attention does) and sums in another order, so the bar is closeness, not bit-equality: within
``TOL`` of the float32 reference rounded to the dtype.
"""

import pytest
import torch

from qfuse.ops.attention.decode_kernels import BLOCK_N, decode_attention_triton, splits_for
from qfuse.ops.decode_attention import decode_attention_ref
from tests.helpers import ACT_DTYPES

# max |kernel - reference| for outputs of magnitude <= 1 (softmax-weighted means of N(0, 1)
# values): a few units of the last place of the dtype, from the P rounding
TOL = {torch.float16: 2e-3, torch.bfloat16: 8e-3}


def _inputs(B, Hq, Hkv, L, S, D, dtype, device="cpu"):
    q = torch.randn(B, L, Hq, D, device=device).to(dtype).transpose(1, 2)
    k = torch.randn(B, Hkv, S, D, device=device).to(dtype)
    v = torch.randn(B, Hkv, S, D, device=device).to(dtype)
    return q, k, v


def _static_cache_mask(B, L, S, filled, device="cpu"):
    """A StaticCache's decode mask: key n visible to token l when n < filled - L + 1 + l."""
    n = torch.arange(S, device=device)
    lq = torch.arange(L, device=device)[:, None]
    return (n[None, :] <= filled - L + lq).expand(B, 1, L, S)


def _check(out, ref):
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.stride() == ref.stride()
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= TOL[out.dtype], f"max error {err}"


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize(
    "B, Hq, Hkv, L, S, D, splits",
    [
        (1, 32, 8, 1, 130, 128, None),  # Llama-3-8B heads, keys over 3 blocks, one per split
        (2, 8, 2, 1, 65, 64, 1),  # one split: the normalized output is written directly
        (7, 9, 3, 1, 200, 64, 2),  # SmolLM2's 3 query heads per KV head, 2 splits of 2 blocks
        (16, 4, 4, 1, 1, 32, None),  # no grouping, one key
        (1, 6, 2, 3, 100, 80, 5),  # 3 query tokens (rows 9 of 16), head_dim 80 (masked to 128)
        (1, 16, 1, 5, 70, 16, 2),  # 80 packed rows: two row blocks of 64
        (3, 4, 2, 1, 300, 64, 64),  # more splits asked than key blocks: one block each
        (1, 16, 1, 3, 70, 256, 2),  # head_dim 256: 48 rows in tiles of at most 32
    ],
)
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_kernel_matches_reference(B, Hq, Hkv, L, S, D, splits, mask_kind, dtype):
    q, k, v = _inputs(B, Hq, Hkv, L, S, D, dtype)
    mask = None
    if mask_kind is not None:
        visible = torch.rand(B, 1, L, S) > 0.3
        visible[..., 0] = True
        mask = visible if mask_kind == "bool" else torch.where(visible, 0.3 * torch.randn(visible.shape), float("-inf")).to(dtype)
    _check(decode_attention_triton(q, k, v, mask, D**-0.5, splits=splits), decode_attention_ref(q, k, v, mask, D**-0.5))


@pytest.mark.parametrize("splits", [1, 3])
def test_static_cache_tail_is_skipped(splits):
    """Key blocks the mask hides for every row are not read: garbage (NaN) in a StaticCache's
    unfilled tail, 2 whole blocks here, leaves the output equal to the reference on a zeroed tail."""
    B, S, filled = 2, 4 * BLOCK_N, 2 * BLOCK_N - 3
    q, k, v = _inputs(B, 8, 2, 1, S, 64, torch.bfloat16)
    mask = _static_cache_mask(B, 1, S, filled)
    k[:, :, 2 * BLOCK_N :] = float("nan")
    v[:, :, 2 * BLOCK_N :] = float("nan")
    out = decode_attention_triton(q, k, v, mask, 0.125, splits=splits)
    k[:, :, 2 * BLOCK_N :] = 0
    v[:, :, 2 * BLOCK_N :] = 0
    _check(out, decode_attention_ref(q, k, v, mask, 0.125))


def test_query_with_no_visible_key_gives_zeros_like_the_reference():
    q, k, v = _inputs(2, 4, 2, 1, 150, 32, torch.float16)
    mask = torch.ones(2, 1, 1, 150, dtype=torch.bool)
    mask[1] = False
    for splits in (1, 3):
        out = decode_attention_triton(q, k, v, mask, 0.2, splits=splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        _check(out, decode_attention_ref(q, k, v, mask, 0.2))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
def test_finite_min_masks_as_transformers_builds_them(dtype):
    """transformers masks with finfo(dtype).min, not -inf: times log2(e) it overflowed to -inf, so
    a row whose keys all carry it saw no key (zeros) where the reference and SDPA average them."""
    q, k, v = _inputs(2, 4, 2, 1, 150, 32, dtype)
    mask = torch.zeros(2, 1, 1, 150, dtype=dtype)
    mask[0, ..., 100:] = torch.finfo(dtype).min  # some keys hidden
    mask[1] = torch.finfo(dtype).min  # every key
    for splits in (1, 3):
        _check(decode_attention_triton(q, k, v, mask, 0.2, splits=splits), decode_attention_ref(q, k, v, mask, 0.2))


def test_non_unit_stride_head_dim_is_copied_first():
    q, k, v = _inputs(1, 4, 2, 1, 40, 32, torch.bfloat16)
    k_strided = torch.empty(1, 2, 40, 64, dtype=torch.bfloat16)[..., ::2].copy_(k)
    _check(decode_attention_triton(q, k_strided, v, None, 0.2), decode_attention_ref(q, k, v, None, 0.2))


def test_tile_rows_and_warps():
    from qfuse.ops.attention.decode_kernels import block_rows, warps_for

    assert [block_rows(r, 128) for r in (1, 4, 17, 33, 200)] == [16, 16, 32, 64, 64]
    assert [block_rows(r, 256) for r in (4, 33)] == [16, 32]  # 64 x 256 spills
    assert [warps_for(16, 128), warps_for(32, 128), warps_for(64, 128), warps_for(16, 256), warps_for(32, 256)] == [4, 4, 8, 4, 8]


def test_splits_fill_two_waves():
    cpu = torch.device("cpu")  # 132 SMs off CUDA (an H200's)
    assert splits_for(8, 16, cpu) == 16  # Llama-3-8B batch 1, context 1024: 128 programs
    assert splits_for(128, 16, cpu) == 3  # batch 16
    assert splits_for(8, 2, cpu) == 2  # never more splits than key blocks
    assert splits_for(1024, 16, cpu) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("B", [1, 2, 7, 16, 64])
@pytest.mark.parametrize("filled", [1, 1025, 4096])
def test_gpu_llama3_decode_shapes(B, filled, dtype):
    """The CUDA op on Llama-3-8B's attention (32 / 8 heads, head_dim 128) over a 4096-token
    StaticCache, against the reference run on the GPU and against SDPA on repeated K / V."""
    S = 4096
    q, k, v = _inputs(B, 32, 8, 1, S, 128, dtype, "cuda")
    mask = _static_cache_mask(B, 1, S, filled, "cuda")
    out = torch.ops.qfuse.decode_attention(q, k, v, mask, 128**-0.5)
    _check(out, decode_attention_ref(q, k, v, mask, 128**-0.5))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask, scale=128**-0.5)
    assert (out.float() - sdpa.float()).abs().max().item() <= 2 * TOL[dtype]
