"""``qfuse bench sass``: compiles a decode kernel for sm_90 on the CPU machine and counts the
hot loop's SASS instructions (the figures the kernels' docstrings quote)."""

from __future__ import annotations

import json
import re

import pytest

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
    text = "\n".join(
        [
            "        /*0000*/  MOV R1, c[0x0][0x28] ;",
            ".L_x_0:",
            "        /*0010*/  FFMA R2, R3, R4, R2 ;",
            "        /*0020*/  LOP3.LUT R5, R6, 0xf, RZ, 0xc0, !PT ;",
            "        /*0030*/  @P0 BRA `(.L_x_0) ;",
            ".L_x_1:",
            "        /*0040*/  FADD R2, R2, R3 ;",
            "        /*0050*/  @P1 BRA `(.L_x_1) ;",
            "        /*0060*/  EXIT ;",
        ]
    )
    loop = sass.hot_loop(text)
    assert [sass.opcode(line) for line in loop] == ["FFMA", "LOP3", "BRA"]


def test_mnemonic_drops_address_and_predicate():
    # the memory line counts loads by mnemonic: a predicated load is still an LDG.E.EF.128
    assert sass.mnemonic("        /*0fd0*/              @!P0 LDG.E.EF.128 R8, desc[UR4][R8.64] ;") == "LDG.E.EF.128"
    assert sass.opcode("        /*0fe0*/                   LDS.U16 R131, [R126+UR8] ;") == "LDS"


def test_bad_arguments_are_errors(capsys):
    assert sass.main(["not_a_kernel"]) == 2
    assert "unknown kernel" in capsys.readouterr().err
    assert sass.main(["gemv_words", "--config", "{BLOCK_N: 1"]) == 2
    assert "qfuse bench sass" in capsys.readouterr().err


def test_every_kernel_compiles_with_its_launchers_options():
    # bench sass compiles with the launcher's own defaults (num_stages changes the word GEMV's
    # code), read from each kernel module's LAUNCH_OPTIONS
    cfgs = {
        "gemv_words": {"BLOCK_N": 32, "BLOCK_W": 64},
        "mma_gemv": {},
        "tiled_planes": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
        "mma_words": {"BLOCK_M": 16, "BLOCK_N": 128},
        "w4a8_gemv": {"BLOCK_N": 2, "BLOCK_W": 32},
        "w4a8_mma_words": {"BLOCK_M": 16, "BLOCK_N": 128},
        "w8a8_gemv": {"BLOCK_N": 2, "BLOCK_W": 32},
        "moe_grouped_words": {"BLOCK_M": 16, "BLOCK_N": 128},
        "decode_attention": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_D": 128},
    }
    for kernel, cfg in cfgs.items():
        fn = sass.kernel_spec(kernel, 4, 128, False, "bf16", cfg)[0]
        options = sass.launch_options(fn)
        assert options["num_stages"] in (1, 2, 3, 4), kernel
        assert options.get("enable_fp_fusion", True) is (not kernel.startswith(("w4a8", "w8a8"))), kernel


def test_tiled_tma_prints_its_wgmma_loop(capfd):
    """The TMA kernel (a WORDS tile): the MMA loop's own count and its waits and register writes."""
    cfg = '{"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3, "WORDS": 1}'
    assert sass.main(["tiled_tma", "--group", "-1", "--config", cfg]) == 0
    out = capfd.readouterr().out
    loop = int(out.split("wgmma loop ")[1].split()[0])
    assert 0 < loop <= int(out.split(" loop ")[1].split()[0]), out  # within the hot loop
    assert "per weight byte" in out and " 0 writes to registers of a wgmma in flight" in out, out


def _wgmma_loop_text(first_wait: int, second_wait: int, top: str) -> str:
    """A loop of two HGMMAs (register A operands R8-R11 and R12-R15, accumulator R24-R27) whose
    first instruction is ``top``."""
    return "\n".join(
        [
            ".L_x_0:",
            f"        /*0100*/  {top} ;",
            "        /*0110*/  WARPGROUP.ARRIVE ;",
            "        /*0120*/  HGMMA.64x8x16.F32.BF16 R24, R8, gdesc[UR4], R24, gsb0 ;",
            f"        /*0130*/  WARPGROUP.DEPBAR.LE gsb0, 0x{first_wait} ;",
            "        /*0140*/  F2FP.BF16.F32.PACK_AB R12, R3, R2 ;",
            "        /*0150*/  HGMMA.64x8x16.F32.BF16 R24, R12, gdesc[UR8], R24, gsb0 ;",
            f"        /*0160*/  WARPGROUP.DEPBAR.LE gsb0, 0x{second_wait} ;",
            "        /*0170*/  @P0 BRA `(.L_x_0) ;",
            ".L_x_1:",  # an out-of-line barrier retry jumping back into the loop: a longer region
            "        /*0180*/  @!P1 BRA `(.L_x_1) ;",
            "        /*0190*/  BRA `(.L_x_0) ;",
        ]
    )


