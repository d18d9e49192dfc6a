"""Offline tuning of ``wna16_gemm`` configs (writes the shipped-defaults JSON).

Why not ``pick_config``'s own measurement: it times with ``do_bench``, whose figure for a
5-20 us kernel is mostly Python launch overhead, and its weights sit in L2. Here every
candidate is timed as CUDA-graph replays over rotated weight copies (qfuse/bench/timing.py),
the way a compiled model runs it. Compilation dominates a fresh machine, so the candidates
are first compiled in parallel worker processes (Triton's disk cache), then timed serially.
"""

from __future__ import annotations

import csv
import functools
import json
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from qfuse.ops._autotune import _TUNED_DIR, _key_str, _memory, device_name, merge_into_json
from qfuse.ops._zeroed_workspace import rezero_workspaces
from qfuse.ops.wna16.dispatch import OP, candidate_configs, config_key, is_experimental, run_config
from qfuse.ops.wna16_gemm import wna16_gemm_ref

from .timing import copies_for, time_graph


def make_weights(n: int, k: int, bits: int, group_size: int, dtype: torch.dtype, asym: bool, device="cuda"):
    """Random codes (returned unpacked too), scales and zero points in the op's layout."""
    groups = 1 if group_size == -1 else k // group_size
    codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device=device)
    qweight = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous() if bits == 4 else codes
    scales = (torch.rand(n, groups, device=device) * 0.02 + 0.005).to(dtype)
    zeros = torch.randint(0, 2**bits, (n, groups), dtype=torch.uint8, device=device) if asym else None
    return codes, qweight, scales, zeros


def op_bytes(m: int, n: int, k: int, bits: int, group_size: int, asym: bool, act_bytes: int = 2) -> int:
    """Bytes a W{bits}A16 GEMM must move: weights, scales (+ zero points), activations, output."""
    groups = 1 if group_size == -1 else k // group_size
    return n * k * bits // 8 + n * groups * (act_bytes + (1 if asym else 0)) + (m * k + m * n) * act_bytes


@functools.lru_cache(maxsize=None)
def _shipped(gpu: str) -> dict:
    path = _TUNED_DIR / f"{OP}.{gpu}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def shipped_config(key: str) -> dict | None:
    """The config ops/tuned/ ships for ``key`` (a pick_config key string), if any (the file read
    once per GPU name: a tune asks for every key twice, to compile and to time)."""
    return _shipped(key.split("|")[1]).get(key)


def tune_candidates(m, n, k, bits, group_size, families: set[str] | None, dtype: torch.dtype, gpu: str) -> list[dict]:
    """The exhaustive candidates, or with ``families`` only theirs plus the shipped pick for this
    key (a re-tune of some families then keeps the old winner where it still wins)."""
    cands = candidate_configs(m, n, k, bits, group_size, exhaustive=True, dtype=dtype)
    if families is None:
        return cands
    keep = [c for c in cands if c["kernel"] in families]
    old = shipped_config(_key_str(OP, (gpu, *config_key(m, n, k, bits, group_size, dtype))))
    return keep + ([old] if old is not None and old not in keep else [])


def _jobs(shapes, ms, bits_list, group_size, families=None, dtype=torch.bfloat16, gpu="cpu"):
    for n, k in shapes:
        for bits in bits_list:
            for m in ms:
                for cfg in tune_candidates(m, n, k, bits, group_size, families, dtype, gpu):
                    yield n, k, bits, m, cfg


def _compile_worker(args) -> int:
    jobs, group_size, dtype_name, asym = args
    dtype = getattr(torch, dtype_name)
    done = 0
    weights = {}
    for n, k, bits, m, cfg in jobs:
        if (n, k, bits) not in weights:
            weights.clear()
            weights[(n, k, bits)] = make_weights(n, k, bits, group_size, dtype, asym)[1:]
        qw, s, z = weights[(n, k, bits)]
        x = torch.randn(m, k, device="cuda").to(dtype)
        try:
            run_config(cfg, x, qw, s, z, None, bits, group_size)
            done += 1
        except Exception:  # a config that does not fit is skipped again when timed
            pass
    torch.cuda.synchronize()
    return done


def precompile(shapes, ms, bits_list, group_size, dtype, asym, workers: int, log=print, worker=_compile_worker, families=None) -> None:
    """Compile every candidate once, in ``workers`` processes sharing Triton's disk cache.

    Jobs with the same compiled signature (config, bits, M == 1, M % 16 == 0) go to one
    worker, so no two workers compile the same kernel."""
    buckets: list[list] = [[] for _ in range(workers)]
    gpu = device_name(torch.device("cuda")) if torch.cuda.is_available() else "cpu"
    for job in _jobs(shapes, ms, bits_list, group_size, families, dtype, gpu):
        n, k, bits, m, cfg = job
        sig = (bits, m == 1, m % 16 == 0, n % 16 == 0, tuple(sorted(cfg.items())))
        buckets[hash(sig) % workers].append(job)
    args = [(b, group_size, str(dtype).removeprefix("torch."), asym) for b in buckets if b]
    try:
        # a worker killed by a compiler abort (an LLVM assertion ends the process) makes
        # multiprocessing.Pool wait forever; the executor raises BrokenProcessPool instead
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            list(pool.map(worker, args))
    except BrokenProcessPool as e:
        log(f"precompile: a compile worker died ({e}); the rest compile while timing, where the same config would stop the run")


