"""GrammarBackend.compile turns a library's exception into a GrammarError (a 400) naming what was
wrong; an exception with no words (xgrammar raised RuntimeError('') for 10**400 in a schema, and
the 400 read "invalid json_schema grammar: ") says at least what was raised."""

from __future__ import annotations

from typing import Any

import pytest

from minisgl_core.api import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec


class _Raising(GrammarBackend):
    capabilities = frozenset({"regex"})

    def __init__(self, error: Exception) -> None:
        super().__init__(None, vocab_size=8, stop_token_ids=[0])
        self.error = error

    def compile_uncached(self, spec: GrammarSpec) -> Any:
        raise self.error

    def matcher(self, compiled: Any) -> GrammarMatcher:
        raise AssertionError("never compiled")


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (RuntimeError(""), "invalid regex grammar: RuntimeError with no message"),
        (ValueError("  \n"), "invalid regex grammar: ValueError with no message"),
        (ValueError("number out of range\n"), "invalid regex grammar: number out of range"),
    ],
)
def test_a_librarys_error_becomes_a_grammar_error_that_says_something(error, says):
    with pytest.raises(GrammarError) as refused:
        _Raising(error).compile(GrammarSpec("regex", "a"))
    assert str(refused.value) == says
