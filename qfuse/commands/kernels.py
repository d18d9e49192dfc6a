"""``qfuse kernels --explain M N K SCHEME``: which kernel families the op considers for one GEMM,
which refuse it and why, which configs are opt-in and why, and which config runs and where that
choice comes from (the user cache, the table shipped for the GPU, or the untuned heuristic that
a first call on the GPU would replace by a measurement). With ``--moe E TOP_K`` the same for
``fused_moe``: M tokens, N = the experts' intermediate size I, K = the hidden size H."""

from __future__ import annotations

import argparse

import torch

from .common import positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("kernels", help="explain the kernel choice of a GEMM: families considered, refused (why), picked")
    p.add_argument(
        "--explain",
        nargs=4,
        metavar=("M", "N", "K", "SCHEME"),
        required=True,
        help="tokens M, output features N, input features K, and a scheme (W4A16, W8A8, W4A8_G128, W4A16_G64, ...)",
    )
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16", help="activation dtype (default bfloat16)")
    p.add_argument("--gpu", default=None, help="GPU name of the tuned tables (default: this machine's GPU, else NVIDIA_H200)")
    p.add_argument("--sms", type=positive_int, default=None, help="streaming multiprocessors (default: this GPU's, else 132)")
    p.add_argument("--no-tma", action="store_true", help="a GPU without TMA (compute capability < 9.0)")
    p.add_argument(
        "--moe", nargs=2, type=int, metavar=("E", "TOP_K"), default=None, help="explain fused_moe instead: E experts, TOP_K per token (N = I, K = H)"
    )
    p.set_defaults(run=run)


def _gpu(args) -> tuple[str, int]:
    from ..ops._autotune import device_name, sm_count

    gpu = args.gpu.strip().replace(" ", "_") if args.gpu else None  # "NVIDIA H200", as the GPU reports it: the tables' NVIDIA_H200
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        return gpu or device_name(dev), args.sms or sm_count(dev)
    return gpu or "NVIDIA_H200", args.sms or 132


def _scheme(name: str):
    """A preset (``W4A16``) or a spelled-out scheme: ``W4A16_G64``, ``W4A16_G32_ASYM``, ``W4A8_G64``, ``W8A16_CH``."""
    from ..schemes import get_scheme

    return get_scheme(name)


def _nearest_stored(op: str, gpu: str, key: tuple, candidates: list[dict]):
    """``(pick, (N, K))`` that pick_config runs untuned: the stored pick of the nearest shape, or None."""
    from ..ops._autotune import _lock, load_stored, nearest_stored_entry

    with _lock:  # the search reads every stored entry, as pick_config's
        load_stored(op, gpu)
        return nearest_stored_entry(op, gpu, key, candidates)


