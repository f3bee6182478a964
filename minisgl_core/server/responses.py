"""Response bodies: OpenAI chat/completions objects and stream chunks, and the native /generate shape.

A :class:`Choice` accumulates one engine request's token events; the functions here turn choices
into the JSON the clients expect (including both OpenAI logprobs formats).
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from minisgl_core.server.state import Delta

if TYPE_CHECKING:
    from minisgl_core.server.chat_output import ChoiceOutput

DONE = "data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


#: one choice's whole answer: the deltas of its stream merged (``Choice(index).merge(delta)``)
Choice = Delta


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with ``cached_tokens`` (of the prompt tokens, those read from the prefix
    cache: RequestGroup.cached_tokens) its ``prompt_tokens_details`` too. A request's usage has
    them; vLLM's continuous_usage_stats chunks leave them out, as vLLM's do."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


# ------------------------------------------------------------------ logprobs


def _entry(text: str, logprob: float, raw: list[int] | None = None) -> dict[str, Any]:
    return {
        "token": text,
        "logprob": logprob,
        "bytes": raw if raw is not None else list(text.encode("utf-8")),
    }


def chat_logprobs(items: list[list[Any]]) -> dict[str, Any]:
    """Chat format: ``{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}``; ``bytes``
    is the token's own where its text is not whole characters (the detokenizer's item[5]: [[id,
    bytes], ...]), so a client joins a character split across tokens."""
    content = []
    for text, logprob, top, *rest in items:
        raw = dict(rest[2]) if len(rest) > 2 else {}
        entry = _entry(text, logprob, raw.get(rest[0]) if rest else None)
        entry["top_logprobs"] = [_entry(t, lp, raw.get(tid)) for t, lp, tid in top]
        content.append(entry)
    return {"content": content, "refusal": None}


def _bytes_token(raw: list[int]) -> str:
    """A token that is not whole characters, as OpenAI's completions name it: ``bytes:\\xe2\\x80``."""
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class TextOffsets:
    """Where each token's text begins in one choice's text, counted on across the chunks of its
    stream. A token that is part of a UTF-8 character (its bytes in the entry, its text U+FFFD)
    begins at that character and moves the offset only once the character is whole: counting each
    as one character put the offsets of an emoji's three tokens at 0, 1, 2 and every later one past
    its text. The character's bytes so far are kept between chunks: one whose tokens straddle two
    chunks is still one character (a decoder per chunk read its later bytes as U+FFFD each)."""

    def __init__(self, start: int = 0) -> None:
        #: where the text of the tokens counted so far ends
        self.at = start
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def advance(self, items: list[list[Any]]) -> list[int]:
        """Where each of ``items``, the tokens after those counted so far, begins."""
        offsets = []
        for text, _, _, *rest in items:
            offsets.append(self.at)
            raw = dict(rest[2]) if len(rest) > 2 else {}
            own = raw.get(rest[0]) if rest else None
            if own is not None:
                self.at += len(self._decoder.decode(bytes(own)))
            else:  # whole characters (bytes left of a character that never completed: U+FFFD each)
                self.at += len(self._decoder.decode(b"", final=True)) + len(text)
                self._decoder.reset()
        return offsets


def completion_logprobs(
    items: list[list[Any]], offsets: TextOffsets | None = None, as_ids: bool = False
) -> dict[str, Any]:
    """Completions format: parallel lists of tokens, their logprobs, top-k dicts and text offsets
    (counted on from ``offsets``, a stream's choice's so far; else from 0). ``as_ids``: tokens
    named ``token_id:{id}`` (:func:`as_token_ids`); the offsets still count each token's own text.
    A token whose text is not whole characters (a part of a UTF-8 character: U+FFFD alone) is
    named by its bytes, ``bytes:\\xe2\\x80`` as OpenAI's, so such tokens neither read alike nor
    collide as keys of a top-k dict.
    Each top-k dict also holds the token itself (up to k+1 entries, after the k, which keeps them
    in order of logprob), as OpenAI's legacy API and vLLM give it: with ``logprobs: 0`` it is the
    token alone (the dicts were the k most likely only, ``{}`` for 0)."""
    tokens, token_logprobs, top_logprobs = [], [], []
    text_offset = (offsets if offsets is not None else TextOffsets()).advance(items)
    if as_ids:
        items = as_token_ids(items, keep_bytes=False)
    for text, logprob, top, *rest in items:
        raw = dict(rest[2]) if len(rest) > 2 else {}
        own = raw.get(rest[0]) if rest else None
        token = _bytes_token(own) if own is not None else text
        tokens.append(token)
        token_logprobs.append(logprob)
        if logprob is None:  # an echoed prompt's first token has none, and no top ones: null, as OpenAI's
            top_logprobs.append(None)
            continue
        ranked = {(_bytes_token(raw[tid]) if tid in raw else t): lp for t, lp, tid in top}
        # (by id: a token's text in context may differ from its text alone, the top ones')
        if not rest or all(tid != rest[0] for _, _, tid in top):
            ranked.setdefault(token, logprob)
        top_logprobs.append(ranked)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def as_token_ids(entries: list[Any], keep_bytes: bool = True) -> list[Any]:
    """Logprob entries naming each token, and each top token, as ``"token_id:{id}"`` (vLLM's
    return_tokens_as_token_ids); None entries stay None. Without ``keep_bytes`` the entries lose the
    bytes of tokens that are not whole characters (completions name such tokens by them, which the
    ids replace)."""
    return [
        None
        if e is None
        else [
            f"token_id:{e[3]}",
            e[1],
            [[f"token_id:{tid}", lp, tid] for _, lp, tid in e[2]],
            *(e[3:] if keep_bytes else e[3:5]),
        ]
        for e in entries
    ]


