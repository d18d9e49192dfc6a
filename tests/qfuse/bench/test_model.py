"""``qfuse bench model`` on the CPU with its tiny config: rows, ratios, CSV and plot (eager only:
the compiled path runs on the GPU; ``generate`` compiled is tested in tests/qfuse/test_compile.py)."""

from __future__ import annotations

import csv
import re
import signal

import pytest
import torch

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


def test_compiled_rows_write_the_compile_phases(tmp_path):
    """On the CPU the compiled step runs without a CUDA graph; its first call's phases go to a file."""
    out = tmp_path / "out"
    args = ["--model", "tiny", "--device", "cpu", "--cases", "W4A16:attn", "--batches", "2", "--eager-batches", "--context", "16"]
    assert bench_model.main(args + ["--prefill", "0", "--steps", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [r["mode"] for r in rows] == ["compiled"] and float(rows[0]["compile_s"]) > 0
    phases = (out / "compile_phases" / "W4A16_attn_decode_b2.txt").read_text()
    # Dynamo's phases are always there; Inductor's only when its FX graph cache missed
    assert phases.startswith("first call") and "_compile.compile_inner" in phases
    assert re.search(r"dynamo: [1-9]\d* calls captured, 1 graphs; inductor: \d+ IR nodes before fusion, \d+ kernels generated", phases)


def test_a_failing_case_is_reported_and_the_others_kept(tmp_path, capsys):
    out = tmp_path / "out"
    rc = bench_model.main(
        ["--model", "tiny", "--device", "cpu", "--cases", "bf16", "W9A9", "--batches", "1", "--no-compile", "--steps", "1", "--out", str(out)]
    )
    assert rc == 1
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [r["mode"] for r in rows] == ["eager", "failed"] and "unknown case 'W9A9'" in rows[1]["error"]
    assert "W9A9: FAILED" in capsys.readouterr().out


def test_attn_and_fuse_cases(tmp_path):
    out = tmp_path / "out"
    cases = ["bf16", "bf16:attn", "W4A16:attn", "bf16:fuse", "W4A16:attn:fuse"]
    args = ["--model", "tiny", "--device", "cpu", "--cases", *cases, "--batches", "2", "--eager-batches", "2", "--context", "16"]
    assert bench_model.main(args + ["--no-compile", "--steps", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [r["case"] for r in rows] == cases and all(float(r["x_bf16"]) > 0 for r in rows)
    model = bench_model.build_model(bench_model.model_config("tiny"), "W8A8:nopasses:attn:lm_head=W8A16", "cpu")
    assert model.config._attn_implementation == "qfuse_decode"
    assert type(model.lm_head).__name__ == "QuantLinear" and model.lm_head.scheme.name == "W8A16"
    model = bench_model.build_model(bench_model.model_config("tiny"), "W4A16:fuse", "cpu")
    assert hasattr(model.model.layers[0].self_attn, "qkv_proj") and hasattr(model.model.layers[0].mlp, "gate_up_proj")


@pytest.mark.parametrize(
    "case, parsed",
    [
        ("bf16", ("bf16", set())),
        ("W8A8:nopasses:attn", ("W8A8", {"nopasses", "attn"})),
        ("torchao-int4:attn", ("torchao-int4", {"attn"})),
        ("W4A16:attn:lm_head=W8A16", ("W4A16", {"attn", "lm_head=W8A16"})),
        ("W4A16:natural_codes", ("W4A16", {"natural_codes"})),
    ],
)
def test_parse_case(case, parsed):
    assert bench_model.parse_case(case) == (parsed[0], frozenset(parsed[1]))


@pytest.mark.parametrize(
    "case", ["W9A9", "W4A16:fast", "bf16:nopasses", "bf16:lm_head=W8A16", "W4A16:lm_head=W2A16", "torchao-int4:fuse", "bf16:natural_codes"]
)
def test_parse_case_refuses(case):
    with pytest.raises(ValueError, match="unknown case"):
        bench_model.parse_case(case)


@pytest.mark.parametrize("name", ["llama3-8b", "qwen2-7b", "mixtral-8x7b"])
def test_published_shapes(name):
    config = bench_model.model_config(name, layers=2)
    assert config.num_hidden_layers == 2
    shapes = {"llama3-8b": (4096, 14336), "qwen2-7b": (3584, 18944), "mixtral-8x7b": (4096, 14336)}
    assert (config.hidden_size, config.intermediate_size) == shapes[name]


def test_mixtral_defaults_to_4_layers_of_its_shape():
    config = bench_model.model_config("mixtral-8x7b")
    assert type(config).__name__ == "MixtralConfig" and config.num_hidden_layers == 4
    assert (config.num_local_experts, config.num_experts_per_tok, config.vocab_size) == (8, 2, 32000)
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 8)


def test_natural_codes_case_keeps_the_experts_natural():
    """``W4A16:natural_codes``: the same experts (state_dict, outputs) with the codes in the natural packing."""
    config = bench_model.model_config("tiny-mixtral")
    tiled = bench_model.build_model(config, "W4A16", "cpu")
    natural = bench_model.build_model(config, "W4A16:natural_codes", "cpu")
    assert all(layer.mlp.experts.tile_major for layer in tiled.model.layers)
    assert not any(layer.mlp.experts.tile_major for layer in natural.model.layers)
    assert bench_model.natural_experts(natural) == 0  # nothing left to rebuild
    a, b = tiled.state_dict(), natural.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(natural(ids).logits, tiled(ids).logits, rtol=0, atol=0)


def test_mixtral_case_quantizes_the_experts_and_skips_torchao(tmp_path, capsys):
    from qfuse.moe import QuantMoE

    model = bench_model.build_model(bench_model.model_config("tiny-mixtral"), "W4A16", "cpu")
    assert all(isinstance(layer.mlp, QuantMoE) and layer.mlp.experts.scheme.name == "W4A16" for layer in model.model.layers)
    out = tmp_path / "out"
    rc = bench_model.main(
        [
            "--model",
            "tiny-mixtral",
            "--device",
            "cpu",
            "--cases",
            "bf16",
            "W4A16",
            "torchao-int4",
            "gemlite-w4",
            "--batches",
            "1",
            "--eager-batches",
            "1",
        ]
        + ["--context", "16", "--no-compile", "--steps", "1", "--out", str(out)]
    )
    assert rc == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    skipped = [("torchao-int4", "skipped"), ("gemlite-w4", "skipped")]
    assert [(r["case"], r["mode"]) for r in rows] == [("bf16", "eager"), ("W4A16", "eager"), *skipped]
    assert float(rows[1]["weight_gb"]) < float(rows[0]["weight_gb"]) / 2  # the experts are most of the weights
    assert "experts" in rows[2]["error"] and "experts" in rows[3]["error"]
    printed = capsys.readouterr().out
    assert "torchao-int4: skipped on tiny-mixtral" in printed and "gemlite-w4: skipped on tiny-mixtral" in printed


def test_weight_bytes_counts_the_inner_tensors_of_a_wrapper_subclass():
    """torchao's quantized weights are wrapper subclasses: their bytes are their inner tensors', not
    numel x the logical dtype's size (which counted a torchao int4 model at its bf16 size)."""
    import torch
    from torch.testing._internal.two_tensor import TwoTensor

    lin = torch.nn.Linear(8, 4, bias=True)
    assert bench_model.weight_bytes(lin) == (32 + 4) * 4
    lin.weight = torch.nn.Parameter(TwoTensor(torch.zeros(4, 8), torch.zeros(4, 8)), requires_grad=False)
    assert bench_model.tensor_bytes(lin.weight) == 2 * 32 * 4
    assert bench_model.weight_bytes(lin) == (2 * 32 + 4) * 4


def test_interleaved_eager_rows(tmp_path):
    out = tmp_path / "out"
    argv = ["--model", "tiny", "--device", "cpu", "--cases", "bf16", "W4A16", "--eager-batches", "1", "2", "--interleave"]
    assert bench_model.main(argv + ["--rounds", "2", "--steps", "1", "--context", "16", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["case"], r["mode"], r["batch"]) for r in rows] == [(c, "eager", b) for c in ("bf16", "W4A16") for b in ("1", "2")]
    assert all(float(r["ms"]) > 0 for r in rows) and {r["x_bf16"] for r in rows if r["case"] == "bf16"} == {"1.0"}
    assert (out / "model.png").stat().st_size > 0


def test_interleaved_run_without_a_timed_step_and_with_a_skipped_case(tmp_path, capsys):
    """--interleave with no eager batch, or no case left to run, writes its CSV (skipped cases as
    rows, as without --interleave) instead of dividing by the empty case list."""
    base = ["--device", "cpu", "--interleave", "--rounds", "2", "--steps", "1", "--context", "16"]
    out = tmp_path / "none"
    assert bench_model.main(base + ["--model", "tiny", "--cases", "bf16", "--eager-batches", "--out", str(out)]) == 0
    assert (out / "model.csv").is_file() and not (out / "model.png").exists()
    out = tmp_path / "skipped"
    assert bench_model.main(base + ["--model", "tiny-mixtral", "--cases", "torchao-int4", "--eager-batches", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["case"], r["mode"]) for r in rows] == [("torchao-int4", "skipped")] and "experts" in rows[0]["error"]
    assert "torchao-int4: skipped on tiny-mixtral" in capsys.readouterr().out


def test_stacks_every_samples_the_run_and_stops_with_it(tmp_path, monkeypatch):
    """--stacks-every S: faulthandler dumps every thread's stack each S seconds while the cases run,
    and is cancelled when they end (also when one fails)."""
    calls = []
    monkeypatch.setattr(bench_model.faulthandler, "dump_traceback_later", lambda s, repeat: calls.append(("dump", s, repeat)))
    monkeypatch.setattr(bench_model.faulthandler, "cancel_dump_traceback_later", lambda: calls.append(("cancel",)))
    argv = ["--model", "tiny", "--device", "cpu", "--cases", "W9A9", "--batches", "1", "--no-compile", "--steps", "1", "--out", str(tmp_path)]
    assert bench_model.main(argv + ["--stacks-every", "60"]) == 1
    assert calls == [("dump", 60.0, True), ("cancel",)]
    calls.clear()
    assert bench_model.main(argv) == 1 and calls == []


def test_compile_timeout_writes_the_stacks_keeps_the_rows_and_goes_on(tmp_path, capsys):
    """A first compiled call past --compile-timeout: its stacks and phases go to a file, the case
    gets a failed row after the rows it already measured, and the next case still runs."""
    out = tmp_path / "out"
    handler = signal.getsignal(signal.SIGALRM)
    args = ["--model", "tiny", "--device", "cpu", "--cases", "W4A16", "bf16", "--batches", "2", "--eager-batches", "2", "--context", "16"]
    assert bench_model.main(args + ["--prefill", "0", "--steps", "1", "--compile-timeout", "0.05", "--out", str(out)]) == 1
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["case"], r["mode"]) for r in rows] == [("W4A16", "eager"), ("W4A16", "failed"), ("bf16", "eager"), ("bf16", "failed")]
    assert all(r["error"].startswith("CompileTimeout: the first compiled call ran past 0.05 s") for r in rows if r["mode"] == "failed")
    assert rows[1]["error"].endswith("stacks in compile_phases/W4A16_decode_b2.timeout.txt")  # no machine path in the CSV
    report = (out / "compile_phases" / "W4A16_decode_b2.timeout.txt").read_text()
    assert (
        report.startswith("stopped after 0.05 s")
        and "(main), most recent call last:" in report
        and "in first_call" in report
        and "compile phases so far:" in report
    )
    assert not (out / "compile_phases" / "W4A16_decode_b2.txt").exists()
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert "W4A16: FAILED CompileTimeout" in capsys.readouterr().out


def test_compile_timeout_holds_when_the_call_swallows_it(tmp_path):
    """A deadline that fired inside a broad ``except`` (torch has some) still stops the call when it returns."""
    import time

    def swallowing():
        try:
            time.sleep(2)  # the alarm fires here
        except bench_model.CompileTimeout:
            pass

    report = tmp_path / "r.timeout.txt"
    with pytest.raises(bench_model.CompileTimeout, match="ran past 0.05 s"), bench_model._deadline(0.05, report):
        swallowing()
    assert report.read_text().startswith("stopped after 0.05 s")


def test_inductor_config_is_parsed_checked_applied_and_recorded(tmp_path, monkeypatch):
    assert bench_model.inductor_fields(["graph_partition=False", "max_fusion_size=8", "cpp.simdlen=None"]) == {
        "graph_partition": False,
        "max_fusion_size": 8,
        "cpp.simdlen": None,
    }
    assert bench_model.inductor_fields(["triton.descriptive_names=original_aten"]) == {"triton.descriptive_names": "original_aten"}
    for bad, message in (("graph_partition", "expected KEY=VALUE"), ("no_such_field=1", "has no field 'no_such_field'")):
        with pytest.raises(ValueError, match=message):
            bench_model.inductor_fields([bad])
        with pytest.raises(SystemExit):
            bench_model.main(["--device", "cpu", "--inductor-config", bad])
    seen = []
    real = bench_model.run_case

    def run_case(case, args, record, log=print):
        import torch._inductor.config

        seen.append(torch._inductor.config.max_fusion_size)
        real(case, args, record, log)

    monkeypatch.setattr(bench_model, "run_case", run_case)
    out = tmp_path / "out"
    argv = ["--model", "tiny", "--device", "cpu", "--cases", "bf16", "--batches", "1", "--no-compile", "--steps", "1", "--out", str(out)]
    assert bench_model.main(argv + ["--inductor-config", "max_fusion_size=7"]) == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert seen == [7] and rows[0]["inductor_config"] == "max_fusion_size=7"
    import torch._inductor.config

    assert torch._inductor.config.max_fusion_size != 7  # restored after the run


def test_eager_batches_outside_batches_are_refused(capsys):
    """An eager batch that --batches lacks would give no row: refused before any model is built."""
    argv = ["--model", "tiny", "--device", "cpu", "--cases", "bf16", "--batches", "1", "--eager-batches", "1", "8"]
    with pytest.raises(SystemExit):
        bench_model.main(argv)
    assert "--eager-batches 8: not in --batches" in capsys.readouterr().err


def test_compile_first_runs_each_case_cold_in_a_subprocess(tmp_path):
    """--compile-first: each case's compiled rows first run in a subprocess (its log and CSV kept); the
    measured rows carry that cold first call as compile_s and their own, warm, as warm_compile_s."""
    out = tmp_path / "out"
    args = ["--model", "tiny", "--device", "cpu", "--cases", "bf16", "W4A16", "--batches", "2", "--eager-batches", "2", "--context", "16"]
    assert bench_model.main(args + ["--prefill", "8", "--steps", "1", "--compile-first", "2", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["case"], r["mode"]) for r in rows] == [(c, m) for c in ("bf16", "W4A16") for m in ("eager", "compiled", "prefill")]
    for case in ("bf16", "W4A16"):
        cold = {r["mode"]: r for r in csv.DictReader((out / "compile_first" / case / "model.csv").open())}
        assert set(cold) == {"compiled", "prefill"}
        assert f"[model] {case} compiled batch 2:" in (out / "compile_first" / case / "log.txt").read_text()
        for r in rows:
            if r["case"] == case and r["mode"] != "eager":
                assert r["compile_s"] == cold[r["mode"]]["compile_s"] and float(r["warm_compile_s"]) > 0
        assert (out / "compile_first" / case / "compile_phases").is_dir()


def test_compile_first_failure_leaves_the_case_its_eager_rows(tmp_path):
    out = tmp_path / "out"
    args = ["--model", "tiny", "--device", "cpu", "--cases", "W4A16", "--batches", "2", "--eager-batches", "2", "--context", "16", "--prefill", "0"]
    assert bench_model.main(args + ["--steps", "1", "--compile-first", "1", "--compile-timeout", "0.05", "--out", str(out)]) == 1
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["case"], r["mode"]) for r in rows] == [("W4A16", "failed"), ("W4A16", "eager")]
    assert rows[0]["error"].startswith("compile-first: CompileTimeout: the first compiled call ran past 0.05 s")
    assert (out / "compile_first" / "W4A16" / "compile_phases" / "W4A16_decode_b2.timeout.txt").is_file()


