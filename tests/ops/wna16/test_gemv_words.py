"""The int32-word GEMV of ``qfuse::wna16_gemm`` (ops/wna16/gemv_words.py), 4- and 8-bit,
against the reference kernel ``wna16_gemm_ref``.

CPU (CI): the launcher under the Triton interpreter on small shapes. GPU (``pytest -m gpu``):
every ``gemv_words`` candidate config of the dispatcher at the real decode shapes.
Tolerance: ``assert_close_to_ref`` of tests/ops/test_wna16_gemm_kernel.py,
``|out - ref| <= 2 * eps(dtype) * max|ref|``: the kernel differs from the reference only in
float32 summation order and in applying the scale to a tile's partial dot instead of to a
weight rounded to the activation dtype (reasons in that file's docstring).
"""

from __future__ import annotations

import json

import pytest
import torch

from qfuse.ops.wna16.dispatch import candidate_configs, is_experimental, run_config, usable_configs
from qfuse.ops.wna16.gemv_words import tile_words, wna16_gemv_words, words_supported
from qfuse.ops.wna16_gemm import wna16_gemm_ref
from tests.ops.test_wna16_gemm_kernel import _in_shard, assert_close_to_ref, make_problem

# 64 codes per tile (4-bit: 8 words, 8-bit: 16 words), so K = 256 splits into 4 whole tiles
BLOCK_W = {4: 8, 8: 16}


def _cfg(bits: int, split_k: int, block_n: int = 16, block_w: int | None = None) -> dict:
    return {"BLOCK_N": block_n, "BLOCK_W": block_w or BLOCK_W[bits], "SPLIT_K": split_k, "num_warps": 4}


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous() if bits == 4 else codes.contiguous()


