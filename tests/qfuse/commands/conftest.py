import pytest
import torch

from tests.hf_models import tiny_hf_model

VOCAB = 320


def tiny_tokenizer(text: str):
    """A byte-level BPE tokenizer trained here on ``text`` (nothing is downloaded)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"])
    tok.train_from_iterator([text], trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="session")
def sample_text(tmp_path_factory):
    from qfuse.eval.perplexity import default_text

    path = tmp_path_factory.mktemp("text") / "sample.txt"
    path.write_text(default_text()[:20_000], encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def float_model_dir(tmp_path_factory, sample_text):
    """A tiny random bf16 Llama saved as a Hugging Face model directory, with a tokenizer."""
    path = tmp_path_factory.mktemp("float_llama")
    model = tiny_hf_model("llama", layers=2, vocab=VOCAB)
    model.save_pretrained(path)
    tiny_tokenizer(sample_text.read_text()).save_pretrained(path)
    assert torch.load  # keep torch imported for the fixture's users
    return path
