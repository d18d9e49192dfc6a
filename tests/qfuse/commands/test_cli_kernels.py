"""``qfuse kernels --explain``: the families considered, refused (with reasons) and picked, with the
pick's source, for a few shapes; errors in one line."""

import pytest

from qfuse import cli
from tests.helpers import OPT_IN_MMA_WORDS


@pytest.mark.parametrize(
    ("args", "picked", "source", "refused"),
    [
        (["1", "4096", "4096", "W4A16"], "'kernel': 'gemv_words'", "shipped table", "dequant_mm"),
        (["16", "28672", "4096", "W4A8_G128"], "'kernel': 'mma_words'", "shipped table", "gemv "),
        (["2048", "4096", "14336", "W8A8"], "'kernel': 'tma'", "shipped table", "gemv8"),
        (["1", "1536", "576", "W4A8_G64"], "'kernel': 'tile'", "untuned heuristic", "mma_words"),
        (["300", "1536", "576", "W4A16_G64_ASYM", "--no-tma"], "'kernel': 'tiled'", "untuned heuristic", "tiled_tma"),
    ],
)
def test_explain_prints_considered_refused_and_picked(capsys, monkeypatch, tmp_path, args, picked, source, refused):
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "none.json"))  # no user cache in the way
    assert cli.main(["kernels", "--explain", *args[:4], *args[4:], "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out
    assert "family" in out and "verdict" in out and picked in out and source in out
    line = next(line for line in out.splitlines() if line.strip().startswith(refused.strip()) and "refused" in line)
    assert len(line.split("refused", 1)[1].split()) > 2  # a reason follows the counts


def test_explain_shows_the_nearest_stored_pick_with_its_split(capsys, monkeypatch, tmp_path):
    """Llama-3-8B's k / v projection (1024 x 4096) at M = 16 has no shipped pick: without measuring,
    the 4096 x 4096 pick runs, its 4 splits of 32 tiles made 16 splits of 8 tiles."""
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "none.json"))
    assert cli.main(["kernels", "--explain", "16", "1024", "4096", "W4A16", "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "with QFUSE_AUTOTUNE=0" in line)
    assert "'kernel': 'mma_words'" in line and "'SPLIT_K': 16" in line and "'num_warps': 8" in line
    assert "nearest shape, N=4096 K=4096" in out


def test_explain_takes_the_user_cache_first(capsys, monkeypatch, tmp_path):
    import json

    cache = tmp_path / "autotune.json"
    cache.write_text(json.dumps({"w8a8_gemm|NVIDIA_H200|2048|4096|14336": {"kernel": "tile", "BLOCK_M": 128}}))
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(cache))
    cli.main(["kernels", "--explain", "2048", "4096", "14336", "W8A8", "--gpu", "NVIDIA_H200"])
    out = capsys.readouterr().out
    assert "the user cache" in out and "'BLOCK_M': 128" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["1", "4096", "4096", "W3A16"], "unknown quantization scheme"),
        (["1", "4096", "4000", "W4A16"], "not divisible"),
        (["x", "4096", "4096", "W4A16"], "must be integers"),
        (["0", "4096", "4096", "W4A16"], "positive"),
        (["16", "4096", "200000", "W8A8"], "exceeds 131071"),  # what quantize_model refuses is not explained
        (["1", "4096", "4097", "W4A16_CH"], "must be even"),
    ],
)
def test_explain_errors_in_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(["kernels", "--explain", *args])
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_sms_below_one_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["kernels", "--explain", "1", "4096", "4096", "W4A16", "--sms", "0"])
    assert exc.value.code == 2 and "argument --sms: must be an integer >= 1" in capsys.readouterr().err


def test_explain_moe(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "none.json"))
    assert cli.main(["kernels", "--explain", "16", "14336", "4096", "W4A16", "--moe", "8", "2", "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fused_moe  M=16 I=14336 H=4096 E=8 top_k=2")
    assert all(f"  {family} " in out for family in ("grouped", "gemv", "gemv_words", "grouped_words"))
    assert "'kernel': 'grouped_words'" in out and "the shipped table (ops/tuned/fused_moe.NVIDIA_H200.json)" in out
    assert cli.main(["kernels", "--explain", "3", "1024", "512", "W8A8", "--moe", "8", "2", "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out  # int8 activations: no gemv; a shape without a stored pick
    assert "weight-only quantized experts only" in out and "untuned heuristic" in out
    with pytest.raises(SystemExit, match="TOP_K must be in"):
        cli.main(["kernels", "--explain", "16", "14336", "4096", "W4A16", "--moe", "8", "9"])


def test_explain_reads_the_gpu_name_as_the_gpu_reports_it(capsys, monkeypatch, tmp_path):
    """--gpu "NVIDIA H200" (torch.cuda.get_device_name's spelling) finds the NVIDIA_H200 tables."""
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "none.json"))
    runs = []
    for gpu in ("NVIDIA_H200", "NVIDIA H200"):
        assert cli.main(["kernels", "--explain", "16", "28672", "4096", "W4A16", "--gpu", gpu]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] and "the shipped table (ops/tuned/wna16_gemm.NVIDIA_H200.json)" in runs[1]


def test_explain_moe_names_the_nearest_shape_by_experts_and_intermediate_size(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "none.json"))
    assert cli.main(["kernels", "--explain", "16", "4096", "4096", "W4A16", "--moe", "8", "2", "--gpu", "NVIDIA_H200"]) == 0
    assert "the stored pick of the nearest shape, E=8 I=14336" in capsys.readouterr().out