def _shippable_pick(timings: list[tuple[float, dict]], bits: int):
    """``(us, config, next us)`` of the fastest config that may ship (not opt-in: a shipped pick
    bypasses the QFUSE_EXPERIMENTAL_KERNELS gate), or None; ``timings`` sorted."""
    ok = [(us, cfg) for us, cfg in timings if not is_experimental(cfg, bits)]
    if not ok:
        return None
    later = [us for us, cfg in ok[1:]]
    return ok[0][0], ok[0][1], later[0] if later else float("nan")


def _append_timings(cache_file: Path, key: str, timings: list[tuple[float, dict]]) -> None:
    path = cache_file.with_suffix(".timings.csv")
    new = not path.is_file()
    with path.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["key", "rank", "us", "config"])
        for rank, (us, cfg) in enumerate(timings):
            w.writerow([key, rank, f"{us:.2f}", json.dumps(cfg, sort_keys=True)])


def tune(
    shapes,
    ms,
    bits_list,
    group_size,
    dtype,
    asym=False,
    workers: int = 8,
    cache_file: Path | None = None,
    log=print,
    device: str = "cuda",
    families: set[str] | None = None,
) -> dict:
    """Time every candidate per (shape, M bucket, bits); keep the fastest in the in-process
    cache (and ``cache_file``, pick_config's JSON format). Returns {key string: config}.
    The pick is the fastest config that may ship (opt-in ones are timed, logged and listed, never
    picked: :func:`_shippable_pick`). Every timed candidate's median goes to ``<cache_file stem>.timings.csv``
    (key, rank, us, config as JSON), so a tune also says how far each loser was.
    ``families``: time only those kernel families and the shipped pick (:func:`tune_candidates`)."""
    if workers > 1:
        precompile(shapes, ms, bits_list, group_size, dtype, asym, workers, log=log, families=families)
    dev = torch.device(device)
    best_all: dict[str, dict] = {}
    for n, k in shapes:
        for bits in bits_list:
            ncopy = copies_for(op_bytes(1, n, k, bits, group_size, asym))
            copies = [make_weights(n, k, bits, group_size, dtype, asym, device)[1:] for _ in range(ncopy)]
            for m in ms:
                key = _key_str(OP, (device_name(dev), *config_key(m, n, k, bits, group_size, dtype)))
                if key in best_all:
                    continue
                x = torch.randn(m, k, device=dev).to(dtype)
                ref = wna16_gemm_ref(x, *copies[0], None, bits, group_size).float()
                tol = 2 * torch.finfo(dtype).eps * ref.abs().max().item()  # the kernel tests' tolerance
                timings = []
                for cfg in tune_candidates(m, n, k, bits, group_size, families, dtype, device_name(dev)):
                    calls = [lambda c=c, cfg=cfg: run_config(cfg, x, *c, None, bits, group_size) for c in copies]
                    try:
                        err = (calls[0]().float() - ref).abs().max().item()
                        if not err <= tol:  # a config is a candidate only if it is right
                            log(f"  MISMATCH {cfg}: max error {err:.3g} > {tol:.3g}, skipped")
                            rezero_workspaces()  # its split-K counters may be left nonzero
                            continue
                        timings.append((time_graph(calls, replays=5), cfg))
                    except Exception as e:  # shared memory overflow etc.
                        log(f"  skip {cfg}: {type(e).__name__}")
                        rezero_workspaces()
                timings.sort(key=lambda t: t[0])
                if cache_file is not None:
                    _append_timings(cache_file, key, timings)
                pick = _shippable_pick(timings, bits)
                if pick is None:
                    log(f"{key}: no candidate ran" if not timings else f"{key}: only opt-in configs ran")
                    continue
                us, cfg, rest = pick
                best_all[key] = cfg
                _memory[key] = cfg
                if cache_file is not None:  # at once: a tune cut short (a device-time limit) keeps every key it finished
                    merge_into_json(cache_file, key, cfg)
                note = f"; opt-in {timings[0][1]} was {timings[0][0]:.1f} us" if timings[0][1] is not cfg else ""
                log(f"{key}: {us:.1f} us {cfg} (next {rest:.1f} us{note})")
            del copies
            torch.cuda.empty_cache()
    return best_all
