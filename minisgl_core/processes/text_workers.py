"""The tokenizer and detokenizer worker processes of the server.

The tokenizer turns text or chat messages into token ids, admits each request against the
engine's limits (from the ready handshake; :func:`minisgl_core.request_limits.admit`) so a bad one
is answered at once with a clear error instead of reaching a scheduler, and fans an accepted one
out to ``n`` engine requests. Its SamplingParams arrive validated from the API server and leave
for the scheduler without another check. Aborts
travel the same way as requests, so an abort can never overtake the request it cancels.

The detokenizer turns the scheduler's per-step tokens into text increments, holding back partial
characters and possible stop-string prefixes, and adds the text of logprob tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import zmq
from jinja2 import TemplateSyntaxError

from minisgl_core.api.grammar import GrammarSpec
from minisgl_core.grammars import LazyGrammarBackend
from minisgl_core.messages import (
    AbortRequest,
    Admission,
    ContinueGeneration,
    DetokOutputs,
    EngineRequest,
    FlushCache,
    Limits,
    PauseGeneration,
    Shutdown,
    StepOutputs,
    TokenizeRequest,
    UpdateWeights,
)
from minisgl_core.plugins import Plugins
from minisgl_core.processes.child import ChildSpec, ReportReady
from minisgl_core.processes.ipc import bind_pull, connect_push, recv, send
from minisgl_core.request_limits import ContextLengthExceeded, admit, truncate_prompt, truncation_tail
from minisgl_core.sampling import SamplingParams
from minisgl_core.token_bans import NoTokenLeft
from minisgl_core.tokenizer.chat_input import (
    ToolsNotRendered,
    check_tools_rendered,
    template_does_not_compile,
    unrendered_tools_fix,
)
from minisgl_core.tokenizer.detokenize import IncrementalDetokenizer, raw_token_bytes
from minisgl_core.tokenizer.load import (
    import_transformers_without_torch,
    load_tokenizer,
    longest_token_chars,
    render_chat_template,
)

logger = logging.getLogger(__name__)


class RequestRejected(ValueError):
    def __init__(self, message: str, param: str | None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


# ---------------------------------------------------------------------------------- tokenizer


class Admitter:
    """Tokenizes one request and decides its max_tokens, or says precisely why it cannot run."""

    def __init__(
        self,
        tokenizer: Any,
        limits: Limits,
        defaults: dict[str, Any] | None = None,
        grammars: LazyGrammarBackend | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        #: the model's sampling defaults (--generation-config): the API server applied them all
        #: but ``max_tokens``, which caps what the context leaves once the prompt is tokenized
        self.defaults = defaults or {}
        #: checks a request's grammar before admission, so a bad one is a 400 before anything runs
        self.grammars = grammars
        #: the tokenizer's longest token in characters (truncation_tail's bound), on first use
        self.max_token_chars: int | None = None
        #: reasoning tags -> their token ids (None: not single tokens), on first use (the server's
        #: --reasoning-parser's at start-up: tokenizer_main)
        self._tag_ids: dict[tuple[str, str], tuple[int, int] | None] = {}

    def prompt_ids(self, req: TokenizeRequest) -> list[int]:
        if req.messages is not None:
            args = req.template_args or {}
            text = render_chat_template(self.tokenizer, req.messages, **args)
            if not req.tools_optional:  # (tools the model may not call are context only)
                # (the whole texts compared, not their tokens: with truncate_prompt_tokens those
                # are of the tails only, the same where the tools are rendered near the start)
                try:
                    check_tools_rendered(
                        text,
                        args,
                        lambda tool_free_args: render_chat_template(
                            self.tokenizer, req.messages, **tool_free_args
                        ),
                        unrendered_tools_fix(args, getattr(self.tokenizer, "chat_template", None)),
                    )
                except ToolsNotRendered as exc:
                    raise RequestRejected(str(exc), "tools") from None
            return self._chat_ids(req, text)
        if req.text is not None:
            if req.params.truncate_prompt_tokens is None:
                self._refuse_far_past_context(req.text, "prompt")
            return list(self.tokenizer.encode(req.text, add_special_tokens=req.add_special_tokens))
        return list(req.input_ids or [])

    def _refuse_far_past_context(self, text: str, field: str) -> None:
        """Refuse a text whose first :data:`HEAD_CHARS_PER_TOKEN` x context characters alone are
        twice the context in tokens, before tokenizing the rest: the API server's bound by
        characters lets through ``context x the longest token`` (655,360 characters for the
        default model, 16 M for a 128k context with 128-character tokens), which took this worker
        0.5 s (seconds, for the longer) while every other request waited, only to be refused.
        Twice, not once: a cut through a word may tokenize its piece apart from the whole."""
        limit = self.limits.max_context_len
        head = HEAD_CHARS_PER_TOKEN * limit
        if len(text) <= head:
            return
        tokens = len(self.tokenizer.encode(text[:head], add_special_tokens=False))
        if tokens >= 2 * limit:
            raise RequestRejected(
                f"the prompt has more tokens than the context length of {limit}: its first {head} "
                f"characters alone are {tokens} tokens (of {len(text)} characters); shorten it",
                field,
                "context_length_exceeded",
            )

    def _chat_ids(self, req: TokenizeRequest, text: str) -> list[int]:
        """``text``, the chat as its template renders it, as token ids (without special tokens:
        the template writes them); with ``truncate_prompt_tokens`` only the tail its last k tokens
        come from when it is longer than the context could hold (the API server let it past its
        bound by characters: it is cut here, as a text prompt is there), so a long conversation
        costs the tokenizer no more than a prompt that fits."""
        k = req.params.truncate_prompt_tokens
        if k is None:
            self._refuse_far_past_context(text, "messages")
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        if self.max_token_chars is None:
            self.max_token_chars = longest_token_chars(self.tokenizer) or 0
        tail = truncation_tail(text, k, self.limits.max_context_len, self.max_token_chars or None)
        return list(self.tokenizer.encode(tail, add_special_tokens=False))

    def admit(self, req: TokenizeRequest) -> tuple[list[int], SamplingParams]:
        """The prompt's token ids and the request's parameters admitted (``max_tokens`` decided);
        the parameters themselves were validated by the API server and are not checked again."""
        prompt_field = "messages" if req.messages is not None else "prompt"
        # the request's own chat_template (the API server compiled it): its errors name it
        own_template = req.messages is not None and bool((req.template_args or {}).get("chat_template"))
        try:
            ids = self.prompt_ids(req)
        except RequestRejected:
            raise
        except TemplateSyntaxError as exc:  # (the server's template, not the request's doing)
            if own_template:  # (the API server compiled it first: kept for a direct caller)
                raise RequestRejected(
                    f"chat_template does not compile: line {exc.lineno}: {exc.message}", "chat_template"
                ) from exc
            raise RequestRejected(template_does_not_compile(exc), prompt_field) from exc
        except RecursionError as exc:  # the template walked a structure hundreds of levels deep
            field = "tools" if (req.template_args or {}).get("tools") else prompt_field
            raise RequestRejected(
                f"could not render the chat template: {field} nested too deeply for it (the template "
                "recursed past Python's limit); flatten the structure",
                field,
            ) from exc
        except Exception as exc:  # noqa: BLE001 - a template or tokenizer error is the request's problem
            if own_template:  # (its raise_exception, an undefined call...)
                raise RequestRejected(
                    f"could not render chat_template: {type(exc).__name__}: {exc}", "chat_template"
                ) from exc
            raise RequestRejected(f"could not tokenize the prompt: {exc}", prompt_field) from exc
        default = self.defaults.get("max_tokens") or req.default_max_tokens
        try:
            ids = truncate_prompt(ids, req.params, self.limits, default)
        except ContextLengthExceeded as exc:  # -1 with no max_tokens to leave room for
            raise RequestRejected(str(exc), req.max_tokens_field, "context_length_exceeded") from exc
        try:
            sampling = admit(ids, req.params, self.limits, default, encode=self._encode_word)
        except ValueError as exc:
            # Blame max_tokens only when lowering it would help.
            prompt_fits = len(ids) < min(self.limits.max_context_len, self.limits.kv_capacity_tokens)
            blame = req.max_tokens_field if prompt_fits and "max_tokens" in str(exc) else prompt_field
            if str(exc).startswith("stop_token_ids"):
                blame = "stop_token_ids"
            if str(exc).startswith("logit_bias"):
                blame = "logit_bias"
            if str(exc).startswith("min_tokens"):
                blame = "min_tokens"
            for field in ("allowed_token_ids", "bad_words"):
                if str(exc).startswith(field):
                    blame = field
            if isinstance(exc, NoTokenLeft):
                blame = exc.param
            # (the prompt and max_tokens past the context or the KV pool: OpenAI's code for it, as
            # the API server's check by characters gives)
            code = "context_length_exceeded" if isinstance(exc, ContextLengthExceeded) else None
            raise RequestRejected(str(exc), blame, code) from exc
        if sampling.grammar is not None:
            if self.grammars is None:
                raise RequestRejected("this server does not support constrained decoding", req.grammar_field)
            try:
                self.grammars.check(sampling.grammar)
            except ValueError as exc:  # GrammarError: the message says what is wrong
                raise self._grammar_rejected(req, exc) from exc
            if req.reasoning_tags is not None:
                tag_ids = self.reasoning_tag_ids(*req.reasoning_tags)
                if tag_ids is not None and not ends_with_tag(self.tokenizer, ids, tag_ids[1]):
                    opened = self.reasoning_opened(req, ids)
                    sampling = dataclasses.replace(
                        sampling, reasoning_tag_ids=tag_ids, reasoning_opened=opened
                    )
        return ids, sampling

    def _grammar_rejected(self, req: TokenizeRequest, exc: ValueError) -> RequestRejected:
        """Why the request's grammar failed its check, naming the field at fault: the first of
        its parts that fails alone (a forced call's tool parameters, ``grammar_parts``), else the
        field that set the grammar. (A tool's parameters that no arguments can satisfy were a 400
        naming tool_choice.)"""
        whole = RequestRejected(f"{req.grammar_field}: {exc}", req.grammar_field)
        if not req.grammar_parts or self.grammars is None:
            return whole
        try:
            backend = self.grammars.get()
        except ValueError:  # no backend (its error is the whole grammar's): no part is at fault
            return whole
        for field, what, schema in req.grammar_parts:
            try:
                backend.check(GrammarSpec("json_schema", schema))
            except ValueError as part_exc:
                return RequestRejected(f"{field}: {what}: {part_exc}", field)
        return whole

    def _encode_word(self, text: str) -> list[int]:
        """A bad word's token ids (admission tokenizes ``bad_words`` here, once a request)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def reasoning_opened(self, req: TokenizeRequest, ids: list[int]) -> bool:
        """Whether the admitted prompt ``ids`` opened the reasoning of ``req.reasoning_tags``: it
        ends with the start tag and whitespace (Qwen3's thinking-only templates, DeepSeek-R1's),
        so the output begins inside the reasoning."""
        tag_ids = None if req.reasoning_tags is None else self.reasoning_tag_ids(*req.reasoning_tags)
        return tag_ids is not None and ends_with_tag(self.tokenizer, ids, tag_ids[0])

    def reasoning_tag_ids(self, start: str, end: str) -> tuple[int, int] | None:
        """The token ids of a reasoning parser's tags, or None where either is not one token of
        this tokenizer (the grammar then applies from the output's first token)."""
        key = (start, end)
        if key not in self._tag_ids:
            ids = [self.tokenizer.encode(tag, add_special_tokens=False) for tag in key]
            single = all(len(i) == 1 for i in ids) and ids[0] != ids[1]
            self._tag_ids[key] = (ids[0][0], ids[1][0]) if single else None
            if not single:
                logger.warning(
                    "reasoning tags %r and %r are not single tokens of this tokenizer: a grammar "
                    "applies from the first output token, with no reasoning before it, and a prompt "
                    "that opens the reasoning is not recognised",
                    start,
                    end,
                )
        return self._tag_ids[key]


#: characters per context token of a text's head that the tokenizer worker looks at before
#: tokenizing a long text whole (Admitter._refuse_far_past_context): text runs 1-6 characters a
#: token, so a head of this many holds twice the context in tokens whenever the text is far past it
HEAD_CHARS_PER_TOKEN = 12
#: prompt tokens at its end that :func:`ends_with_tag` looks at
TAG_TAIL = 16


def ends_with_tag(tokenizer: Any, ids: list[int], tag_id: int) -> bool:
    """Whether the prompt ``ids`` ends with the token ``tag_id`` and nothing after it but
    whitespace: with the reasoning's end tag, the prompt closed the reasoning itself (Qwen3's
    template with ``enable_thinking`` false writes an empty ``<think>\\n\\n</think>\\n\\n``), so
    the answer opens with its content and the grammar applies at once; with its start tag, the
    prompt opened it, so the output begins inside the reasoning."""
    tail = ids[-TAG_TAIL:]
    if tag_id not in tail:
        return False
    after = tail[len(tail) - tail[::-1].index(tag_id) :]
    return not tokenizer.decode(after, skip_special_tokens=False).strip()


def load_worker_tokenizer(spec: ChildSpec, plugins: Plugins) -> Any:
    """The model's tokenizer, as the tokenizer and detokenizer processes load it: without torch,
    which neither needs (only the scheduler ranks run the model)."""
    import_transformers_without_torch()
    return load_tokenizer(spec.payload["model"], plugins, spec.payload.get("chat_template"))


def tokenizer_main(spec: ChildSpec, plugins: Plugins, ctx: zmq.Context, report_ready: ReportReady) -> None:
    tokenizer = load_worker_tokenizer(spec, plugins)
    inbox = bind_pull(ctx, spec.endpoints.tokenizer)
    to_scheduler = connect_push(ctx, spec.endpoints.scheduler)
    to_api = connect_push(ctx, spec.endpoints.api)
    # The launcher sends the engine's limits once scheduler rank 0 is up; only then are we ready.
    limits = recv(inbox)
    if isinstance(limits, Shutdown):  # stopped before the server came up
        return
    if not isinstance(limits, Limits):
        raise RuntimeError(f"tokenizer expected Limits first, got {type(limits).__name__}")
    grammars = LazyGrammarBackend(
        plugins,
        spec.payload.get("grammar_backend", "xgrammar"),
        tokenizer,
        vocab_size=limits.vocab_size,
        # (the engine's: read here too, the file's warnings were logged twice)
        stop_token_ids=limits.eos_token_ids,
    )
    admitter = Admitter(tokenizer, limits, spec.payload.get("sampling_defaults"), grammars)
    # --reasoning-parser's tags looked up now: tags that are not single tokens are said at
    # start-up, once (the lookup is kept), not on the first request that has a grammar
    if spec.payload.get("reasoning_tags"):
        admitter.reasoning_tag_ids(*spec.payload["reasoning_tags"])
    # (the server refuses a prompt longer than context x this before sending it here)
    report_ready({"max_token_chars": longest_token_chars(tokenizer)})
    while True:
        msg = recv(inbox)
        if isinstance(msg, TokenizeRequest):
            first = msg.rids[0]
            try:
                ids, sampling = admitter.admit(msg)
            except RequestRejected as exc:
                send(to_api, Admission(first, 0, 0, error=str(exc), param=exc.param, code=exc.code))
                continue
            prompt_ids = list(ids) if msg.return_prompt_ids else None
            opened = admitter.reasoning_opened(msg, ids)
            # (the client's guess of the output's text: tokenized as output is, no special tokens)
            prediction = (
                list(tokenizer.encode(msg.prediction, add_special_tokens=False)) if msg.prediction else None
            )
            send(
                to_api,
                Admission(
                    first,
                    len(ids),
                    sampling.max_tokens,
                    prompt_ids=prompt_ids,
                    reasoning_opened=opened,
                    grammar_answer=msg.reasoning_tags is not None and sampling.grammar is not None,
                    prediction_tokens=len(prediction or ()),
                ),
            )
            for i, rid in enumerate(msg.rids):
                # n > 1 with a seed: distinct but reproducible choices
                send(
                    to_scheduler,
                    EngineRequest(rid, ids, sampling.for_choice(i), msg.priority, msg.cache_salt, prediction),
                )
        elif isinstance(
            msg, (AbortRequest, FlushCache, UpdateWeights, PauseGeneration, ContinueGeneration, Shutdown)
        ):
            send(to_scheduler, msg)
            if isinstance(msg, Shutdown):
                return
        else:
            logger.warning("tokenizer ignores unexpected %s", type(msg).__name__)


# ---------------------------------------------------------------------------------- detokenizer


class Detokenizer:
    """Per-request incremental detokenizers, keyed by rid."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.streams: dict[int, IncrementalDetokenizer] = {}
        self._token_text: dict[int, str] = {}
        self._token_bytes: dict[int, list[int] | None] = {}

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def token_bytes(self, token_id: int) -> list[int] | None:
        """The token's own bytes where its text alone is not whole characters (U+FFFD: a part of
        a UTF-8 character), else None (the text's UTF-8 is its bytes)."""
        if "\ufffd" not in self.token_text(token_id):
            return None
        if token_id not in self._token_bytes:
            raw = raw_token_bytes(self.tokenizer, token_id)
            self._token_bytes[token_id] = None if raw is None else list(raw)
        return self._token_bytes[token_id]

    def convert(self, step: StepOutputs) -> DetokOutputs:
        # The scheduler opens a request's stream in the step that received it, so no later than
        # its first token (one socket: nothing overtakes it).
        for rid, stop, skip_special_tokens, keep_stop, min_tokens, context in step.streams:
            self.streams[rid] = IncrementalDetokenizer(
                self.tokenizer, stop, skip_special_tokens, keep_stop, min_tokens, context
            )
        out = DetokOutputs(
            stats=step.stats,
            cached_tokens=step.cached_tokens,
            error_params=step.error_params,
            flushed=step.flushed,
            answers=step.answers,
            accepted_predictions=step.accepted_predictions,
        )
        for i, rid in enumerate(step.rids):
            token, reason, matched = step.token_ids[i], step.finish_reasons[i], step.matched_stops[i]
            stream = self.streams.get(rid)
            text = ""
            if stream is not None and token >= 0:
                text = stream.add([token], finished=reason is not None, matched_stop=matched)
            elif stream is not None and reason is not None:
                text = stream.add([], finished=True, matched_stop=matched)
            if reason is not None:
                self.streams.pop(rid, None)
            out.rids.append(rid)
            out.token_ids.append(token)
            out.texts.append(text)
            out.finish_reasons.append(reason)
            out.matched_stops.append(matched)
            out.logprobs.append(self._logprob(step.logprobs[i]))
            out.errors.append(step.errors[i])
            prompt = step.prompt_logprobs[i]
            out.prompt_logprobs.append(None if prompt is None else [self._logprob(w) for w in prompt])
        return out

    def _logprob(self, wire: list[Any] | None) -> list[Any] | None:
        if wire is None:
            return None
        token_id, logprob, top, rank = wire
        item = [
            self.token_text(token_id),
            logprob,
            [[self.token_text(t), lp, t] for t, lp in top],
            token_id,
            rank,
        ]
        # [[id, bytes], ...] of the tokens here whose text is not whole characters (rare: no field)
        raw = [[t, b] for t in (token_id, *(t for t, _ in top)) if (b := self.token_bytes(t)) is not None]
        if raw:
            item.append(raw)
        return item


def detokenizer_main(spec: ChildSpec, plugins: Plugins, ctx: zmq.Context, report_ready: ReportReady) -> None:
    detok = Detokenizer(load_worker_tokenizer(spec, plugins))
    inbox = bind_pull(ctx, spec.endpoints.detokenizer)
    to_api = connect_push(ctx, spec.endpoints.api)
    report_ready({})
    while True:
        msg = recv(inbox)
        out: DetokOutputs | None = None
        if isinstance(msg, StepOutputs):
            out = detok.convert(msg)
        elif isinstance(msg, Shutdown):
            return
        if out is not None and (out.rids or out.stats is not None or out.flushed or out.answers):
            send(to_api, out)
