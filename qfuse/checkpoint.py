"""Quantized checkpoints in and out.

    model = qfuse.from_pretrained("Llama-3-8B-AWQ")        # AutoAWQ / GPTQ / compressed-tensors
    qfuse.load_quantized("Llama-3-8B-GPTQ", model)          # into a model built elsewhere
    qfuse.save_quantized(model, "out/")                     # compressed-tensors, for vLLM / SGLang

Loading never materializes a float weight of a quantized layer: ``from_pretrained`` builds
the Hugging Face model with its parameters on the meta device and fills it tensor by tensor,
each quantized layer straight into the qfuse layout.

Sparse-MoE blocks (Mixtral, Qwen2-MoE, Qwen3-MoE; :class:`qfuse.moe.QuantMoE`) are stored as
Hugging Face checkpoints store them: each expert is three Linears under the names of
:data:`qfuse.moe.CHECKPOINT_NAMES` (Mixtral: ``<layer>.block_sparse_moe.experts.<e>.w1`` / ``w3`` /
``w2``, its router ``<layer>.block_sparse_moe.gate``; Qwen: ``<layer>.mlp.experts.<e>.gate_proj`` /
``up_proj`` / ``down_proj``), each quantized expert Linear written exactly as a dense layer of its
scheme (the same tensors and config group), float experts as ``.weight``. Loading stacks the
expert layers of each block back into :class:`qfuse.moe.QuantExperts`.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .checkpoint_moe import float_experts, load_experts, moe_sites, renamer, split_experts
from .eager_graphs import graph_blocks
from .formats import CheckpointError, open_checkpoint, quantization_config
from .formats.compressed_tensors import EXTENSION_KEY, EXTENSION_NAME, layer_to_ct
from .formats.compressed_tensors import NAME as CT_NAME
from .formats.files import check_checkpoint_dir, parse_size, write_safetensors
from .fused_projections import ProjectionSlice, member_layers
from .linear import QuantLinear
from .models.cast import rotary_inv_freq
from .moe import QuantExperts, QuantMoE
from .norm import RMSNorm, is_convertible_rmsnorm
from .quantize_model import head_untied

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _model_dtype(config: dict, dtype: torch.dtype | str | None, reader=None) -> torch.dtype:
    """The activation dtype: ``dtype`` if given; for AutoAWQ / GPTQ the dtype their scales are
    stored in (fp16), so the weights stay bit-exact; else config.json's when it is fp16/bf16;
    else fp16."""
    if isinstance(dtype, str):
        named, dtype = dtype, _DTYPES.get(dtype.removeprefix("torch."))
        if dtype is None:
            raise ValueError(f"dtype must be float16 or bfloat16, got {named!r}")
    if dtype is not None:
        if dtype not in _DTYPES.values():
            raise TypeError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
        return dtype
    if reader is not None and reader.name != CT_NAME:
        scales = [n for n in reader.files.names() if n.endswith(".scales")]
        stored = {"F16": torch.float16, "BF16": torch.bfloat16}.get(reader.files.dtype(scales[0])) if scales else None
        if stored is not None:
            return stored
    named = config.get("torch_dtype") or config.get("dtype")
    return _DTYPES.get(str(named).removeprefix("torch."), torch.float16)


def _uncompiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` / ``qfuse.compile`` wrapper holds: its state_dict names
    carry an ``_orig_mod.`` prefix no reader knows."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was compiled
    while eval_frame is not None and isinstance(model, eval_frame.OptimizedModule):
        model = model._orig_mod
    return model


def _aliases(model: nn.Module) -> dict[str, list[str]]:
    """Every parameter / buffer name -> all names of that same tensor (tied weights)."""
    by_id: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        by_id.setdefault(id(t), []).append(name)
    return {name: names for names in by_id.values() for name in names}


def _set_tensor(model: nn.Module, name: str, value: Tensor) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    if leaf in module._parameters:
        module._parameters[leaf] = value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[leaf] = value


# Buffers the model computes from its config: transformers before 4.31 saved Llama's rotary
# inv_freq in every attention layer (early GPTQ / AWQ checkpoints hold them); transformers and
# vLLM skip them on load, and the model rebuilds them in float32
COMPUTED_BUFFERS = ("rotary_emb.inv_freq",)


def _plain_tensors(reader, model: nn.Module, consumed: set[str], quantized: tuple[str, ...], rename, dtype: torch.dtype, device) -> dict[str, Tensor]:
    """Every checkpoint tensor that is not ``consumed`` by a quantized layer or an expert, by its
    name in the model (``rename``), checked against the model's parameter or buffer of that name
    (shape; floating point or not), cast to ``dtype``. A tensor under a ``quantized`` prefix (a
    checkpoint name) that no layer consumes belongs to nothing."""
    files = reader.files
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(model.named_buffers(remove_duplicate=False))
    plain = {}
    for stored in files.names():
        if stored in consumed or stored.endswith(COMPUTED_BUFFERS):
            continue
        where = files.file_of[stored]
        name = rename(stored)
        if name not in targets or stored.startswith(quantized):
            shown = repr(stored) if name == stored else f"{stored!r} ({name} in the model)"
            raise CheckpointError(f"{where}: tensor {shown} belongs to no parameter or buffer of the model")
        want = targets[name]
        t = files.get(stored)
        if tuple(t.shape) != tuple(want.shape):
            raise CheckpointError(f"{where}: tensor {stored!r} has shape {list(t.shape)}, the model expects {list(want.shape)}")
        if t.is_floating_point() != want.is_floating_point():
            raise CheckpointError(
                f"{where}: tensor {stored!r} has dtype {str(t.dtype).removeprefix('torch.')}, "
                f"the model expects {str(want.dtype).removeprefix('torch.')}"
            )
        plain[name] = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    return plain


def _check_nothing_missing(model: nn.Module, aliases: dict[str, list[str]], replaced: tuple[str, ...], plain: dict[str, Tensor], files) -> None:
    """Fail, before the model is touched, on any parameter or stored buffer the checkpoint
    does not provide (a tied weight is provided when one of its names is, ``aliases``: the
    model's :func:`_aliases`); names under a ``replaced`` prefix belong to modules the loader replaces."""
    stored = set(model.state_dict(keep_vars=True))
    missing = [n for n in aliases if n in stored and not n.startswith(replaced) and not any(a in plain for a in aliases[n])]
    if missing:
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        shards = ", ".join(sorted({f.name for f in files.file_of.values()}))
        raise CheckpointError(f"{files.path}: the checkpoint has no tensor for {', '.join(missing[:10])}{more} (searched {shards})")


def _check_tied(aliases: dict[str, list[str]], plain: dict[str, Tensor], files) -> None:
    """Fail on two stored tensors with different values for one tensor of the model (``aliases``:
    its :func:`_aliases`; a checkpoint with its own ``lm_head.weight`` loaded into a model built
    with tied embeddings): assigning both would keep whichever came last."""
    for name, t in plain.items():
        for other in aliases.get(name, ()):
            if other > name and other in plain and not torch.equal(plain[other], t):
                raise CheckpointError(
                    f"{files.path}: the checkpoint stores {name} and {other} with different values, but the model "
                    "ties them (one tensor); build the model with them untied (e.g. config tie_word_embeddings=False)"
                )


# Config fields that change what the same tensors compute (a tensor's shape does not show them):
# a checkpoint loaded into a model built with other values gives other logits without an error.
_SEMANTIC_FIELDS = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "num_experts_per_tok", "norm_topk_prob")


