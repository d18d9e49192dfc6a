"""Fused mixture-of-experts MLP with float or quantized experts: ``fused_moe``.

Arguments (M tokens, H hidden size, I intermediate size, E experts; for each weight, N is its
output rows and K its inputs: N = 2I, K = H for ``w13``, N = H, K = I for ``w2``)::

    x              [M, H]  fp16 or bf16 activations
    router_logits  [M, E]  fp16, bf16 or float32
    top_k          experts per token, 1 <= top_k <= E
    renormalize    divide each token's top-k weights by their sum (Mixtral: always; Qwen-MoE: norm_topk_prob)
    w13            [E, 2I, K*]  each expert's gate (rows 0 .. I-1) and up (rows I .. 2I-1) projections,
                                nn.Linear layout (rows = outputs)
    w2             [E, H, K*]   each expert's down projection
    <w>_scale, <w>_zeros, <w>_group_scale   per weight, by format (below); None where not used
    weight_bits, act_bits, group_size       the format
    w13_act_perm   int64 [E, H] or None: weight-only experts whose w13 input channels are stored in
                   act-order (GPTQ ``desc_act``): expert e's fc1 reads x[m, w13_act_perm[e]] (row e
                   a permutation of 0 .. H-1). An act-order w2 needs no argument: its permutation is
                   applied to the rows of w13 (gate and up alike) when the experts are built, so h
                   comes out in w2's order (qfuse/moe.py).
    tile_major     weight-only experts (W8A16, W4A16): w13's and w2's codes are stored tile-major
                   (ops/moe/tile_major.py: 64-row x 64-byte tiles, each 4 KB in a row; 2I, H and each
                   row's bytes multiples of 64); every CUDA family and the reference read them so.

Formats (one per scheme; the per-expert slices are exactly the dense ops' layouts)::

    weight_bits act_bits  w                       scale                 zeros           group_scale          group_size
    16          16        x.dtype [E, N, K]       None                  None            None                 -1
    8 / 4       16        uint8 [E, N, K*bits/8]  x.dtype [E, N, G]     uint8 [E, N, G] None                 -1, 32, 64, 128
                          (as wna16_gemm: codes u, 4-bit two per byte, low nibble = even k)  or None (symmetric)
    8           8         int8 [E, N, K]          float32 [E, N]        None            None                 -1
    4           8         uint8 [E, N, K // 2]    float32 [E, N]        None            int8 [E, N, K // g]  -1, 32, 64, 128
                          (as w4a8_gemm: q = u - 8)                                     (None per channel)

with G = K // group_size groups (1 per channel), one group_size for both weights (it must
divide H and I). The real weight of expert e (the dense ops' math, per expert)::

    16/16:  w_hat[e] = w[e]
    8|4/16: w_hat[e] = x.dtype( float32(u[e] - z[e, :, g]) * float32(scale[e, :, g]) )   z = 2**(bits-1) if no zeros
    8/8:    w_int[e] = w[e]                                           (int8)
    4/8:    w_int[e] = (u[e] - 8) * group_scale[e, :, g]              (int8, |w_int| <= 128; group_scale = 1 per channel)

Math (all float arithmetic float32, evaluated left to right; round = to nearest even)::

    routing (routing.py):  p = softmax(float32(router_logits[m])); (w[m], e[m]) = topk(p, top_k);
                           renormalize: w[m, j] /= sum_j' w[m, j']
    for each pair (m, j), expert e = e[m, j]:
      fc1, 16-bit activations:  acc = x[m] @ w_hat13[e].T                      float32 accumulator [2I]
                                (x[m, w13_act_perm[e]] @ w_hat13[e].T with w13_act_perm)
          int8 activations:     xq, xs = quant_per_token_int8(x)  (ops/quant_int8.py, per token row)
                                acc = float32(sum_k int32(xq[m, k]) * w_int13[e, :, k]) * xs[m] * scale13[e]
      g, u = acc[:I], acc[I:]
      h[m, j] = x.dtype( g / (1 + exp(-g)) * u )                               SiLU(gate) * up, one rounding
      fc2, 16-bit activations:  y = float32( h[m, j] @ w_hat2[e].T )
          int8 activations:     hq, hs = quant_per_token_int8(h)  (per pair row (m, j))
                                y = float32(sum_i int32(hq[m, j, i]) * w_int2[e, :, i]) * hs[m, j] * scale2[e]
      c[m, j] = y * w[m, j]
    out[m] = x.dtype( (...((c[m, 0] + c[m, 1]) + c[m, 2]) ...) + c[m, top_k - 1] )      one rounding

Output: contiguous [M, H] of x.dtype. The integer accumulators are exact (|acc| <= K * 2**14,
so H, I <= 131071 for int8 activations); an all-zero token gives zeros (the per-token scale's
floor keeps 0/0 out), and a large negative gate gives -0 * up, never NaN.

Reference kernel (CPU): a loop over the experts that received tokens, the math above as
written, reusing the dense ops' dequantizers and exact int8 matmul. CUDA: Triton
(ops/moe/dispatch.py): routing, token sorting into per-expert blocks (align.py), one grouped
GEMM launch for fc1 with the SiLU-and-mul epilogue (with ``w13_act_perm``, fc1 reads one gathered
activation row per pair instead of one per token), per-token int8 quantization of h (int8
activations), one grouped GEMM launch for fc2 with the routing-weight epilogue, and the
top-k sum in j order. The int8 accumulators and the top-k sum are bit-exact to the reference;
the float accumulators differ by float32 summation order, and exp / the rounding of h may
differ in the last place (tolerances in tests/ops/moe).

Value checks read data, so only the reference (CPU) path runs them, as in the dense ops:
4-bit zero points in [0, 16) and W4A8 group scales in [1, 16]. The CUDA kernel does not
(a host sync would break CUDA-graph capture); quantizers guarantee both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._custom_op import custom_op
from .._int_matmul import int8_matmul_nt
from .._validation import (
    ACT_DTYPES,
    check_contiguous,
    check_dtype,
    check_int_range,
    check_ndim,
    check_same_device,
    check_shape,
    check_tensor,
)
from ..quant_int8 import quant_per_token_int8_ref
from ..w4a8_gemm import GROUP_SCALE_MAX, w4a8_int_weight
from ..w8a8_gemm import MAX_K
from ..wna16_gemm import dequantize_wna16
from .routing import topk_routing
from .tile_major import from_tile_major, tile_major_supported

OP = "fused_moe"
GROUP_SIZES = (128, 64, 32)  # besides -1 (per channel), for the 4- and 8-bit weight-only and the W4A8 formats
FORMATS = {(16, 16): "bf16/fp16", (8, 16): "W8A16", (4, 16): "W4A16", (8, 8): "W8A8", (4, 8): "W4A8"}
LOGIT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _absent(name: str, t, why: str) -> None:
    if t is not None:
        raise ValueError(f"qfuse.{OP}: {name} must be None {why}")


def _check_weight(name: str, w, scale, zeros, group_scale, e: int, n: int, k: int, dtype: torch.dtype, bits: int, act_bits: int, group_size: int):
    """One expert weight (``w13`` or ``w2``) and its scales against the format."""
    fmt = f"for {FORMATS[(bits, act_bits)]} (weight_bits={bits}, act_bits={act_bits})"
    check_tensor(OP, name, w)
    if bits == 16:
        check_dtype(OP, name, w, dtype)
        check_shape(OP, name, w, (e, n, k), "[E, N, K] float weights")
        check_contiguous(OP, name, w)
        for suffix, t in (("scale", scale), ("zeros", zeros), ("group_scale", group_scale)):
            _absent(f"{name}_{suffix}", t, f"{fmt}: the weight is not quantized")
        return
    code_dtype = torch.int8 if (bits, act_bits) == (8, 8) else torch.uint8
    check_dtype(OP, name, w, code_dtype)
    check_shape(OP, name, w, (e, n, k * bits // 8), f"{bits}-bit codes [E, N, K{' // 2' if bits == 4 else ''}] with K={k}")
    check_contiguous(OP, name, w)
    groups = 1 if group_size == -1 else k // group_size
    if scale is None:
        raise ValueError(f"qfuse.{OP}: {name}_scale is required {fmt}")
    check_tensor(OP, f"{name}_scale", scale)
    if act_bits == 16:
        check_dtype(OP, f"{name}_scale", scale, dtype)
        check_shape(OP, f"{name}_scale", scale, (e, n, groups), f"[E, N, K // group_size] for group_size={group_size}")
        check_contiguous(OP, f"{name}_scale", scale)
        if zeros is not None:
            check_tensor(OP, f"{name}_zeros", zeros)
            check_dtype(OP, f"{name}_zeros", zeros, torch.uint8)
            check_shape(OP, f"{name}_zeros", zeros, (e, n, groups), f"same as {name}_scale")
            check_contiguous(OP, f"{name}_zeros", zeros)
        _absent(f"{name}_group_scale", group_scale, f"{fmt} (a second-level scale belongs to W4A8)")
        return
    check_dtype(OP, f"{name}_scale", scale, torch.float32)
    check_shape(OP, f"{name}_scale", scale, (e, n), "one float32 scale per expert and output channel")
    check_contiguous(OP, f"{name}_scale", scale)
    _absent(f"{name}_zeros", zeros, f"{fmt}: int8-activation formats are symmetric")
    if group_size == -1:
        _absent(f"{name}_group_scale", group_scale, f"{fmt} per channel (group_size=-1)")
        return
    if group_scale is None:
        raise ValueError(f"qfuse.{OP}: group_size={group_size} needs {name}_group_scale (int8 [E, N, K // {group_size}])")
    check_tensor(OP, f"{name}_group_scale", group_scale)
    check_dtype(OP, f"{name}_group_scale", group_scale, torch.int8)
    check_shape(OP, f"{name}_group_scale", group_scale, (e, n, groups), f"[E, N, K // {group_size}]")
    check_contiguous(OP, f"{name}_group_scale", group_scale)


def check_fused_moe_args(
    x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale,
    weight_bits, act_bits, group_size, w13_act_perm=None, tile_major=False,
) -> tuple[int, int, int, int]:  # fmt: skip
    """Validate every argument of ``fused_moe`` (metadata only); return (M, H, I, E)."""
    # the format selectors as ints: under torch.compile the fake kernel may get SymInts (a function
    # compiled for two formats), which do not hash for the FORMATS lookups; int() specializes on them
    weight_bits, act_bits, group_size = int(weight_bits), int(act_bits), int(group_size)
    check_tensor(OP, "x", x)
    check_tensor(OP, "router_logits", router_logits)
    check_dtype(OP, "x", x, ACT_DTYPES)
    check_ndim(OP, "x", x, 2, "[M, H]; flatten leading dimensions first")
    m, h = x.shape
    check_dtype(OP, "router_logits", router_logits, LOGIT_DTYPES)
    check_ndim(OP, "router_logits", router_logits, 2, "[M, E]")
    e = router_logits.shape[1]
    check_shape(OP, "router_logits", router_logits, (m, e), f"[M, E] with M={m} from x")
    if e < 1:
        raise ValueError(f"qfuse.{OP}: router_logits must have at least one expert column, got shape {tuple(router_logits.shape)}")
    if not 1 <= top_k <= e:
        raise ValueError(f"qfuse.{OP}: top_k must be in [1, E={e}], got {top_k}")
    if (weight_bits, act_bits) not in FORMATS:
        raise ValueError(
            f"qfuse.{OP}: (weight_bits, act_bits) must be one of {list(FORMATS)} ({', '.join(FORMATS.values())}), got ({weight_bits}, {act_bits})"
        )
    check_tensor(OP, "w13", w13)
    check_ndim(OP, "w13", w13, 3, "[E, 2I, K*]: gate and up projections stacked")
    if w13.shape[0] != e:
        raise ValueError(f"qfuse.{OP}: w13 holds {w13.shape[0]} experts but router_logits has E={e} columns")
    two_i = w13.shape[1]
    if two_i == 0 or two_i % 2:
        raise ValueError(f"qfuse.{OP}: w13 must have 2I rows (gate rows then up rows), got {two_i}")
    i = two_i // 2
    if weight_bits == 4 and (h % 2 or i % 2):
        raise ValueError(f"qfuse.{OP}: H={h} and I={i} must be even for 4-bit weights (two codes per byte)")
    if act_bits == 8 and max(h, i) > MAX_K:
        raise ValueError(f"qfuse.{OP}: H={h} and I={i} must be <= {MAX_K}, past which the int32 accumulator could overflow")
    allowed = (-1,) if weight_bits == 16 or (weight_bits, act_bits) == (8, 8) else (-1, *GROUP_SIZES)
    if group_size not in allowed:
        raise ValueError(
            f"qfuse.{OP}: group_size must be one of {list(allowed)} for {FORMATS[(weight_bits, act_bits)]} (-1 = per channel), got {group_size}"
        )
    if group_size != -1 and (h % group_size or i % group_size):
        raise ValueError(f"qfuse.{OP}: group_size={group_size} must divide both H={h} (w13's K) and I={i} (w2's K)")
    _check_weight("w13", w13, w13_scale, w13_zeros, w13_group_scale, e, two_i, h, x.dtype, weight_bits, act_bits, group_size)
    check_tensor(OP, "w2", w2)
    check_ndim(OP, "w2", w2, 3, "[E, H, K*]")
    _check_weight("w2", w2, w2_scale, w2_zeros, w2_group_scale, e, h, i, x.dtype, weight_bits, act_bits, group_size)
    if w13_act_perm is not None:
        if act_bits != 16 or weight_bits == 16:
            _absent("w13_act_perm", w13_act_perm, f"for {FORMATS[(weight_bits, act_bits)]}: act-order applies to weight-only quantized experts")
        check_tensor(OP, "w13_act_perm", w13_act_perm)
        check_dtype(OP, "w13_act_perm", w13_act_perm, torch.int64)
        check_shape(OP, "w13_act_perm", w13_act_perm, (e, h), "[E, H]: each expert's w13 input channel order")
        check_contiguous(OP, "w13_act_perm", w13_act_perm)
    if tile_major:
        if act_bits != 16 or weight_bits == 16:
            raise ValueError(
                f"qfuse.{OP}: tile_major applies to weight-only quantized experts (W8A16, W4A16), not {FORMATS[(weight_bits, act_bits)]}"
            )
        for name, w in (("w13", w13), ("w2", w2)):
            if not tile_major_supported(w.shape[1], w.shape[2]):
                raise ValueError(f"qfuse.{OP}: tile_major needs {name}'s rows and bytes per row to be multiples of 64, got {list(w.shape)}")
    check_same_device(
        OP, "x", x, router_logits=router_logits, w13=w13, w13_scale=w13_scale, w13_zeros=w13_zeros, w13_group_scale=w13_group_scale,
        w2=w2, w2_scale=w2_scale, w2_zeros=w2_zeros, w2_group_scale=w2_group_scale, w13_act_perm=w13_act_perm,
    )  # fmt: skip
    return m, h, i, e


def check_fused_moe_values(w13_zeros, w13_group_scale, w2_zeros, w2_group_scale, weight_bits: int, w13_act_perm=None) -> None:
    """The value checks (they read data: reference path and load time only, never the CUDA kernel)."""
    if w13_act_perm is not None:
        natural = torch.arange(w13_act_perm.shape[1], device=w13_act_perm.device).expand_as(w13_act_perm)
        bad = (torch.sort(w13_act_perm, dim=1).values != natural).any(dim=1).nonzero()
        if bad.numel():
            raise ValueError(f"qfuse.{OP}: w13_act_perm[{int(bad[0])}] is not a permutation of 0..{w13_act_perm.shape[1] - 1}")
    for name, z in (("w13_zeros", w13_zeros), ("w2_zeros", w2_zeros)):
        if z is not None:
            check_int_range(OP, name, z, 0, 1 << weight_bits, f" for bits={weight_bits}")
    for name, gs in (("w13_group_scale", w13_group_scale), ("w2_group_scale", w2_group_scale)):
        if gs is not None:
            check_int_range(OP, name, gs, 1, GROUP_SCALE_MAX + 1, " (W4A8 second-level scales)")


def _at(t: Tensor | None, e: int) -> Tensor | None:
    return None if t is None else t[e]


def expert_matmul(a: Tensor, a_scale: Tensor | None, w: Tensor, scale, zeros, group_scale, weight_bits, act_bits, group_size) -> Tensor:
    """One expert's product as float32 ``[rows, N]``: ``a @ w_hat.T`` (16-bit activations ``a``), or
    ``float32(int32 acc) * a_scale * scale`` (int8 ``a`` with float32 ``a_scale [rows, 1]``); ``w`` and
    its scales are the expert's slices ``[N, K*]``."""
    if act_bits == 8:
        w_int = w if weight_bits == 8 else w4a8_int_weight(w, group_scale, group_size)
        return int8_matmul_nt(a, w_int).float() * a_scale * scale.reshape(1, -1)
    w_hat = w if weight_bits == 16 else dequantize_wna16(w, scale, zeros, weight_bits, group_size).to(a.dtype)
    return a.float() @ w_hat.float().t()


