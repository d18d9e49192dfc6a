"""``qfuse bench sass``: static sm_90 SASS statistics of one decode-kernel config; no GPU needed.

The decode kernels' docstrings and the dispatcher quote "SASS instructions per weight byte"
(a decode GEMV on the H200 is issue-bound near ~8 of them per byte; BENCHMARKS.md). This
reproduces such a figure on any machine with the installed Triton: the kernel is compiled for
sm_90 (``triton.compile`` with an explicit signature; pointers and the integer arguments that
are multiples of 16 on the usual shapes marked 16-divisible, as a real launch specializes them), disassembled with Triton's bundled ``nvdisasm``, and the hot loop is
the longest region closed by a backward branch::

    qfuse bench sass gemv_words --bits 4 --group 128 --config '{"BLOCK_N": 32, "BLOCK_W": 64, "num_warps": 4}'

prints registers and spill bytes per thread (``cuobjdump -res-usage``), the loop's instruction
count and opcode histogram, and instructions per weight byte = loop instructions x threads /
weight bytes one loop iteration of a program reads. Kernels: ``gemv_words`` (W4A16 / W8A16), ``mma_gemv``,
``tiled_planes`` and ``mma_words`` (W4A16), ``tiled_tma`` (W4A16 / W8A16), ``w4a8_gemv`` and ``w4a8_mma_words`` (W4A8), ``w8a8_gemv``,
``moe_grouped_words`` (fused_moe's W4A16 word MMA; ``"GATED": false`` in the config for fc2),
``decode_attention`` (per K / V byte; ``MASK_KIND`` 0 / 1 / 2 and ``DIRECT`` in the config). A static count: the real rate also
depends on occupancy and stalls (see the ncu profile in BENCHMARKS.md).

For a kernel with wgmma it also prints the MMA loop's ``WARPGROUP.DEPBAR`` counts (all 0: ptxas
serialized the wgmmas) and any instruction that writes a register of a wgmma still in flight
(:func:`wgmma_pipeline`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile


def kernel_spec(kernel: str, bits: int, group: int, zeros: bool, dtype: str, cfg: dict):
    """``(jit function, signature, constexprs, weight bytes per loop iteration)`` of a config."""
    ptrs = {
        "x_ptr": f"*{dtype}",
        "s_ptr": f"*{dtype}",
        "z_ptr": "*u8",
        "bias_ptr": f"*{dtype}",
        "out_ptr": f"*{dtype}",
        "ws_ptr": "*fp32",
        "count_ptr": "*i32",
    }
    if kernel == "gemv_words":
        from qfuse.ops.wna16.gemv_words import _wna16_gemv_words_kernel as fn

        sig = {
            "x_ptr": ptrs["x_ptr"],
            "qw_ptr": "*i32",
            **{k: v for k, v in ptrs.items() if k != "x_ptr"},
            "experts_ptr": "*i32",  # the dense launch passes the words (fused_moe: the pairs' experts)
            "M": "i32",
            "N": "i32",
            "KW": "i32",
            "G": "i32",
            "W_PER_SPLIT": "i32",
            "SPLIT_K": "i32",
            "MAGIC_BITS": "i32",
            "CODE_MASK": "i32",
        }
        consts = dict(
            BITS=bits,
            GROUP=group,
            HAS_ZEROS=zeros,
            HAS_BIAS=False,
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_W=cfg["BLOCK_W"],
            VEC=cfg.get("VEC", 4 if (bits == 8 or cfg.get("HFMA2")) and cfg["BLOCK_W"] % 4 == 0 else 1),
            HFMA2=int(cfg.get("HFMA2", 0)),
            ASM=True,
            EXPERTS=False,
            TILED=bool(cfg.get("TILED", False)),
            ROW_DIV=1,
        )
        return fn, sig, consts, cfg["BLOCK_N"] * cfg["BLOCK_W"] * 4
    if kernel == "mma_gemv":
        from qfuse.ops.wna16.mma_gemv import _w4a16_mma_gemv_kernel as fn

        sig = {
            "x_ptr": ptrs["x_ptr"],
            "qw_ptr": "*i32",
            **{k: v for k, v in ptrs.items() if k != "x_ptr"},
            "M": "i32",
            "N": "i32",
            "KW": "i32",
            "G": "i32",
            "W_PER_SPLIT": "i32",
            "SPLIT_K": "i32",
        }
        nw = cfg.get("num_warps", 4)
        consts = dict(GROUP=group, HAS_ZEROS=zeros, HAS_BIAS=False, ROW_TILES=cfg.get("ROW_TILES", 1), STEPS=cfg.get("STEPS", 1), NW=nw, ASM=True)
        return fn, sig, consts, 16 * cfg.get("ROW_TILES", 1) * nw * 64 * cfg.get("STEPS", 1)  # STEPS 128-code steps of each row
    if kernel == "tiled_planes":
        from qfuse.ops.wna16.tiled_planes import _w4a16_tiled_planes_kernel as fn

        halves = cfg.get("PLANES", 2) == 4
        sig = {
            "x_ptr": ptrs["x_ptr"],
            "qw_ptr": "*i16" if halves else "*u8",
            **{k: v for k, v in ptrs.items() if k != "x_ptr"},
            "M": "i32",
            "N": "i32",
            "K": "i32",
            "KB": "i32",
            "G": "i32",
            "stride_xm": "i32",
            "K_PER_SPLIT": "i32",
        }
        consts = dict(
            GROUP=group,
            HAS_ZEROS=zeros,
            HAS_BIAS=False,
            SPLIT_K=cfg.get("SPLIT_K", 1),
            EVEN_K=True,
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_K=cfg["BLOCK_K"],
            GROUP_M=8,
            SWAP_AB=bool(cfg.get("SWAP_AB", False)) or bool(cfg.get("JOIN", False)),
            HALVES=halves,
            JOIN=bool(cfg.get("JOIN", False)),
            ASM=True,
            DOT_F32=False,
        )
        return fn, sig, consts, cfg["BLOCK_N"] * cfg["BLOCK_K"] // 2
    if kernel == "mma_words":
        from qfuse.ops.wna16.mma_words import _w4a16_mma_words_kernel as fn

        sig = {
            "x_ptr": ptrs["x_ptr"],
            "qw_ptr": "*i32",
            **{k: v for k, v in ptrs.items() if k != "x_ptr"},
            "M": "i32",
            "N": "i32",
            "K": "i32",
            "KW": "i32",
            "G": "i32",
            "stride_xm": "i32",
            "W_PER_SPLIT": "i32",
        }
        consts = dict(
            GROUP=group,
            HAS_ZEROS=zeros,
            HAS_BIAS=False,
            SPLIT_K=cfg.get("SPLIT_K", 1),
            SCALE_W=bool(cfg.get("SCALE_W", False)),
            BYTE_PAIRS=bool(cfg.get("BYTE_PAIRS", False)),
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_N=cfg["BLOCK_N"],
            GROUP_M=8,
            ASM=True,
            DOT_F32=False,
        )
        return fn, sig, consts, cfg["BLOCK_N"] * 64  # one 128-code tile per row
    if kernel == "moe_grouped_words":
        from qfuse.ops.moe.grouped_words import _moe_mma_words_kernel as fn

        gated = bool(cfg.get("GATED", True))  # fc1 (gate and up tiles per iteration) or fc2
        sig = {
            "x_ptr": ptrs["x_ptr"],
            "qw_ptr": "*i32",
            "s_ptr": ptrs["s_ptr"],
            "z_ptr": ptrs["z_ptr"],
            "topw_ptr": "*fp32",
            "out_ptr": ptrs["out_ptr"] if gated else "*fp32",
            "sorted_ids_ptr": "*i32",
            "expert_ids_ptr": "*i32",
            "total_ptr": "*i32",
            "xs_ptr": "*fp32",
            "P": "i32",
            "N": "i32",
            "KW": "i32",
            "G": "i32",
            "stride_xm": "i32",
            "ROW_DIV": "i32",
            "W_PER_SPLIT": "i32",
        }
        consts = dict(
            GATED=gated,
            GROUP=group,
            HAS_ZEROS=zeros,
            SCALE_W=bool(cfg.get("SCALE_W", False)),
            X_WORDS=bool(cfg.get("X_WORDS", False)),
            FOLD_ZERO=bool(cfg.get("FOLD_ZERO", False)),
            TILED=bool(cfg.get("TILED", False)),
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_N=cfg["BLOCK_N"],
            ASM=True,
            DOT_F32=False,
            INTERPRET=False,
        )
        return fn, sig, consts, cfg["BLOCK_N"] * 64 * (2 if gated else 1)  # one 128-code tile per row (fc1: two)
    if kernel == "tiled_tma":
        from qfuse.ops.wna16.tma import _wna16_tma_kernel as fn

        bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"] if group == -1 else min(cfg["BLOCK_K"], group)
        tail = cfg.get("TAIL_SPLIT", 0)  # TAIL_SPLIT: the tail launch (the whole waves run the config without it)
        consts = dict(
            BITS=bits,
            GROUP=group,
            HAS_ZEROS=zeros,
            HAS_BIAS=False,
            SPLIT_K=tail if tail > 1 else cfg.get("SPLIT_K", 1),
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=8,
            ASM=True,
            DOT_F32=False,
            TAIL_SPLIT=tail,
            WORDS=bool(cfg.get("WORDS", False)),
        )
        # the kernel's parameters in order (FULL_TILES comes after the constexprs); 8-bit codes as int16 pairs, WORDS as int32 words
        w_block = f"i32[{bn}, {bk // 8}]" if consts["WORDS"] else f"{'u8' if bits == 4 else 'i16'}[{bn}, {bk // 2}]"
        args = {
            "x_desc": f"tensordesc<{dtype}[{bm}, {bk}]>",
            "w_desc": f"tensordesc<{w_block}>",
            "s_ptr": f"*{dtype}",
            "z_ptr": "*u8",
            "bias_ptr": f"*{dtype}",
            "out_ptr": f"*{dtype}",
            "ws_ptr": "*fp32",
            "count_ptr": "*i32",
            "M": "i32",
            "N": "i32",
            "K": "i32",
            "G": "i32",
            "K_PER_SPLIT": "i32",
            "FULL_TILES": "i32",
        }
        sig = {q.name: args.get(q.name, "constexpr") for q in fn.params}
        return fn, sig, consts, bn * bk * bits // 8
    int8 = {"x_ptr": "*i32", "xs_ptr": "*fp32", "w_ptr": "*i32", "ws_ptr": "*fp32"}
    if kernel == "w4a8_gemv":
        from qfuse.ops.int8.gemv import _w4a8_gemv_kernel as fn

        sig = {
            **int8,
            "gs_ptr": "*i8",
            "bias_ptr": f"*{dtype}",
            "out_ptr": f"*{dtype}",
            "acc_ws_ptr": "*i32",
            "count_ptr": "*i32",
            "M": "i32",
            "N": "i32",
            "KW4": "i32",
            "W_PER_SPLIT": "i32",
            "G": "i32",
        }
        consts = dict(GROUPED=group == 128)
    elif kernel == "w4a8_mma_words":
        from qfuse.ops.int8.mma_words import _w4a8_mma_words_kernel, _w4a8_mma_words_stream_kernel

        stream = bool(cfg.get("STREAM"))
        fn = _w4a8_mma_words_stream_kernel if stream else _w4a8_mma_words_kernel
        sig = {
            "x_ptr": "*i8",
            "xs_ptr": "*fp32",
            "w_ptr": "*u8",
            "ws_ptr": "*fp32",
            "gs_ptr": "*i8",
            "bias_ptr": f"*{dtype}",
            "out_ptr": f"*{dtype}",
            "acc_ws_ptr": "*i32",
            "count_ptr": "*i32",
            "M": "i32",
            "N": "i32",
            "K": "i32",
            "KB": "i32",
            "G": "i32",
            **({"KT": "i32", "UNITS": "i32"} if stream else {"B_PER_SPLIT": "i32"}),
        }
        consts = dict(
            GROUPED=group == 128,
            X_PER_TOKEN=True,
            W_PER_CHANNEL=True,
            HAS_BIAS=False,
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_N=cfg["BLOCK_N"],
            GROUP_N=8,
            GS_FOLD=bool(cfg.get("GS_FOLD", 0)),
            ASM=True,
        )
        if not stream:
            consts["SPLIT"] = cfg.get("SPLIT_K", 1) > 1
        return fn, sig, consts, cfg["BLOCK_N"] * 64  # one 128-code tile per row
    elif kernel == "decode_attention":
        from qfuse.ops.attention.decode_kernels import _decode_attention_kernel as fn

        names = ["q_ptr", "k_ptr", "v_ptr", "mask_ptr", "out_ptr", "part_acc_ptr", "part_ml_ptr"]
        types = [f"*{dtype}"] * 3 + ["*u8", f"*{dtype}", "*fp32", "*fp32"]
        ints = ["Hkv", "G", "L", "S", "D", "n_splits", "blocks_per_split"]
        strides = ["sq_b", "sq_h", "sq_l", "sk_b", "sk_h", "sk_s", "sv_b", "sv_h", "sv_s", "sm_b", "sm_l", "sm_s", "so_b", "so_h", "so_l"]
        sig = {**dict(zip(names, types)), **{n: "i32" for n in ints}, "scale_log2e": "fp32", **{n: "i32" for n in strides}}
        consts = dict(
            MASK_KIND=cfg.get("MASK_KIND", 1),
            DIRECT=bool(cfg.get("DIRECT", False)),
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_D=cfg["BLOCK_D"],
            INTERPRET=False,
        )
        return fn, sig, consts, cfg["BLOCK_N"] * cfg["BLOCK_D"] * 2 * 2  # a K and a V block, 16-bit
    elif kernel == "w8a8_gemv":
        from qfuse.ops.int8.gemv8 import _w8a8_gemv_kernel as fn

        sig = {
            **int8,
            "bias_ptr": f"*{dtype}",
            "out_ptr": f"*{dtype}",
            "acc_ws_ptr": "*i32",
            "count_ptr": "*i32",
            "M": "i32",
            "N": "i32",
            "KW4": "i32",
            "W_PER_SPLIT": "i32",
        }
        consts = {}
    else:
        raise ValueError(f"unknown kernel {kernel!r}")
    consts.update(
        X_PER_TOKEN=True,
        W_PER_CHANNEL=True,
        HAS_BIAS=False,
        BLOCK_M=cfg.get("BLOCK_M", 1),
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_W=cfg["BLOCK_W"],
        SPLIT=cfg.get("SPLIT_K", 1) > 1,
        DP4A_ASM=True,
        PREFETCH=bool(cfg.get("PREFETCH", 0)),
    )
    return fn, sig, consts, cfg["BLOCK_N"] * cfg["BLOCK_W"] * 16  # 4 words of 4 bytes per column


def compile_sass(fn, sig: dict, consts: dict, cfg: dict) -> tuple[str, str]:
    """``(SASS, cuobjdump -res-usage)`` of ``fn`` compiled for sm_90 as a launch on the usual
    shapes specializes it: pointers, and integers that are multiples of 16 (N, K, strides, ...)
    unless the kernel opts out (do_not_specialize); M, split counts and masks typically are not.
    Compile options: the launcher's own (``LAUNCH_OPTIONS``), then the config's."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    unaligned = {"M", "SPLIT_K", "CODE_MASK", "MASK", "UNITS", "FULL_TILES"} | {q.name for q in fn.params if q.do_not_specialize}
    aligned = [i for i, name in enumerate(sig) if name not in unaligned and not sig[name].startswith(("constexpr", "tensordesc"))]
    src = ASTSource(
        fn=fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in aligned}
    )
    # num_stages changes the code: the word GEMV at 3 stages stages its loads through shared
    # memory, at its launch's 2 it does not
    options = {"num_warps": cfg.get("num_warps", 4), **launch_options(fn), **{k: cfg[k] for k in ("num_stages",) if k in cfg}}
    if "MAXNREG" in cfg:  # the word GEMV's opt-in register cap (ops/wna16/dispatch.py)
        options["maxnreg"] = cfg["MAXNREG"]
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    return sass, usage


