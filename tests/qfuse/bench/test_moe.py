"""``qfuse bench moe`` on the CPU with its tiny shapes (reference kernel, wall-clock timing): rows,
ratios, floor bytes, CSV, plot and the report table; the GPU figures are CUDA-graph replays."""

from __future__ import annotations

import csv

import pytest
import torch

from qfuse.bench import moe as bench_moe
from qfuse.bench import report

COLUMNS = ["shape", "M", "case", "us", "x_bf16", "x_loop", "pct_of_floor", "floor_us", "bf16_us", "loop_us", "experts_touched", "expert_mb"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe")
    rc = bench_moe.main(["--device", "cpu", "--shapes", "tiny", "--m", "1", "16", "--out", str(out)])
    with (out / "moe.csv").open() as f:
        reader = csv.DictReader(f)
        return rc, out, reader.fieldnames, list(reader)


def test_rows_and_columns(run):
    rc, out, fields, rows = run
    assert rc == 0
    assert fields[: len(COLUMNS)] == COLUMNS
    assert [(r["M"], r["case"]) for r in rows] == [(m, c) for m in ("1", "16") for c in bench_moe.CASES]
    assert all(float(r["us"]) > 0 and float(r["floor_us"]) > 0 and float(r["pct_of_floor"]) >= 0 for r in rows)
    assert {r["x_bf16"] for r in rows if r["case"] == "bf16"} == {"1.0"} == {r["x_loop"] for r in rows if r["case"] == "loop"}
    for r in rows:  # the stored ratios are the reference times over the row's
        assert float(r["x_bf16"]) == pytest.approx(float(r["bf16_us"]) / float(r["us"]), rel=0.01, abs=1e-3)
        assert float(r["x_loop"]) == pytest.approx(float(r["loop_us"]) / float(r["us"]), rel=0.01, abs=1e-3)
    _, _, e, top_k = bench_moe.SHAPES["tiny"]
    assert all(top_k <= int(r["experts_touched"]) <= e for r in rows)
    assert {r["experts_touched"] for r in rows if r["M"] == "1"} == {str(top_k)}  # one token: its top-k experts
    # on the CPU the op is its reference kernel; the bf16 loop differs from it by bf16 roundings only
    assert all(float(r["max_rel_err"]) == 0.0 for r in rows if r["case"] != "loop")
    assert all(0 < float(r["max_rel_err"]) < 0.05 for r in rows if r["case"] == "loop")
    assert (out / "moe.png").stat().st_size > 0
    assert {r["case"] for r in rows if r["tile_major"] == "True"} == {"W4A16", "W4A16_ACTORDER"}  # QuantExperts' layout


def test_natural_codes(tmp_path):
    argv = [
        "--device",
        "cpu",
        "--shapes",
        "tiny",
        "--m",
        "1",
        "--cases",
        "W4A16",
        "W8A16",
        "--replays",
        "1",
        "--natural-codes",
        "--out",
        str(tmp_path),
    ]
    assert bench_moe.main(argv) == 0
    with (tmp_path / "moe.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["case"], r["tile_major"]) for r in rows] == [("W8A16", "False"), ("W4A16", "False")]  # W4A16: tile-major by default


def test_floor_counts_the_touched_experts_bytes(run):
    _, _, _, rows = run
    h, i, _, _ = bench_moe.SHAPES["tiny"]
    params = 3 * h * i  # w13 [2I, H] and w2 [H, I] of one expert
    groups = 2 * i * (h // 128) + h * (i // 128)  # group-128 scales of w13 and w2
    expected = {  # bytes of one expert: codes, scales (per output channel or group), group scales
        "bf16": 2 * params,
        "W8A16": params + 2 * (2 * i + h),
        "W4A16": params // 2 + 2 * groups,
        "W4A16_ACTORDER": params // 2 + 2 * groups,  # W4A16's experts; its input orders are not expert bytes
        "W8A8": params + 4 * (2 * i + h),
        "W4A8": params // 2 + 4 * (2 * i + h),
        "W4A8_G128": params // 2 + 4 * (2 * i + h) + groups,
    }
    for r in rows:
        per_expert = expected["bf16" if r["case"] == "loop" else r["case"]]
        assert float(r["expert_mb"]) == pytest.approx(per_expert / 1e6, abs=1e-3)
        floor = int(r["experts_touched"]) * per_expert / bench_moe.CPU_BANDWIDTH * 1e6
        assert float(r["floor_us"]) == pytest.approx(floor, abs=0.01)


def test_report_renders_the_moe_table(run):
    _, out, _, rows = run
    lines = report.table(out / "moe.csv").splitlines()
    assert lines[0] == "| shape | M | case | us | x bf16 | x loop | % of floor | experts touched | kernel |"
    assert len(lines) == 2 + len(rows)
    assert lines[2].startswith("| tiny | 1 | bf16 | ") and "| 1.00 | " in lines[2]
    assert report.table(out / "moe.csv", ["M=16"]).count("\n| tiny | 16 |") == len(bench_moe.CASES)


def test_loop_matches_the_reference_with_an_idle_expert():
    from qfuse.ops.moe.fused_moe import fused_moe_ref
    from qfuse.ops.moe.routing import topk_routing

    torch.manual_seed(0)
    e, h, i, top_k = 4, 64, 32, 2
    w13, w2 = (torch.randn(e, 2 * i, h) / 8).bfloat16(), (torch.randn(e, h, i) / 6).bfloat16()
    x, logits = torch.randn(5, h).bfloat16(), torch.randn(5, e)
    logits[:, 3] = -30.0  # expert 3 gets no token
    plan = bench_moe.expert_plan(topk_routing(logits, top_k, True)[1])
    assert [p[0] for p in plan] == [0, 1, 2]
    out = bench_moe.moe_loop(x, logits, top_k, w13, w2, plan)
    ref = fused_moe_ref(x, logits, top_k, True, w13, None, None, None, w2, None, None, None, 16, 16, -1)
    assert ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item() < 0.02


def test_every_config_rows_and_picks(tmp_path, monkeypatch):
    """``--every-config``: a row per candidate of every family (opt-in ones included), each
    checked against the reference, and the fastest per key in the shipped tables' key format.
    One config per family (each runs in the Triton interpreter here)."""
    import ast
    import json

    from qfuse.ops.moe.dispatch import REGISTRY

    every = REGISTRY.candidates
    monkeypatch.setattr(REGISTRY, "candidates", lambda p: [c for f in REGISTRY.families for c in [c for c in every(p) if c["kernel"] == f.name][:1]])
    argv = ["--device", "cpu", "--shapes", "tiny", "--m", "1", "--cases", "W4A16", "--replays", "1", "--every-config", "--out", str(tmp_path)]
    assert bench_moe.main(argv) == 0
    with (tmp_path / "moe_configs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["family"] for r in rows] == ["grouped", "gemv", "gemv_words", "grouped_words"]
    assert all(float(r["us"]) > 0 and float(r["max_rel_err"]) < 0.02 and not r.get("error") for r in rows)
    assert [r["opt_in"] for r in rows] == ["", "", "", ""]
    assert {r["tile_major"] for r in rows} == {"True"}  # QuantExperts' layout of the tiny shape's W4A16 experts
    h, i, e, top_k = bench_moe.SHAPES["tiny"]
    fastest = ast.literal_eval(min(rows, key=lambda r: float(r["us"]))["config"])
    picks = json.loads((tmp_path / "moe_picks.json").read_text())
    assert picks == {f"fused_moe|cpu|1|{e}|{i}|{h}|{top_k}|4|16|{min(128, h)}|bfloat16|tile_major": fastest}


def test_every_config_of_some_families(tmp_path, monkeypatch, capsys):
    """``--families``: only those families' configs get rows; an unknown name is refused."""
    from qfuse.ops.moe.dispatch import REGISTRY

    every = REGISTRY.candidates
    monkeypatch.setattr(REGISTRY, "candidates", lambda p: [c for f in REGISTRY.families for c in [c for c in every(p) if c["kernel"] == f.name][:1]])
    argv = ["--device", "cpu", "--shapes", "tiny", "--m", "1", "--cases", "W4A16", "--replays", "1", "--every-config", "--out", str(tmp_path)]
    assert bench_moe.main([*argv, "--families", "grouped_words", "gemv"]) == 0
    with (tmp_path / "moe_configs.csv").open() as f:
        assert [r["family"] for r in csv.DictReader(f)] == ["gemv", "grouped_words"]
    with pytest.raises(SystemExit):
        bench_moe.main([*argv, "--families", "grouped_word"])
    assert "unknown grouped_word" in capsys.readouterr().err


def test_act_order_case_passes_its_input_orders():
    from qfuse.ops.moe.fused_moe import fused_moe_ref

    h, i, e, top_k = bench_moe.SHAPES["tiny"]
    g = torch.Generator().manual_seed(0)
    w13, w2 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).bfloat16(), (torch.randn(e, h, i, generator=g) / i**0.5).bfloat16()
    tensors, fmt, tiled = bench_moe.expert_tensors(w13, w2, top_k, "W4A16_ACTORDER")
    assert fmt == bench_moe.expert_tensors(w13, w2, top_k, "W4A16")[1] == (4, 16, 128)
    perm = bench_moe.random_act_perm(e, h, 0, "cpu")
    assert perm.shape == (e, h) and torch.equal(perm.sort(dim=1).values, torch.arange(h).expand(e, h))
    x, logits = torch.randn(5, h, generator=g).bfloat16(), torch.randn(5, e, generator=g)
    out = bench_moe.fused_moe(x, logits, top_k, tensors, fmt, perm, tiled)
    assert torch.equal(out, fused_moe_ref(x, logits, top_k, True, *tensors, *fmt, perm, tiled))
    assert not torch.equal(out, bench_moe.fused_moe(x, logits, top_k, tensors, fmt, None, tiled))


def test_run_as_a_module_reads_its_command_line(tmp_path, monkeypatch):
    """``python -m qfuse.bench.moe ARGS`` calls ``main()``: the options come from ``sys.argv``, not the defaults."""
    import sys

    monkeypatch.setattr(sys, "argv", ["moe.py", "--device", "cpu", "--shapes", "tiny", "--m", "1", "--cases", "bf16", "--out", str(tmp_path)])
    assert bench_moe.main() == 0
    with (tmp_path / "moe.csv").open() as f:
        assert [(r["shape"], r["M"], r["case"]) for r in csv.DictReader(f)] == [("tiny", "1", "bf16")]
