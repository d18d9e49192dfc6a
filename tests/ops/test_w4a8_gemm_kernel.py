"""The Triton kernel of ``qfuse::w4a8_gemm`` against its reference and the fake-quant math.

* Against the reference kernel: bit for bit (exact int32 accumulator over the exact int8
  operand ``w_int = (u - 8) * group_scale``, and the reference's float epilogue order).
* Against fake quantization (dequantize to the real weight, then matmul), computed in
  float64, where every product and sum of the integer parts is exact: the kernel output
  must equal that value up to the output dtype's rounding (half an ulp: relative 2**-8
  for bf16, 2**-11 for fp16), plus float32 epilogue rounding (a few 2**-24 of the
  magnitudes involved). This is the check QQQ's per-group kernel would fail (its fp16
  second-level scale is rounded inside the kernel), and it covers bf16, which QQQ lacks.
"""

import pytest
import torch

from qfuse.ops._int_matmul import int8_matmul_nt
from qfuse.ops.int4_packing import pack_int4
from qfuse.ops.int8.dispatch import candidate_configs, int8_gemm, run_int8_gemm
from qfuse.ops.int8.gemv import gemv_configs, gemv_supported, run_w4a8_gemv
from qfuse.ops.int8.int8_weight import w4_to_int8
from qfuse.ops.int8.mma_words import mma_words_configs
from qfuse.ops.int8.tile import tile_config
from qfuse.ops.w4a8_gemm import dequantize_w4a8, w4a8_gemm_ref, w4a8_int_weight

from .test_w8a8_gemm_kernel import SHAPES, assert_bitwise, kernel_acc

DTYPES = (torch.bfloat16, torch.float16)
HALF_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # half an ulp, relative, at the bottom of a binade


