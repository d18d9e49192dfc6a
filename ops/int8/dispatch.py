"""Kernel-family choice and configs for the int8-activation GEMMs ``w8a8_gemm`` and ``w4a8_gemm`` on
CUDA (the ops' math: ops/int8/common.py). A config is a dict whose ``"kernel"`` names its family;
the families, in registry order:

* ``tile`` (ops/int8/tile.py): the pointer-fed tile kernel, any M (W4A8 on a GPU also with the
  inline-PTX unpack ``UNPACK_ASM`` and, with groups at M <= 64, the int32-partial group scale
  ``GS_PARTIAL``);
* ``gemv`` (ops/int8/gemv.py): W4A8 dp4a GEMV, M <= 8; the H200 pick at M = 1-2 (8.1-31.0 us at
  M = 1 on five shapes, against 9.5-35.8 for the best tile config);
* ``mma_words`` (ops/int8/mma_words.py): W4A8, M <= 64, the packed bytes as the int8 wgmma's
  register operand; the H200 pick at almost every W4A8 key at M = 4-64;
* ``tma`` (ops/int8/tma.py): TMA-fed tiles (W8A8; W4A8 at M > 64 with the unpack fused); on
  the H200 it won W8A8 at 15 of 25 decode and 14 of 15 M >= 1024 points;
* ``w8`` (ops/int8/int8_weight.py): W4A8 at M > 64 as an int4 -> int8 weight pass, then the
  ``tile`` or (``TMA``) ``tma`` kernel in its W8A8 form: 1.10-1.43x bf16 at M >= 1024;
* ``gemv8`` (ops/int8/gemv8.py): W8A8 dp4a GEMV, opt-in (slower than ``tile`` at every point).

Which run on the CPU (the Triton interpreter): ``tile`` in its plain form only. The untuned pick
(:func:`_heuristic`) is the GEMV's first lane tile at M <= 2, then ``mma_words``'s first config
up to M = 64, else the tile kernel's first. :func:`int8_gemm` looks the key up in the user
cache or ``ops/tuned/<op>.<gpu>.json`` (ops/_autotune.py), else times the candidates once.
"""

from __future__ import annotations

import functools

from .._autotune import capturing, m_bucket, pick_config, sm_count, tma_capable
from ..activation.quant_kernels import device_guard
from ..kernel_family import Problem, Registry
from .gemv import FAMILY as GEMV
from .gemv8 import FAMILY as GEMV8
from .int8_weight import FAMILY as W8
from .mma_words import FAMILY as MMA_WORDS
from .tile import FAMILY as TILE
from .tma import FAMILY as TMA


def _heuristic(p: Problem, cands: list[dict]) -> list[dict]:
    """W4A8 on a GPU: at M <= 2 the GEMV's first lane tile, then every ``mma_words`` config (on the
    H200 1.1-1.5x faster than ``mma_words`` at M = 1); up to M = 64 ``mma_words``'s first config (it
    won 33 of the 40 keys at M = 1-64). Otherwise the registry's order (the tile kernel first)."""
    gemv = [c for c in cands if c["kernel"] == "gemv"]
    words = [c for c in cands if c["kernel"] == "mma_words"]
    if p.m <= 2 and gemv:
        lead = gemv[:1] + words
    else:
        lead = words[:1]
    return lead + [c for c in cands if not any(c is x for x in lead)]


REGISTRY = Registry("w8a8_gemm / w4a8_gemm", (TILE, GEMV, MMA_WORDS, TMA, W8, GEMV8), _heuristic)


def problem(m: int, n: int, k: int, group_size: int, sms: int, *, w4: bool, gpu: bool, tma: bool = True) -> Problem:
    return Problem(m, n, k, 4 if w4 else 8, group_size, None, sms, tma, gpu)


@functools.lru_cache(maxsize=4096)  # pure in its arguments: 45 us -> 0.35 us of Python per call (CPU box)
def _candidates(p: Problem) -> tuple[dict, ...]:
    return tuple(REGISTRY.candidates(p))


