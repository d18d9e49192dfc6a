"""The Triton kernel of ``qfuse::w8a8_gemm`` against its reference kernel.

Tolerance: none. The int32 accumulator is exact, and the kernel's float epilogue does
the reference's operations in the reference's order (``(acc * x_scale) * w_scale + bias``,
FMA contraction off, bf16 rounded to nearest even), so outputs are compared bit for bit.
On CPU the kernel runs under the Triton interpreter (small shapes, explicit configs).
"""

import pytest
import torch

from qfuse.ops._int_matmul import int8_matmul_nt
from qfuse.ops.int8.dispatch import EAGER_MAX_M, candidate_configs, int8_gemm, normalize, run_int8_gemm
from qfuse.ops.int8.gemv8 import gemv8_configs, gemv8_supported
from qfuse.ops.int8.tile import tile_config
from qfuse.ops.int8.tma import tma_configs
from qfuse.ops.w8a8_gemm import w8a8_gemm_ref

DTYPES = (torch.bfloat16, torch.float16)


def make_w8a8(m, n, k, device="cpu", per_token=True, per_channel=True, bias=True, out_dtype=torch.bfloat16):
    xq = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=device)
    wq = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device)
    x_scale = (torch.rand(m, 1, device=device) + 0.05) / 64 if per_token else torch.rand(1, device=device) / 64 + 1e-3
    w_scale = (torch.rand(n, device=device) + 0.05) / 64 if per_channel else torch.rand(1, device=device) / 64 + 1e-3
    b = torch.randn(n, device=device).to(out_dtype) if bias else None
    return xq, x_scale, wq, w_scale, b


def kernel_acc(xq, w, *, w4=False, group_scale=None, config):
    """The kernel's int32 accumulator: unit scales, float32 output (exact while |acc| <= 2**24)."""
    one = torch.ones(1, device=xq.device)
    out = run_int8_gemm(xq, one, w, one, group_scale, None, torch.float32, w4=w4, config=config)
    assert out.abs().max() <= 2**24  # every integer up to 2**24 is a float32
    return out.to(torch.int32)


