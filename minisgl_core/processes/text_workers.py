"""The tokenizer and detokenizer worker processes of the server.

The tokenizer turns text or chat messages into token ids, checks each request against the
engine's limits (from the ready handshake) so a bad one is answered at once with a clear error
instead of reaching a scheduler, and fans an accepted one out to ``n`` engine requests. Aborts
travel the same way as requests, so an abort can never overtake the request it cancels.

The detokenizer turns the scheduler's per-step tokens into text increments, holding back partial
characters and possible stop-string prefixes, and adds the text of logprob tokens.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import Any

import zmq

from minisgl_core.checkpoint.formats import open_model
from minisgl_core.grammars import LazyGrammarBackend
from minisgl_core.messages import (
    AbortRequest,
    Admission,
    DetokOutputs,
    DetokRegister,
    EngineRequest,
    Limits,
    Shutdown,
    StepOutputs,
    TokenizeRequest,
)
from minisgl_core.model_dir import eos_token_ids
from minisgl_core.plugins import Plugins
from minisgl_core.processes.child import ChildSpec, ReportReady
from minisgl_core.processes.ipc import bind_pull, connect_push, recv, send
from minisgl_core.request_limits import check_request_fits
from minisgl_core.sampling import SamplingParams, choice_seed, merge_sampling
from minisgl_core.tokenizer.detokenize import IncrementalDetokenizer
from minisgl_core.tokenizer.load import apply_chat_template, load_tokenizer

logger = logging.getLogger(__name__)


class RequestRejected(ValueError):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


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
        #: the model's sampling defaults (--generation-config) for fields a request leaves unset
        self.defaults = defaults or {}
        #: checks a request's grammar before admission, so a bad one is a 400 before anything runs
        self.grammars = grammars

    def prompt_ids(self, req: TokenizeRequest) -> list[int]:
        if req.messages is not None:
            args = dict(req.template_args or {})
            ids = apply_chat_template(self.tokenizer, req.messages, **args)
            if args.pop("tools", None):
                # A template without a tools section would drop them without a word, and the
                # model would answer as if it had none.
                if ids == apply_chat_template(self.tokenizer, req.messages, **args):
                    raise RequestRejected(
                        "this model's chat template does not render tools; start the server with "
                        "--chat-template FILE whose template does",
                        "tools",
                    )
            return ids
        if req.text is not None:
            return list(self.tokenizer.encode(req.text, add_special_tokens=False))
        return list(req.input_ids or [])

    def admit(self, req: TokenizeRequest) -> tuple[list[int], SamplingParams]:
        prompt_field = "messages" if req.messages is not None else "prompt"
        try:
            ids = self.prompt_ids(req)
        except RequestRejected:
            raise
        except Exception as exc:  # noqa: BLE001 - a template or tokenizer error is the request's problem
            raise RequestRejected(f"could not tokenize the prompt: {exc}", prompt_field) from exc
        # request > model default > SamplingParams' (OpenAI's) default, field by field
        params = merge_sampling(req.params, {k: v for k, v in self.defaults.items() if k != "max_tokens"})
        room = min(self.limits.max_context_len, self.limits.kv_capacity_tokens) - len(ids)
        if params.get("max_tokens") is None:
            if room < 1:
                raise RequestRejected(
                    f"the prompt has {len(ids)} tokens and leaves no room for output in the context "
                    f"length {self.limits.max_context_len}; shorten the prompt",
                    prompt_field,
                )
            # the model's max_new_tokens caps what the context leaves, never the other way round
            params["max_tokens"] = min(room, self.defaults.get("max_tokens") or room)
        try:
            sampling = SamplingParams(**params)
        except (TypeError, ValueError) as exc:
            field = str(exc).split(" ", 1)[0]
            raise RequestRejected(str(exc), req.max_tokens_field if field == "max_tokens" else field) from exc
        try:
            check_request_fits(
                ids,
                sampling,
                vocab_size=self.limits.vocab_size,
                max_context_len=self.limits.max_context_len,
                kv_capacity_tokens=self.limits.kv_capacity_tokens,
            )
        except ValueError as exc:
            # Blame max_tokens only when lowering it would help.
            prompt_fits = len(ids) < min(self.limits.max_context_len, self.limits.kv_capacity_tokens)
            blame = req.max_tokens_field if prompt_fits and "max_tokens" in str(exc) else prompt_field
            if str(exc).startswith("stop_token_ids"):
                blame = "stop_token_ids"
            if str(exc).startswith("logit_bias"):
                blame = "logit_bias"
            raise RequestRejected(str(exc), blame) from exc
        if sampling.grammar is not None:
            if self.grammars is None:
                raise RequestRejected("this server does not support constrained decoding", req.grammar_field)
            try:
                self.grammars.check(sampling.grammar)
            except ValueError as exc:  # GrammarError: the message says what is wrong
                raise RequestRejected(f"{req.grammar_field}: {exc}", req.grammar_field) from exc
        return ids, sampling


def tokenizer_main(spec: ChildSpec, plugins: Plugins, ctx: zmq.Context, report_ready: ReportReady) -> None:
    tokenizer = load_tokenizer(spec.payload["model"], plugins, spec.payload.get("chat_template"))
    inbox = bind_pull(ctx, spec.endpoints.tokenizer)
    to_scheduler = connect_push(ctx, spec.endpoints.scheduler)
    to_detokenizer = connect_push(ctx, spec.endpoints.detokenizer)
    to_api = connect_push(ctx, spec.endpoints.api)
    # The launcher sends the engine's limits once scheduler rank 0 is up; only then are we ready.
    limits = recv(inbox)
    if isinstance(limits, Shutdown):  # stopped before the server came up
        return
    if not isinstance(limits, Limits):
        raise RuntimeError(f"tokenizer expected Limits first, got {type(limits).__name__}")
    source = open_model(spec.payload["model"], plugins)
    grammars = LazyGrammarBackend(
        plugins,
        spec.payload.get("grammar_backend", "xgrammar"),
        tokenizer,
        vocab_size=limits.vocab_size,
        stop_token_ids=sorted(eos_token_ids(source.hf_config(), source.generation_config())),
    )
    admitter = Admitter(tokenizer, limits, spec.payload.get("sampling_defaults"), grammars)
    report_ready({})
    while True:
        msg = recv(inbox)
        if isinstance(msg, TokenizeRequest):
            first = msg.rids[0]
            try:
                ids, sampling = admitter.admit(msg)
            except RequestRejected as exc:
                send(to_api, Admission(first, 0, 0, error=str(exc), param=exc.param))
                continue
            send(to_api, Admission(first, len(ids), sampling.max_tokens))
            for i, rid in enumerate(msg.rids):
                # n > 1 with a seed: distinct but reproducible choices
                seeded = (
                    sampling
                    if i == 0 or sampling.seed is None
                    else replace(sampling, seed=choice_seed(sampling.seed, i))
                )
                send(to_detokenizer, DetokRegister(rid, sampling.stop, sampling.skip_special_tokens))
                send(to_scheduler, EngineRequest(rid, ids, asdict(seeded)))
        elif isinstance(msg, (AbortRequest, Shutdown)):
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
        # Registration and outputs come from different processes; an output that overtakes its
        # registration waits here.
        self.early: dict[int, StepOutputs] = {}
        self._token_text: dict[int, str] = {}

    def register(self, msg: DetokRegister) -> DetokOutputs | None:
        self.streams[msg.rid] = IncrementalDetokenizer(self.tokenizer, msg.stop, msg.skip_special_tokens)
        waiting = self.early.pop(msg.rid, None)
        return self.convert(waiting) if waiting is not None else None

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def convert(self, step: StepOutputs) -> DetokOutputs:
        out = DetokOutputs(stats=step.stats)
        for i, rid in enumerate(step.rids):
            token, reason, matched = step.token_ids[i], step.finish_reasons[i], step.matched_stops[i]
            stream = self.streams.get(rid)
            if stream is None and reason not in ("abort", "error"):
                early = self.early.setdefault(rid, StepOutputs())
                early.add(rid, token, reason, matched, step.logprobs[i], step.errors[i])
                continue
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
        return out

    def _logprob(self, wire: list[Any] | None) -> list[Any] | None:
        if wire is None:
            return None
        token_id, logprob, top = wire
        return [
            self.token_text(token_id),
            logprob,
            [[self.token_text(t), lp, t] for t, lp in top],
            token_id,
        ]


def detokenizer_main(spec: ChildSpec, plugins: Plugins, ctx: zmq.Context, report_ready: ReportReady) -> None:
    detok = Detokenizer(load_tokenizer(spec.payload["model"], plugins))
    inbox = bind_pull(ctx, spec.endpoints.detokenizer)
    to_api = connect_push(ctx, spec.endpoints.api)
    report_ready({})
    while True:
        msg = recv(inbox)
        out: DetokOutputs | None = None
        if isinstance(msg, DetokRegister):
            out = detok.register(msg)
        elif isinstance(msg, StepOutputs):
            out = detok.convert(msg)
        elif isinstance(msg, Shutdown):
            return
        if out is not None and (out.rids or out.stats is not None):
            send(to_api, out)