def test_wgmma_pipeline_finds_writes_to_registers_of_a_wgmma_in_flight():
    # one wgmma left in flight across the back edge: the second one's A operand (R12-R15) is
    # still being read when the next iteration's first instruction writes R13
    loop = sass.wgmma_loop(_wgmma_loop_text(1, 1, "LDS.U16 R13, [R2]"))
    assert [sass.opcode(line) for line in loop][-1] == "BRA" and len(loop) == 8
    waits, hazards = sass.wgmma_pipeline(loop)
    assert waits == [1, 1] and len(hazards) == 1 and "LDS.U16 R13" in hazards[0] and "R12" in hazards[0]
    # R8 (the first wgmma's operand) is retired by then; and the write to R12 inside the loop
    # comes after the wait that retires the previous iteration's second wgmma
    assert sass.wgmma_pipeline(sass.wgmma_loop(_wgmma_loop_text(1, 1, "LDS.U16 R9, [R2]")))[1] == []
    # a 64-bit load into R26-R27 overwrites the accumulator of both wgmmas in flight
    assert len(sass.wgmma_pipeline(sass.wgmma_loop(_wgmma_loop_text(1, 1, "LDS.64 R26, [R2]")))[1]) == 1
    # serialized (ptxas C7515): every wait 0, nothing in flight to overwrite
    assert sass.wgmma_pipeline(sass.wgmma_loop(_wgmma_loop_text(0, 0, "LDS.U16 R13, [R2]"))) == ([0, 0], [])
    assert sass.wgmma_loop("        /*0000*/  EXIT ;") == []


def test_moe_grouped_words_fc1_reads_two_tiles_per_iteration(capfd):
    """fused_moe's word MMA: fc1's loop (gate and up tiles) is about twice fc2's, and per weight byte
    both stay under the dense word GEMV's ~8 (sm_90, 128 rows, 8 warps)."""
    loops = []
    for cfg in ('{"GATED": true}', '{"GATED": false}'):
        assert sass.main(["moe_grouped_words", "--config", cfg]) == 0
        out = capfd.readouterr().out
        loops.append((int(re.search(r"loop (\d+) instructions", out).group(1)), float(re.search(r"per weight byte ([\d.]+)", out).group(1))))
    (fc1, fc1_per_byte), (fc2, fc2_per_byte) = loops
    assert 1.5 * fc2 < fc1 < 2.2 * fc2
    assert fc1_per_byte < 7 and fc2_per_byte < 7


@pytest.mark.parametrize(
    "block_m, block_d, mask_kind, direct", [(16, 128, 0, True), (16, 128, 1, False), (32, 128, 2, True), (64, 128, 1, False), (32, 256, 1, False)]
)
def test_decode_attention_compiles_for_sm90_without_spills(block_m, block_d, mask_kind, direct, capfd):
    """The decode-attention kernel's tiles with their launcher's warps (normalized output or partials,
    each mask kind, head_dim 128 and 256): no stack (a general head-dim stride cost 255 registers
    and a stack)."""
    from qfuse.ops.attention.decode_kernels import warps_for

    cfg = {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_D": block_d, "MASK_KIND": mask_kind, "DIRECT": direct, "num_warps": warps_for(block_m, block_d)}
    assert sass.main(["decode_attention", "--config", json.dumps(cfg)]) == 0
    out = capfd.readouterr().out
    registers = int(re.search(r"registers (\d+)", out).group(1))
    assert "stack 0 B" in out and registers < 255, out
    assert re.search(r"HMMA|wgmma loop", out), out  # tensor cores: mma.sync up to 32 rows, wgmma at 64


def test_interpreter_rerun_passes_the_module_command_line(monkeypatch):
    """Under TRITON_INTERPRET=1 ``python -m qfuse.bench.sass ARGS`` (``main()``) reruns itself with ARGS."""
    import subprocess
    import sys

    calls = []
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(sys, "argv", ["sass.py", "gemv_words", "--bits", "8"])
    monkeypatch.setattr(subprocess, "run", lambda cmd, env: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert sass.main() == 0
    assert calls[0][-5:] == ["bench", "sass", "gemv_words", "--bits", "8"]
