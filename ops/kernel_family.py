"""Kernel families: the kernels a GEMM op can run, as first-class objects walked in one order.

Each op (``wna16_gemm``; ``w8a8_gemm`` and ``w4a8_gemm``, which share the int8 kernels) has a
:class:`Registry`: its :class:`KernelFamily` objects in a fixed order. For a :class:`Problem`
each family answers whether it can run it (``supports`` -> ``(ok, reason)``) and which configs
it offers (``configs``: plain dicts of meta-parameters whose ``"kernel"`` names the family).
The op's candidates are the families' configs in registry order, reordered by the op's
heuristic so that the config that runs untuned comes first; ops/_autotune.py then takes a
shipped or cached pick, or times the candidates once.

A family is opt-in as a whole (``default=False``, with ``why_opt_in``), or some of its configs
are (``opt_in(cfg)`` returns the reason): opt-in configs are offered only with
``QFUSE_EXPERIMENTAL_KERNELS=1``. :meth:`Registry.explain` keeps every refusal and opt-in reason,
which ``qfuse kernels --explain`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ._autotune import experimental_kernels


@dataclass(frozen=True)
class Problem:
    """One GEMM call's shape and setting: ``m`` tokens, ``n`` output features, ``k`` inputs,
    ``bits`` of the weights (4 or 8), ``group_size`` (-1 per channel), ``dtype`` of the
    activations (wna16; None when unknown), ``sms`` of the GPU, ``tma``: the device may run the
    TMA-fed families (compute capability >= 9.0, or the interpreter), ``gpu``: a CUDA device
    (inline-PTX forms, which the Triton interpreter cannot run, are offered only there),
    ``act_bits``: the activations' bits where one op takes both (fused_moe)."""

    m: int
    n: int
    k: int
    bits: int = 4
    group_size: int = -1
    dtype: torch.dtype | None = None
    sms: int = 132
    tma: bool = True
    gpu: bool = True
    act_bits: int | None = None  # fused_moe: 16 (float activations) or 8 (int8); the dense ops leave it unset


def _always(problem: Problem) -> tuple[bool, str]:
    return True, ""


def _none(cfg: dict) -> str:
    return ""


@dataclass(frozen=True)
class KernelFamily:
    """One kernel family: ``name`` (the configs' ``"kernel"``), the ``module`` that holds it,
    ``supports(problem) -> (ok, reason)``, ``configs(problem, exhaustive) -> [config]`` (without
    ``"kernel"``: the registry adds it), ``run(config, *op_args) -> Tensor``, whether it is offered
    by ``default`` (else ``why_opt_in`` says what it is for), and ``opt_in(config) -> reason`` for
    single configs kept opt-in ("" = offered)."""

    name: str
    module: str
    supports: Callable[[Problem], tuple[bool, str]]
    configs: Callable[[Problem, bool], list[dict]]
    run: Callable[..., torch.Tensor]
    default: bool = True
    why_opt_in: str = ""
    opt_in: Callable[[dict], str] = field(default=_none)

    def opt_in_reason(self, cfg: dict) -> str:
        """Why ``cfg`` is offered only with ``QFUSE_EXPERIMENTAL_KERNELS=1`` ("" if it is offered)."""
        return self.why_opt_in if not self.default else self.opt_in(cfg)


@dataclass(frozen=True)
class Verdict:
    """What one family said about one problem (:meth:`Registry.explain`)."""

    family: str
    supported: bool
    reason: str  # why it cannot run the problem, or why it is opt-in
    configs: int  # configs it generated
    offered: int  # of those, offered without QFUSE_EXPERIMENTAL_KERNELS


class Registry:
    """An op's families in order, and ``heuristic(problem, candidates) -> candidates`` that
    puts the untuned pick first (the rest keep their order)."""

    def __init__(self, op: str, families: Sequence[KernelFamily], heuristic: Callable[[Problem, list[dict]], list[dict]] = lambda p, c: c):
        names = [f.name for f in families]
        if len(set(names)) != len(names):
            raise ValueError(f"{op}: duplicate kernel family names in {names}")
        self.op = op
        self.families = tuple(families)
        self._by_name = {f.name: f for f in families}
        self.heuristic = heuristic

    def family(self, name: str) -> KernelFamily:
        try:
            return self._by_name[name]
        except KeyError:
            raise ValueError(f"qfuse.{self.op}: unknown kernel family {name!r} (known: {', '.join(self._by_name)})") from None

    def candidates(self, problem: Problem, exhaustive: bool = False) -> list[dict]:
        """Every config of every family that supports ``problem``, opt-in ones included, the
        heuristic pick first."""
        out = []
        for fam in self.families:
            if fam.supports(problem)[0]:
                out += [{"kernel": fam.name, **c} for c in fam.configs(problem, exhaustive)]
        return self.heuristic(problem, out)

    def is_opt_in(self, cfg: dict) -> bool:
        return bool(self.family(cfg["kernel"]).opt_in_reason(cfg))

    def usable(self, cfg) -> bool:
        """Whether a stored pick (a cache file's, a shipped table's) may run: a config of a family this
        version has, opt-in ones only with ``QFUSE_EXPERIMENTAL_KERNELS=1``."""
        fam = self._by_name.get(cfg.get("kernel")) if isinstance(cfg, dict) else None
        return fam is not None and (experimental_kernels() or not fam.opt_in_reason(cfg))

    def offered(self, problem: Problem, exhaustive: bool = False) -> list[dict]:
        """The candidates the op may pick from: opt-in configs only with ``QFUSE_EXPERIMENTAL_KERNELS=1``."""
        every = self.candidates(problem, exhaustive)
        return every if experimental_kernels() else [c for c in every if not self.is_opt_in(c)]

    def explain(self, problem: Problem) -> list[Verdict]:
        """Each family's answer for ``problem``, in registry order."""
        out = []
        for fam in self.families:
            ok, reason = fam.supports(problem)
            if not ok:
                out.append(Verdict(fam.name, False, reason, 0, 0))
                continue
            cfgs = [{"kernel": fam.name, **c} for c in fam.configs(problem, False)]
            kept = [c for c in cfgs if not fam.opt_in_reason(c)]
            why = fam.why_opt_in if not fam.default else "; ".join(dict.fromkeys(r for c in cfgs if (r := fam.opt_in(c))))
            out.append(Verdict(fam.name, True, why, len(cfgs), len(kept)))
        return out

    def run(self, cfg: dict, *args):
        return self.family(cfg["kernel"]).run(cfg, *args)
