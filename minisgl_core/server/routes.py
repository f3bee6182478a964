"""The OpenAI-compatible routes: /v1/chat/completions, /v1/completions and /v1/models[/{id}].

Each route validates its body (schemas), opens a RequestGroup on the server state, adds its
prompts (a 400 comes back here, before any streaming starts), then streams SSE chunks or waits for
the whole answer. Leaving a route for any reason closes the group, which aborts what is unfinished.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from minisgl_core.api import TagReasoningParser
from minisgl_core.sampling import SamplingParams
from minisgl_core.server import responses as r
from minisgl_core.server.api_options import ApiOptions, ApiTokenizer
from minisgl_core.server.chat_output import ChoiceOutput
from minisgl_core.server.errors import APIError, respell, sse_error
from minisgl_core.server.handling import (
    check_token_ids,
    client_request_id,
    drop_generated,
    respond,
    room_to_score,
    sampling_params,
    score_only_fields,
    with_request_id,
)
from minisgl_core.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    check_request_template,
)
from minisgl_core.server.state import RequestGroup, ServerState
from minisgl_core.server.tools import plan_tools
from minisgl_core.tokenizer.chat_input import (
    ToolsNotRendered,
    check_tools_rendered,
    template_does_not_compile,
    unrendered_tools_fix,
)

#: /v1/completions' max_tokens when the request and the model's generation config leave it unset:
#: OpenAI's legacy default (vLLM's too), capped by what the context leaves. Chat has none (OpenAI's
#: chat default is the rest of the context).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: how /v1/completions asks for a score-only request (the prompt's logprobs, no new text)
SCORE_ONLY_ECHO = "echo with max_tokens 0"


@contextmanager
def fields_named(names: dict[str, str]) -> Iterator[None]:
    """A 400 raised inside names each field of ``names`` (SamplingParams' name or admission's:
    ``max_tokens``, ``min_tokens``, ``prompt``) as the request spelled it (``max_completion_tokens``,
    ``sampling_params.max_new_tokens``, ``text``, ``prompt.1``), in its param and its message:
    the messages are built where the body's names are unknown (SamplingParams, admission in the
    tokenizer worker)."""
    try:
        yield
    except APIError as exc:
        if exc.status == 400:
            exc.message = respell(exc.message, names)
            exc.param = names.get(exc.param, exc.param)
        raise


def reasoning_tags(options: ApiOptions) -> list[str] | None:
    """The reasoning parser's tags, for the tokenizer worker: it says whether the prompt opened
    the reasoning (the parser then reads the output as inside it), and a grammar applies after the
    reasoning, as in vLLM and SGLang (where the worker finds both tags single tokens)."""
    parser = options.reasoning_parser
    if parser is None or not issubclass(parser, TagReasoningParser):
        return None
    return [parser.start_tag, parser.end_tag]


@dataclasses.dataclass(frozen=True)
class ChatAdmitted:
    """A chat request admitted by the engine: its group of engine requests (one a choice), its
    SamplingParams, and a maker of each choice's output parsers (reasoning, tool calls)."""

    group: RequestGroup
    params: SamplingParams
    new_output: Callable[[], ChoiceOutput]


