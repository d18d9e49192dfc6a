import math

import pytest
import torch
from torch import nn

from qfuse.eval.perplexity import default_text, perplexity, windows_of


class UniformLM(nn.Module):
    """Equal logits for every token: perplexity is exactly the vocabulary size."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        return torch.zeros(*input_ids.shape, self.vocab)


class PeakedLM(nn.Module):
    """Puts probability p on the true next token (it peeks), the rest spread evenly."""

    def __init__(self, vocab: int, p: float):
        super().__init__()
        self.vocab, self.p = vocab, p
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        b, t = input_ids.shape
        probs = torch.full((b, t, self.vocab), (1 - self.p) / (self.vocab - 1))
        nxt = torch.cat([input_ids[:, 1:], input_ids[:, :1]], dim=1)
        probs.scatter_(2, nxt.unsqueeze(-1), self.p)
        return probs.log()


def test_windows_drop_the_tail_and_cap():
    ids = torch.arange(1000)
    w = windows_of(ids, 128)
    assert w.shape == (7, 128) and torch.equal(w[1], torch.arange(128, 256))
    assert windows_of(ids, 128, max_windows=3).shape == (3, 128)
    with pytest.raises(ValueError, match="fewer than one window"):
        windows_of(ids[:50], 128)
    with pytest.raises(ValueError, match=">= 2"):
        windows_of(ids, 1)
    for bad in (0, -1):  # 0 claimed the text was too short, -1 failed in reshape
        with pytest.raises(ValueError, match=f"max_windows must be >= 1, got {bad}"):
            windows_of(ids, 128, max_windows=bad)


@pytest.mark.parametrize("batch", [0, -1])
def test_batch_below_one_is_refused(batch):
    """range(0, W, -1) scored nothing and returned a perplexity of 1."""
    with pytest.raises(ValueError, match=f"batch must be >= 1, got {batch}"):
        perplexity(UniformLM(37), windows_of(torch.randint(0, 37, (700,)), 64), batch=batch, progress=False)


@pytest.mark.parametrize("batch", [1, 3])
def test_uniform_model_has_vocab_perplexity(batch):
    windows = windows_of(torch.randint(0, 37, (700,)), 64)
    r = perplexity(UniformLM(37), windows, batch=batch, progress=False)
    assert r.windows == 10 and r.tokens == 10 * 63
    assert r.ppl == pytest.approx(37, rel=1e-5)


def test_first_token_of_each_window_is_not_scored():
    p = 0.25
    windows = windows_of(torch.randint(0, 50, (640,)), 32)
    r = perplexity(PeakedLM(50, p), windows, progress=False)
    assert r.nll == pytest.approx(-math.log(p), rel=1e-5)


def test_default_text_is_pydoc_topics():
    text = default_text()
    assert len(text) > 300_000 and "the Python" in text
