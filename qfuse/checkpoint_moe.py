"""Where the experts of sparse-MoE blocks live in a checkpoint, and building them back.

Hugging Face checkpoints store each expert as three Linears under the names of
:data:`qfuse.moe.CHECKPOINT_NAMES` (Mixtral: ``<layer>.block_sparse_moe.experts.<e>.w1`` / ``w3``
/ ``w2``; Qwen: ``<layer>.mlp.experts.<e>.gate_proj`` / ``up_proj`` / ``down_proj``), while the
model holds them stacked (:class:`qfuse.moe.QuantExperts`, or transformers' fused
``experts.gate_up_proj``). :func:`moe_sites` finds the blocks, :func:`renamer` maps tensor names
between the model and the checkpoint, :func:`split_experts` takes a block's expert layers out of a
checkpoint's layer list, :func:`load_experts` / :func:`float_experts` build them back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .formats import CheckpointError, LayerSpec
from .formats.base import FLOAT_DTYPES
from .moe import CHECKPOINT_NAMES, QuantExperts, QuantMoE, block_routing, is_sparse_moe_block


@dataclass
class MoeSite:
    """A sparse-MoE block of the model (a Hugging Face block or a QuantMoE) and its checkpoint names."""

    name: str  # in the model
    module: nn.Module
    disk: str  # the block's name in checkpoints
    projections: tuple[str, str, str]  # gate, up, down
    num_experts: int
    hidden: int
    intermediate: int

    def expert(self, e: int, j: int) -> str:
        """The checkpoint name of expert ``e``'s projection ``j`` (0 gate, 1 up, 2 down)."""
        return ".".join(p for p in (self.disk, "experts", str(e), self.projections[j]) if p)

    def expert_shape(self, j: int) -> tuple[int, int]:
        return (self.hidden, self.intermediate) if j == 2 else (self.intermediate, self.hidden)

    def describe(self) -> str:
        names = " / ".join(self.projections)
        return f"{self.disk}.experts.<e>.{names} for e in 0..{self.num_experts - 1}"


def moe_sites(model: nn.Module) -> list[MoeSite]:
    """Every sparse-MoE block of ``model``, Hugging Face or :class:`QuantMoE`, with its checkpoint names."""
    sites = []
    for name, m in model.named_modules():
        if isinstance(m, QuantMoE):
            block_type = m.block_type
            e, h, i = m.experts.num_experts, m.experts.hidden_size, m.experts.intermediate_size
        elif is_sparse_moe_block(m):
            block_type = type(m).__name__
            e, two_i, h = m.experts.gate_up_proj.shape
            i = two_i // 2
        else:
            continue
        if block_type not in CHECKPOINT_NAMES:
            raise ValueError(
                f"{name or 'the model'}: QuantMoE of block type {block_type!r} has no checkpoint names for its experts "
                f"(known: {', '.join(CHECKPOINT_NAMES)}); build it with QuantMoE.from_block or QuantMoE.with_experts"
            )
        leaf, projections = CHECKPOINT_NAMES[block_type]
        parent = name.rpartition(".")[0]
        disk = name if leaf is None or not name else ".".join(p for p in (parent, leaf) if p)
        sites.append(MoeSite(name, m, disk, projections, e, h, i))
    return sites


def renamer(sites: list[MoeSite], to_disk: bool):
    """Tensor or module name in the model -> in checkpoints (``to_disk``), or back: the blocks whose
    checkpoint name differs (Mixtral's ``block_sparse_moe``) swap that prefix."""
    pairs = [(s.name, s.disk) if to_disk else (s.disk, s.name) for s in sites if s.disk != s.name]

    def rename(name: str) -> str:
        for src, dst in pairs:
            if name == src or name.startswith(f"{src}."):
                return dst + name[len(src) :]
        return name

    return rename