def add_token_ids(
    body: dict, choices: list[Choice], prompt_ids: list[list[int] | None], per_choice_prompt: bool
) -> dict:
    """vLLM's return_token_ids on a whole response: each choice's ``token_ids``, and the prompt's
    ``prompt_token_ids`` on each choice (completions: a prompt per choice) or on the response (chat)."""
    for rendered, c in zip(body["choices"], choices, strict=True):
        rendered["token_ids"] = list(c.token_ids)
        if per_choice_prompt:
            rendered["prompt_token_ids"] = prompt_ids[c.index]
    if not per_choice_prompt:
        body["prompt_token_ids"] = prompt_ids[0] if prompt_ids else None
    return body


def prompt_logprobs(entries: list[list[Any] | None], k: int) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token, None for the first (nothing precedes it), else
    ``{token_id: {logprob, rank, decoded_token}}`` for the token itself and then the k most likely
    tokens at its position (the token once if it is among them)."""
    out: list[dict[str, Any] | None] = []
    for entry in entries:
        if entry is None or entry[1] is None:
            out.append(None)
            continue
        text, logprob, top, token_id, rank, *_ = entry
        ranked = {str(token_id): {"logprob": logprob, "rank": rank, "decoded_token": text}}
        for place, (t, lp, tid) in enumerate(top[:k], start=1):
            ranked.setdefault(str(tid), {"logprob": lp, "rank": place, "decoded_token": t})
        out.append(ranked)
    return out


def top_cut(entries: list[list[Any]], k: int) -> list[list[Any]]:
    """``entries`` with at most ``k`` top tokens each (a step's top-k is the most any asked for)."""
    return [[*e[:2], e[2][:k], *e[3:]] for e in entries]


# ------------------------------------------------------------------ OpenAI objects


def finish_reason(choice: Choice) -> str | None:
    # "abort" (/abort_request ended it; vLLM's name) reaches the client; "error" never does as a
    # finish reason: such requests end otherwise.
    return choice.finish_reason if choice.finish_reason in ("stop", "length", "abort") else None


def stop_reason(choice: Choice, stop_token_ids: tuple[int, ...]) -> str | int | None:
    """vLLM's ``stop_reason``: the stop string that ended the choice, or the token id of
    ``stop_token_ids`` that did; None for an end of sequence (eos, a grammar's end), for
    ``length``, and while the choice goes on."""
    matched = choice.matched_stop if choice.finish_reason == "stop" else None
    if isinstance(matched, int) and matched not in stop_token_ids:
        return None  # an eos id
    return matched


def chat_completion(
    rid: str,
    model: str,
    choices: list[Choice],
    prompt_tokens: int,
    with_logprobs: bool,
    new_output: Callable[[], ChoiceOutput] | None = None,
    prompt_logprobs_k: int | None = None,
    stop_token_ids: tuple[int, ...] = (),
    cached_tokens: int = 0,
) -> dict:
    """``new_output()`` makes each choice's parser (reasoning, tool calls); None: plain content.
    With ``prompt_logprobs_k`` the response carries vLLM's ``prompt_logprobs`` (the choices share
    the prompt: the first choice's). ``stop_token_ids``: the request's, for each choice's
    ``stop_reason``; ``cached_tokens``: of ``prompt_tokens``, those the prefix cache held."""
    rendered = []
    for c in choices:
        if new_output is None:
            message, reason = {"role": "assistant", "content": c.text}, finish_reason(c)
        else:
            output = new_output()
            message = output.message(c.text)
            reason = output.finish_reason(finish_reason(c))
        rendered.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": chat_logprobs(c.logprobs) if with_logprobs else None,
                "finish_reason": reason,
                "stop_reason": stop_reason(c, stop_token_ids),
            }
        )
    out = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": rendered,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in choices), cached_tokens),
    }
    if prompt_logprobs_k is not None:
        first = min(choices, key=lambda c: c.index).prompt_logprobs
        out["prompt_logprobs"] = None if first is None else prompt_logprobs(first, prompt_logprobs_k)
    return out


