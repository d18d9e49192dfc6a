import pytest

from qfuse.cli import main


def test_demo_prints_table(capsys):
    assert main(["demo", "--schemes", "W8A8", "W4A16"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for name in ("W8A8", "W4A16"):
        row = lines[name]
        max_err, mean_err, rel = map(float, row[1:4])
        assert 0 < mean_err <= max_err and rel < 0.4
        assert float(row[4]) < 0.05  # compiled vs eager
    assert lines["W8A8"][5] == "6"  # 2 layers x (input norm, post-attention norm, SiLU-and-mul)
    assert lines["W4A16"][5] == "-"
    assert "bfloat16" in lines


def test_unknown_bench_and_scheme():
    with pytest.raises(SystemExit):
        main(["bench", "nope"])
    with pytest.raises(ValueError, match="valid schemes"):
        main(["demo", "--schemes", "W2A2", "--no-compile"])
