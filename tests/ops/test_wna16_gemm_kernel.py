"""The Triton kernels of ``qfuse::wna16_gemm`` against its reference kernel.

CPU (CI): the launchers run under the Triton interpreter on small shapes, one config each.
GPU (``pytest -m gpu``): the issue's grid through the registered CUDA kernel, every
candidate config of every family, and CUDA-graph capture. Shard the grid over processes
with ``QFUSE_GPU_SHARD=i/n`` (compilation dominates a fresh machine; see BENCHMARKS.md).

Tolerance for float outputs: ``|out - ref| <= 2 * eps(dtype) * max|ref|``. Why: the kernels
differ from the reference only by float32 summation order (split-K, tiles) and, in the
scale-after-dot / per-channel / GEMV variants, by skipping the weight's one rounding to the
activation dtype (relative 2**-9 per term, random signs, so ~2**-9 of the output's RMS);
both are far below one output ulp at the output's largest magnitude (eps * max|ref|).
Dequantized weights (the dequant + cuBLAS path) are compared bit for bit.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import triton
import triton.language as tl

from qfuse.ops._autotune import m_bucket
from qfuse.ops.wna16.common import dequantize_triton, finish_split, split_counters
from qfuse.ops.wna16.dispatch import candidate_configs, is_experimental, run_config, usable_configs
from qfuse.ops.wna16.gemv import wna16_gemv
from qfuse.ops.wna16.tiled import wna16_tiled
from qfuse.ops.wna16.tiled_words import wna16_tiled_words
from qfuse.ops.wna16_gemm import _wna16_gemm_cuda, dequantize_wna16, wna16_gemm_ref


def make_problem(m, n, k, bits, group_size, dtype, asym, bias, device="cpu", scale=0.02):
    """Random codes (full range), scales, zero points, activations, bias: never zeros."""
    groups = 1 if group_size == -1 else k // group_size
    codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device=device)
    qweight = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous() if bits == 4 else codes
    scales = (torch.rand(n, groups, device=device) * scale + scale / 4).to(dtype)
    zeros = torch.randint(0, 2**bits, (n, groups), dtype=torch.uint8, device=device) if asym else None
    x = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(n, device=device).to(dtype) if bias else None
    return x, qweight, scales, zeros, b


def assert_close_to_ref(out, x, qweight, scales, zeros, bias, bits, group_size):
    ref = wna16_gemm_ref(x, qweight, scales, zeros, bias, bits, group_size)
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    assert ref.abs().max() > 0
    tol = 2 * torch.finfo(x.dtype).eps * ref.float().abs().max().item()
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= tol, f"max error {err:.3g} > tolerance {tol:.3g}"


# ---------------------------------------------------------------- CPU: Triton interpreter

TILED_CFGS = [
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "SCALE_AFTER_DOT": False},
    {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 3, "SCALE_AFTER_DOT": True},
    {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 2, "SCALE_AFTER_DOT": False, "GROUP_M": 2},
]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 32, 64])
@pytest.mark.parametrize("cfg", range(len(TILED_CFGS)))
def test_tiled_kernel_interpreter(bits, group_size, cfg):
    # alternate dtype / zero points / bias over the grid so each appears with every bits x group
    i = (bits // 4) + 2 * cfg + (group_size > 0)
    dtype = (torch.bfloat16, torch.float16)[i % 2]
    x, qw, s, z, b = make_problem(7, 40, 128, bits, group_size, dtype, asym=cfg != 1, bias=i % 3 != 0)
    out = wna16_tiled(x, qw, s, z, b, bits, group_size, TILED_CFGS[cfg])
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,k", [(33, 96), (2, 200)])  # K not a multiple of BLOCK_K (per-channel)
def test_tiled_kernel_odd_k_and_m(bits, m, k):
    x, qw, s, z, b = make_problem(m, 24, k, bits, -1, torch.bfloat16, asym=True, bias=True)
    out = wna16_tiled(x, qw, s, z, b, bits, -1, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 2})
    assert_close_to_ref(out, x, qw, s, z, b, bits, -1)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 32])
@pytest.mark.parametrize("m,split_k", [(1, 1), (2, 2), (3, 3)])
def test_gemv_kernel_interpreter(bits, group_size, m, split_k):
    dtype = torch.float16 if split_k == 2 else torch.bfloat16
    x, qw, s, z, b = make_problem(m, 48, 192, bits, group_size, dtype, asym=m != 2, bias=m != 3)
    out = wna16_gemv(x, qw, s, z, b, bits, group_size, {"BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": split_k})
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


def test_gemv_kernel_odd_k():
    x, qw, s, z, b = make_problem(1, 20, 90, 4, -1, torch.bfloat16, asym=True, bias=False)
    out = wna16_gemv(x, qw, s, z, b, 4, -1, {"BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 2})
    assert_close_to_ref(out, x, qw, s, z, b, 4, -1)


def _check_dequant(bits, group_size, asym, dtype, device):
    _, qw, s, z, _ = make_problem(1, 40, 192, bits, group_size, dtype, asym=asym, bias=False, scale=3.0, device=device)
    got = dequantize_triton(qw, s, z, bits, group_size, dtype)
    want = dequantize_wna16(qw, s, z, bits, group_size).to(dtype)
    if dtype == torch.bfloat16 and device == "cpu":
        # the interpreter rounds float32 -> bf16 half-up (not half-to-even): 1 ulp; bit-exact on the GPU
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)
    else:
        assert torch.equal(got, want)


DEQUANT_CASES = [(4, 32, True), (4, -1, False), (8, 64, True), (8, -1, False)]


@pytest.mark.parametrize("bits,group_size,asym", DEQUANT_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dequant_kernel_bit_exact(bits, group_size, asym, dtype):
    _check_dequant(bits, group_size, asym, dtype, "cpu")


@triton.jit
def _finish_split_probe(part_ptr, bias_ptr, ws_ptr, count_ptr, out_ptr, MN, SPLIT_K, BLOCK: tl.constexpr):
    """Tile ``program_id(0)`` of a flat output, split ``program_id(1)``: hands its slice of
    ``part[pid_k]`` to finish_split, as the kernels do with their partial sums."""
    tile, pid_k = tl.program_id(0), tl.program_id(1)
    idx = tile * BLOCK + tl.arange(0, BLOCK)
    mask = idx < MN
    part = tl.load(part_ptr + pid_k * MN + idx, mask=mask, other=0.0)
    finish_split(part, idx, mask, bias_ptr + idx % MN, ws_ptr, count_ptr, out_ptr, tile, pid_k, MN, SPLIT_K, True)


def _check_finish_split(device, split_k, mn, block, repeats):
    parts = torch.randn(split_k, mn, device=device)
    bias = torch.randn(mn, device=device).to(torch.float16)  # fp16: the interpreter's bf16 rounding is not RTNE
    tiles = triton.cdiv(mn, block)
    counts = split_counters(torch.device(device), tiles)
    expect = parts[0].clone()
    for s in range(1, split_k):
        expect = expect + parts[s]
    expect = (expect + bias.float()).to(torch.float16)
    for _ in range(repeats):  # the counters must come back to zero for the next launch
        ws = torch.empty_like(parts)
        out = torch.empty(mn, dtype=torch.float16, device=device)
        _finish_split_probe[(tiles, split_k)](parts, bias, ws, counts, out, mn, split_k, BLOCK=block)
        assert torch.equal(out, expect)
        assert not counts[:tiles].any()


def test_finish_split_is_ordered_sum_plus_bias_and_resets_counters():
    _check_finish_split("cpu", split_k=3, mn=70, block=32, repeats=2)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [2, 8, 16])
def test_finish_split_gpu(split_k):
    """Thousands of tiles whose splits race on the H200: the last arriver must see every partial."""
    _check_finish_split("cuda", split_k=split_k, mn=28672 * 16 + 5, block=128, repeats=5)


def test_tolerance_catches_a_nibble_swap():
    """The check above can fail: swapping the nibble order (a layout bug) is caught."""
    x, qw, s, z, b = make_problem(2, 32, 64, 4, 32, torch.bfloat16, asym=True, bias=False)
    swapped = ((qw >> 4) | (qw << 4)).contiguous()
    out = wna16_tiled(x, swapped, s, z, b, 4, 32, TILED_CFGS[0])
    with pytest.raises(AssertionError):
        assert_close_to_ref(out, x, qw, s, z, b, 4, 32)


@pytest.mark.parametrize("m", [1, 2, 16, 64, 200])
def test_candidate_families_by_m_bucket(m):
    cands = candidate_configs(m, 4096, 4096, 4, 128)
    kinds = {c["kernel"] for c in cands}
    assert ("gemv" in kinds) == (m <= 4)
    assert ("dequant_mm" in kinds) == (m >= 128)
    assert ("gemv_words" in kinds) == (m <= 2)
    assert ("tiled_words" in kinds) == ("tiled" in kinds)
    assert "tiled_words" not in {c["kernel"] for c in candidate_configs(m, 4096, 4094, 4, -1)}  # K not whole words
    swapped = [c for c in cands if c.get("SWAP_AB") and c["kernel"] == "tiled_words" and not c.get("HALF_PLANES")]
    assert len(swapped) >= sum(c["kernel"] == "tiled" and c["BLOCK_M"] <= 64 for c in cands) > 0
    # the large weight-major tiles (M bucket >= 64): tokens up to twice the bucket, 4-bit with PTX half planes
    big = [c for c in cands if c["kernel"] == "tiled_words" and c.get("HALF_PLANES")]
    assert bool(big) == (m >= 64) and all(c["SWAP_AB"] and c["BLOCK_M"] <= 2 * m and not c["SCALE_AFTER_DOT"] for c in big)
    big8 = [c for c in candidate_configs(m, 4096, 4096, 8, 128) if c["kernel"] == "tiled_words" and c.get("SWAP_AB") and c["BLOCK_M"] >= 128]
    assert bool(big8) == (m >= 64) and not any("HALF_PLANES" in c for c in big8)
    planes = [c for c in cands if c["kernel"] == "tiled_planes"]  # 4-bit only; 4 planes need BLOCK_K >= 64
    assert planes and all(c["SWAP_AB"] and (c["BLOCK_K"] >= 64 or c["PLANES"] == 2) for c in planes)
    assert not any(c["kernel"] == "tiled_planes" for c in candidate_configs(m, 4096, 4096, 8, 128))
    mma = [c for c in cands if c["kernel"] == "mma_words"]  # 4-bit, M bucket <= 64, K % 128 == 0
    assert bool(mma) == (m <= 64) and all(c["BLOCK_M"] == max(16, min(64, m_bucket(m))) for c in mma)
    assert not any(c["kernel"] == "mma_words" for c in candidate_configs(m, 4096, 4096, 8, 128) + candidate_configs(m, 4096, 4160, 4, -1))
    assert cands[0]["kernel"] == ("gemv_words" if m == 1 else "mma_words" if m <= 32 else "tiled_tma")
    assert candidate_configs(m, 4096, 4096, 8, 128)[0]["kernel"] == ("gemv_words" if m == 1 else "tiled" if m <= 32 else "tiled_tma")
    assert all(c.get("BLOCK_K", 0) <= 128 for c in cands)


@pytest.mark.parametrize("m", [1, 3, 130])
def test_every_candidate_family_runs(m):
    """One config of each family the dispatcher offers at this M, through run_config."""
    x, qw, s, z, b = make_problem(m, 32, 64, 4, 32, torch.bfloat16, asym=True, bias=True)
    seen = set()
    for cfg in candidate_configs(m, 32, 64, 4, 32):
        if cfg["kernel"] in seen:
            continue
        seen.add(cfg["kernel"])
        cfg = {**cfg, "BLOCK_N": 32, "BLOCK_M": min(cfg.get("BLOCK_M", 16), 32), "SPLIT_K": 1} if cfg["kernel"] != "dequant_mm" else cfg
        assert_close_to_ref(run_config(cfg, x, qw, s, z, b, 4, 32), x, qw, s, z, b, 4, 32)


@pytest.mark.parametrize("m", [1, 3])
def test_cuda_entry_point_end_to_end(m):
    """The function registered for CUDA, run on CPU tensors: dispatch + heuristic config."""
    x, qw, s, z, b = make_problem(m, 32, 64, 4, 32, torch.float16, asym=True, bias=True)
    assert_close_to_ref(_wna16_gemm_cuda(x, qw, s, z, b, 4, 32), x, qw, s, z, b, 4, 32)


def test_cuda_entry_point_checks_before_any_kernel():
    x, qw, s, z, b = make_problem(2, 32, 64, 4, 32, torch.bfloat16, asym=True, bias=False)
    with pytest.raises(ValueError):
        _wna16_gemm_cuda(x, qw[:, :-1].contiguous(), s, z, b, 4, 32)  # wrong packed width
    with pytest.raises(TypeError):
        _wna16_gemm_cuda(x, qw, s.float(), z, b, 4, 32)  # scales not in x.dtype
    with pytest.raises(ValueError):
        _wna16_gemm_cuda(x, qw, s, z, b, 4, 48)  # unsupported group size


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [-1, 32, 64])
@pytest.mark.parametrize("cfg", range(len(TILED_CFGS)))
@pytest.mark.parametrize("swap_ab", [False, True])
def test_tiled_words_kernel_interpreter(bits, group_size, cfg, swap_ab):
    i = (bits // 4) + 2 * cfg + (group_size > 0) + swap_ab
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    x, qw, s, z, b = make_problem(7, 40, 128, bits, group_size, dtype, asym=(cfg + swap_ab) % 2 == 1, bias=i % 3 != 1)
    out = wna16_tiled_words(x, qw, s, z, b, bits, group_size, {**TILED_CFGS[cfg], "SWAP_AB": swap_ab})
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


@pytest.mark.parametrize("group_size", [-1, 32, 64])
@pytest.mark.parametrize("cfg", range(len(TILED_CFGS)))
@pytest.mark.parametrize("swap_ab", [False, True])
def test_tiled_words_half_planes_interpreter(group_size, cfg, swap_ab):
    """4-bit through int16 halves, planes k = 4h + t joined back to natural K order."""
    dtype = (torch.float16, torch.bfloat16)[(cfg + swap_ab) % 2]
    x, qw, s, z, b = make_problem(7, 40, 128, 4, group_size, dtype, asym=(cfg + swap_ab + (group_size > 0)) % 2 == 1, bias=cfg != 1)
    out = wna16_tiled_words(x, qw, s, z, b, 4, group_size, {**TILED_CFGS[cfg], "SWAP_AB": swap_ab, "HALF_PLANES": True})
    assert_close_to_ref(out, x, qw, s, z, b, 4, group_size)


def test_tiled_words_half_planes_catches_swapped_planes():
    """The join order matters: swapping two codes of every half must fail the tolerance."""
    x, qw, s, z, b = make_problem(5, 32, 128, 4, 32, torch.bfloat16, asym=False, bias=False)
    swapped = ((qw & 0x0F) << 4) | (qw >> 4)  # k = 2j <-> 2j + 1
    with pytest.raises(AssertionError):
        assert_close_to_ref(
            wna16_tiled_words(x, swapped, s, z, b, 4, 32, {**TILED_CFGS[0], "SWAP_AB": True, "HALF_PLANES": True}), x, qw, s, z, b, 4, 32
        )


@pytest.mark.parametrize("bits,m,k", [(4, 33, 104), (8, 2, 100)])  # K: whole words, not whole BLOCK_K tiles
def test_tiled_words_kernel_odd_k_and_m(bits, m, k):
    x, qw, s, z, b = make_problem(m, 24, k, bits, -1, torch.bfloat16, asym=True, bias=True)
    out = wna16_tiled_words(x, qw, s, z, b, bits, -1, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 2, "SWAP_AB": bits == 4})
    assert_close_to_ref(out, x, qw, s, z, b, bits, -1)


@pytest.mark.parametrize("bits", [4, 8])
def test_tiled_words_kernel_extreme_codes(bits):
    # every code 0 or 2**bits - 1 against zero points at the other end: the largest |u - z|
    # the in-place exponent trick sees, in every position of the word (the FFMA must be exact)
    top = (1 << bits) - 1
    x, _, s, _, _ = make_problem(3, 16, 128, bits, 32, torch.bfloat16, asym=False, bias=False)
    codes = torch.randint(0, 2, (16, 128), dtype=torch.uint8) * top
    qw = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous() if bits == 4 else codes
    z = (top - codes[:, ::32]).contiguous()
    out = wna16_tiled_words(x, qw, s, z, None, bits, 32, {**TILED_CFGS[1], "SWAP_AB": bits == 8})
    assert_close_to_ref(out, x, qw, s, z, None, bits, 32)


def test_tiled_words_kernel_rejects_partial_words():
    x, qw, s, z, b = make_problem(2, 16, 36, 4, -1, torch.bfloat16, asym=False, bias=False)
    with pytest.raises(ValueError, match="whole number of int32 words"):
        wna16_tiled_words(x, qw, s, z, b, 4, -1, TILED_CFGS[0])


def test_tiled_words_unaligned_weight_storage():
    """A weight view that does not start on a 4-byte boundary (a slice of a larger buffer) still runs."""
    x, qw, s, z, b = make_problem(2, 16, 64, 4, -1, torch.bfloat16, asym=True, bias=False)
    shifted = torch.empty(qw.numel() + 1, dtype=torch.uint8)[1:].view(qw.shape)
    shifted.copy_(qw)
    assert_close_to_ref(wna16_tiled_words(x, shifted, s, z, b, 4, -1, TILED_CFGS[0]), x, qw, s, z, b, 4, -1)


def test_tiled_words_tolerance_catches_a_nibble_swap():
    x, qw, s, z, b = make_problem(2, 32, 64, 4, 32, torch.bfloat16, asym=True, bias=False)
    swapped = ((qw >> 4) | (qw << 4)).contiguous()
    with pytest.raises(AssertionError):
        assert_close_to_ref(wna16_tiled_words(x, swapped, s, z, b, 4, 32, TILED_CFGS[0]), x, qw, s, z, b, 4, 32)


# ---------------------------------------------------------------- GPU: the grid

# QFUSE_GPU_GRID_M=1,2 narrows the grid to some M (a quick check of the decode kernels)
GRID_M = tuple(int(v) for v in os.environ.get("QFUSE_GPU_GRID_M", "1,2,7,16,33,64,128,512,2048").split(","))
GRID_SHAPES = ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (4000, 4096), (1000, 2944))
GRID_QUANT = ((4, -1), (4, 32), (4, 64), (4, 128), (8, -1), (8, 32), (8, 64), (8, 128))


def _grid_cases():
    cases = []
    for si, (n, k) in enumerate(GRID_SHAPES):
        for qi, (bits, g) in enumerate(GRID_QUANT):
            for mi, m in enumerate(GRID_M):
                i = si + qi + mi  # cycles dtype, zero points and bias so every pair of them meets every (bits, group)
                cases.append((n, k, bits, g, m, ("bfloat16", "float16")[i % 2], (i // 2) % 2 == 0, (i // 4) % 2 == 0))
    return _in_shard(cases)


def _in_shard(cases: list) -> list:
    idx, count = _shard()
    return cases[idx::count]


def _shard() -> tuple[int, int]:
    shard = os.environ.get("QFUSE_GPU_SHARD", "0/1")
    idx, count = (int(v) for v in shard.split("/"))
    return idx, count


_WEIGHTS: dict = {}


def _gpu_problem(n, k, bits, g, m, dtype, asym, bias):
    key = (n, k, bits, g, dtype, asym)
    if key not in _WEIGHTS:  # weights are the slow part; reuse them across M
        _WEIGHTS.clear()
        _WEIGHTS[key] = make_problem(1, n, k, bits, g, dtype, asym, True, device="cuda")[1:]
    qw, s, z, b = _WEIGHTS[key]
    x = torch.randn(m, k, device="cuda").to(dtype)
    return x, qw, s, z, b if bias else None


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,bits,group_size,m,dtype,asym,bias", _grid_cases())
def test_gpu_grid(n, k, bits, group_size, m, dtype, asym, bias):
    x, qw, s, z, b = _gpu_problem(n, k, bits, group_size, m, getattr(torch, dtype), asym, bias)
    out = torch.ops.qfuse.wna16_gemm(x, qw, s, z, b, bits, group_size)
    assert_close_to_ref(out, x, qw, s, z, b, bits, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group_size,m", _in_shard([(b, g, m) for b, g in [(4, 128), (4, -1), (8, -1), (8, 32)] for m in (1, 3, 16, 128)]))
def test_gpu_every_candidate(bits, group_size, m):
    x, qw, s, z, b = make_problem(m, 4096, 4096, bits, group_size, torch.bfloat16, True, True, device="cuda")
    for cfg in candidate_configs(m, 4096, 4096, bits, group_size, dtype=torch.bfloat16):  # bf16: the HFMA2 forms too
        assert_close_to_ref(run_config(cfg, x, qw, s, z, b, bits, group_size), x, qw, s, z, b, bits, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("bits,group_size,asym,dtype", _in_shard([(*c, d) for c in DEQUANT_CASES for d in (torch.bfloat16, torch.float16)]))
def test_gpu_dequant_kernel_bit_exact(bits, group_size, asym, dtype):
    _check_dequant(bits, group_size, asym, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("m", _in_shard([1, 16, 512]))
def test_gpu_cuda_graph_capture(m):
    x, qw, s, z, b = make_problem(m, 4096, 4096, 4, 128, torch.bfloat16, False, True, device="cuda")
    eager = torch.ops.qfuse.wna16_gemm(x, qw, s, z, b, 4, 128)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.qfuse.wna16_gemm(x, qw, s, z, b, 4, 128)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert_close_to_ref(out, x, qw, s, z, b, 4, 128)
    assert not torch.equal(out, eager)


def test_shipped_configs_are_candidates():
    """Every shipped H200 config is in the (exhaustive) candidate space of its key, not opt-in, and carries
    every meta-parameter of its family's offered configs (else pick_config refuses it: ``lacks_keys``)."""
    from pathlib import Path

    import qfuse.ops
    from qfuse.ops._autotune import lacks_keys

    table = json.loads((Path(qfuse.ops.__file__).with_name("tuned") / "wna16_gemm.NVIDIA_H200.json").read_text())
    assert table
    for key, cfg in table.items():
        op, gpu, mb, n, k, group, dtype, bits = key.split("|")
        assert op == "wna16_gemm" and gpu == "NVIDIA_H200" and dtype in ("bfloat16", "float16")
        assert cfg in candidate_configs(int(mb), int(n), int(k), int(bits), int(group), exhaustive=True, dtype=getattr(torch, dtype)), key
        assert not is_experimental(cfg, int(bits)), key  # what ships runs without QFUSE_EXPERIMENTAL_KERNELS
        assert not lacks_keys(cfg, usable_configs(int(mb), int(n), int(k), int(bits), int(group), dtype=getattr(torch, dtype))), key