def chat_chunk(rid: str, model: str, created: int, index: int, delta: dict, **extra: Any) -> dict:
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": extra.get("logprobs"),
        "finish_reason": extra.get("finish_reason"),
        "stop_reason": extra.get("stop_reason"),
    }
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def completion(
    rid: str,
    model: str,
    choices: list[Choice],
    prompt_tokens: int,
    with_logprobs: bool,
    prompt_logprobs_k: int | None = None,
    stop_token_ids: tuple[int, ...] = (),
    as_ids: bool = False,
    cached_tokens: int = 0,
) -> dict:
    """With ``prompt_logprobs_k`` each choice carries vLLM's ``prompt_logprobs`` of its prompt.
    ``stop_token_ids``: the request's, for each choice's ``stop_reason``. ``as_ids``: logprobs name
    tokens by id (:func:`completion_logprobs`). ``cached_tokens``: of ``prompt_tokens``, those the
    prefix cache held."""
    rendered = []
    for c in choices:
        choice = {
            "index": c.index,
            "text": c.text,
            "logprobs": completion_logprobs(c.logprobs, as_ids=as_ids) if with_logprobs else None,
            "finish_reason": finish_reason(c),
            "stop_reason": stop_reason(c, stop_token_ids),
        }
        if prompt_logprobs_k is not None:
            choice["prompt_logprobs"] = (
                None if c.prompt_logprobs is None else prompt_logprobs(c.prompt_logprobs, prompt_logprobs_k)
            )
        rendered.append(choice)
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": rendered,
        "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in choices), cached_tokens),
    }


def completion_chunk(rid: str, model: str, created: int, index: int, text: str, **extra: Any) -> dict:
    choice = {
        "index": index,
        "text": text,
        "logprobs": extra.get("logprobs"),
        "finish_reason": extra.get("finish_reason"),
        "stop_reason": extra.get("stop_reason"),
    }
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def usage_chunk(
    rid: str,
    model: str,
    created: int,
    kind: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
) -> dict:
    return {
        "id": rid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
    }


# ------------------------------------------------------------------ native /generate


def generate_result(
    rid: str,
    choice: Choice,
    prompt_tokens: int,
    arrival: float,
    with_logprobs: bool,
    logprob_start_len: int = -1,
    with_text: bool = False,
    cached_tokens: int = 0,
    weight_version: str = "default",
) -> dict:
    """SGLang's /generate answer; ``with_text`` (its return_text_in_logprobs): each logprob
    entry's third item is its token's text, else null. ``cached_tokens``: SGLang's, the prompt
    tokens the prefix cache held. ``weight_version``: SGLang's, the weights that answered
    (/update_weights_from_disk's name for them)."""

    def shown(text: str) -> str | None:
        return text if with_text else None

    meta: dict[str, Any] = {
        "id": rid,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(choice.token_ids),
        "cached_tokens": cached_tokens,
        "finish_reason": _generate_finish(choice),
        "e2e_latency": time.monotonic() - arrival,
        "weight_version": weight_version,
    }
    if with_logprobs:
        # SGLang's layout: (logprob, token_id, text) per position, and the top-k at each position
        meta["output_token_logprobs"] = [[lp, tid, shown(text)] for text, lp, _, tid, *_ in choice.logprobs]
        meta["output_top_logprobs"] = [[[lp, tid, shown(t)] for t, lp, tid in e[2]] for e in choice.logprobs]
        if logprob_start_len >= 0 and choice.prompt_logprobs is not None:
            # the prompt's tokens from logprob_start_len on: the first prompt token's logprob null
            prompt = [e for e in choice.prompt_logprobs[logprob_start_len:] if e is not None]
            meta["input_token_logprobs"] = [[lp, tid, shown(text)] for text, lp, _, tid, *_ in prompt]
            meta["input_top_logprobs"] = [
                None if logprob is None else [[lp, tid, shown(t)] for t, lp, tid in top]
                for _, logprob, top, *_ in prompt
            ]
    return {"text": choice.text, "output_ids": choice.token_ids, "meta_info": meta}


def _generate_finish(choice: Choice) -> dict[str, Any] | None:
    """SGLang's meta_info.finish_reason: ``{"type": "abort", "message": ...}`` for a choice that
    /abort_request ended, else the reason and what matched (a stop string or token id)."""
    if choice.finish_reason is None:
        return None
    if choice.finish_reason == "abort":
        return {"type": "abort", "message": choice.error}
    return {"type": choice.finish_reason, "matched": choice.matched_stop}
