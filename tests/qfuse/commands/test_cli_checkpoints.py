"""`qfuse quantize` / `info` / `eval` / `--version` as a user runs them, on a tiny Llama
directory with its own tokenizer."""

import json
import re

import pytest

from qfuse.cli import main


def _run(capsys, *argv) -> str:
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def _ppl(out: str) -> float:
    return float(re.search(r"perplexity ([0-9.]+)", out).group(1))


@pytest.fixture(scope="module")
def quantized_dir(float_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("w4a16")
    assert main(["quantize", str(float_model_dir), "--scheme", "W4A16", "--out", str(out)]) == 0
    return out


def test_quantize_prints_memory_and_writes_a_servable_directory(float_model_dir, tmp_path, capsys):
    out = tmp_path / "w8a8"
    text = _run(capsys, "quantize", float_model_dir, "--scheme", "w8a8", "--out", out)
    m = re.search(r"linear weights: ([0-9.]+) MB bfloat16 -> ([0-9.]+) MB W8A8 \(([0-9.]+)x smaller\)", text)
    assert m, text
    # int8 codes plus one float32 scale per row are just under half the bf16 bytes; lm_head
    # (82k of the 1.26M linear weights) stays bf16, so the whole is 1.86x smaller
    assert float(m.group(3)) == 1.86
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "int-quantized"
    assert qc["ignore"] == ["lm_head"]


def test_info_lists_every_layer(quantized_dir, capsys):
    text = _run(capsys, "info", quantized_dir)
    assert "format: compressed-tensors (pack-quantized)" in text
    layers = [line for line in text.splitlines() if line.strip().startswith("model.layers.")]
    assert len(layers) == 14 and all("W4A16" in line for line in layers)
    assert "model.layers.0.mlp.down_proj" in text and "[256, 512]" in text
    assert re.search(r"W4A16\s+14\s", text) and "total" in text
    summary = _run(capsys, "info", quantized_dir, "--summary")
    assert "model.layers.0" not in summary and re.search(r"W4A16\s+14\s", summary)


def test_info_on_a_float_directory(float_model_dir, capsys):
    assert "not a quantized checkpoint" in _run(capsys, "info", float_model_dir)


def test_eval_ppl_quantized_and_float(float_model_dir, quantized_dir, sample_text, capsys):
    args = ["--ppl", "--text", sample_text, "--window", "64", "--max-windows", "4"]
    q = _run(capsys, "eval", quantized_dir, *args)
    f = _run(capsys, "eval", float_model_dir, *args)
    assert "4 windows of 64, 252 scored tokens" in q
    # random weights: both near the vocabulary size (320), and W4A16 close to the float model
    assert 100 < _ppl(f) < 1000 and abs(_ppl(q) / _ppl(f) - 1) < 0.1


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert re.match(r"qfuse \d+\.\d+\.\d+ \(torch \S+, triton \S+\)", capsys.readouterr().out)


def test_errors_are_one_line(tmp_path, float_model_dir, capsys):
    with pytest.raises(SystemExit, match="has no config.json"):
        main(["quantize", str(tmp_path), "--scheme", "W4A16", "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="valid schemes"):
        main(["quantize", str(float_model_dir), "--scheme", "W3A3", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="no usable tokenizer"):
        main(["eval", str(tmp_path), "--ppl"])
    with pytest.raises(SystemExit, match="no safetensors"):
        main(["info", str(tmp_path)])
