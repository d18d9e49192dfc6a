"""Corrupt or inconsistent checkpoints give a CheckpointError naming the tensor and the file,
never a silently wrong model.

Every case starts from a valid checkpoint that qfuse itself wrote (a tiny Llama quantized
W4A16 / W8A8 / W8A16 and saved with save_quantized), breaks one thing, and checks that
from_pretrained raises, and that load_quantized into a meta-device skeleton raises the same
error with the skeleton left as it was (nothing loaded, nothing swapped in).
"""

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import qfuse
from qfuse.formats.files import INDEX_NAME, SINGLE_NAME
from qfuse.formats.packing import pack_int32
from tests.hf_models import tiny_hf_model

pytest.importorskip("transformers")

Q = "model.layers.0.self_attn.q_proj"  # [256, 256]: W4A16 weight_packed [256, 32], weight_scale [256, 2]
DOWN = "model.layers.0.mlp.down_proj"  # [256, 512] (K=320 in the k320 checkpoint)
NORM = "model.layers.0.input_layernorm.weight"
FILE = SINGLE_NAME


# ----------------------------------------------------------------------------- valid checkpoints, made once


def _save(tmp_path_factory, name, scheme, **kw):
    model = qfuse.quantize_model(tiny_hf_model("llama", layers=1, **kw.pop("model", {})), scheme, progress=False)
    path = tmp_path_factory.mktemp(name)
    qfuse.save_quantized(model, path, progress=False, **kw)
    return path


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """kind -> a pristine checkpoint directory (built on first use; tests copy them)."""
    made = {}

    def get(kind):
        if kind not in made:
            made[kind] = {
                "w4": lambda: _save(tmp_path_factory, "w4", "W4A16"),
                "w4_sharded": lambda: _save(tmp_path_factory, "w4_sharded", "W4A16", max_shard_size=150_000),
                "w8": lambda: _save(tmp_path_factory, "w8", "W8A8"),
                "k320": lambda: _save(tmp_path_factory, "k320", "W8A16", model={"intermediate": 320}),
            }[kind]()
        return made[kind]

    return get


@pytest.fixture
def ckpt(bases, tmp_path):
    """kind -> a fresh copy of that valid checkpoint, to corrupt."""

    def copy_of(kind):
        path = tmp_path / kind
        shutil.copytree(bases(kind), path)
        return path

    return copy_of


# ----------------------------------------------------------------------------- rewriting a checkpoint


