"""`qfuse quantize` / `info` / `eval` / `--version` as a user runs them, on a tiny Llama
directory with its own tokenizer."""

import json
import re

import pytest
import torch

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


def test_quantize_refuses_a_quantized_directory(quantized_dir, tmp_path):
    with pytest.raises(SystemExit, match="is already a quantized checkpoint; start from the float model"):
        main(["quantize", str(quantized_dir), "--scheme", "W8A16", "--out", str(tmp_path / "again")])
    with pytest.raises(SystemExit, match="--table quantizes a float model, and .* is already a quantized checkpoint"):
        main(["eval", str(quantized_dir), "--ppl", "--table", "--out", str(tmp_path / "table")])


def test_quantize_counts_the_embedding_a_quantized_tied_head_unties(tmp_path, capsys):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "tied")
    text = _run(capsys, "quantize", tmp_path / "tied", "--scheme", "W8A16", "--lm-head", "W8A16", "--out", tmp_path / "out")
    m = re.search(r"other tensors ([0-9.]+ K?B) -> ([0-9.]+ K?B); in all ([0-9.]+ K?B) -> ([0-9.]+ K?B)", text)
    assert m, text
    size = lambda s: float(s.split()[0]) * (1000 if s.endswith("KB") else 1)  # noqa: E731
    embedding = 320 * 128 * 2  # the float embedding, counted once the head no longer shares it
    assert size(m.group(2)) - size(m.group(1)) == pytest.approx(embedding, abs=10)
    linear = re.search(r"linear weights: ([0-9.]+ KB) bfloat16 -> ([0-9.]+ KB)", text)
    assert size(m.group(4)) == pytest.approx(size(linear.group(2)) + size(m.group(2)), abs=10)


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
    with pytest.raises(SystemExit, match="no usable tokenizer"):
        main(["eval", str(tmp_path), "--ppl"])
    with pytest.raises(SystemExit, match="none: no such directory"):
        main(["eval", str(tmp_path / "none"), "--ppl"])
    with pytest.raises(SystemExit, match="no safetensors"):
        main(["info", str(tmp_path)])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["quantize", "{model}", "--scheme", "W3A3", "--out", "{out}"], "argument --scheme: unknown quantization scheme 'W3A3'"),
        (["quantize", "{model}", "--scheme", "W4A16", "--lm-head", "FOO", "--out", "{out}"], "argument --lm-head: unknown"),
        (["quantize", "{model}", "--scheme", "W4A16", "--max-shard-size", "garbage", "--out", "{out}"], "must be a positive size"),
        (["quantize", "{model}", "--scheme", "W4A16", "--max-shard-size", "0", "--out", "{out}"], "must be a positive size"),
        (["eval", "{model}", "--ppl", "--scheme", "FOO"], "argument --scheme: unknown"),
        (["eval", "{model}", "--ppl", "--batch", "0"], "argument --batch: must be an integer >= 1, got '0'"),
        (["eval", "{model}", "--ppl", "--table", "--out", "{out}", "--schemes"], "argument --schemes: expected at least one argument"),
        (["eval", "{model}", "--ppl", "--batch", "-1"], "argument --batch: must be an integer >= 1"),
        (["eval", "{model}", "--ppl", "--max-windows", "0"], "argument --max-windows: must be an integer >= 1"),
        (["eval", "{model}", "--ppl", "--device", "foo"], "argument --device"),
        (["eval", "{model}", "--ppl", "--table", "--out", "{out}", "--schemes", "W3A3"], "argument --schemes: unknown"),
        (["demo", "--schemes", "W8A8_STATIC"], "W8A8_STATIC needs calibration data"),
        (["bench", "report", "{out}/none.csv"], "no such file or folder"),
        (
            ["quantize", "{model}", "--scheme", "W8A8", "--calibration", "sq", "--calibration-samples", "-3", "--out", "{out}"],
            "must be an integer >= 1",
        ),
        (["eval", "{model}", "--ppl", "--scheme", "W8A8", "--calibration", "sq", "--calibration-samples", "0"], "must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_usage_errors_before_any_work(argv, message, float_model_dir, tmp_path, capsys):
    """An unknown scheme or a bad number is an argparse error (exit 2, no traceback): it was a
    traceback, or for --batch -1 a perplexity of 1 over no batch, after the model had loaded."""
    argv = [a.format(model=float_model_dir, out=tmp_path / "o") for a in argv]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "{model}", "--ppl", "--schemes", "W8A16"], "--schemes belong to --table"),
        (["eval", "{model}", "--ppl", "--out", "{out}"], "--out belong to --table"),
        (["eval", "{model}", "--ppl", "--text", "{out}/none.txt"], "is not a file"),
        (["quantize", "{model}", "--scheme", "W4A16", "--out", "{model}/config.json"], "is a file, not a directory"),
        (["quantize", "{model}", "--scheme", "W8A16", "--calibration-samples", "5", "--out", "{out}"], "--calibration-samples needs a calibration"),
        (["eval", "{model}", "--ppl", "--calibration-samples", "5"], "--calibration-samples needs a calibration"),
        (["eval", "{model}", "--ppl", "--scheme", "W8A16", "--calibration", "rtn", "--calibration-samples", "5"], "it would be ignored"),
        (["eval", "{model}", "--ppl", "--table", "--out", "{out}", "--recipes", "gptq", "bogus"], "--recipes: unknown calibration step 'bogus'"),
    ],
)
def test_conflicting_or_missing_paths_stop_before_loading(argv, message, float_model_dir, tmp_path):
    with pytest.raises(SystemExit, match=re.escape(message)):
        main([a.format(model=float_model_dir, out=tmp_path / "o") for a in argv])
