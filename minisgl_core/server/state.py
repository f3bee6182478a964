"""The API server's link to the worker processes: submitting prompts, routing outputs back, aborting.

A route opens a :class:`RequestGroup` (one HTTP request: one or more prompts, each fanned out to
``n`` engine requests), adds its prompts (each waits for the tokenizer's admission, so a bad prompt
fails the HTTP request synchronously with a 400), names it (:meth:`RequestGroup.name`: the ids
SGLang's /abort_request finds it by), reads the group's token events and closes it; closing aborts
whatever is unfinished, which is how a client that went away frees its KV.

Everything here runs on the API server's event loop; the launcher reaches it only through
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from minisgl_core.messages import (
    STEP_MS,
    AbortRequest,
    Admission,
    ContinueGeneration,
    DetokOutputs,
    FlushCache,
    Message,
    PauseGeneration,
    TokenizeRequest,
    UpdateWeights,
    decode,
)
from minisgl_core.processes.ipc import bind_pull, connect_push, send
from minisgl_core.request_limits import cache_salt_key, check_priority, truncation_tail
from minisgl_core.sampling import SamplingParams
from minisgl_core.server.errors import APIError, respell
from minisgl_core.server.limits import ServerLimits
from minisgl_core.server.metrics import Metrics
from minisgl_core.server.schemas import PAUSE_ABORT_MESSAGE, WEIGHT_UPDATE_ABORT_MESSAGE
from minisgl_core.tokenizer.chat_input import json_strings

logger = logging.getLogger(__name__)

#: how often a call waiting for the scheduler's answer looks whether the server can still serve
ANSWER_POLL_S = 0.5


@dataclass(frozen=True)
class ModelInfo:
    """What the ready handshake told us about the served model."""

    name: str
    path: str
    max_context_len: int
    kv_capacity_tokens: int
    vocab_size: int
    #: the model's sampling defaults (--generation-config) for fields a request leaves unset
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    #: the most characters one token stands for (the tokenizer's longest vocabulary entry; None:
    #: unknown, request_limits.CHARS_PER_TOKEN)
    max_token_chars: int | None = None
    #: more ids a request may send for this model (--served-model-name's later names); answers
    #: carry ``name``
    aliases: tuple[str, ...] = ()
    #: --policy, and whether it orders requests by priority (the scheduler's ready handshake says:
    #: SchedulingPolicy.uses_priority): a request's non-zero ``priority`` is refused unless it does
    policy: str = "prefill-first"
    uses_priority: bool = False

    @property
    def max_model_len(self) -> int:
        """The longest prompt + output one request can have: the context, or the KV pool where it
        holds fewer tokens (--num-kv-tokens), as SGLang caps it."""
        return min(self.max_context_len, self.kv_capacity_tokens)

    def check_name(self, requested: str | None) -> None:
        """A 404 in OpenAI's shape unless ``requested`` (a body's ``model``, a path's id) names
        this model, by name, alias or path; None (left out) does."""
        if requested is not None and requested not in (self.name, self.path, *self.aliases):
            # (cut short: a megabyte of name was echoed back whole)
            shown = repr(requested) if len(requested) <= 200 else repr(requested[:200]) + "..."
            raise APIError(
                404,
                f"the model {shown} does not exist; this server serves {self.name!r}"
                + (f" (also named {', '.join(map(repr, self.aliases))})" if self.aliases else ""),
                "model",
                "model_not_found",
            )


@dataclass(frozen=True)
class TokenEvent:
    """One engine request's progress: its choice index in the group, new token and text."""

    index: int
    token_id: int
    text: str
    finish_reason: str | None
    matched_stop: str | int | None
    #: [token_text, logprob, [[top_text, top_logprob, top_id], ...], token_id, rank] or None (rank:
    #: the token's vocabulary rank), then [[id, bytes], ...] for those of its tokens whose text is
    #: not whole characters (only when there are some)
    logprob: list[Any] | None
    #: the error's message; for finish_reason "abort", the abort's (/abort_request's abort_message)
    error: str | None
    #: with prompt_logprobs, on the first event: one entry per prompt token as ``logprob`` (None
    #: for the first token)
    prompt_logprobs: list[list[Any] | None] | None = None
    #: the HTTP status of an error: 500, or 400 where the engine found the request at fault (503
    #: where a worker died)
    error_status: int = 500
    #: the error's code, where its status has one ("server_unavailable")
    error_code: str | None = None
    #: the request's field a 400 of the engine's names (RequestGroup.field_name), else None
    error_param: str | None = None


