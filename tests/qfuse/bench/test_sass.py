"""``qfuse bench sass``: compiles a decode kernel for sm_90 on the CPU machine and counts the
hot loop's SASS instructions (the figures the kernels' docstrings quote)."""

from __future__ import annotations

import re

from qfuse.bench import sass


def test_word_gemv_instructions_per_byte(capfd):
    # the word GEMV's docstring: 8.23 per weight byte (4-bit, group 128, 128 x 16 words, triton
    # 3.7.1); another Triton may schedule a little differently, hence the band
    assert sass.main(["gemv_words", "--bits", "4", "--group", "128", "--config", '{"BLOCK_N": 128, "BLOCK_W": 16}']) == 0
    out = capfd.readouterr().out
    per_byte = float(re.search(r"instructions per weight byte ([0-9.]+)", out).group(1))
    assert 6.0 < per_byte < 11.0, out
    assert re.search(r"registers \d+\s+stack 0 B", out), out  # no spills
    assert "FFMA" in out and "LOP3" in out


def test_hot_loop_is_the_longest_backward_branch():
    text = "\n".join([
        "        /*0000*/  MOV R1, c[0x0][0x28] ;",
        ".L_x_0:",
        "        /*0010*/  FFMA R2, R3, R4, R2 ;",
        "        /*0020*/  LOP3.LUT R5, R6, 0xf, RZ, 0xc0, !PT ;",
        "        /*0030*/  @P0 BRA `(.L_x_0) ;",
        ".L_x_1:",
        "        /*0040*/  FADD R2, R2, R3 ;",
        "        /*0050*/  @P1 BRA `(.L_x_1) ;",
        "        /*0060*/  EXIT ;",
    ])
    loop = sass.hot_loop(text)
    assert [sass.opcode(line) for line in loop] == ["FFMA", "LOP3", "BRA"]


def test_bad_arguments_are_errors(capsys):
    assert sass.main(["not_a_kernel"]) == 2
    assert "unknown kernel" in capsys.readouterr().err
    assert sass.main(["gemv_words", "--config", "{BLOCK_N: 1"]) == 2
    assert "qfuse bench sass" in capsys.readouterr().err