# ---------------------------------------------------------------- CPU: Triton interpreter


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("m,split_k,asym", [(1, 1, False), (2, 2, True), (7, 4, True), (1, 4, False)])
def test_gemv_words_kernel_interpreter(bits, group_size, m, split_k, asym):
    # N = 24 with BLOCK_N = 16: a partial last row tile; K = 256: split-K 2 and 4 take whole tiles
    i = bits // 4 + m + (group_size > 0)  # cycles dtype and bias over the grid
    dtype = (torch.bfloat16, torch.float16)[i % 2]
    x, qw, s, z, b = make_problem(m, 24, 256, bits, group_size, dtype, asym=asym, bias=(i // 2) % 2 == 0)
    out = wna16_gemv_words(x, qw, s, z, b, bits, group_size, _cfg(bits, split_k))
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("asym", [False, True])
def test_gemv_words_kernel_extreme_codes(bits, asym):
    # every code 0 or 2**bits - 1; zero points at the other end (or the implicit 2**(bits-1)):
    # the largest |u - z| and the top code in every position of the word (u * 2**(BITS*j) up to
    # 255 * 2**8 in the exponent trick must stay exact)
    top = (1 << bits) - 1
    x, _, s, _, _ = make_problem(2, 16, 128, bits, 32, torch.bfloat16, asym=False, bias=False)
    codes = torch.randint(0, 2, (16, 128), dtype=torch.uint8) * top
    qw = _pack(codes, bits)
    z = (top - codes[:, ::32]).contiguous() if asym else None
    out = wna16_gemv_words(x, qw, s, z, None, bits, 32, _cfg(bits, 2))
    assert_close_to_ref(out, x, qw, s, z, None, bits, 32)


@pytest.mark.parametrize(
    "bits,k,group_size",
    [(4, 576, -1), (4, 576, 64), (4, 96, 32), (8, 560, -1), (8, 576, 64), (8, 96, 32)],
)
def test_gemv_words_k_not_a_multiple_of_the_configured_tile(bits, k, group_size):
    # K = 576 (SmolLM2's hidden size) is 72 4-bit / 144 8-bit words: not a multiple of BLOCK_W
    # = 16 / 32; 8-bit K = 560 is 140 words: BLOCK_W shrinks to 4
    assert words_supported(k, bits, group_size)
    x, qw, s, z, b = make_problem(1, 24, k, bits, group_size, torch.bfloat16, asym=True, bias=True)
    cfg = {"BLOCK_N": 16, "BLOCK_W": 4 * bits, "SPLIT_K": 4}  # the dispatcher's BLOCK_W per width
    out = wna16_gemv_words(x, qw, s, z, b, bits, group_size, cfg)
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


def test_gemv_words_8bit_rows_not_a_multiple_of_4_words():
    # K = 40 is 10 words: outside words_supported, but the launcher still runs it with scalar
    # word loads (VEC = 1, BLOCK_W = 2)
    assert not words_supported(40, 8, -1)
    x, qw, s, z, b = make_problem(3, 20, 40, 8, -1, torch.float16, asym=True, bias=True)
    out = wna16_gemv_words(x, qw, s, z, b, 8, -1, {"BLOCK_N": 16, "BLOCK_W": 32, "SPLIT_K": 2})
    assert_close_to_ref(out, x, qw, s, z, b, 8, -1)


def test_gemv_words_rejects_partial_words():
    x, qw, s, z, b = make_problem(1, 16, 42, 8, -1, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="whole number of int32 words"):
        wna16_gemv_words(x, qw, s, z, b, 8, -1, _cfg(8, 1))


def test_words_supported():
    assert words_supported(4096, 4, 128) and words_supported(4096, 8, 128)
    assert words_supported(14336, 8, -1) and words_supported(576, 8, 32)
    assert words_supported(48, 8, -1) and not words_supported(48, 4, -1)  # 16 codes = 4 8-bit words
    assert not words_supported(4104, 8, -1) and not words_supported(4096, 2, 128)


@pytest.mark.parametrize("bits", [4, 8])
def test_tolerance_catches_a_code_order_swap(bits):
    """The check can fail: codes swapped within each byte pair / nibble pair (a layout bug)."""
    x, qw, s, z, b = make_problem(1, 32, 128, bits, 64, torch.bfloat16, asym=True, bias=False)
    if bits == 4:
        swapped = ((qw >> 4) | (qw << 4)).contiguous()
    else:
        swapped = qw.view(-1, 2).flip(-1).reshape(qw.shape).contiguous()
    out = wna16_gemv_words(x, swapped, s, z, b, bits, 64, _cfg(bits, 1))
    with pytest.raises(AssertionError):
        assert_close_to_ref(out, x, qw, s, z, b, bits, 64)


@pytest.mark.parametrize("bits,group_size", [(4, 128), (4, -1), (8, 128), (8, -1), (8, 64), (8, 32)])
def test_dispatcher_offers_and_runs_gemv_words(bits, group_size):
    # tiles of 8-32 words per thread; BLOCK_W = 64 spans 4 groups of 128 (4-bit) or 8 of 32 (8-bit)
    every = [c for c in candidate_configs(1, 4096, 4096, bits, group_size) if c["kernel"] == "gemv_words"]
    cands = [c for c in every if not is_experimental(c, bits)]
    assert {c["BLOCK_W"] for c in cands} == ({16, 32, 64, 128} if bits == 4 else {32, 64, 128})
    shapes = {(c["BLOCK_N"], c["BLOCK_W"], c["num_warps"]) for c in cands}
    assert len(shapes) == (9 if bits == 4 else 7)
    for bn, bw, warps in shapes:  # split-K: 1 and divisors of the row's tiles, >= 2 tiles per split
        splits = {c["SPLIT_K"] for c in cands if (c["BLOCK_N"], c["BLOCK_W"], c["num_warps"]) == (bn, bw, warps)}
        tiles = 4096 * bits // 32 // tile_words(4096, bits, group_size, bw)
        assert 1 in splits and len(splits) >= 2 and all(tiles % sp == 0 and tiles // sp >= 2 for sp in splits)
    assert len(every) - len(cands) == 20 and all(c["MAXNREG"] in (64, 80) for c in every if c not in cands)
    assert all(8 <= c["BLOCK_N"] * c["BLOCK_W"] // (32 * c["num_warps"]) <= 32 for c in cands)  # words per thread and tile
    assert candidate_configs(1, 4096, 4096, bits, group_size)[0]["kernel"] == "gemv_words"
    x, qw, s, z, b = make_problem(2, 40, 512, bits, group_size, torch.bfloat16, asym=True, bias=True)
    wide = next(c for c in cands if c["SPLIT_K"] == 2 and c["BLOCK_W"] == 64)  # as offered: BLOCK_N > N wraps rows
    for cfg in (cands[0], wide):
        assert_close_to_ref(run_config(cfg, x, qw, s, z, b, bits, group_size), x, qw, s, z, b, bits, group_size)


def test_register_cap_configs_are_opt_in(monkeypatch):
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    assert not any(is_experimental(c, 4) for c in usable_configs(1, 4096, 4096, 4, 128))
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    capped = [c for c in usable_configs(1, 4096, 4096, 4, 128) if is_experimental(c, 4)]
    assert capped
    # the cap is a ptxas option: on the interpreter the config runs as without it
    x, qw, s, z, b = make_problem(1, 40, 512, 4, 128, torch.bfloat16, asym=True, bias=True)
    assert_close_to_ref(run_config(capped[0], x, qw, s, z, b, 4, 128), x, qw, s, z, b, 4, 128)


@pytest.mark.parametrize("bits,group_size,block_w", [(4, 32, 16), (4, 64, 64), (8, 64, 64), (8, 128, 64)])
def test_gemv_words_tile_spanning_groups(bits, group_size, block_w):
    # NG = BLOCK_W * CPW / group scale groups per tile, each with its own scale and zero point
    x, qw, s, z, b = make_problem(7, 24, 1024, bits, group_size, torch.float16, asym=True, bias=False)
    out = wna16_gemv_words(x, qw, s, z, b, bits, group_size, _cfg(bits, 2, block_w=block_w))
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


@pytest.mark.parametrize("group_size", [-1, 32, 128])
@pytest.mark.parametrize("hfma2", [1, 2])
@pytest.mark.parametrize("m,split_k,asym", [(1, 1, False), (2, 2, True), (1, 4, True)])
def test_gemv_words_hfma2_interpreter(group_size, hfma2, m, split_k, asym):
    # the packed-bf16 form (4-bit, bf16): each word's (or word pair's) products in two bf16 lanes;
    # the interpreter rounds each lane FMA to bf16 as the GPU's fma.rn.bf16x2 does; N = 24 with
    # BLOCK_N = 16: a partial last row tile
    x, qw, s, z, b = make_problem(m, 24, 512, 4, group_size, torch.bfloat16, asym=asym, bias=m == 2)
    out = wna16_gemv_words(x, qw, s, z, b, 4, group_size, {**_cfg(4, split_k), "HFMA2": hfma2})
    assert_close_to_ref(out, x, qw, s, z, b, 4, group_size)


@pytest.mark.parametrize("group_size,block_n,block_w", [(32, 8, 32), (64, 4, 64), (-1, 8, 16), (128, 8, 64)])
def test_gemv_words_hfma2_tiles_of_several_groups(group_size, block_n, block_w):
    # HFMA2 tiles of several groups (NG = 8, 8, 1, 1) and rows, each group with its scale
    # and zero point; 10 rows, so the last tile recomputes rows past N
    x, qw, s, z, b = make_problem(2, 10, 1024, 4, group_size, torch.bfloat16, asym=True, bias=True)
    cfg = {"BLOCK_N": block_n, "BLOCK_W": block_w, "SPLIT_K": 2, "num_warps": 4, "HFMA2": 2}
    assert_close_to_ref(wna16_gemv_words(x, qw, s, z, b, 4, group_size, cfg), x, qw, s, z, b, 4, group_size)


def test_gemv_words_hfma2_extreme_codes_and_odd_words():
    # codes 0 / 15 against zero points at the other end: |u - z| = 15 in every lane position
    x, _, s, _, _ = make_problem(2, 16, 256, 4, 32, torch.bfloat16, asym=False, bias=False)
    codes = torch.randint(0, 2, (16, 256), dtype=torch.uint8) * 15
    z = (15 - codes[:, ::32]).contiguous()
    out = wna16_gemv_words(x, _pack(codes, 4), s, z, None, 4, 32, {**_cfg(4, 2), "HFMA2": 2})
    assert_close_to_ref(out, x, _pack(codes, 4), s, z, None, 4, 32)
    # K = 40: 5 words per row, so tiles of one word; word pairs fall back to single words
    x, qw, s, z, b = make_problem(1, 20, 40, 4, -1, torch.bfloat16, asym=True, bias=True)
    out = wna16_gemv_words(x, qw, s, z, b, 4, -1, {"BLOCK_N": 16, "BLOCK_W": 8, "SPLIT_K": 1, "HFMA2": 2})
    assert_close_to_ref(out, x, qw, s, z, b, 4, -1)


def test_gemv_words_hfma2_activations_at_an_odd_element():
    """Activations that start 2 bytes into their storage (a view) still run: HFMA2 reads them as
    int32 pairs, so the launcher copies such a view first."""
    x, qw, s, z, b = make_problem(1, 16, 256, 4, 128, torch.bfloat16, asym=True, bias=False)
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 4
    out = wna16_gemv_words(shifted, qw, s, z, b, 4, 128, {**_cfg(4, 1), "HFMA2": 2})
    assert_close_to_ref(out, x, qw, s, z, b, 4, 128)


def test_gemv_words_hfma2_tolerance_catches_a_nibble_swap():
    x, qw, s, z, b = make_problem(1, 32, 256, 4, 64, torch.bfloat16, asym=True, bias=False)
    out = wna16_gemv_words(x, ((qw >> 4) | (qw << 4)).contiguous(), s, z, b, 4, 64, {**_cfg(4, 1), "HFMA2": 2})
    with pytest.raises(AssertionError):
        assert_close_to_ref(out, x, qw, s, z, b, 4, 64)


def test_hfma2_tile_layout_in_the_sm90_sass(capfd):
    """The point of the HFMA2 form's [BLOCK_N, BLOCK_W] block load, checked in the compiled loop
    (sm_90, the installed Triton): a thread's words arrive as 16-byte loads and its activations
    do not go through shared memory once per word column (a 3D [BLOCK_N, NG, WPG] load of the
    same tile on triton 3.6: 32 4-byte word loads and 8 LDS.128 a loop iteration)."""
    from qfuse.bench import sass

    assert (
        sass.main(
            ["gemv_words", "--bits", "4", "--group", "128", "--config", json.dumps({"BLOCK_N": 32, "BLOCK_W": 128, "HFMA2": 2, "num_warps": 4})]
        )
        == 0
    )
    line = next(li for li in capfd.readouterr().out.splitlines() if li.startswith("memory: "))
    loads = dict((name, int(n)) for name, n in (item.rsplit(" ", 1) for item in line.removeprefix("memory: ").split(", ")))
    assert loads.get("LDG.E.EF.128") == 8 and "LDG.E.EF" not in loads, loads  # 8 rows x 16 bytes
    assert loads.get("LDS.128", 0) <= 4, loads


@pytest.mark.parametrize("bits,dtype", [(4, torch.float16), (8, torch.bfloat16)])
def test_gemv_words_hfma2_rejects_other_widths_and_dtypes(bits, dtype):
    x, qw, s, z, b = make_problem(1, 16, 128, bits, -1, dtype, asym=False, bias=False)
    with pytest.raises(ValueError, match="HFMA2 takes 4-bit weights and bf16"):
        wna16_gemv_words(x, qw, s, z, b, bits, -1, {**_cfg(bits, 1), "HFMA2": 2})


def test_hfma2_candidates_only_for_4bit_bf16(monkeypatch):
    monkeypatch.delenv("QFUSE_FP32_ACCUMULATE", raising=False)
    bf = [c for c in candidate_configs(1, 4096, 4096, 4, 128, dtype=torch.bfloat16) if "HFMA2" in c]
    assert bf and all(c["kernel"] == "gemv_words" and c["HFMA2"] == 2 and not is_experimental(c, 4) for c in bf)
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    for bits, dtype in ((4, torch.float16), (4, None), (8, torch.bfloat16)):
        assert not any("HFMA2" in c for c in candidate_configs(1, 4096, 4096, bits, 128, dtype=dtype))
    assert not any("HFMA2" in c for c in candidate_configs(16, 4096, 4096, 4, 128, dtype=torch.bfloat16))  # M bucket > 2
    assert any("HFMA2" in c for c in usable_configs(1, 4096, 4096, 4, 128, dtype=torch.bfloat16))
    for n, k, g in ((4096, 4096, 128), (28672, 4096, -1), (4000, 576, 64)):  # the untuned pick: an HFMA2 tile
        first = candidate_configs(1, n, k, 4, g, dtype=torch.bfloat16)[0]
        assert first["kernel"] == "gemv_words" and first["HFMA2"] == 2 and first["SPLIT_K"] == 1
        assert candidate_configs(1, n, k, 4, g, dtype=torch.float16)[0].get("HFMA2") is None
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "1")  # the opt-out drops them
    assert not any("HFMA2" in c for c in usable_configs(1, 4096, 4096, 4, 128, dtype=torch.bfloat16))


def test_fp32_accumulate_strips_a_picked_hfma2(monkeypatch):
    """QFUSE_FP32_ACCUMULATE=1 runs a shipped / cached HFMA2 pick as the same tile in float32."""
    import qfuse.ops.wna16.dispatch as dispatch

    x, qw, s, z, b = make_problem(1, 40, 256, 4, 128, torch.bfloat16, asym=True, bias=True)
    seen = []
    monkeypatch.setattr(dispatch, "pick_config", lambda *a, **k: {"kernel": "gemv_words", **_cfg(4, 1), "HFMA2": 2})
    monkeypatch.setattr(dispatch, "run_config", lambda cfg, *a: seen.append(cfg))
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "1")
    dispatch.wna16_gemm_triton(x, qw, s, z, b, 4, 128)
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "0")
    dispatch.wna16_gemm_triton(x, qw, s, z, b, 4, 128)
    assert "HFMA2" not in seen[0] and seen[1]["HFMA2"] == 2
    assert {**seen[0], "HFMA2": 2} == seen[1]


# ---------------------------------------------------------------- GPU: real decode shapes

SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "n,k,group_size,asym",
    _in_shard(
        [(n, k, g, asym) for n, k in SHAPES for g in (128, -1) for asym in (False, True)]
        + [(4096, 4096, g, asym) for g in (64, 32) for asym in (False, True)]
    ),  # BLOCK_N = 256 / 512
)
def test_gpu_every_gemv_words_candidate_8bit(n, k, group_size, asym):
    dtype = (torch.bfloat16, torch.float16)[(asym + (group_size < 0)) % 2]  # every dtype x zero-point pair
    x, qw, s, z, b = make_problem(1, n, k, 8, group_size, dtype, asym, bias=asym, device="cuda")
    cands = [c for c in candidate_configs(1, n, k, 8, group_size) if c["kernel"] == "gemv_words"]
    assert cands
    for cfg in cands:
        assert_close_to_ref(run_config(cfg, x, qw, s, z, b, 8, group_size), x, qw, s, z, b, 8, group_size)


