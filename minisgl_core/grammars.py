"""The grammar backend a process uses, chosen by ``--grammar-backend`` and built on first use.

Shared by the tokenizer worker (grammars are checked before admission) and the engine (which
compiles and runs them); free of torch so the tokenizer process stays light until a library needs it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from minisgl_core.api.grammar import GrammarBackend, GrammarError, GrammarSpec
from minisgl_core.plugins import PluginError, Plugins, UnknownPluginName, selection

logger = logging.getLogger(__name__)


def check_grammar_backend(plugins: Plugins, name: str, default: str, *, warn: bool = False) -> None:
    """PluginError when ``name`` was chosen (not the ``default``) and no installed plugin has it:
    refused at start (the server and ``LLM()`` alike); the default, missing, leaves an engine for
    free text, whose grammar requests say why. ``warn`` (the server, once) says so at start too:
    a server started with it disabled looked ready for structured output until the first such
    request."""
    if name in plugins.names("grammars"):
        return
    if name != default:
        raise UnknownPluginName(plugins.missing_message("grammars", name))
    if warn:
        logger.warning(
            "%s; constrained requests (response_format, a tool_choice that forces a call, grammars) "
            "will be refused",
            plugins.missing_message("grammars", name),
        )


def make_grammar_backend(
    plugins: Plugins,
    name: str,
    tokenizer: Any,
    *,
    vocab_size: int,
    stop_token_ids: Sequence[int],
    fill_threads: int | None = None,
) -> GrammarBackend:
    """The backend registered as ``name``; GrammarError saying why when it cannot be used.
    ``fill_threads``: its batched fills' threads (None: ``default_fill_threads()``)."""
    try:
        cls = plugins.resolve("grammars", name)
    except PluginError as exc:
        raise GrammarError(f"constrained decoding is unavailable: {exc}") from None
    selected = selection("grammars", name, plugins.spelling, quote=False)
    why = cls.availability()
    if why is not None:
        raise GrammarError(f"constrained decoding is unavailable: {selected}: {why}")
    try:
        backend = cls(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    except Exception as exc:  # noqa: BLE001 - e.g. a tokenizer the library cannot read
        raise GrammarError(
            f"constrained decoding is unavailable: {selected} failed to start: {type(exc).__name__}: {exc}"
        ) from exc
    if fill_threads is not None:
        backend.fill_threads = fill_threads
    return backend


class LazyGrammarBackend:
    """The backend, built on first use; an unusable one is reported on every constrained request
    (a server without a grammar library still serves free text)."""

    def __init__(
        self,
        plugins: Plugins,
        name: str,
        tokenizer: Any,
        *,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        fill_threads: int | None = None,
    ) -> None:
        self.plugins, self.name, self.tokenizer = plugins, name, tokenizer
        self.vocab_size, self.stop_token_ids = vocab_size, tuple(stop_token_ids)
        self.fill_threads = fill_threads
        self._backend: GrammarBackend | None = None
        #: why the backend cannot be built (kept: trying again per request would cost each one)
        self._failure: GrammarError | None = None
        #: the engine builds it on a compile thread while its own thread may ask for it
        self._lock = threading.Lock()

    def get(self) -> GrammarBackend:
        if self._backend is not None:
            return self._backend
        with self._lock:
            return self._build()

    def _build(self) -> GrammarBackend:
        if self._failure is not None:
            raise GrammarError(str(self._failure))
        if self._backend is None:
            try:
                self._backend = make_grammar_backend(
                    self.plugins,
                    self.name,
                    self.tokenizer,
                    vocab_size=self.vocab_size,
                    stop_token_ids=self.stop_token_ids,
                    fill_threads=self.fill_threads,
                )
            except GrammarError as exc:
                logger.error("%s", exc)
                self._failure = exc
                raise
        return self._backend

    def check(self, spec: GrammarSpec) -> None:
        self.get().check(spec)
