"""The gemlite peer's inputs (bench/_peers.py): gemlite itself needs CUDA and runs in the GPU
benches; here, that the codes and scales it is given are the weights qfuse's W4A16 runs, and
that a model's Linears are swapped as documented."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

import qfuse
from qfuse.bench import _peers as peers
from qfuse.bench import model as bench_model


@pytest.mark.parametrize(("n", "k"), [(24, 256), (40, 384)])
def test_gemlite_codes_dequantize_to_the_qfuse_layer_weight(n, k):
    """gemlite's ``(q - z) * s`` with ``z = 8``, in float32 rounded once: qfuse's W4A16 weight, bit for bit."""
    torch.manual_seed(0)
    linear = nn.Linear(k, n, bias=False).to(torch.bfloat16)
    codes, scales = peers.gemlite_codes(linear.weight.detach(), 4, 128)
    assert codes.dtype == torch.uint8 and codes.shape == (n, k) and scales.shape == (n, k // 128) and int(codes.max()) <= 15
    gemlite_weight = ((codes.float() - 8) * scales.float().repeat_interleave(128, dim=1)).to(torch.bfloat16)
    assert torch.equal(gemlite_weight, qfuse.QuantLinear.from_linear(linear, "W4A16").dequantized_weight())


def test_gemlite_linears_swaps_every_linear_but_lm_head(monkeypatch):
    made = []

    def fake_layer(codes, scales, group, dtype, bits, bias=None):  # gemlite needs CUDA: record what it would be given
        made.append((tuple(codes.shape), group, dtype, bits, bias))
        return nn.Identity()

    monkeypatch.setattr(peers, "gemlite_layer", fake_layer)
    model = bench_model.build_model(bench_model.model_config("tiny"), "bf16", "cpu")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    model.model.layers[0].self_attn.q_proj.bias = nn.Parameter(torch.ones(linears["model.layers.0.self_attn.q_proj"].out_features))
    assert peers.gemlite_linears(model, bits=4, group=128) == len(linears) - 1
    assert [n for n, m in model.named_modules() if isinstance(m, nn.Linear)] == ["lm_head"]
    assert [s for s, *_ in made] == [tuple(m.weight.shape) for n, m in linears.items() if n != "lm_head"]
    assert {(g, d, b) for _, g, d, b, _ in made} == {(128, torch.bfloat16, 4)}
    assert torch.equal(made[0][4], torch.ones(made[0][0][0])) and all(bias is None for *_, bias in made[1:])


def test_gemlite_case_without_gemlite_is_a_failed_row(tmp_path):
    pytest.importorskip("transformers")
    try:
        import gemlite  # noqa: F401

        pytest.skip("gemlite is installed here")
    except ImportError:
        pass
    out = tmp_path / "out"
    argv = [
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--cases",
        "bf16",
        "gemlite-w4",
        "--batches",
        "1",
        "--no-compile",
        "--steps",
        "1",
        "--out",
        str(out),
    ]
    assert bench_model.main(argv) == 1
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["case"], r["mode"]) for r in rows] == [("bf16", "eager"), ("gemlite-w4", "failed")]
    assert rows[1]["error"].startswith("RuntimeError: gemlite unavailable: ModuleNotFoundError")
