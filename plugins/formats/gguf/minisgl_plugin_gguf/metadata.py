"""GGUF metadata → a Hugging Face ``config.json`` dict and ``generation_config.json`` defaults."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

#: GGUF ``general.architecture`` → the Hugging Face architecture our model plugins register
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}

#: the architectures whose files hold a mixture of experts (``{arch}.expert_count``)
MOE_ARCHITECTURES = frozenset({"qwen3moe"})
#: architectures llama.cpp writes with experts under another's name: Mixtral is ``llama`` with
#: ``llama.expert_count`` (its experts sized by ``feed_forward_length``)
EXPERTS_OF = {"llama": "MixtralForCausalLM"}

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
    # Phi-3's window, which its model applies whenever set (refused when shorter than the context)
    "attention.sliding_window": "sliding_window",
    # a mixture of experts (qwen3moe)
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
}

#: the ``{arch}.*`` keys read as counts and sizes (llama.cpp's uint32s): each a positive integer
_WHOLE_KEYS = (
    "context_length", "embedding_length", "feed_forward_length", "block_count", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "rope.dimension_count", "expert_feed_forward_length",
    "vocab_size", "rope.scaling.original_context_length",
)  # fmt: skip
#: counts where 0 is none (a dense model's ``expert_count``; Gemma 3's window): whole numbers from 0
_WHOLE_OR_NONE_KEYS = ("expert_count", "expert_used_count", "attention.sliding_window")
#: the ``{arch}.*`` keys read as numbers (llama.cpp's float32s), each as (test of a finite
#: number, what the error says): the bounds the core checks config.json's rope_theta, rms_norm_eps
#: and rope scaling factor against (checkpoint/integrity.py's CONSTANT_RULES), named in the file's
#: keys (1e-320 or 0.5 as the rotary base, 1e308 as the epsilon loaded a model that answered
#: nonsense; a string was a TypeError traceback)
_NUMBER_KEYS: dict[str, tuple[Callable[[float], bool], str]] = {
    "rope.freq_base": (lambda v: v > 1, "a number above 1 (the rotary base; models use 10000 to 1e9)"),
    "rope.freq_base_swa": (lambda v: v > 1, "a number above 1 (the rotary base; models use 10000 to 1e9)"),
    "attention.layer_norm_rms_epsilon": (
        lambda v: 0 < v < 1,
        "a number between 0 and 1 (the norm's epsilon; models use 1e-5 or 1e-6)",
    ),
    "rope.scaling.factor": (lambda v: v >= 1, "a number of at least 1 (the positions are divided by it)"),
}
#: float32's largest number (llama.cpp holds these in float32, as the core computes with them)
_FLOAT32_MAX = 3.4028234663852886e38

#: ``general.sampling.*`` (written by recent llama.cpp converters) → generation_config.json key
_SAMPLING_KEYS = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p"}


class UnsupportedGGUF(ValueError):
    """The file is a valid GGUF that this plugin cannot serve (architecture, tensor type)."""


def hf_config_from_metadata(fields: dict[str, Any], tied: bool, path: str) -> dict[str, Any]:
    """The config.json our model plugins read, from the file's ``fields`` (key → value).

    Settings the file declares that our models do not implement (a rope scaling type, a partial
    rotary dimension) are passed on as config.json would state them, so the core refuses them as
    it refuses them in a directory, rather than left out (a model computing other numbers)."""
    arch = fields.get("general.architecture")
    if arch not in ARCHITECTURES:
        supported = ", ".join(f"{k} ({v})" for k, v in ARCHITECTURES.items())
        raise UnsupportedGGUF(f"{path}: GGUF architecture {arch!r} is not supported; supported: {supported}")
    _check_numbers(fields, arch, path)
    _refuse_unsupported_layouts(fields, arch, path)
    config: dict[str, Any] = {"architectures": [ARCHITECTURES[arch]], "model_type": arch}
    # (no experts, expert_count 0: a dense model, as llama.cpp reads it, its expert keys left out;
    # beside experts, an expert_used_count of 0 is passed on for the core to refuse: left out, the
    # model's default of 8 would have run silently)
    dense = not fields.get(f"{arch}.expert_count")
    for key, hf_key in _ARCH_KEYS.items():
        value = fields.get(f"{arch}.{key}")
        if value is not None and not (dense and key in ("expert_count", "expert_used_count") and value == 0):
            config[hf_key] = value
    if arch in EXPERTS_OF and config.get("num_experts", 0) > 0:
        config["architectures"] = [EXPERTS_OF[arch]]
        config["num_local_experts"] = config.pop("num_experts")
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
    for key, gguf_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        value = fields.get(f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            config[key] = int(value)
    scaling = rope_scaling_from_metadata(fields, arch)
    if scaling is not None:
        config["rope_scaling"] = scaling
    rotary_dims = fields.get(f"{arch}.rope.dimension_count")
    # (without attention.key_length, as llama.cpp writes Llama files, the head size is the
    # embedding's share of a head: a rotary part of it was ignored, all of each head rotated)
    head_dim = config.get("head_dim") or _even_share(config["hidden_size"], config["num_attention_heads"])
    if (
        isinstance(head_dim, int)
        and head_dim > 0
        and isinstance(rotary_dims, int)
        and 0 < rotary_dims != head_dim
    ):
        config["partial_rotary_factor"] = rotary_dims / head_dim
    if arch in MOE_ARCHITECTURES:
        # llama.cpp's qwen3moe graph always renormalises the chosen experts' weights (the
        # released Qwen3-MoE configs' norm_topk_prob); the file has no key for it
        config["norm_topk_prob"] = True
    if arch in GEMMA_ARCHITECTURES:
        config.update(gemma_settings(fields, arch, config, path))
    config["torch_dtype"] = "float32"
    return config


#: the Gemma architectures, whose norm weights llama.cpp's converter stores plus one
#: (:data:`minisgl_plugin_gguf.names.GEMMA_NORM_SHIFT`)
GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})
#: ``{arch}.block_count`` of the 27B models, whose attention scale is ``(hidden / heads) ** -0.5``,
#: not ``head_dim ** -0.5``: llama.cpp decides the scale by the layer count alone (its
#: llama-model.cpp, ``LLM_TYPE_27B``; query_pre_attn_scalar is not in the file)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
#: the sliding-window period llama.cpp gives each architecture (llama-model.cpp's
#: ``set_swa_pattern``): layer ``i`` slides where ``i % period < period - 1``
_GEMMA_WINDOW_PERIOD = {"gemma2": 2, "gemma3": 6}


def gemma_settings(fields: dict[str, Any], arch: str, config: dict[str, Any], path: str) -> dict[str, Any]:
    """The config.json keys of a Gemma file that llama.cpp states by convention rather than in
    metadata (its llama-model.cpp's hparams for GEMMA, GEMMA2 and GEMMA3; convert_hf_to_gguf.py's
    GemmaModel, Gemma2Model and Gemma3Model for what the file holds)."""
    # the converter writes no rope.freq_base for Gemma and Gemma 2: llama.cpp's default 10000
    out: dict[str, Any] = {"rope_theta": config.get("rope_theta", 10000.0)}
    if arch == "gemma":
        return out
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or _even_share(hidden, heads)
    share = _even_share(hidden, heads)
    is_27b = config["num_hidden_layers"] == _GEMMA_27B_LAYERS[arch]
    out["query_pre_attn_scalar"] = share if is_27b and share is not None else head_dim
    window = fields.get(f"{arch}.attention.sliding_window")
    if arch == "gemma2":
        # llama.cpp's defaults where the file has no key (Gemma2Config's too): 50, 30 and 4096
        out["attn_logit_softcapping"] = fields.get(f"{arch}.attn_logit_softcapping", 50.0)
        out["final_logit_softcapping"] = fields.get(f"{arch}.final_logit_softcapping", 30.0)
        window = 4096 if window is None else window
    else:
        # no attention soft-cap in Gemma 3; a final one only where the file states it
        out["attn_logit_softcapping"] = None
        out["final_logit_softcapping"] = fields.get(f"{arch}.final_logit_softcapping") or None
        # sliding layers rotate with their own base: llama.cpp's 10000 unless the file says
        out["rope_local_base_freq"] = fields.get(f"{arch}.rope.freq_base_swa", 10000.0)
    layers = config["num_hidden_layers"]
    if not isinstance(layers, int) or isinstance(layers, bool):
        return out  # the core's check of the config's values names the bad one
    if not window:  # (Gemma 3 without the key: every layer attends fully)
        out["layer_types"] = ["full_attention"] * layers
        return out
    out["sliding_window"] = window
    # newer llama.cpp reads a period or a flag a layer (true: it slides) from the file where given
    pattern = fields.get(f"{arch}.attention.sliding_window_pattern", _GEMMA_WINDOW_PERIOD[arch])
    if isinstance(pattern, list):
        slides = [bool(flag) for flag in pattern]
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        slides = [i % pattern < pattern - 1 for i in range(layers)]
    else:
        raise UnsupportedGGUF(
            f"{path}: {arch}.attention.sliding_window_pattern {pattern!r} is not supported "
            "(a positive period or a flag a block is)"
        )
    if len(slides) != layers:
        raise UnsupportedGGUF(
            f"{path}: {arch}.attention.sliding_window_pattern has {len(slides)} flags for {layers} blocks"
        )
    out["layer_types"] = ["sliding_attention" if slide else "full_attention" for slide in slides]
    return out


def _even_share(total: Any, parts: Any) -> int | None:
    """``total // parts`` where both are positive ints and it divides evenly, else None."""
    if isinstance(total, int) and isinstance(parts, int) and parts > 0 and total % parts == 0:
        return total // parts
    return None