def assert_bitwise(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    if not torch.equal(out, ref):
        d = (out.float() - ref.float()).abs()
        raise AssertionError(f"{int((d > 0).sum())} of {d.numel()} outputs differ, max |diff| {d.max().item():.3g}")


# --------------------------------------------------------------- CPU: Triton interpreter


@pytest.mark.parametrize("m", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("split_k", [1, 3])
def test_accumulator_exact(m, split_k):
    n, k = 40, 200  # odd N tile, K not a multiple of BLOCK_K: masked tails
    xq, _, wq, _, _ = make_w8a8(m, n, k)
    acc = kernel_acc(xq, wq, config=tile_config(16, 32, 64, split_k))
    assert torch.equal(acc, int8_matmul_nt(xq, wq))


def test_accumulator_extremes():
    """All -128: the largest |acc| per product (2**14); K = 1024 keeps float32(acc) exact."""
    xq = torch.full((3, 1024), -128, dtype=torch.int8)
    wq = torch.full((32, 1024), -128, dtype=torch.int8)
    wq[::2] = 127
    acc = kernel_acc(xq, wq, config=tile_config(16, 32, 256, 2))
    assert torch.equal(acc, int8_matmul_nt(xq, wq))
    assert acc.abs().max() == 1024 * 2**14


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_scale_variants_match_reference(per_token, per_channel, out_dtype):
    args = make_w8a8(7, 48, 256, per_token=per_token, per_channel=per_channel, out_dtype=out_dtype)
    out = run_int8_gemm(*args[:4], None, args[4], out_dtype, w4=False, config=tile_config(16, 32, 128, 2))
    assert_bitwise(out, w8a8_gemm_ref(*args, out_dtype))


@pytest.mark.parametrize("m,n,k", [(1, 24, 96), (17, 56, 160), (33, 40, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_odd_shapes_match_reference(m, n, k, bias):
    args = make_w8a8(m, n, k, bias=bias)
    out = run_int8_gemm(*args[:4], None, args[4], torch.bfloat16, w4=False, config=tile_config(16, 32, 64, 1))
    assert_bitwise(out, w8a8_gemm_ref(*args, torch.bfloat16))


def test_heuristic_config_on_cpu():
    """The launcher's own config choice (first candidate) runs and matches."""
    args = make_w8a8(5, 64, 512)
    out = int8_gemm("w8a8_gemm", *args[:4], None, args[4], torch.float16, w4=False)
    assert_bitwise(out, w8a8_gemm_ref(*args, torch.float16))


def test_candidates_are_legal():
    for m in (1, 2, 7, 16, 33, 64, 128, 512, 2048, 4096):
        for n, k in ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (40, 96)):
            for gs in (-1, 128):
                for c in candidate_configs(m, n, k, gs, 132, w4=gs != -1, gpu=False):
                    assert c["BLOCK_M"] >= 16 and c["BLOCK_N"] >= 16 and c["SPLIT_K"] >= 1
                    if gs == 128:
                        assert 128 % c["BLOCK_K"] == 0


def gemv8_cfg(bm, bn, bw, split, prefetch=0):
    return {
        "kernel": "gemv8",
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_W": bw,
        "SPLIT_K": split,
        "num_warps": 4,
        "num_stages": 2,
        "DP4A_ASM": 0,
        "PREFETCH": prefetch,
    }


# the dp4a GEMV (ops/int8/gemv8.py) under the interpreter, dp4a spelled in shifts and masks;
# tiles of 8 words (32 k)
@pytest.mark.parametrize(
    "m,bm,split,prefetch,per_token,out_dtype,k",
    [
        (1, 1, 1, 0, True, torch.bfloat16, 384),
        (2, 2, 3, 1, False, torch.float16, 384),  # 384 / 3 = 128 k per split
        (7, 4, 2, 1, True, torch.bfloat16, 128),  # two token tiles, the second past M; 2 tiles per split
    ],
)
def test_gemv8_matches_reference(m, bm, split, prefetch, per_token, out_dtype, k):
    xq, xs, wq, ws, b = make_w8a8(m, 40, k, per_token=per_token, out_dtype=out_dtype)
    out = run_int8_gemm(xq, xs, wq, ws, None, b, out_dtype, w4=False, config=gemv8_cfg(bm, 32, 2, split, prefetch))
    assert_bitwise(out, w8a8_gemm_ref(xq, xs, wq, ws, b, out_dtype))


def test_gemv8_accumulator_extremes():
    xq = torch.full((2, 1024), -128, dtype=torch.int8)
    wq = torch.full((32, 1024), -128, dtype=torch.int8)
    wq[::2] = 127
    acc = kernel_acc(xq, wq, config=gemv8_cfg(2, 32, 4, 2))
    assert torch.equal(acc, int8_matmul_nt(xq, wq)) and acc.abs().max() == 1024 * 2**14


def test_gemv8_candidates_are_extra():
    assert not gemv8_supported(40, gemv8_cfg(1, 32, 1, 1)) and gemv8_supported(64, gemv8_cfg(1, 32, 4, 1))
    for m in (1, 2, 4, 8, 16, 64):
        for n, k in SHAPES:
            old = candidate_configs(m, n, k, -1, 132, w4=False, gpu=False)
            new = candidate_configs(m, n, k, -1, 132, w4=False, gpu=True)
            assert new[: len(old)] == old
            tma = [dict(c, kernel="tma") for c in tma_configs(m, k)]  # the TMA kernel's (tests/ops/test_int8_gemm_tma.py), then the GEMV's
            assert new[len(old) : len(old) + len(tma)] == tma
            extra = new[len(old) + len(tma) :]
            assert bool(extra) == (m <= 8) and all(c["kernel"] == "gemv8" and gemv8_supported(k, c) for c in extra)


# --------------------------------------------------------------- GPU grid (H200)

SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (8192, 8192)]
ODD_SHAPES = [(1000, 4104), (72, 3000), (8200, 136)]
GRID_M = [1, 2, 7, 16, 33, 64, 128, 512, 2048, 4096]


@pytest.fixture
def no_tuning(monkeypatch):
    """Shipped configs, else the heuristic one: the grid checks numerics, not speed."""
    monkeypatch.setenv("QFUSE_AUTOTUNE", "0")


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", SHAPES + ODD_SHAPES)
@pytest.mark.parametrize("m", GRID_M)
def test_gpu_grid(m, n, k, no_tuning):
    bias = (n, k) in ODD_SHAPES  # the five model shapes run the benchmark's variant (no bias): shared compiles
    args = make_w8a8(m, n, k, device="cuda", bias=bias)
    out = torch.ops.qfuse.w8a8_gemm(*args, torch.bfloat16)
    assert_bitwise(out, w8a8_gemm_ref(*args, torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("m", [16])
def test_gpu_scale_variants(m, per_token, per_channel, out_dtype, no_tuning):
    args = make_w8a8(m, 4096, 4096, device="cuda", per_token=per_token, per_channel=per_channel, out_dtype=out_dtype)
    out = torch.ops.qfuse.w8a8_gemm(*args, out_dtype)
    assert_bitwise(out, w8a8_gemm_ref(*args, out_dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
def test_gpu_every_candidate(m):
    """Every candidate config (split-K ones race their int32 partials for real here)."""
    n, k = 6144, 4096
    xq, xs, wq, ws, _ = make_w8a8(m, n, k, device="cuda", bias=False)
    ref = w8a8_gemm_ref(xq, xs, wq, ws, None, torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cfg in candidate_configs(m, n, k, -1, sms, w4=False, gpu=False) + [tile_config(16, 64, 256, 16)]:
        assert_bitwise(run_int8_gemm(xq, xs, wq, ws, None, None, torch.bfloat16, w4=False, config=cfg), ref)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture(no_tuning):
    args = make_w8a8(4, 4096, 4096, device="cuda")
    expected = torch.ops.qfuse.w8a8_gemm(*args, torch.bfloat16)  # eager call first: config chosen
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.qfuse.w8a8_gemm(*args, torch.bfloat16)
    args[0].copy_(torch.randint(-128, 128, args[0].shape, dtype=torch.int8, device="cuda"))
    graph.replay()
    assert_bitwise(out, w8a8_gemm_ref(*args, torch.bfloat16))
    assert not torch.equal(out, expected)


@pytest.mark.gpu
def test_gpu_rejects_bad_input():
    xq, xs, wq, ws, b = make_w8a8(4, 64, 128, device="cuda")
    with pytest.raises(TypeError):
        torch.ops.qfuse.w8a8_gemm(xq.float(), xs, wq, ws, b, torch.bfloat16)
    with pytest.raises(ValueError):
        torch.ops.qfuse.w8a8_gemm(xq, xs, wq[:, :64], ws, b, torch.bfloat16)
    with pytest.raises(ValueError):
        torch.ops.qfuse.w8a8_gemm(xq, xs[:2], wq, ws, b, torch.bfloat16)


@pytest.mark.parametrize("op", ["w8a8_gemm", "w4a8_gemm", "w8a8_gemm_eager"])
def test_shipped_configs_are_candidates(op):
    """Every shipped H200 config is in the candidate space of its key (no stale or hand-typo'd entry) and
    carries every meta-parameter of its family's offered configs (else pick_config refuses it: ``lacks_keys``);
    the eager picks (int8_gemm's outside-a-graph choice) are no TMA configs, for decode buckets only."""
    import json
    from pathlib import Path

    import qfuse.ops
    from qfuse.ops._autotune import lacks_keys
    from qfuse.ops.int8.dispatch import REGISTRY, problem, uses_tma

    path = Path(qfuse.ops.__file__).with_name("tuned") / f"{op}.NVIDIA_H200.json"
    table = json.loads(path.read_text())
    assert table
    for key, cfg in table.items():
        name, gpu, mb, n, k, *gs = key.split("|")
        assert name == op and gpu == "NVIDIA_H200"
        cands = candidate_configs(
            int(mb), int(n), int(k), int(gs[0]) if gs else -1, 132, w4=op == "w4a8_gemm", gpu=True
        )  # the GPU candidate space, GEMVs included
        assert cfg == normalize(cfg), key  # stored in the one spelling: "kernel" names the family
        norm = lambda c: c if c["kernel"] == "gemv" else dict(c, UNPACK_ASM=c.get("UNPACK_ASM", 0))  # noqa: E731 - the GEMV has no unpack switch
        assert any(norm(c) == norm(cfg) for c in cands), key
        offered = REGISTRY.offered(problem(int(mb), int(n), int(k), int(gs[0]) if gs else -1, 132, w4=op == "w4a8_gemm", gpu=True))
        assert not lacks_keys(cfg, [c for c in offered if not uses_tma(c)] if op.endswith("_eager") else offered), key
        if op.endswith("_eager"):
            assert cfg["kernel"] != "tma" and not cfg.get("TMA") and int(mb) <= EAGER_MAX_M, key


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", SHAPES + [(1000, 4096), (72, 3072)])  # ODD_SHAPES' K are not multiples of 16
def test_gpu_gemv8_every_config(n, k):
    """Every W8A8 GEMV candidate (inline-PTX dp4a) bit for bit against the reference."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m in (1, 2, 3, 8):
        xq, xs, wq, ws, b = make_w8a8(m, n, k, device="cuda", bias=n == 1000)
        ref = w8a8_gemm_ref(xq, xs, wq, ws, b, torch.bfloat16)
        cfgs = [{"kernel": "gemv8", **c} for c in gemv8_configs(m, n, k, sms, asm=True)]
        assert cfgs
        for cfg in cfgs:
            assert_bitwise(run_int8_gemm(xq, xs, wq, ws, None, b, torch.bfloat16, w4=False, config=cfg), ref)
