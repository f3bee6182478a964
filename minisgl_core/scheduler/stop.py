"""When a request is done: eos ids, stop token ids, stop strings, max_tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from minisgl_core.scheduler.request import Request


class StopChecker:
    def __init__(self, eos_ids: Iterable[int], decode: Callable[[list[int]], str] | None) -> None:
        self.eos_ids = frozenset(eos_ids)
        #: token ids -> text; needed only for stop strings
        self.decode = decode

    def check(self, req: Request) -> tuple[str | None, str | int | None]:
        """(finish_reason, matched stop) after ``req`` got a new token; (None, None) to go on."""
        params = req.params
        token = req.output_ids[-1]
        if token in params.stop_token_ids:
            return "stop", token
        if not params.ignore_eos and token in self.eos_ids:
            return "stop", token
        if params.stop and self.decode is not None:
            matched = self._stop_string(req)
            if matched is not None:
                return "stop", matched
        if len(req.output_ids) >= params.max_tokens:
            return "length", None
        return None, None

    def _stop_string(self, req: Request) -> str | None:
        # A stop string that ends in the newest token lies within the last few tokens; every token
        # decodes to at least one character except partial UTF-8 bytes, so a window of
        # len(longest stop) + 4 tokens covers it. Earlier text was checked at earlier steps.
        if not req.stop_window:
            req.stop_window = max(len(s) for s in req.params.stop) + 4
        tail = self.decode(req.output_ids[-req.stop_window :])
        for stop in req.params.stop:
            if stop in tail:
                return stop
        return None
