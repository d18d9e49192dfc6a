"""``qfuse bench report``: markdown tables from benchmark CSVs (stdlib only, no GPU)."""

from __future__ import annotations

import csv

import pytest

from qfuse import cli
from qfuse.bench import report, timing

GEMM_ROWS = [
    # a row whose CSV carries the bench's own ratios (computed from unrounded times) ...
    {
        "shape": "4096x4096",
        "N": 4096,
        "K": 4096,
        "M": 1,
        "bits": 4,
        "config": "{'BLOCK_N': 8, 'BLOCK_W': 256, 'SPLIT_K': 1, 'kernel': 'gemv_words', 'num_warps': 4}",
        "op_us": 5.35,
        "bf16_us": 13.88,
        "tinygemm_us": 7.12,
        "gemlite_us": 8.38,
        "floor_us": 2.11,
        "speedup_vs_bf16": 2.59,
        "pct_of_floor": 39.34,
    },
    # ... and one without them: computed from the times
    {
        "shape": "28672x4096",
        "N": 28672,
        "K": 4096,
        "M": 64,
        "bits": 4,
        "config": "{'BLOCK_K': 128, 'BLOCK_M': 64, 'BLOCK_N': 128, 'SPLIT_K': 1, 'WORDS': True, 'kernel': 'tiled_tma', 'num_warps': 4}",
        "op_us": 40.0,
        "bf16_us": 64.0,
        "tinygemm_us": 520.0,
        "gemlite_us": 100.0,
        "floor_us": 16.0,
        "speedup_vs_bf16": "",
        "pct_of_floor": "",
    },
]


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_gemm_table_rows_and_ratios(tmp_path):
    lines = report.table(write_csv(tmp_path / "w4.csv", GEMM_ROWS)).splitlines()
    assert lines[0] == "| N x K | M | us | bf16 us | x bf16 | tinygemm us | x tinygemm | gemlite us | x gemlite | % of floor | kernel |"
    assert lines[1] == "|" + "---|" * 11
    assert lines[2] == "| 4096x4096 | 1 | 5.35 | 13.88 | 2.59 | 7.12 | 1.33 | 8.38 | 1.57 | 39 % | gemv_words 8x256w SK1 4w |"
    assert lines[3] == "| 28672x4096 | 64 | 40 | 64 | 1.60 | 520 | 13.00 | 100 | 2.50 | 40 % | tiled_tma 64x128x128 SK1 4w WORDS |"
    assert len(lines) == 4


def test_peer_columns_only_where_measured(tmp_path):
    rows = [{**r, "tinygemm_us": "", "gemlite_us": ""} for r in GEMM_ROWS]
    header = report.table(write_csv(tmp_path / "w8.csv", rows)).splitlines()[0]
    assert "tinygemm" not in header and "gemlite" not in header


def test_w4a8_table_and_filters(tmp_path):
    rows = [
        {
            "shape": "8192x8192",
            "N": 8192,
            "K": 8192,
            "M": m,
            "bf16_us": 36.0,
            "int_mm_us": 32.0,
            "w4a8_pc_us": pc,
            "w4a8_pc_cfg": "gemv/m1",
            "w4a8_g128_us": g,
            "w4a8_g128_cfg": "mma_words",
            "floor_w4a8_us": 8.0,
        }
        for m, pc, g in ((1, 12.0, 16.0), (2, 14.4, 14.4), (4, 18.0, 20.0))
    ]
    path = write_csv(tmp_path / "w4a8.csv", rows)
    lines = report.table(path, ["M>=2"]).splitlines()
    assert len(lines) == 4
    # pc x bf16, g128 x bf16, g128 / pc (the g128 op's speed relative to pc's), pc x _int_mm, pc % of floor
    # (floor_w4a8_us is group 128's: the per-channel floor leaves out its 8192 * 64 bytes of group scales)
    assert lines[2] == "| 8192x8192 | 2 | 14.4 | 14.4 | 36 | 2.50 | 2.50 | 1.00 | 2.22 | 55 % | gemv/m1 | mma_words |"
    assert [ln.split(" | ")[1] for ln in report.table(path, ["M=1,4"]).splitlines()[2:]] == ["1", "4"]
    assert report.table(path, ["M<=1"]).splitlines()[2].startswith("| 8192x8192 | 1 | 12 | 16 | 36 | 3.00 | 2.25 | 0.75 |")


