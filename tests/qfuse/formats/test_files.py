"""qfuse.formats.files: safetensors checkpoint directories read one tensor at a time, and
every problem a CheckpointError that names the file (and the tensor, where there is one)."""

import json
import re
import struct

import pytest
import torch
from safetensors.torch import save_file

from qfuse.formats.files import INDEX_NAME, SINGLE_NAME, CheckpointError, CheckpointFiles, parse_size, read_json, write_safetensors


def names(*parts) -> str:
    """A ``match=`` regex: every part, literally, in this order."""
    return ".*".join(re.escape(str(p)) for p in parts)


def raw_safetensors(path, header, data: bytes = b"") -> None:
    """A safetensors file from a header (dict, or raw bytes) and data bytes, however wrong."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


@pytest.fixture
def tensors():
    return {
        "a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "a.codes": torch.arange(-4, 4, dtype=torch.int8),
        "b.scale": torch.tensor([0.5, 2.0], dtype=torch.bfloat16),
        "b.words": torch.tensor([[1, -2], [3, 2**31 - 1]], dtype=torch.int32),
    }


@pytest.fixture
def single(tmp_path, tensors):
    write_safetensors(tensors, tmp_path)
    return tmp_path


# ----------------------------------------------------------------------------- writing and reading back


def test_write_one_file_and_read_every_tensor_back(single, tensors):
    assert sorted(p.name for p in single.iterdir()) == [SINGLE_NAME]
    files = CheckpointFiles(single)
    assert sorted(files.names()) == sorted(tensors)  # safetensors orders a file's tensors itself
    for name, t in tensors.items():
        assert name in files
        assert files.shape(name) == tuple(t.shape)
        got = files.get(name, (t.dtype,), tuple(t.shape))
        assert got.dtype == t.dtype and torch.equal(got, t)
        assert files.nbytes(name) == t.numel() * t.element_size()
    assert files.dtype("a.codes") == "I8" and files.dtype("b.scale") == "BF16"
    assert "nothing" not in files


def test_write_shards_past_max_shard_size_with_an_index(tmp_path):
    tensors = {f"t{i}": torch.full((64,), float(i)) for i in range(5)}  # 256 bytes each
    written = write_safetensors(tensors, tmp_path, max_shard_size=600)
    assert [p.name for p in written] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == 5 * 256
    assert index["weight_map"] == {"t0": written[0].name, "t1": written[0].name, "t2": written[1].name, "t3": written[1].name, "t4": written[2].name}
    files = CheckpointFiles(tmp_path)
    assert {n: p.name for n, p in files.file_of.items()} == index["weight_map"]
    assert all(torch.equal(files.get(n), t) for n, t in tensors.items())


def test_where_names_the_file_of_a_layers_tensors(tmp_path):
    tensors = {"a.x": torch.zeros(64), "a.y": torch.zeros(64), "b.x": torch.zeros(64), "b.y": torch.zeros(64)}
    written = write_safetensors(tensors, tmp_path, max_shard_size=3 * 256)  # a.x, a.y, b.x | b.y
    files = CheckpointFiles(tmp_path)
    assert files.where("a") == str(written[0])
    assert files.where("b") == str(tmp_path)  # spread over two shards: the directory
    assert files.where("c") == str(tmp_path)


def test_a_tensor_larger_than_the_limit_gets_a_shard_of_its_own(tmp_path):
    written = write_safetensors({"big": torch.zeros(100), "small": torch.zeros(1)}, tmp_path, max_shard_size=16)
    assert len(written) == 2
    assert CheckpointFiles(tmp_path).file_of["big"] == written[0]


def test_rewriting_removes_the_old_shards_and_index(tmp_path):
    write_safetensors({f"t{i}": torch.zeros(64) for i in range(3)}, tmp_path, max_shard_size=256)
    assert (tmp_path / INDEX_NAME).is_file()
    write_safetensors({"only": torch.ones(2)}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [SINGLE_NAME]
    assert CheckpointFiles(tmp_path).names() == ["only"]


def test_without_index_or_model_safetensors_every_safetensors_file_is_read(tmp_path):
    save_file({"x": torch.zeros(2)}, tmp_path / "part-a.safetensors")
    save_file({"y": torch.ones(3)}, tmp_path / "part-b.safetensors")
    files = CheckpointFiles(tmp_path)
    assert sorted(files.names()) == ["x", "y"]
    assert files.file_of["y"].name == "part-b.safetensors"


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1234, 1234),
        ("1234", 1234),
        ("5GB", 5 * 10**9),
        ("500MB", 500 * 10**6),
        ("2KB", 2000),
        ("1KiB", 1024),
        (" 1.5 mib ", 3 * 2**19),
        ("2GiB", 2 * 2**30),
    ],
)
def test_parse_size(size, expected):
    assert parse_size(size) == expected


# ----------------------------------------------------------------------------- get(): dtype and shape checks


def test_get_checks_dtype_and_names_tensor_and_file(single):
    files = CheckpointFiles(single)
    with pytest.raises(CheckpointError, match=names(single / SINGLE_NAME, "'b.words'", "dtype int32", "expected int8 or int64")):
        files.get("b.words", (torch.int8, torch.int64))


def test_get_checks_shape_with_wildcards(single):
    files = CheckpointFiles(single)
    assert files.get("a.weight", shape=(3, None)).shape == (3, 4)
    with pytest.raises(CheckpointError, match=names(single / SINGLE_NAME, "'a.weight'", "shape [3, 4]", "expected [3, 5]")):
        files.get("a.weight", shape=(3, 5))
    with pytest.raises(CheckpointError, match=names(single / SINGLE_NAME, "'a.weight'", "expected [*]")):
        files.get("a.weight", shape=(None,))  # wrong number of dimensions


def test_missing_tensor_names_it_and_the_files_looked_in(single):
    files = CheckpointFiles(single)
    for ask in (files.get, files.shape, files.dtype, files.nbytes):
        with pytest.raises(CheckpointError, match=names(single, "'a.bias'", "is missing", SINGLE_NAME)):
            ask("a.bias")


def test_header_that_disagrees_with_its_data_fails_on_get_naming_the_tensor(tmp_path):
    # 4 float32 values need 16 bytes; the offsets give 8 (safetensors itself rejects this on open)
    raw_safetensors(tmp_path / SINGLE_NAME, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, bytes(8))
    files = CheckpointFiles(tmp_path)
    with pytest.raises(CheckpointError, match=names(tmp_path / SINGLE_NAME, "cannot read tensor 'w'")):
        files.get("w")


# ----------------------------------------------------------------------------- corrupt files


def test_not_a_directory(tmp_path):
    with pytest.raises(CheckpointError, match=names(tmp_path / "nope", "not a directory")):
        CheckpointFiles(tmp_path / "nope")


def test_directory_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=names(tmp_path, "no safetensors files")):
        CheckpointFiles(tmp_path)


def cut(path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def header_len(path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


@pytest.mark.parametrize("how", ["half", "last bytes", "one byte", "inside header", "inside length"])
def test_truncated_file(single, how):
    file = single / SINGLE_NAME
    size, n = file.stat().st_size, header_len(file)
    keep = {"half": size // 2, "last bytes": size - 3, "one byte": size - 1, "inside header": 8 + n // 2, "inside length": 5}[how]
    cut(file, keep)
    what = "truncated" if keep >= 8 + n else "not a readable safetensors file"
    with pytest.raises(CheckpointError, match=names(file, what)):
        CheckpointFiles(single)


def test_truncated_file_names_the_tensor_cut_off(single):
    file = single / SINGLE_NAME
    header = json.loads(file.read_bytes()[8 : 8 + header_len(file)])
    last = max((t for t in header if t != "__metadata__"), key=lambda t: header[t]["data_offsets"][1])
    cut(file, file.stat().st_size - 1)
    with pytest.raises(CheckpointError, match=names(file, "truncated", f"'{last}'")):
        CheckpointFiles(single)


def test_empty_file(single):
    (single / SINGLE_NAME).write_bytes(b"")
    with pytest.raises(CheckpointError, match=names(single / SINGLE_NAME, "not a readable safetensors file", "0 bytes")):
        CheckpointFiles(single)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_garbage_bytes(single, seed):
    file = single / SINGLE_NAME
    g = torch.Generator().manual_seed(seed)
    file.write_bytes(bytes(torch.randint(0, 256, (file.stat().st_size,), generator=g, dtype=torch.uint8).tolist()))
    with pytest.raises(CheckpointError, match=names(file, "not a readable safetensors file")):
        CheckpointFiles(single)


@pytest.mark.parametrize(
    "header",
    [
        b"[1, 2, 3]",  # JSON, not an object
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]',  # cut JSON
        b"\xff\xfe{}",  # not UTF-8
        b"",  # zero-length header
    ],
)
def test_unreadable_header(tmp_path, header):
    raw_safetensors(tmp_path / SINGLE_NAME, header, bytes(4))
    with pytest.raises(CheckpointError, match=names(tmp_path / SINGLE_NAME, "not a readable safetensors file")):
        CheckpointFiles(tmp_path)


@pytest.mark.parametrize(
    "entry",
    [
        {"shape": [1], "data_offsets": [0, 4]},  # no dtype
        {"dtype": "F32", "data_offsets": [0, 4]},  # no shape
        {"dtype": "F32", "shape": [1]},  # no offsets
        {"dtype": "F32", "shape": [1], "data_offsets": [0]},
        {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]},
        {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]},
        {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
        {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]},
        {"dtype": 7, "shape": [1], "data_offsets": [0, 4]},
        "F32",
    ],
)
def test_malformed_header_entry_names_the_tensor(tmp_path, entry):
    raw_safetensors(
        tmp_path / SINGLE_NAME,
        {"__metadata__": {"format": "pt"}, "good": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "bad": entry},
        bytes(8),
    )
    with pytest.raises(CheckpointError, match=names(tmp_path / SINGLE_NAME, "not a readable safetensors file", "'bad'")):
        CheckpointFiles(tmp_path)


def test_unreadable_file_is_a_checkpoint_error(tmp_path, monkeypatch):
    write_safetensors({"x": torch.zeros(1)}, tmp_path)
    real_open = open

    def failing_open(file, *args, **kwargs):
        if str(file).endswith(".safetensors"):
            raise PermissionError(13, "Permission denied")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(CheckpointError, match=names(tmp_path / SINGLE_NAME, "cannot read it", "Permission denied")):
        CheckpointFiles(tmp_path)


# ----------------------------------------------------------------------------- sharded checkpoints


@pytest.fixture
def sharded(tmp_path):
    write_safetensors({f"t{i}": torch.full((64,), float(i)) for i in range(4)}, tmp_path, max_shard_size=512)
    return tmp_path  # t0, t1 in shard 1; t2, t3 in shard 2


def edit_index(path, fn) -> None:
    index = json.loads((path / INDEX_NAME).read_text())
    fn(index)
    (path / INDEX_NAME).write_text(json.dumps(index))


def test_missing_shard(sharded):
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=names(sharded / "model-00002-of-00002.safetensors", "listed in the index but missing")):
        CheckpointFiles(sharded)


def test_truncated_shard(sharded):
    shard = sharded / "model-00001-of-00002.safetensors"
    cut(shard, shard.stat().st_size - 8)
    with pytest.raises(CheckpointError, match=names(shard, "truncated", "'t1'")):
        CheckpointFiles(sharded)


def test_index_lists_a_tensor_its_shard_does_not_hold(sharded):
    edit_index(sharded, lambda i: i["weight_map"].update({"t9": "model-00001-of-00002.safetensors"}))
    with pytest.raises(CheckpointError, match=names(sharded / INDEX_NAME, "'t9'", "model-00001-of-00002.safetensors", "not stored there")):
        CheckpointFiles(sharded)


def test_index_lists_a_tensor_in_the_wrong_shard(sharded):
    edit_index(sharded, lambda i: i["weight_map"].update({"t0": "model-00002-of-00002.safetensors"}))
    with pytest.raises(CheckpointError, match=names(sharded / INDEX_NAME, "'t0'", "listed in model-00002", "stored in model-00001")):
        CheckpointFiles(sharded)


def test_a_tensor_stored_in_two_shards(sharded):
    save_file({"t0": torch.zeros(64), "t2": torch.zeros(64)}, sharded / "model-00002-of-00002.safetensors")
    edit_index(sharded, lambda i: i["weight_map"].update({"t2": "model-00002-of-00002.safetensors"}))
    with pytest.raises(CheckpointError, match=names("model-00002-of-00002.safetensors", "'t0'", "also stored in model-00001")):
        CheckpointFiles(sharded)


@pytest.mark.parametrize(
    "weight_map", [None, {}, [["t0", "a.safetensors"]], {"t0": 3}, {"t0": ""}, {"t0": "../model-00001-of-00002.safetensors"}, {"t0": "/etc/passwd"}]
)
def test_malformed_index(sharded, weight_map):
    edit_index(sharded, lambda i: i.update(weight_map=weight_map) if weight_map is not None else i.pop("weight_map"))
    with pytest.raises(CheckpointError, match=re.escape(str(sharded / INDEX_NAME))):
        CheckpointFiles(sharded)


def test_index_that_is_not_json(sharded):
    (sharded / INDEX_NAME).write_text('{"weight_map": {')
    with pytest.raises(CheckpointError, match=names(sharded / INDEX_NAME, "not valid JSON")):
        CheckpointFiles(sharded)


# ----------------------------------------------------------------------------- read_json


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b'{"a": 1,', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\x80\x81\x82", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'"text"', "expected a JSON object"),
    ],
)
def test_read_json_errors_name_the_file(tmp_path, content, what):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=names(path, what)):
        read_json(path)


def test_read_json_of_a_directory_or_missing_file(tmp_path):
    (tmp_path / "config.json").mkdir()
    for path in (tmp_path / "config.json", tmp_path / "missing.json"):
        with pytest.raises(CheckpointError, match=names(path, "cannot read it")):
            read_json(path)


def test_read_json(tmp_path):
    (tmp_path / "c.json").write_text('{"a": [1, 2], "b": "\u00e9"}', encoding="utf-8")
    assert read_json(tmp_path / "c.json") == {"a": [1, 2], "b": "\u00e9"}


@pytest.mark.parametrize("size", ["garbage", "0", 0, -5, "-1MB", "0.0001KB", None])
def test_parse_size_refuses_what_is_not_a_positive_size(size):
    """0 and -1 wrote one shard per tensor; 'garbage' failed in int() after the work."""
    with pytest.raises(ValueError, match="max_shard_size must be a positive size"):
        parse_size(size)
