"""Tiny random-weight Hugging Face decoders built from configs (no download)."""

import torch

ARCHS = ("llama", "qwen2", "mistral")


def tiny_hf_model(arch: str, dtype=torch.bfloat16, layers: int = 2):
    import transformers as tf

    common = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cfg, cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
    }[arch]
    torch.manual_seed(0)
    model = cls(cfg(**common))
    with torch.no_grad():  # norm weights away from exactly 1 so a dropped weight would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.mul_(1 + 0.1 * torch.randn_like(p))
    return model.to(dtype).eval()