def silu_and_mul(g: Tensor, u: Tensor) -> Tensor:
    """``g / (1 + exp(-g)) * u`` in float32 (SiLU written out, as the kernel computes it)."""
    return g / (1.0 + torch.exp(-g)) * u


def sum_topk(contrib: Tensor, dtype: torch.dtype) -> Tensor:
    """``dtype(c[:, 0] + c[:, 1] + ...)`` for float32 ``contrib [M, top_k, H]``, added in j order."""
    acc = contrib[:, 0]
    for j in range(1, contrib.shape[1]):
        acc = acc + contrib[:, j]
    return acc.to(dtype).contiguous()


def fused_moe_ref(
    x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale,
    weight_bits, act_bits, group_size, w13_act_perm=None, tile_major=False,
) -> Tensor:  # fmt: skip
    """Reference kernel for ``fused_moe``: a loop over the experts that received tokens."""
    if tile_major:
        w13, w2 = from_tile_major(w13), from_tile_major(w2)
    m, h = x.shape
    i = w13.shape[1] // 2
    weights, experts = topk_routing(router_logits, top_k, renormalize)
    a1, a1_scale = quant_per_token_int8_ref(x) if act_bits == 8 else (x, None)
    contrib = torch.zeros((m, top_k, h), dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        rows, slots = torch.where(experts == e)
        if rows.numel() == 0:
            continue
        a = a1[rows] if w13_act_perm is None else a1[rows][:, w13_act_perm[e]]
        acc = expert_matmul(
            a, None if a1_scale is None else a1_scale[rows], w13[e], _at(w13_scale, e), _at(w13_zeros, e), _at(w13_group_scale, e),
            weight_bits, act_bits, group_size,
        )  # fmt: skip
        hidden = silu_and_mul(acc[:, :i], acc[:, i:]).to(x.dtype)
        a2, a2_scale = quant_per_token_int8_ref(hidden) if act_bits == 8 else (hidden, None)
        y = expert_matmul(a2, a2_scale, w2[e], _at(w2_scale, e), _at(w2_zeros, e), _at(w2_group_scale, e), weight_bits, act_bits, group_size)
        contrib[rows, slots] = y * weights[rows, slots].unsqueeze(1)
    return sum_topk(contrib, x.dtype)


@custom_op("qfuse::fused_moe")
def fused_moe(
    x: Tensor,
    router_logits: Tensor,
    top_k: int,
    renormalize: bool,
    w13: Tensor,
    w13_scale: Tensor | None,
    w13_zeros: Tensor | None,
    w13_group_scale: Tensor | None,
    w2: Tensor,
    w2_scale: Tensor | None,
    w2_zeros: Tensor | None,
    w2_group_scale: Tensor | None,
    weight_bits: int,
    act_bits: int,
    group_size: int,
    w13_act_perm: Tensor | None = None,
    tile_major: bool = False,
) -> Tensor:
    """Top-k routed SiLU-gated expert MLPs with float, W8A16, W4A16, W8A8 or W4A8 experts (module docstring)."""
    args = (x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale)
    check_fused_moe_args(*args, weight_bits, act_bits, group_size, w13_act_perm, tile_major)
    check_fused_moe_values(w13_zeros, w13_group_scale, w2_zeros, w2_group_scale, weight_bits, w13_act_perm)  # reads data: reference path only
    return fused_moe_ref(*args, weight_bits, act_bits, group_size, w13_act_perm, tile_major)


@fused_moe.register_kernel("cuda")
def _fused_moe_cuda(
    x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale,
    weight_bits, act_bits, group_size, w13_act_perm=None, tile_major=False,
):  # fmt: skip
    """Routing, block-aligned token sorting and two grouped-GEMM launches in Triton (ops/moe/dispatch.py)."""
    args = (x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale)
    m, h, _, _ = check_fused_moe_args(*args, weight_bits, act_bits, group_size, w13_act_perm, tile_major)
    if m == 0:  # not the reference: its per-expert token lookup would read device data
        return torch.empty((0, h), dtype=x.dtype, device=x.device)
    from .dispatch import fused_moe_triton

    return fused_moe_triton(*args, weight_bits, act_bits, group_size, w13_act_perm, tile_major)


@fused_moe.register_fake
def _fused_moe_fake(
    x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale,
    weight_bits, act_bits, group_size, w13_act_perm=None, tile_major=False,
):  # fmt: skip
    args = (x, router_logits, top_k, renormalize, w13, w13_scale, w13_zeros, w13_group_scale, w2, w2_scale, w2_zeros, w2_group_scale)
    m, h, _, _ = check_fused_moe_args(*args, weight_bits, act_bits, group_size, w13_act_perm, tile_major)
    return torch.empty((m, h), dtype=x.dtype, device=x.device)
