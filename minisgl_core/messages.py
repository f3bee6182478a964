"""The typed messages the server's processes exchange, and their msgpack wire format (never pickle).

Each message is a small dataclass of plain values (ints, strings, lists, dicts), so it encodes as
``[tag, field1, field2, ...]`` with msgpack and decodes back into the same class. Token ids travel
as lists of ints; a request's :class:`~minisgl_core.sampling.SamplingParams`, validated once where
the request entered, travels as its field values and is rebuilt without a second check. Who sends
what:

    API server  ──TokenizeRequest / AbortRequest / FlushCache / UpdateWeights / PauseGeneration /
                ContinueGeneration / Shutdown──▶ tokenizer
    tokenizer   ──Admission──▶ API server          (accepted with its prompt length, or rejected)
    tokenizer   ──EngineRequest, and the API server's other messages as they came──▶ scheduler rank 0
    scheduler 0 ──StepOutputs / Shutdown──▶ detokenizer  (a new request's stop strings and
                                                       skip_special_tokens ride with the step
                                                       that received it, before its first token)
    detokenizer ──DetokOutputs──▶ API server
    launcher    ──Limits──▶ tokenizer               (the engine's limits, from the ready handshake)
    every child ──ProcessReady / ProcessFailed──▶ launcher
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import msgpack

from minisgl_core.sampling import SamplingParams

#: a token's logprob on the wire: [token_id, logprob, [[top_id, top_logprob], ...], rank] (rank:
#: the token's vocabulary rank, or None)
WireLogprob = list[Any]


@dataclass
class Message:
    tag: ClassVar[int] = -1


@dataclass
class Limits(Message):
    """What every request must fit in; the tokenizer checks requests against it."""

    tag: ClassVar[int] = 1
    max_context_len: int
    kv_capacity_tokens: int
    vocab_size: int
    #: the ids that end the model's generation, as the engine read them (grammars may stop on them)
    eos_token_ids: list[int] = field(default_factory=list)


@dataclass
class TokenizeRequest(Message):
    """One prompt to tokenize, fanned out to ``len(rids)`` engine requests (OpenAI's ``n``)."""

    tag: ClassVar[int] = 2
    rids: list[int]
    #: exactly one of text / messages / input_ids is set
    text: str | None
    messages: list[dict[str, Any]] | None
    input_ids: list[int] | None
    #: validated by the API server; ``max_tokens`` None = whatever the context has left
    params: SamplingParams
    #: the API field that set max_tokens, named in length errors
    max_tokens_field: str = "max_tokens"
    #: extra chat-template variables with ``messages``: ``tools`` and the request's chat_template_kwargs
    #: (and ``chat_template``, the request's own Jinja template, where the server trusts it)
    template_args: dict[str, Any] | None = None
    #: the API field that set the grammar (params["grammar"]), named in grammar errors
    grammar_field: str = "grammar"
    #: the Admission carries the prompt's token ids back (vLLM's return_token_ids)
    return_prompt_ids: bool = False
    #: the endpoint's own cap for ``max_tokens`` left unset where the model sets none (16 on
    #: /v1/completions, OpenAI's legacy default); None: what the context leaves
    default_max_tokens: int | None = None
    #: the request cannot call its ``tools`` (tool_choice "none"): a chat template that does not
    #: render them is fine, they are context only; one that can call them must see them rendered
    tools_optional: bool = False
    #: a ``text`` prompt is encoded with the tokenizer's special tokens (its BOS, as vLLM's and
    #: SGLang's completions do); ``messages`` never (the chat template writes them)
    add_special_tokens: bool = True
    #: the reasoning parser's start and end tags: whether the prompt opened the reasoning comes back
    #: (``Admission.reasoning_opened``), and with a grammar, the grammar applies after the
    #: reasoning (``SamplingParams.reasoning_tag_ids``, set by the tokenizer worker where both tags
    #: are single tokens and the prompt does not close the reasoning itself)
    reasoning_tags: list[str] | None = None
    #: the request's priority (vLLM's: lower runs earlier), checked by the API server against the
    #: policy; passed on to each EngineRequest. Not a sampling parameter: it orders the requests,
    #: the tokens are the same (last, so an encoding without it reads as priority 0)
    priority: int = 0
    #: vLLM's cache_salt as its key (``request_limits.cache_salt_key``; 0: none), passed on to each
    #: EngineRequest (an encoding without it reads as 0)
    cache_salt: int = 0
    #: [API field, what it is, JSON schema] of each part of the grammar that another field of the
    #: request gave (a forced tool call's grammar: each function's parameters). When the whole
    #: grammar fails its check, the first part that fails alone is named, not ``grammar_field``
    grammar_parts: list[list[str]] | None = None
    #: OpenAI's Predicted Outputs: the text the client expects the output to be, mostly; tokenized
    #: (no special tokens) onto each EngineRequest for the speculative drafter
    prediction: str | None = None


@dataclass
class Admission(Message):
    """The tokenizer's answer to a TokenizeRequest, keyed by its first rid."""

    tag: ClassVar[int] = 3
    rid: int
    prompt_len: int
    max_tokens: int
    #: set when the request is rejected; nothing was sent to the scheduler then
    error: str | None = None
    param: str | None = None
    #: the prompt's token ids, when the TokenizeRequest asked for them
    prompt_ids: list[int] | None = None
    #: the error's code in OpenAI's shape (``context_length_exceeded``), if it has one
    code: str | None = None
    #: the prompt opened the reasoning (TokenizeRequest.reasoning_tags): the output begins inside it
    reasoning_opened: bool = False
    #: the request has a grammar and names reasoning tags: the answer is the grammar's text exactly,
    #: whitespace included. The grammar applies after the reasoning's end tag where the engine can
    #: wait for it (``SamplingParams.reasoning_tag_ids`` set), else from the output's first token
    #: (the prompt closed the reasoning, or the tags are not single tokens of the tokenizer); either
    #: way an output that does not open the reasoning itself is the grammar's answer whole
    grammar_answer: bool = False
    #: the tokens of TokenizeRequest.prediction (0: none): the usage's rejected_prediction_tokens
    #: are those of them the output did not use
    prediction_tokens: int = 0


@dataclass
class EngineRequest(Message):
    tag: ClassVar[int] = 4
    rid: int
    prompt_ids: list[int]
    #: admitted: max_tokens resolved and checked against the engine's limits
    params: SamplingParams
    #: TokenizeRequest.priority (an encoding without it reads as 0)
    priority: int = 0
    #: TokenizeRequest.cache_salt (an encoding without it reads as 0)
    cache_salt: int = 0
    #: TokenizeRequest.prediction's tokens (None: no prediction)
    prediction_ids: list[int] | None = None


@dataclass
class AbortRequest(Message):
    tag: ClassVar[int] = 5
    rid: int


@dataclass
class CompilesSettled(Message):
    """Rank 0 to every rank: admit the requests whose grammar compile has ended (``done``) and
    drop those that waited too long for theirs (``overdue``), in this step (Engine.admit_compiled)."""

    tag: ClassVar[int] = 12
    done: list[int]
    overdue: list[int]


@dataclass
class FlushCache(Message):
    """Empty the prefix cache (``/flush_cache``), on every rank in the same step; the answer comes
    back as ``StepOutputs.flushed`` under ``token``."""

    tag: ClassVar[int] = 13
    token: int


@dataclass
class UpdateWeights(Message):
    """Load the weights at ``model_path`` into the served model (``/update_weights_from_disk``),
    on every rank in the same step, once no request runs or waits (those arriving meanwhile wait
    for it); then, with ``flush_cache``, empty the prefix cache (computed by the old weights). The
    answer comes back as ``StepOutputs.answers`` under ``token``. While generation is paused
    (:class:`PauseGeneration`) it runs at once; with ``keep_pause`` generation is paused (in place)
    afterwards until :class:`ContinueGeneration`."""

    tag: ClassVar[int] = 14
    token: int
    model_path: str
    flush_cache: bool = True
    keep_pause: bool = False


#: SGLang's /pause_generation modes: how the requests in the engine wait (``abort``: the API server
#: has ended them all; the engine then holds none)
PAUSE_MODES = ("abort", "retract", "in_place")


@dataclass
class PauseGeneration(Message):
    """Stop stepping the engine (``/pause_generation``), on every rank in the same step, once the
    step in flight has landed: ``in_place`` keeps the running requests with their KV, ``retract``
    gives their KV back (to the prefix cache) and puts them back in the queue, to be computed
    again. Requests arriving meanwhile wait. The answer ("") comes back as ``StepOutputs.answers``
    under ``token``."""

    tag: ClassVar[int] = 15
    token: int
    mode: str = "abort"


@dataclass
class ContinueGeneration(Message):
    """Step the engine again after :class:`PauseGeneration` (``/continue_generation``); the answer
    ("") comes back as ``StepOutputs.answers`` under ``token``."""

    tag: ClassVar[int] = 16
    token: int


@dataclass
class Shutdown(Message):
    """Passed down the pipeline (tokenizer → scheduler → detokenizer); each process exits after it."""

    tag: ClassVar[int] = 6


#: ms between two of scheduler rank 0's reports while idle (a heartbeat): the API server's /health
#: reads their age, so --health-timeout is at least two of them
HEARTBEAT_INTERVAL_MS = 1000

#: the stats key of the step heartbeat's reports (StepHeartbeat): how long the step in flight has
#: run, in ms; absent from every other report, as no step is in flight then
STEP_MS = "step_ms"

#: the stats key of rank 0's idle heartbeat while the engine has nothing to do: how long, in ms,
#: every rank has been parked waiting for work (/metrics' minisgl_idle_seconds); absent from every
#: other report, and rank 0's first report after it wakes has stats
IDLE_MS = "idle_ms"


@dataclass
class StepOutputs(Message):
    """One engine step's outputs, column by column (one entry per request that progressed)."""

    tag: ClassVar[int] = 8
    rids: list[int] = field(default_factory=list)
    #: -1 for an aborted request (no token)
    token_ids: list[int] = field(default_factory=list)
    #: None while running, else "stop" | "length" | "abort" | "error" | "invalid" (the request's
    #: fault, found by the engine: its grammar did not compile, or not in time; an HTTP 400)
    finish_reasons: list[str | None] = field(default_factory=list)
    matched_stops: list[str | int | None] = field(default_factory=list)
    logprobs: list[WireLogprob | None] = field(default_factory=list)
    #: error text per request (finish_reason "error" or "invalid"), else None
    errors: list[str | None] = field(default_factory=list)
    #: Engine.stats(), sent now and then
    stats: dict[str, int] | None = None
    #: with prompt_logprobs, on a request's first output: one wire logprob per prompt token (None
    #: for the first), else None
    prompt_logprobs: list[list[WireLogprob | None] | None] = field(default_factory=list)
    #: [rid, stop strings, skip_special_tokens, include_stop_str_in_output, min_tokens, the
    #: prompt's last tokens] of each request the scheduler received this step: how the detokenizer
    #: turns its tokens into text (sent no later than its first token)
    streams: list[list[Any]] = field(default_factory=list)
    #: [rid, prompt tokens read from the prefix cache] of each request whose first output is in
    #: this step (once a request: no column of Nones on every decode step)
    cached_tokens: list[list[int]] = field(default_factory=list)
    #: [rid, field] of each request finishing "invalid" this step whose error names the request's
    #: field at fault (StepOutput.error_param): the 400's param (once a request: no column)
    error_params: list[list[Any]] = field(default_factory=list)
    #: [FlushCache.token, cached tokens freed, or -1: not flushed, requests were running or waiting]
    flushed: list[list[int]] = field(default_factory=list)
    #: [token, "" or why not] answering UpdateWeights ("": every rank took the new weights),
    #: PauseGeneration and ContinueGeneration
    answers: list[list[Any]] = field(default_factory=list)
    #: [rid, tokens] of each request whose prediction this step's output used more of
    #: (StepOutput.accepted_prediction_tokens: no column on every step)
    accepted_predictions: list[list[int]] = field(default_factory=list)

    def open_stream(
        self,
        rid: int,
        stop: Sequence[str],
        skip_special_tokens: bool,
        keep_stop: bool = False,
        min_tokens: int = 0,
        context: Sequence[int] = (),
    ) -> None:
        self.streams.append([rid, list(stop), skip_special_tokens, keep_stop, min_tokens, list(context)])

    def add(
        self,
        rid: int,
        token_id: int,
        finish_reason: str | None,
        matched_stop: str | int | None = None,
        logprob: WireLogprob | None = None,
        error: str | None = None,
        prompt_logprobs: list[WireLogprob | None] | None = None,
        error_param: str | None = None,
    ) -> None:
        self.rids.append(rid)
        if error_param is not None:
            self.error_params.append([rid, error_param])
        self.token_ids.append(token_id)
        self.finish_reasons.append(finish_reason)
        self.matched_stops.append(matched_stop)
        self.logprobs.append(logprob)
        self.errors.append(error)
        self.prompt_logprobs.append(prompt_logprobs)

    def __len__(self) -> int:
        return len(self.rids)


@dataclass
class DetokOutputs(Message):
    """StepOutputs with text: per request the new text (may be empty while held back) and token."""

    tag: ClassVar[int] = 9
    rids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    matched_stops: list[str | int | None] = field(default_factory=list)
    #: [token_text, logprob, [[top_text, top_logprob, top_id], ...], token_id] or None
    logprobs: list[list[Any] | None] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    stats: dict[str, int] | None = None
    #: with prompt_logprobs, on a request's first output: the prompt tokens' logprobs as
    #: ``logprobs`` writes them (None for the first token), else None
    prompt_logprobs: list[list[list[Any] | None] | None] = field(default_factory=list)
    #: StepOutputs.cached_tokens, passed on as it came
    cached_tokens: list[list[int]] = field(default_factory=list)
    #: StepOutputs.error_params, passed on as they came
    error_params: list[list[Any]] = field(default_factory=list)
    #: StepOutputs.flushed, passed on as it came
    flushed: list[list[int]] = field(default_factory=list)
    #: StepOutputs.answers, passed on as they came
    answers: list[list[Any]] = field(default_factory=list)
    #: StepOutputs.accepted_predictions, passed on as they came
    accepted_predictions: list[list[int]] = field(default_factory=list)


@dataclass
class ProcessReady(Message):
    tag: ClassVar[int] = 10
    role: str
    rank: int
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProcessFailed(Message):
    tag: ClassVar[int] = 11
    role: str
    rank: int
    #: the child's traceback, shown by the launcher
    error: str
    #: what HTTP clients may be told: the exception's class, with the words it carries for them
    #: (a PluginFailure's ``summary``), never its text (a gloo error holds C++ build paths)
    summary: str = ""
    #: a setting (or a model's file) the process refused before it was ready, in the one line the
    #: command that started the server says (a usage error: exit code 2); "" for any other failure
    refusal: str = ""


_BY_TAG: dict[int, type[Message]] = {
    cls.tag: cls
    for cls in (
        Limits,
        TokenizeRequest,
        Admission,
        EngineRequest,
        AbortRequest,
        CompilesSettled,
        FlushCache,
        UpdateWeights,
        PauseGeneration,
        ContinueGeneration,
        Shutdown,
        StepOutputs,
        DetokOutputs,
        ProcessReady,
        ProcessFailed,
    )
}
_FIELDS: dict[type[Message], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in _BY_TAG.values()
}
#: positions of the SamplingParams fields of each message (rebuilt from the wire untouched)
_PARAMS_AT: dict[type[Message], tuple[int, ...]] = {
    cls: tuple(i for i, f in enumerate(fields(cls)) if f.type == "SamplingParams") for cls in _BY_TAG.values()
}


#: msgpack extension type of an integer past 64 bits, as its decimal digits (JSON allows any
#: integer: a tool's schema with ``"const": -9223372036854775809`` was a 500 here)
_BIG_INT = 1


def _plain(value: Any) -> Any:
    if isinstance(value, SamplingParams):
        return value.to_wire()
    if isinstance(value, int):  # msgpack asks only for those past 64 bits
        return msgpack.ExtType(_BIG_INT, str(value).encode())
    raise TypeError(f"cannot encode {type(value).__name__} in a message")


def _extension(code: int, data: bytes) -> Any:
    if code == _BIG_INT:
        return int(data)
    return msgpack.ExtType(code, data)


def encode(msg: Message) -> bytes:
    return msgpack.packb(
        [msg.tag, *(getattr(msg, name) for name in _FIELDS[type(msg)])], use_bin_type=True, default=_plain
    )


def decode(data: bytes) -> Message:
    tag, *values = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_extension)
    cls = _BY_TAG.get(tag)
    if cls is None:
        raise ValueError(f"unknown message tag {tag!r}")
    for i in _PARAMS_AT[cls]:
        values[i] = SamplingParams.from_wire(values[i])
    return cls(*values)
