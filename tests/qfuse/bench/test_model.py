"""``qfuse bench model`` on the CPU with its tiny config: rows, ratios, CSV and plot (eager only:
the compiled path runs on the GPU; ``generate`` compiled is tested in tests/qfuse/test_compile.py)."""

from __future__ import annotations

import csv

import pytest

from qfuse.bench import model as bench_model


def test_eager_rows_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    rc = bench_model.main(
        ["--model", "tiny", "--device", "cpu", "--cases", "bf16", "W8A8", "--batches", "1", "2", "--eager-batches", "1", "2"]
        + ["--context", "16", "--no-compile", "--steps", "2", "--out", str(out)]
    )
    assert rc == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["case"], r["mode"], r["batch"]) for r in rows] == [(c, "eager", b) for c in ("bf16", "W8A8") for b in ("1", "2")]
    assert all(float(r["ms"]) > 0 and float(r["tokens_per_s"]) > 0 for r in rows)
    assert {r["x_bf16"] for r in rows if r["case"] == "bf16"} == {"1.0"}
    quantized = [r for r in rows if r["case"] == "W8A8"]
    assert all(float(r["x_bf16"]) > 0 for r in quantized)
    assert float(quantized[0]["weight_gb"]) < float(rows[0]["weight_gb"])  # int8 Linears (embeddings stay bf16)
    assert (out / "model.png").stat().st_size > 0
    assert "W8A8" in capsys.readouterr().out


def test_a_failing_case_is_reported_and_the_others_kept(tmp_path, capsys):
    out = tmp_path / "out"
    rc = bench_model.main(
        ["--model", "tiny", "--device", "cpu", "--cases", "bf16", "W9A9", "--batches", "1", "--no-compile", "--steps", "1", "--out", str(out)]
    )
    assert rc == 1
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [r["mode"] for r in rows] == ["eager", "failed"] and "unknown case 'W9A9'" in rows[1]["error"]
    assert "W9A9: FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["llama3-8b", "qwen2-7b"])
def test_published_shapes(name):
    config = bench_model.model_config(name, layers=2)
    assert config.num_hidden_layers == 2
    assert (config.hidden_size, config.intermediate_size) == {"llama3-8b": (4096, 14336), "qwen2-7b": (3584, 18944)}[name]
