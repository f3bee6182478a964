"""Loading the model directory's tokenizer and rendering chat messages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minisgl_core.plugins import Plugins

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from minisgl_core.checkpoint.formats import load_tokenizer_dir  # noqa: E402 (after the variable)

__all__ = [
    "apply_chat_template",
    "load_tokenizer",
    "load_tokenizer_dir",
    "longest_token_chars",
    "render_chat_template",
]


def load_tokenizer(
    model: str | Path, plugins: Plugins | None = None, chat_template: str | None = None
) -> Any:
    """The tokenizer of the model at ``model``, read through its weight format, with
    ``chat_template`` (Jinja text, ``--chat-template``) replacing its own when given."""
    from minisgl_core.checkpoint.formats import open_model, source_tokenizer

    tokenizer = source_tokenizer(open_model(model, plugins))
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def apply_chat_template(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template (or ``chat_template``
    of ``kwargs``, Jinja text), ready for the reply (``add_generation_prompt`` true unless
    ``kwargs`` says otherwise)."""
    if not (kwargs.get("chat_template") or getattr(tokenizer, "chat_template", None)):
        raise ValueError("this model's tokenizer has no chat_template; use the completions API instead")
    kwargs.setdefault("add_generation_prompt", True)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def render_chat_template(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """The text :func:`apply_chat_template` tokenizes (with ``add_special_tokens`` false: the
    template writes the special tokens itself)."""
    if not (kwargs.get("chat_template") or getattr(tokenizer, "chat_template", None)):
        raise ValueError("this model's tokenizer has no chat_template; use the completions API instead")
    kwargs.setdefault("add_generation_prompt", True)
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters of text one token can stand for: the longest entry of the vocabulary,
    added tokens included (a byte-level entry spells each byte as one character, and a byte is at
    most one character of text, so this bounds it from above). A text longer than
    ``context x this`` cannot fit the context. None when the tokenizer shows no vocabulary."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    try:
        vocab = get_vocab()
    except Exception:  # noqa: BLE001 (a tokenizer without one: the caller falls back)
        return None
    return max(map(len, vocab), default=None)