def test_compile_first_failure_keeps_the_rows_its_subprocess_finished(tmp_path, monkeypatch):
    """A subprocess that finished batch 1 and failed at batch 2 (it stops there): the measured run
    compiles batch 1 again (its cold compile_s kept), batch 2 and the prefill eager only."""
    cold = [
        {"case": "W4A16", "mode": "compiled", "batch": "1", "compile_s": "12.5"},
        {"case": "W4A16", "mode": "failed", "error": "CompileTimeout: the first compiled call ran past 0.05 s"},
    ]
    monkeypatch.setattr(bench_model, "compile_first", lambda args, cases, log=print: {"W4A16": cold})
    out = tmp_path / "out"
    args = ["--model", "tiny", "--device", "cpu", "--cases", "W4A16", "--batches", "1", "2", "--eager-batches", "1", "2", "--context", "16"]
    assert bench_model.main(args + ["--prefill", "8", "--steps", "1", "--compile-first", "1", "--out", str(out)]) == 1
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["mode"], r["batch"]) for r in rows] == [("failed", ""), ("eager", "1"), ("compiled", "1"), ("eager", "2")]
    assert rows[0]["error"].startswith("compile-first: CompileTimeout") and rows[2]["compile_s"] == "12.5"


def test_compile_first_out_of_memory_compiles_every_row_here(tmp_path, monkeypatch):
    """A subprocess that ran out of GPU memory beside the others (its rows after batch 1 unfinished) is
    no failure: the measured run compiles every row, batch 1 with its cold compile_s, the rest with their own."""
    cold = [
        {"case": "W4A16", "mode": "compiled", "batch": "1", "compile_s": "12.5"},
        {"case": "W4A16", "mode": "failed", "error": "AcceleratorError: CUDA error: out of memory"},
    ]
    monkeypatch.setattr(bench_model, "compile_first", lambda args, cases, log=print: {"W4A16": cold})
    out = tmp_path / "out"
    args = ["--model", "tiny", "--device", "cpu", "--cases", "W4A16", "--batches", "1", "2", "--eager-batches", "--context", "16"]
    assert bench_model.main(args + ["--prefill", "8", "--steps", "1", "--compile-first", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["mode"], r["batch"]) for r in rows] == [("compiled", "1"), ("compiled", "2"), ("prefill", "1")]
    assert rows[0]["compile_s"] == "12.5" and float(rows[0]["warm_compile_s"]) > 0
    assert float(rows[1]["compile_s"]) > 0 and not rows[1]["warm_compile_s"] and float(rows[2]["compile_s"]) > 0


def test_decode_step_writes_and_attends_at_pos_every_call():
    """transformers 5's static cache advances its own write counter per call; DecodeStep pins it to
    ``pos``: a step repeated at one position gives the same logits (no extra key per call), and
    equals a step on a cache filled only up to that position."""
    import torch

    from tests.hf_models import tiny_hf_model

    model = tiny_hf_model("llama", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    fill, ids = torch.randint(0, 256, (2, 12), generator=gen), torch.randint(0, 256, (2, 1), generator=gen)
    pos = torch.tensor([12])
    with torch.inference_mode():
        step = bench_model.DecodeStep(model, 20, 2)
        step(fill, torch.arange(12))
        first, again = step(ids, pos), step(ids, pos)
        for _ in range(3):
            step(ids, pos)
        later = step(ids, pos)
        fresh = bench_model.DecodeStep(model, 20, 2)
        fresh(fill, torch.arange(12))
        want = fresh(ids, pos)
    assert torch.equal(first, again) and torch.equal(first, later) and torch.equal(first, want)
    assert all(int(c) == 13 for c in step._counters) and len(step._counters) == model.config.num_hidden_layers
