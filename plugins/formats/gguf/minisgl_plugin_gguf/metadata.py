"""GGUF metadata → a Hugging Face ``config.json`` dict and ``generation_config.json`` defaults."""

from __future__ import annotations

from typing import Any

#: GGUF ``general.architecture`` → the Hugging Face architecture our model plugins register
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}

#: ``{arch}.<key>`` → config.json key
_ARCH_KEYS = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "rope.freq_base": "rope_theta",
}

#: ``general.sampling.*`` (written by recent llama.cpp converters) → generation_config.json key
_SAMPLING_KEYS = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p"}


class UnsupportedGGUF(ValueError):
    """The file is a valid GGUF that this plugin cannot serve (architecture, tensor type)."""


def hf_config_from_metadata(fields: dict[str, Any], tied: bool, path: str) -> dict[str, Any]:
    """The config.json our model plugins read, from the file's ``fields`` (key → value)."""
    arch = fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        supported = ", ".join(f"{k} ({v})" for k, v in ARCHITECTURES.items())
        raise UnsupportedGGUF(f"{path}: GGUF architecture {arch!r} is not supported; supported: {supported}")
    config: dict[str, Any] = {"architectures": [ARCHITECTURES[arch]], "model_type": arch}
    for key, hf_key in _ARCH_KEYS.items():
        value = fields.get(f"{arch}.{key}")
        if value is not None:
            config[hf_key] = value
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads") if k not in config]
    if missing:
        raise UnsupportedGGUF(f"{path}: GGUF metadata lacks {arch}.* keys for {', '.join(missing)}")
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    config.setdefault("rms_norm_eps", 1e-6)
    tokens = fields.get("tokenizer.ggml.tokens")
    vocab_size = fields.get(f"{arch}.vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab_size is None:
        raise UnsupportedGGUF(f"{path}: GGUF metadata has neither {arch}.vocab_size nor a token list")
    config["vocab_size"] = int(vocab_size)
    config["tie_word_embeddings"] = tied
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = fields.get(f"tokenizer.ggml.{key}")
        if value is not None:
            config[key] = int(value)
    config["torch_dtype"] = "float32"
    return config


def generation_config_from_metadata(fields: dict[str, Any]) -> dict[str, Any]:
    """Sampling defaults the file declares, plus its eos token (so stop checks agree with HF)."""
    out: dict[str, Any] = {}
    for key, hf_key in _SAMPLING_KEYS.items():
        value = fields.get(f"general.sampling.{key}")
        if value is not None:
            out[hf_key] = value
    for key in ("bos_token_id", "eos_token_id"):
        value = fields.get(f"tokenizer.ggml.{key}")
        if value is not None:
            out[key] = int(value)
    return out
