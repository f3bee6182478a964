"""Constrained decoding in the engine: the selected grammar backend, each request's matcher,
and the token bitmask of a step.

The backend is built on the first constrained request (building it reads the whole vocabulary),
so a server that never sees one pays nothing. Where the masks are filled is the engine's
business (:meth:`Engine._launch`): after the forward is launched and before the sampler, so the
host fills them while the device computes the logits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from minisgl_core.api import GrammarBackend, GrammarError, GrammarSpec, allocate_token_bitmask
from minisgl_core.plugins import PluginError, Plugins
from minisgl_core.scheduler.request import Request

logger = logging.getLogger(__name__)


def make_grammar_backend(
    plugins: Plugins, name: str, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int]
) -> GrammarBackend:
    """The backend registered as ``name``; GrammarError saying why when it cannot be used."""
    try:
        cls = plugins.resolve("grammars", name)
    except PluginError as exc:
        raise GrammarError(f"constrained decoding is unavailable: {exc}") from None
    why = cls.availability()
    if why is not None:
        raise GrammarError(f"constrained decoding is unavailable: --grammar-backend {name}: {why}")
    try:
        return cls(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    except Exception as exc:  # noqa: BLE001 - e.g. a tokenizer the library cannot read
        raise GrammarError(
            f"constrained decoding is unavailable: --grammar-backend {name} failed to start: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


class LazyGrammarBackend:
    """The backend, built on first use; an unusable one is reported on every constrained request
    (a server without a grammar library still serves free text)."""

    def __init__(
        self, plugins: Plugins, name: str, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int]
    ) -> None:
        self.plugins, self.name, self.tokenizer = plugins, name, tokenizer
        self.vocab_size, self.stop_token_ids = vocab_size, tuple(stop_token_ids)
        self._backend: GrammarBackend | None = None
        #: why the backend cannot be built (kept: trying again per request would cost each one)
        self._failure: GrammarError | None = None

    def get(self) -> GrammarBackend:
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
                )
            except GrammarError as exc:
                logger.error("%s", exc)
                self._failure = exc
                raise
        return self._backend

    def check(self, spec: GrammarSpec) -> None:
        self.get().check(spec)


class GrammarRunner:
    """Matchers of the engine's constrained requests: made at admission, advanced by each sampled
    token, asked for the next step's bitmask."""

    def __init__(self, backend: LazyGrammarBackend, device: torch.device) -> None:
        self.backend = backend
        self.device = device

    def attach(self, req: Request) -> None:
        """Give a constrained request its matcher; GrammarError (a ValueError) for a bad grammar."""
        spec = req.params.grammar
        if spec is None:
            return
        backend = self.backend.get()
        compiled = backend.compile(spec)
        try:
            req.matcher = backend.matcher(compiled)
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - the request fails, not the scheduler
            raise GrammarError(
                f"the grammar backend could not start a matcher: {type(exc).__name__}: {exc}"
            ) from exc

    def accept(self, requests: Sequence[Request], token_ids: Sequence[int], live: dict[int, Request]) -> None:
        """Advance each live constrained request by its sampled token. A token the grammar rejects
        (only possible through a bug or a disagreeing rank) fails that request, never the engine."""
        for req, token in zip(requests, token_ids):
            matcher = req.matcher
            if matcher is None or req.grammar_error is not None or live.get(req.rid) is not req:
                continue
            if matcher.is_terminated():  # a token planned before the finish was seen: dropped later
                continue
            try:
                accepted = matcher.accept_token(token)
            except Exception as exc:  # noqa: BLE001 - a backend failure fails the request, not the engine
                accepted, why = False, f"{type(exc).__name__}: {exc}"
            else:
                why = "not allowed here"
            if not accepted:
                req.grammar_error = f"the grammar rejected sampled token {token} ({why})"
                logger.error("request %d: %s", req.rid, req.grammar_error)

    def bitmask(self, requests: Sequence[Request]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows of ``requests`` that are constrained, their bitmask) on the device, or None.

        A matcher that is finished or failed allows everything: its token is dropped anyway."""
        rows = [i for i, r in enumerate(requests) if r.matcher is not None]
        if not rows:
            return None
        pinned = self.device.type == "cuda"
        # A fresh pinned buffer per step: the caching host allocator does not hand it out again
        # until the copy below has run, while a reused one could be overwritten under it.
        mask = allocate_token_bitmask(len(rows), self.backend.vocab_size, pin_memory=pinned)
        for j, i in enumerate(rows):
            req = requests[i]
            matcher = req.matcher
            assert matcher is not None
            if req.grammar_error is None and not matcher.is_terminated():
                try:
                    matcher.fill_bitmask(mask, j)
                except Exception as exc:  # noqa: BLE001
                    req.grammar_error = f"the grammar backend failed: {type(exc).__name__}: {exc}"
                    logger.error("request %d: %s", req.rid, req.grammar_error)
                    mask[j] = -1
        index = torch.tensor(rows, dtype=torch.int64)
        if pinned:
            index = index.pin_memory()
        return index.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)