def test_explain_shows_the_untuned_eager_pick_and_the_float32_form(capsys, monkeypatch, tmp_path):
    """W8A8 1 x 14336 x 4096 has no shipped pick: without measuring, the op runs the nearest shape's
    TMA pick, and eagerly that shape's stored non-TMA pick; QFUSE_FP32_ACCUMULATE=1 runs an HFMA2
    pick's tile in float32."""
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "none.json"))
    assert cli.main(["kernels", "--explain", "1", "14336", "4096", "W8A8", "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out
    assert "'kernel': 'tma'" in next(line for line in out.splitlines() if "with QFUSE_AUTOTUNE=0 or under" in line)
    eager = out.split("eager (outside a CUDA graph", 1)[1]
    line = next(line for line in eager.splitlines() if "with QFUSE_AUTOTUNE=0:" in line)
    assert "'kernel': 'tile'" in line and "nearest shape, N=28672 K=4096" in line
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "1")
    assert cli.main(["kernels", "--explain", "1", "4096", "4096", "W4A16", "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out
    runs = next(line for line in out.splitlines() if line.strip().startswith("runs as:"))
    assert "'kernel': 'gemv_words'" in runs and "HFMA2" not in runs and "'HFMA2': 2" in out


def test_explain_does_not_name_a_stored_pick_the_op_refuses(capsys, monkeypatch, tmp_path):
    """A cached opt-in config (cached with QFUSE_EXPERIMENTAL_KERNELS=1) or one of a family this
    version lacks: the op warns and runs the shipped pick of the key, or chooses again where the
    table has none, so the cached config is not what --explain says runs."""
    import json

    opt_in = OPT_IN_MMA_WORDS
    cache = tmp_path / "autotune.json"
    refused = {
        "wna16_gemm|NVIDIA_H200|16|4096|4096|128|bfloat16|4": opt_in,
        "wna16_gemm|NVIDIA_H200|16|4096|4352|128|bfloat16|4": opt_in,  # a shape the table does not ship
        "w8a8_gemm|NVIDIA_H200|2048|4096|14336": {"kernel": "gone"},
    }
    cache.write_text(json.dumps(refused))
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(cache))
    monkeypatch.delenv("QFUSE_EXPERIMENTAL_KERNELS", raising=False)
    cases = (
        (["16", "4096", "4096", "W4A16"], "'MAXNREG': 128", True),
        (["16", "4096", "4352", "W4A16"], "'MAXNREG': 128", False),
        (["2048", "4096", "14336", "W8A8"], "'kernel': 'gone'", True),
    )
    for args, stored, shipped in cases:
        assert cli.main(["kernels", "--explain", *args, "--gpu", "NVIDIA_H200"]) == 0
        out = capsys.readouterr().out
        picked = next(line for line in out.splitlines() if line.strip().startswith("picked:"))
        source = next(line for line in out.splitlines() if line.strip().startswith("from:"))
        assert stored not in picked and "cannot run here" in out
        if shipped:
            assert "the shipped pick runs" in out and "the shipped table" in source
        else:
            assert "chosen again" in out and "untuned heuristic" in source
    monkeypatch.setenv("QFUSE_EXPERIMENTAL_KERNELS", "1")
    assert cli.main(["kernels", "--explain", "16", "4096", "4096", "W4A16", "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out
    assert "'MAXNREG': 128" in next(line for line in out.splitlines() if line.strip().startswith("picked:")) and "the user cache" in out


def test_explain_moe_shows_the_float32_form(capsys, monkeypatch, tmp_path):
    """fused_moe's word GEMV runs a shipped HFMA2 pick in float32 under QFUSE_FP32_ACCUMULATE=1, as the dense op does."""
    monkeypatch.setenv("QFUSE_AUTOTUNE_CACHE", str(tmp_path / "none.json"))
    monkeypatch.setenv("QFUSE_FP32_ACCUMULATE", "1")
    assert cli.main(["kernels", "--explain", "1", "14336", "4096", "W4A16", "--moe", "8", "2", "--gpu", "NVIDIA_H200"]) == 0
    out = capsys.readouterr().out
    runs = next(line for line in out.splitlines() if line.strip().startswith("runs as:"))
    assert "'kernel': 'gemv_words'" in runs and "HFMA2" not in runs and "'HFMA2': 2" in out
