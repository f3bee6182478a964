"""Turning output token ids into text, whole or incrementally for streaming."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: how many of the prompt's last tokens the output is decoded after (:func:`decode_after`)
CONTEXT_TOKENS = 4


def prompt_context(prompt_ids: Sequence[int]) -> list[int]:
    """The prompt's last tokens, which the output's text is decoded after."""
    return list(prompt_ids[-CONTEXT_TOKENS:])


def decode_after(decode: Callable[[list[int]], str], context: list[int], ids: list[int]) -> str:
    """The text of ``ids`` as it reads after the ``context`` tokens (the prompt's last ones): a
    SentencePiece decoder (Llama 2's, Mistral's) drops the space of the "▁" its text starts with,
    so "▁Paris" alone is "Paris" where the answer to "The capital of France is" is " Paris" (vLLM's
    and SGLang's detokenizers decode the output after a few prompt tokens too). The ids alone
    where the context's text ends inside a character or is not the start of theirs together."""
    if context and ids:
        head = decode(context)
        if not head.endswith("\ufffd"):
            text = decode(context + ids)
            if text.startswith(head):
                return text[len(head) :]
    return decode(ids)


def visible_ids(output_ids: list[int], matched_stop: str | int | None, keep: bool = False) -> list[int]:
    """Output ids without the stop token id that ended the request (it is not part of the text),
    unless ``keep`` (include_stop_str_in_output: vLLM keeps a stop token's text then too)."""
    if not keep and isinstance(matched_stop, int) and output_ids and output_ids[-1] == matched_stop:
        return output_ids[:-1]
    return output_ids


def trim_stop(text: str, matched_stop: str | int | None, keep: bool = False, start: int = 0) -> str:
    """Cut the text before the stop string that ended the request (after it with ``keep``: vLLM's
    include_stop_str_in_output, SGLang's no_stop_trim): its first occurrence from ``start`` on
    (occurrences before min_tokens did not count: :func:`stop_search_start`)."""
    if isinstance(matched_stop, str):
        cut = text.find(matched_stop, start)
        if cut >= 0:
            return text[: cut + len(matched_stop)] if keep else text[:cut]
    return text


def stop_search_start(decode: Any, output_ids: list[int], stop: str, min_tokens: int) -> int:
    """Where a stop string that ended a request with ``min_tokens`` may start in its text: it
    counts only if it ends in the text of token ``min_tokens`` or later (the scheduler's
    ``StopChecker`` skips earlier ones), so after the text of the first ``min_tokens - 1`` tokens
    less its length plus one (of their whole characters: one they end inside ends later)."""
    if min_tokens <= 1:
        return 0
    return max(0, whole_text_length(decode, output_ids[: min_tokens - 1]) - len(stop) + 1)


def whole_text_length(decode: Callable[[list[int]], str], ids: list[int]) -> int:
    """The length of the text of ``ids``' whole characters: a character they end inside decodes to
    U+FFFD, and with a byte-fallback vocabulary (Llama 2's <0xE6> pieces) the whole run of byte
    pieces it ends, the characters before it too, whose text that of fewer tokens holds."""
    text = decode(ids)
    if not text.endswith("\ufffd"):
        return len(text)
    return max(len(decode(ids[: len(ids) - back]).rstrip("\ufffd")) for back in range(min(3, len(ids)) + 1))


def final_text(
    tokenizer: Any,
    output_ids: list[int],
    matched_stop: str | int | None,
    skip_special_tokens: bool = True,
    keep_stop: bool = False,
    min_tokens: int = 0,
    context: list[int] | None = None,
) -> str:
    """The text of a finished request's output; ``context``: its prompt's last tokens
    (:func:`prompt_context`), which the output is decoded after."""

    def decode(ids: list[int]) -> str:
        return decode_after(
            lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), context or [], ids
        )

    visible = visible_ids(output_ids, matched_stop, keep_stop)
    text = decode(visible)
    cut = cut_character_tokens(tokenizer, visible, text)
    if cut:
        visible = visible[:-cut]
        text = decode(visible)
    text = without_cut_character(tokenizer, visible, text)
    start = 0
    if isinstance(matched_stop, str):
        start = stop_search_start(decode, visible, matched_stop, min_tokens)
    return trim_stop(text, matched_stop, keep_stop, start)


def special_token_texts(tokenizer: Any) -> tuple[str, ...]:
    """The text of each of ``tokenizer``'s special tokens, which ``skip_special_tokens`` drops
    from decoded text (its added tokens marked special, and ``all_special_ids``), longest first."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {int(i) for i, token in added.items() if getattr(token, "special", False)}
    ids |= {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()}
    texts = {tokenizer.decode([i], skip_special_tokens=False) for i in ids}
    return tuple(sorted((t for t in texts if t), key=lambda t: (-len(t), t)))


def without_cut_character(tokenizer: Any, ids: list[int], text: str) -> str:
    """``text`` (the decoded ``ids``, or its end) less the U+FFFD that stands for a character the
    output stopped inside (max_tokens reached after the first bytes of a multi-byte character):
    the text a stream sent holds those bytes back, so the end of a request drops them, as vLLM's
    detokenizer does. A U+FFFD the model wrote stays."""
    if text.endswith("\ufffd") and ends_inside_character(tokenizer, ids):
        return text[:-1]
    return text


def cut_character_tokens(tokenizer: Any, ids: list[int], text: str) -> int:
    """How many of the last ``ids`` (``text``: their decoded text, or its end) hold nothing but
    the first bytes of a character the output stopped inside. A byte-fallback vocabulary's pieces
    (``<0xE6>``, Llama 2's) decode to U+FFFD a byte, and a run of them ending inside a character
    all to U+FFFD, the whole characters before too ("你好" and half of "世" were eight U+FFFD), so
    they are left out before decoding, as vLLM never sends them (a byte-level token that also holds
    whole characters stays: :func:`without_cut_character` drops its U+FFFD)."""
    if not text.endswith("\ufffd"):
        return 0
    cut, held, tokens = _cut_bytes(tokenizer, ids), 0, 0
    for token_id in reversed(ids):
        raw = raw_token_bytes(tokenizer, token_id)
        if raw is None or held + len(raw) > cut:
            break
        held, tokens = held + len(raw), tokens + 1
    return tokens


def ends_inside_character(tokenizer: Any, ids: list[int]) -> bool:
    """Whether the bytes of ``ids`` end with an incomplete UTF-8 sequence: a lead byte whose
    continuation bytes never came (read from the last tokens' vocabulary entries,
    :func:`raw_token_bytes`; a token of another kind ends whole characters)."""
    return _cut_bytes(tokenizer, ids) > 0


def _cut_bytes(tokenizer: Any, ids: list[int]) -> int:
    """How many bytes of an incomplete UTF-8 sequence the bytes of ``ids`` end with (0: none)."""
    tail = b""
    for token_id in reversed(ids[-4:]):
        raw = raw_token_bytes(tokenizer, token_id)
        if raw is None:
            break
        tail = raw + tail
        if len(tail) >= 4:
            break
    for back in range(1, min(4, len(tail)) + 1):
        byte = tail[-back]
        if 0x80 <= byte < 0xC0:  # a continuation byte: the lead is further back
            continue
        if 0xC0 <= byte < 0xF8:  # a lead byte: 2, 3 or 4 bytes in all
            return back if (2 if byte < 0xE0 else 3 if byte < 0xF0 else 4) > back else 0
        return 0  # ASCII
    return 0


class IncrementalDetokenizer:
    """Yields the new text of each step, holding back incomplete UTF-8 and a possible stop-string prefix.

    Decodes a short window of recent tokens (not the whole output) each step, the way
    streaming servers do: text is emitted once the window decodes to complete characters.
    """

    def __init__(
        self,
        tokenizer: Any,
        stop: list[str],
        skip_special_tokens: bool = True,
        keep_stop: bool = False,
        min_tokens: int = 0,
        context: list[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.context = context or []  # the prompt's last tokens: the output is decoded after them
        self.skip = skip_special_tokens
        self.stop = stop
        self.keep_stop = keep_stop  # the matched stop string stays in the text
        self.min_tokens = min_tokens  # stop strings count from this token on
        self._search_start: dict[str, int] = {}  # stop -> stop_search_start (fixed by then)
        #: per stop string, how much of it the text ends with (read incrementally: the tail held
        #: back; rescanning the text for it each step cost the square of a long stop's length)
        self._tails = [_StopTail(stop) for stop in stop]
        self._searched = 0  # text searched for whole stop strings (from where each may start)
        self._stop_at: int | None = None  # where the first whole stop string begins
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all text decoded so far (before stop trimming)
        self.sent = 0  # characters of text already emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def _decode_output(self, ids: list[int]) -> str:
        """The text of output ids from the output's first on, read after the context."""
        return decode_after(self._decode, self.context, ids)

    def _decode_window(self, ids: list[int], start: int) -> str:
        return self._decode_output(ids) if start == 0 else self._decode(ids)

    def add(self, token_ids: list[int], finished: bool = False, matched_stop: str | int | None = None) -> str:
        """Feed new tokens; return text that is safe to emit now."""
        self.ids.extend(token_ids)
        ids = visible_ids(self.ids, matched_stop, self.keep_stop) if finished else self.ids
        prefix = self._decode_window(ids[self.prefix_offset : self.read_offset], self.prefix_offset)
        full = self._decode_window(ids[self.prefix_offset :], self.prefix_offset)
        if finished:  # (the bytes of a character the output stopped inside were never sent)
            cut = cut_character_tokens(self.tokenizer, ids, full)
            if cut:
                ids = ids[: max(len(ids) - cut, self.read_offset)]
                full = self._decode_window(ids[self.prefix_offset :], self.prefix_offset)
        if finished or (len(full) > len(prefix) and not full.endswith("\ufffd")):
            new = full[len(prefix) :]
            if finished:
                new = without_cut_character(self.tokenizer, ids, new)
            self.text += new
            self.prefix_offset = self.read_offset
            self.read_offset = len(ids)
            if not finished:
                for tail in self._tails:
                    tail.feed(new)
        if finished:
            start = 0
            if isinstance(matched_stop, str):
                start = stop_search_start(self._decode_output, ids, matched_stop, self.min_tokens)
            end = len(trim_stop(self.text, matched_stop, self.keep_stop, start))
        else:
            # Hold back a tail that could still grow into a stop string, and text from a whole one
            # on (the request is about to end there), unless min_tokens has not been reached: then
            # it does not count and the text goes out.
            end = len(self.text) - max((tail.matched for tail in self._tails), default=0)
            if len(self.ids) >= self.min_tokens:
                for stop in self.stop:
                    start = self._search_start.get(stop)
                    if start is None:  # decodes the first min_tokens - 1 tokens: once per stop
                        start = self._search_start[stop] = stop_search_start(
                            self._decode_output, self.ids, stop, self.min_tokens
                        )
                    # (only where a new occurrence may lie: the text searched before had none)
                    at = self.text.find(stop, max(start, self._searched - len(stop) + 1))
                    if at >= 0 and (self._stop_at is None or at < self._stop_at):
                        self._stop_at = at
                self._searched = len(self.text)
            if self._stop_at is not None:
                end = min(end, self._stop_at)
        end = max(end, self.sent)
        out = self.text[self.sent : end]
        self.sent = end
        return out


class _StopTail:
    """How long a beginning of ``stop`` the text ends with (the longest proper prefix of ``stop``
    that is a suffix of the text), kept up to date as text is fed: Knuth-Morris-Pratt's matcher,
    amortized constant work per character."""

    __slots__ = ("stop", "fallback", "matched")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        # fallback[i]: the longest proper prefix of stop[: i + 1] that is also its suffix
        self.fallback = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.fallback[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.fallback[i] = k
        self.matched = 0

    def feed(self, text: str) -> None:
        stop, fallback, k = self.stop, self.fallback, self.matched
        for ch in text:
            while k and stop[k] != ch:
                k = fallback[k - 1]
            if stop[k] == ch:
                k += 1
                if k == len(stop):  # a whole one (the caller's search finds it): what may follow
                    k = fallback[k - 1]
        self.matched = k


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's (GPT-2's) spelling of bytes as characters, read back: the printable bytes
    ``!``-``~``, ``¡``-``¬`` and ``®``-``ÿ`` stand for themselves, every other byte, in order, for
    the characters from U+0100 on."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if chr(b) not in table]
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table


_BYTE_LEVEL = _byte_level_alphabet()


def raw_token_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """The bytes a token stands for, read from its vocabulary entry: a byte-fallback entry
    (``<0xF0>``) or a byte-level BPE one (``ðŁĺ``); None for any other kind. For the tokens whose
    text alone is not whole UTF-8 characters (decoded alone they show U+FFFD): the entries of
    logprobs carry a token's bytes so that a client can join a character split across tokens."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    piece = convert(token_id) if convert is not None else None
    if not isinstance(piece, str) or not piece:
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            return None
    if all(ch in _BYTE_LEVEL for ch in piece):
        return bytes(_BYTE_LEVEL[ch] for ch in piece)
    return None
