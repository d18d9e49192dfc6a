"""The TMA-fed int8 kernel (ops/int8/tma.py), W8A8 and W4A8, against the reference, bit for bit.

On CPU it runs under the Triton interpreter, which models the descriptors' zero fill past
the tensor's edge; on the GPU (``-m gpu``) every candidate config at real shapes.
"""

import pytest
import torch

from qfuse.ops._int_matmul import int8_matmul_nt
from qfuse.ops.int8.dispatch import candidate_configs, run_int8_gemm
from qfuse.ops.int8.tile import tile_config
from qfuse.ops.int8.tma import tma_configs
from qfuse.ops.w4a8_gemm import w4a8_gemm_ref
from qfuse.ops.w8a8_gemm import w8a8_gemm_ref

from .._sm90_scripts import run_sm90_script
from ..test_w4a8_gemm_kernel import make_w4a8
from ..test_w8a8_gemm_kernel import assert_bitwise, kernel_acc, make_w8a8


def tma_cfg(bm=16, bn=32, bk=64, persistent=0, programs=None):
    cfg = dict(tile_config(bm, bn, bk, 1, 4, 2), kernel="tma", PERSISTENT=persistent)
    return dict(cfg, PROGRAMS=programs) if programs else cfg


# --------------------------------------------------------------- CPU: Triton interpreter


