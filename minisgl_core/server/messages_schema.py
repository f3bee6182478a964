"""The body of Anthropic's Messages API (``POST /v1/messages``), validated, and turned into the chat
request that runs it: /v1/messages is a front of the chat pipeline, as /v1/responses is.

``system`` becomes a system message first; a user turn's ``tool_result`` blocks each a ``tool``
message (before the turn's text), an assistant turn's ``thinking`` blocks its
``reasoning_content`` and its ``tool_use`` blocks its ``tool_calls``; the custom ``tools`` chat's
functions (``input_schema`` their parameters) and ``tool_choice`` chat's (``any`` is
``required``); ``stop_sequences`` is ``stop``, ``metadata.user_id`` the ``user``; ``thinking``
the chat template's ``enable_thinking`` (:class:`ThinkingConfig`). A conversation that ends with
the assistant's text is continued (``continue_final_message``), Anthropic's prefill. What the
chat path cannot run (images, documents, server tools, ...) is a 400 naming the field.
``cache_control`` is taken and changes nothing: minisgl's prefix cache reuses every prompt's
prefix on its own. :class:`CountTokensRequest` is the body of ``POST /v1/messages/count_tokens``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from minisgl_core.sampling import short_repr
from minisgl_core.server.errors import APIError, validation_error
from minisgl_core.server.schemas import (
    BodyError,
    Bool,
    ChatCompletionRequest,
    Float,
    FreeObject,
    Int,
    StrictModel,
    Text,
)

#: the content blocks the chat path can run; any other (image, document, search_result,
#: redacted_thinking, server tools' blocks...) is refused by name
BLOCK_KINDS = ("text", "tool_use", "tool_result", "thinking")


class _Refused(BodyError):
    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, field, "unsupported_field")


class TextBlock(StrictModel):
    type: Literal["text"]
    text: Text
    #: prompt caching is automatic in minisgl (its prefix cache): taken, changes nothing
    cache_control: FreeObject | None = None


class ToolUseBlock(StrictModel):
    """A call the assistant made, sent back with its result."""

    type: Literal["tool_use"]
    id: Text
    name: Text
    input: FreeObject
    cache_control: FreeObject | None = None


class ToolResultBlock(StrictModel):
    type: Literal["tool_result"]
    tool_use_id: Text
    content: Text | list[TextBlock] = ""
    is_error: Bool = False
    cache_control: FreeObject | None = None

    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "\n".join(b.text for b in self.content)
        # chat's tool message has no error flag: the model reads it in the text
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(StrictModel):
    """The assistant's reasoning, sent back: that turn's ``reasoning_content``. Its signature is
    the one minisgl gave (empty): nothing is checked."""

    type: Literal["thinking"]
    thinking: Text
    signature: Text | None = None


_BLOCK_TAGS = {"text": "TextBlock", "tool_use": "ToolUseBlock", "tool_result": "ToolResultBlock",
               "thinking": "ThinkingBlock"}  # fmt: skip


def _block_kind(block: Any) -> str:
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    return _BLOCK_TAGS.get(kind, "TextBlock") if isinstance(kind, str) else "TextBlock"


#: (the union's tags are the class names: errors leave them out of the path, see errors.py)
Block = Annotated[
    Annotated[TextBlock, Tag("TextBlock")]
    | Annotated[ToolUseBlock, Tag("ToolUseBlock")]
    | Annotated[ToolResultBlock, Tag("ToolResultBlock")]
    | Annotated[ThinkingBlock, Tag("ThinkingBlock")],
    Discriminator(_block_kind),
]


class Message(StrictModel):
    role: Literal["user", "assistant"]
    content: Text | list[Block]


class Tool(StrictModel):
    """A custom tool (Anthropic's server tools, which it runs itself, are refused)."""

    name: Text
    input_schema: FreeObject
    description: Text | None = None
    type: Literal["custom"] | None = None
    cache_control: FreeObject | None = None


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: Text | None = None
    disable_parallel_tool_use: Bool | None = None

    @model_validator(mode="after")
    def _name_iff_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('type "tool" needs the tool\'s name; the other types take none')
        return self


class Metadata(StrictModel):
    user_id: Text | None = None


class ThinkingConfig(StrictModel):
    """Whether the model thinks: the chat template's ``enable_thinking`` (``enabled`` true,
    ``disabled`` false, ``adaptive`` the template's default), as chat's ``chat_template_kwargs``
    sets it; a template that does not read it ignores it. minisgl cannot end the thinking at a
    budget of its own (its reasoning and answer share ``max_tokens``): ``budget_tokens`` is taken
    where it bounds nothing more, at least ``max_tokens``."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Int | None = None
    #: adaptive's: thinking comes back as it is ("summarized": Anthropic's name for that)
    display: Literal["summarized"] | None = None


class MessagesInput(StrictModel):
    """What a Messages request runs on (what ``count_tokens`` takes too), and its chat request."""

    model: Text | None = None
    messages: list[Message] = Field(min_length=1)
    system: Text | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    #: (automatic caching, the request's: as a block's, taken and changing nothing)
    cache_control: FreeObject | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _known_blocks(cls, messages: Any) -> Any:
        # before the union's checks, whose 400 for an image would be about a text block's text
        for i, message in enumerate(messages if isinstance(messages, list) else ()):
            blocks = message.get("content") if isinstance(message, dict) else None
            for j, block in enumerate(blocks if isinstance(blocks, list) else ()):
                kind = block.get("type") if isinstance(block, dict) else None
                if isinstance(kind, str) and kind not in BLOCK_KINDS:
                    raise _Refused(
                        f"content blocks of type {short_repr(kind)} are not supported: minisgl's "
                        "models read text; send text, tool_use, tool_result and thinking blocks",
                        f"messages.{i}.content.{j}.type",
                    )
                results = block.get("content") if kind == "tool_result" else None
                for k, part in enumerate(results if isinstance(results, list) else ()):
                    part_kind = part.get("type") if isinstance(part, dict) else None
                    if isinstance(part_kind, str) and part_kind != "text":
                        raise _Refused(
                            f"tool results of type {short_repr(part_kind)} are not supported: send text",
                            f"messages.{i}.content.{j}.content.{k}.type",
                        )
        return messages

    @field_validator("tools", mode="before")
    @classmethod
    def _custom_tools_only(cls, tools: Any) -> Any:
        for i, tool in enumerate(tools if isinstance(tools, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind is not None and kind != "custom":
                raise _Refused(
                    f"tools of type {short_repr(kind)} are not supported: minisgl runs no tools of "
                    "its own; give custom tools (name, description, input_schema) for your code to run",
                    f"tools.{i}.type",
                )
        return tools

    def chat_request(self, generation: dict[str, Any]) -> tuple[ChatCompletionRequest, list[str]]:
        """The chat request that runs this one with ``generation`` (the fields of how the answer
        is generated), and each chat message's origin in this body (``system``, ``messages.2``),
        for :func:`messages_names`."""
        messages, origins = self._chat_messages()
        chat: dict[str, Any] = {"messages": messages, **generation}
        if self.tools:
            chat["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                }  # fmt: skip
                for t in self.tools
            ]
        if self.tool_choice is not None:
            choice = self.tool_choice
            named = {"type": "function", "function": {"name": choice.name}}
            chat["tool_choice"] = {"any": "required", "tool": named}.get(choice.type, choice.type)
            if choice.disable_parallel_tool_use is not None:
                chat["parallel_tool_calls"] = not choice.disable_parallel_tool_use
        if self.thinking is not None and self.thinking.type != "adaptive":
            chat["chat_template_kwargs"] = {"enable_thinking": self.thinking.type == "enabled"}
        last = messages[-1]
        if last["role"] == "assistant" and not last.get("tool_calls"):
            # Anthropic's prefill: the answer goes on from the assistant's text
            chat |= {"continue_final_message": True, "add_generation_prompt": False}
        with messages_names(origins):
            try:
                return ChatCompletionRequest.model_validate(chat), origins
            except ValidationError as exc:  # (a message the chat route refuses)
                raise validation_error(RequestValidationError(exc.errors())) from None

    def _chat_messages(self) -> tuple[list[dict[str, Any]], list[str]]:
        messages: list[dict[str, Any]] = []
        origins: list[str] = []
        if self.system is not None:
            system = self.system if isinstance(self.system, str) else "\n".join(b.text for b in self.system)
            messages.append({"role": "system", "content": system})
            origins.append("system")
        for i, message in enumerate(self.messages):
            where = f"messages.{i}"
            if isinstance(message.content, str):
                messages.append({"role": message.role, "content": message.content})
                origins.append(where)
                continue
            turn = (self._assistant_turn if message.role == "assistant" else self._user_turn)(
                message.content, where
            )
            messages += turn
            origins += [where] * len(turn)
        return messages, origins

    @staticmethod
    def _user_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
        """Each tool result a ``tool`` message, then the text (Anthropic's results come first)."""
        turn: list[dict[str, Any]] = []
        texts: list[str] = []
        for j, block in enumerate(blocks):
            if isinstance(block, ToolResultBlock):
                turn.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
            elif isinstance(block, TextBlock):
                texts.append(block.text)
            else:
                raise APIError(
                    400,
                    f"{where}.content.{j}.type: a user's message takes text and tool_result blocks, "
                    f"not {block.type}: send it in an assistant's message",
                    f"{where}.content.{j}.type",
                )
        if texts or not turn:
            turn.append({"role": "user", "content": "".join(texts)})
        return turn

    @staticmethod
    def _assistant_turn(blocks: list[Any], where: str) -> list[dict[str, Any]]:
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        for j, block in enumerate(blocks):
            if isinstance(block, TextBlock):
                message["content"] += block.text
            elif isinstance(block, ThinkingBlock):
                message["reasoning_content"] = message.get("reasoning_content", "") + block.thinking
            elif isinstance(block, ToolUseBlock):
                call = {"id": block.id, "type": "function",
                        "function": {"name": block.name, "arguments": json.dumps(block.input)}}  # fmt: skip
                message.setdefault("tool_calls", []).append(call)
            else:
                raise APIError(
                    400,
                    f"{where}.content.{j}.type: an assistant's message takes text, thinking and "
                    "tool_use blocks, not tool_result: send it in the user's message after it",
                    f"{where}.content.{j}.type",
                )
        if message.get("tool_calls") and not message["content"]:
            message["content"] = None
        return [message]


class MessagesRequest(MessagesInput):
    """The body of ``POST /v1/messages``."""

    max_tokens: Int = Field(ge=1)
    stop_sequences: list[Text] | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int | None = None
    stream: Bool = False
    metadata: Metadata | None = None

    @model_validator(mode="after")
    def _budget_within_max_tokens(self) -> MessagesRequest:
        budget = self.thinking.budget_tokens if self.thinking is not None else None
        if budget is not None and budget < self.max_tokens:
            raise _Refused(
                f"a thinking budget under max_tokens ({budget} < {self.max_tokens}) is not supported: "
                "minisgl cannot end the thinking apart from the answer (both count in max_tokens); "
                'send thinking {"type": "adaptive"} (the model thinks as it decides, within '
                "max_tokens), or budget_tokens of at least max_tokens",
                "thinking.budget_tokens",
            )
        return self

    def chat(self) -> tuple[ChatCompletionRequest, list[str]]:
        return self.chat_request({
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": self.stop_sequences,
            "user": self.metadata.user_id if self.metadata is not None else None,
        })  # fmt: skip


class CountTokensRequest(MessagesInput):
    """The body of ``POST /v1/messages/count_tokens`` (``client.messages.count_tokens``)."""

    def chat(self) -> tuple[ChatCompletionRequest, list[str]]:
        return self.chat_request({})


#: chat's names for the fields of a Messages body, where they differ
_RENAMES = [
    (re.compile(r"(?<![\w.])tools\.(\d+)\.function\.parameters(?![\w])"), r"tools.\1.input_schema"),
    (re.compile(r"(?<![\w.])tools\.(\d+)\.function(?![\w])"), r"tools.\1"),
    # (SamplingParams' message starts with the field's name; elsewhere "stop" is a word)
    (re.compile(r"^stop(?![\w])"), "stop_sequences"),
]


def messages_renamed(text: str, origins: list[str]) -> str:
    """``text`` (a 400's message or param) with the chat request's field names replaced by the
    Messages body's: its ``messages.N`` is the chat message's origin (``system``, ``messages.2``)."""
    for pattern, name in _RENAMES:
        text = pattern.sub(name, text)
    return re.sub(
        r"(?<![\w.])messages\.(\d+)(?![\w])",
        lambda m: origins[int(m.group(1))] if int(m.group(1)) < len(origins) else m.group(0),
        text,
    )


@contextmanager
def messages_names(origins: list[str]) -> Iterator[None]:
    """A 400 raised while the chat pipeline runs a Messages request names the Messages body's
    fields, in its param and its message."""
    try:
        yield
    except APIError as exc:
        if exc.status == 400:
            exc.message = messages_renamed(exc.message, origins)
            exc.param = messages_renamed(exc.param, origins) if exc.param else exc.param
        raise