def test_w4a8_pc_floor_has_no_group_scales(tmp_path):
    """``pc % of floor``: the per-channel op's floor (``floor_w4a8_pc_us``); a CSV without that column
    has only group 128's ``floor_w4a8_us``, whose bytes include the int8 group scales the per-channel
    op never reads, so it is scaled to the per-channel bytes."""
    from qfuse.bench._floors import int8_gemm_bytes

    row = {"shape": "28672x4096", "M": 1, "bf16_us": 60.5, "int_mm_us": 48.8, "w4a8_pc_us": 18.75, "w4a8_g128_us": 18.95}
    g128_floor = int8_gemm_bytes(1, 28672, 4096, 4, 128) / 4.19e12 * 1e6  # 14.28 us at 4.19 TB/s: 76 % of 18.75
    pc_floor = int8_gemm_bytes(1, 28672, 4096, 4) / 4.19e12 * 1e6  # 14.06 us
    legacy = report.table(write_csv(tmp_path / "old.csv", [{**row, "floor_w4a8_us": round(g128_floor, 2)}])).splitlines()[2]
    assert legacy.split(" | ")[9] == f"{100 * pc_floor / 18.75:.0f} %" == "75 %"
    both = {**row, "floor_w4a8_us": round(g128_floor, 2), "floor_w4a8_pc_us": 12.0}
    assert report.table(write_csv(tmp_path / "new.csv", [both])).splitlines()[2].split(" | ")[9] == "64 %"


def test_write_and_check_refill_the_marked_tables(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "w4.csv", GEMM_ROWS)
    md = tmp_path / "B.md"
    md.write_text("# B\n\nText.\n<!-- report data/w4.csv M=64 -->\n| stale |\n\n<!-- report end -->\n\nMore text.\n")
    assert report.main(["--check", str(md)]) == 1
    assert report.main(["--write", str(md)]) == 0
    text = md.read_text()
    assert "| stale |" not in text and text.startswith("# B\n\nText.\n<!-- report data/w4.csv M=64 -->\n| N x K |")
    assert "| 28672x4096 | 64 |" in text and "| 4096x4096 |" not in text and text.endswith("\n\n<!-- report end -->\n\nMore text.\n")
    assert report.main(["--check", str(md)]) == 0
    assert report.main([str(tmp_path / "data")]) == 0
    assert capsys.readouterr().out.startswith("### w4.csv\n\n| N x K |")


@pytest.mark.parametrize(
    "start, end",
    [
        ("<!-- report data/w4.csv M=64-->", "<!-- report end -->"),  # no space before -->
        ("<!-- report data/w4.csv  M=64 -->", "<!-- report end -->"),  # two spaces
        ("<!-- report data/w4.csv M=64 -->", ""),  # no end marker
    ],
)
def test_a_malformed_marker_stops_write_and_check(tmp_path, start, end):
    """A marker line the table pattern does not take would leave its table unchecked: --check and --write stop."""
    (tmp_path / "data").mkdir()
    write_csv(tmp_path / "data" / "w4.csv", GEMM_ROWS)
    md = tmp_path / "B.md"
    text = f"# B\n{start}\n| stale |\n\n{end}\n"
    md.write_text(text)
    for option in ("--check", "--write"):
        with pytest.raises(SystemExit, match="line 2: .* starts no marked table"):
            report.main([option, str(md)])
    assert md.read_text() == text
    # a missing end marker before the next table: the first table's pattern would run into the second
    md.write_text(f"{start}\n| stale |\n\n<!-- report data/w4.csv M=1 -->\n| stale |\n\n<!-- report end -->\n")
    with pytest.raises(SystemExit, match="starts no marked table"):
        report.main(["--check", str(md)])


def test_unknown_csv_and_bad_filter_stop_with_one_line(tmp_path):
    path = write_csv(tmp_path / "x.csv", [{"a": 1}])
    with pytest.raises(SystemExit, match="not a CSV of a known benchmark"):
        report.table(path)
    with pytest.raises(SystemExit, match="bad row filter"):
        report.table(write_csv(tmp_path / "w4.csv", GEMM_ROWS), ["M~1"])