def launch_options(fn) -> dict:
    """The compile options the kernel's launcher uses where a config does not set them (its
    module's ``LAUNCH_OPTIONS``: num_stages, and enable_fp_fusion for the int8 kernels)."""
    return dict(sys.modules[fn.fn.__module__].LAUNCH_OPTIONS)


def _backward_regions(sass: str) -> list[list[str]]:
    """The instructions of each region that ends in a branch back to a label above it."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*\.L_x_(\d+):", line))}
    regions = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+`?\(?\.L_x_(\d+)", line)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            regions.append([line for line in lines[labels[m.group(1)] : i + 1] if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)])
    return regions


def hot_loop(sass: str) -> list[str]:
    """Instructions of the longest region that ends in a branch back to a label above it."""
    return max(_backward_regions(sass), key=len, default=[])


def wgmma_loop(sass: str) -> list[str]:
    """The shortest backward-branch region with a wgmma (HGMMA / IGMMA / QGMMA): the MMA loop itself
    (a longer one is an out-of-line barrier retry that jumps back into it, spanning the epilogue)."""
    return min((r for r in _backward_regions(sass) if any(mnemonic(line).startswith(_WGMMA) for line in r)), key=len, default=[])


_WGMMA = ("HGMMA", "IGMMA", "QGMMA")  # wgmma on 16-bit floats, int8, fp8
# instructions that write no general register (stores, barriers, branches, async copies, wgmmas: their
# accumulators are tracked apart, ...)
_NO_REGISTER_DEST = (
    "ST",
    "RED",
    "BAR",
    "BRA",
    "SYNCS",
    "WARPGROUP",
    "EXIT",
    "UTMA",
    "NOP",
    "MEMBAR",
    "FENCE",
    "CCTL",
    "WARPSYNC",
    "BSSY",
    "BSYNC",
    "RET",
    "CALL",
    "ERRBAR",
    "DEPBAR",
) + _WGMMA


def _registers(operand: str, width: int) -> set[int]:
    m = re.match(r"-?\|?R(\d+)\b", operand.strip())
    return set(range(int(m.group(1)), int(m.group(1)) + width)) if m else set()


def _dest_width(mnem: str) -> int:
    if mnem.startswith("LDSM"):
        return int(mnem.rsplit(".", 1)[1])
    if ".128" in mnem:
        return 4
    return 2 if ".64" in mnem or "WIDE" in mnem or mnem.startswith("CS2R") else 1


def wgmma_pipeline(loop: list[str]) -> tuple[list[int], list[str]]:
    """``(waits, hazards)`` of a loop's wgmmas: the ``WARPGROUP.DEPBAR.LE`` counts in order (0 after
    every wgmma: ptxas serialized them), and the instructions that write a register of a wgmma still
    in flight (its register A operand or accumulator; PTX leaves that undefined) when the loop runs
    again and again (a DEPBAR with count c retires all but the c newest HGMMAs).

    ptxas (CUDA 12.8 in triton 3.6) emitted such writes for the 8-bit TMA tiles at 8 warps with
    split-K, which computed wrong results on the H200 (ops/wna16/tma.py)."""
    waits, hazards, pending = [], [], []
    for rep in range(3):  # the first pass fills the pipeline as the previous iteration leaves it
        for line in loop:
            mnem = mnemonic(line)
            operands = [t.strip() for t in re.sub(r"^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?\S+", "", line).split(";")[0].split(",")]
            if mnem.startswith(_WGMMA):
                acc = _registers(operands[0], int(re.search(r"64x(\d+)x", mnem).group(1)) // 2)
                pending.append((acc | _registers(operands[1], 4), line.strip()))
            elif mnem.startswith("WARPGROUP.DEPBAR"):
                keep = int(operands[-1], 0)
                pending = pending[len(pending) - keep :] if keep else []
                if rep == 0:
                    waits.append(keep)
            elif rep > 0 and not mnem.startswith(_NO_REGISTER_DEST):
                dest = _registers(operands[0], _dest_width(mnem))
                hazards += [f"{line.strip()}  (in flight: {mma})" for regs, mma in pending if dest & regs]
    return waits, list(dict.fromkeys(hazards))


def mnemonic(line: str) -> str:
    """The instruction with its modifiers (``LDG.E.EF.128``), without address and predicate."""
    return re.sub(r"^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?", "", line).split()[0]


def opcode(line: str) -> str:
    return mnemonic(line).split(".")[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="qfuse bench sass", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "kernel",
        help="gemv_words, mma_gemv, tiled_planes, mma_words, tiled_tma, w4a8_gemv, w4a8_mma_words, w8a8_gemv, moe_grouped_words or decode_attention",
    )
    p.add_argument("--bits", type=int, choices=(4, 8), default=4, help="weight width (gemv_words)")
    p.add_argument("--group", type=int, default=128, help="group size (-1: per-channel)")
    p.add_argument("--zeros", action="store_true", help="with zero points (wna16)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--config", default="{}", help="JSON kernel config (BLOCK_N, BLOCK_W / BLOCK_K, num_warps, ...)")
    args = p.parse_args(argv)
    defaults = {
        "gemv_words": {"BLOCK_N": 128, "BLOCK_W": 16},
        "mma_gemv": {"ROW_TILES": 1, "num_warps": 4},
        "tiled_planes": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128},
        "mma_words": {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
        "tiled_tma": {"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3},
        "w4a8_gemv": {"BLOCK_N": 256, "BLOCK_W": 4},
        "w4a8_mma_words": {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
        "w8a8_gemv": {"BLOCK_N": 256, "BLOCK_W": 4},
        "moe_grouped_words": {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 8, "num_stages": 4},
        "decode_attention": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_D": 128},
    }
    try:
        if args.kernel not in defaults:
            raise ValueError(f"unknown kernel {args.kernel!r}; choose from {', '.join(defaults)}")
        cfg = {**defaults[args.kernel], **json.loads(args.config)}
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        print(f"qfuse bench sass: {e}", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET") == "1":  # interpreted kernels cannot be compiled: rerun without it
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, "-m", "qfuse.cli", "bench", "sass", *(sys.argv[1:] if argv is None else argv)], env=env).returncode
    try:
        fn, sig, consts, loop_bytes = kernel_spec(args.kernel, args.bits, args.group, args.zeros, args.dtype, cfg)
    except KeyError as e:
        print(f"qfuse bench sass: config {cfg} lacks {e}", file=sys.stderr)
        return 2

    import triton

    warps = cfg.get("num_warps", 4)
    sass, usage = compile_sass(fn, sig, consts, cfg)
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    loop = hot_loop(sass)
    ops = collections.Counter(opcode(line) for line in loop)
    print(
        f"{args.kernel} {args.bits}-bit group {args.group}{' zeros' if args.zeros else ''} {args.dtype} {cfg}  (triton {triton.__version__}, sm_90)"
    )
    print(f"registers {regs.group(1) if regs else '?'}  stack {stack.group(1) if stack else '?'} B  loop {len(loop)} instructions")
    print(f"instructions per weight byte {len(loop) * warps * 32 / loop_bytes:.2f}")
    print("opcodes: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(10)))
    memory = collections.Counter(mnemonic(line) for line in loop if opcode(line) in ("LDG", "STG", "LDS", "STS", "LDSM", "STSM"))
    print("memory: " + ", ".join(f"{k} {v}" for k, v in sorted(memory.items())))
    mma_loop = wgmma_loop(sass)
    if mma_loop:
        waits, hazards = wgmma_pipeline(mma_loop)
        mode = "serialized" if waits and max(waits) == 0 else "asynchronous"
        # the MMA loop alone (the hot loop above may be a longer region around it, e.g. a split-K epilogue's)
        print(f"wgmma loop {len(mma_loop)} instructions, {len(mma_loop) * warps * 32 / loop_bytes:.2f} per weight byte")
        print(f"wgmma waits {','.join(map(str, waits))} ({mode}); {len(hazards)} writes to registers of a wgmma in flight")
        for line in hazards[:5]:
            print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
