"""The llguidance backend the plugin's tests share: one per test module, over a 400-token byte-level
BPE trained on the fly (stop token id 2)."""

from __future__ import annotations

import pytest
from minisgl_plugin_llguidance.backend import LLGuidanceBackend


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> LLGuidanceBackend:
    from transformers import AutoTokenizer

    from minisgl_core.demo.factories import train_tokenizer

    tok = AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400)))
    return LLGuidanceBackend(tok, vocab_size=len(tok), stop_token_ids=[2])