@dataclass
class Delta:
    """What one choice gained since its route last looked: usually one token's event, several
    merged when the route fell behind (so a busy server sends fewer, larger chunks instead of
    falling further behind)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Any]] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    #: the error's message, or the abort's (TokenEvent.error)
    error: str | None = None
    #: the HTTP status of ``error`` (TokenEvent.error_status)
    error_status: int = 500
    #: the error's param and code where the server ended the choice (its request's timeout: the
    #: 504's "timeout" and "request_timeout", in a stream too)
    error_param: str | None = None
    error_code: str | None = None
    #: the prompt tokens' logprobs (prompt_logprobs), from the choice's first event
    prompt_logprobs: list[list[Any] | None] | None = None
    #: after each event (one token's), where ``text`` and ``logprobs`` ended: :meth:`tokens`
    token_ends: list[tuple[int, int]] = field(default_factory=list)

    def add(self, ev: TokenEvent) -> None:
        if ev.prompt_logprobs is not None:
            self.prompt_logprobs = ev.prompt_logprobs
        self.text += ev.text
        if ev.token_id >= 0:
            self.token_ids.append(ev.token_id)
        if ev.logprob is not None:
            self.logprobs.append(ev.logprob)
        self.token_ends.append((len(self.text), len(self.logprobs)))
        if ev.finish_reason is not None:
            self.finish_reason, self.matched_stop, self.error = ev.finish_reason, ev.matched_stop, ev.error
            self.error_status, self.error_param, self.error_code = (
                ev.error_status,
                ev.error_param,
                ev.error_code,
            )

    def tokens(self) -> Iterator[tuple[str, list[list[Any]]]]:
        """The text and the logprob entries (none, or the token's one) of each event in turn: the
        delta read token by token, however many events it merged (a delta built whole, without
        events, is one piece)."""
        text_at = logprobs_at = 0
        for text_end, logprobs_end in self.token_ends:
            yield self.text[text_at:text_end], self.logprobs[logprobs_at:logprobs_end]
            text_at, logprobs_at = text_end, logprobs_end
        if text_at < len(self.text) or logprobs_at < len(self.logprobs):
            yield self.text[text_at:], self.logprobs[logprobs_at:]

    def merge(self, later: Delta) -> None:
        """Append what ``later`` (of the same choice) gained."""
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        text_at, logprobs_at = len(self.text), len(self.logprobs)
        if (text_at, logprobs_at) != (self.token_ends[-1] if self.token_ends else (0, 0)):
            self.token_ends.append((text_at, logprobs_at))  # (what came without events: one piece)
        self.token_ends += [(t + text_at, lp + logprobs_at) for t, lp in later.token_ends]
        self.text += later.text
        self.token_ids += later.token_ids
        self.logprobs += later.logprobs
        if later.finish_reason is not None:
            self.finish_reason, self.matched_stop, self.error = (
                later.finish_reason,
                later.matched_stop,
                later.error,
            )
            self.error_status, self.error_param, self.error_code = (
                later.error_status,
                later.error_param,
                later.error_code,
            )


class RequestGroup:
    def __init__(self, state: ServerState, *, probe: bool = False) -> None:
        self.state = state
        #: a health probe's (/health_generate): left out of /metrics, whose request counts,
        #: tokens and latencies are the clients' (a router polls it every few seconds)
        self.probe = probe
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.unfinished: dict[int, int] = {}  # rid -> choice index
        self.prompt_tokens = 0
        #: each choice's prompt tokens, in choice order
        self.choice_prompt_tokens: list[int] = []
        #: each choice's prompt token ids, in choice order, when add() asked for them
        self.choice_prompt_ids: list[list[int] | None] = []
        #: each choice's prompt tokens read from the prefix cache, by choice index (from its
        #: first output: StepOutputs.cached_tokens), and each prompt's choices (first index, n)
        self.choice_cached_tokens: dict[int, int] = {}
        #: with a prediction (OpenAI's Predicted Outputs): each choice's prediction tokens, in
        #: choice order, and those of them its output used, by choice index
        #: (StepOutputs.accepted_predictions); see :meth:`prediction_usage`
        self.choice_prediction_tokens: list[int] = []
        self.choice_accepted_prediction: Counter[int] = Counter()
        self._prompt_choices: list[tuple[int, int]] = []
        self.arrival = time.monotonic()
        self.num_choices = 0
        #: monotonic time the request ends with a timeout error (None: no deadline)
        self.deadline: float | None = None
        self.timed_out = False
        #: sequences the whole request will start, when the route knows them up front
        self.expected_sequences: int | None = None
        #: the request's priority (lower runs earlier), for every engine request it starts
        self.priority = 0
        #: its cache_salt's key (0: none), for every engine request it starts
        self.cache_salt = 0
        #: the ids it is found by in ServerState.named, while it has unfinished choices
        self._names: set[str] = set()
        #: /abort_request ended the whole request (its message): a prompt admitted after that
        #: (a batch's later prompts, admitted one after another) ends as aborted at once
        self.aborted: str | None = None
        #: the field that set each choice's grammar (``add``'s grammar_field), by choice index
        self.choice_grammar_fields: dict[int, str] = {}
        #: SamplingParams' fields each choice's route spells otherwise (``add``'s field_names:
        #: /generate's sampling_params.min_new_tokens), by choice index
        self.choice_field_names: dict[int, dict[str, str]] = {}

    def expect(self, sequences: int, param: str = "n") -> None:
        """Check the whole request's size (prompts x n) against the bounds before any prompt is
        tokenized, so a request too large is refused at once and never half-admitted (``param``:
        the field a refusal blames). A server that cannot take requests says so first: a draining
        one answered a full queue's 429 "retry later" here (a probe)."""
        self.state.check_alive()
        self.state.check_room(0, sequences, param)
        self.expected_sequences = sequences

    def set_timeout(self, timeout_s: float | None) -> None:
        """The request's deadline: its own ``timeout`` field, bounded by the server's --request-timeout."""
        bounds = [t for t in (timeout_s, self.state.limits.request_timeout_s) if t]
        self.deadline = self.arrival + min(bounds) if bounds else None

    def set_cache_salt(self, salt: str | None) -> None:
        """The request's vLLM ``cache_salt`` (None: none), as the key its engine requests carry."""
        self.cache_salt = cache_salt_key(salt) if salt is not None else 0

    def set_priority(self, priority: int, param: str = "priority") -> None:
        """The request's ``priority`` (vLLM's: lower runs earlier); a 400 naming ``param`` when it is
        not 0 and the server's policy does not order requests by it (as vLLM refuses it)."""
        model = self.state.model
        try:
            self.priority = check_priority(priority, model.uses_priority, model.policy)
        except ValueError as exc:
            raise APIError(400, str(exc), param) from None

    async def add(
        self,
        params: SamplingParams,
        n: int = 1,
        *,
        text: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        input_ids: list[int] | None = None,
        max_tokens_field: str = "max_tokens",
        template_args: dict[str, Any] | None = None,
        grammar_field: str = "grammar",
        field_names: dict[str, str] | None = None,
        grammar_parts: list[list[str]] | None = None,
        return_prompt_ids: bool = False,
        default_max_tokens: int | None = None,
        tools_optional: bool = False,
        add_special_tokens: bool = True,
        reasoning_tags: list[str] | None = None,
        prediction: str | None = None,
    ) -> Admission:
        """Tokenize one prompt into ``n`` engine requests; raise a 400 APIError if it cannot run
        (a 429 if the server's queue is full, a 503 if it cannot take requests). With
        ``return_prompt_ids`` the admission carries the prompt's token ids; ``default_max_tokens``
        caps an unset ``max_tokens`` where the model sets no default; ``tools_optional``: a template
        may leave the tools out, ``reasoning_tags``: a grammar applies after the reasoning,
        ``grammar_parts``: the grammar's parts a failed check may name (see TokenizeRequest),
        ``field_names``: SamplingParams' fields the route spells otherwise, for the engine's 400s;
        ``prediction``: OpenAI's predicted output, the speculative drafter's (``prediction_usage``)."""
        state = self.state
        state.check_alive()
        if self.expected_sequences is None:
            state.check_room(self.num_choices, n)
        if params.truncate_prompt_tokens is not None and text is not None:
            text = truncation_tail(
                text, params.truncate_prompt_tokens, state.model.max_context_len, state.model.max_token_chars
            )
        if params.truncate_prompt_tokens is None or messages is None:
            state.check_prompt_size(text, messages, template_args)
        # (else the tokenizer worker cuts the rendered chat as above: the body's size bounds it)
        rids = [next(state.rids) for _ in range(n)]
        first_index = self.num_choices
        self.num_choices += n
        for i, rid in enumerate(rids):
            self.unfinished[rid] = first_index + i
            self.choice_grammar_fields[first_index + i] = grammar_field
            if field_names:
                self.choice_field_names[first_index + i] = field_names
            state.pending[rid] = self
        admission: asyncio.Future[Admission] = asyncio.get_running_loop().create_future()
        state.admissions[rids[0]] = admission
        try:
            request = TokenizeRequest(
                rids, text, messages, input_ids, params, max_tokens_field, template_args, grammar_field,
                return_prompt_ids=return_prompt_ids, default_max_tokens=default_max_tokens,
                tools_optional=tools_optional, add_special_tokens=add_special_tokens,
                reasoning_tags=reasoning_tags, priority=self.priority, cache_salt=self.cache_salt,
                grammar_parts=grammar_parts, prediction=prediction,
            )  # fmt: skip
            send(state.to_tokenizer, request)
            try:  # the deadline holds while the tokenizer worker is busy (or stopped) too
                result = await asyncio.wait_for(admission, self._time_left())
            except asyncio.TimeoutError:
                self.timed_out = True
                raise APIError(504, self._timeout_message(), "timeout", "request_timeout") from None
        except APIError:  # timed out, or the server cannot take it: refused, not served
            self.withdraw()
            raise
        except BaseException:  # cancelled (the client went away), or the request did not encode
            self.close()
            raise
        finally:
            state.admissions.pop(rids[0], None)
        if result.error is not None:
            for rid in rids:
                self.unfinished.pop(rid, None)
                state.pending.pop(rid, None)
            raise APIError(400, result.error, result.param, result.code)
        self.prompt_tokens += result.prompt_len
        self.choice_prompt_tokens += [result.prompt_len] * n
        self.choice_prompt_ids += [result.prompt_ids] * n
        if prediction is not None:
            self.choice_prediction_tokens += [result.prediction_tokens] * n
        self._prompt_choices.append((first_index, n))
        if not self.probe:
            state.metrics.prompt_tokens += result.prompt_len
        if self.aborted is not None:  # (ended while an earlier prompt of it was admitted)
            self.abort(range(first_index, first_index + n), self.aborted)
        return result

    def field_name(self, index: int, name: str | None) -> str | None:
        """The request's field ``name`` (an engine's: a SamplingParams field, ``grammar`` for the
        one that set the grammar) as choice ``index``'s route spelled it (``response_format``,
        ``tool_choice``, ``sampling_params.json_schema``, ``sampling_params.min_new_tokens``...)."""
        if name == "grammar":
            return self.choice_grammar_fields.get(index, name)
        if name is None:
            return None
        return self.choice_field_names.get(index, {}).get(name, name)

    def spelled(self, index: int, message: str) -> str:
        """The engine's ``message`` about choice ``index`` with SamplingParams' field names as its
        route spells them (the engine knows only its own: "min_tokens rule out every token")."""
        names = self.choice_field_names.get(index)
        return respell(message, names) if names else message

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens read from the prefix cache, counted as :attr:`prompt_tokens` counts the
        prompt (once, whatever ``n``): per prompt the least of its choices' figures, the part of it
        no choice computed (so never more than the prompt). A choice with no output yet counts 0."""
        got = self.choice_cached_tokens
        return sum(min(got.get(i, 0) for i in range(first, first + n)) for first, n in self._prompt_choices)

    def prediction_usage(self) -> dict[str, int] | None:
        """OpenAI's ``completion_tokens_details`` of a request with a prediction (None without):
        ``accepted_prediction_tokens``, the prediction's tokens the choices' outputs used (drafts
        the verification accepted, and the target's own token where it went on with the
        prediction); ``rejected_prediction_tokens``, the prediction's other tokens, which the
        outputs did not use. Summed over the choices, each of which had the prediction."""
        if not self.choice_prediction_tokens:
            return None
        accepted = sum(self.choice_accepted_prediction.values())
        return {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(self.choice_prediction_tokens) - accepted,
        }

    async def deltas(self) -> AsyncIterator[Delta]:
        """Every choice's progress until all have finished: one delta per choice for all the events
        that are waiting when the route asks (an error always starts a delta of its own, so the
        text before it still goes out)."""
        open_indices = set(range(self.num_choices))
        while open_indices:
            try:
                events = [await asyncio.wait_for(self.queue.get(), self._time_left())]
            except asyncio.TimeoutError:
                # Past the deadline: free the engine now and end every open choice with the reason.
                self.timed_out = True
                self.close()
                message = self._timeout_message()
                for index in sorted(open_indices):
                    yield Delta(
                        index, finish_reason="error", error=message, error_status=504,
                        error_param="timeout", error_code="request_timeout",
                    )  # fmt: skip
                return
            while not self.queue.empty():
                events.append(self.queue.get_nowait())
            current: dict[int, Delta] = {}
            merged: list[Delta] = []
            for ev in events:
                delta = current.get(ev.index)
                if delta is None or ev.finish_reason == "error":
                    delta = current[ev.index] = Delta(ev.index)
                    merged.append(delta)
                delta.add(ev)
                if ev.finish_reason is not None:
                    open_indices.discard(ev.index)
            for delta in merged:
                yield delta

    def _timeout_message(self) -> str:
        timeout_s = (self.deadline or self.arrival) - self.arrival
        return f"the request did not finish within its timeout of {timeout_s:g}s"

    def _time_left(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def name(self, request_id: str, choices: range | None = None) -> None:
        """Let /abort_request find this request's choices (all, or those of ``choices``: a batch
        prompt's) by ``request_id`` (a client's id, an answer's), until it ends. Called once its
        prompts are admitted; a request that already ended is not named."""
        if not self.unfinished:
            return
        entries = self.state.named.setdefault(request_id, [])
        if (self, choices) not in entries:  # (a batch's rid is also its one sample's answer id)
            entries.append((self, choices))
        self._names.add(request_id)

    def abort(self, choices: range | None, message: str) -> int:
        """/abort_request: stop the unfinished choices (all, or those of ``choices``) in the engine
        and end each here as ``abort`` with what it produced so far and ``message``, counted once in
        /metrics; the engine's late outputs for them are dropped (they are no longer pending). How
        many choices it ended."""
        if choices is None:
            self.aborted = message
        ended = 0
        for rid, index in list(self.unfinished.items()):
            if choices is not None and index not in choices:
                continue
            del self.unfinished[rid]
            if self.state.pending.pop(rid, None) is None:
                continue
            self.state.abort(rid, not self.probe)
            self.queue.put_nowait(TokenEvent(index, -1, "", "abort", None, None, message))
            ended += 1
        if not self.unfinished:
            self.forget_names()
        return ended

    def forget_names(self) -> None:
        """Out of ServerState.named: the request ended (finished, aborted, closed or refused)."""
        named = self.state.named
        for request_id in self._names:
            left = [entry for entry in named.get(request_id, ()) if entry[0] is not self]
            if left:
                named[request_id] = left
            else:
                named.pop(request_id, None)
        self._names.clear()

    def close(self) -> None:
        """Abort the engine requests that have not finished (the client is gone or gave up)."""
        self._abort_unfinished(counted=True)

    def withdraw(self) -> None:
        """The request is refused after some of its prompts were admitted (a later prompt is bad,
        or a field is checked against the prompt's length): abort them in the engine without
        counting them in /metrics as served, neither as aborts nor by their prompt tokens (the
        refusal counts the request once, as rejected)."""
        self._abort_unfinished(counted=False)
        if not self.probe:
            self.state.metrics.prompt_tokens -= self.prompt_tokens

    @contextmanager
    def admitting(self) -> Iterator[None]:
        """Around a route's admission of its prompts one after another: a 400 (or other refusal)
        withdraws the prompts admitted before it (:meth:`withdraw`); anything else (the client
        went away meanwhile, the server failing) aborts them (:meth:`close`)."""
        try:
            yield
        except APIError:
            self.withdraw()
            raise
        except BaseException:
            self.close()
            raise

    def _abort_unfinished(self, counted: bool) -> None:
        for rid in list(self.unfinished):
            if self.state.pending.pop(rid, None) is not None:
                self.state.abort(rid, counted and not self.probe)
        self.unfinished.clear()
        self.forget_names()


class ServerState:
    def __init__(
        self,
        endpoints: Any,
        model: ModelInfo,
        metrics: Metrics | None = None,
        limits: ServerLimits | None = None,
        process_problem: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.endpoints = endpoints
        self.model = model
        self.metrics = metrics or Metrics()
        self.limits = limits or ServerLimits()
        #: a worker process that is stopped or gone, in words (None: all run)
        self.process_problem = process_problem
        #: when scheduler rank 0 last reported (outputs, stats or its idle heartbeat)
        self.last_report_at = time.monotonic()
        #: when the step in flight began, by rank 0's step heartbeat (None: no step in flight, as
        #: its last stats said), and when the engine last sent any request's output
        self.step_began_at: float | None = None
        self.last_output_at = 0.0
        #: set by SIGTERM: new requests get 503 while the in-flight ones finish
        self.draining = False
        #: HTTP requests from their headers to the end of their answer (app.CountOpenRequests)
        self.open_requests = 0
        self.rids = itertools.count()
        self.pending: dict[int, RequestGroup] = {}
        #: the ids /abort_request finds requests by (RequestGroup.name) -> each named group and
        #: which of its choices (None: all); ids may repeat across requests (a client's)
        self.named: dict[str, list[tuple[RequestGroup, range | None]]] = {}
        self.admissions: dict[int, asyncio.Future[Admission]] = {}
        #: /flush_cache calls waiting for the scheduler's answer, by FlushCache.token
        self.flushes: dict[int, asyncio.Future[int]] = {}
        self._flush_tokens = itertools.count()
        #: /update_weights_from_disk, /pause_generation and /continue_generation calls waiting for
        #: the scheduler's answer ("" when done, else why not), by their message's token
        self.answers: dict[int, asyncio.Future[str]] = {}
        self._updating_weights = asyncio.Lock()
        self._pausing = asyncio.Lock()
        #: /pause_generation's mode while generation is paused, else None
        self.paused: str | None = None
        #: the served weights' name and trainer step (SGLang's; /update_weights_from_disk sets them)
        self.weight_version = "default"
        self.token_step = 0
        self.last_token_at: dict[int, float] = {}
        #: set when a worker process died; every request then fails with 503
        self.failure: str | None = None
        self.created = int(time.time())
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.sync_ctx = zmq.Context()
        # A plain socket: sends never block (no high-water mark), so sync code such as close() can send.
        self.to_tokenizer = connect_push(self.sync_ctx, self.endpoints.tokenizer)
        self.async_ctx = zmq.asyncio.Context()
        self.inbox = bind_pull(self.async_ctx, self.endpoints.api)
        self._task = asyncio.create_task(self._receive_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.fail("the server is shutting down")
        self.inbox.close(linger=0)
        self.async_ctx.term()
        self.to_tokenizer.close()
        self.sync_ctx.term()

    def check_alive(self) -> None:
        if self.failure is not None:
            raise APIError(503, f"the server cannot take requests: {self.failure}", code="server_unavailable")
        if self.draining:
            message = "the server is shutting down and takes no new requests"
            raise APIError(503, message, code="server_unavailable")

    def check_room(self, sequences_so_far: int, n: int, param: str = "n") -> None:
        """Refuse a prompt whose ``n`` sequences would pass the per-request or the server's bound
        (a 400 blaming ``param``: ``n``, or ``prompt`` where the prompts alone are too many)."""
        limits = self.limits
        if sequences_so_far + n > limits.max_sequences_per_request:
            raise APIError(
                400,
                f"the request asks for {sequences_so_far + n} or more sequences (prompts x n); "
                f"this server runs at most {limits.max_sequences_per_request} per request",
                param,
                "too_many_sequences",
            )
        if sequences_so_far + n > limits.max_queued_sequences:  # a 429 would never turn into room
            raise APIError(
                400,
                f"the request asks for {sequences_so_far + n} or more sequences (prompts x n); this "
                f"server queues at most {limits.max_queued_sequences} (--max-queued-requests)",
                param,
                "too_many_sequences",
            )
        if len(self.pending) + n > limits.max_queued_sequences:
            raise APIError(
                429,
                f"the server is at capacity ({len(self.pending)} sequences queued or running); retry later",
                code="server_overloaded",
                headers={"Retry-After": str(self.retry_after_s())},
            )

    def retry_after_s(self) -> int:
        return 1

    def check_prompt_size(
        self,
        text: str | None,
        messages: list[dict[str, Any]] | None,
        template_args: dict[str, Any] | None = None,
    ) -> None:
        """Refuse a prompt that cannot fit the context by its length in characters, before the
        tokenizer spends seconds on it (and every other request waits): every string of the
        messages (content parts, tool calls) and of the chat template's arguments (tools,
        chat_template_kwargs) counts, as the template may render any of them."""
        chars = sum(map(len, json_strings([text, messages, template_args])))
        bound = self.limits.max_prompt_chars(self.model.max_context_len, self.model.max_token_chars)
        if chars > bound:
            raise APIError(
                400,
                f"the prompt has {chars} characters, more than can fit the context length of "
                f"{self.model.max_context_len} tokens (at most {bound} characters); shorten it",
                "messages" if messages is not None else "prompt",
                "context_length_exceeded",
            )

    def health(self) -> str | None:
        """Why the server is not healthy, or None: a failed or stopped worker, draining, or an
        engine that stopped reporting (rank 0 sends a heartbeat every second even when idle)."""
        if self.failure is not None:
            return self.failure
        if self.draining:
            return "the server is shutting down"
        if (problem := self.process_problem()) is not None:
            return problem
        silent, bound = time.monotonic() - self.last_report_at, self.limits.health_timeout_s
        if silent > bound:
            return f"the scheduler has not reported for {silent:.1f}s (bound {bound:g}s)"
        return None

    def serving_problem(self) -> str | None:
        """Why the engine cannot serve now, or None: :meth:`health`'s reasons, or one step running
        past --step-timeout (stuck in it: the step heartbeat still reports, so /health stays 200,
        as vLLM's asks only whether the engine lives). A step shorter than that is a busy server,
        however long (a CPU prefill of thousands of tokens takes minutes)."""
        if (problem := self.health()) is not None:
            return problem
        bound = self.limits.step_timeout_s
        if (
            bound
            and self.step_began_at is not None
            and (ran := time.monotonic() - self.step_began_at) > bound
        ):
            return f"one scheduler step has run for {ran:.0f}s, past --step-timeout ({bound:g}s)"
        return None

    def busy_since(self, since: float) -> bool:
        """Whether the engine has shown since ``since`` that it works on other requests: a step in
        flight (shorter than --step-timeout), or some request's output."""
        return self.step_began_at is not None or self.last_output_at > since

    def abort(self, rid: int, counted: bool = True) -> None:
        """Stop engine request ``rid``; ``counted``: a finish by abort in /metrics (the client went
        away), not a request refused after admission."""
        if counted:
            self.metrics.finished["abort"] += 1
        self.last_token_at.pop(rid, None)
        if not self.to_tokenizer.closed:  # streams cancelled at shutdown close their groups late
            send(self.to_tokenizer, AbortRequest(rid))

    def abort_requests(self, request_id: str | None, message: str) -> int:
        """SGLang's /abort_request: end the requests named ``request_id`` (RequestGroup.name), or
        every unfinished one for None (but /health_generate's probes), each choice with what it
        produced so far and finish reason ``abort``; how many choices it ended (0 for an unknown
        id, as SGLang ignores one)."""
        if request_id is None:
            groups = dict.fromkeys(group for group in self.pending.values() if not group.probe)
            entries: list[tuple[RequestGroup, range | None]] = [(group, None) for group in groups]
        else:
            entries = list(self.named.get(request_id, ()))
        return sum(group.abort(choices, message) for group, choices in entries)

    async def flush_cache(self) -> int:
        """Empty the engine's prefix cache: the number of cached tokens freed. A 400 while
        requests are running or waiting (their prefixes are in use), 503 when the server cannot
        serve (:meth:`serving_problem`), before or while it waits for the scheduler's answer."""
        self.check_serving("flush its cache")
        token = next(self._flush_tokens)
        fut: asyncio.Future[int] = self.loop.create_future()
        self.flushes[token] = fut
        send(self.to_tokenizer, FlushCache(token))
        try:
            freed = await self._answered(fut, "the cache may be flushed")
        finally:
            self.flushes.pop(token, None)
        if freed < 0:
            raise APIError(
                400,
                "the prefix cache was not flushed: requests are running or waiting; flush when the "
                "server is idle",
                code="server_busy",
            )
        return freed

    async def update_weights(
        self, model_path: str, flush_cache: bool, abort_all: bool, keep_pause: bool = False
    ) -> int:
        """Load new weights for the served model from ``model_path`` (/update_weights_from_disk)
        once no request runs or waits: those running finish first (with ``abort_all`` they end
        now, as by /abort_request), and those arriving meanwhile wait for the new weights. How
        many choices it aborted. A 400 naming ``model_path`` when no rank could take the weights
        (the old ones serve on), 503 when the server cannot serve. Calls run one at a time."""
        async with self._updating_weights:
            self.check_serving("update its weights")
            aborted = self.abort_requests(None, WEIGHT_UPDATE_ABORT_MESSAGE) if abort_all else 0
            token = next(self._flush_tokens)
            update = UpdateWeights(token, model_path, flush_cache, keep_pause)
            error = await self._answer(token, update, "the weights may be updated")
            if keep_pause and not error:
                self.paused = self.paused or "in_place"
        if error:
            raise APIError(400, f"the weights were not updated: {error}", "model_path", "weights_not_updated")
        return aborted

    async def _answer(self, token: int, msg: Message, later: str) -> str:
        """Send ``msg`` down to the scheduler and wait for its answer under ``token``
        (:meth:`_answered`)."""
        fut: asyncio.Future[str] = self.loop.create_future()
        self.answers[token] = fut
        send(self.to_tokenizer, msg)
        try:
            return await self._answered(fut, later)
        finally:
            self.answers.pop(token, None)

    async def _answered(self, fut: asyncio.Future, later: str) -> Any:
        """The scheduler's answer in ``fut``, however long the step in flight keeps it (it reads
        messages between steps): a busy server answers late, never with an error, as SGLang and
        vLLM wait for theirs (a 504 past the health bound said the action would happen anyway, and
        a client retrying it applied it twice). A 503 once the server cannot serve
        (:meth:`serving_problem`), saying ``later`` once the scheduler reads the message."""
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(fut), ANSWER_POLL_S)
            except TimeoutError:
                if (problem := self.serving_problem()) is not None:
                    raise APIError(
                        503,
                        f"the scheduler did not answer: {problem}; {later} once it reads the message",
                        code="server_unavailable",
                    ) from None

    def check_serving(self, action: str) -> None:
        """A 503 saying the server cannot do ``action`` now (:meth:`serving_problem`)."""
        if (problem := self.serving_problem()) is not None:
            raise APIError(503, f"the server cannot {action}: {problem}", code="server_unavailable")

    async def pause_generation(self, mode: str) -> int:
        """SGLang's /pause_generation: the engine stops stepping once its step in flight has
        landed; requests arriving meanwhile wait (they are accepted, and run after
        /continue_generation). ``abort`` first ends every unfinished request as /abort_request
        does; ``retract`` gives the running ones' KV back, to be computed again; ``in_place``
        keeps it. How many choices it aborted. 503 when the server cannot serve, before or while it
        waits for the scheduler's answer (:meth:`_answered`)."""
        async with self._pausing:
            self.check_serving("pause generation")
            aborted = self.abort_requests(None, PAUSE_ABORT_MESSAGE) if mode == "abort" else 0
            token = next(self._flush_tokens)
            try:
                await self._answer(token, PauseGeneration(token, mode), "generation pauses")
            finally:  # sent: the engine pauses, answered or not (a 503), so a drain continues it
                if self.paused is None or mode == "retract":
                    self.paused = mode
        return aborted

    async def continue_generation(self) -> None:
        """SGLang's /continue_generation: the engine steps again, and the requests that arrived
        while it was paused run (nothing done while it is not paused)."""
        async with self._pausing:
            self.check_serving("continue generation")
            token = next(self._flush_tokens)
            try:
                await self._answer(token, ContinueGeneration(token), "generation continues")
            finally:  # sent: the engine goes on, answered or not
                self.paused = None

    def start_draining(self) -> None:
        """SIGTERM: new requests get 503 while the accepted ones finish; paused generation
        continues, so that they can."""
        self.draining = True
        if self.paused is not None and self.failure is None:
            self.paused = None
            send(self.to_tokenizer, ContinueGeneration(next(self._flush_tokens)))

    def fail(self, message: str) -> None:
        """A worker died: end every waiting request with an error instead of letting it hang."""
        if self.failure is None:
            self.failure = message
        for fut in [*self.admissions.values(), *self.flushes.values(), *self.answers.values()]:
            if not fut.done():
                fut.set_exception(APIError(503, message, code="server_unavailable"))
        for rid, group in list(self.pending.items()):
            group.queue.put_nowait(
                TokenEvent(
                    group.unfinished.get(rid, 0),
                    -1,
                    "",
                    "error",
                    None,
                    None,
                    message,
                    error_status=503,
                    error_code="server_unavailable",
                )  # fmt: skip
            )
        self.pending.clear()
        self.named.clear()

    # ------------------------------------------------------------------ outputs

    async def _receive_loop(self) -> None:
        while True:
            msg = decode(await self.inbox.recv())
            if isinstance(msg, Admission):
                fut = self.admissions.get(msg.rid)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, DetokOutputs):
                self._dispatch(msg)

    def _dispatch(self, out: DetokOutputs) -> None:
        now = self.last_report_at = time.monotonic()
        if out.stats is not None:
            self.metrics.engine = out.stats
            step_ms = out.stats.get(STEP_MS)
            self.step_began_at = None if step_ms is None else now - step_ms / 1000
        if out.rids:
            self.last_output_at = now
        m = self.metrics
        for token, freed in out.flushed:
            fut = self.flushes.get(token)
            if fut is not None and not fut.done():
                fut.set_result(freed)
        for token, error in out.answers:
            answer = self.answers.get(token)
            if answer is not None and not answer.done():
                answer.set_result(error)
        for rid, cached in out.cached_tokens:  # (before the outputs: a first output may be the last)
            group = self.pending.get(rid)
            if group is not None:
                group.choice_cached_tokens[group.unfinished.get(rid, 0)] = cached
        for rid, used in out.accepted_predictions:  # (before the outputs: the step may end it)
            group = self.pending.get(rid)
            if group is not None:
                group.choice_accepted_prediction[group.unfinished.get(rid, 0)] += used
        error_params = dict(out.error_params) if out.error_params else {}
        for i, rid in enumerate(out.rids):
            group = self.pending.get(rid)
            if group is None:  # aborted or failed meanwhile
                continue
            token, reason = out.token_ids[i], out.finish_reasons[i]
            status, param, error = 500, None, out.errors[i]
            index = group.unfinished.get(rid, 0)
            if reason == "invalid":  # the engine found the request at fault: an error, a 400
                reason, status = "error", 400
                param = group.field_name(index, error_params.get(rid))
                error = group.spelled(index, error) if error else error
            counted = not group.probe
            if token >= 0 and counted:
                m.generation_tokens += 1
                last = self.last_token_at.get(rid)
                if last is None:
                    m.ttft.observe(now - group.arrival)
                else:
                    m.itl.observe(now - last)
                self.last_token_at[rid] = now
            if reason is not None:
                del self.pending[rid]
                group.unfinished.pop(rid, None)
                if not group.unfinished:
                    group.forget_names()
                self.last_token_at.pop(rid, None)
                if counted:
                    m.finished[reason] += 1
                    m.e2e.observe(now - group.arrival)
            group.queue.put_nowait(
                TokenEvent(
                    index,
                    token,
                    out.texts[i],
                    reason,
                    out.matched_stops[i],
                    out.logprobs[i],
                    error,
                    out.prompt_logprobs[i],
                    status,
                    error_param=param,
                )  # fmt: skip
            )
