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

import torch

from minisgl_core.api import GrammarError, allocate_token_bitmask
from minisgl_core.grammars import LazyGrammarBackend
from minisgl_core.scheduler.request import Request

logger = logging.getLogger(__name__)


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