def _check_numbers(fields: dict[str, Any], arch: str, path: str) -> None:
    """An UnsupportedGGUF naming the first ``{arch}.*`` number the model cannot be built from: a
    count that is not a whole number (a string, a float, a list) or below 1, a rotary base,
    norm epsilon or scaling factor outside its bounds (:data:`_NUMBER_KEYS`)."""
    for key in (*_WHOLE_KEYS, *_WHOLE_OR_NONE_KEYS):
        value, least = fields.get(f"{arch}.{key}"), 0 if key in _WHOLE_OR_NONE_KEYS else 1
        if value is not None and not (
            isinstance(value, int) and not isinstance(value, bool) and value >= least
        ):
            words = "a whole number (0: none)" if least == 0 else "a positive integer"
            raise UnsupportedGGUF(f"{path}: {arch}.{key} must be {words}, got {_shown(value)}")
    for key, (test, words) in _NUMBER_KEYS.items():
        value = fields.get(f"{arch}.{key}")
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and abs(value) <= _FLOAT32_MAX and test(value)):
            raise UnsupportedGGUF(f"{path}: {arch}.{key} must be {words}, got {_shown(value)}")


def _shown(value: Any) -> str:
    """``value`` as JSON writes it (a string quoted, NaN as NaN), cut to 80 characters."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse_unsupported_layouts(fields: dict[str, Any], arch: str, path: str) -> None:
    """Files of a supported architecture that hold what our models cannot: one part of a split
    GGUF (the rest of the tensors are in other files), a mixture of experts in an architecture
    whose model has none (``llama`` files with experts are Mixtral, :data:`EXPERTS_OF`)."""
    parts = fields.get("split.count")
    if isinstance(parts, int) and parts > 1:
        number = fields.get("split.no", 0)
        raise UnsupportedGGUF(
            f"{path} is part {number + 1 if isinstance(number, int) else '?'} of a GGUF split into {parts} "
            "files, which is not supported; merge the parts into one file first "
            "(llama.cpp's `llama-gguf-split --merge FIRST_PART OUT.gguf`)"
        )
    experts = fields.get(f"{arch}.expert_count")
    if isinstance(experts, int) and experts > 0 and arch not in MOE_ARCHITECTURES | EXPERTS_OF.keys():
        raise UnsupportedGGUF(
            f"{path}: a mixture-of-experts model ({arch}.expert_count = {experts}), which is not supported"
        )


def rope_scaling_from_metadata(fields: dict[str, Any], arch: str) -> dict[str, Any] | None:
    """config.json's ``rope_scaling`` for the file's ``{arch}.rope.scaling.*`` keys (llama.cpp's
    converter writes them for linear and YaRN scaling), None when the file has none."""
    kind = fields.get(f"{arch}.rope.scaling.type")
    if kind is None or kind == "none":
        return None
    scaling: dict[str, Any] = {"rope_type": str(kind)}
    factor = fields.get(f"{arch}.rope.scaling.factor")
    if factor is not None:
        scaling["factor"] = factor
    original = fields.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    return scaling


#: (the token list, the tokenizer model) transformers builds a GGUF file's tokenizer from
_TOKENIZER_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.model")


def check_tokenizer_metadata(fields: dict[str, Any], path: str) -> None:
    """An UnsupportedGGUF naming the key when the file's tokenizer cannot be built: no token list
    or tokenizer model, or a special token id outside the list (transformers fails on them only
    once the tokenizer is built, in a worker process, with a traceback)."""
    missing = [key for key in _TOKENIZER_KEYS if not fields.get(key)]
    if missing:
        raise UnsupportedGGUF(
            f"{path}: the file has no tokenizer ({' and '.join(missing)} missing); minisgl reads the "
            "tokenizer from the GGUF file's metadata"
        )
    size = len(fields["tokenizer.ggml.tokens"])
    for key in (
        "bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "padding_token_id", "unknown_token_id",
        "seperator_token_id",
    ):  # fmt: skip
        value = fields.get(f"tokenizer.ggml.{key}")
        if value is not None and not (isinstance(value, int) and 0 <= value < size):
            raise UnsupportedGGUF(
                f"{path}: tokenizer.ggml.{key} is {value!r}, not an id of the file's {size} tokens"
            )


def generation_config_from_metadata(fields: dict[str, Any]) -> dict[str, Any]:
    """Sampling defaults the file declares, plus the tokens generation ends on (so stop checks
    agree with HF's generation config): its eos, and where the file names them its end-of-turn
    and end-of-message tokens, on which llama.cpp ends generation too (a Gemma -it file's
    ``<end_of_turn>``, Llama 3's ``<|eot_id|>``, whose eos may be another token)."""
    out: dict[str, Any] = {}
    for key, hf_key in _SAMPLING_KEYS.items():
        value = fields.get(f"general.sampling.{key}")
        if value is not None:
            out[hf_key] = value
    bos = fields.get("tokenizer.ggml.bos_token_id")
    if bos is not None:
        out["bos_token_id"] = int(bos)
    ends = [fields.get(f"tokenizer.ggml.{key}") for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    ends = list(dict.fromkeys(int(v) for v in ends if v is not None))
    if ends:
        out["eos_token_id"] = ends[0] if len(ends) == 1 else ends
    return out