def _check_config(model: nn.Module, config: dict, path: Path) -> None:
    """Fail where the model's config and the checkpoint's config.json disagree on a field of
    ``_SEMANTIC_FIELDS`` that both have."""
    mine = getattr(model, "config", None)
    if mine is None or not config:
        return
    differ = [
        f"{f}: config.json {config[f]!r}, the model {getattr(mine, f)!r}"
        for f in _SEMANTIC_FIELDS
        if f in config and config[f] is not None and getattr(mine, f, None) is not None and getattr(mine, f) != config[f]
    ]
    if differ:
        raise CheckpointError(
            f"{path / 'config.json'}: the model was built with another architecture than the checkpoint's ({'; '.join(differ)}); "
            "build it from this config.json (qfuse.from_pretrained does)"
        )


def load_quantized(
    path: str | Path,
    model: nn.Module | None = None,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> nn.Module:
    """Load the quantized checkpoint at ``path`` (AutoAWQ GEMM, GPTQ v1/v2, compressed-tensors;
    detected from ``config.json`` / ``quantize_config.json``) into ``model`` and return it.

    ``model`` is the float architecture, with parameters real or on the meta device; each
    quantized layer in the checkpoint replaces the ``nn.Linear`` of that name by a
    :class:`qfuse.QuantLinear`, each sparse-MoE block whose experts are quantized in the
    checkpoint becomes a :class:`qfuse.moe.QuantMoE` (its router and shared expert kept), every
    other tensor is assigned by name (cast to ``dtype`` if floating point; tied weights stay
    tied; float experts stored per expert are stacked into the block), computed buffers left on
    the meta device (rotary ``inv_freq``) are rebuilt from ``model.config``, and RMSNorms become
    :class:`qfuse.RMSNorm`.
    ``model=None`` builds the Hugging Face model from ``config.json`` (:func:`from_pretrained`).

    ``dtype`` (fp16 or bf16) defaults to the stored scale dtype for AutoAWQ and GPTQ (fp16, so
    their weights stay bit-exact), else to config.json's dtype.

    Raises :class:`qfuse.CheckpointError` (a ``ValueError``) naming the file and tensor for a
    missing or malformed tensor, a config the tensors contradict, a layer the model lacks, or a
    model parameter the checkpoint lacks. Everything is read and checked before the model is
    changed, so after an error the model is as it was.
    """
    if model is None:
        return from_pretrained(path, dtype=dtype, device=device, progress=progress)
    compiled, model = model, _uncompiled(model)
    if any(isinstance(m, ProjectionSlice) for m in model.modules()):
        raise ValueError(
            "load_quantized: the model has projections stacked by qfuse.fuse_projections, and checkpoints name "
            "q_proj / k_proj / v_proj and gate_proj / up_proj; load into the unfused model and fuse after loading"
        )
    path = Path(path)
    reader = open_checkpoint(path)
    config, _ = quantization_config(path)
    _check_config(model, config, path)
    dtype = _model_dtype(config, dtype, reader)
    specs = reader.layers()
    sites = moe_sites(model)
    to_model = renamer(sites, to_disk=False)
    moe_specs, moe_floats = split_experts(reader.files, sites, specs, to_model)
    for prefix, spec in specs.items():
        where = reader.files.where(prefix)
        name = to_model(prefix)
        shown = prefix if name == prefix else f"{prefix} ({name} in the model)"
        try:
            target = model.get_submodule(name)
        except AttributeError:
            raise CheckpointError(f"{where}: quantized layer {shown} has no module of that name in the model") from None
        shape = (target.out_features, target.in_features) if isinstance(target, (nn.Linear, QuantLinear)) else None
        if shape != (spec.out_features, spec.in_features):
            raise CheckpointError(
                f"{where}: quantized layer {shown} is [{spec.out_features}, {spec.in_features}], "
                f"the model's {type(target).__name__} there is {list(shape) if shape else 'not a linear layer'}"
            )
    by_name = {site.name: site for site in sites}
    consumed = {t for spec in specs.values() for t in spec.tensors}
    consumed |= {t for rows in moe_specs.values() for row in rows for spec in row for t in spec.tensors}
    consumed |= {f"{p}.weight" for rows in moe_floats.values() for row in rows for p in row}
    quantized = tuple(f"{p}." for p in specs) + tuple(f"{by_name[n].disk}.experts." for n in [*moe_specs, *moe_floats])
    plain = _plain_tensors(reader, model, consumed, quantized, to_model, dtype, device)
    float_moes = {}
    for name, rows in moe_floats.items():
        site = by_name[name]
        gate_up, down = float_experts(reader.files, site, rows, dtype, device)
        if isinstance(site.module, QuantMoE):  # a model whose block is converted already: float experts
            e = site.module.experts
            experts = QuantExperts(e.num_experts, e.hidden_size, e.intermediate_size, e.top_k, e.renormalize, None, {"w13": gate_up, "w2": down})
            float_moes[name] = QuantMoE.with_experts(site.module, experts)
        else:
            plain[f"{name}.experts.gate_up_proj"], plain[f"{name}.experts.down_proj"] = gate_up, down
    replaced = tuple(f"{to_model(p)}." for p in specs) + tuple(f"{n}.experts." for n in [*moe_specs, *float_moes])
    aliases = _aliases(model)
    _check_nothing_missing(model, aliases, replaced, plain, reader.files)
    _check_tied(aliases, plain, reader.files)
    built, moes = {}, dict(float_moes)
    total = len(specs) + sum(len(rows) * 3 for rows in moe_specs.values())
    with tqdm(total=total, desc=f"qfuse load ({reader.name})", unit="layer", disable=not progress) as bar:
        for name, rows in moe_specs.items():
            moes[name] = load_experts(reader, by_name[name], rows, dtype, device)
            bar.update(len(rows) * 3)
        for prefix, spec in specs.items():
            built[to_model(prefix)] = reader.build(spec, dtype).to(device)
            bar.update()
    # Everything is read and checked: the model changes from here on.
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    for name, moe in moes.items():  # before the layers: a shared expert's Linears are set inside the new block
        model.set_submodule(name, moe)
    for prefix, layer in built.items():
        model.set_submodule(prefix, layer)
    for name, t in plain.items():
        value = nn.Parameter(t, requires_grad=False) if name in params else t
        for alias in aliases.get(name, [name]):
            if alias == name or not alias.startswith(replaced):  # a tied head quantized in the checkpoint has no float weight
                _set_tensor(model, alias, value)
    _rebuild_meta_buffers(model, getattr(model, "config", None))
    if head_untied(model):  # the checkpoint's head is quantized: the model's config must stop tying it
        model.config.tie_word_embeddings = False
    for name, mod in list(model.named_modules()):
        if name and is_convertible_rmsnorm(mod):
            model.set_submodule(name, RMSNorm.from_module(mod))
    graph_blocks(model)  # as quantize_model: eager MLP calls replayed as CUDA graphs
    model.eval()
    return compiled


def _rebuild_meta_buffers(model: nn.Module, config) -> None:
    """Non-persistent buffers (rotary ``inv_freq``) are computed, not stored: rebuild each
    module that holds one on the meta device from the config, on the CPU."""
    for name, module in model.named_modules():
        meta = [b for b, t in module._buffers.items() if t is not None and t.is_meta and b in module._non_persistent_buffers_set]
        if not meta:
            continue
        try:
            if config is None:
                raise ValueError("the model has no config")
            fresh = type(module)(config=config)
        except Exception as e:
            raise CheckpointError(f"cannot rebuild the computed buffers {meta} of {name} ({type(module).__name__}): {e}") from None
        for b in meta:
            module._buffers[b] = fresh._buffers[b]
        for attr, value in vars(fresh).items():  # e.g. attention_scaling, computed with inv_freq
            if not attr.startswith("_") and not isinstance(value, (Tensor, nn.Module)):
                setattr(module, attr, value)


def from_pretrained(
    path: str | Path,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> nn.Module:
    """Build the Hugging Face causal LM described by ``path/config.json`` and load the quantized
    checkpoint into it (see :func:`load_quantized`). Float weights of quantized layers are never
    materialized: the model is built on the meta device, so peak host memory is about the
    checkpoint's size. Nothing is downloaded; ``path`` is a local directory."""
    import transformers

    path = Path(path)
    check_checkpoint_dir(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json to build the model from (pass a model to load_quantized instead)")
    quantization_config(path)  # an unreadable config raises a CheckpointError naming it, before transformers reads it
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the layers are qfuse's; transformers must not quantize anything
    with torch.device("meta"):  # parameters and buffers: no memory, no init
        model = transformers.AutoModelForCausalLM.from_config(config)
    _rebuild_meta_buffers(model, config)
    return load_quantized(path, model, dtype=dtype, device=device, progress=progress)


def save_quantized(model: nn.Module, path: str | Path, *, max_shard_size: int | str = "5GB", progress: bool = True) -> Path:
    """Save a qfuse-quantized model as a compressed-tensors checkpoint (safetensors, sharded past
    ``max_shard_size``, with ``model.safetensors.index.json``) plus ``config.json``, so vLLM and
    SGLang load it and shard it for tensor parallelism; :func:`from_pretrained` reloads it with
    identical logits.

    Weight-only layers are written ``pack-quantized``; W8A8 and W4A8 (per-channel) layers
    ``int-quantized`` with dynamic per-token (or static per-tensor) int8 activations. W4A8_G128
    layers, whose integer group scale the format cannot express, are written as int-quantized
    W8A8 layers holding the exact int8 product and listed under ``qfuse_extension`` in
    config.json (engines run the same math; qfuse reloads them 4-bit).

    The experts of a :class:`qfuse.moe.QuantMoE` are written one quantized Linear per expert and
    projection under the Hugging Face checkpoint names (see the module docstring), each exactly as
    a dense layer of the experts' scheme; float experts (a block kept in floating point) one
    ``.weight`` per expert and projection, listed in ``ignore`` with the routers.
    """
    path = Path(path)
    parse_size(max_shard_size)  # a bad size fails before the work
    model = _uncompiled(model)
    sites = moe_sites(model)
    # projections stacked by fuse_projections are written as their members, under the members' names
    members, stacked = member_layers(model)
    layers = {n: members.get(n, m) for n, m in model.named_modules() if n not in stacked and isinstance(members.get(n, m), QuantLinear)}
    float_members = {n: m for n, m in members.items() if not isinstance(m, QuantLinear)}
    quantized_moes = [s for s in sites if isinstance(s.module, QuantMoE) and s.module.experts.scheme is not None]
    if not layers and not quantized_moes:
        raise ValueError(
            "save_quantized: the model has no qfuse.QuantLinear layers or quantized QuantMoE experts; quantize it first (qfuse.quantize_model)"
        )
    rounded = [(n, b.dtype) for n, b in rotary_inv_freq(model).items() if b.dtype in (torch.float16, torch.bfloat16)]
    if rounded:  # Module.to(dtype) rounded them; from_pretrained rebuilds them in float32
        warnings.warn(
            f"save_quantized: the model's rotary inv_freq ({rounded[0][0]}) is {str(rounded[0][1]).removeprefix('torch.')}, "
            "rounded by Module.to(dtype); the reloaded model computes it in float32, so its logits differ slightly from this model's. "
            "Build the float model with from_pretrained(..., dtype=...) or qfuse.models.cast.cast_float_model instead of .to(dtype)",
            stacklevel=2,
        )
    to_disk = renamer(sites, to_disk=True)
    member_names = {to_disk(n) for n in members}
    entries = [(to_disk(n), m, False) for n, m in layers.items()]
    for site in quantized_moes:
        for e in range(site.num_experts):
            entries += [(site.expert(e, j), lin, True) for j, lin in enumerate(site.module.experts.expert_layers(e))]
    tensors: dict[str, Tensor] = {}
    groups: dict[str, dict] = {}
    extension, extension_groups = [], {}
    for name, layer, expert in tqdm(entries, desc="qfuse save", unit="layer", disable=not progress):
        entry, local, ext = layer_to_ct(layer)
        if expert or name in member_names:  # views of stacked buffers: safetensors refuses tensors that share memory
            local = {k: v.clone() if v._base is not None else v for k, v in local.items()}
        key = json.dumps(entry, sort_keys=True)
        groups.setdefault(key, {**entry, "targets": []})["targets"].append(name)
        tensors.update({f"{name}.{k}": v for k, v in local.items()})
        if layer.bias is not None:
            tensors[f"{name}.bias"] = layer.bias.clone() if layer.bias._base is not None else layer.bias
        if ext:
            extension.append(name)
            if layer.scheme.group_size != 128:  # a layer of K not a multiple of 128 (quantize_model's group fallback)
                extension_groups[name] = layer.scheme.group_size
    prefixes = tuple(f"{n}." for n in [*layers, *stacked]) + tuple(f"{s.name}.experts." for s in sites)
    for name, lin in float_members.items():
        tensors.update({f"{to_disk(name)}.{k}": v for k, v in lin.state_dict().items()})
    seen = set()
    for name, t in model.state_dict().items():
        if name.startswith(prefixes):
            continue
        key = (t.data_ptr(), t.shape, t.dtype)
        if t.numel() and key in seen:  # tied weights (lm_head = embed_tokens): stored once, re-tied on load
            continue
        seen.add(key)
        tensors[to_disk(name)] = t
    float_experts = []
    for site in sites:
        if any(site is q for q in quantized_moes):
            continue
        experts = site.module.experts
        gate_up, down = (experts.w13, experts.w2) if isinstance(site.module, QuantMoE) else (experts.gate_up_proj, experts.down_proj)
        i = site.intermediate
        for e in range(site.num_experts):
            for j, w in enumerate((gate_up[e, :i], gate_up[e, i:], down[e])):
                float_experts.append(site.expert(e, j))
                tensors[f"{float_experts[-1]}.weight"] = w.detach().clone()
    float_linears = {to_disk(n) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in stacked}
    float_linears |= {to_disk(n) for n in float_members}
    # the routers stay float (they are nn.Linear layers in transformers 4 models)
    routers = {".".join(p for p in (s.disk, "gate") if p) for s in sites}
    float_linears = sorted(float_linears | routers | set(float_experts))
    config_groups = {}
    for i, g in enumerate(groups.values()):
        if len(groups) == 1:
            g["targets"] = ["Linear"]  # every Linear not in ignore (the float ones are all listed there)
        config_groups[f"group_{i}"] = g
    if len(config_groups) > 1:
        warnings.warn(
            f"save_quantized: {path} has {len(config_groups)} config groups (schemes or group sizes); qfuse and "
            "compressed-tensors read each layer's group, but transformers' compressed-tensors loader (5.25) decompresses "
            "every dense layer with the first group's scheme and loads such a checkpoint wrong or fails",
            UserWarning,
            stacklevel=2,
        )
    formats = {g["format"] for g in config_groups.values()}
    qc = {
        "quant_method": CT_NAME,
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "quantization_status": "compressed",
        "config_groups": config_groups,
        "ignore": float_linears,
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
    }
    config = model.config.to_dict() if hasattr(model, "config") and hasattr(model.config, "to_dict") else {}
    config.pop(EXTENSION_KEY, None)
    act_dtype = next((t.dtype for t in model.parameters() if t.dtype in _DTYPES.values()), None)
    if act_dtype is not None:  # Module.to(dtype) does not update config.dtype; readers take the dtype from here
        config["dtype"] = config["torch_dtype"] = str(act_dtype).removeprefix("torch.")
    if head_untied(model):  # a quantized head of a model loaded with its config still tied
        config["tie_word_embeddings"] = False
    config["quantization_config"] = qc
    if extension:
        config[EXTENSION_KEY] = {
            "name": EXTENSION_NAME,
            "version": 1,
            "layers": extension,
            "about": "int-quantized int8 weights that are int4 codes times an integer group scale in [1, 16] per "
            "128 inputs (or per the layer's entry in group_sizes); qfuse reloads these layers as W4A8 "
            "with that group, other engines run them as W8A8 (same math)",
        }
        if extension_groups:
            config[EXTENSION_KEY]["group_sizes"] = extension_groups
    write_safetensors(tensors, path, max_shard_size)
    with open(path / "config.json", "w") as f:
        json.dump(config, f, indent=2, sort_keys=True, default=str)
    return path
