"""Test helpers for the core and for plugin authors: tiny random models and tokenizers built
locally, hand-built batches over a paged KV pool, and offline engines run step by step
(:mod:`minisgl_core.testing.engine_run`)."""

import sys

try:  # a failed check in the suites shows its values, as in the plugin author's own test modules
    import pytest

    _SUITES = (
        "attention",
        "cache",
        "format",
        "grammar",
        "model",
        "packaging",
        "parser",
        "policy",
        "quantization",
    )
    # (installed modules are not rewritten unless registered before their import; the package itself
    # is being imported now, so only the modules not imported yet are named)
    pytest.register_assert_rewrite(
        *(name for name in (f"{__name__}.{s}_suite" for s in _SUITES) if name not in sys.modules)
    )
except ImportError:  # the kit's helpers without pytest
    pass

from minisgl_core.demo.factories import (
    CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    demo_model_dir,
    make_model_dir,
    pad_vocab,
    train_tokenizer,
)
from minisgl_core.testing.engine_run import StaggeredRun, assert_kv_released, cpu_llm, drain, run_staggered
from minisgl_core.testing.harness import PagedSequences, greedy_generate, make_attention

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "PagedSequences",
    "StaggeredRun",
    "assert_kv_released",
    "cpu_llm",
    "demo_model_dir",
    "drain",
    "greedy_generate",
    "make_attention",
    "make_model_dir",
    "pad_vocab",
    "run_staggered",
    "train_tokenizer",
]
