"""The xgrammar backend the plugin's tests share: one per test module, over a 400-token byte-level
BPE trained on the fly (stop token id 2), and ``takes``, whether a grammar takes a text."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from minisgl_plugin_xgrammar.backend import XGrammarBackend

from minisgl_core.api import GrammarSpec


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> XGrammarBackend:
    from transformers import AutoTokenizer

    from minisgl_core.demo.factories import train_tokenizer

    tok = AutoTokenizer.from_pretrained(str(train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400)))
    return XGrammarBackend(tok, vocab_size=len(tok), stop_token_ids=[2])


@pytest.fixture
def takes(backend: XGrammarBackend) -> Callable[[str, Any, str], bool]:
    """``takes(kind, value, text)``: whether ``backend``'s grammar of that kind (``value`` a JSON
    text, or a JSON value to write as one) takes ``text``'s tokens and then ends."""

    def takes(kind: str, value: Any, text: str) -> bool:
        spec = GrammarSpec(kind, value if isinstance(value, str) else json.dumps(value))
        matcher = backend.matcher(backend.compile(spec))
        stop = backend.stop_token_ids[0]
        tokens = backend.tokenizer.encode(text, add_special_tokens=False)
        return all(matcher.accept_token(t) for t in tokens) and (
            matcher.accept_token(stop) or matcher.is_terminated()
        )

    return takes
