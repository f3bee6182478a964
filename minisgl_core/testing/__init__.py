"""Test helpers for the core and for plugin authors: tiny random models and tokenizers built
locally, and hand-built batches over a paged KV pool."""

from minisgl_core.demo.factories import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    demo_model_dir,
    make_model_dir,
    pad_vocab,
    train_tokenizer,
)
from minisgl_core.testing.harness import PagedSequences, greedy_generate, make_attention

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "PagedSequences",
    "demo_model_dir",
    "greedy_generate",
    "make_attention",
    "make_model_dir",
    "pad_vocab",
    "train_tokenizer",
]
