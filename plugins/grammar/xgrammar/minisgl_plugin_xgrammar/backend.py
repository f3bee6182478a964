"""The xgrammar grammar backend: every grammar kind, compiled for the served tokenizer."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from minisgl_core.api import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec

#: threads xgrammar compiles one grammar with (it splits the vocabulary among them)
_COMPILE_THREADS = int(os.environ.get("MINISGL_XGRAMMAR_THREADS", "8"))


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def reset(self) -> None:
        self._matcher.reset()


class XGrammarBackend(GrammarBackend):
    capabilities = frozenset({"json_schema", "json_object", "regex", "choice", "ebnf", "structural_tag"})

    @classmethod
    def availability(cls) -> str | None:
        if importlib.util.find_spec("xgrammar") is None:
            return "xgrammar is not installed (pip install minisgl-plugin-xgrammar pulls it in)"
        return None

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        super().__init__(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        import xgrammar

        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(self.stop_token_ids) or None
        )
        # our own cache (GrammarBackend.compile) keeps compiled grammars; no second one inside
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=_COMPILE_THREADS, cache_enabled=False)

    def check(self, spec: GrammarSpec) -> None:
        """Parse without compiling against the vocabulary (the expensive part), for admission."""
        if spec.kind not in self.capabilities:
            self.compile(spec)  # raises, naming the kinds we support
        try:
            self._grammar(spec)
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - xgrammar's parse errors name the problem
            raise GrammarError(f"invalid {spec.kind} grammar: {exc}") from exc

    def compile_uncached(self, spec: GrammarSpec) -> Any:
        return self._compiler.compile_grammar(self._grammar(spec))

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return XGrammarMatcher(self._xgr.GrammarMatcher(compiled))

    def _grammar(self, spec: GrammarSpec) -> Any:
        grammar = self._xgr.Grammar
        if spec.kind == "json_schema":
            _check_json(spec.value, "json_schema")
            # compact output (no free whitespace): a weak model cannot stall in an endless run of spaces
            return grammar.from_json_schema(spec.value, any_whitespace=False, strict_mode=True)
        if spec.kind == "json_object":
            # any object: strict mode would forbid every property the schema does not name
            return grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if spec.kind == "regex":
            return grammar.from_regex(spec.value)
        if spec.kind == "choice":
            options = spec.choices()
            return grammar.from_ebnf("root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options))
        if spec.kind == "ebnf":
            return grammar.from_ebnf(spec.value)
        if spec.kind == "structural_tag":
            _check_json(spec.value, "structural_tag")
            return grammar.from_structural_tag(spec.value)
        raise GrammarError(f"xgrammar backend: unsupported grammar kind {spec.kind!r}")


def _check_json(text: str, what: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"{what} is not valid JSON: {exc}") from exc