async def admit_chat(
    state: ServerState, options: ApiOptions, body: ChatCompletionRequest, tokenizer: ApiTokenizer
) -> ChatAdmitted:
    """The chat pipeline up to the engine: tools planned (a forced call's grammar), the request's
    SamplingParams, the parsers built once (a plugin failing to build costs no generation), the
    messages rendered and admitted. A 400 names the body's fields; /v1/responses renames them."""
    check_request_template(body.chat_template, options.trust_request_chat_template)
    if body.prediction is not None and not options.speculative_decoding:
        raise APIError(
            400,
            "prediction needs speculative decoding, which this server does not run: its operator "
            "must start it with --speculative-algorithm ngram (or leave prediction out)",
            "prediction",
            "unsupported_field",
        )
    plan = plan_tools(body, options.tool_parser)
    fields = body.sampling_fields()
    hidden_special: tuple[str, ...] = ()
    if (
        plan.parser is not None
        and getattr(plan.parser, "reads_special_tokens", False)
        and fields["skip_special_tokens"]
    ):
        # the parser's markers are special tokens: its text keeps them, and the ones it leaves in
        # the answer are taken out after it (vLLM turns skipping off for Mistral's tools as well)
        fields["skip_special_tokens"] = False
        hidden_special = await asyncio.to_thread(tokenizer.special_texts)
    if plan.grammar is not None:
        if fields.get("grammar") is not None:  # response_format / structured_outputs
            raise APIError(
                400,
                "tool_choice 'required' or a named function constrains the output to tool calls; "
                "it cannot be combined with another output constraint such as response_format",
                "tool_choice",
            )
        fields["grammar"] = plan.grammar
    grammar_field = "tool_choice" if plan.grammar is not None else body.grammar_field
    rename = {"max_tokens": body.max_tokens_field, "logprobs": "top_logprobs", "grammar": grammar_field}
    with fields_named({"max_tokens": body.max_tokens_field}):
        params = sampling_params(fields, rename, state.model)
    ChoiceOutput(plan, options.reasoning_parser, options.parser_labels, context=options.context)
    group = RequestGroup(state)
    group.set_timeout(body.timeout)
    group.set_priority(body.priority)
    group.set_cache_salt(body.cache_salt)
    with fields_named({"max_tokens": body.max_tokens_field}):
        admission = await group.add(
            params,
            body.n,
            messages=body.template_messages(),
            max_tokens_field=body.max_tokens_field,
            template_args=body.template_args(),
            # a forced tool call's grammar comes from tool_choice, so its errors name that field,
            # or the tool's parameters when they alone fail
            grammar_field=grammar_field,
            grammar_parts=plan.grammar_parts or None,
            return_prompt_ids=body.return_token_ids,
            # tool_choice "none" (no parser: the output is plain content) needs no tools rendered
            tools_optional=plan.parser is None,
            reasoning_tags=reasoning_tags(options),
            prediction=body.prediction.text() if body.prediction is not None else None,
        )

    def new_output() -> ChoiceOutput:
        return ChoiceOutput(
            plan,
            options.reasoning_parser,
            options.parser_labels,
            admission.reasoning_opened,
            admission.grammar_answer,
            hidden_special,
            context=options.context,
        )

    return ChatAdmitted(group, params, new_output)


async def chat_prompt_ids(
    state: ServerState, options: ApiOptions, body: ChatCompletionRequest, tokenizer: ApiTokenizer
) -> list[int]:
    """The token ids :func:`admit_chat` would run ``body`` on, its messages rendered and
    tokenized as the tokenizer worker does (``Admitter.prompt_ids``), in the API process (the
    tokenizer /tokenize loads) and with nothing run: what /v1/responses/input_tokens counts. The
    pipeline's checks of the template and the tools come first, with their 400s; as there, the
    tools must render unless no tool parser reads the answer (tool_choice none). What the worker
    checks beyond the prompt (a forced call's grammar, the room left for the output) is not."""
    check_request_template(body.chat_template, options.trust_request_chat_template)
    plan = plan_tools(body, options.tool_parser)
    messages, args = body.template_messages(), body.template_args()
    state.check_prompt_size(None, messages, args)  # (before seconds of tokenizing, as admission)

    def render(tok: Any, free_args: dict[str, Any]) -> list[int]:
        from minisgl_core.tokenizer.load import render_chat_template  # (as ApiTokenizer loads it: on use)

        return list(tok.encode(render_chat_template(tok, messages, **free_args), add_special_tokens=False))

    def prompt_ids(tok: Any) -> list[int]:
        ids = render(tok, args)
        if plan.parser is not None:
            fix = unrendered_tools_fix(args, getattr(tok, "chat_template", None))
            check_tools_rendered(ids, args, lambda free_args: render(tok, free_args), fix)
        return ids

    try:
        return await tokenizer.run(prompt_ids)
    except ToolsNotRendered as exc:
        raise APIError(400, str(exc), "tools") from None
    except Exception as exc:  # noqa: BLE001 - a template or tokenizer error is the request's problem
        message = template_does_not_compile(exc) or f"could not tokenize the prompt: {exc}"
        raise APIError(400, message, "messages") from exc