def stored(path: Path) -> dict[str, tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint: name -> (file name, tensor)."""
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                out[name] = (file.name, f.get_tensor(name))
    return out


def edit_tensors(path: Path, fn) -> None:
    """Rewrite the checkpoint's tensors through ``fn(tensors)`` (a name -> tensor dict it may change
    in place): each tensor stays in its file, new ones go to the first file, the index follows."""
    old = stored(path)
    tensors = {name: t for name, (_, t) in old.items()}
    fn(tensors)
    files = sorted({file for file, _ in old.values()})
    shards = {file: {} for file in files}
    for name, t in tensors.items():
        shards[old[name][0] if name in old else files[0]][name] = t.contiguous()
    for file, shard in shards.items():
        save_file(shard, path / file, metadata={"format": "pt"})
    if (path / INDEX_NAME).is_file():
        index = json.loads((path / INDEX_NAME).read_text())
        index["weight_map"] = {name: file for file, shard in shards.items() for name in shard}
        (path / INDEX_NAME).write_text(json.dumps(index))


def delete(*names):
    def fn(t):
        for name in names:
            del t[name]

    return fn


def change(name, how):
    def fn(t):
        t[name] = how(t[name])

    return fn


def add(name, value):
    def fn(t):
        t[name] = value

    return fn


def edit_config(path: Path, fn) -> None:
    config = json.loads((path / "config.json").read_text())
    fn(config)
    (path / "config.json").write_text(json.dumps(config))


def group0(config: dict) -> dict:
    return config["quantization_config"]["config_groups"]["group_0"]


def set_weights(**args):
    return lambda c: group0(c)["weights"].update(args)


def set_activations(**args):
    return lambda c: group0(c)["input_activations"].update(args)


def layer_prefixes(path: Path) -> list[str]:
    return sorted(n.removesuffix(".weight_scale") for n in stored(path) if n.endswith(".weight_scale"))


def make_static(path: Path, scale: float = 0.02) -> None:
    """A W8A8 checkpoint -> static per-tensor activations: config input_activations
    ``strategy: tensor, dynamic: false`` and an ``input_scale`` [1] per layer."""
    prefixes = layer_prefixes(path)
    edit_config(path, set_activations(strategy="tensor", dynamic=False, observer="minmax"))
    edit_tensors(path, lambda t: t.update({f"{p}.input_scale": torch.tensor([scale]) for p in prefixes}))


def asymmetric_layer(path: Path, prefix: str, zero_point: torch.Tensor) -> None:
    """A W4A16 checkpoint -> ``prefix`` alone asymmetric (a second config group naming it, which
    wins over the ``Linear`` group) with ``zero_point`` as its weight_zero_point."""

    def fn(c):
        g = copy.deepcopy(group0(c))
        g["targets"] = [prefix]
        g["weights"]["symmetric"] = False
        c["quantization_config"]["config_groups"]["group_1"] = g

    edit_config(path, fn)
    edit_tensors(path, add(f"{prefix}.weight_zero_point", zero_point))


# ----------------------------------------------------------------------------- the check


def names(*parts) -> str:
    """A ``match=`` regex: every part, literally, in this order."""
    return ".*".join(re.escape(str(p)) for p in parts)


@pytest.fixture(scope="module")
def skeleton(bases):
    """kind -> the float model of that checkpoint, parameters on the meta device (from the
    pristine config.json, so a corrupted one does not matter)."""
    import transformers

    configs = {}

    def build(kind):
        if kind not in configs:
            configs[kind] = transformers.AutoConfig.from_pretrained(bases(kind), local_files_only=True)
            del configs[kind].quantization_config
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(configs[kind])

    return build


def untouched(model) -> bool:
    return not any(isinstance(m, qfuse.QuantLinear) for m in model.modules()) and all(t.is_meta for t in model.state_dict().values())


@pytest.fixture
def rejected(skeleton):
    """``rejected(path, match)``: from_pretrained raises a CheckpointError matching ``match``;
    load_quantized into a skeleton raises it too, and leaves the skeleton untouched."""

    def check(path: Path, match: str, *, into_model: bool = True):
        with pytest.raises(qfuse.CheckpointError, match=match):
            qfuse.from_pretrained(path, progress=False)
        if into_model:
            model = skeleton(path.name)  # ckpt() names each copy after its kind
            with pytest.raises(qfuse.CheckpointError, match=match):
                qfuse.load_quantized(path, model, progress=False)
            assert untouched(model), "a failed load_quantized changed the model"

    return check


@pytest.mark.parametrize("kind", ["w4", "w4_sharded", "w8", "k320"])
def test_the_valid_checkpoints_load(ckpt, kind):
    """The controls: every checkpoint the cases below corrupt loads as it was written."""
    model = qfuse.from_pretrained(ckpt(kind), progress=False)
    assert sum(isinstance(m, qfuse.QuantLinear) for m in model.modules()) == 7


def test_the_sharded_checkpoint_has_shards(bases):
    assert len(list(bases("w4_sharded").glob("*.safetensors"))) >= 3


# ----------------------------------------------------------------------------- missing tensors


@pytest.mark.parametrize(
    ("kind", "leaf", "message"),
    [
        ("w4", "weight_packed", f"{FILE}: layer {Q} has a weight_scale but neither weight_packed nor weight"),
        ("w4", "weight_shape", f": tensor '{Q}.weight_shape' is missing (not in {FILE})"),
        ("w4", "weight_scale", f"{FILE}: tensor '{Q}.weight_"),  # weight_packed or weight_shape, whichever comes first
        ("w4", "weight_scale", f"is quantized data, but there is no '{Q}.weight_scale'"),
        ("w8", "weight", f"{FILE}: layer {Q} has a weight_scale but neither weight_packed nor weight"),
        ("w8", "weight_scale", f"{FILE}: tensor '{Q}.weight' (I8) is quantized data, but there is no '{Q}.weight_scale'"),
    ],
)
def test_quantized_layer_tensor_deleted(ckpt, rejected, kind, leaf, message):
    path = ckpt(kind)
    edit_tensors(path, delete(f"{Q}.{leaf}"))
    rejected(
        path, names(f"{path}{'/' if message.startswith(FILE) else ''}{message}") if message.startswith((FILE, ":")) else names(path / FILE, message)
    )


def test_static_input_scale_deleted(ckpt, rejected):
    path = ckpt("w8")
    make_static(path)
    edit_tensors(path, delete(f"{Q}.input_scale"))
    rejected(path, names(path, f"'{Q}.input_scale' is missing", FILE))


@pytest.mark.parametrize("name", [NORM, "model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"])
def test_plain_tensor_deleted(ckpt, rejected, name):
    path = ckpt("w4")
    edit_tensors(path, delete(name))
    # load_quantized has swapped layers into the model by the time it finds this out (see below)
    rejected(path, names(path, "has no tensor for", name), into_model=False)


def test_plain_tensor_deleted_leaves_a_given_model_untouched(ckpt, rejected):
    path = ckpt("w4")
    edit_tensors(path, delete(NORM))
    rejected(path, names(path, "has no tensor for", NORM))


# ----------------------------------------------------------------------------- wrong shape or dtype


@pytest.mark.parametrize(
    ("kind", "name", "how", "message"),
    [
        ("w4", f"{DOWN}.weight_scale", lambda t: t[:, :-1], f"{FILE}: layer {DOWN}: weight_scale has shape [256, 3], expected [256, 4]"),
        ("w4", f"{DOWN}.weight_scale", lambda t: t[:-1], f"{FILE}: layer {DOWN}: weight_scale has shape [255, 4], expected [256, 4]"),
        ("w4", f"{DOWN}.weight_scale", lambda t: t.reshape(-1), f"{FILE}: layer {DOWN}: weight_scale has shape [1024]"),
        ("w4", f"{Q}.weight_packed", lambda t: t[:-1], f"{FILE}: tensor '{Q}.weight_packed' has shape [255, 32], but '{Q}.weight_shape' [256, 256]"),
        ("w4", f"{Q}.weight_packed", lambda t: t[:, :-1], f"{FILE}: tensor '{Q}.weight_packed' has shape [256, 31]"),
        ("w4", f"{Q}.weight_shape", lambda t: t[:1], f"{FILE}: tensor '{Q}.weight_shape' has shape [1], expected [2]"),
        ("w4", NORM, lambda t: t[:-1], f"{FILE}: tensor '{NORM}' has shape [255], the model expects [256]"),
        ("w4", "model.embed_tokens.weight", lambda t: t[:, :-8], f"{FILE}: tensor 'model.embed_tokens.weight' has shape [256, 248]"),
        ("w8", f"{Q}.weight_scale", lambda t: t[:-1], f"{FILE}: layer {Q}: weight_scale has shape [255, 1], expected [256, 1] or [1]"),
        ("w8", f"{Q}.weight_scale", lambda t: t.expand(-1, 2), f"{FILE}: layer {Q}: weight_scale has shape [256, 2]"),
        ("w8", f"{Q}.weight", lambda t: t[:-1], f"/{FILE}: quantized layer {Q} is [255, 256], the model's Linear there is [256, 256]"),
    ],
)
def test_wrong_shape(ckpt, rejected, kind, name, how, message):
    path = ckpt(kind)
    edit_tensors(path, change(name, how))
    rejected(path, names(path / message) if message.startswith(FILE) else names(f"{path}{message}"))


@pytest.mark.parametrize(
    ("kind", "name", "dtype", "message"),
    [
        ("w4", f"{Q}.weight_packed", torch.int64, "dtype int64, expected int32"),
        ("w4", f"{Q}.weight_packed", torch.uint8, "dtype uint8, expected int32"),
        ("w4", f"{Q}.weight_scale", torch.int32, "dtype int32, expected float16 or bfloat16 or float32"),
        ("w4", f"{Q}.weight_shape", torch.float32, "dtype float32, expected int64 or int32"),
        ("w8", f"{Q}.weight", torch.int32, "dtype int32, expected int8"),
        ("w8", f"{Q}.weight", torch.bfloat16, "dtype bfloat16, expected int8"),
        ("w8", f"{Q}.weight_scale", torch.int32, "dtype int32, expected float16 or bfloat16 or float32"),
    ],
)
def test_wrong_dtype(ckpt, rejected, kind, name, dtype, message):
    path = ckpt(kind)
    edit_tensors(path, change(name, lambda t: t.to(dtype)))
    rejected(path, names(path / FILE, f"tensor '{name}' has {message}"))


def test_wrong_dtype_of_a_static_input_scale(ckpt, rejected):
    path = ckpt("w8")
    make_static(path)
    edit_tensors(path, change(f"{Q}.input_scale", lambda t: t.to(torch.int32)))
    rejected(path, names(path / FILE, f"tensor '{Q}.input_scale' has dtype int32"))


# ----------------------------------------------------------------------------- config: bits, strategies, types


@pytest.mark.parametrize(
    ("kind", "edit", "message"),
    [
        ("w4", set_weights(num_bits=3), "weight_bits must be 4 or 8, got 3"),
        ("w4", set_weights(num_bits=2), "weight_bits must be 4 or 8, got 2"),
        ("w4", set_weights(num_bits=16), "weight_bits must be 4 or 8, got 16"),
        ("w4", set_weights(num_bits=1), "weight_bits must be 4 or 8, got 1"),
        ("w4", set_weights(num_bits="four"), "num_bits='four' and group_size=128 must be integers"),
        ("w4", set_weights(num_bits=None), "num_bits=None"),
        ("w8", set_weights(num_bits=3), "weight_bits must be 4 or 8, got 3"),
        ("w8", set_weights(num_bits=16), "weight_bits must be 4 or 8, got 16"),
        ("w4", set_weights(strategy="block", block_structure=[128, 128]), "weight strategy 'block' is not supported"),
        ("w4", set_weights(strategy="token"), "weight strategy 'token' is not supported"),
        ("w4", set_weights(strategy="tensor_group"), "weight strategy 'tensor_group' is not supported"),
        ("w4", set_weights(type="float"), "only integer quantization is supported (got weights type 'float')"),
        ("w4", set_weights(type="float", num_bits=8), "only integer quantization is supported"),
        ("w8", set_activations(type="float"), "only integer quantization is supported"),
        ("w8", set_activations(num_bits=4), "activations must be symmetric int8"),
        ("w8", set_activations(symmetric=False), "activations must be symmetric int8"),
        ("w8", set_activations(strategy="tensor", dynamic=True), "activation strategy 'tensor' with dynamic=True is not supported"),
        ("w8", set_activations(strategy="group", group_size=128), "activation strategy 'group'"),
        ("w8", set_weights(symmetric=False), "int8-activation layers need symmetric weights"),
        ("w8", lambda c: group0(c).update(output_activations=group0(c)["input_activations"]), "output activation quantization is not supported"),
        ("w4", lambda c: group0(c).update(format="marlin-24"), "compressed-tensors format 'marlin-24' is not supported"),
        ("w4", lambda c: group0(c).update(format="nvfp4-pack-quantized"), "format 'nvfp4-pack-quantized' is not supported"),
    ],
)
def test_unsupported_config(ckpt, rejected, kind, edit, message):
    path = ckpt(kind)
    edit_config(path, edit)
    rejected(path, names(path / "config.json", "layer model.layers.0.", message))


@pytest.mark.parametrize("fmt", ["nonsense-format", "dense", "sparse-24-bitmask"])
def test_unsupported_checkpoint_format(ckpt, rejected, fmt):
    """The format names the layout of the tensors; one qfuse does not read is refused by name,
    not loaded as if it were another (an unknown name loaded before)."""
    path = ckpt("w4")
    edit_config(path, lambda c: c["quantization_config"].update(format=fmt))
    rejected(path, names(path, f"compressed-tensors format {fmt!r} is not supported"))


@pytest.mark.parametrize(
    ("kind", "edit", "message"),
    [
        # bits the codes were not written with: caught by the tensors' shape or value range
        (
            "w4",
            set_weights(num_bits=8),
            f"{FILE}: tensor '{DOWN}.weight_packed' has shape [256, 64], but '{DOWN}.weight_shape' [256, 512] with 8-bit codes needs [256, 128]",
        ),
        ("w8", set_weights(num_bits=4), f"{FILE}: layer {DOWN}: weight codes lie in"),
        (
            "k320",
            set_weights(num_bits=4),
            f"{FILE}: tensor '{DOWN}.weight_packed' has shape [256, 80], but '{DOWN}.weight_shape' [256, 320] with 4-bit codes needs [256, 40]",
        ),
    ],
)
def test_bits_disagreeing_with_the_tensors(ckpt, rejected, kind, edit, message):
    path = ckpt(kind)
    edit_config(path, edit)
    rejected(path, names(path, message))


# ----------------------------------------------------------------------------- config: group size


@pytest.mark.parametrize(
    ("group_size", "message"),
    [
        (96, "group_size must be -1, 32, 64 or 128, got 96"),  # divides neither 256 nor 512, and no kernel runs it
        (100, "group_size must be -1, 32, 64 or 128, got 100"),
        (256, "group_size must be -1, 32, 64 or 128, got 256"),  # divides K, but the kernels cannot run it
        (16, "group_size must be -1, 32, 64 or 128, got 16"),
        (None, "weight strategy 'group' needs a positive group_size, got None"),
        (0, "weight strategy 'group' needs a positive group_size, got 0"),
        (-1, "weight strategy 'group' needs a positive group_size, got -1"),
        ("big", "group_size='big' must be integers"),
    ],
)
def test_group_size_the_kernels_cannot_run(ckpt, rejected, group_size, message):
    path = ckpt("w4")
    edit_config(path, set_weights(group_size=group_size))
    rejected(path, names(path / "config.json", "layer model.layers.0.", message))


def test_group_size_not_dividing_k(ckpt, rejected):
    path = ckpt("k320")  # down_proj has K=320, quantized per channel
    edit_config(path, set_weights(strategy="group", group_size=128))
    rejected(path, names(path / FILE, f"layer {DOWN}: in_features=320 is not divisible by group_size=128"))


@pytest.mark.parametrize(
    ("kind", "group_size", "message"),
    [
        ("w4", 64, f"layer {DOWN}: weight_scale has shape [256, 4], expected [256, 8]"),  # written with 128
        ("w4", 32, f"layer {DOWN}: weight_scale has shape [256, 4], expected [256, 16]"),
        ("k320", 64, f"layer {DOWN}: weight_scale has shape [256, 1], expected [256, 5]"),  # written per channel
    ],
)
def test_group_size_disagreeing_with_the_scales(ckpt, rejected, kind, group_size, message):
    path = ckpt(kind)
    edit_config(path, set_weights(strategy="group", group_size=group_size))
    rejected(path, names(path / FILE, message))


def test_channel_strategy_for_group_scales(ckpt, rejected):
    path = ckpt("w4")
    edit_config(path, set_weights(strategy="channel", group_size=None))
    rejected(path, names(path / FILE, f"layer {DOWN}: weight_scale has shape [256, 4], expected [256, 1]"))


# ----------------------------------------------------------------------------- truncated and garbage files


def cut(file: Path, keep: int) -> None:
    file.write_bytes(file.read_bytes()[:keep])


def header_length(file: Path) -> int:
    return int.from_bytes(file.read_bytes()[:8], "little")


@pytest.mark.parametrize("how", ["half", "few bytes", "one byte", "inside header", "inside length"])
def test_truncated_safetensors(ckpt, rejected, how):
    path = ckpt("w4")
    file = path / FILE
    size, n = file.stat().st_size, header_length(file)
    keep = {"half": size // 2, "few bytes": size - 5, "one byte": size - 1, "inside header": 8 + n // 2, "inside length": 4}[how]
    cut(file, keep)
    rejected(path, names(file, "truncated" if keep >= 8 + n else "not a readable safetensors file"))


def test_truncated_safetensors_names_the_tensor_cut_off(ckpt, rejected):
    path = ckpt("w4")
    file = path / FILE
    header = json.loads(file.read_bytes()[8 : 8 + header_length(file)])
    last = max((t for t in header if t != "__metadata__"), key=lambda t: header[t]["data_offsets"][1])
    cut(file, file.stat().st_size - 2)
    rejected(path, names(file, "truncated", f"tensor '{last}'"))


def test_garbage_bytes(ckpt, rejected):
    path = ckpt("w4")
    file = path / FILE
    g = torch.Generator().manual_seed(0)
    file.write_bytes(bytes(torch.randint(0, 256, (file.stat().st_size,), generator=g, dtype=torch.uint8).tolist()))
    rejected(path, names(file, "not a readable safetensors file"))


def test_garbage_data_after_a_valid_header(ckpt, rejected):
    """Overwritten data bytes keep the file readable: the checks on values catch them (here the
    first found is weight_shape [-1, -1]; weight_scale is NaN everywhere too)."""
    path = ckpt("w4")
    file = path / FILE
    raw = bytearray(file.read_bytes())
    start = 8 + header_length(file)
    raw[start:] = b"\xff" * (len(raw) - start)  # 0xffff is a NaN bfloat16
    file.write_bytes(bytes(raw))
    rejected(path, names(file, "'model.layers.0.", "weight_shape' [-1, -1]"))


def test_empty_file(ckpt, rejected):
    path = ckpt("w4")
    (path / FILE).write_bytes(b"")
    rejected(path, names(path / FILE, "not a readable safetensors file"))


def test_no_safetensors_at_all(ckpt, rejected):
    path = ckpt("w4")
    (path / FILE).unlink()
    rejected(path, names(path, "no safetensors files"))


# ----------------------------------------------------------------------------- sharded checkpoints


def shards(path: Path) -> list[Path]:
    return sorted(path.glob("model-*-of-*.safetensors"))


def test_sharded_checkpoint_with_a_shard_missing(ckpt, rejected):
    path = ckpt("w4_sharded")
    gone = shards(path)[1]
    gone.unlink()
    rejected(path, names(gone, "listed in the index but missing"))


def test_sharded_checkpoint_with_a_shard_truncated(ckpt, rejected):
    path = ckpt("w4_sharded")
    shard = shards(path)[-1]
    cut(shard, shard.stat().st_size // 2)
    rejected(path, names(shard, "truncated"))


def test_index_lists_a_tensor_not_in_its_shard(ckpt, rejected):
    path = ckpt("w4_sharded")
    first = shards(path)[0]
    with safe_open(first, framework="pt") as f:
        victim = sorted(f.keys())[0]
    tensors = stored(path)
    save_file({n: t for n, (file, t) in tensors.items() if file == first.name and n != victim}, first, metadata={"format": "pt"})
    rejected(path, names(path / INDEX_NAME, f"tensor '{victim}' is listed in {first.name} but not stored there"))


def test_index_lists_a_tensor_in_the_wrong_shard(ckpt, rejected):
    path = ckpt("w4_sharded")
    index = json.loads((path / INDEX_NAME).read_text())
    counts = {}
    for file in index["weight_map"].values():
        counts[file] = counts.get(file, 0) + 1
    victim = sorted(n for n, file in index["weight_map"].items() if counts[file] > 1)[0]  # its shard stays listed
    right = index["weight_map"][victim]
    wrong = next(s.name for s in shards(path) if s.name != right)
    index["weight_map"][victim] = wrong
    (path / INDEX_NAME).write_text(json.dumps(index))
    rejected(path, names(path / INDEX_NAME, f"'{victim}' is listed in {wrong} but stored in {right}"))


def test_sharded_layer_error_names_the_shard(ckpt, rejected):
    path = ckpt("w4_sharded")
    edit_tensors(path, change(f"{Q}.weight_scale", lambda t: t.index_fill(0, torch.tensor([5]), float("nan"))))
    files = {file for name, (file, _) in stored(path).items() if name.startswith(f"{Q}.")}
    where = path / files.pop() if len(files) == 1 else path  # the shard, or the directory when the layer spans two
    rejected(path, names(where, f"layer {Q}: scales hold NaN"))


# ----------------------------------------------------------------------------- config and tensors disagreeing


def test_config_symmetric_but_nonzero_zero_points(ckpt, rejected):
    path = ckpt("w4")
    zp = torch.full((256, 2), 3, dtype=torch.uint8)  # unsigned 3 = signed -5
    edit_tensors(path, add(f"{Q}.weight_zero_point", pack_int32(zp, 4, dim=0)))
    rejected(path, names(path / FILE, f"layer {Q}: the config says symmetric but weight_zero_point holds nonzero zero points"))


def test_config_symmetric_with_all_zero_zero_points_loads(ckpt):
    """compressed-tensors before mid-2024 stored (zero) zero points for symmetric layers too."""
    path = ckpt("w4")
    edit_tensors(path, add(f"{Q}.weight_zero_point", pack_int32(torch.full((256, 2), 8, dtype=torch.uint8), 4, dim=0)))
    edit_tensors(path, add(f"{DOWN}.weight_zero_point", torch.zeros(256, 4, dtype=torch.int8)))  # the older unpacked form
    model = qfuse.from_pretrained(path, progress=False)
    assert model.get_submodule(Q).zeros is None and model.get_submodule(Q).scheme.name == "W4A16"


@pytest.mark.parametrize("zero", [0, 5])
def test_w8a8_zero_points(ckpt, rejected, zero):
    path = ckpt("w8")
    edit_tensors(path, add(f"{Q}.weight_zero_point", torch.full((256, 1), zero, dtype=torch.int8)))
    if zero:
        rejected(path, names(path / FILE, f"layer {Q}: weight_zero_point", "symmetric"))
    else:
        assert qfuse.from_pretrained(path, progress=False).get_submodule(Q).scheme.name == "W8A8"


def test_config_asymmetric_but_no_zero_points(ckpt, rejected):
    path = ckpt("w4")
    edit_config(path, set_weights(symmetric=False))
    rejected(path, names(path / FILE, "layer model.layers.0.", "the config says asymmetric but weight_zero_point is missing"))


def test_one_layer_asymmetric_without_its_zero_points(ckpt, rejected):
    path = ckpt("w4")
    asymmetric_layer(path, Q, torch.zeros(256, 2, dtype=torch.int8))
    edit_tensors(path, delete(f"{Q}.weight_zero_point"))
    rejected(path, names(path / FILE, f"layer {Q}: the config says asymmetric but weight_zero_point is missing"))


@pytest.mark.parametrize(
    ("shape", "dtype"), [((256, 3), torch.int8), ((255, 2), torch.int8), ((32, 3), torch.int32), ((256, 2), torch.int32), ((256, 2), torch.float16)]
)
def test_zero_points_of_the_wrong_shape_or_dtype(ckpt, rejected, shape, dtype):
    path = ckpt("w4")
    asymmetric_layer(path, Q, torch.zeros(shape, dtype=dtype))
    message = "dtype float16, expected int32 or int8" if dtype.is_floating_point else f"weight_zero_point has shape {list(shape)}"
    rejected(path, names(path / FILE, Q, message))


def test_weight_shape_disagreeing_with_weight_packed(ckpt, rejected):
    path = ckpt("w4")
    edit_tensors(path, change(f"{Q}.weight_shape", lambda t: torch.tensor([256, 128])))
    rejected(path, names(path / FILE, f"tensor '{Q}.weight_packed' has shape [256, 32], but '{Q}.weight_shape' [256, 128]"))


def test_weight_shape_disagreeing_with_the_model(ckpt, rejected):
    # W8A16 per channel, so no group constrains K; 254 8-bit codes still take 64 words a row
    path = ckpt("k320")
    edit_tensors(path, change(f"{Q}.weight_shape", lambda t: torch.tensor([256, 254])))
    rejected(path, names(path, f"quantized layer {Q} is [256, 254], the model's Linear there is [256, 256]"))


def test_quantized_layer_the_ignore_list_names(ckpt, rejected):
    path = ckpt("w4")
    edit_config(path, lambda c: c["quantization_config"]["ignore"].append(Q))
    rejected(path, names(path, f"layer {Q} has quantized tensors but the config's ignore list names it"))


def test_quantized_layer_no_config_group_targets(ckpt, rejected):
    path = ckpt("w4")
    edit_config(path, lambda c: group0(c).update(targets=["re:.*mlp.*"]))
    rejected(path, names(path, "layer model.layers.0.self_attn.", "has quantized tensors but no config group targets it"))


def test_quantized_layer_the_model_does_not_have(ckpt, rejected):
    path = ckpt("w4")
    renamed = Q.replace("q_proj", "qq_proj")
    edit_tensors(path, lambda t: t.update({k.replace(Q, renamed): t.pop(k) for k in [k for k in t if k.startswith(f"{Q}.")]}))
    rejected(path, names(path, f"quantized layer {renamed} has no module of that name in the model"))


def test_quantized_layer_where_the_model_has_no_linear(ckpt, rejected):
    path = ckpt("w4")
    edit_tensors(path, lambda t: t.update({k.replace(Q, "model.layers.0.self_attn"): t.pop(k) for k in [k for k in t if k.startswith(f"{Q}.")]}))
    rejected(path, names(path, "quantized layer model.layers.0.self_attn is [256, 256]", "not a linear layer"))


@pytest.mark.parametrize(
    ("kind", "name", "value", "message"),
    [
        ("w4", "model.foo.weight", torch.zeros(3), "tensor 'model.foo.weight' belongs to no parameter or buffer of the model"),
        ("w4", f"{Q}.weight_foo", torch.zeros(3), f"tensor '{Q}.weight_foo' belongs to no parameter or buffer of the model"),
        (
            "w4",
            f"{Q}.weight",
            torch.zeros(256, 256, dtype=torch.bfloat16),
            f"tensor '{Q}.weight' is stored but the layer's weights are in weight_packed",
        ),
        (
            "w4",
            f"{Q}.weight_g_idx",
            torch.arange(256, dtype=torch.int32).flip(0) // 128,
            f"tensor '{Q}.weight_g_idx' is stored but the config sets no group actorder",
        ),
        ("w4", f"{Q}.input_scale", torch.ones(1), f"tensor '{Q}.input_scale' is stored but the config's activations are not static per-tensor"),
        ("w8", f"{Q}.input_scale", torch.ones(1), f"tensor '{Q}.input_scale' is stored but the config's activations are not static per-tensor"),
        (
            "w4",
            "model.layers.0.self_attn.x_proj.weight_packed",
            torch.zeros(4, 1, dtype=torch.int32),
            "'model.layers.0.self_attn.x_proj.weight_packed' (I32) is quantized data, but there is no 'model.layers.0.self_attn.x_proj.weight_scale'",
        ),
        ("w4", "lm_head.weight_zero_point", torch.zeros(1, 1, dtype=torch.int32), "'lm_head.weight_zero_point' (I32) is quantized data"),
    ],
)
def test_extra_tensor(ckpt, rejected, kind, name, value, message):
    path = ckpt(kind)
    edit_tensors(path, add(name, value))
    rejected(path, names(path / FILE, message))


def test_plain_tensor_stored_as_integers(ckpt, rejected):
    path = ckpt("w4")
    edit_tensors(path, change(NORM, lambda t: t.to(torch.int32)))
    rejected(path, names(path / FILE, f"'{NORM}' (I32)"))


def test_config_without_quantization_config(ckpt, rejected):
    path = ckpt("w4")
    edit_config(path, lambda c: c.pop("quantization_config"))
    rejected(path, names(path, "no quantization config", "is this a quantized checkpoint?"))


@pytest.mark.parametrize("method", ["bitsandbytes", "fp8", "", None])
def test_unknown_quant_method(ckpt, rejected, method):
    path = ckpt("w4")
    edit_config(path, lambda c: c["quantization_config"].update(quant_method=method))
    rejected(path, names(path, f"quant_method {method!r} is not supported"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["quantization_config"].update(quantization_status="frozen"), "quantization_status is 'frozen'"),
        (lambda c: c["quantization_config"].update(config_groups={}), "quantization_config has no config_groups"),
        (lambda c: c["quantization_config"].update(sparsity_config={"format": "sparse-24"}), "sparsity_config is not supported"),
        (lambda c: c["quantization_config"].update(kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme is not supported"),
        (lambda c: c.update(qfuse_extension={"name": "someone.else"}), "unknown qfuse_extension 'someone.else'"),
        (
            lambda c: c.update(qfuse_extension={"name": "qfuse.w4a8_integer_group_scale", "layers": [Q]}),
            f"layer {Q}: qfuse.w4a8_integer_group_scale layers are dynamic W8A8 per-channel layers, this one is weight-only",
        ),
    ],
)
def test_other_config_problems(ckpt, rejected, edit, message):
    path = ckpt("w4")
    edit_config(path, edit)
    rejected(path, names(path, message))


@pytest.mark.parametrize("content", ['{"architectures": ["LlamaForCausalLM"],', "", "\x00\xff", "[]"])
def test_invalid_json_in_config(ckpt, skeleton, content):
    path = ckpt("w4")
    (path / "config.json").write_bytes(content.encode("latin-1"))
    model = skeleton("w4")
    with pytest.raises(qfuse.CheckpointError, match=names(path / "config.json", "not valid JSON" if content != "[]" else "expected a JSON object")):
        qfuse.load_quantized(path, model, progress=False)
    assert untouched(model)


def test_invalid_json_in_config_from_pretrained(ckpt):
    path = ckpt("w4")
    (path / "config.json").write_text((path / "config.json").read_text()[:-10])
    with pytest.raises(qfuse.CheckpointError, match=names(path / "config.json", "not valid JSON")):
        qfuse.from_pretrained(path, progress=False)


def test_no_config_json(ckpt, skeleton):
    path = ckpt("w4")
    (path / "config.json").unlink()
    with pytest.raises(qfuse.CheckpointError, match=names(path, "no config.json")):
        qfuse.from_pretrained(path, progress=False)
    model = skeleton("w4")
    with pytest.raises(qfuse.CheckpointError, match=names(path, "no quantization config")):
        qfuse.load_quantized(path, model, progress=False)
    assert untouched(model)


# ----------------------------------------------------------------------------- values the ops would reject


@pytest.mark.parametrize(("low", "high"), [(100, 100), (-100, -100), (-9, 0), (0, 8), (-128, 127)])
def test_zero_points_out_of_range_for_4_bit(ckpt, rejected, low, high):
    """Unpacked int8 zero points (compressed-tensors < 0.9.4) must lie in [-8, 7] for 4-bit;
    packed 4-bit ones cannot leave it."""
    path = ckpt("w4")
    zp = torch.zeros(256, 2, dtype=torch.int8)
    zp[7, 1], zp[100, 0] = low, high
    asymmetric_layer(path, Q, zp)
    rejected(path, names(path / FILE, f"layer {Q}: weight_zero_point values lie in [{min(low, 0)}, {max(high, 0)}], outside the 4-bit range [-8, 7]"))


@pytest.mark.parametrize("packed", [False, True])
def test_zero_points_in_range_load(ckpt, packed):
    path = ckpt("w4")
    zp = torch.randint(-8, 8, (256, 2), dtype=torch.int8)
    asymmetric_layer(path, Q, pack_int32((zp + 8).to(torch.uint8), 4, dim=0) if packed else zp)
    layer = qfuse.from_pretrained(path, progress=False).get_submodule(Q)
    assert layer.scheme.name == "W4A16_ASYM"
    assert torch.equal(layer.zeros, (zp + 8).to(torch.uint8))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("kind", ["w4", "w8"])
def test_non_finite_weight_scale(ckpt, rejected, kind, value):
    path = ckpt(kind)
    edit_tensors(path, change(f"{Q}.weight_scale", lambda t: t.index_fill(0, torch.tensor([17]), value)))
    rejected(path, names(path / FILE, f"layer {Q}: ", "NaN or inf"))


def test_static_w8a8_loads(ckpt):
    path = ckpt("w8")
    make_static(path, 0.03125)
    layer = qfuse.from_pretrained(path, progress=False).get_submodule(Q)
    assert layer.scheme.static_act and torch.equal(layer.input_scale, torch.tensor([0.03125]))


@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("inf")])
def test_static_input_scale_not_positive_and_finite(ckpt, rejected, value):
    path = ckpt("w8")
    make_static(path)
    edit_tensors(path, change(f"{Q}.input_scale", lambda t: torch.full_like(t, value)))
    rejected(path, names(path / FILE, f"layer {Q}: input_scale: "))


@pytest.mark.parametrize("shape", [(2,), (256,), (0,)])
def test_static_input_scale_not_one_value(ckpt, rejected, shape):
    path = ckpt("w8")
    make_static(path)
    edit_tensors(path, change(f"{Q}.input_scale", lambda t: torch.full(shape, 0.02)))
    rejected(path, names(path / FILE, f"layer {Q}: input_scale must hold one value, got shape {list(shape)}"))
