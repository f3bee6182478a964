"""A request's state inside the scheduler."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from minisgl_core.api import RequestView
from minisgl_core.runner.sampler import SampleRequest
from minisgl_core.sampling import SamplingParams
from minisgl_core.token_bans import own_constraints

#: Request.reasoning: no output token yet, and the reasoning's start tag may open the output
OPENING = "opening"
#: Request.reasoning: inside the reasoning (from its start tag through its end tag)
REASONING = "reasoning"


#: Request.cache_key: an odd multiplier (the golden ratio's 64 bits) maps the 62-bit salts to
#: distinct values for any one token id
_SALT_MULTIPLIER = 0x9E3779B97F4A7C15
_SALT_MASK = (1 << 62) - 1

_new_tuple = tuple.__new__


@dataclass(eq=False)
class Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int
    #: the client's priority (vLLM's: lower runs earlier), for policies that use it (RequestView)
    priority: int = 0
    #: its vLLM cache_salt's key (0: none): see :meth:`cache_key`
    cache_salt: int = 0
    #: OpenAI's Predicted Outputs: the tokens the client expects the output to be mostly, which
    #: the speculative drafter proposes from (scheduler/speculative.py); never changes the output
    prediction_ids: list[int] | None = None
    output_ids: list[int] = field(default_factory=list)
    #: row of the page table; None until admitted
    row: int | None = None
    #: cache handle locked for the reused prefix, and that prefix's slots (positions [0, prefix_len))
    prefix_handle: Any = None
    prefix_slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    prefix_len: int = 0
    #: pages this request owns, covering positions prefix_len, prefix_len + page_size, ...
    pages: list[int] = field(default_factory=list)
    #: tokens whose KV is in the pool (prefix + prefilled chunks + decoded tokens)
    num_computed: int = 0
    generator: torch.Generator | None = None
    #: per-request stop-string window, in tokens
    stop_window: int = 0
    #: (another request's prefix_slots, how many leading slots this one shares with it), see
    #: :mod:`minisgl_core.scheduler.cascade`
    shared_prefix_memo: tuple[torch.Tensor, int] | None = None
    #: (prefix_slots, its first slot as an int)
    first_slot_memo: tuple[torch.Tensor, int] | None = None

    #: the request's GrammarMatcher when its output is constrained (see engine/grammar.py)
    matcher: Any = None
    #: set when the grammar rejected a sampled token, or the token was drawn from a row that the
    #: request's constraints left empty (allowed_token_ids, bans, grammar): it finishes with an error
    grammar_error: str | None = None
    #: the request is at fault (its grammar accepts no text, its constraints leave no token): it
    #: finishes as "invalid" (a 400), not "error"
    grammar_invalid: bool = False
    #: with ``grammar_invalid``: the field at fault, which the 400 names as its param (a
    #: SamplingParams field: ``allowed_token_ids``..., or ``grammar`` for the field that set it)
    error_param: str | None = None
    #: the matcher's is_terminated() after its last accepted token, kept by the engine's grammar
    #: runner: the scheduler reads this, never the matcher, which a fill thread may be using
    grammar_terminated: bool = False
    #: tokens the matcher has accepted (ahead of ``output_ids`` by the step in flight, with overlap)
    grammar_tokens: int = 0
    #: with ``params.reasoning_tag_ids``, where the output is in the engine's grammar runner's
    #: eyes (ahead of ``output_ids`` as grammar_tokens is): OPENING until the first token (the
    #: reasoning's start tag or the grammar's first token), REASONING from the start tag (from
    #: the first token where the prompt opened the reasoning) through the end tag (free; the
    #: matcher is not asked), then None: the grammar applies
    reasoning: str | None = None

    #: tokens whose KV must exist before the next token is sampled: the prompt, and after a
    #: retraction the prompt plus the output so far (recomputed, mostly from the prefix cache)
    fill_ids: list[int] = field(default_factory=list)

    #: with ``params.prompt_logprobs``: those of the prompt tokens computed so far (the first None),
    #: and whether they went out with the first output
    prompt_logprobs: list[Any] | None = None
    prompt_logprobs_sent: bool = False

    #: prompt tokens whose KV the request read from the prefix cache and never computed itself,
    #: as its first output reports them (the API's ``cached_tokens``): the prefix its admission
    #: matched, within the prompt; the least of its admissions before its first token (a prompt
    #: set back mid-prefill computes again what the cache evicted meanwhile). A retraction after
    #: the first token changes nothing: what it computes again is the engine's cost, not a miss.
    #: None until admitted
    cached_prompt_tokens: int | None = None

    #: ``params.allowed_token_ids`` on the sampler's device, made on first use
    #: (:meth:`allowed_ids_on`)
    allowed_ids: torch.Tensor | None = None

    #: whether its params take tokens out of its sampler rows besides a grammar
    #: (allowed_token_ids, min_tokens, bad_words: :func:`~minisgl_core.token_bans.own_constraints`):
    #: only then are a step's bans made and a drawn token checked against them. Read once (the
    #: params never change): asked every step of every request, the calls cost more than the answer
    has_own_constraints: bool = field(init=False, default=False)
    #: whether its sampling reads its newest output tokens on the host (:func:`needs_host_outputs`)
    needs_host_outputs: bool = field(init=False, default=False)
    #: what the sampler reads of it without constraints of its own, kept (:meth:`sample_request`)
    _sample_request: SampleRequest | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.has_own_constraints = bool(own_constraints(self.params))
        self.needs_host_outputs = needs_host_outputs(self.params)
        if not self.fill_ids:
            self.fill_ids = self.prompt_ids
        if self.params.reasoning_tag_ids is not None and self.params.grammar is not None:
            self.reasoning = REASONING if self.params.reasoning_opened else OPENING
        if self.params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    def allowed_ids_on(self, device: torch.device) -> torch.Tensor | None:
        """``params.allowed_token_ids`` as a tensor on ``device`` (what the sampler indexes the
        logits with), made once for the request: made every step, 24,576 ids took 0.35 ms of host
        time a request a step; None without the field."""
        allowed = self.params.allowed_token_ids
        if allowed is None:
            return None
        if self.allowed_ids is None or self.allowed_ids.device != device:
            self.allowed_ids = torch.tensor(allowed, dtype=torch.int64, device=device)
        return self.allowed_ids

    def sample_request(self) -> SampleRequest:
        """What the sampler reads of this request when it has no constraints of its own (no bans
        nor allowed ids: ``has_own_constraints`` is False), made once and kept while its generator
        is the request's: the scheduler gives a seeded request its own when it is added. Its params,
        prompt and output list are the request's for its whole life (the output grows in place,
        which the kept one reads as it is). Made for every request of every step, one cost
        0.4 µs of host time on the dev CPU."""
        made = self._sample_request
        if made is None or made.generator is not self.generator:
            made = self._sample_request = SampleRequest(
                self.params, self.output_ids, self.generator, self.prompt_ids
            )
        return made

    @property
    def scores_prompt(self) -> bool:
        """Whether prompt tokens' logprobs (``params.prompt_logprobs``) are still to compute: then
        the prompt is prefilled whole, without the prefix cache (a retraction after they were
        computed reuses it as usual)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.prompt_len

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def fill_len(self) -> int:
        return len(self.fill_ids)

    @property
    def remaining_output(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    @property
    def admitted(self) -> bool:
        return self.row is not None

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def cache_key(self, tokens: list[int]) -> list[int]:
        """``tokens`` (the start of this request's own) as the prefix cache's key. Without a
        cache salt, the tokens; with one (vLLM's ``cache_salt``), the first is replaced by a
        negative number made of the salt and that token, which no token id equals and another
        salt gives for no token. Every entry hangs below the first page, so requests share
        entries only with requests of the same salt: a client cannot tell from the speed of
        its answers what others with other salts asked."""
        if not self.cache_salt or not tokens:
            return tokens
        mixed = (self.cache_salt * _SALT_MULTIPLIER + tokens[0]) & _SALT_MASK
        return [-1 - mixed, *tokens[1:]]

    def view(self) -> RequestView:
        return views((self,))[0]


def views(reqs: Iterable[Request]) -> list[RequestView]:
    """What a scheduling policy sees of each of ``reqs`` (the one place a RequestView is made).
    Built for every request every step: one comprehension, positional, no properties, and no call
    of the NamedTuple's Python-level ``__new__`` (the same tuple, made by ``tuple.__new__`` as that
    makes it)."""
    return [
        _new_tuple(RequestView, (
            r.rid, r.arrival, len(r.fill_ids), r.num_computed, (out := len(r.output_ids)),
            r.params.max_tokens - out, r.priority,
        ))
        for r in reqs
    ]  # fmt: skip


def needs_host_outputs(params: SamplingParams) -> bool:
    """Whether sampling for a request reads its newest output tokens on the host (penalties,
    min_tokens, which bans stop tokens by how many there are, and bad_words, which ban a word's
    last token after its others): with overlap, the engine lands the step in flight before it
    plans one with such a request. repetition_penalty was left out: under overlap its newest token
    went unpenalised, and greedy output differed from overlap off and from speculative decoding."""
    return bool(
        params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
        or params.min_tokens
        # (the words' token ids: admission's, or given as they are, which bad_words may leave empty)
        or params.bad_words_token_ids
    )