def test_runs_as_a_bench_subcommand_without_a_gpu(tmp_path, capsys):
    assert "report" in cli._bench_names()
    assert cli.main(["bench", "report", str(write_csv(tmp_path / "w4.csv", GEMM_ROWS))]) == 0
    assert "| 4096x4096 | 1 |" in capsys.readouterr().out


def test_moe_by_case_pivots_one_row_per_shape_and_m(tmp_path):
    def row(m, case, us, pct=None):
        return {"shape": "mixtral-8x7b", "M": m, "case": case, "us": us, "x_bf16": "", "x_loop": "", "pct_of_floor": pct or "",
                "floor_us": 50.0, "bf16_us": 200.0, "loop_us": 250.0, "experts_touched": 2, "config": ""}  # fmt: skip

    path = write_csv(tmp_path / "moe.csv", [row(1, "bf16", 200.0), row(1, "W4A16", 80.0, 62.5), row(1, "W8A8", 100.0), row(16, "bf16", 200.0)])
    lines = report.table(path, ["by_case"]).splitlines()
    assert lines[0] == "| shape | M | experts touched | bf16 us | W4A16 x bf16 (% floor) | W8A8 x bf16 (% floor) |"
    assert lines[2] == "| mixtral-8x7b | 1 | 2 | 200 | 2.50 (62 %) | 2.00 (50 %) |"  # stored pct, else floor / us
    assert lines[3] == "| mixtral-8x7b | 16 | 2 | 200 |  |  |"
    assert len(report.table(path, ["by_case", "M=16"]).splitlines()) == 3
    gemm = write_csv(tmp_path / "gemm.csv", GEMM_ROWS)
    with pytest.raises(SystemExit, match="by_case needs a qfuse bench moe CSV"):
        report.table(gemm, ["by_case"])


def test_model_build_peak_column_only_where_measured(tmp_path):
    row = {"model": "llama3-8b", "layers": 32, "case": "W4A16", "weight_gb": 5.7, "mode": "compiled", "batch": 1, "tokens": 1}
    row |= {"ms": 3.33, "tokens_per_s": 300.3, "x_bf16": 1.805, "peak_gb": 6.9, "compile_s": 42.4}
    old = report.table(write_csv(tmp_path / "model_old.csv", [row])).splitlines()
    assert old[0] == "| case | mode | batch | tokens | ms | tokens/s | x bf16 | weights GB | peak GB | compile s |"
    new = report.table(write_csv(tmp_path / "model_new.csv", [{**row, "build_peak_gb": 21.8}])).splitlines()
    assert new[0] == "| case | mode | batch | tokens | ms | tokens/s | x bf16 | weights GB | peak GB | build peak GB | compile s |"
    assert new[2] == "| W4A16 | compiled | 1 | 1 | 3.33 | 300.3 | 1.805 | 5.7 | 6.9 | 21.8 | 42.4 |"


def test_word_order_table(tmp_path):
    """``qfuse bench word_order``'s CSV: a permutation row (no N) and GEMM rows, with and without ATen's order."""
    rows = [
        {"kind": "permute", "M": 2048, "N": "", "K": 4096, "config": "BLOCK_K 64", "us": 11.6, "us_aten": 28.1, "GB_s": 2897.0},
        {"kind": "gemm", "M": 2048, "N": 4096, "K": 14336, "config": "op", "us": 387.8, "us_aten": "", "max_err": 0.0},
        {"kind": "gemm", "M": 2048, "N": 4096, "K": 14336, "config": "words s3", "us": 377.6, "us_aten": 456.3, "max_err": 0.12},
    ]
    path = tmp_path / "word_order.csv"
    timing.write_csv(rows, path)  # the bench's writer: the union of the rows' columns
    lines = report.table(path).splitlines()
    assert lines[0] == "| what | M | N x K | config | us | us, ATen's order | x ATen's order |"
    assert lines[2] == "| permute | 2048 | K 4096 | BLOCK_K 64 | 11.6 | 28.1 | 2.42 |"
    assert lines[3] == "| gemm | 2048 | 4096 x 14336 | op | 387.8 |  |  |"
    assert lines[4] == "| gemm | 2048 | 4096 x 14336 | words s3 | 377.6 | 456.3 | 1.21 |"
