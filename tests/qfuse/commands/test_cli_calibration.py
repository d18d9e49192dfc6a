"""`qfuse quantize --calibration`, `qfuse eval --scheme/--calibration/--fake-quant` and
`qfuse eval --table` on a tiny Llama directory with its own tokenizer."""

import json
import re

import pytest

from qfuse.cli import main
from qfuse.eval.accuracy import read_rows

SMALL = ("--calibration-samples", "4")
EVAL = ("--window", "64", "--max-windows", "2")


def _run(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def _ppl(out: str) -> float:
    return float(re.search(r"perplexity ([0-9.]+)", out).group(1))


def test_quantize_with_gptq_saves_a_loadable_checkpoint(float_model_dir, sample_text, tmp_path, capsys):
    out = tmp_path / "gptq"
    text = _run(capsys, "quantize", float_model_dir, "--scheme", "W4A16", "--calibration", "gptq", *SMALL, "--out", out)
    assert "calibration: 4 windows of 512 tokens" in text and re.search(r"calibrated \(gptq\) and quantized in [0-9.]+ s", text)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "compressed-tensors"
    ppl = _ppl(_run(capsys, "eval", out, "--ppl", "--text", sample_text, *EVAL))
    assert ppl > 1 and ppl < 1e6


def test_quantize_w8a8_static_writes_input_scales(float_model_dir, tmp_path, capsys):
    out = tmp_path / "static"
    _run(capsys, "quantize", float_model_dir, "--scheme", "W8A8_STATIC", *SMALL, "--out", out)
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    acts = [g["input_activations"] for g in groups.values()]
    assert acts and all(a["dynamic"] is False and a["strategy"] == "tensor" for a in acts)


def test_eval_of_the_simulation_prints_the_kernels_perplexity(float_model_dir, sample_text, capsys):
    """--fake-quant evaluates the calibration's own simulation: on the CPU reference ops the same number."""
    args = ("eval", float_model_dir, "--ppl", "--text", sample_text, *EVAL, "--scheme", "W4A8_G128", "--calibration", "sq+gptq", *SMALL)
    kernels = _run(capsys, *args)
    simulation = _run(capsys, *args, "--fake-quant")
    assert "W4A8_G128 sq+gptq fake-quant" in simulation
    assert _ppl(kernels) == _ppl(simulation)


def test_table_writes_csv_markdown_and_rows(float_model_dir, sample_text, tmp_path, capsys):
    out = tmp_path / "table"
    text = _run(
        capsys,
        "eval",
        float_model_dir,
        "--ppl",
        "--text",
        sample_text,
        *EVAL,
        *SMALL,
        "--table",
        "--schemes",
        "W8A8",
        "W4A16",
        "--recipes",
        "rtn",
        "sq",
        "gptq",
        "--out",
        out,
    )
    assert "wrote" in text
    base, rows = read_rows(out / "accuracy.csv")
    assert [(r.scheme, r.recipe) for r in rows] == [("W8A8", "rtn"), ("W8A8", "sq"), ("W8A8", "gptq"), ("W4A16", "rtn"), ("W4A16", "gptq")]
    assert all(r.ppl == r.ppl_fake_quant for r in rows)  # CPU reference ops: bit-exact
    assert all(r.delta_pct == pytest.approx((r.ppl / base - 1) * 100, abs=1e-5) for r in rows)
    md = (out / "accuracy.md").read_text()
    assert md.count("\n| W8A8 |") == 3 and "float model: ppl" in md


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--calibration", "gptq"), "need --scheme"),
        (("--table",), "--table needs --out"),
        (("--scheme", "W4A16", "--calibration", "foo"), "unknown calibration step 'foo'"),
        (("--scheme", "W4A16", "--calibration", "sq"), "SmoothQuant helps int8 activation"),
    ],
)
def test_eval_errors_are_one_line(float_model_dir, argv, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["eval", str(float_model_dir), "--ppl", *argv])
