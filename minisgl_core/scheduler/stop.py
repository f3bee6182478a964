"""When a request is done: eos ids, stop token ids, stop strings, max_tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from minisgl_core.scheduler.request import Request
from minisgl_core.tokenizer.detokenize import decode_after, prompt_context, whole_text_length

#: tokens decoded first for a long stop's window: they hold every character the newest token
#: completed (a character is at most four bytes, a token at least one) and the token before it
_RECENT = 8


class StopChecker:
    def __init__(self, eos_ids: Iterable[int], decode: Callable[[list[int], bool], str] | None) -> None:
        self.eos_ids = frozenset(eos_ids)
        #: (token ids, skip_special_tokens) -> text; needed only for stop strings, which match the
        #: text the client gets: with special tokens skipped (the default) a stop string holding
        #: one (``"4.<|im_end|>"``) never matches, as in vLLM (the scheduler decoded them, matched
        #: such a stop, and the detokenizer, which skips them, found nothing to cut)
        self.decode = decode

    def check(self, req: Request) -> tuple[str | None, str | int | None]:
        """(finish_reason, matched stop) after ``req`` got a new token; (None, None) to go on."""
        params = req.params
        token = req.output_ids[-1]
        produced = len(req.output_ids)
        if produced >= params.min_tokens:  # before min_tokens no stop counts (vLLM's min_tokens)
            if token in params.stop_token_ids:
                return "stop", token
            if not params.ignore_eos and token in self.eos_ids:
                return "stop", token
            if params.stop and self.decode is not None:
                matched = self._stop_string(req)
                if matched is not None:
                    return "stop", matched
        if produced >= params.max_tokens:
            return "length", None
        return None, None

    def _stop_string(self, req: Request) -> str | None:
        # A stop string that ends in the newest token lies within the last few tokens: every token
        # decodes to at least one byte of text, so a window of the longest stop's UTF-8 bytes + 4
        # tokens covers it (its length in characters did not: a CJK character or an emoji is two
        # to four tokens of a byte-level vocabulary, and such stops were never found). Earlier
        # text was checked at earlier steps, but for text before min_tokens, which does not count:
        # while the window still holds some of the first min_tokens - 1 tokens, only a stop ending
        # after their text does (the detokenizer trims at the same one: stop_search_start).
        assert self.decode is not None
        skip = req.params.skip_special_tokens

        def decode(ids: list[int]) -> str:
            return self.decode(ids, skip)  # type: ignore[misc]

        if not req.stop_window:
            req.stop_window = max(len(s.encode("utf-8")) for s in req.params.stop) + 4
        if req.stop_window > 2 * _RECENT:
            # A stop found now ends in the characters the newest token completed (or, for one
            # ending in a real U+FFFD, the token before), which began within the last four tokens:
            # if no stop's last character is in the last few tokens' text, none can match, and the
            # window (up to 4,100 tokens for a long stop of emoji) need not be decoded this step.
            _, recent = _text_from(decode, req, len(req.output_ids) - _RECENT)
            if not any(stop[-1] in recent for stop in req.params.stop):
                return None
        start, tail = _text_from(decode, req, len(req.output_ids) - req.stop_window)
        window = req.output_ids[start:]
        context = prompt_context(req.prompt_ids) if start == 0 else []
        early = req.params.min_tokens - 1 - (len(req.output_ids) - len(window))
        # (a character the first min_tokens - 1 tokens end inside is not their text: it ends later)
        before = (
            whole_text_length(lambda ids: decode_after(decode, context, ids), window[:early])
            if early > 0
            else 0
        )
        # A character cut by either end of the window (the window starting inside one, the newest
        # token ending inside one) decodes to U+FFFD: not the output's text, which a stop of
        # "\ufffd" matched inside a whole emoji. The end's characters are found once complete.
        end = len(tail.rstrip("\ufffd"))
        lead = len(tail) - len(tail.lstrip("\ufffd")) if len(window) < len(req.output_ids) else 0
        # Of several stop strings the one the text reaches first wins, whatever their order in the
        # list (one token can hold two: "and" with stop ["d", "a"] ends at "a"); at the same
        # start the shorter, which ended first. The detokenizer cuts at its first occurrence.
        found = None
        for stop in req.params.stop:
            at = tail.find(stop, max(lead, before - len(stop) + 1), end)
            if at >= 0 and (found is None or (at, len(stop)) < found[:2]):
                found = (at, len(stop), stop)
        return None if found is None else found[2]


def _text_from(decode: Callable[[list[int]], str], req: Request, start: int) -> tuple[int, str]:
    """(where it starts, the text of) ``req``'s output from token ``start`` on. A window starting
    inside a character decodes it to U+FFFD, and with a byte-fallback vocabulary (Llama 2's
    <0xE6> pieces) the whole run of byte pieces it starts in, the characters after the cut one
    too ("👧 ." was not found in "\ufffd" * 8 + " ."): it starts again a token earlier, up to
    three, at the character's first byte. From the output's first token it is read after the
    prompt's end, as the detokenizer reads it (a SentencePiece "▁Paris" starting it is " Paris")."""
    first = start = max(0, start)
    while True:
        context = prompt_context(req.prompt_ids) if start == 0 else []
        text = decode_after(decode, context, req.output_ids[start:])
        if start == 0 or first - start == 3 or not text.startswith("\ufffd"):
            return start, text
        start -= 1
