"""``qfuse bench picks`` without a GPU: the shipped keys it times and the before/after comparison."""

from __future__ import annotations

import csv
from pathlib import Path

from qfuse.bench import picks

TABLES = Path(__file__).resolve().parents[3] / "ops" / "tuned"


def test_shipped_keys_cover_every_table_entry():
    import json

    for op in picks.OPS:
        rows = picks.shipped_keys(TABLES, op, "NVIDIA_H200")
        assert len(rows) == len(json.loads((TABLES / f"{op}.NVIDIA_H200.json").read_text())) > 0
        assert all(r["op"] == op and r["m"] >= 1 and r["n"] > 0 and r["k"] > 0 for r in rows)
    wna16 = picks.shipped_keys(TABLES, "wna16_gemm", "NVIDIA_H200")
    assert {r["bits"] for r in wna16} == {4, 8} and {r["dtype"] for r in wna16} == {"bfloat16", "float16"}
    assert {r["group"] for r in picks.shipped_keys(TABLES, "w4a8_gemm", "NVIDIA_H200")} >= {-1, 128}
    assert picks.shipped_keys(TABLES, "wna16_gemm", "NO_SUCH_GPU") == []


def _write(path: Path, times: dict[int, float]) -> str:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=picks.FIELDS)
        w.writeheader()
        for m, us in times.items():
            w.writerow({"op": "w8a8_gemm", "m": m, "n": 4096, "k": 4096, "group": -1, "dtype": "bfloat16", "bits": 8, "us": us, "tree": ""})
    return str(path)


def test_compare_takes_each_keys_best_pass_and_flags_slower_keys(tmp_path, capsys):
    before = _write(tmp_path / "b1.csv", {1: 10.0, 16: 20.0}) + "," + _write(tmp_path / "b2.csv", {1: 9.0, 16: 21.0})
    after_same = _write(tmp_path / "a1.csv", {1: 9.1, 16: 20.2})
    assert picks.compare(before, after_same, 0.03) == 0
    out = capsys.readouterr().out
    assert "w8a8_gemm" in out and "slower" not in out
    after_slow = _write(tmp_path / "a2.csv", {1: 9.0, 16: 25.0})
    assert picks.compare(before, after_slow, 0.03) == 1
    assert "slower: ('w8a8_gemm', 16, 4096, 4096" in capsys.readouterr().out
