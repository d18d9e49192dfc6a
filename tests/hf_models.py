"""Tiny random-weight Hugging Face decoders built from configs (no download)."""

import torch

ARCHS = ("llama", "qwen2", "mistral")


def tiny_hf_model(arch: str, dtype=torch.bfloat16, layers: int = 2, hidden: int = 256, intermediate: int = 512, vocab: int = 256):
    """A ``<Arch>ForCausalLM`` with 4 attention heads / 2 KV heads and random weights
    (norm weights perturbed away from 1, so a dropped norm weight would show), in ``dtype`` as
    ``from_pretrained(dtype=...)`` builds it."""
    import transformers as tf

    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    cfg, cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
    }[arch]
    torch.manual_seed(0)
    model = cls(cfg(**common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.mul_(1 + 0.1 * torch.randn_like(p))
    from qfuse.models.cast import cast_float_model

    return cast_float_model(model, dtype).eval()  # rotary inv_freq float32, as from_pretrained(dtype=...) builds it
