"""Loading the model directory's tokenizer and rendering chat messages."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minisgl_core.plugins import Plugins

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from minisgl_core.checkpoint.formats import load_tokenizer_dir  # noqa: E402 (after the variable)

__all__ = [
    "apply_chat_template",
    "import_transformers_without_torch",
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


def import_transformers_without_torch() -> None:
    """Import transformers as if torch were not installed, for a process that only tokenizes (the
    server's tokenizer and detokenizer). transformers imports torch whenever it is installed
    (``is_torch_available()``, decided once a process, at its import): 2-4 CPU-seconds and 300 MB
    a process, for tokenizers that never touch it. Hidden while transformers decides, torch stays
    importable after (a plugin may still import it); transformers, in this process, runs as in an
    install without torch: its tokenizers, chat templates and configs are the same, its models
    are unavailable. Does nothing where either is imported already (the decision is made)."""
    if "transformers" in sys.modules or "torch" in sys.modules:
        return
    advice = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    # (a None entry makes importlib.util.find_spec("torch") None, and `import torch` fail)
    sys.modules["torch"] = None  # type: ignore[assignment]
    # its "PyTorch was not found. Models won't be available" is this function's purpose, not news
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        import transformers  # noqa: F401 (decides is_torch_available() once)
    finally:
        del sys.modules["torch"]
        if advice is None:
            os.environ.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
        else:
            os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = advice


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
