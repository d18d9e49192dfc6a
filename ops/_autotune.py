"""Kernel-config selection shared by the Triton launchers: measured once, cached to JSON.

A launcher describes its problem with a key (op name, M bucket, N, K, group size,
dtype, ...) and a list of candidate configs (plain dicts of meta-parameters), and
calls :func:`pick_config`. Lookup order:

1. the in-process cache;
2. the user cache file: ``$QFUSE_AUTOTUNE_CACHE`` if set, else
   ``~/.cache/qfuse/autotune.json``;
3. the defaults shipped in ``ops/tuned/<op>.<gpu>.json`` (measured on that GPU);
4. a measurement: every candidate is timed as the replay of a CUDA graph of
   ``_GRAPH_CALLS`` launches (median of several replays; eager timing of a 10-40 us
   kernel would mostly measure the 100-400 us Python launch path on the H200), and
   the fastest is stored in the user cache file;

except that (4) never runs while a CUDA graph is being captured, or when
``QFUSE_AUTOTUNE=0``: then the pick stored for the nearest shape of the same M bucket and
kind (group, dtype, bits) is used if the launcher offers it for this shape, else the first
candidate (the launcher's heuristic choice). Hugging Face models keep q / k / v and gate /
up apart (k and v are 1024 x 4096 in Llama-3-8B, gate and up 14336 x 4096) while the tables
hold the fused shapes; the nearest shape's pick is a measured config of the same family
where a heuristic is a guess. Still: capture a graph only after one eager call per shape,
or ship defaults.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import statistics
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

try:  # POSIX: the cache file's writers take turns (merge_into_json)
    import fcntl
except ImportError:  # Windows
    fcntl = None

import torch

_TUNED_DIR = Path(__file__).with_name("tuned")
_log = logging.getLogger("qfuse.autotune")
# entry key -> [(config, reason)] of the configs that failed in its last measurement (logged at INFO)
failures: dict[str, list[tuple[dict, str]]] = {}
_lock = threading.Lock()
# held while candidates are timed: one measurement at a time in the process (a CUDA graph captured
# in one thread while another synchronizes or captures invalidates both); reentrant for a run
# that picks a config itself
_measure_lock = threading.RLock()
_memory: dict[str, dict] = {}
_loaded_files: set[str] = set()
_untuned: dict[tuple, dict] = {}  # (entry key, experimental_kernels()) -> the pick made without a measurement
_checked: dict[str, dict] = {}  # entry key -> its stored pick, found usable (pick_config's usable) in this process
_refused: dict[str, dict] = {}  # entry key -> its stored pick, found not usable in this process (warned once)


def m_bucket(m: int) -> int:
    """Round M up to the bucket its config is tuned for: 1, 2, 4, 8, 16, 32, ... 8192, then 8192."""
    b = 1
    while b < m and b < 8192:
        b *= 2
    return b


def split_k_choices(k_tiles: int, programs: int, sms: int, min_tiles: int = 2) -> list[int]:
    """Split-K factors worth timing for a decode grid of ``programs`` output tiles whose K is
    ``k_tiles`` whole tiles: 1 and, for 1, 2, 4, 8 and 16 programs per SM, the divisor of
    ``k_tiles`` (each split whole tiles, >= ``min_tiles`` of them) whose grid lands nearest.
    Not only powers of two: K = 14336 is 7 * 2**11, so a power-of-two split of its 28 tiles of
    64 words stops at 4 (an N = 4096 GEMV then fills 512 of the H200's ~660 resident slots)."""
    divs = [s for s in range(1, k_tiles // min_tiles + 1) if k_tiles % s == 0] or [1]
    picks = {1}
    for per_sm in (1, 2, 4, 8, 16):
        target = per_sm * sms
        picks.add(min(divs, key=lambda s: max(programs * s, target) / min(programs * s, target)))
    return sorted(picks, reverse=True)


@functools.lru_cache(maxsize=None)
def _properties(index: int):
    """``torch.cuda.get_device_properties(index)``, once per device (the launchers ask on every call)."""
    return torch.cuda.get_device_properties(index)


@functools.lru_cache(maxsize=None)
def _name(index: int) -> str:
    return _properties(index).name.replace(" ", "_")


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_name(device: torch.device | None = None) -> str:
    if device is None or device.type != "cuda":
        return "cpu"
    return _name(_index(device))


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (the launchers size split-K and persistent grids by
    it); 132, an H200's, off CUDA, where the interpreter runs the kernels (CPU tests)."""
    if device.type != "cuda":
        return 132
    return _properties(_index(device)).multi_processor_count


def tma_capable(device: torch.device) -> bool:
    """Whether the TMA-fed kernel families (host ``TensorDescriptor``s; tuned for Hopper) may be
    offered on ``device``: compute capability 9.0 or newer, or off CUDA (the interpreter runs them)."""
    if device.type != "cuda":
        return True
    props = _properties(_index(device))
    return (props.major, props.minor) >= (9, 0)


def cache_path() -> Path:
    env = os.environ.get("QFUSE_AUTOTUNE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qfuse" / "autotune.json"  # "~/..." set without a shell


def _key_str(op: str, key: tuple) -> str:
    return op + "|" + "|".join(str(k) for k in key)


def read_json_object(path: Path) -> dict | None:
    """The JSON object stored in ``path``: ``{}`` for a missing file, None for one that cannot be
    read, is not UTF-8 JSON or holds no object (a corrupt cache only costs a re-measurement)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: JSONDecodeError and UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None


def _load(path: Path) -> None:
    if str(path) in _loaded_files:
        return
    _loaded_files.add(str(path))
    data = read_json_object(path)
    if data:
        _memory.update({k: v for k, v in data.items() if k not in _memory})


def load_stored(op: str, gpu: str) -> None:
    """Read ``op``'s user cache and shipped table for ``gpu`` into the in-process cache (each file
    once per process); call with ``_lock`` held."""
    _load(cache_path())
    _load(_TUNED_DIR / f"{op}.{gpu}.json")


def merge_into_json(path: Path, entry_key: str, config: dict) -> None:
    """Set ``entry_key`` to ``config`` in the JSON file ``path`` (created if missing; a symlink's
    target), under an exclusive lock on ``<path>.lock`` so that processes writing at once (the
    benchmarks' parallel compiles) each add their entries, and written through a temporary file
    of its own and a rename, so a reader never sees half a file. A file that is not a JSON object
    (truncated, foreign) is replaced, with a warning: it had no usable entry."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        data = read_json_object(path)
        if data is None:
            _log.warning("%s is not a JSON object of configs; writing a new one", path)
            data = {}
        data[entry_key] = config
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")  # a text file, as the shipped tables in ops/tuned/
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise


# M buckets up to here are decode sizes, whose grids are set by the N tiles and the splits (the M
# tiles, the same for two shapes of one bucket, are 1-4): where nearest_stored keeps a pick's
# program count
DECODE_MAX_M = 64


TILE_MAJOR = "tile_major"  # the last field of a fused_moe key for tile-major codes (ops/moe/dispatch.py)


def nearest_stored(op: str, gpu: str, key: tuple, candidates: list[dict]) -> dict | None:
    """The stored pick (user cache or shipped table, as loaded) for the shape nearest to ``key``'s
    ``(N, K)`` with the same M bucket and the same remaining fields (a tile-major fused_moe key:
    or the natural layout's, 0.5 farther), among ``candidates`` only; None if there is none.
    Distance: ``|log2 N'/N| + 2 |log2 K'/K|`` (K sets the split-K and the tile loop, so it weighs double).

    At M <= ``DECODE_MAX_M``, a pick with ``BLOCK_N`` and ``SPLIT_K`` is taken with the offered ``SPLIT_K`` that keeps its
    program count (``ceil(N / BLOCK_N) * SPLIT_K``) nearest to what it had on its own shape: the
    170 shipped W4A16 / W8A16 H200 picks at M 1-64 run 96-3584 programs on the 132 SMs, while the
    28672 x 4096 pick (SPLIT_K 1) taken as it was for a 1024 x 4096 layer at M = 16 (Llama-3-8B's
    k / v projections in ``qfuse bench model``, QFUSE_AUTOTUNE=0) ran 8."""
    found = nearest_stored_entry(op, gpu, key, candidates)
    return None if found is None else found[0]


def nearest_stored_entry(op: str, gpu: str, key: tuple, candidates: list[dict]) -> tuple[dict, tuple[int, int]] | None:
    """:func:`nearest_stored`'s pick with the ``(N, K)`` it was stored for."""
    if len(key) < 3 or not all(isinstance(v, int) and v > 0 for v in key[1:3]):
        return None
    prefix = f"{op}|{gpu}|{key[0]}|"
    rest = [str(v) for v in key[3:]]
    # a tile-major fused_moe key (ops/moe/dispatch.py) may take a natural-layout pick, which runs on
    # those codes too, at a distance of 0.5 more: the same layout's pick wins for the same shape
    other_layout = rest[:-1] if rest and rest[-1] == TILE_MAJOR else None
    best, best_d = None, math.inf
    for entry, cfg in list(_memory.items()):
        if not entry.startswith(prefix):
            continue
        try:
            n, k, *others = entry[len(prefix) :].split("|")
            if others != rest and others != other_layout:
                continue
            n, k = int(n), int(k)
            # fused_moe's keys hold (E, I) there, not (N, K), and past M = 64 the M tiles fill the GPU
            # (a split there adds float32 partials of a large output): those picks are taken as stored
            adapt = op != "fused_moe" and isinstance(key[0], int) and key[0] <= DECODE_MAX_M
            pick = _same_programs(cfg, n, key[1], candidates) if adapt else (cfg if cfg in candidates else None)
            if pick is None:
                continue
            d = abs(math.log2(n / key[1])) + 2 * abs(math.log2(k / key[2])) + (0.5 if others != rest else 0.0)
        except (ValueError, TypeError, ArithmeticError):  # a hand-edited or foreign entry (short key, N = 0, SPLIT_K = 0, ...)
            _log.warning("the stored entry %s: %s cannot be read; ignored", entry, cfg)
            continue
        if d < best_d:
            best, best_d = (pick, (n, k)), d
    return best


def _same_programs(cfg: dict, stored_n: int, n: int, candidates: list[dict]) -> dict | None:
    """``cfg`` (stored for ``stored_n`` output features) as offered for ``n``: the offered config that
    differs from it at most in ``SPLIT_K``, with the program count nearest to ``cfg``'s on its
    shape; ``cfg`` itself if offered and it has no split; None if no such config is offered."""
    if "BLOCK_N" not in cfg or "SPLIT_K" not in cfg:
        return cfg if cfg in candidates else None
    rest = {f: v for f, v in cfg.items() if f != "SPLIT_K"}
    variants = [c for c in candidates if {f: v for f, v in c.items() if f != "SPLIT_K"} == rest]
    if not variants:
        return None
    want = cfg["SPLIT_K"] * math.ceil(stored_n / cfg["BLOCK_N"]) / math.ceil(n / cfg["BLOCK_N"])
    return min(variants, key=lambda c: (abs(math.log2(c.get("SPLIT_K", 1) / want)), c.get("SPLIT_K", 1)))


def lookup(op: str, key: tuple, gpu: str) -> tuple[dict, str] | None:
    """The stored config for ``(op, key)`` on the GPU named ``gpu`` (``device_name``'s spelling) and
    where it is stored: the user cache (:func:`cache_path`) first, then the shipped table; None if
    neither holds it. Reads the files (not the in-process cache); measures nothing."""
    entry_key = _key_str(op, (gpu, *key))
    for path, where in ((cache_path(), "the user cache"), (_TUNED_DIR / f"{op}.{gpu}.json", "the shipped table")):
        data = read_json_object(path) or {}
        if entry_key in data:
            shown = f"ops/tuned/{path.name}" if path.parent == _TUNED_DIR else str(path)
            return data[entry_key], f"{where} ({shown})"
    return None


def lacks_keys(cfg: dict, candidates: Sequence[dict]) -> list[str]:
    """The meta-parameters that every offered config of ``cfg``'s family (its ``"kernel"``) carries and
    ``cfg`` does not: a pick stored by another qfuse version, before its kernel read them, would fail
    at launch (KeyError). [] where none of ``candidates`` is of its family (nothing to compare)."""
    same = [c.keys() for c in candidates if c.get("kernel") == cfg.get("kernel")]
    return sorted(set.intersection(*map(set, same)) - cfg.keys()) if same else []


def shipped_replacement(op: str, key: tuple, gpu: str, refused: dict, usable: Callable[[dict], bool]) -> dict | None:
    """What runs in place of a stored pick ``usable`` refuses (a user-cache entry): the shipped table's
    config for ``(op, key)`` on ``gpu`` (ops/tuned/) where it differs and may run; None: chosen again."""
    pick = (read_json_object(_TUNED_DIR / f"{op}.{gpu}.json") or {}).get(_key_str(op, (gpu, *key)))
    return pick if isinstance(pick, dict) and pick != refused and usable(pick) else None


def _save(entry_key: str, config: dict) -> None:
    try:
        merge_into_json(cache_path(), entry_key, config)
    except OSError as e:  # a cache that cannot be written only costs a re-measurement next time
        _log.info("autotune cache %s not written: %s", cache_path(), e)


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_GRAPH_CALLS = 10


def experimental_kernels() -> bool:
    """Whether the op dispatchers may pick kernel families that are tested under the Triton
    interpreter (and by SASS inspection) but have not yet passed the GPU grid: opt in with
    ``QFUSE_EXPERIMENTAL_KERNELS=1``. Without it they are never autotuned into use, so an
    unverified kernel cannot be chosen silently for a shape with no shipped config.
    Benchmarks and GPU tests call the families directly, whatever this says."""
    return env_flag("QFUSE_EXPERIMENTAL_KERNELS", False)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name: str, default: bool) -> bool:
    """An on / off environment variable: 1 / true / yes / on or 0 / false / no / off (any case,
    spaces around ignored); unset or empty: ``default``; anything else is a ValueError."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"{name}={os.environ[name]!r}: expected one of {', '.join(_TRUE)} or {', '.join(_FALSE)}")


def offered(candidates: list[dict], is_experimental: Callable[[dict], bool]) -> list[dict]:
    """The candidates an op may pick from: those ``is_experimental`` marks only with
    ``QFUSE_EXPERIMENTAL_KERNELS=1`` (:func:`experimental_kernels`)."""
    return candidates if experimental_kernels() else [c for c in candidates if not is_experimental(c)]


def graph_time_ms(calls: Sequence[Callable[[], object]], replays: int = 5, warmup: int = 1) -> float:
    """Median milliseconds per call: ``calls`` (run in order) captured in one CUDA graph and
    replayed, so no launch overhead is in the figure. The calls run once on the capture
    stream first (compilation, autotuning, lazy allocations stay out of the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    del graph
    return statistics.median(times)


def pick_config(
    op: str,
    key: tuple,
    candidates: list[dict] | Callable[[], list[dict]],
    run: Callable[[dict], object],
    device: torch.device,
    usable: Callable[[dict], bool] | None = None,
) -> dict:
    """Return the config to use for ``(op, key)`` on ``device``; ``run(cfg)`` launches the kernel once.

    ``candidates`` may be a function returning the list: it is then called once per key and process
    (a stored pick is checked against it, :func:`lacks_keys`), not on later calls. Building a
    launcher's list costs 15-70 us of Python (60 dicts for a W4A16 decode key), which a cached call
    then no longer pays. ``usable(cfg)``: whether a stored pick may run here (a kernel family this
    version has; an opt-in config only with ``QFUSE_EXPERIMENTAL_KERNELS=1``). A stored pick that
    may not, or that lacks a meta-parameter its family's configs carry here, is checked once per
    key and process and gives way to the shipped table's pick of the key (where that may run),
    else is chosen again, with a warning.
    """
    gpu = device_name(device)
    entry_key = _key_str(op, (gpu, *key))
    hit = _checked.get(entry_key)
    if hit is not None and _memory.get(entry_key) is hit:  # not replaced since (the tuners set _memory)
        return hit
    with _lock:
        if entry_key not in _memory:
            load_stored(op, gpu)
        hit = _memory.get(entry_key)
    if hit is not None and _refused.get(entry_key) is not hit:
        if callable(candidates):
            candidates = candidates()

        def runs_here(cfg) -> bool:
            return isinstance(cfg, dict) and (usable is None or usable(cfg)) and not lacks_keys(cfg, candidates)

        if runs_here(hit):
            _checked[entry_key] = hit
            return hit
        _refused[entry_key] = hit
        missing = lacks_keys(hit, candidates) if isinstance(hit, dict) else []
        why = f"it lacks {', '.join(missing)}, which its kernel reads" if missing else "an unknown kernel family, or opt-in"
        shipped = shipped_replacement(op, key, gpu, hit, runs_here)
        if shipped is not None:
            _log.warning("%s: the stored pick %s cannot run here (%s); the shipped pick %s runs", entry_key, hit, why, shipped)
            with _lock:
                _memory[entry_key] = shipped
            _checked[entry_key] = shipped
            return shipped
        _log.warning("%s: the stored pick %s cannot run here (%s); choosing again", entry_key, hit, why)
    untuned = capturing() or not env_flag("QFUSE_AUTOTUNE", True) or device.type != "cuda"
    memo = (entry_key, experimental_kernels())
    if untuned and memo in _untuned:  # before the candidate list: building it costs 15-70 us per call
        return _untuned[memo]
    if callable(candidates):
        candidates = candidates()
    if not candidates:
        raise ValueError(f"pick_config({op}): no candidate configs")
    if len(candidates) == 1:
        return candidates[0]
    if untuned:
        if device.type != "cuda":
            return candidates[0]
        with _lock:  # the search reads every stored entry: once per key
            _untuned[memo] = nearest_stored(op, gpu, key, candidates) or candidates[0]
        return _untuned[memo]
    with _measure_lock:
        done = _memory.get(entry_key)
        if done is not None and done is not hit:  # measured by another thread meanwhile
            return done
        best, best_ms, failed = None, float("inf"), []
        for cfg in candidates:
            try:
                ms = graph_time_ms([lambda: run(cfg)] * _GRAPH_CALLS)
            except Exception as e:  # a config that does not compile or fit (shared memory) is skipped, with its reason
                torch.cuda.synchronize()
                failed.append((cfg, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                continue
            if ms < best_ms:
                best, best_ms = cfg, ms
        failures[entry_key] = failed
        if failed:
            _log.info("%s: %d of %d configs failed to run, e.g. %s: %s", entry_key, len(failed), len(candidates), *failed[0])
        if best is None:
            reasons = "; ".join(f"{c}: {why}" for c, why in failed[:3])
            raise RuntimeError(f"pick_config({op}): none of the {len(candidates)} configs ran on {gpu}: {reasons}")
        with _lock:
            _memory[entry_key] = best
        _save(entry_key, best)
    return best
