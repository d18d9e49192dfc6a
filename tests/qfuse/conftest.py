import pytest


@pytest.fixture(scope="session")
def smollm2():
    """``(model, tokenizer)``: the real SmolLM2-135M-Instruct in float32 (``qfuse.models.load_smollm2``),
    loaded once per session: the GGUF load takes ~20 s. Shared: do not modify it, deep-copy it first."""
    from qfuse.models import load_smollm2

    return load_smollm2()