@pytest.mark.parametrize("m", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("programs", [None, 3])  # one program per tile; 3 programs walking 6-15 tiles
def test_accumulator_exact(m, programs):
    n, k = 72, 208  # N past the last 32-row tile, K past the last 64-deep tile: zero-filled edges
    xq, _, wq, _, _ = make_w8a8(m, n, k)
    acc = kernel_acc(xq, wq, config=tma_cfg(persistent=1 if programs else 0, programs=programs))
    assert torch.equal(acc, int8_matmul_nt(xq, wq))


def test_accumulator_extremes():
    """All -128 against +-127 / -128: |acc| reaches K * 2**14 (K = 1024 keeps float32(acc) exact)."""
    xq = torch.full((3, 1024), -128, dtype=torch.int8)
    wq = torch.full((32, 1024), -128, dtype=torch.int8)
    wq[::2] = 127
    acc = kernel_acc(xq, wq, config=tma_cfg(bk=128))
    assert torch.equal(acc, int8_matmul_nt(xq, wq))
    assert acc.abs().max() == 1024 * 2**14


@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_scale_variants_match_reference(per_token, per_channel, out_dtype):
    args = make_w8a8(7, 48, 256, per_token=per_token, per_channel=per_channel, out_dtype=out_dtype)
    out = run_int8_gemm(*args[:4], None, args[4], out_dtype, w4=False, config=tma_cfg(persistent=1, programs=2))
    assert_bitwise(out, w8a8_gemm_ref(*args, out_dtype))


@pytest.mark.parametrize("m,n,k,bias", [(1, 24, 96, True), (17, 56, 160, False), (40, 40, 64, True)])
def test_odd_shapes_match_reference(m, n, k, bias):
    args = make_w8a8(m, n, k, bias=bias)
    out = run_int8_gemm(*args[:4], None, args[4], torch.bfloat16, w4=False, config=tma_cfg(bm=32))
    assert_bitwise(out, w8a8_gemm_ref(*args, torch.bfloat16))


def test_misaligned_activation_is_copied():
    """A row slice whose data starts 16 bytes + 1 in: the descriptor needs a 16-byte aligned base."""
    xq_big, xs, wq, ws, b = make_w8a8(5, 32, 128)
    xq = torch.randint(-128, 128, (5 * 128 + 1,), dtype=torch.int8)[1:].view(5, 128)
    assert xq.data_ptr() % 16 != 0
    out = run_int8_gemm(xq, xs, wq, ws, None, b, torch.bfloat16, w4=False, config=tma_cfg())
    assert_bitwise(out, w8a8_gemm_ref(xq, xs, wq, ws, b, torch.bfloat16))


def test_rejects_what_it_cannot_take():
    xq, xs, wq, ws, _ = make_w8a8(2, 32, 200)  # K % 16 != 0: no 16-byte row stride
    with pytest.raises(ValueError, match="multiple of 16"):
        run_int8_gemm(xq, xs, wq, ws, None, None, torch.bfloat16, w4=False, config=tma_cfg())
    assert tma_configs(2, 200) == []
    xq4, xs4, qw, ws4, _, _ = make_w4a8(2, 32, 208)  # K % 32 != 0: packed rows of 104 bytes
    with pytest.raises(ValueError, match="multiple of 32"):
        run_int8_gemm(xq4, xs4, qw, ws4, None, None, torch.bfloat16, w4=True, config=tma_cfg())
    xq4, xs4, qw, ws4, gs, _ = make_w4a8(2, 32, 256, 128)
    with pytest.raises(ValueError, match="BLOCK_K dividing it"):
        run_int8_gemm(xq4, xs4, qw, ws4, gs, None, torch.bfloat16, w4=True, config=tma_cfg(bk=256))


@pytest.mark.parametrize(
    "m,n,k,group_size,per_token,out_dtype",
    [
        (70, 40, 224, -1, True, torch.bfloat16),  # K tail: 224 = 3.5 tiles of 64; zero bytes unpack to -8 there
        (33, 72, 256, 128, False, torch.float16),  # two groups of 128, N tail
        (5, 24, 384, 128, True, torch.bfloat16),
    ],
)
def test_w4_matches_reference(m, n, k, group_size, per_token, out_dtype):
    """The W4A8 form: packed bytes through the descriptor, unpacked into the MMA's B operand."""
    xq, xs, qw, ws, gs, b = make_w4a8(m, n, k, group_size, per_token=per_token, out_dtype=out_dtype)
    out = run_int8_gemm(xq, xs, qw, ws, gs, b, out_dtype, w4=True, config=tma_cfg(programs=2 if m > 16 else None, persistent=int(m > 16)))
    assert_bitwise(out, w4a8_gemm_ref(xq, xs, qw, ws, gs, b, group_size, out_dtype))


def test_w4_accumulator_extremes():
    """All codes 0 (u - 8 = -8) times group scale 16 against -128: |acc| = K * 2**14, the bound."""
    k = 1024
    xq = torch.full((3, k), -128, dtype=torch.int8)
    qw = torch.zeros(32, k // 2, dtype=torch.uint8)
    gs = torch.full((32, k // 128), 16, dtype=torch.int8)
    one = torch.ones(1)
    out = run_int8_gemm(xq, one, qw, one, gs, None, torch.float32, w4=True, config=tma_cfg(bk=128))
    assert torch.equal(out, torch.full((3, 32), float(k * 2**14)))


def test_offered_where_it_applies():
    """GPU candidate lists: W8A8 gets the TMA configs after the pointer kernel's (so the heuristic
    first choice is unchanged); W4A8 gets its own form at M > 64, and the W8A8 form behind the
    int4 -> int8 weight pass."""
    for m in (1, 16, 64, 256, 2048):
        cands = candidate_configs(m, 6144, 4096, -1, 132, w4=False, gpu=True)
        assert cands[0]["kernel"] != "tma" and [c for c in cands if c["kernel"] == "tma"] == [dict(c, kernel="tma") for c in tma_configs(m, 4096)]
        for gs in (-1, 128):
            w4 = candidate_configs(m, 6144, 4096, gs, 132, w4=True, gpu=True)
            assert w4[0]["kernel"] != "tma"
            assert [c for c in w4 if c["kernel"] == "tma"] == [dict(c, kernel="tma", UNPACK_ASM=1) for c in tma_configs(m, 4096, gs, w4=True)]
            assert bool(tma_configs(m, 4096, gs, w4=True)) == (m > 64)
            assert all(128 % c["BLOCK_K"] == 0 for c in w4 if c["kernel"] == "tma" and gs == 128)
    assert any(c.get("TMA") and c["kernel"] == "w8" for c in candidate_configs(2048, 6144, 4096, 128, 132, w4=True, gpu=True))
    assert not any(
        c["kernel"] == "tma" or c.get("TMA") for c in candidate_configs(2048, 6144, 4096, 128, 132, w4=True, gpu=True, tma=False)
    )  # before Hopper
    assert tma_configs(256, 4112, w4=True) == [] and tma_configs(256, 4112)  # packed rows of K / 2 bytes: K % 32
    for m in (1, 16, 33, 64, 256, 1024):
        for c in tma_configs(m, 4096):
            assert c["SPLIT_K"] == 1 and c["BLOCK_M"] >= 16 and c["PERSISTENT"] in (0, 1)


def test_folded_group_scale_layout_sm90():
    """The folded group-scale PTX takes one scale per register of four packed codes: right only if
    Triton gives those four bytes one row. Compiled for sm_90 with the installed Triton (no GPU),
    every W4A8 TMA tile's asm operand must have registers 0-3 along K (tests/ops/_tma_w4_layout_sm90.py;
    the tile kernel's register-operand layout, which failed on the H200, does not pass this check)."""
    tiles = sorted({(c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_warps"], c["num_stages"]) for c in tma_configs(1024, 4096, 128, w4=True)})
    cases = [",".join(map(str, t)) for t in tiles]
    stdout = run_sm90_script("_tma_w4_layout_sm90.py", cases)
    lines = stdout.splitlines()
    assert len(lines) == len(cases) and all(line.endswith(" ok") for line in lines), stdout


@pytest.mark.parametrize(
    "m,capturing,expected",
    [
        (16, False, "eager"),  # decode outside a graph: the pick without TMA (cheaper launch)
        (16, True, "graph"),  # under capture: the graph-timed pick
        (1024, False, "graph"),  # M bucket > EAGER_MAX_M: the launch cost is hidden behind the kernel
    ],
)
def test_eager_decode_takes_the_pick_without_tma(monkeypatch, m, capturing, expected):
    """int8_gemm's dispatch: a TMA pick for a decode bucket is swapped for ``<op>_eager``'s pick
    (built from the non-TMA candidates) when no CUDA graph is being captured."""
    import qfuse.ops.int8.dispatch as dispatch

    tile = dict(tile_config(16, 32, 64), kernel="tile")
    picks = {"w8a8_gemm": dict(tma_cfg(), TAG="graph"), "w8a8_gemm_eager": dict(tile, TAG="eager")}
    seen = {}

    def fake_pick(op, key, cands, run, device, usable=None):
        if op.endswith("_eager"):
            seen["eager_cands"] = cands()
        return picks[op]

    class FakeRegistry:
        def offered(self, p):
            return [tma_cfg(), tile]

        def run(self, cfg, *args):
            return cfg["TAG"]

    monkeypatch.setattr(dispatch, "pick_config", fake_pick)
    monkeypatch.setattr(dispatch, "capturing", lambda: capturing)
    monkeypatch.setattr(dispatch, "REGISTRY", FakeRegistry())
    xq, xs, wq, ws, b = make_w8a8(m, 64, 128)
    assert dispatch.int8_gemm("w8a8_gemm", xq, xs, wq, ws, None, b, torch.bfloat16, w4=False) == expected
    if expected == "eager":
        assert seen["eager_cands"] == [tile]


# --------------------------------------------------------------- GPU (H200)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 33, 64, 256, 1024, 2048])
def test_gpu_every_tma_candidate(m):
    n, k = 6144, 4096
    xq, xs, wq, ws, _ = make_w8a8(m, n, k, device="cuda", bias=False)
    ref = w8a8_gemm_ref(xq, xs, wq, ws, None, torch.bfloat16)
    cfgs = tma_configs(m, k)
    assert cfgs
    for cfg in cfgs:
        assert_bitwise(run_int8_gemm(xq, xs, wq, ws, None, None, torch.bfloat16, w4=False, config=cfg), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(7, 1000, 4112), (2048, 1000, 4112), (300, 72, 3072), (4096, 8200, 144)])
def test_gpu_tma_odd_shapes(m, n, k):
    """Edges in every dimension: M, N and K tails the descriptors zero-fill; bias; per-tensor scales."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_token in (True, False):
        xq, xs, wq, ws, b = make_w8a8(m, n, k, device="cuda", per_token=per_token, per_channel=per_token)
        ref = w8a8_gemm_ref(xq, xs, wq, ws, b, torch.float16)
        for cfg in tma_configs(m, k) + [tma_cfg(128, 128, 128, 1, programs=sms + 3)]:
            assert_bitwise(run_int8_gemm(xq, xs, wq, ws, None, b, torch.float16, w4=False, config=cfg), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [65, 256, 1024, 2048])
@pytest.mark.parametrize("group_size", [-1, 128])
def test_gpu_every_w4_tma_candidate(m, group_size):
    """The W4A8 form with the inline-PTX unpack (what the GPU candidates use), on a real shape and an odd one."""
    for n, k in ((6144, 4096), (1000, 4128 if group_size == -1 else 4224)):  # odd: a K tail / 33 groups
        xq, xs, qw, ws, gs, b = make_w4a8(m, n, k, group_size, device="cuda", bias=n == 1000)
        ref = w4a8_gemm_ref(xq, xs, qw, ws, gs, b, group_size, torch.bfloat16)
        cfgs = [c for c in candidate_configs(m, n, k, group_size, 132, w4=True, gpu=True) if c["kernel"] == "tma"]
        assert cfgs
        for cfg in cfgs:
            assert_bitwise(run_int8_gemm(xq, xs, qw, ws, gs, b, torch.bfloat16, w4=True, config=cfg), ref)


@pytest.mark.gpu
def test_gpu_tma_cuda_graph_capture():
    xq, xs, wq, ws, b = make_w8a8(1024, 4096, 4096, device="cuda")
    cfg = tma_configs(1024, 4096)[1]  # persistent
    assert cfg["PERSISTENT"]
    run = lambda: run_int8_gemm(xq, xs, wq, ws, None, b, torch.bfloat16, w4=False, config=cfg)  # noqa: E731
    first = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    xq.copy_(torch.randint(-128, 128, xq.shape, dtype=torch.int8, device="cuda"))
    graph.replay()
    assert_bitwise(out, w8a8_gemm_ref(xq, xs, wq, ws, b, torch.bfloat16))
    assert not torch.equal(out, first)
