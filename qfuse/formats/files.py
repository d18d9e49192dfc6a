"""Reading and writing a checkpoint directory: ``config.json`` plus safetensors files
(one ``model.safetensors`` or shards listed in ``model.safetensors.index.json``).

Every problem is a :class:`CheckpointError` naming the file and, where there is one, the
tensor: a missing tensor, a wrong shape or dtype, a truncated or unreadable file.
Tensors are read one at a time (``safe_open``), so nothing but the tensor asked for is
materialized.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, or disagrees with its own config."""


def check_checkpoint_dir(path: Path) -> None:
    """A path that does not exist, or is a file, named as such (not as a directory missing its files)."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: {'not a directory' if path.exists() else 'no such directory'} (a checkpoint is a directory)")


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


class CheckpointFiles:
    """The tensors of a checkpoint directory, by name."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a directory")
        self.file_of: dict[str, Path] = {}
        self._meta: dict[str, tuple[str, list[int]]] = {}
        index = self.path / INDEX_NAME
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: no 'weight_map' (an object of tensor name -> file name)")
            for tensor, name in weight_map.items():
                if not isinstance(name, str) or not name or Path(name).name != name:
                    raise CheckpointError(f"{index}: tensor {tensor!r} is listed in {name!r}, not a file name in {self.path}")
            files = sorted(set(weight_map.values()))
        elif (self.path / SINGLE_NAME).is_file():
            files = [SINGLE_NAME]
        else:
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{self.path}: no safetensors files (and no {INDEX_NAME})")
        self.files = [self.path / name for name in files]
        for file in self.files:
            self._scan(file)
        if index.is_file():
            for tensor, name in weight_map.items():
                if tensor not in self.file_of:
                    raise CheckpointError(f"{index}: tensor {tensor!r} is listed in {name} but not stored there")
                if self.file_of[tensor].name != name:
                    raise CheckpointError(f"{index}: tensor {tensor!r} is listed in {name} but stored in {self.file_of[tensor].name}")

    def _scan(self, file: Path) -> None:
        """Read the header of ``file`` and check that its data is all there."""
        if not file.is_file():
            raise CheckpointError(f"{file}: listed in the index but missing")
        try:
            size = file.stat().st_size
            with open(file, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if size < 8 or n > size - 8:
                    raise ValueError(f"header of {n} bytes in a {size}-byte file" if size >= 8 else f"only {size} bytes")
                header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
        except OSError as e:
            raise CheckpointError(f"{file}: cannot read it ({e.strerror or e})") from None
        header.pop("__metadata__", None)
        for tensor, info in header.items():
            try:
                begin, end = info["data_offsets"]
                ok = isinstance(info["dtype"], str) and all(isinstance(d, int) and d >= 0 for d in [*info["shape"], begin, end])
            except (TypeError, KeyError, ValueError):
                ok = False
            if not ok or begin > end:
                raise CheckpointError(f"{file}: not a readable safetensors file (tensor {tensor!r} has a malformed header entry {info!r})")
        end = max((info["data_offsets"][1] for info in header.values()), default=0)
        if 8 + n + end > size:
            raise CheckpointError(
                f"{file}: truncated ({size} bytes, its header needs {8 + n + end}; "
                f"tensor {max(header, key=lambda t: header[t]['data_offsets'][1])!r} ends past the end)"
            )
        for tensor, info in header.items():
            if tensor in self.file_of:
                raise CheckpointError(f"{file}: tensor {tensor!r} is also stored in {self.file_of[tensor].name}")
            self.file_of[tensor] = file
            self._meta[tensor] = (info["dtype"], info["shape"])

    def names(self) -> list[str]:
        return list(self.file_of)

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def shape(self, name: str) -> tuple[int, ...]:
        self._require(name)
        return tuple(self._meta[name][1])

    def nbytes(self, name: str) -> int:
        """Bytes of one stored tensor, from the header alone."""
        self._require(name)
        dtype, shape = self._meta[name]
        return _DTYPE_BYTES.get(dtype, 1) * math.prod(shape)

    def dtype(self, name: str) -> str:
        """The safetensors dtype name of ``name`` (``"I8"``, ``"BF16"``, ...), from its header."""
        self._require(name)
        return self._meta[name][0]

    def where(self, prefix: str) -> str:
        """The file holding the tensors ``prefix.*`` (the directory when they are spread over several), for messages."""
        files = {file for name, file in self.file_of.items() if name.startswith(f"{prefix}.")}
        return str(files.pop()) if len(files) == 1 else str(self.path)

    def _require(self, name: str) -> None:
        if name not in self.file_of:
            stored = ", ".join(f.name for f in self.files[:3]) + (f" or {len(self.files) - 3} more" if len(self.files) > 3 else "")
            raise CheckpointError(f"{self.path}: tensor {name!r} is missing (not in {stored})")

    def get(self, name: str, dtypes: Iterable[torch.dtype] | None = None, shape: tuple | None = None) -> Tensor:
        """Load one tensor, checking its dtype (one of ``dtypes``) and ``shape`` (``None`` entries match anything)."""
        from safetensors import safe_open

        self._require(name)
        file = self.file_of[name]
        try:
            with safe_open(file, framework="pt") as f:
                t = f.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types for corrupt data
            raise CheckpointError(f"{file}: cannot read tensor {name!r} ({e})") from None
        dtypes = tuple(dtypes) if dtypes is not None else None
        if dtypes is not None and t.dtype not in dtypes:
            want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise CheckpointError(f"{file}: tensor {name!r} has dtype {str(t.dtype).removeprefix('torch.')}, expected {want}")
        if shape is not None and (t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape))):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise CheckpointError(f"{file}: tensor {name!r} has shape {list(t.shape)}, expected {want}")
        return t