@pytest.mark.parametrize("bits", [4, 8])
def test_gemv_words_unaligned_weight_storage(bits):
    """A weight view that does not start on a 4-byte boundary (a slice of a larger buffer) still runs."""
    x, qw, s, z, b = make_problem(1, 16, 128, bits, -1, torch.bfloat16, asym=False, bias=True)
    shifted = torch.empty(qw.numel() + 2, dtype=torch.uint8)[2:].view(qw.shape)
    shifted.copy_(qw)
    out = wna16_gemv_words(x, shifted, s, z, b, bits, -1, {"BLOCK_N": 16, "BLOCK_W": 4, "SPLIT_K": 1})
    assert_close_to_ref(out, x, qw, s, z, b, bits, -1)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "n,k,group_size,asym",
    _in_shard([(n, k, g, asym) for n, k in SHAPES for g in (128, -1) for asym in (False, True)] + [(4096, 4096, 32, True), (4096, 4096, 64, False)]),
)
def test_gpu_every_hfma2_candidate(n, k, group_size, asym):
    """Every packed-bf16 (HFMA2) candidate of the dispatcher, W4A16 bf16 M = 1, at the real shapes."""
    x, qw, s, z, b = make_problem(1, n, k, 4, group_size, torch.bfloat16, asym, bias=asym, device="cuda")
    cands = [c for c in candidate_configs(1, n, k, 4, group_size, dtype=torch.bfloat16) if "HFMA2" in c]
    assert cands
    for cfg in cands + [{**cands[0], "HFMA2": 1}]:
        assert_close_to_ref(run_config(cfg, x, qw, s, z, b, 4, group_size), x, qw, s, z, b, 4, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,group_size", [(8192, 8192, 128), (4096, 14336, -1), (28672, 4096, 128)])
def test_gpu_hfma2_error_against_the_exact_product(n, k, group_size):
    """The bf16 lane sums cost accuracy, bounded here: the rms error against the float64 product
    of x and w_hat stays under 2.5x the reference kernel's own (measured 1.4-2.0x, BENCHMARKS.md)
    and the max error under 2.5x the reference's max error."""
    x, qw, s, z, _ = make_problem(1, n, k, 4, group_size, torch.bfloat16, asym=True, bias=False, device="cuda")
    w = dequantize_exact(qw, s, z, group_size)
    exact = x.double() @ w.t()
    ref = wna16_gemm_ref(x, qw, s, z, None, 4, group_size).double()
    cfg = next(c for c in candidate_configs(1, n, k, 4, group_size, dtype=torch.bfloat16) if "HFMA2" in c)
    out = run_config(cfg, x, qw, s, z, None, 4, group_size).double()
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(out - exact) <= 2.5 * rms(ref - exact)
    assert (out - exact).abs().max().item() <= 2.5 * (ref - exact).abs().max().item()


def dequantize_exact(qw, s, z, group_size):
    """w_hat = (u - z) * s in float64, unrounded."""
    codes = torch.stack((qw & 15, qw >> 4), -1).reshape(qw.shape[0], -1).double()
    g = codes.shape[1] if group_size == -1 else group_size
    return (codes - z.double().repeat_interleave(g, 1)) * s.double().repeat_interleave(g, 1)


def test_fp32_accumulate_reads_on_off_spellings(monkeypatch):
    from qfuse.ops.wna16.dispatch import fp32_accumulate

    for value, on in (("true", True), ("ON", True), ("1", True), ("false", False), ("off", False), ("", False)):
        monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", value)
        assert fp32_accumulate() is on, value
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "fp32")
    with pytest.raises(ValueError, match="QFUSE_FP32_ACCUMULATE='fp32'"):
        fp32_accumulate()
