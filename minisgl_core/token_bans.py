"""The tokens a request may not sample at a step (vLLM's ``min_tokens`` and ``bad_words``), whether
a drawn token was one it could draw (``allowed_token_ids`` too), and the error of a request whose
constraints leave none. Plain Python: admission (the tokenizer process, which starts without
torch) checks a request's first step with them, the scheduler each drawn token, the sampler takes
each step's bans from them."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

from minisgl_core.sampling import SamplingParams


def step_bans(params: SamplingParams, output_ids: Sequence[int], eos_ids: Iterable[int]) -> tuple[int, ...]:
    """The token ids a request whose output so far is ``output_ids`` may not sample next: its
    min_tokens' (:func:`min_tokens_ban`) and its bad words' (:func:`bad_words_ban`)."""
    banned = min_tokens_ban(params, len(output_ids), eos_ids)
    if params.bad_words_token_ids:
        banned += bad_words_ban(params.bad_words_token_ids, output_ids)
    return banned


def drawable(params: SamplingParams, output_ids: Sequence[int], token: int, eos_ids: Iterable[int]) -> bool:
    """Whether ``token`` is one the sampler could draw for a request whose output so far is
    ``output_ids``: among its ``allowed_token_ids`` and outside its :func:`step_bans`. A token that
    is not was drawn from a row those left without a finite logit (the sampler then draws an
    arbitrary one): :func:`no_token_left` says why the request ends."""
    allowed = params.allowed_token_ids
    if allowed is not None:
        at = bisect_left(allowed, token)  # (sorted without repeats by SamplingParams)
        if at == len(allowed) or allowed[at] != token:
            return False
    if len(output_ids) < params.min_tokens or params.bad_words_token_ids:
        return token not in step_bans(params, output_ids, eos_ids)
    return True


def own_constraints(params: SamplingParams) -> list[str]:
    """The fields of ``params`` that take tokens out of the sampler's rows besides a grammar."""
    named = {
        "allowed_token_ids": params.allowed_token_ids is not None,
        "min_tokens": params.min_tokens > 0,
        "bad_words": bool(params.bad_words_token_ids),
    }
    return [name for name, present in named.items() if present]


class NoTokenLeft(ValueError):
    """Admission's refusal of a request whose ``allowed_token_ids`` are all banned at its first
    output token (:func:`first_token_left`): the field a server's 400 names."""

    param = "allowed_token_ids"


def first_token_left(params: SamplingParams, eos_ids: Iterable[int]) -> str | None:
    """Admission's look at a request's own constraints: None where its first output token has one
    to draw; else the error (:func:`no_token_left`'s) of a request whose ``allowed_token_ids`` are
    all banned there, by min_tokens (the stop tokens) or one-token bad words. Later steps and a
    grammar are the scheduler's to find (:func:`drawable`): a bad word of several tokens bans its
    last only after the others."""
    allowed = params.allowed_token_ids
    if allowed is None or not set(allowed).issubset(step_bans(params, (), eos_ids)):
        return None
    return no_token_left(params, (), eos_ids, grammar=False)


def step_constraints(params: SamplingParams, output_ids: Sequence[int], eos_ids: Iterable[int]) -> list[str]:
    """The fields of ``params`` that take tokens out of the sampler's row after ``output_ids``:
    allowed_token_ids always; min_tokens and bad_words only where they ban a token at that step
    (min_tokens before its count, a bad word once the output ends with its other tokens)."""
    named = {
        "allowed_token_ids": params.allowed_token_ids is not None,
        "min_tokens": bool(min_tokens_ban(params, len(output_ids), eos_ids)),
        "bad_words": bool(params.bad_words_token_ids)
        and bool(bad_words_ban(params.bad_words_token_ids, output_ids)),
    }
    return [name for name, present in named.items() if present]


def no_token_left(
    params: SamplingParams, output_ids: Sequence[int], eos_ids: Iterable[int], grammar: bool = True
) -> str:
    """The error of a request whose constraints left no token to draw after the output
    ``output_ids`` (a request's own fault: it finishes as "invalid", a 400), naming the fields
    that took part at that step (:func:`step_constraints`); ``grammar``: whether its grammar, if
    it has one, took part."""
    fields = step_constraints(params, output_ids, eos_ids) + (
        ["the grammar"] if grammar and params.grammar else []
    )
    if not fields:  # (none banned here by the rules above: name all the request has)
        fields = own_constraints(params)
    together = fields[0] if len(fields) == 1 else ", ".join(fields[:-1]) + " and " + fields[-1]
    why = {
        "min_tokens": "min_tokens bans the stop tokens until its count",
        "bad_words": "bad_words bans a word's last token right after its other tokens",
        "the grammar": "the grammar is the request's response_format or forced tool call",
    }
    notes = "; ".join(why[f] for f in fields if f in why)
    rule = "rules" if len(fields) == 1 else "rule"
    return (
        f"no token is left to sample after {len(output_ids)} output token(s): {together} {rule} out every "
        "token of the vocabulary there" + (f" ({notes})" if notes else "")
    )


def no_token_left_field(params: SamplingParams, output_ids: Sequence[int], eos_ids: Iterable[int]) -> str:
    """The field the 400 of :func:`no_token_left` names: the first of the request's own constraints
    that took part at that step (allowed_token_ids before min_tokens and bad_words), else
    ``"grammar"`` (the grammar alone ran dry: whatever field set it). Its own constraints before
    the grammar: admission checked that the grammar alone accepts a text and that the allowed ids
    alone leave a first token, so it is the ids (or bans) that take the grammar's tokens away, and
    widening them is the fix that keeps the output's format."""
    fields = step_constraints(params, output_ids, eos_ids)
    if not fields and params.grammar is None:  # (as no_token_left: all the request has)
        fields = own_constraints(params)
    return fields[0] if fields else "grammar"


def bad_words_ban(forms: Sequence[Sequence[int]], output_ids: Sequence[int]) -> tuple[int, ...]:
    """vLLM's bad_words: the last token of each form (a bad word's token sequence) whose other
    tokens the output ends with; a one-token form's always. Only the output counts, not the
    prompt."""
    banned = []
    produced = len(output_ids)
    for form in forms:
        before = len(form) - 1
        if before == 0 or (
            before <= produced and all(output_ids[produced - before + j] == form[j] for j in range(before))
        ):
            banned.append(form[-1])
    return tuple(banned)


def min_tokens_ban(params: SamplingParams, produced: int, eos_ids: Iterable[int]) -> tuple[int, ...]:
    """The token ids a request with ``produced`` output tokens may not sample now: before
    ``min_tokens`` its stop token ids and (unless ``ignore_eos``) the eos ids, else none."""
    if produced >= params.min_tokens:
        return ()
    return tuple(params.stop_token_ids) + (() if params.ignore_eos else tuple(sorted(eos_ids)))
