"""Compile ops/wna16/tiled_planes.py's, ops/wna16/tma.py's, ops/wna16/mma_words.py's, ops/int8/mma_words.py's and ops/moe/grouped_words.py's kernels for sm_90 without a GPU (run
as a subprocess by tests/ops/test_w4a16_tiled_planes.py and tests/ops/test_wna16_tma.py). Their
inline PTX cannot run under the Triton interpreter, and a malformed asm operand list ends the
compiling process with an LLVM abort, so this is the CPU-side check that the PTX assembles for
Hopper with the installed Triton."""

from __future__ import annotations

import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qfuse.bench.sass import kernel_spec  # noqa: E402


def _compile(fn, sig: dict, consts: dict, divisible: list[int], warps: int, stages: int) -> str:
    src = ASTSource(
        fn=fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in divisible}
    )
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    assert kernel.asm["cubin"]
    return kernel.asm["ptx"]


def compile_planes(dtype: str, planes: int, swap: bool, zeros: bool, aligned: bool, join: bool = False) -> str:
    fn, sig, consts, _ = kernel_spec(
        "tiled_planes",
        4,
        128,
        zeros,
        dtype,
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 2, "PLANES": planes, "SWAP_AB": swap, "JOIN": join},
    )
    # pointers (and, with ``aligned``, the integer arguments) 16-divisible, as Triton specializes real launches:
    # the layout it then picks changes how the asm's operands are packed
    divisible = [i for i, name in enumerate(sig) if sig[name].startswith("*") or (aligned and name != "M")]
    return _compile(fn, sig, {**consts, "HAS_BIAS": True}, divisible, 4, 3)


def compile_tma(dtype: str, group: int, zeros: bool, split_k: int, bits: int = 4, tail_split: int = 0) -> str:
    """ops/wna16/tma.py's kernel (TMA descriptors of the activations and weight bytes); its PTX."""
    cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": split_k, "TAIL_SPLIT": tail_split}
    fn, sig, consts, _ = kernel_spec("tiled_tma", bits, group, zeros, dtype, cfg)
    divisible = [name for name in sig if sig[name].startswith("*") or name in ("N", "K", "K_PER_SPLIT")]
    src = ASTSource(
        fn=fn,
        signature=sig,
        constexprs={**consts, "HAS_BIAS": True},
        attrs={(list(sig).index(name),): [["tt.divisibility", 16]] for name in divisible},
    )
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 4})
    assert kernel.asm["cubin"]
    return kernel.asm["ptx"]


def _sass_pipeline(kernel: str, bits: int, group: int, zeros: bool, dtype: str, cfg: dict) -> tuple[list[int], list[str]]:
    """``(waits, hazards)`` of the config's sm_90 SASS wgmma loop (qfuse.bench.sass.wgmma_pipeline)."""
    from qfuse.bench import sass

    fn, sig, consts, _ = kernel_spec(kernel, bits, group, zeros, dtype, cfg)
    return sass.wgmma_pipeline(sass.wgmma_loop(sass.compile_sass(fn, sig, consts, cfg)[0]))


def compile_mma_words(dtype: str, group: int, zeros: bool, scale_w: bool, byte_pairs: bool = False) -> str:
    """ops/wna16/mma_words.py's kernel at its decode tile (16 tokens, 128 weight rows, 8 warps); its PTX."""
    fn, sig, consts, _ = kernel_spec(
        "mma_words", 4, group, zeros, dtype, {"BLOCK_M": 16, "BLOCK_N": 128, "SPLIT_K": 2, "SCALE_W": scale_w, "BYTE_PAIRS": byte_pairs}
    )
    return _compile(fn, sig, {**consts, "HAS_BIAS": True}, [i for i, name in enumerate(sig) if name != "M"], 8, 4)


def compile_w4a8_mma_words(group: int, split: bool, tokens: int, rows: int, warps: int, fold: bool = False, stream: bool = False) -> str:
    """ops/int8/mma_words.py's kernel (with ``stream`` its stream-K form); its PTX."""
    fn, sig, consts, _ = kernel_spec(
        "w4a8_mma_words",
        4,
        group,
        False,
        "bf16",
        {"BLOCK_M": tokens, "BLOCK_N": rows, "SPLIT_K": 2 if split else 1, "GS_FOLD": fold, "STREAM": int(stream)},
    )
    return _compile(fn, sig, {**consts, "HAS_BIAS": True}, [i for i, name in enumerate(sig) if name != "M"], warps, 4)


def _waits(ptx: str) -> str:
    """The kernel's ``wgmma.wait_group`` counts in program order, comma-separated."""
    return ",".join(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx))