def parse_size(size: int | str) -> int:
    """``"5GB"`` / ``"500MB"`` / an int of bytes -> bytes (a ValueError unless positive)."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    try:
        if isinstance(size, int):
            n = size
        else:
            s = size.strip().upper()
            unit = next((u for u in sorted(units, key=len, reverse=True) if s.endswith(u)), None)
            n = int(float(s[: -len(unit)]) * units[unit]) if unit else int(s)
    except (AttributeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"max_shard_size must be a positive size such as '5GB', '500MB' or a number of bytes, got {size!r}")
    return n


_SHARD_NAME = re.compile(r"model-\d+-of-\d+\.safetensors")


def _remove_old_checkpoint(path: Path) -> None:
    """Delete the model checkpoint files ``path`` already holds (``model.safetensors``, shards named
    ``model-NNNNN-of-NNNNN.safetensors`` or listed in its index, the index): a reader would mix
    an older checkpoint's shards with the new ones. Other safetensors files (an adapter, the user's
    own) are kept, with a warning: vLLM loads every safetensors file of a directory without an index."""
    old = {path / INDEX_NAME, path / SINGLE_NAME}
    index = path / INDEX_NAME
    if index.is_file():
        try:
            listed = read_json(index).get("weight_map", {})
        except CheckpointError:
            listed = {}  # an unreadable index: the files named like shards go below
        if isinstance(listed, dict):
            old |= {path / f for f in listed.values() if isinstance(f, str) and "/" not in f}
    old |= {p for p in path.glob("*.safetensors") if _SHARD_NAME.fullmatch(p.name)}
    for f in old:
        f.unlink(missing_ok=True)
    others = sorted(p.name for p in path.glob("*.safetensors") if p not in old)
    if others:
        warnings.warn(
            f"save_quantized: {path} also holds {', '.join(others)}, kept; engines that read every safetensors "
            "file of a directory (vLLM when a checkpoint has no index) would load them with the model",
            UserWarning,
            stacklevel=4,
        )


def write_safetensors(tensors: dict[str, Tensor], path: Path, max_shard_size: int | str = "5GB") -> list[Path]:
    """Write ``tensors`` (in order) into ``path`` as one file or as shards plus an index."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = t.detach().to("cpu").contiguous()
        size += nbytes
    path.mkdir(parents=True, exist_ok=True)
    _remove_old_checkpoint(path)
    if len(shards) == 1:
        files = [path / SINGLE_NAME]
        save_file(shards[0], files[0], metadata={"format": "pt"})
        return files
    files = [path / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for shard, file in zip(shards, files):
        save_file(shard, file, metadata={"format": "pt"})
        weight_map.update({name: file.name for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(path / INDEX_NAME, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return files
