"""Admission: the one place a request is checked against an engine's limits (context length, KV
capacity, vocabulary) and its ``max_tokens`` decided.

The server's tokenizer worker admits with the limits scheduler rank 0 reported in the ready
handshake, the offline ``LLM`` with its engine's (:meth:`Engine.limits`); an engine then trusts
what it is given. Plain Python on purpose: the tokenizer process must start without importing
torch."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from numbers import Integral

from minisgl_core.messages import Limits
from minisgl_core.sampling import INT64_MAX, INT64_MIN, SamplingParams, short_repr
from minisgl_core.setting_names import Spelling
from minisgl_core.token_bans import NoTokenLeft, first_token_left

#: characters one token may stand for when the tokenizer did not say (its longest vocabulary entry,
#: ``tokenizer.load.longest_token_chars``): a prompt over ``context x`` that many characters cannot
#: fit and is refused without tokenizing. Tokenizers pack long runs into one token (SmolLM2-135M's
#: longest entries are 64-81 characters of spaces, dashes, newlines), so the bound must be the
#: vocabulary's own: 16, an average, refused prompts that fit
CHARS_PER_TOKEN = 128
#: tokens tokenized beyond the k kept of a text cut for truncate_prompt_tokens (the cut's effect
#: on a byte-level BPE stays within the first pre-token or two)
TRUNCATION_MARGIN_TOKENS = 16


#: the most characters of a request's cache_salt
MAX_CACHE_SALT_CHARS = 1024


def cache_salt_key(salt: str) -> int:
    """vLLM's ``cache_salt`` as the integer requests carry (``EngineRequest.cache_salt``): a 62-bit
    digest of the text, never 0 (0 is no salt). Requests share prefix-cache entries only with
    requests of the same salt (``Request.cache_key``)."""
    digest = hashlib.blake2b(salt.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 2) | 1


def max_prompt_chars(max_context_len: int, max_token_chars: int | None) -> int:
    """The most characters a text that fits ``max_context_len`` tokens can have."""
    return max_context_len * (max_token_chars or CHARS_PER_TOKEN)


def truncation_tail(text: str, k: int, max_context_len: int, max_token_chars: int | None) -> str:
    """What of a text prompt (or a rendered chat) whose last ``k`` tokens are kept
    (``truncate_prompt_tokens``; -1: the context) needs tokenizing: a text within the bound by
    characters whole, exactly as without truncation; a longer one (refused by that bound without
    it) from its last ``(k + margin) x longest token`` characters only: at least k + margin tokens,
    the last k of which the whole text's tokenization ends with too, short of a tokenizer whose
    cut reaches further back."""
    bound = max_prompt_chars(max_context_len, max_token_chars)
    if len(text) <= bound:
        return text
    k = max_context_len if k == -1 else min(k, max_context_len)
    per_token = max_prompt_chars(1, max_token_chars)
    return text[-min(bound, (k + TRUNCATION_MARGIN_TOKENS) * per_token) :]


class ContextLengthExceeded(ValueError):
    """The prompt and max_tokens do not fit the context length or the KV pool (OpenAI's
    ``context_length_exceeded``)."""


def truncate_prompt(
    prompt_ids: list[int], params: SamplingParams, limits: Limits, default_max_tokens: int | None = None
) -> list[int]:
    """The prompt as ``params.truncate_prompt_tokens`` asks: its last k tokens, or all of it.

    -1 keeps as many as fit beside the output: the context (or the KV pool, if smaller) less
    ``max_tokens``, or less the default an unset ``max_tokens`` takes (``default_max_tokens``). A
    prompt cut to the whole context left no room for a single output token; with neither
    ``max_tokens`` nor a default, a prompt that does not fit is a ContextLengthExceeded naming
    max_tokens (the output would otherwise get whatever the cut happened to leave)."""
    k = params.truncate_prompt_tokens
    if k is None:
        return prompt_ids
    if k == -1:
        room = min(limits.max_context_len, limits.kv_capacity_tokens)
        output = params.max_tokens or default_max_tokens
        if output is None:
            if len(prompt_ids) < room:
                return prompt_ids
            raise ContextLengthExceeded(
                f"the prompt has {len(prompt_ids)} tokens; truncate_prompt_tokens -1 keeps what fits beside "
                f"the output in the context length {limits.max_context_len}, and max_tokens is unset: set "
                "max_tokens"
            )
        # (an output as long as the context leaves no prompt: admission refuses that max_tokens)
        k = max(room - output, 1)
    return prompt_ids[-k:] if len(prompt_ids) > k else prompt_ids


#: token ids the tokenized forms of one request's bad words may hold together (vLLM's bound): the
#: sampler compares every form with the output's last tokens each step
MAX_BAD_WORDS_TOKENS = 1024


def bad_words_token_ids(
    words: tuple[str, ...], encode: Callable[[str], list[int]]
) -> tuple[tuple[int, ...], ...]:
    """The token sequences whose last token ``words`` ban (vLLM's reading of bad_words): each word
    with its leading whitespace stripped, and with one leading space where that is a distinct
    word of as many tokens (another first token: "Paris" and " Paris" mid-sentence). ``encode``
    tokenizes without special tokens. ValueError naming bad_words for a word that gives no token,
    or forms past :data:`MAX_BAD_WORDS_TOKENS` tokens in all."""
    forms: list[tuple[int, ...]] = []
    for i, word in enumerate(words):
        bare = tuple(encode(word.lstrip()))
        if not bare:
            raise ValueError(f"bad_words: word {i} ({word.strip()[:40]!r}) gives no token")
        forms.append(bare)
        spaced = tuple(encode(" " + word.lstrip()))
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            forms.append(spaced)
    total = sum(map(len, forms))
    if total > MAX_BAD_WORDS_TOKENS:
        raise ValueError(
            f"bad_words: their tokenized forms hold {total} tokens, at most {MAX_BAD_WORDS_TOKENS} are "
            "taken; give fewer or shorter words"
        )
    return tuple(forms)


def admit(
    prompt_ids: list[int],
    params: SamplingParams,
    limits: Limits,
    default_max_tokens: int | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> SamplingParams:
    """``params`` with ``max_tokens`` decided, once the request is known to fit; ValueError (the
    message says what to change) when it never can.

    ``max_tokens=None`` becomes what the context leaves, capped by the model's own default
    (``default_max_tokens``, generation_config.json's max_new_tokens): the default caps what the
    context leaves, never the other way round.

    ``bad_words`` are tokenized here, once a request, by ``encode`` (text -> token ids without
    special tokens; the tokenizer worker's or the offline engine's tokenizer), into
    ``bad_words_token_ids``, which travel with the request to every rank."""
    if params.bad_words:
        if encode is None:
            raise ValueError("bad_words need a tokenizer: this admission has none")
        params = params.with_bad_words_token_ids(bad_words_token_ids(params.bad_words, encode))
    if params.max_tokens is None:
        room = unset_max_tokens(len(prompt_ids), limits, default_max_tokens)
        if room < 1:
            raise ContextLengthExceeded(
                f"the prompt has {len(prompt_ids)} tokens and leaves no room for output in the context "
                f"length {limits.max_context_len}; shorten the prompt"
            )
        params = params.with_max_tokens(room)
    if params.min_tokens > params.max_tokens:  # (given ones are checked with the other fields)
        raise ValueError(
            f"min_tokens ({params.min_tokens}) exceeds the {params.max_tokens} output tokens this "
            "request may have (max_tokens left unset: what the context leaves); lower min_tokens"
        )
    stuck = first_token_left(params, limits.eos_token_ids)
    if stuck is not None:  # (refused here, before a stream starts: found later, it ends one)
        raise NoTokenLeft(stuck)
    check_request_fits(
        prompt_ids,
        params,
        vocab_size=limits.vocab_size,
        max_context_len=limits.max_context_len,
        kv_capacity_tokens=limits.kv_capacity_tokens,
    )
    return params


def unset_max_tokens(prompt_len: int, limits: Limits, default_max_tokens: int | None = None) -> int:
    """The ``max_tokens`` a request of ``prompt_len`` tokens that leaves it unset gets: what the
    context (or the KV pool, if smaller) leaves, capped by the model's own default; below 1 when
    the prompt leaves no room."""
    room = min(limits.max_context_len, limits.kv_capacity_tokens) - prompt_len
    return min(room, default_max_tokens or room)


def check_request_fits(
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_context_len: int,
    kv_capacity_tokens: int,
) -> None:
    """Raise ValueError when a request (``max_tokens`` decided) can never run with these limits.

    ``prompt_ids`` are integers: their types are the caller's to check, once (``LLM.encode`` for an
    offline prompt; the server's request schema or its tokenizer for a served one)."""
    assert params.max_tokens is not None, "admit() decides max_tokens first"
    if not prompt_ids:
        raise ValueError("prompt is empty")
    # min and max run in C (a Python loop took 25 ms over the standard offline workload's 143k ids)
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab_size:
        raise ValueError(f"prompt token ids must be integers in [0, {vocab_size})")
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise ValueError(f"stop_token_ids must be integers in [0, {vocab_size}), the model's vocabulary")
    if any(t >= vocab_size for t in params.logit_bias):
        raise ValueError(f"logit_bias token ids must be in [0, {vocab_size})")
    if params.allowed_token_ids is not None and params.allowed_token_ids[-1] >= vocab_size:
        raise ValueError(f"allowed_token_ids must be token ids in [0, {vocab_size}), the model's vocabulary")
    if any(t >= vocab_size for form in params.bad_words_token_ids or () for t in form):
        raise ValueError(f"bad_words: their tokens must be in [0, {vocab_size}), the model's vocabulary")
    if params.reasoning_tag_ids is not None and max(params.reasoning_tag_ids) >= vocab_size:
        raise ValueError(f"reasoning_tag_ids must be token ids in [0, {vocab_size})")
    total = len(prompt_ids) + params.max_tokens
    if total > max_context_len:
        raise ContextLengthExceeded(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
            f"the context length {max_context_len}; shorten the prompt or lower max_tokens"
        )
    if total > kv_capacity_tokens:
        raise ContextLengthExceeded(
            f"prompt + max_tokens = {total} tokens exceeds the KV pool ({kv_capacity_tokens} tokens)"
        )


def check_priority(priority: object, uses_priority: bool, policy: str, spelling: Spelling = "flag") -> int:
    """A request's ``priority`` (vLLM's: lower runs earlier) as an int: ValueError when it is no
    signed 64-bit integer (a bool is none), or not 0 while the scheduling ``policy`` does not order
    requests by priority (``SchedulingPolicy.uses_priority``): it would run in arrival order, not
    the order its client asked for (vLLM refuses it too). ``spelling``: how the fix is written."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, Integral)
        or not INT64_MIN <= priority <= INT64_MAX
    ):
        raise ValueError(
            f"priority must be an integer in [-2**63, 2**63-1] (lower runs earlier), got {short_repr(priority)}"
        )
    priority = int(priority)
    if priority != 0 and not uses_priority:
        if spelling == "flag":
            now = f"this server runs --policy {policy}"
            fix = "start it with --policy priority (vLLM's --scheduling-policy priority)"
        else:
            now = f"this LLM runs policy={policy!r}"
            fix = "create it with policy='priority' (vLLM's scheduling_policy='priority')"
        raise ValueError(
            "a priority other than 0 needs a scheduling policy that orders requests by it: "
            f"{now}; {fix}, or leave priority at 0"
        )
    return priority