def make_w4a8(m, n, k, group_size=-1, device="cpu", per_token=True, bias=True, out_dtype=torch.bfloat16):
    xq = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=device)
    qweight = pack_int4(torch.randint(0, 16, (n, k), dtype=torch.uint8, device=device))
    x_scale = (torch.rand(m, 1, device=device) + 0.05) / 64 if per_token else torch.rand(1, device=device) / 64 + 1e-3
    w_scale = (torch.rand(n, device=device) + 0.05) / 512
    gs = torch.randint(1, 17, (n, k // group_size), dtype=torch.int8, device=device) if group_size != -1 else None
    b = torch.randn(n, device=device).to(out_dtype) if bias else None
    return xq, x_scale, qweight, w_scale, gs, b


def fake_quant_check(out, xq, x_scale, qweight, w_scale, gs, b, group_size):
    """``out`` vs (xq * x_scale) @ dequantize(w).T + bias in float64 (see the module docstring)."""
    w = dequantize_w4a8(qweight, w_scale, gs, group_size).double()
    x = xq.double() * x_scale.double().reshape(-1, 1)
    exact = x @ w.t()
    mag = x.abs() @ w.abs().t()
    if b is not None:
        exact = exact + b.double()
        mag = mag + b.double().abs()
    tol = HALF_ULP[out.dtype] * exact.abs() + 2.0**-20 * mag + 2.0**-24
    err = (out.double() - exact).abs()
    assert (err <= tol).all(), f"max err/tol {(err / tol).max().item():.3g}"


# --------------------------------------------------------------- CPU: Triton interpreter


@pytest.mark.parametrize("m", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("group_size", [-1, 128])
@pytest.mark.parametrize("split_k", [1, 2])
def test_accumulator_exact(m, group_size, split_k):
    n, k = 40, 384
    xq, _, qweight, _, gs, _ = make_w4a8(m, n, k, group_size)
    acc = kernel_acc(xq, qweight, w4=True, group_scale=gs, config=tile_config(16, 32, 64, split_k))
    assert torch.equal(acc, int8_matmul_nt(xq, w4a8_int_weight(qweight, gs, group_size)))


def test_accumulator_extremes():
    """u = 0 (q = -8) times group_scale 16 is w_int = -128, the int8 edge; xq = -128."""
    k = 1024
    xq = torch.full((2, k), -128, dtype=torch.int8)
    codes = torch.zeros((32, k), dtype=torch.uint8)
    codes[1::2] = 15  # q = 7, w_int = 112
    gs = torch.full((32, k // 128), 16, dtype=torch.int8)
    acc = kernel_acc(xq, pack_int4(codes), w4=True, group_scale=gs, config=tile_config(16, 32, 128, 1))
    assert torch.equal(acc, int8_matmul_nt(xq, w4a8_int_weight(pack_int4(codes), gs, 128)))
    assert acc.abs().max() == k * 2**14


@pytest.mark.parametrize("group_size", [-1, 128])
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("per_token", [True, False])
def test_matches_reference_and_fake_quant(group_size, out_dtype, per_token):
    args = make_w4a8(7, 48, 256, group_size, per_token=per_token, out_dtype=out_dtype)
    out = run_int8_gemm(*args[:5], args[5], out_dtype, w4=True, config=tile_config(16, 32, 128, 2))
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, out_dtype))
    fake_quant_check(out, *args, group_size)


@pytest.mark.parametrize("m,n,k", [(1, 24, 130), (17, 56, 98)])
def test_odd_shapes_per_channel(m, n, k):
    """K not a multiple of BLOCK_K (nor of 4): the packed tail is masked."""
    args = make_w4a8(m, n, k)
    out = run_int8_gemm(*args[:5], args[5], torch.bfloat16, w4=True, config=tile_config(16, 32, 64, 1))
    assert_bitwise(out, w4a8_gemm_ref(*args, -1, torch.bfloat16))


@pytest.mark.parametrize("group_size", [-1, 128])
def test_heuristic_config_on_cpu(group_size):
    args = make_w4a8(3, 64, 512, group_size)
    out = int8_gemm("w4a8_gemm", *args[:5], args[5], torch.bfloat16, w4=True, group_size=group_size)
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, torch.bfloat16))


def test_group_scale_is_applied_per_group():
    """A kernel that ignored or misplaced group scales would fail this (scales differ per group)."""
    xq, xs, qweight, ws, _, b = make_w4a8(2, 32, 512, 128)
    gs = torch.arange(1, 5, dtype=torch.int8).repeat(32, 1)  # group g has scale g + 1
    out = run_int8_gemm(xq, xs, qweight, ws, gs, b, torch.float16, w4=True, config=tile_config(16, 32, 64, 1))
    assert_bitwise(out, w4a8_gemm_ref(xq, xs, qweight, ws, gs, b, 128, torch.float16))
    flipped = run_int8_gemm(xq, xs, qweight, ws, gs.flip(1).contiguous(), b, torch.float16, w4=True, config=tile_config(16, 32, 64, 1))
    assert not torch.equal(out, flipped)


@pytest.mark.parametrize("group_size", [64, 32])
@pytest.mark.parametrize("m,gs_partial,split_k", [(1, 0, 2), (7, 1, 1), (16, 1, 2), (33, 0, 1)])
def test_small_groups_accumulator_exact(m, group_size, gs_partial, split_k):
    """Groups of 64 / 32 (layers whose K 128 does not divide, K = 576 here as SmolLM2's hidden
    size): the tile kernel with BLOCK_K = the group, the scale in the operand or on the partial."""
    n, k = 40, 576
    xq, _, qweight, _, gs, _ = make_w4a8(m, n, k, group_size)
    cfg = tile_config(16, 32, group_size, split_k, gs_partial=gs_partial)
    acc = kernel_acc(xq, qweight, w4=True, group_scale=gs, config=cfg)
    assert torch.equal(acc, int8_matmul_nt(xq, w4a8_int_weight(qweight, gs, group_size)))


@pytest.mark.parametrize("group_size", [64, 32])
def test_small_groups_through_the_op_and_the_int8_weight_pass(group_size):
    """The heuristic pick at decode and prefill M, and the int8-weight pass + W8A8 kernel, bit for
    bit against the reference; the families that read groups of 128 only are not offered."""
    n, k = 48, 576
    for m in (2, 70):
        args = make_w4a8(m, n, k, group_size)
        out = int8_gemm("w4a8_gemm", *args, torch.bfloat16, w4=True, group_size=group_size)
        assert_bitwise(out, w4a8_gemm_ref(*args, group_size, torch.bfloat16))
    out = run_int8_gemm(*args, torch.bfloat16, w4=True, config=dict(tile_config(32, 32, 64, 1), kernel="w8"))
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, torch.bfloat16))
    fake_quant_check(out, *args, group_size)
    for m in (1, 2, 16, 64, 128, 4096):
        cands = candidate_configs(m, 4096, 4096 + 576, group_size, 132, w4=True, gpu=True)
        assert cands and not any(c["kernel"] in ("gemv", "mma_words", "tma") for c in cands)
        assert all(c["BLOCK_K"] <= group_size for c in cands if c["kernel"] != "w8")