def explain(
    m: int,
    n: int,
    k: int,
    scheme_name: str,
    dtype: torch.dtype = torch.bfloat16,
    gpu: str = "NVIDIA_H200",
    sms: int = 132,
    tma: bool = True,
    moe: tuple[int, int] | None = None,
) -> str:
    """The report ``qfuse kernels --explain`` prints; ``moe=(E, top_k)``: for ``fused_moe`` (N = I, K = H)."""
    from ..ops._autotune import lookup, shipped_replacement
    from ..ops.int8 import dispatch as int8_dispatch
    from ..ops.wna16 import dispatch as wna16_dispatch

    s = _scheme(scheme_name)
    if min(m, n, k) < 1:
        raise ValueError(f"M, N and K must be positive, got {m}, {n}, {k}")
    if s.group_size != -1 and k % s.group_size:
        raise ValueError(
            f"K={k} is not divisible by {s.name}'s group size {s.group_size} "
            "(quantize_model gives such layers a smaller group: try that scheme, e.g. W4A16_G64)"
        )
    from ..linear import check_quantizable  # what quantize_model refuses (odd K at 4 bits, K past the int8 ops' limit)

    check_quantizable(torch.empty(n, k, dtype=dtype, device="meta"), s, f"K={k}")
    tiled = False
    if moe is not None:
        from ..ops.moe import dispatch as moe_dispatch

        e, top_k = moe
        if not 1 <= top_k <= e:
            raise ValueError(f"--moe: TOP_K must be in [1, E={e}], got {top_k}")
        op, registry = moe_dispatch.OP, moe_dispatch.REGISTRY
        p = moe_dispatch.problem(m, n, k, s.weight_bits, s.group_size, dtype, s.act_bits)
        from ..moe import holds_tile_major

        tiled = holds_tile_major(s, k, n)  # the layout QuantExperts gives these experts
        key = moe_dispatch.config_key(m, e, n, k, top_k, s.weight_bits, s.act_bits, s.group_size, dtype, tiled)
        key = moe_dispatch.layout_key(key, gpu) if tiled else key
        offered = registry.offered(p)
    elif s.weight_only:
        op, registry = wna16_dispatch.OP, wna16_dispatch.REGISTRY
        p = wna16_dispatch.problem(m, n, k, s.weight_bits, s.group_size, sms, tma, dtype)
        key = wna16_dispatch.config_key(m, n, k, s.weight_bits, s.group_size, dtype)
        offered = wna16_dispatch.usable_configs(m, n, k, s.weight_bits, s.group_size, sms, tma, dtype)
    else:
        op = "w4a8_gemm" if s.weight_bits == 4 else "w8a8_gemm"
        registry = int8_dispatch.REGISTRY
        p = int8_dispatch.problem(m, n, k, s.group_size, sms, w4=s.weight_bits == 4, gpu=True, tma=tma)
        key = int8_dispatch.config_key(m, n, k, s.group_size, w4=s.weight_bits == 4)
        offered = registry.offered(p)
    usable = int8_dispatch.usable if registry is int8_dispatch.REGISTRY else registry.usable  # the op's check of a stored pick
    verdicts = registry.explain(p)
    shape = f"M={m} I={n} H={k} E={moe[0]} top_k={moe[1]}{', tile-major codes' if tiled else ''}" if moe else f"M={m} N={n} K={k}"
    lines = [
        f"{op}  {shape}  {s.name} ({s.weight_bits}-bit weights, "
        f"{'per channel' if s.group_size == -1 else f'group {s.group_size}'}, {str(dtype).removeprefix('torch.')})  "
        f"on {gpu} ({sms} SMs{'' if tma else ', no TMA'})",
        "",
    ]
    width = max(len(v.family) for v in verdicts)
    lines.append(f"  {'family':<{width}}  {'verdict':<8}  configs  offered  why")
    for v in verdicts:
        verdict = "refused" if not v.supported else ("opt-in" if v.offered == 0 and v.configs else "offered")
        lines.append(f"  {v.family:<{width}}  {verdict:<8}  {v.configs:>7}  {v.offered:>7}  {v.reason}")
    lines.append("")

    def stored(op: str, what: str):
        """The stored pick of ``op`` at ``key`` and its source, or None where there is none or the op
        refuses it and the shipped table has no pick it may run in its place (it warns and chooses
        again: pick_config); a refusal gets a line saying so."""
        hit = lookup(op, key, gpu)
        if hit is not None and not usable(hit[0]):
            line = f"  {what}: {hit[0]} in {hit[1]}: cannot run here (an unknown kernel family, or opt-in)"
            shipped = shipped_replacement(op, key, gpu, hit[0], usable)
            if shipped is not None:  # what pick_config runs then
                lines.append(line + "; the shipped pick runs")
                return shipped, f"the shipped table (ops/tuned/{op}.{gpu}.json)"
            lines.append(line + "; chosen again")
            return None
        return hit

    hit = stored(op, "stored")
    nearest = None
    if hit is not None:
        cfg, source = hit
    else:
        cfg, source = (offered[0] if offered else None), "the untuned heuristic (the first candidate); a first call on the GPU measures them"
        nearest = _nearest_stored(op, gpu, key, offered)
    lines.append(f"  picked: {cfg}")
    lines.append(f"  from:   {source}")
    if nearest is not None:  # what pick_config runs where it does not measure
        lines.append(f"  with QFUSE_AUTOTUNE=0 or under CUDA-graph capture: {nearest[0]}")
        shape = f"E={nearest[1][0]} I={nearest[1][1]}" if moe is not None else f"N={nearest[1][0]} K={nearest[1][1]}"  # fused_moe's keys hold (E, I)
        lines.append(f"          the stored pick of the nearest shape, {shape}")
    if (
        moe is None
        and not s.weight_only
        and key[0] <= int8_dispatch.EAGER_MAX_M
        and any(c is not None and int8_dispatch.uses_tma(int8_dispatch.normalize(c)) for c in (cfg, nearest and nearest[0]))
    ):
        eager = stored(op + "_eager", "stored eager pick")
        lines.append(
            f"  eager (outside a CUDA graph, no TMA launch): {eager[0] if eager else 'measured at the first eager call'}"
            + (f"  from {eager[1]}" if eager else "")
        )
        if eager is None:  # what the op runs there without measuring (pick_config's untuned branch)
            plain = [c for c in offered if not int8_dispatch.uses_tma(c)]
            near = _nearest_stored(op + "_eager", gpu, key, plain)
            untuned = f"{near[0]}, the stored eager pick of the nearest shape, N={near[1][0]} K={near[1][1]}" if near else plain[0] if plain else None
            lines.append(f"         with QFUSE_AUTOTUNE=0: {untuned}")
    if s.weight_only and cfg is not None and wna16_dispatch.accumulate_form(cfg) != cfg:  # fused_moe's word GEMV too
        lines.append(f"  runs as: {wna16_dispatch.accumulate_form(cfg)}  (QFUSE_FP32_ACCUMULATE=1: float32 sums)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    m, n, k, scheme = args.explain
    try:
        m, n, k = int(m), int(n), int(k)
    except ValueError:
        raise SystemExit(f"qfuse kernels: M, N, K must be integers, got {args.explain[:3]}") from None
    gpu, sms = _gpu(args)
    try:
        print(explain(m, n, k, scheme, getattr(torch, args.dtype), gpu, sms, not args.no_tma, tuple(args.moe) if args.moe else None))
    except (ValueError, KeyError) as e:
        raise SystemExit(f"qfuse kernels: {e}") from None
    return 0