if __name__ == "__main__":
    for case in sys.argv[1:]:
        if case.startswith("mma,"):  # mma,dtype,group,zeros,scale_w[,byte_pairs]
            _, dtype, group, zeros, scale_w, *pairs = case.split(",")
            ptx = compile_mma_words(dtype, int(group), zeros == "1", scale_w == "1", pairs == ["1"])
            print("compiled", case, "waits", _waits(ptx), flush=True)
            continue
        if case.startswith("w4a8mw,"):  # w4a8mw,group,split,tokens,rows,warps[,gs_fold[,stream]]: prints the int8 wgmma shapes used
            _, group, split, tokens, rows, warps, *flags = case.split(",")
            flags += ["0"] * (2 - len(flags))
            ptx = compile_w4a8_mma_words(int(group), split == "1", int(tokens), int(rows), int(warps), flags[0] == "1", flags[1] == "1")
            print(
                "compiled",
                case,
                "mma",
                ",".join(sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k32\.s32\.s8\.s8)", ptx)))),
                flush=True,
            )
            continue
        if case.startswith(
            "tmasass,"
        ):  # tmasass,bits,dtype,group,zeros,BLOCK_M,BLOCK_N,BLOCK_K,warps,stages,split_k[,words]: the SASS wgmma pipeline
            _, bits, dtype, group, zeros, bm, bn, bk, warps, stages, split_k, *words = case.split(",")
            cfg = {
                "BLOCK_M": int(bm),
                "BLOCK_N": int(bn),
                "BLOCK_K": int(bk),
                "num_warps": int(warps),
                "num_stages": int(stages),
                "SPLIT_K": int(split_k),
                "WORDS": words == ["1"],
            }
            waits, hazards = _sass_pipeline("tiled_tma", int(bits), int(group), zeros == "1", dtype, cfg)
            print("compiled", case, "waits", ",".join(map(str, waits)), "hazards", len(hazards), *hazards[:2], flush=True)
            continue
        if case.startswith("offered,"):  # offered,bits,dtype,group,zeros,M,N,K: the SASS wgmma pipeline of each offered wgmma config
            import json

            import torch

            from qfuse.ops.wna16.dispatch import candidate_configs, is_experimental

            _, bits, dtype, group, zeros, m, n, k = case.split(",")
            seen = {}
            for cfg in candidate_configs(int(m), int(n), int(k), int(bits), int(group), dtype=torch.bfloat16 if dtype == "bf16" else torch.float16):
                # the families with wgmma loops, as offered without QFUSE_EXPERIMENTAL_KERNELS
                if cfg["kernel"] in ("tiled_planes", "mma_words", "tiled_tma") and not is_experimental(cfg, int(bits)):
                    cfg = {**cfg, "SPLIT_K": min(cfg["SPLIT_K"], 2)}  # every split > 1 compiles the same code
                    seen.setdefault(json.dumps(cfg, sort_keys=True), cfg)
            for cfg in seen.values():
                waits, hazards = _sass_pipeline(cfg["kernel"], int(bits), int(group), zeros == "1", dtype, cfg)
                print("compiled", case, json.dumps(cfg, sort_keys=True), "waits", ",".join(map(str, waits)), "hazards", len(hazards), flush=True)
            continue
        if case.startswith("moesass,"):  # moesass,group,JSON config: the SASS wgmma pipeline of fused_moe's grouped_words, fc1 and fc2
            import json

            _, group, cfg = case.split(",", 2)
            for gated in (True, False):
                waits, hazards = _sass_pipeline("moe_grouped_words", 4, int(group), False, "bf16", {**json.loads(cfg), "GATED": gated})
                print(
                    "compiled", case, "fc1" if gated else "fc2", "waits", ",".join(map(str, waits)), "hazards", len(hazards), *hazards[:1], flush=True
                )
            continue
        if case.startswith("planessass,"):  # planessass,dtype,group,JSON config: the SASS wgmma pipeline of one tiled_planes config
            import json

            _, dtype, group, cfg = case.split(",", 3)
            waits, hazards = _sass_pipeline("tiled_planes", 4, int(group), False, dtype, {"kernel": "tiled_planes", **json.loads(cfg)})
            print("compiled", case, "waits", ",".join(map(str, waits)), "hazards", len(hazards), *hazards[:1], flush=True)
            continue
        if case.startswith("tma,"):  # tma,dtype,group,zeros,split_k[,bits[,tail_split]]
            _, dtype, group, zeros, split_k, *rest = case.split(",")
            ptx = compile_tma(dtype, int(group), zeros == "1", int(split_k), *(int(v) for v in rest))
            print("compiled", case, "waits", _waits(ptx), flush=True)
            continue
        dtype, planes, swap, zeros, aligned, *join = case.split(",")  # optional 6th field: JOIN
        ptx = compile_planes(dtype, int(planes), swap == "1", zeros == "1", aligned == "1", join == ["1"])
        print("compiled", case, "waits", _waits(ptx), flush=True)