def gemv_cfg(bm, bn, bw, split, prefetch=0):
    return {
        "kernel": "gemv",
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_W": bw,
        "SPLIT_K": split,
        "num_warps": 4,
        "num_stages": 2,
        "DP4A_ASM": 0,
        "PREFETCH": prefetch,
    }


@pytest.mark.parametrize("m", [1, 7, 33])
def test_group_partial_accumulator_exact(m):
    """GS_PARTIAL: int32 partial per 128-K tile times its group scale, split over K."""
    n, k = 40, 384
    xq, _, qweight, _, gs, _ = make_w4a8(m, n, k, 128)
    acc = kernel_acc(xq, qweight, w4=True, group_scale=gs, config=tile_config(16, 32, 64, 2, gs_partial=1))
    assert torch.equal(acc, int8_matmul_nt(xq, w4a8_int_weight(qweight, gs, 128)))


# GEMV (ops/int8/gemv.py) under the interpreter: the same data movement as on the GPU, with
# dp4a / prmt spelled in shifts and masks (DP4A_ASM=0). Each case is 1-3 s: few programs.
# K = 512: 4 tiles of 16 words, 2 per split at split 2; the 4-token tiles (4 dot products per
# word) take K = 256 (2 tiles): a split of one tile, and a prefetching loop of two.
@pytest.mark.parametrize(
    "m,bm,group_size,split,out_dtype,per_token,prefetch,k",
    [
        (1, 1, -1, 1, torch.bfloat16, True, 0, 512),
        (1, 1, 128, 2, torch.float16, True, 1, 512),
        (2, 2, 128, 1, torch.bfloat16, False, 1, 512),
        (2, 2, -1, 2, torch.float16, True, 0, 512),
        (7, 4, 128, 2, torch.bfloat16, True, 0, 256),  # two token tiles, the second past M
        (7, 4, -1, 1, torch.bfloat16, False, 1, 256),
    ],
)
def test_gemv_matches_reference_and_fake_quant(m, bm, group_size, split, out_dtype, per_token, prefetch, k):
    args = make_w4a8(m, 40, k, group_size, per_token=per_token, out_dtype=out_dtype)  # N = 40: a clamped row tile
    out = run_int8_gemm(*args, out_dtype, w4=True, config=gemv_cfg(bm, 32, 4, split, prefetch))
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, out_dtype))
    fake_quant_check(out, *args, group_size)