def candidate_configs(m: int, n: int, k: int, group_size: int, sms: int, *, w4: bool, gpu: bool, tma: bool = True) -> list[dict]:
    """Every family's configs for this problem, opt-in ones included, the untuned pick first.
    ``gpu``: a CUDA device (the inline-PTX forms and every family but ``tile`` need one);
    ``tma``: it can run the TMA families (compute capability >= 9.0)."""
    return [dict(c) for c in _candidates(problem(m, n, k, group_size, sms, w4=w4, gpu=gpu, tma=tma))]


def is_experimental(config: dict) -> bool:
    """Whether ``config`` is offered only with ``QFUSE_EXPERIMENTAL_KERNELS=1``: the W8A8 dp4a GEMV
    (``gemv8``) and the stream-K form of W4A8 ``mma_words`` (``STREAM``); their reasons are in
    the families (``qfuse kernels --explain``)."""
    return REGISTRY.is_opt_in(normalize(config))


def normalize(config: dict) -> dict:
    """``config`` in the one spelling: ``"kernel"`` names the family. Configs stored before (user
    caches) named it ``"KERNEL"`` or, for the tile and TMA kernels, by the absence of one and a
    ``TMA`` flag; they run unchanged."""
    if "kernel" in config:
        return config
    cfg = dict(config)
    kind = cfg.pop("KERNEL", None)
    if kind is None:
        kind = "tma" if cfg.pop("TMA", 0) else "tile"
    return {"kernel": kind, **cfg}


def usable(config) -> bool:
    """Whether a stored pick (any spelling, :func:`normalize`) may run here (``Registry.usable``)."""
    return isinstance(config, dict) and REGISTRY.usable(normalize(config))


def run_int8_gemm(xq, x_scale, w, w_scale, group_scale, bias, out_dtype, *, w4: bool, config: dict):
    """Run one config (arguments already checked by the op). Returns [M, N]."""
    return REGISTRY.run(normalize(config), xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4)


def config_key(m: int, n: int, k: int, group_size: int, *, w4: bool) -> tuple:
    return (m_bucket(m), n, k, group_size) if w4 else (m_bucket(m), n, k)


# Decode buckets up to here take the eager pick outside CUDA-graph capture (see int8_gemm).
EAGER_MAX_M = 64


def int8_gemm(op, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, *, w4: bool, group_size: int = -1):
    """Pick a config (ops/_autotune.py: cache, shipped defaults, or a measurement) and run.

    Configs are ranked by CUDA-graph time, which leaves out the host's launch cost. A TMA
    launch costs more of it (two host descriptors encoded per call: on the H200 24-48 us of
    Python and driver per launch at M = 1-16 against 11-12 us for the pointer kernel, whose
    graph time is only 0.3-1.7 us longer there), and a decode GEMM outside a graph waits on
    the host. So when the pick for an M bucket <= EAGER_MAX_M runs the TMA kernel and no CUDA
    graph is being captured, the op takes the best config without TMA instead (its own key,
    ``<op>_eager``: shipped, cached or measured like any other). Both compute the same bits.
    """
    m, k = xq.shape
    n = w.shape[0]
    key = config_key(m, n, k, group_size, w4=w4)

    def cands() -> list[dict]:  # the problem and its candidates are built only on a cache miss (pick_config)
        p = problem(m, n, k, group_size, sm_count(xq.device), w4=w4, gpu=xq.device.type == "cuda", tma=tma_capable(xq.device))
        return REGISTRY.offered(p)

    def run(c):
        return REGISTRY.run(c, xq, x_scale, w, w_scale, group_scale, bias, out_dtype, w4)

    with device_guard(xq):  # Triton launches on the current device: xq's, for a measurement too (a model spread over GPUs)
        cfg = normalize(pick_config(op, key, cands, run, xq.device, usable))
        if uses_tma(cfg) and key[0] <= EAGER_MAX_M and not capturing():
            cfg = normalize(pick_config(op + "_eager", key, lambda: [c for c in cands() if not uses_tma(c)], run, xq.device, usable))
        return run(cfg)


def uses_tma(cfg: dict) -> bool:
    return cfg["kernel"] == "tma" or (cfg["kernel"] == "w8" and bool(cfg.get("TMA")))
