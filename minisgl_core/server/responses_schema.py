"""The body of OpenAI's Responses API (``POST /v1/responses``), validated, and turned into the chat
request that runs it: /v1/responses is a front of the chat pipeline, not a second engine path.

``input`` (a string, or a list of items: messages, ``function_call`` and ``function_call_output``
items, ``reasoning`` items sent back) becomes the chat ``messages`` (``instructions`` a system
message first), the flat function ``tools`` chat's nested ones, ``text.format`` the
``response_format`` and ``max_output_tokens`` the ``max_tokens``; with ``previous_response_id``,
that stored response's conversation and output (``responses_store``) come before ``input``. What
needs state minisgl does not keep (``conversation``, ``background``, ``prompt`` templates), a
tool it does not run (web search, file search...) or what it does not make (reasoning summaries,
encrypted reasoning) is a 400 saying what to send instead. :class:`InputTokensRequest`, the body
of ``POST /v1/responses/input_tokens``, has the fields that make the prompt (:class:`ResponsesInput`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from minisgl_core.request_limits import MAX_CACHE_SALT_CHARS
from minisgl_core.sampling import INT64_MAX, INT64_MIN, short_repr
from minisgl_core.server.errors import APIError, validation_error
from minisgl_core.server.schemas import (
    MAX_TIMEOUT_S,
    BodyError,
    Bool,
    ChatCompletionRequest,
    Float,
    FreeObject,
    FunctionDefinition,
    Int,
    ReasoningEffort,
    StreamOptions,
    StrictModel,
    Text,
    default_verbosity_only,
    in_memory_cache_only,
)

#: the ``include`` that asks for logprobs on each output_text part (with ``top_logprobs``)
INCLUDE_LOGPROBS = "message.output_text.logprobs"
#: what a stateless client (``store: false``) asks for to carry reasoning between turns: taken, and
#: no item carries it (minisgl encrypts nothing: a reasoning item sent back as it came carries its
#: text in ``content``, which is what the next turn needs)
INCLUDE_ENCRYPTED_REASONING = "reasoning.encrypted_content"
#: OpenAI's bounds on ``metadata``: pairs, and the characters of a key and of a value
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
#: where the fix for a request that needs stored state is the same
WHOLE_CONVERSATION = (
    "minisgl stores no conversations: send the whole conversation in input (the earlier input "
    "items and each response's output items), or continue a stored response with previous_response_id"
)


class _Refused(BodyError):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, field, "unsupported_field")


# ------------------------------------------------------------------ input items


class InputText(StrictModel):
    """A text part: ``input_text`` (what a user, system or developer says) or ``output_text`` (an
    assistant's, sent back as the server answered it, with its annotations and logprobs)."""

    type: Literal["input_text", "output_text"]
    text: Text
    annotations: list[FreeObject] | None = None
    logprobs: list[FreeObject] | None = None


class Refusal(StrictModel):
    type: Literal["refusal"]
    refusal: Text


def _part_kind(part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return "Refusal" if kind == "refusal" else "InputText"


#: (the union's tags are the class names: errors leave them out of the path, see errors.py)
Part = Annotated[
    Annotated[InputText, Tag("InputText")] | Annotated[Refusal, Tag("Refusal")], Discriminator(_part_kind)
]
#: the text parts the served models read; another part (an image, a file, audio) is refused by name
TEXT_PARTS = ("input_text", "output_text", "refusal")
#: Responses' item statuses (sent back with the items of an earlier response)
Status = Literal["in_progress", "completed", "incomplete"]


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Text | list[Part]
    id: Text | None = None
    status: Status | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str | list[dict[str, str]]:
        if isinstance(self.content, str):
            return self.content
        return [
            {"type": "refusal", "refusal": p.refusal}
            if isinstance(p, Refusal)
            else {"type": "text", "text": p.text}
            for p in self.content
        ]


class FunctionCallItem(StrictModel):
    """A call the model made (an earlier response's output item), sent back with its output."""

    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text
    id: Text | None = None
    status: Status | None = None


class FunctionCallOutputItem(StrictModel):
    type: Literal["function_call_output"]
    call_id: Text
    output: Text | list[InputText]
    id: Text | None = None
    status: Status | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "\n".join(p.text for p in self.output)


class ReasoningText(StrictModel):
    type: Literal["reasoning_text", "summary_text"]
    text: Text


class ReasoningItem(StrictModel):
    """The reasoning of an earlier response, sent back: the next assistant turn's reasoning."""

    type: Literal["reasoning"]
    summary: list[ReasoningText]
    content: list[ReasoningText] | None = None
    id: Text | None = None
    status: Status | None = None
    #: only OpenAI can read its encrypted reasoning; minisgl returns none
    encrypted_content: None = None

    def text(self) -> str:
        return "\n".join(p.text for p in (self.content or self.summary))


ITEM_KINDS = {"message": MessageItem, "function_call": FunctionCallItem,
              "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}  # fmt: skip


def _item_kind(item: Any) -> str:
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return (ITEM_KINDS.get(kind, MessageItem) if isinstance(kind, str) else MessageItem).__name__


InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")],
    Discriminator(_item_kind),
]
#: the id prefix of an input item stored without one, by its type
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
#: a stored conversation read back (``responses_store``): the items it was stored as
HISTORY = TypeAdapter(list[InputItem])


# ------------------------------------------------------------------ tools and formats


class FunctionTool(FunctionDefinition):
    """Responses' function tool: chat's ``function`` fields (name, description, parameters,
    strict) at the top level, beside its ``type``."""

    type: Literal["function"]


class FunctionChoice(StrictModel):
    type: Literal["function"]
    name: Text


#: the tool_choice values a 400 names
TOOL_CHOICES = '{"type": "function", "name": ...}, or "none", "auto" or "required"'


class TextFormat(StrictModel):
    """``text.format``: plain text, any JSON object, or JSON following ``schema``."""

    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = None
    description: Text | None = None
    schema_: FreeObject | None = Field(default=None, alias="schema")
    strict: Bool | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> TextFormat:
        schema_fields = [
            k for k in ("name", "description", "schema_", "strict") if getattr(self, k) is not None
        ]
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError('type "json_schema" needs a name and a schema')
        if self.type != "json_schema" and schema_fields:
            raise ValueError(f'{schema_fields[0].rstrip("_")} goes with type "json_schema" only')
        return self

    def response_format(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        spec = {
            "name": self.name,
            "schema": self.schema_,
            "description": self.description,
            "strict": self.strict,
        }
        return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}


class TextConfig(StrictModel):
    format: TextFormat | None = None
    #: (see :func:`~minisgl_core.server.schemas.default_verbosity_only`)
    verbosity: Literal["low", "medium", "high"] | None = None

    @field_validator("verbosity", mode="before")
    @classmethod
    def _default_verbosity_only(cls, value: Any) -> Any:
        return default_verbosity_only(value, "text.verbosity")


class ReasoningConfig(StrictModel):
    """The effort is the chat template's variable ``reasoning_effort``, as chat's field of that
    name (a template that does not read it ignores it); the served model reasons as its template
    and ``--reasoning-parser`` make it, and its reasoning comes back whole, as the reasoning
    item's ``content``. minisgl writes no summary: ``summary: "auto"`` (the model's choice; what
    agents such as Codex send by default) is taken and the item's ``summary`` is an empty list, as
    vLLM does; ``"concise"`` or ``"detailed"`` asks for one and is refused (an empty list there
    would be a silent wrong answer)."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    #: (OpenAI's older name for ``summary``)
    generate_summary: Literal["auto", "concise", "detailed"] | None = None

    @field_validator("summary", "generate_summary", mode="before")
    @classmethod
    def _no_summaries(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and value != "auto":
            raise _Refused(
                "reasoning summaries are not supported: minisgl writes none; the reasoning item's "
                "content holds the model's reasoning text whole (with the server's --reasoning-parser); "
                f'leave reasoning.{info.field_name} out, or "auto"',
                f"reasoning.{info.field_name}",
            )
        return value


# ------------------------------------------------------------------ the body


class ResponsesInput(StrictModel):
    """What a Responses request runs on: the fields that make its prompt (``input``,
    ``instructions``, ``tools``, ``reasoning``, ``previous_response_id``...), which
    ``POST /v1/responses/input_tokens`` takes too (:class:`InputTokensRequest`), and the chat
    request they become."""

    model: Text | None = None
    input: Text | list[InputItem]
    instructions: Text | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: Bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["disabled", "auto"] = "disabled"
    #: a stored response whose conversation, then its output, come before ``input``
    previous_response_id: Text | None = None
    # what needs state minisgl does not keep: refused below, with what to send instead
    # (in the order of schemas.StructuredOutputs.json_: typing caches a union by its members,
    # so the first spelled in a process was both fields' and the published schema's order changed
    # with what a process imported first)
    conversation: FreeObject | Text | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_stateful(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("conversation") is not None:
            raise _Refused(f"not supported: {WHOLE_CONVERSATION}", "conversation")
        if data.get("truncation") == "auto":
            raise _Refused(
                '"auto" is not supported: minisgl does not drop input items; leave truncation '
                '"disabled" and shorten the input',
                "truncation",
            )
        return data

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, items: Any) -> Any:
        # before the union's checks, whose 400 for {"type": "web_search_call"} or an input_image
        # part would be about a message's missing role; also the index a 400 names
        if isinstance(items, list):
            if not items:
                raise BodyError("input is empty: give at least one item", "input")
            for i, item in enumerate(items):
                kind = item.get("type", "message") if isinstance(item, dict) else None
                if isinstance(kind, str) and kind not in ITEM_KINDS:
                    raise _Refused(
                        f"items of type {short_repr(kind)} are not supported: send messages, "
                        "function_call, function_call_output and reasoning items",
                        f"input.{i}.type",
                    )
                # (a message's content, a function_call_output's output: a tool's image is as unread)
                parts_of = {"message": "content", "function_call_output": "output"}
                field = parts_of.get(kind) if isinstance(kind, str) else None
                parts = item.get(field) if field is not None else None
                for j, part in enumerate(parts if isinstance(parts, list) else ()):
                    part_kind = part.get("type") if isinstance(part, dict) else None
                    if isinstance(part_kind, str) and part_kind not in TEXT_PARTS:
                        raise _Refused(
                            f"content parts of type {short_repr(part_kind)} are not supported: the "
                            "served models take text only (input_text)",
                            f"input.{i}.{field}.{j}.type",
                        )
        return items

    @field_validator("tools", mode="before")
    @classmethod
    def _functions_only(cls, tools: Any) -> Any:
        for i, tool in enumerate(tools if isinstance(tools, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise _Refused(
                    f"type {short_repr(kind)} is not supported: minisgl runs no tools of its "
                    'own; give functions (type "function") for your code to run',
                    f"tools.{i}.type",
                )
        return tools

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choices_only(cls, choice: Any) -> Any:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise _Refused(
                f"type {short_repr(kind)} is not supported: minisgl calls functions; send {TOOL_CHOICES}",
                "tool_choice",
            )
        return choice

    def input_items(self) -> list[InputItem]:
        """``input`` as items: a string is a user message (none: no items, a count's without input)."""
        if self.input is None:
            return []
        return [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input

    def stored_items(self, history: Sequence[InputItem] = ()) -> list[dict[str, Any]]:
        """The items this request runs on, as JSON, in the order they are rendered: ``history``
        (a previous response's conversation and output), then ``input``. What a stored response
        keeps (``instructions`` are not: each request gives its own, as OpenAI's)."""
        items = [i.model_dump(by_alias=True, exclude_none=True) for i in [*history, *self.input_items()]]
        for item in items:  # (OpenAI names each: GET .../input_items pages by these ids)
            item.setdefault("id", f"{_ITEM_PREFIX[item['type']]}_{uuid.uuid4().hex}")
        return items

    def chat_request(self, history: Sequence[InputItem] = ()) -> tuple[ChatCompletionRequest, list[str]]:
        """The chat request that runs this one after ``history`` (the items of its
        ``previous_response_id``, :data:`HISTORY`), and for each of its messages the field it
        came from (``instructions``, ``input.3``, ``previous_response_id``), for
        :func:`responses_names`."""
        self._distinct_ids(history)
        self._calls_answered(history)
        messages, origins = self._messages(history)
        chat: dict[str, Any] = {
            "messages": messages,
            "parallel_tool_calls": self.parallel_tool_calls,
            **self._generation_fields(),
        }
        if self.tools:
            chat["tools"] = [
                {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                for t in self.tools
            ]
        if isinstance(self.tool_choice, FunctionChoice):
            chat["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        else:
            chat["tool_choice"] = self.tool_choice
        if self.text is not None and self.text.format is not None:
            chat["response_format"] = self.text.format.response_format()
        if self.reasoning is not None:
            chat["reasoning_effort"] = self.reasoning.effort
        with responses_names(origins):
            try:
                return ChatCompletionRequest.model_validate(chat), origins
            except ValidationError as exc:  # (a message the chat route refuses: a role's rules)
                raise validation_error(RequestValidationError(exc.errors())) from None

    def _generation_fields(self) -> dict[str, Any]:
        """The chat fields of how the answer is generated (none here: a count generates nothing)."""
        return {}

    def _distinct_ids(self, history: Sequence[InputItem]) -> None:
        """OpenAI's 400 for an input item whose id an earlier item of the conversation has (one
        of ``history``, ``previous_response_id``'s, when a client sends that response's output
        again): the turn would run twice, and GET .../input_items, which pages by id, would loop."""
        earlier = {item.id for item in history if item.id is not None}
        seen = set(earlier)
        for i, item in enumerate(self.input if isinstance(self.input, list) else ()):
            if item.id is None:
                continue
            if item.id in seen:
                where = (
                    "previous_response_id's conversation" if item.id in earlier else "an earlier input item"
                )
                raise APIError(
                    400,
                    f"Duplicate item found with id {short_repr(item.id)} ({where} has it): remove "
                    "duplicate items from your input",
                    f"input.{i}.id",
                )
            seen.add(item.id)

    def _calls_answered(self, history: Sequence[InputItem]) -> None:
        """OpenAI's 400s for function calls and outputs that do not pair up, in the conversation
        (``history``, then ``input``): an output whose call_id no earlier function_call has ("No
        tool call found for function call output..."; the chat template rendered a tool result
        after no call of that id), a call with no output after it ("No tool output found for
        function call ...", param ``input``: the model would answer as if the call had returned
        nothing), and a call_id two calls, or two outputs, share (which call an output answers
        is ambiguous)."""
        items = [*history, *self.input_items()]
        unanswered: dict[str, bool] = {}  # each call's call_id: whether no output answered it yet
        for i, item in enumerate(items, start=-len(history)):
            if not isinstance(item, FunctionCallItem | FunctionCallOutputItem):
                continue
            param = f"input.{i}.call_id" if i >= 0 else "previous_response_id"
            call_id = short_repr(item.call_id)
            if isinstance(item, FunctionCallItem):
                if item.call_id in unanswered:
                    raise APIError(
                        400,
                        f"Duplicate function call with call_id {call_id}: each function_call item "
                        "needs a call_id of its own",
                        param,
                    )
                unanswered[item.call_id] = True
            elif item.call_id not in unanswered:
                raise APIError(
                    400,
                    f"No tool call found for function call output with call_id {call_id}: send the "
                    "function_call item it answers in input before it, or the previous_response_id "
                    "of the response that made the call",
                    param,
                )
            elif not unanswered[item.call_id]:
                raise APIError(
                    400,
                    f"Duplicate function call output for call_id {call_id}: send one "
                    "function_call_output per function_call",
                    param,
                )
            else:
                unanswered[item.call_id] = False
        missing = next((call_id for call_id, open_ in unanswered.items() if open_), None)
        if missing is not None:
            raise APIError(
                400,
                f"No tool output found for function call {short_repr(missing)}: send its function_call_output "
                "item (the result of running it) in input after it",
                "input",
            )

    def _messages(self, history: Sequence[InputItem]) -> tuple[list[dict[str, Any]], list[str]]:
        """Chat messages: a function_call item joins the assistant message before it (calls in a
        row are one turn's), a reasoning item the assistant message right after it, or, with none
        there (an output cut off mid-reasoning, sent back before the next user message), is an
        assistant turn of reasoning alone where it stands."""
        messages: list[dict[str, Any]] = []
        origins: list[str] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
            origins.append("instructions")
        items = [*history, *self.input_items()]
        reasoning: str | None = None  # reasoning items' text, for the next assistant message
        reasoning_origin = ""

        def reasoning_alone() -> None:
            nonlocal reasoning
            if reasoning is not None:
                messages.append({"role": "assistant", "content": "", "reasoning_content": reasoning})
                origins.append(reasoning_origin)
                reasoning = None

        for i, item in enumerate(items, start=-len(history)):
            where = (
                "previous_response_id" if i < 0 else "input" if isinstance(self.input, str) else f"input.{i}"
            )
            if isinstance(item, ReasoningItem):
                reasoning = item.text() if reasoning is None else f"{reasoning}\n{item.text()}"
                reasoning_origin = where
                continue
            if isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                last = messages[-1] if messages else None
                if reasoning is None and last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                    continue
                message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            elif isinstance(item, FunctionCallOutputItem):
                message = {"role": "tool", "tool_call_id": item.call_id, "content": item.text()}
            else:
                message = {"role": item.role, "content": item.text()}
            if message["role"] != "assistant":
                reasoning_alone()  # (before the user's next message, not after it)
            elif reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
            origins.append(where)
        reasoning_alone()  # reasoning last
        return messages, origins


class ResponsesRequest(ResponsesInput):
    """The body of ``POST /v1/responses``: what it runs on, and how to generate the answer."""

    max_output_tokens: Int | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_logprobs: Int | None = None
    include: list[Text] | None = None
    stream: Bool = False
    stream_options: StreamOptions | None = None
    #: echoed on the response (and kept with it when stored)
    metadata: dict[Text, Text] | None = None
    #: keep the finished response for GET /v1/responses/{id} and previous_response_id (OpenAI's default)
    store: Bool = True
    user: Text | None = None
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None
    #: (see :func:`~minisgl_core.server.schemas.in_memory_cache_only`)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    #: a bound on calls to OpenAI's built-in tools: minisgl runs none, so any bound holds
    max_tool_calls: Int | None = Field(default=None, ge=0, le=INT64_MAX)
    service_tier: Literal["auto", "default"] | None = None
    #: minisgl's, as chat's: seconds after which the request ends with a timeout error
    timeout: Float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    #: vLLM's, as chat's: lower runs earlier; not 0 only with ``--policy priority``
    priority: Int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    #: vLLM's, as chat's: prefix-cache entries shared only with requests of the same salt
    cache_salt: Text | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    # more that needs state minisgl does not keep (see ResponsesInput.conversation)
    background: Bool = False
    prompt: FreeObject | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_background_and_stored_prompts(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("background") is True:
            raise _Refused(
                "not supported: minisgl answers within the request; leave background false "
                "(stream for output as it comes; closing the connection stops a response, streamed "
                "or not)",
                "background",
            )
        if data.get("prompt") is not None:
            raise _Refused(
                "stored prompt templates are not supported: send the text in instructions and input",
                "prompt",
            )
        return data

    @field_validator("prompt_cache_retention", mode="before")
    @classmethod
    def _in_memory_only(cls, value: Any) -> Any:
        return in_memory_cache_only(value, "prompt_cache_retention")

    @field_validator("metadata")
    @classmethod
    def _openais_metadata_bounds(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        # (a client built against minisgl would meet OpenAI's 400 only once deployed there)
        if metadata is None:
            return None
        long_key = next((key for key in metadata if len(key) > METADATA_KEY_CHARS), None)
        long_value = next((key for key, value in metadata.items() if len(value) > METADATA_VALUE_CHARS), None)
        if len(metadata) > METADATA_PAIRS:
            got = f"{len(metadata)} pairs"
        elif long_key is not None:
            got = f"a key of {len(long_key)} characters"
        elif long_value is not None:
            got = f"a value of {len(metadata[long_value])} characters (key {short_repr(long_value)})"
        else:
            return metadata
        raise ValueError(
            f"at most {METADATA_PAIRS} pairs, keys of at most {METADATA_KEY_CHARS} characters and values "
            f"of at most {METADATA_VALUE_CHARS} characters, as OpenAI's; got {got}"
        )

    @field_validator("include")
    @classmethod
    def _served_includes(cls, include: list[str]) -> list[str]:
        served = (INCLUDE_LOGPROBS, INCLUDE_ENCRYPTED_REASONING)
        other = next((value for value in include if value not in served), None)
        if other is not None:
            raise _Refused(
                f"{short_repr(other)} is not supported; the includes served are {INCLUDE_LOGPROBS!r} "
                f"and {INCLUDE_ENCRYPTED_REASONING!r} (minisgl encrypts no reasoning: a reasoning item "
                "sent back as it came carries its text)",
                "include",
            )
        return include

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, options: StreamOptions, info: Any) -> StreamOptions:
        if not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")
        if options.include_usage is not None or options.continuous_usage_stats:
            raise ValueError("takes include_obfuscation only (the last event carries the usage)")
        return options

    @model_validator(mode="after")
    def _logprobs_asked(self) -> ResponsesRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise BodyError(
                f'needs include: ["{INCLUDE_LOGPROBS}"], which asks for the logprobs',
                "top_logprobs",
            )
        return self

    @property
    def logprobs(self) -> bool:
        return INCLUDE_LOGPROBS in (self.include or ())

    def _generation_fields(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "timeout": self.timeout,
            "priority": self.priority,
            "cache_salt": self.cache_salt,
        }


class InputTokensRequest(ResponsesInput):
    """The body of ``POST /v1/responses/input_tokens`` (``client.responses.input_tokens.count``):
    the fields of a Responses request that make its prompt, ``input`` optional (without it, the
    conversation of ``previous_response_id`` is counted)."""

    input: Text | list[InputItem] | None = None

    @model_validator(mode="after")
    def _something_to_count(self) -> InputTokensRequest:
        if self.input is None and self.previous_response_id is None:
            raise BodyError(
                "give the input to count, or a previous_response_id to count its conversation", "input"
            )
        return self


#: chat's names for the fields of a Responses body, where they differ
_RENAMES = [
    (re.compile(r"(?<![\w.])max_tokens(?!\w)"), "max_output_tokens"),
    (re.compile(r"(?<![\w.])response_format(\.json_schema)?(?![\w])"), "text.format"),
    (re.compile(r"(?<![\w.])tools\.(\d+)\.function(?![\w])"), r"tools.\1"),
]


def responses_renamed(text: str, origins: list[str]) -> str:
    """``text`` (a 400's message or param) with the chat request's field names replaced by the
    Responses body's (see :func:`responses_names`)."""
    for pattern, name in _RENAMES:
        text = pattern.sub(name, text)
    return re.sub(
        r"(?<![\w.])messages(?:\.(\d+))?(?![\w])",
        lambda m: origins[int(m.group(1))] if m.group(1) and int(m.group(1)) < len(origins) else "input",
        text,
    )


@contextmanager
def responses_names(origins: list[str]) -> Iterator[None]:
    """A 400 raised while the chat pipeline runs a Responses request names the Responses body's
    fields (``max_output_tokens``, ``text.format``, ``tools.0.parameters``, ``input.3``), in its
    param and its message, where it named the chat request's; ``origins``: each chat message's."""
    try:
        yield
    except APIError as exc:
        if exc.status == 400:
            exc.message = responses_renamed(exc.message, origins)
            exc.param = responses_renamed(exc.param, origins) if exc.param else exc.param
        raise