@pytest.mark.parametrize(
    "m,tile,group_size,split",
    [
        (1, (2, 32, 2), -1, 1),
        (2, (2, 32, 2), 128, 2),
        (1, (2, 64, 4), 128, 1),
        (2, (1, 64, 2), -1, 1),
        (1, (4, 16, 2), 128, 4),
    ],
)
def test_gemv_lane_tiles(m, tile, group_size, split):
    """The one-lane-per-thread tiles (ops/int8/gemv.py, _LANE_TILES): rows 1-4 a program, N = 9
    (the last program's rows past N: 1 of 2, 3 of 4), 512-1024 bytes of a row per tile."""
    bn, bw, warps = tile
    args = make_w4a8(m, 9, 2048, group_size)
    out = run_w4a8_gemv(*args, torch.bfloat16, config=dict(gemv_cfg(2 if m == 2 else 1, bn, bw, split), num_warps=warps))
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, torch.bfloat16))


def test_gemv_split_inside_a_group():
    """12 words per split: tiles start mid-group, so each tile must find its own group."""
    xq, xs, qweight, ws, gs, b = make_w4a8(2, 24, 384, 128)
    out = run_w4a8_gemv(xq, xs, qweight, ws, gs, b, torch.bfloat16, config=gemv_cfg(2, 16, 1, 4, prefetch=1))
    assert_bitwise(out, w4a8_gemm_ref(xq, xs, qweight, ws, gs, b, 128, torch.bfloat16))


