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


def test_demo_without_a_cxx_compiler_still_prints_its_table(capsys):
    """Inductor's CPU code needs a C++ compiler: without one the compiled column says so, the rest runs."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        assert main(["demo", "--schemes", "W8A8", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("W8A8"))
    assert row[4:7] == ["no", "C++", "cc"] and "vs fp16" in out and "needs a C++ compiler" in out


def test_unknown_bench_and_scheme(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "nope"])
    with pytest.raises(SystemExit) as e:
        main(["demo", "--schemes", "W2A2", "--no-compile"])
    assert e.value.code == 2 and "valid schemes" in capsys.readouterr().err


def test_warnings_are_one_line(capsys):
    import warnings

    from qfuse.cli import _warnings_as_lines

    with _warnings_as_lines():
        warnings.warn("quantize_model: something to know", UserWarning, stacklevel=1)
    assert capsys.readouterr().err == "qfuse: warning: quantize_model: something to know\n"