def _listing(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def split_experts(files, sites: list[MoeSite], specs: dict[str, LayerSpec], rename) -> tuple[dict, dict]:
    """Take each block's expert layers out of ``specs``: ``({block: [[gate, up, down] LayerSpec per
    expert]}, {block: [[gate, up, down] name of a float expert per expert]})``. A block has all its
    experts quantized, all float (``.weight``), or none per expert (then the model's own names, a
    fused ``experts.gate_up_proj``, must be in the checkpoint); anything else, an expert layer of the
    wrong shape or scheme, or one the block does not have, is a CheckpointError naming it."""
    quantized, floats = {}, {}
    model_names = {rename(n) for n in files.names()}
    for site in sites:  # quantized layers under a block's experts that are not its experts
        expected = {site.expert(e, j) for e in range(site.num_experts) for j in range(3)}
        stray = sorted(p for p in specs if p.startswith(f"{site.disk}.experts.") and p not in expected)
        if stray:
            raise CheckpointError(
                f"{files.where(stray[0])}: quantized layer {_listing(stray, 3)}: block {site.name} ({type(site.module).__name__}) "
                f"has {site.num_experts} experts, stored as {site.describe()}"
            )
    for site in sites:
        rows = [[site.expert(e, j) for j in range(3)] for e in range(site.num_experts)]
        flat = [p for row in rows for p in row]
        where = files.where(f"{site.disk}.experts") if site.disk else str(files.path)
        label = f"{where}: sparse-MoE block {site.name} ({type(site.module).__name__}: {site.describe()})"
        found_q = [p for p in flat if p in specs]
        found_f = [p for p in flat if f"{p}.weight" in files and p not in specs]
        if found_q:
            missing = [p for p in flat if p not in specs]
            if missing:
                raise CheckpointError(f"{label}: {len(found_q)} of {len(flat)} expert layers are quantized; no quantized layer {_listing(missing)}")
            first = specs[flat[0]].scheme
            for e, row in enumerate(rows):
                for j, p in enumerate(row):
                    spec = specs[p]
                    n, k = site.expert_shape(j)
                    if (spec.out_features, spec.in_features) != (n, k):
                        raise CheckpointError(
                            f"{files.where(p)}: expert layer {p} is [{spec.out_features}, {spec.in_features}], block {site.name} "
                            f"needs [{n}, {k}] (hidden size {site.hidden}, expert intermediate size {site.intermediate})"
                        )
                    if spec.scheme != first:
                        raise CheckpointError(
                            f"{files.where(p)}: expert layer {p} has scheme {spec.scheme.name} and {flat[0]} {first.name}; "
                            "the experts of one block run one scheme"
                        )
            quantized[site.name] = [[specs.pop(p) for p in row] for row in rows]
        elif found_f:
            missing = [f"{p}.weight" for p in flat if f"{p}.weight" not in files]
            if missing:
                raise CheckpointError(f"{label}: {len(found_f)} of {len(flat)} float expert weights are stored; no tensor {_listing(missing)}")
            floats[site.name] = rows
        elif not any(n.startswith(f"{site.name}.experts.") for n in model_names):
            raise CheckpointError(f"{label}: the checkpoint has no expert tensors (no {flat[0]}.weight_packed / .weight / .qweight, ...)")
    return quantized, floats


def load_experts(reader, site: MoeSite, rows: list[list[LayerSpec]], dtype: torch.dtype, device) -> QuantMoE:
    """The block's QuantMoE with experts built from their per-expert quantized layers."""
    where = f"{reader.files.where(f'{site.disk}.experts')}: sparse-MoE block {site.name}"
    if isinstance(site.module, QuantMoE):
        top_k, renormalize = site.module.experts.top_k, site.module.experts.renormalize
    else:
        try:
            top_k, renormalize = block_routing(site.module, site.name)
        except ValueError as e:
            raise CheckpointError(f"{where}: {e}") from None
    layers = [tuple(reader.build(spec, dtype) for spec in row) for row in rows]
    try:
        experts = QuantExperts.from_expert_layers(layers, top_k, renormalize, rows[0][0].scheme, f"{site.disk}.experts")
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None
    return QuantMoE.with_experts(site.module, experts.to(device))


def float_experts(files, site: MoeSite, rows: list[list[str]], dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
    """``(gate_up [E, 2I, H], down [E, H, I])`` from each expert's float ``.weight`` tensors."""
    ws = [[files.get(f"{p}.weight", FLOAT_DTYPES, site.expert_shape(j)) for j, p in enumerate(row)] for row in rows]
    gate_up = torch.stack([torch.cat([g, u]) for g, u, _ in ws]).to(device=device, dtype=dtype)
    down = torch.stack([d for _, _, d in ws]).to(device=device, dtype=dtype)
    return gate_up, down