def test_gemv_accumulator_extremes():
    """xq = -128 against w_int = -128 (u = 0, gs = 16) and 112 (u = 15): |acc| = K * 2**14, the
    largest per product, and the odd codes' byte 0xF0 * -128 in the dp4a of the high nibbles."""
    k = 1024
    xq = torch.full((1, k), -128, dtype=torch.int8)
    codes = torch.zeros((32, k), dtype=torch.uint8)
    codes[1::2] = 15
    gs = torch.full((32, k // 128), 16, dtype=torch.int8)
    one = torch.ones(1)
    out = run_w4a8_gemv(xq, one, pack_int4(codes), one, gs, None, torch.float32, config=gemv_cfg(1, 32, 4, 2))
    assert torch.equal(out.to(torch.int32), int8_matmul_nt(xq, w4a8_int_weight(pack_int4(codes), gs, 128)))
    assert out.abs().max() == k * 2**14


def test_gemv_unaligned_storage():
    """Operands at a storage offset that is not a multiple of 4 bytes (no int32 view) still run."""
    xq, xs, qweight, ws, _, _ = make_w4a8(1, 8, 128)
    xq_odd = torch.empty(129, dtype=torch.int8)[1:].view(1, 128)
    xq_odd.copy_(xq)
    qw_odd = torch.empty(8 * 64 + 2, dtype=torch.uint8)[2:].view(8, 64)
    qw_odd.copy_(qweight)
    out = run_w4a8_gemv(xq_odd, xs, qw_odd, ws, None, None, torch.bfloat16, config=gemv_cfg(1, 8, 1, 1))
    assert_bitwise(out, w4a8_gemm_ref(xq, xs, qweight, ws, None, None, -1, torch.bfloat16))
    assert torch.equal(w4_to_int8(qw_odd, None, block_n=8, block_w=8), w4a8_int_weight(qweight, None, -1))


@pytest.mark.parametrize("bw,split", [(8, 1), (16, 2)])
def test_gemv_tile_spanning_groups(bw, split):
    """32 / 64-word tiles span 2 / 4 groups of 128 codes: each 4-word column takes its own group's scale."""
    xq, xs, qweight, ws, gs, b = make_w4a8(2, 24, 1024, 128)
    out = run_w4a8_gemv(xq, xs, qweight, ws, gs, b, torch.bfloat16, config=gemv_cfg(2, 16, bw, split))
    assert_bitwise(out, w4a8_gemm_ref(xq, xs, qweight, ws, gs, b, 128, torch.bfloat16))


def test_gemv_rejects_what_it_cannot_tile():
    assert not gemv_supported(48, -1, gemv_cfg(1, 32, 1, 1))  # K % 32
    assert not gemv_supported(128, 128, gemv_cfg(1, 32, 8, 1))  # K = 16 words: not a whole 32-word tile
    assert gemv_supported(256, 128, gemv_cfg(1, 32, 8, 1))  # a 32-word tile spanning two groups
    assert gemv_supported(128, -1, gemv_cfg(1, 32, 4, 1)) and not gemv_supported(128, -1, gemv_cfg(1, 32, 4, 2))
    args = make_w4a8(1, 8, 48)
    with pytest.raises(ValueError):
        run_w4a8_gemv(*args[:5], None, torch.bfloat16, config=gemv_cfg(1, 32, 1, 1))


@pytest.mark.parametrize("group_size", [-1, 128])
def test_new_candidates_are_extra(group_size):
    """The GEMV / GS_PARTIAL / int8-weight-pass families come after the tile kernel's configs,
    only where they can run; every GEMV config tiles its K. The heuristic goes first: the GEMV's
    2-row x 32-column lane tile at M <= 2, the mma_words config (ops/int8/mma_words.py) to M = 64."""
    for m in (1, 2, 4, 8, 16, 64, 128):
        for n, k in SHAPES:
            if group_size != -1 and k % group_size:
                continue
            old = candidate_configs(m, n, k, group_size, 132, w4=True, gpu=False)
            new = candidate_configs(m, n, k, group_size, 132, w4=True, gpu=True)
            assert new[0]["kernel"] == ("gemv" if m <= 2 else "mma_words" if m <= 64 else "tile")
            if m <= 2:
                assert (new[0]["BLOCK_N"], new[0]["BLOCK_W"], new[0]["num_warps"]) == (2, 32, 2)
            start = new.index(old[0])
            assert start <= 1 + len(mma_words_configs(m, n, k, 132, group_size)) and new[start : start + len(old)] == old
            gemv = [c for c in new if c["kernel"] == "gemv"]
            assert bool(gemv) == (m <= 8) and all(gemv_supported(k, group_size, c) for c in gemv)
            assert any(c.get("GS_PARTIAL") for c in new) == (group_size == 128 and m <= 64)
            assert any(c["kernel"] == "w8" for c in new) == (m > 64)
    assert gemv_configs(16, 4096, 4096, -1, 132, asm=True) == []


@pytest.mark.parametrize("n,k,group_size", [(40, 512, 128), (33, 392, -1), (40, 576, 64), (17, 96, 32)])
def test_int8_weight_pass_exact(n, k, group_size):
    """The packed-arithmetic int4 -> int8 pass equals the reference's operand, extremes included."""
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    codes[0], codes[1] = 0, 15  # w_int -128 and 112 with gs = 16
    gs = torch.randint(1, 17, (n, k // group_size), dtype=torch.int8) if group_size != -1 else None
    if gs is not None:
        gs[:2] = 16
    qw = pack_int4(codes)
    assert torch.equal(w4_to_int8(qw, gs, block_n=16, block_w=16), w4a8_int_weight(qw, gs, group_size))


@pytest.mark.parametrize("group_size", [-1, 128])
def test_int8_weight_then_w8a8_matches_reference(group_size):
    args = make_w4a8(70, 48, 256, group_size)
    cfg = dict(tile_config(32, 32, 64, 1), kernel="w8")
    out = run_int8_gemm(*args, torch.bfloat16, w4=True, config=cfg)
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, torch.bfloat16))


_SASS_SCRIPT = r"""
import collections, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qfuse.ops.int8.gemv import _w4a8_gemv_kernel
sig = {"x_ptr": "*i32", "xs_ptr": "*fp32", "w_ptr": "*i32", "ws_ptr": "*fp32", "gs_ptr": "*i8", "bias_ptr": "*bf16",
       "out_ptr": "*bf16", "acc_ws_ptr": "*i32", "count_ptr": "*i32", "M": "i32", "N": "i32", "KW4": "i32",
       "W_PER_SPLIT": "i32", "G": "i32"}
nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
res = {}
for grouped in (False, True):
    consts = dict(GROUPED=grouped, X_PER_TOKEN=True, W_PER_CHANNEL=True, HAS_BIAS=False, BLOCK_M=1, BLOCK_N=256,
                  BLOCK_W=4, SPLIT=True, DP4A_ASM=True, PREFETCH=False)
    src = ASTSource(_w4a8_gemv_kernel, {**sig, **{k: "constexpr" for k in consts}}, consts,
                    attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        lines = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout.splitlines()
    best = None  # the hot loop: the longest region between a label and a backward branch to it
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\(\.L_x_(\d+)\)", line)
        j = next((j for j, l in enumerate(lines[:i]) if m and l.strip() == f".L_x_{m.group(1)}:"), None)
        if j is not None and (best is None or i - j > best[1] - best[0]):
            best = (j, i)
    body = [l for l in lines[best[0]:best[1] + 1] if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
    res[str(grouped)] = (len(body), sum("IDP.4A" in l for l in body))
print(json.dumps(res))
"""


def test_gemv_sass_budget():
    """The dp4a GEMV's sm_90 loop stays cheap: <= 2.5 instructions per weight byte at M = 1 (counted
    1.75 per-channel, 2.01 group 128, triton 3.7.1; the tile kernel: 5.7-6.7 and 6.5-27), using dp4a."""
    import json
    import os
    import subprocess
    import sys

    import triton

    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")):
        pytest.skip("triton's bundled nvdisasm is not available")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _SASS_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    bytes_per_iter = 256 * 4 * 16 / 128  # [BLOCK_N, BLOCK_W, 4] int32 words over 128 threads
    for grouped, (n_instr, n_dp4a) in json.loads(out.stdout.strip().splitlines()[-1]).items():
        assert n_dp4a >= 64, (grouped, n_dp4a)  # 8 rows x 4 words x (lo, hi) per thread at least
        assert n_instr / bytes_per_iter <= 2.5, (grouped, n_instr / bytes_per_iter)


# --------------------------------------------------------------- GPU grid (H200)

GRID_M = [1, 2, 7, 16, 33, 64, 128, 512, 2048, 4096]
ODD_SHAPES = [(1000, 4224), (72, 3072), (8200, 256)]  # K % 128 == 0 for the group-128 runs


@pytest.fixture
def no_tuning(monkeypatch):
    monkeypatch.setenv("QFUSE_AUTOTUNE", "0")


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [-1, 128])
@pytest.mark.parametrize("n,k", SHAPES + ODD_SHAPES)
@pytest.mark.parametrize("m", GRID_M)
def test_gpu_grid(m, n, k, group_size, no_tuning):
    out_dtype = torch.bfloat16  # fp16 and the other scale variants: test_gpu_fake_quant
    args = make_w4a8(m, n, k, group_size, device="cuda", bias=(n, k) in ODD_SHAPES, out_dtype=out_dtype)
    out = torch.ops.qfuse.w4a8_gemm(*args, group_size, out_dtype)
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, out_dtype))
    if m <= 64:  # float64 fake-quant at M = 4096 x 28672 x 4096 costs seconds per case
        fake_quant_check(out, *args, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,group_size,out_dtype", [(1, -1, torch.float16), (16, 128, torch.float16), (300, 128, torch.bfloat16), (300, -1, torch.float16)]
)
def test_gpu_fake_quant(m, group_size, out_dtype, no_tuning):
    args = make_w4a8(m, 4096, 4096, group_size, device="cuda", per_token=m != 16, out_dtype=out_dtype)
    out = torch.ops.qfuse.w4a8_gemm(*args, group_size, out_dtype)
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, out_dtype))
    fake_quant_check(out, *args, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("m", GRID_M)
@pytest.mark.parametrize("n,k", [(1536, 576), (576, 576), (4096, 4160)])
@pytest.mark.parametrize("group_size", [64, 32])
def test_gpu_grid_small_groups(group_size, n, k, m, no_tuning):
    """Groups of 64 / 32 at SmolLM2's K = 576 (and a large K 128 does not divide)."""
    args = make_w4a8(m, n, k, group_size, device="cuda", bias=n == 576)
    out = torch.ops.qfuse.w4a8_gemm(*args, group_size, torch.bfloat16)
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, torch.bfloat16))
    if m <= 64:
        fake_quant_check(out, *args, group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("group_size,k", [(-1, 14336), (128, 14336), (64, 14400)])
@pytest.mark.parametrize("m", [1, 16, 2048])
def test_gpu_every_candidate(m, group_size, k):
    n = 4096
    args = make_w4a8(m, n, k, group_size, device="cuda", bias=False)
    ref = w4a8_gemm_ref(*args, group_size, torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cfg in candidate_configs(m, n, k, group_size, sms, w4=True, gpu=True):  # the inline-PTX unpack runs here only
        assert_bitwise(run_int8_gemm(*args, torch.bfloat16, w4=True, config=cfg), ref)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture(no_tuning):
    args = make_w4a8(2, 4096, 4096, 128, device="cuda")
    torch.ops.qfuse.w4a8_gemm(*args, 128, torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.qfuse.w4a8_gemm(*args, 128, torch.bfloat16)
    args[0].copy_(torch.randint(-128, 128, args[0].shape, dtype=torch.int8, device="cuda"))
    graph.replay()
    assert_bitwise(out, w4a8_gemm_ref(*args, 128, torch.bfloat16))


@pytest.mark.gpu
def test_gpu_rejects_bad_input():
    xq, xs, qw, ws, gs, b = make_w4a8(4, 64, 256, 128, device="cuda")
    with pytest.raises(ValueError):
        torch.ops.qfuse.w4a8_gemm(xq, xs, qw, ws, gs, b, 64, torch.bfloat16)
    with pytest.raises(ValueError):
        torch.ops.qfuse.w4a8_gemm(xq, xs, qw, ws, None, b, 128, torch.bfloat16)
    with pytest.raises(TypeError):
        torch.ops.qfuse.w4a8_gemm(xq, xs, qw.to(torch.int8), ws, gs, b, 128, torch.bfloat16)


GEMV_M = [1, 2, 3, 8]  # token tiles of 1, 2, 4 (partly past M) and two tiles of 4


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [-1, 128])
@pytest.mark.parametrize("n,k", SHAPES + ODD_SHAPES)
def test_gpu_gemv_every_config(n, k, group_size):
    """Every GEMV candidate (inline-PTX dp4a / prmt) bit for bit against the reference."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m in GEMV_M:
        args = make_w4a8(m, n, k, group_size, device="cuda", bias=(n, k) in ODD_SHAPES)
        ref = w4a8_gemm_ref(*args, group_size, torch.bfloat16)
        cfgs = [{"kernel": "gemv", **c} for c in gemv_configs(m, n, k, group_size, sms, asm=True)]
        assert cfgs or k % 32  # every shape here but none tiles K = 98 / 130
        for cfg in cfgs:
            assert_bitwise(run_int8_gemm(*args, torch.bfloat16, w4=True, config=cfg), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [-1, 128])
def test_gpu_gemv_fake_quant_and_graph(group_size):
    args = make_w4a8(3, 4096, 4096, group_size, device="cuda", out_dtype=torch.float16)
    cfg = {"kernel": "gemv", **gemv_configs(3, 4096, 4096, group_size, 132, asm=True)[0]}
    assert cfg["SPLIT_K"] > 1  # the atomics + last-arrival epilogue path
    run = lambda: run_int8_gemm(*args, torch.float16, w4=True, config=cfg)  # noqa: E731
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    args[0].copy_(torch.randint(-128, 128, args[0].shape, dtype=torch.int8, device="cuda"))
    graph.replay()
    assert_bitwise(out, w4a8_gemm_ref(*args, group_size, torch.float16))
    fake_quant_check(out, *args, group_size)
