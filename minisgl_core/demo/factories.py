"""Tiny random models and tokenizers, built locally (no model hub): for tests, benchmarks and the
embedded default model the server starts when no ``--model`` is given."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minisgl_core import environment

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: Qwen-style ChatML
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TINY_DEFAULTS: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)

#: what a tiny mixture-of-experts model (Qwen3MoeForCausalLM) adds: 8 experts of 32, 2 a token
#: (MixtralForCausalLM: the same, its experts sized by intermediate_size)
_TINY_MOE_DEFAULTS: dict[str, Any] = dict(
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True
)

#: what an architecture changes in the tiny shape: Gemma's tied head (as every Gemma checkpoint
#: has), and Gemma 2's sliding window as long as the tiny context, so a tiny Gemma 2 loads without
#: ``max_context_len`` (the window is refused where a sequence could outgrow it)
_TINY_ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "GemmaForCausalLM": dict(tie_word_embeddings=True),
    "Gemma2ForCausalLM": dict(
        tie_word_embeddings=True, sliding_window=_TINY_DEFAULTS["max_position_embeddings"]
    ),
    # (Gemma 3 likewise; its default sliding_window_pattern of 6 makes both tiny layers slide)
    "Gemma3ForCausalLM": dict(
        tie_word_embeddings=True, sliding_window=_TINY_DEFAULTS["max_position_embeddings"]
    ),
}
#: architectures whose RMS norms scale by ``1 + weight`` (Gemma 3's q_norm/k_norm too)
_NORMS_AROUND_ZERO = frozenset({"GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"})

#: the embedded demo model: what it changes in the tiny shape (make_model_dir starts from that)
_DEMO_OVERRIDES: dict[str, Any] = dict(
    hidden_size=256,
    num_hidden_layers=4,
    head_dim=64,
    intermediate_size=512,
    vocab_size=2048,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
)


def train_tokenizer(
    out_dir: str | Path,
    vocab_size: int = 1024,
    corpus: list[str] | None = None,
    added_tokens: Sequence[str] = (),
    special_added_tokens: Sequence[str] = (),
) -> Path:
    """Train a byte-level BPE tokenizer (about 0.1 s) and save it as Hugging Face files.

    ``tokenizer.json`` + ``tokenizer_config.json`` (ChatML ``chat_template``, eos ``<|im_end|>``,
    pad ``<|endoftext|>``), loadable by ``transformers.AutoTokenizer.from_pretrained``. The
    vocabulary holds at most ``vocab_size`` tokens (fewer if the corpus runs out of merges).
    ``added_tokens``: whole tokens that are text, not special (a reasoning model's ``<think>``),
    with the ids after the special tokens'; ``special_added_tokens``: whole tokens that are special
    (decoding with ``skip_special_tokens`` drops them: Mistral's ``[TOOL_CALLS]``), after those."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from minisgl_core.demo.corpus import builtin_corpus

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *added_tokens, *special_added_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus if corpus is not None else builtin_corpus(), trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    special = (*SPECIAL_TOKENS, *special_added_tokens)
    if added_tokens:  # (the trainer made them special: they would vanish from decoded text)
        saved = json.loads((out / "tokenizer.json").read_text())
        for entry in saved["added_tokens"]:
            entry["special"] = entry["content"] in special
        (out / "tokenizer.json").write_text(json.dumps(saved, ensure_ascii=False))
    # Written by hand (not save_pretrained) so the chat template lives in tokenizer_config.json and
    # the files load with transformers 4 and 5 alike.
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "special": token in special,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for token in (*SPECIAL_TOKENS, *added_tokens, *special_added_tokens)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def pad_vocab(tokenizer_dir: str | Path, vocab_size: int) -> int:
    """Grow a trained tokenizer's vocabulary to ``vocab_size`` ids with filler words, so that every
    id a model of that vocabulary samples decodes to visible text, as with a real tokenizer.

    A random-weight model of a real shape (151,936 ids for Qwen3) samples nearly uniformly; with
    the 4,096-token tokenizer we can train locally, 97% of its tokens would decode to nothing, and
    a streaming server would send almost no chunks. The filler words (`` ba``, `` be``, ...) are
    plain vocabulary entries that no merge produces, so encoding is unchanged. Returns how many
    ids were added."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    taken = set(vocab) | {t["content"] for t in data.get("added_tokens", [])}
    next_id = max([*vocab.values(), *(t["id"] for t in data.get("added_tokens", []))]) + 1
    added = 0
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    i = 0
    while next_id < vocab_size:
        # i in base (consonant, vowel) syllables: "Ġ" is the byte-level alphabet's space
        word, k = "", i
        while True:
            word += consonants[k % len(consonants)] + vowels[(k // len(consonants)) % len(vowels)]
            k //= len(consonants) * len(vowels)
            if k == 0:
                break
        i += 1
        token = "\u0120" + word
        if token in taken:
            continue
        vocab[token] = next_id
        taken.add(token)
        next_id += 1
        added += 1
    path.write_text(json.dumps(data, ensure_ascii=False))
    return added


def make_model_dir(
    out_dir: str | Path,
    arch: str = "Qwen3ForCausalLM",
    *,
    seed: int = 0,
    num_shards: int = 1,
    dtype: str = "float32",
    tokenizer_vocab_size: int = 1024,
    added_tokens: Sequence[str] = (),
    special_added_tokens: Sequence[str] = (),
    **config_overrides: Any,
) -> Path:
    """Write a complete random model directory: config, safetensors weights (an index and at least
    ``num_shards`` files when ``num_shards > 1``), tokenizer and generation config.

    ``arch`` is ``"Qwen3ForCausalLM"``, ``"Qwen2ForCausalLM"``, ``"LlamaForCausalLM"``,
    ``"MistralForCausalLM"``, ``"Phi3ForCausalLM"``, ``"GraniteForCausalLM"``, ``"Olmo2ForCausalLM"``,
    ``"GemmaForCausalLM"``, ``"Gemma2ForCausalLM"``, ``"Gemma3ForCausalLM"``, ``"Qwen3MoeForCausalLM"`` or
    ``"MixtralForCausalLM"``; tiny defaults (hidden 64,
    2 layers, 4 heads, 2 KV heads, head_dim 16) are overridden by ``config_overrides``, and
    ``vocab_size`` defaults to the tokenizer's. Weights come from transformers' own initialisation
    with ``seed`` and std ``hidden_size ** -0.5`` (logits of order one); norm weights and biases are then randomised too, so no parameter is trivially
    ones or zeros and a mis-mapped one shows up in numerics tests."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        Gemma2Config,
        Gemma3TextConfig,
        GemmaConfig,
        GenerationConfig,
        GraniteConfig,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Olmo2Config,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )
    from transformers.utils import logging as hf_logging

    config_classes = {
        "Qwen3ForCausalLM": Qwen3Config,
        "Qwen2ForCausalLM": Qwen2Config,
        "LlamaForCausalLM": LlamaConfig,
        "MistralForCausalLM": MistralConfig,
        "Phi3ForCausalLM": Phi3Config,
        "GraniteForCausalLM": GraniteConfig,
        "Olmo2ForCausalLM": Olmo2Config,
        "GemmaForCausalLM": GemmaConfig,
        "Gemma2ForCausalLM": Gemma2Config,
        "Gemma3ForCausalLM": Gemma3TextConfig,
        "Qwen3MoeForCausalLM": Qwen3MoeConfig,
        "MixtralForCausalLM": MixtralConfig,
    }
    if arch not in config_classes:
        raise ValueError(f"unknown arch {arch!r}; choose from {sorted(config_classes)}")
    out = Path(out_dir)
    train_tokenizer(
        out,
        vocab_size=tokenizer_vocab_size,
        added_tokens=added_tokens,
        special_added_tokens=special_added_tokens,
    )
    tokens = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    endoftext, im_end = tokens["<|endoftext|>"], tokens["<|im_end|>"]
    moe = {
        "Qwen3MoeForCausalLM": _TINY_MOE_DEFAULTS,
        "MixtralForCausalLM": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    }.get(arch, {})
    settings = {
        **_TINY_DEFAULTS,
        **moe,
        **_TINY_ARCH_DEFAULTS.get(arch, {}),
        "vocab_size": len(tokens),
        **config_overrides,
    }
    # transformers' default std (0.02) leaves the residual stream dominated by the token's own
    # embedding, so a tied model just repeats its input; unit-gain projections make every layer count.
    settings.setdefault("initializer_range", settings["hidden_size"] ** -0.5)
    config = config_classes[arch](
        **settings, architectures=[arch], bos_token_id=None, eos_token_id=im_end, pad_token_id=endoftext
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                # (Gemma's norms scale by 1 + weight: their weights are stored around zero)
                centre = 0.0 if arch in _NORMS_AROUND_ZERO else 1.0
                param.copy_(centre + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.02 * torch.randn_like(param))
    model.to(getattr(torch, dtype))
    total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    shard_bytes = total_bytes + 1 if num_shards <= 1 else -(-total_bytes // num_shards)
    progress_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=shard_bytes)
    finally:
        if progress_was_on:
            hf_logging.enable_progress_bar()
    GenerationConfig(eos_token_id=[im_end, endoftext], pad_token_id=endoftext).save_pretrained(out)
    return out


def demo_model_dir() -> Path:
    """The embedded default model: a real Qwen3 architecture (hidden 256, 4 layers, 4 q / 2 KV heads,
    head_dim 64, vocab 2048, tied embeddings) with RANDOM weights, so its output is meaningless
    text. It exists so the server starts and can be exercised with no model hub.

    Built once into ``$MINISGL_CACHE_DIR/demo-qwen3`` (default ``~/.cache/minisgl/demo-qwen3``)
    and reused; building goes through a temporary directory renamed into place, so concurrent
    first starts never see a half-written model."""
    root = environment.cache_dir()
    final = root / "demo-qwen3"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-qwen3-", dir=root))
    try:
        make_model_dir(staging, "Qwen3ForCausalLM", seed=0, tokenizer_vocab_size=2048, **_DEMO_OVERRIDES)
        os.rename(staging, final)
    except OSError:
        if not (final / "config.json").is_file():  # a concurrent builder did not win the race either
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
