"""Compile ops/int8/tma.py's W4A8 form for sm_90 without a GPU (run as a subprocess by
tests/ops/test_int8_gemm_tma.py) and print, per config, whether every folded group-scale PTX
call (``_scaled_nibbles``: one scale per 32-bit register of four codes) gets its packed bytes
from a layout whose four consecutive registers lie along K in one row: the one assumption that
PTX makes and that the Triton interpreter cannot check (the tile kernel's register-operand
layout broke it on the H200).

Output: one line per config, ``BMxBNxBK/warps/stages ok`` or ``... BAD <layout>``.
"""

from __future__ import annotations

import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qfuse.ops.int8.tma import _int8_gemm_tma_kernel  # noqa: E402


def _packs_along_k(layout: str) -> bool:
    """Whether registers 0-3 of each thread are k, k+1, k+2, k+3 of one row in this TTGIR layout."""
    blocked = re.match(r"#ttg\.blocked<\{sizePerThread = \[(\d+), (\d+)\].*order = \[(\d+), (\d+)\]", layout)
    if blocked:
        return int(blocked.group(2)) % 4 == 0 and blocked.group(3) == "1"
    linear = re.match(r"#ttg\.linear<\{register = \[\[(\d+), (\d+)\], \[(\d+), (\d+)\]", layout)
    if linear:
        return tuple(int(v) for v in linear.groups()) == (0, 1, 0, 2)
    return False


def check(bm: int, bn: int, bk: int, warps: int, stages: int) -> str:
    sig = {
        "x_desc": f"tensordesc<i8[{bm}, {bk}]>",
        "w_desc": f"tensordesc<u8[{bn}, {bk // 2}]>",
        "xs_ptr": "*fp32",
        "ws_ptr": "*fp32",
        "gs_ptr": "*i8",
        "bias_ptr": "*bf16",
        "out_ptr": "*bf16",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "PROGRAMS": "i32",
    }
    consts = dict(
        W4=True,
        GROUPED=True,
        UNPACK_ASM=True,
        X_PER_TOKEN=True,
        W_PER_CHANNEL=True,
        HAS_BIAS=False,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_N=8,
        PERSISTENT=False,
    )
    src = ASTSource(
        fn=_int8_gemm_tma_kernel,
        signature={**sig, **{k: "constexpr" for k in consts}},
        constexprs=consts,
        attrs={(i,): [["tt.divisibility", 16]] for i in (2, 3, 4, 5, 6, 9, 10)},
    )
    ttgir = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}).asm["ttgir"]
    aliases = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, flags=re.M))
    folded = [line for line in ttgir.splitlines() if "elementwise_inline_asm" in line and "mad.lo.u32" in line]
    if not folded:
        return "BAD no folded group-scale asm found"
    for line in folded:
        layout = re.search(r": tensor<\d+x\d+xi8, (#\w+)>", line).group(1)
        if not _packs_along_k(aliases.get(layout, layout)):
            return f"BAD {aliases.get(layout, layout)}"
    return "ok"


if __name__ == "__main__":
    for case in sys.argv[1:]:
        bm, bn, bk, warps, stages = (int(v) for v in case.split(","))
        print(f"{bm}x{bn}x{bk}/{warps}/{stages}", check(bm, bn, bk, warps, stages), flush=True)