def make_router(
    state: ServerState, options: ApiOptions | None = None, tokenizer: ApiTokenizer | None = None
) -> APIRouter:
    router = APIRouter()
    model = state.model
    options = options or ApiOptions()
    tokenizer = tokenizer or ApiTokenizer(model.path, options.chat_template)

    def check_model(body: SamplingFields) -> None:
        model.check_name(body.model)

    # ---------------------------------------------------------------- chat

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body)
        given = client_request_id(request, body.request_id)
        admitted = await admit_chat(state, options, body, tokenizer)
        group, params, new_output = admitted.group, admitted.params, admitted.new_output
        rid, created = f"chatcmpl-{given}" if given else r.new_id("chatcmpl"), int(time.time())
        name_group(group, given, rid)

        produced = [0] * group.num_choices  # each choice's completion tokens so far
        # vLLM's echo: the client's own text before each choice's, kept apart from what the model
        # made (its parsers, logprobs and token counts)
        echoed = body.echoed_text()

        def usage_so_far(chunk: dict, index: int) -> dict:
            return _with_usage(chunk, body.continuous_usage, group, produced, index)

        async def chunks() -> AsyncIterator[str]:
            outputs = [new_output() for _ in range(group.num_choices)]
            for i in range(group.num_choices):
                role = r.chat_chunk(rid, model.name, created, i, {"role": "assistant", "content": ""})
                if body.return_token_ids:  # the prompt's ids on each choice's first chunk
                    role["prompt_token_ids"] = group.choice_prompt_ids[i]
                yield r.sse(usage_so_far(role, i))
            if echoed:  # one chunk a choice, after the roles, as vLLM's
                for i in range(group.num_choices):
                    chunk = r.chat_chunk(rid, model.name, created, i, {"content": echoed})
                    yield r.sse(usage_so_far(chunk, i))
            completion_tokens = 0
            async for delta in group.deltas():
                if delta.finish_reason == "error":
                    # The status line went out long ago: the error is an event, and [DONE] still
                    # tells the client the stream ended on purpose.
                    yield sse_error(delta.error, delta.error_status, delta.error_param, delta.error_code)
                    yield r.DONE
                    return
                completion_tokens += len(delta.token_ids)
                produced[delta.index] += len(delta.token_ids)
                output = outputs[delta.index]
                message = output.delta(delta.text, final=delta.finish_reason is not None)
                with_ids = body.return_token_ids and delta.token_ids
                if not message and delta.finish_reason is None and not delta.logprobs and not with_ids:
                    continue
                chunk = r.chat_chunk(
                    rid,
                    model.name,
                    created,
                    delta.index,
                    message,
                    logprobs=r.chat_logprobs(named(delta.logprobs)) if delta.logprobs else None,
                    finish_reason=output.finish_reason(delta.finish_reason),
                    stop_reason=r.stop_reason(delta, params.stop_token_ids),
                )
                if body.return_token_ids:
                    chunk["choices"][0]["token_ids"] = delta.token_ids
                yield r.sse(usage_so_far(chunk, delta.index))
            if body.include_usage:
                yield r.sse(
                    with_prediction_usage(
                        r.usage_chunk(
                            rid,
                            model.name,
                            created,
                            "chat.completion.chunk",
                            group.prompt_tokens,
                            completion_tokens,
                            group.cached_tokens,
                        )
                    )
                )
            yield r.DONE

        def named(items: list) -> list:
            return r.as_token_ids(items) if body.return_tokens_as_token_ids else items

        def with_prediction_usage(out: dict) -> dict:
            details = group.prediction_usage()
            if details is not None:  # (OpenAI's: only where the request had a prediction)
                out["usage"]["completion_tokens_details"] = details
            return out

        def build(choices: list[r.Choice]) -> dict:
            for choice in choices:
                choice.logprobs = named(choice.logprobs)
                if choice.prompt_logprobs is not None:
                    choice.prompt_logprobs = named(choice.prompt_logprobs)
            out = r.chat_completion(
                rid,
                model.name,
                choices,
                group.prompt_tokens,
                body.logprobs,
                new_output,
                body.prompt_logprobs,
                params.stop_token_ids,
                group.cached_tokens,
            )
            with_prediction_usage(out)
            if echoed:  # (an answer of tool calls alone, content null, gets the text as content)
                for choice in out["choices"]:
                    choice["message"]["content"] = echoed + (choice["message"]["content"] or "")
            return (
                r.add_token_ids(out, choices, group.choice_prompt_ids, False)
                if body.return_token_ids
                else out
            )

        return with_request_id(await respond(group, request, body.stream, chunks, build), given, rid)

    # ---------------------------------------------------------------- completions

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body)
        given = client_request_id(request, body.request_id)
        fields = body.sampling_fields()
        # echo with max_tokens 0 (OpenAI's legacy way to score a text): the prompt alone comes back,
        # with its logprobs if asked; one token is generated and dropped
        score_only = body.echo and body.max_tokens == 0
        if score_only:
            fields = score_only_fields(fields, SCORE_ONLY_ECHO)
        params = sampling_params(fields, {"grammar": body.grammar_field}, model)
        # echo with logprobs: the prompt's tokens get theirs too (computed whole: no prefix cache)
        echo_logprobs = body.echo and body.logprobs is not None
        if echo_logprobs:
            k = max(body.logprobs or 0, body.prompt_logprobs or 0)
            params = dataclasses.replace(params, prompt_logprobs=k)
        try:
            prompts = body.prompts()
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt") from exc
        # (a list of strings or of token id lists; a list of ids is one prompt)
        batch = isinstance(body.prompt, list) and not isinstance(body.prompt[0], int)
        for prompt in prompts:
            if not isinstance(prompt, str):
                check_token_ids(prompt, model.vocab_size, "prompt")
        # echo: each choice starts with its prompt's text (choices are n per prompt, in order);
        # decoded before any engine request exists, so nothing is left running if this fails
        echoes = [""] * (len(prompts) * body.n)
        # echo of a truncated prompt: what was kept, known once admitted (its ids come back)
        echo_kept = body.echo and params.truncate_prompt_tokens is not None
        if body.echo and not echo_kept:
            texts = [
                p if isinstance(p, str) else await tokenizer.run(lambda t, ids=p: t.decode(ids))
                for p in prompts
            ]
            echoes = [text for text in texts for _ in range(body.n)]
        group = RequestGroup(state)
        group.set_timeout(body.timeout)
        group.set_priority(body.priority)
        group.set_cache_salt(body.cache_salt)
        group.expect(len(prompts) * body.n, "n" if body.n > 1 else "prompt")
        with group.admitting():  # (a prompt refused withdraws those admitted before it)
            for i, prompt in enumerate(prompts):
                source = {"text": prompt} if isinstance(prompt, str) else {"input_ids": prompt}
                # a batch's errors name the prompt they are about
                with (
                    fields_named({"prompt": f"prompt.{i}" if batch else "prompt"}),
                    room_to_score(score_only, model, SCORE_ONLY_ECHO),
                ):
                    await group.add(
                        params,
                        body.n,
                        **source,
                        grammar_field=body.grammar_field,
                        return_prompt_ids=body.return_token_ids or echo_kept,
                        default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
                        add_special_tokens=body.add_special_tokens,
                    )
            if echo_kept:
                echoes = [
                    await tokenizer.run(lambda t, ids=ids: t.decode(ids)) for ids in group.choice_prompt_ids
                ]
        rid, created = f"cmpl-{given}" if given else r.new_id("cmpl"), int(time.time())
        name_group(group, given, rid)
        with_logprobs = body.logprobs is not None

        produced = [0] * group.num_choices  # each choice's completion tokens so far

        def usage_so_far(chunk: dict, index: int) -> dict:
            return _with_usage(chunk, body.continuous_usage, group, produced, index)

        as_ids = body.return_tokens_as_token_ids

        unannounced = set(range(group.num_choices)) if body.return_token_ids else set()

        def with_ids(chunk: dict, index: int, token_ids: list[int]) -> dict:
            """return_token_ids: the chunk's token ids, and the prompt's on the choice's first chunk."""
            if body.return_token_ids:
                chunk["choices"][0]["token_ids"] = token_ids
                if index in unannounced:
                    unannounced.discard(index)
                    chunk["choices"][0]["prompt_token_ids"] = group.choice_prompt_ids[index]
            return chunk

        async def chunks() -> AsyncIterator[str]:
            completion_tokens = 0
            # each choice's offsets count on from chunk to chunk (a character's tokens may straddle two)
            offsets = [r.TextOffsets() for _ in range(group.num_choices)]
            # echo with logprobs: the prompt's text goes out with its tokens' logprobs, which come
            # with the choice's first delta (a chunk of its own before them left the next chunk's
            # logprobs the prompt's tokens and the new ones under the new text alone)
            pending = list(echoes) if echo_logprobs else [""] * group.num_choices
            for i, echo in enumerate(echoes):
                if echo and not echo_logprobs:
                    chunk = with_ids(r.completion_chunk(rid, model.name, created, i, echo), i, [])
                    yield r.sse(usage_so_far(chunk, i))
            async for delta in group.deltas():
                if delta.finish_reason == "error":
                    # The status line went out long ago: the error is an event, and [DONE] still
                    # tells the client the stream ended on purpose.
                    yield sse_error(delta.error, delta.error_status, delta.error_param, delta.error_code)
                    yield r.DONE
                    return
                if score_only:
                    drop_generated(delta)
                completion_tokens += len(delta.token_ids)
                produced[delta.index] += len(delta.token_ids)
                if pending[delta.index]:
                    delta.text, pending[delta.index] = pending[delta.index] + delta.text, ""
                if (
                    not delta.text
                    and delta.finish_reason is None
                    and not delta.logprobs
                    and delta.prompt_logprobs is None
                    and not (body.return_token_ids and delta.token_ids)
                ):
                    continue
                logprobs = None
                if echo_logprobs and delta.prompt_logprobs is not None:
                    # the prompt's tokens first (their text is the echo, at the chunk's start)
                    items = r.top_cut([e for e in delta.prompt_logprobs if e is not None], body.logprobs)
                    logprobs = r.completion_logprobs(items + delta.logprobs, offsets[delta.index], as_ids)
                elif delta.logprobs:
                    logprobs = r.completion_logprobs(delta.logprobs, offsets[delta.index], as_ids)
                chunk = r.completion_chunk(
                    rid,
                    model.name,
                    created,
                    delta.index,
                    delta.text,
                    logprobs=logprobs,
                    finish_reason=delta.finish_reason,
                    stop_reason=r.stop_reason(delta, params.stop_token_ids),
                )
                yield r.sse(usage_so_far(with_ids(chunk, delta.index, delta.token_ids), delta.index))
            if body.include_usage:
                yield r.sse(
                    r.usage_chunk(
                        rid,
                        model.name,
                        created,
                        "text_completion",
                        group.prompt_tokens,
                        completion_tokens,
                        group.cached_tokens,
                    )
                )
            yield r.DONE

        def build(choices: list[r.Choice]) -> dict:
            for choice in choices:
                if score_only:
                    drop_generated(choice)
                choice.text = echoes[choice.index] + choice.text
                if echo_logprobs and choice.prompt_logprobs is not None:
                    prompt = [e for e in choice.prompt_logprobs if e is not None]
                    choice.logprobs = r.top_cut(prompt, body.logprobs) + choice.logprobs
                if as_ids and choice.prompt_logprobs is not None:
                    choice.prompt_logprobs = r.as_token_ids(choice.prompt_logprobs, keep_bytes=False)
            out = r.completion(
                rid,
                model.name,
                choices,
                group.prompt_tokens,
                with_logprobs,
                body.prompt_logprobs,
                params.stop_token_ids,
                as_ids,
                group.cached_tokens,
            )
            return (
                r.add_token_ids(out, choices, group.choice_prompt_ids, True) if body.return_token_ids else out
            )

        return with_request_id(await respond(group, request, body.stream, chunks, build), given, rid)

    # ---------------------------------------------------------------- info

    def model_card(name: str) -> dict:
        return {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "minisgl",
            "root": model.path,
            "max_model_len": model.max_model_len,
            # token ids a prompt may use: [0, vocab_size) (bench serve builds prompts from it)
            "vocab_size": model.vocab_size,
        }

    @router.get("/v1/models")
    async def models() -> dict:
        # one card per name a request may send, as vLLM lists its served names
        return {"object": "list", "data": [model_card(name) for name in (model.name, *model.aliases)]}

    @router.get("/v1/models/{model_id:path}")
    async def model_info(model_id: str) -> dict:
        model.check_name(model_id)
        return model_card(model_id if model_id in model.aliases else model.name)

    return router


def name_group(group: RequestGroup, given: str | None, answer_id: str) -> None:
    """What /abort_request finds the request by: the client's id (if any) and the answer's."""
    if given:
        group.name(given)
    group.name(answer_id)


def _with_usage(chunk: dict, on: bool, group: RequestGroup, produced: list[int], index: int) -> dict:
    """``chunk`` with the usage so far of its choice when ``on`` (vLLM's continuous_usage_stats)."""
    if on:
        chunk["usage"] = r.usage(group.choice_prompt_tokens[index], produced[index])
    return chunk