def test_offered_wgmma_configs_keep_their_registers_untouched_in_sass():
    """sm_90 SASS (no GPU) of every config the op may pick without QFUSE_EXPERIMENTAL_KERNELS in the
    wgmma families (tiled_planes, mma_words, tiled_tma) at three keys: no instruction writes a register
    of a wgmma still in flight (PTX leaves the result undefined: the former 8-bit TMA path's wrong
    results on the H200, ops/wna16/tma.py). The control: tiled_planes' JOIN form at 16 x 64 x 128
    split 2, opt-in because ptxas does exactly that there (is_experimental) with triton 3.6-3.8."""
    from ._sm90_scripts import run_sm90_script_per_case

    join = '{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 2, "SWAP_AB": true, "JOIN": true, "PLANES": 4, "num_warps": 4, "num_stages": 3}'
    assert is_experimental({"kernel": "tiled_planes", **json.loads(join)}, 4)
    assert not any(c.get("JOIN") for c in usable_configs(16, 4096, 4096, 4, -1))
    cases = [
        "offered,4,bf16,-1,0,16,4096,4096",
        "offered,4,bf16,128,0,64,4096,4096",
        "offered,8,fp16,128,1,256,4096,4096",
        f"planessass,bf16,-1,{join}",
    ]  # M = 64: the WORDS TMA tiles offered there too
    lines = run_sm90_script_per_case("_compile_sm90.py", cases).splitlines()
    offered = [line for line in lines if line.startswith("compiled offered,")]
    kinds = {f for line in offered for f in ("tiled_planes", "mma_words", "tiled_tma") if f'"kernel": "{f}"' in line}
    assert len(offered) >= 60 and kinds == {"tiled_planes", "mma_words", "tiled_tma"}, lines
    assert any('"WORDS": true' in line for line in offered), lines
    assert all(line.endswith(" hazards 0") for line in offered), [line for line in offered if not line.endswith(" hazards 0")]
    control = lines[-1]
    assert control.startswith("compiled planessass,"), control
    import triton

    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9):  # 3.9 compiles the JOIN form without the write (seen)
        assert " hazards 0" not in control, control  # the detector's own cases: tests/qfuse/bench/test_sass.py
