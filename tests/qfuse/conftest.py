import contextlib
import functools

import pytest


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers' GGUF loader opens the file three times (tokenizer, config, weights), and each
    ``gguf.GGUFReader`` parses every metadata field again (the 49,152-token vocabulary); it also
    rebuilds gguf's tensor-name map for each of the ~400 tensors. Within this block each is built
    once per argument (they depend on the file / the architecture only: the loaded model and
    tokenizer are the same, bit for bit), which halves the load (measured 32 s -> 15 s)."""
    try:
        import gguf
    except ImportError:  # load_smollm2 itself says what is missing
        yield
        return
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers = {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = reader_cls(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


@pytest.fixture(scope="session")
def smollm2():
    """``(model, tokenizer)``: the real SmolLM2-135M-Instruct in float32 (``qfuse.models.load_smollm2``),
    loaded once per session (the GGUF load: ~15 s, see _gguf_parsed_once). Shared: do not modify it, deep-copy it first."""
    from qfuse.models import load_smollm2

    with _gguf_parsed_once():
        return load_smollm2()
