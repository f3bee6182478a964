"""Request bodies of the HTTP API (OpenAI chat/completions and the native /generate), validated.

Unknown fields are rejected (``extra="forbid"``) so a client never believes a field it sent was
honoured when it was not; a field sent as ``null`` means "not set" and is dropped (so an
unsupported one sent as null is fine, and a supported one takes its default).
Each body turns into SamplingParams fields with :meth:`sampling_fields`, where None means unset:
the tokenizer fills those from the model's defaults, then SamplingParams' own (OpenAI's), see
``sampling.merge_sampling``. Range checks live in SamplingParams itself and surface as 400
errors naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.types import Strict

from minisgl_core.api.grammar import GrammarSpec
from minisgl_core.request_limits import MAX_CACHE_SALT_CHARS
from minisgl_core.sampling import INT64_MAX, INT64_MIN, SamplingParams, short_repr
from minisgl_core.server.errors import APIError, json_kind
from minisgl_core.tokenizer.chat_input import (
    TEMPLATE_RESERVED,
    check_continued_message,
    compile_chat_template,
    json_strings,
    message_error,
    part_type_error,
    reasoning_error,
    role_error,
    template_args,
    template_message,
)

#: a request's own timeout field may ask for at most a day
MAX_TIMEOUT_S = 86400.0


def _utf8(text: str) -> str:
    # JSON may carry a lone UTF-16 surrogate ("\udfff"): no tokenizer or wire format takes it.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"invalid text: a lone UTF-16 surrogate at character {exc.start}") from None
    return text


#: every string of a request body: valid Unicode text (no lone surrogates)
Text = Annotated[str, AfterValidator(_utf8)]


def _utf8_throughout(value: Any) -> Any:
    """Every string of free-form JSON, as :func:`_utf8` checks one: a lone surrogate in a tool's
    parameter schema was a 500 (the message to the tokenizer process cannot carry it)."""
    for text in json_strings(value):
        _utf8(text)
    return value


#: a JSON object of any content (a schema, template variables) whose strings are all valid text
FreeObject = Annotated[dict[str, Any], AfterValidator(_utf8_throughout)]


def _integral_number(value: Any) -> Any:
    # JSON has one kind of number and some clients write every number as 5.0: a float with no
    # fraction is that integer (as vLLM reads it); anything else goes on to the strict check.
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# Pydantic's lax mode reads true as 1, "5" as 5 and "yes" as true; OpenAI refuses all three with a
# 400, and so do these types: a field never silently takes a value the client did not write.
#: a JSON integer (5.0 counts as 5); not a boolean, a string or a fraction
Int = Annotated[int, Strict(), BeforeValidator(_integral_number)]
#: a JSON number; not a boolean or a string
Float = Annotated[float, Strict()]
#: JSON true or false; not 0/1 or a string
Bool = Annotated[bool, Strict()]
#: OpenAI's reasoning effort (chat's reasoning_effort, the Responses API's reasoning.effort)
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


#: the most characters of a client's id for its request (vLLM's ``request_id`` and
#: ``X-Request-Id``, SGLang's ``rid``): it comes back in the answer's id and header
MAX_REQUEST_ID_CHARS = 256


def header_value_problem(text: str) -> str | None:
    """Why ``text`` cannot be sent back as an HTTP header value, None if it can. RFC 9110 allows
    visible ASCII, obs-text (bytes from 0x80) and spaces and tabs between them: a control
    character would make the response's header invalid (h11 lets a request's in and sends it out
    as it came), edge whitespace is stripped from a request's header and dropped the connection
    when sent. (A character past Latin-1 goes out as its UTF-8 bytes: :func:`header_text`.)"""
    for at, char in enumerate(text):
        code = ord(char)
        if (code < 0x20 and char != "\t") or code == 0x7F:
            return f"character {at} is U+{code:04X}, a control character; the id must be printable text"
    if text != text.strip(" \t"):
        return "the id must not begin or end with a space or tab, which an HTTP header drops"
    return None


def header_text(text: str) -> str:
    """``text`` as a header value's characters (Starlette encodes them as Latin-1): itself where
    Latin-1 holds it (an id that came in a header goes back byte for byte), else its UTF-8 bytes
    (an id of the body's such as "日本"; it was a 500)."""
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8").decode("latin-1")
    return text


def _request_id(text: str) -> str:
    if (problem := header_value_problem(text)) is not None:
        raise ValueError(f"{problem} (it comes back in the X-Request-Id header)")
    return text


#: a client's id for its request (vLLM's request_id, SGLang's rid), which comes back in the
#: answer's id and its ``X-Request-Id`` header
RequestId = Annotated[
    str,
    # (on the string itself: after a validator, pydantic says "at most 256 items after validation")
    Field(min_length=1, max_length=MAX_REQUEST_ID_CHARS),
    AfterValidator(_utf8),
    AfterValidator(_request_id),
]


#: SGLang fields the SGLang Model Gateway (sglang-router) writes into every request it forwards,
#: each with its default. At that value each asks for what minisgl does anyway, so it is accepted
#: and dropped; any other value is still refused as an unsupported field.
GATEWAY_DEFAULTS: dict[str, bool] = {
    # (completions and chat have a field of their own, false by default; every other body,
    # /generate's among them, still drops the gateway's)
    "echo": False,
    "no_stop_trim": False,
    "return_hidden_states": False,
    # no reasoning parser: there is no reasoning text to separate or stream apart
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_text_in_logprobs": False,
    "log_metrics": True,
    "background": False,
    "no_logs": False,
    "return_bytes": False,
    "return_entropy": False,
    # vLLM's, which clients built for it send with their defaults: no beam search; the reasoning
    # in the answer (as a reasoning parser puts it there anyway); spaces between special tokens
    # (what a fast tokenizer's decoding does, vLLM's included)
    "use_beam_search": False,
    "include_reasoning": True,
    "spaces_between_special_tokens": True,
}


def _is_gateway_default(key: str, value: Any) -> bool:
    return key in GATEWAY_DEFAULTS and value is GATEWAY_DEFAULTS[key]


class BodyError(ValueError):
    """A check of the whole body (a model validator) that blames one field: the 400 names it in
    ``param`` (pydantic places a whole-body check at the body itself, which names none), and
    carries ``code`` (``unsupported_field`` for a value minisgl does not implement). A check of a
    list's item, which cannot know its index, blames no field (None): the 400 names the place
    pydantic found (``tools.1``)."""

    def __init__(self, message: str, field: str | None, code: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.code = code


def default_verbosity_only(value: Any, field: str) -> Any:
    """OpenAI's ``verbosity`` (chat's, the Responses API's ``text.verbosity``), a hint for how long
    an answer runs: ``"medium"``, its default, is taken (the model answers as it does); ``"low"``
    and ``"high"`` would need the model told, which a served model's template has no variable for,
    so they are refused rather than ignored."""
    if value in ("low", "high"):
        raise BodyError(
            f"{short_repr(value)} is not supported: the served model answers at its own length; "
            f'leave {field} out, or "medium" (the default), and bound the answer with the maximum '
            "of tokens",
            field,
            "unsupported_field",
        )
    return value


def in_memory_cache_only(value: Any, field: str) -> Any:
    """OpenAI's ``prompt_cache_retention`` (deprecated for ``prompt_cache_options``): how long cached
    prefixes live. ``"in_memory"`` is what the prefix cache does; ``"24h"`` is refused."""
    if value == "24h":
        raise BodyError(
            "'24h' is not supported: minisgl's prefix cache keeps prefixes in memory while there "
            f'is room, for no set time; leave {field} out, or "in_memory"',
            field,
            "unsupported_field",
        )
    return value


def refuse_batch(data: Any, route: str, alternative: str = "") -> Any:
    """A batch (``prompt`` a list, ``messages`` a list of conversations) on a route that takes one
    prompt a request (/tokenize), refused saying so rather than "prompt: Input should be a valid
    string"."""
    if not isinstance(data, dict):
        return data
    # prompt a list of any shape (empty, of strings, of token ids or their lists; each was "should
    # be a valid string, not an array"), messages a list of conversations
    batched = ["prompt"] if isinstance(data.get("prompt"), list) else []
    if isinstance(value := data.get("messages"), list) and value and isinstance(value[0], list):
        batched.append("messages")
    if batched:
        raise BodyError(
            f"batched input is not supported on {route}: send one request per prompt{alternative}",
            batched[0],
            "unsupported_field",
        )
    return data


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None and not _is_gateway_default(k, v)}
        return data


class StreamOptions(StrictModel):
    #: None = unset: off, unless continuous_usage_stats asks for usage
    include_usage: Bool | None = None
    #: vLLM's: every chunk carries the usage so far (its choice's completion tokens); it implies
    #: include_usage (``{"continuous_usage_stats": true}`` alone was a 400, vLLM takes it)
    continuous_usage_stats: Bool = False
    #: OpenAI's: random padding on each stream event against length side channels. minisgl adds
    #: none, true or false (vLLM accepts it likewise); a 400 had broken clients that send it
    include_obfuscation: Bool | None = None

    @model_validator(mode="after")
    def _continuous_needs_usage(self) -> StreamOptions:
        # vLLM sends no usage on the chunks then, silently; a contradiction is refused instead
        if self.continuous_usage_stats and self.include_usage is False:
            raise ValueError(
                "continuous_usage_stats needs include_usage true (or left out): usage on every chunk "
                "includes the final usage chunk"
            )
        return self

    @property
    def usage(self) -> bool:
        """Whether the stream ends with a usage chunk."""
        return bool(self.include_usage) or self.continuous_usage_stats


class JsonSchemaFormat(StrictModel):
    """OpenAI's ``response_format.json_schema``; without ``schema`` any JSON object matches."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Text
    description: Text | None = None
    schema_: FreeObject | Bool | None = Field(default=None, alias="schema")
    #: accepted; the output always follows the schema exactly (what strict asks for)
    strict: Bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    #: type "structural_tag": vLLM's and SGLang's ``structures`` + ``triggers``, or xgrammar's ``format``
    structures: list[FreeObject] | None = None
    triggers: list[Text] | None = None
    format: FreeObject | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError(
                'response_format.json_schema is required with (and only with) type "json_schema"'
            )
        older = self.structures is not None or self.triggers is not None
        if self.type != "structural_tag" and (older or self.format is not None):
            raise ValueError(
                'response_format.structures, triggers and format go with type "structural_tag" only'
            )
        if self.type == "structural_tag" and (self.format is not None) == older:
            raise ValueError(
                'response_format of type "structural_tag" takes "structures" and "triggers", or "format"'
            )
        if self.type == "structural_tag" and older and (self.structures is None or self.triggers is None):
            raise ValueError(
                'response_format of type "structural_tag" takes both "structures" and "triggers"'
            )
        return self

    def spec(self) -> GrammarSpec | None:
        if self.type == "text":
            return None
        if self.type == "structural_tag":
            tag = (
                {"type": "structural_tag", "format": self.format}
                if self.format is not None
                else {"structures": self.structures, "triggers": self.triggers}
            )
            return GrammarSpec("structural_tag", json.dumps(tag))
        if self.type == "json_object" or self.json_schema is None or self.json_schema.schema_ is None:
            return GrammarSpec("json_object", "")
        return GrammarSpec("json_schema", json.dumps(self.json_schema.schema_))


class StructuredOutputs(StrictModel):
    """vLLM's ``structured_outputs``: exactly one constraint."""

    json_: FreeObject | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = Field(default=None, min_length=1)
    grammar: Text | None = None
    json_object: Bool | None = None
    structural_tag: Text | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [
            name
            for name in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
            if self._value(name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "structured_outputs takes exactly one of json, regex, choice, grammar, json_object, "
                f"structural_tag; got {', '.join(given) or 'none'}"
            )
        if self.json_object is False:
            raise ValueError("structured_outputs.json_object must be true when given")
        return self

    def _value(self, name: str) -> Any:
        return self.json_ if name == "json" else getattr(self, name)

    def spec(self) -> GrammarSpec:
        if self.json_ is not None:
            value = self.json_ if isinstance(self.json_, str) else json.dumps(self.json_)
            return GrammarSpec("json_schema", value)
        if self.regex is not None:
            return GrammarSpec("regex", self.regex)
        if self.choice is not None:
            return GrammarSpec("choice", json.dumps(self.choice))
        if self.grammar is not None:
            return GrammarSpec("ebnf", self.grammar)
        if self.structural_tag is not None:
            return GrammarSpec("structural_tag", self.structural_tag)
        return GrammarSpec("json_object", "")


class GrammarFields(StrictModel):
    """Constrained decoding: OpenAI's ``response_format``, vLLM's ``structured_outputs``, and
    SGLang's top-level ``regex`` / ``ebnf``; at most one of them."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    regex: Text | None = None
    ebnf: Text | None = None

    @model_validator(mode="after")
    def _one_grammar(self) -> GrammarFields:
        given = [
            name
            for name in ("response_format", "structured_outputs", "regex", "ebnf")
            if getattr(self, name) is not None
        ]
        if self.response_format is not None and self.response_format.type == "text":
            given.remove("response_format")
        if len(given) > 1:
            raise BodyError(f"give at most one of {', '.join(given)} (each constrains the output)", given[-1])
        return self

    def grammar_spec(self) -> GrammarSpec | None:
        if self.structured_outputs is not None:
            return self.structured_outputs.spec()
        if self.regex is not None:
            return GrammarSpec("regex", self.regex)
        if self.ebnf is not None:
            return GrammarSpec("ebnf", self.ebnf)
        return self.response_format.spec() if self.response_format is not None else None

    @property
    def grammar_field(self) -> str:
        """The request field a grammar error is about."""
        for name in ("structured_outputs", "regex", "ebnf"):
            if getattr(self, name) is not None:
                return name
        return "response_format"

    def grammar_wire(self) -> dict[str, str] | None:
        """The grammar as SamplingParams takes it over the wire (a plain dict for msgpack)."""
        spec = self.grammar_spec()
        return None if spec is None else {"kind": spec.kind, "value": spec.value}


class TextPart(StrictModel):
    type: Literal["text"]
    text: Text


class RefusalPart(StrictModel):
    """What an assistant declined to do, in OpenAI's schema of assistant messages: text to the model."""

    type: Literal["refusal"]
    refusal: Text

    @property
    def text(self) -> str:
        return self.refusal


def _part_kind(part: Any) -> str:
    # by the part's type, so that a bad part's error is its own kind's; a part without a type is
    # taken for a text part, which says the type is missing. (Serializing asks of a part built.)
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
    return "RefusalPart" if kind == "refusal" else "TextPart"


#: a message's content part (the union's tags are the class names: errors leave them out of the path)
ContentPart = Annotated[
    Annotated[TextPart, Tag("TextPart")] | Annotated[RefusalPart, Tag("RefusalPart")],
    Discriminator(_part_kind),
]


def _arguments(text: str) -> str:
    """A tool call's arguments as the chat template will get them (see
    ``tokenizer.chat_input.template_message``): JSON text that decodes to an object must decode to
    valid text, nested no deeper than Python's decoder goes (each was a 500 when the template was
    rendered; any other text is passed on as it is)."""
    try:
        decoded = json.loads(text)
    except RecursionError:
        raise ValueError("the arguments' JSON is nested too deeply") from None
    except ValueError:
        return text
    if isinstance(decoded, dict):
        _utf8_throughout(decoded)
    return text


class FunctionCall(StrictModel):
    name: Text
    #: JSON text, as OpenAI sends it
    arguments: Annotated[Text, AfterValidator(_arguments)]


class AssistantToolCall(StrictModel):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(StrictModel):
    role: Text
    #: may be null only on an assistant message that makes tool calls
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[AssistantToolCall] | None = None
    tool_call_id: Text | None = None
    #: an assistant's reasoning sent back: as the server answers it, and as vLLM reads it
    reasoning_content: Text | None = None
    reasoning: Text | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any, info: ValidationInfo) -> Any:
        # a part of another type (image_url, input_audio, file) would otherwise fail as "text:
        # Field required", which does not say what is wrong
        if isinstance(content, list):
            role = info.data.get("role")  # (absent when it was refused: that error says why)
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                error = part_type_error(kind, role)
                if error is not None:
                    raise ValueError(error)
        return content

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        error = role_error(role)
        if error is not None:
            raise ValueError(error)
        return role

    @field_validator("reasoning_content", "reasoning")
    @classmethod
    def _assistant_reasoning(cls, value: str | None, info: ValidationInfo) -> str | None:
        # a field validator, so that the 400 names the field (messages.0.reasoning_content)
        other = info.data.get("reasoning_content") if info.field_name == "reasoning" else None
        reasoning = value if info.field_name == "reasoning" else None
        content = value if info.field_name == "reasoning_content" else other
        error = reasoning_error(info.data.get("role"), reasoning, content)
        if error is not None:
            raise ValueError(error[1])
        return value

    @model_validator(mode="after")
    def _fits_role(self) -> ChatMessage:
        # (the rules LLM.chat applies too, in tokenizer.chat_input)
        error = message_error(self.role, self.content is not None, self.tool_calls, self.tool_call_id)
        if error is not None:
            raise ValueError(error[1])
        return self

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template gets it: what the offline ``LLM.chat`` hands it too
        (``template_message``, which leaves out an empty tool_calls: ``'tool_calls' in message``
        picks Llama 3.1's tool-call branch), of the fields set here."""
        return template_message(self.model_dump(exclude_none=True))


class FunctionDefinition(StrictModel):
    name: Text = Field(min_length=1)
    description: Text | None = None
    #: a JSON schema of the arguments object
    parameters: FreeObject | None = None
    strict: Bool | None = None


class ToolDefinition(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition

    # before the field checks, whose 400 for OpenAI's {"type": "custom", "custom": {...}} was
    # "tools.0.function: Field required": another kind of tool is refused by name, as tool_choice's
    @model_validator(mode="before")
    @classmethod
    def _functions_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise BodyError(
                f'type {short_repr(kind)} is not supported: minisgl calls functions; send tools of type "function"',
                None,
                "unsupported_field",
            )
        if isinstance(data, dict) and "type" in data and not isinstance(kind, str):
            # (the field checks named the missing "function", not the type: {"type": 1})
            raise BodyError(f'type must be the string "function", not {short_repr(kind)}', None)
        return data


class FunctionName(StrictModel):
    name: Text


#: the tool_choice values a 400 names
TOOL_CHOICES = '{"type": "function", "function": {"name": ...}}, or "none", "auto" or "required"'


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: FunctionName


class SamplingFields(GrammarFields):
    """Sampling options shared by chat and completions (OpenAI names plus top_k/min_p/ignore_eos)."""

    model: Text | None = None
    max_tokens: Int | None = None
    #: None = unset: the model's default (--generation-config), else OpenAI's
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int | None = None
    min_p: Float | None = None
    seed: Int | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[Int] | None = None
    presence_penalty: Float = 0.0
    frequency_penalty: Float = 0.0
    #: (the bound is SamplingParams', which the offline LLM checks: one number for both)
    n: Int = Field(default=1, ge=1, le=SamplingParams.MAX_N)
    ignore_eos: Bool = False
    skip_special_tokens: Bool = True
    #: vLLM's: the stop string that ended the request stays at the end of the text
    include_stop_str_in_output: Bool = False
    #: vLLM's: no stop (eos, stop_token_ids, stop strings) before this many output tokens
    min_tokens: Int = 0
    #: vLLM's: keep only the prompt's last k tokens (-1: as many as the context length holds)
    truncate_prompt_tokens: Int | None = None
    stream: Bool = False
    stream_options: StreamOptions | None = None
    #: token id (as a string, JSON keys are) -> bias in [-100, 100]
    logit_bias: dict[str, Float] | None = None
    #: None = unset: the model's default (generation_config.json), else 1.0 (off)
    repetition_penalty: Float | None = None
    #: vLLM's: only these token ids may be sampled (None: any; an empty list is refused)
    allowed_token_ids: list[Int] | None = None
    #: vLLM's: words the output may not end in (a word's last token is banned right after its
    #: other tokens, a one-token word always)
    bad_words: list[Text] | None = None
    #: accepted as harmless metadata (OpenAI uses it for abuse monitoring)
    user: Text | None = None
    #: vLLM's: the response's id is ``chatcmpl-<request_id>`` (``cmpl-`` on completions), to trace
    #: a request by an id of the client's; an ``X-Request-Id`` header wins over it, as in vLLM
    request_id: RequestId | None = None
    #: vLLM's: the request shares prefix-cache entries only with requests of the same salt (one a
    #: tenant: others cannot learn from the speed of their answers what it asked)
    cache_salt: Text | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    #: seconds after which the request ends with a timeout error (the server's --request-timeout
    #: still bounds it)
    timeout: Float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    #: vLLM's: lower runs earlier, ties by arrival; not 0 only with ``--policy priority`` (a 400
    #: otherwise, as vLLM's without ``--scheduling-policy priority``)
    priority: Int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    #: vLLM's: each prompt token's logprob and vocabulary rank given the tokens before it, with the
    #: k most likely tokens there (``prompt_logprobs`` of the choice, or of a chat response);
    #: not with stream, as vLLM
    prompt_logprobs: Int | None = None
    #: vLLM's: each choice also gets its ``token_ids`` and the prompt's ``prompt_token_ids`` (in a
    #: stream: the delta's token ids on every chunk, the prompt's on the choice's first)
    return_token_ids: Bool = False
    #: vLLM's: logprobs name tokens as ``"token_id:{id}"`` instead of their text (which may not be
    #: valid UTF-8 on its own, or shared by two tokens)
    return_tokens_as_token_ids: Bool = False

    def sampling_fields(self) -> dict[str, Any]:
        """SamplingParams keyword arguments; max_tokens None = what the context has left."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "max_tokens": self.max_tokens,
            "stop": [self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "logprobs": self.logprobs_k(),
            "prompt_logprobs": self.prompt_logprobs,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "truncate_prompt_tokens": self.truncate_prompt_tokens,
            "min_tokens": self.min_tokens,
            "logit_bias": dict(self.logit_bias or {}),
            "repetition_penalty": self.repetition_penalty,
            "allowed_token_ids": self.allowed_token_ids,
            "bad_words": list(self.bad_words or []),
            "grammar": self.grammar_wire(),
        }

    def logprobs_k(self) -> int | None:
        return None

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, options: StreamOptions, info: ValidationInfo) -> StreamOptions:
        # a field validator (not a model one) so that the 400 names stream_options
        if not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")
        return options

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_not_streamed(cls, k: int, info: ValidationInfo) -> int:
        # vLLM's rule: the prompt's logprobs come in the whole response only
        if info.data.get("stream", False):
            raise ValueError(
                "not available when stream is true (the prompt's logprobs come with the whole response)"
            )
        return k

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def max_tokens_field(self) -> str:
        return "max_tokens"


class PredictionTextPart(StrictModel):
    type: Literal["text"]
    text: Text


class PredictedOutput(StrictModel):
    """OpenAI's Predicted Outputs (``prediction``): text the client expects most of the answer to
    be (a file with small edits). Its tokens are the speculative decoder's drafts: the answer is
    the one without it, faster where it matches."""

    type: Literal["content"]
    content: Text | list[PredictionTextPart]

    def text(self) -> str:
        """The predicted text: its parts one after the other."""
        content = self.content
        return content if isinstance(content, str) else "".join(part.text for part in content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = None
    logprobs: Bool = False
    top_logprobs: Int | None = None
    tools: list[ToolDefinition] | None = None
    #: default "auto" when tools are given, else "none" (OpenAI's defaults)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: Bool = True
    #: extra variables for the chat template, e.g. {"enable_thinking": false} for Qwen3
    chat_template_kwargs: FreeObject | None = None
    #: vLLM's: the request's own Jinja chat template, rendering its messages instead of the
    #: server's; only where the server was started with --trust-request-chat-template
    #: (:func:`check_request_template`)
    chat_template: Text | None = None
    #: OpenAI's: the chat template's variable ``reasoning_effort`` (gpt-oss's templates read it;
    #: a template that does not ignores it); chat_template_kwargs' own wins
    reasoning_effort: ReasoningEffort | None = None
    #: vLLM's: documents for a retrieval-augmented template, its variable ``documents`` (as
    #: transformers' apply_chat_template takes them); chat_template_kwargs' own wins
    documents: list[dict[Text, Text]] | None = None
    #: end the prompt with the template's opening of an assistant turn (vLLM's field)
    add_generation_prompt: Bool = True
    #: the reply continues the last message, an assistant one, instead of starting a new turn
    #: (vLLM's field; needs add_generation_prompt false)
    continue_final_message: Bool = False
    #: vLLM's: each choice's content starts with the last message's text where that message has
    #: the reply's role (:meth:`echoed_text`): with continue_final_message, the whole message back
    echo: Bool = False
    #: OpenAI's fields for stored completions, tiers and output kinds, taken where they ask for
    #: what minisgl does anyway (the official SDK sends what its caller sets; vLLM ignores them):
    #: nothing is stored (store must be false, and metadata, a stored completion's tags, tags
    #: nothing), there is one tier, and text is the one output
    store: Bool = False
    metadata: dict[Text, Text] | None = None
    service_tier: Literal["auto", "default"] | None = None
    modalities: list[Literal["text"]] | None = None
    #: OpenAI's successors of ``user``, taken as it is: an end user's id for abuse monitoring, and
    #: a key to group requests for its prompt cache (the radix cache finds shared prefixes itself)
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None
    #: (see :func:`in_memory_cache_only` and :func:`default_verbosity_only`)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    #: OpenAI's Predicted Outputs: drafts for the speculative decoder (a 400 on a server without
    #: one: admit_chat), reported in usage.completion_tokens_details
    prediction: PredictedOutput | None = None

    @field_validator("prompt_cache_retention", mode="before")
    @classmethod
    def _in_memory_only(cls, value: Any) -> Any:
        return in_memory_cache_only(value, "prompt_cache_retention")

    @field_validator("verbosity", mode="before")
    @classmethod
    def _default_verbosity_only(cls, value: Any) -> Any:
        return default_verbosity_only(value, "verbosity")

    @field_validator("chat_template_kwargs")
    @classmethod
    def _free_template_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return template_kwargs(kwargs)

    @field_validator("store")
    @classmethod
    def _nothing_stored(cls, store: bool) -> bool:
        if store:
            raise BodyError("minisgl stores no completions; leave store false", "store", "unsupported_field")
        return store

    # before the Literal checks, whose 400 had code null: a value OpenAI has but minisgl does not
    # serve is refused as an unsupported one (anything else still fails the type check)
    @field_validator("service_tier", mode="before")
    @classmethod
    def _one_tier(cls, tier: Any) -> Any:
        if isinstance(tier, str) and tier not in ("auto", "default"):
            raise BodyError(
                f"{short_repr(tier)} is not supported: minisgl serves one tier; send auto or default, or leave it out",
                "service_tier",
                "unsupported_field",
            )
        return tier

    # before the union's checks, whose 400 for {"type": "custom"} was "tool_choice.function: Field
    # required": OpenAI's other kinds of tool choice are refused by name; a type that is no string
    # was "Input should be 'function'" (123, a list) or "Field required" (null, though given)
    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choices_only(cls, choice: Any) -> Any:
        if not isinstance(choice, dict) or "type" not in choice:
            return choice
        kind = choice["type"]
        if not isinstance(kind, str):
            raise BodyError(
                f'must be the string "function", not {json_kind(kind)}; send {TOOL_CHOICES}',
                "tool_choice.type",
                "invalid_type",
            )
        if kind != "function":
            raise BodyError(
                f"type {short_repr(kind)} is not supported: minisgl calls functions; send {TOOL_CHOICES}",
                "tool_choice",
                "unsupported_field",
            )
        return choice

    @field_validator("modalities", mode="before")
    @classmethod
    def _text_only(cls, modalities: Any) -> Any:
        if not isinstance(modalities, list):
            return modalities
        other = next((m for m in modalities if isinstance(m, str) and m != "text"), None)
        if other is not None:
            raise BodyError(
                f'{short_repr(other)} is not supported: minisgl outputs text only; send ["text"] or leave it out',
                "modalities",
                "unsupported_field",
            )
        return modalities

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        chat_template_args(self)
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None and self.max_tokens != self.max_completion_tokens:
                raise BodyError(
                    "give max_completion_tokens or max_tokens, not two different values",
                    "max_completion_tokens",
                )
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise BodyError("top_logprobs requires logprobs to be true", "top_logprobs")
        return self

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def max_tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template() for m in self.messages]

    def echoed_text(self) -> str:
        """What ``echo`` puts before each choice's content, as vLLM: the last message's text
        (content parts a line each, as the template reads them) where its role is the reply's,
        "assistant" or, without add_generation_prompt, the last message's own; else nothing. It
        is the client's text, not the model's: no parser reads it, no stop string, grammar or
        logprob applies to it, and no completion token counts it."""
        last = self.messages[-1]
        if not self.echo or (self.add_generation_prompt and last.role != "assistant"):
            return ""
        return last.to_template()["content"]

    def template_args(self) -> dict[str, Any]:
        """Keyword arguments for the chat template: the tools, chat_template_kwargs and the two
        settings (checked when the request was)."""
        return chat_template_args(self)


def chat_template_args(body: Any) -> dict[str, Any]:
    """The chat template's keyword arguments of a chat request or a /tokenize body with messages
    (its ``messages``, ``tools``, ``chat_template_kwargs``, ``add_generation_prompt`` and
    ``continue_final_message``), as ``LLM.chat`` builds them (``chat_input.template_args``, same
    texts): a BodyError naming the field to change when the settings cannot go together."""
    # a chat request's reasoning_effort and documents are template variables, which a client's
    # chat_template_kwargs may set too (its own win); /tokenize's body has neither
    fields = {name: getattr(body, name, None) for name in ("reasoning_effort", "documents")}
    variables = {name: value for name, value in fields.items() if value is not None}
    variables |= body.chat_template_kwargs or {}
    try:
        args = template_args(
            body.add_generation_prompt,
            body.continue_final_message,
            variables=variables,
            tools=[t.model_dump(exclude_none=True) for t in body.tools or ()],
            chat_template=getattr(body, "chat_template", None),
        )
    except ValueError as exc:
        raise BodyError(str(exc), "add_generation_prompt") from None
    if body.continue_final_message and body.messages:
        try:
            check_continued_message(body.messages[-1].role)
        except ValueError as exc:
            raise BodyError(str(exc), "messages") from None
    return args


def check_request_template(template: str | None, trusted: bool) -> None:
    """A 400 naming ``chat_template`` unless a request's own template (``template``, None when it
    sent none) may render its messages: the server trusts requests' templates
    (``--trust-request-chat-template``, as vLLM's) and it compiles. Checked on the API server, so
    a template that does not compile never reaches the tokenizer worker; one that fails while
    rendering is the worker's 400, named the same."""
    if template is None:
        return
    if not trusted:
        raise APIError(
            400,
            "this server does not take a request's own chat_template: its operator must start it "
            "with --trust-request-chat-template (leave chat_template out to use the server's template)",
            "chat_template",
            "unsupported_field",
        )
    if not template.strip():
        raise APIError(400, "chat_template is empty: give the Jinja text of a chat template", "chat_template")
    from jinja2 import TemplateSyntaxError

    try:
        compile_chat_template(template)
    except TemplateSyntaxError as exc:
        raise APIError(
            400, f"chat_template does not compile: line {exc.lineno}: {exc.message}", "chat_template"
        ) from None


#: chat template arguments that are request fields of their own
_TEMPLATE_FIELDS = ("add_generation_prompt", "continue_final_message", "tools")
#: apply_chat_template's own arguments, which the server sets (a client's template among them)
_TEMPLATE_RESERVED = (*TEMPLATE_RESERVED, "chat_template")


def template_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A request's ``chat_template_kwargs``, free template variables only: not the request's own
    fields (``tools``...), nor ``apply_chat_template``'s arguments, which the server sets (a
    ``chat_template`` of the client's, ``return_tensors``, ``truncation``...)."""
    for key in kwargs:
        if key in _TEMPLATE_FIELDS:
            raise ValueError(
                f"{short_repr(key)} is not a template variable here: set the request's {key} field"
            )
        if key in _TEMPLATE_RESERVED:
            raise ValueError(
                f"{short_repr(key)} is set by the server and cannot be passed to the chat template"
            )
    return kwargs


class CompletionRequest(SamplingFields):
    prompt: Text | list[Text] | list[Int] | list[list[Int]]
    #: the number of top tokens to report per position (OpenAI's completions convention)
    logprobs: Int | None = None
    #: answer with the prompt followed by the completion
    echo: Bool = False
    #: a text prompt gets the tokenizer's special tokens (a Llama's BOS), as vLLM's and SGLang's
    #: completions do by default (vLLM's field: false encodes the text alone)
    add_special_tokens: Bool = True
    #: fill-in-the-middle text after the completion: not supported, rejected with a 400; empty
    #: (some clients' default) asks for nothing after the completion, as null does, and is taken
    suffix: Text | None = None
    #: OpenAI's: generate best_of and return the n most likely; accepted equal to n only (the no-op,
    #: its default, which clients send as 1)
    best_of: Int | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.suffix:
            raise BodyError(
                "suffix is not supported: this server does no fill-in-the-middle; "
                "put the whole text in prompt instead",
                "suffix",
                "unsupported_field",
            )
        return self

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, best_of: int, info: ValidationInfo) -> int:
        n = info.data.get("n", 1)
        if best_of != n:
            raise BodyError(
                f"only best_of equal to n ({n}) is supported, got {best_of}: ask for n choices instead",
                "best_of",
                "unsupported_field",
            )
        return best_of

    def logprobs_k(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request (a string, token ids, or a batch of either)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt must not be empty")
        if isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class GenerateSampling(StrictModel):
    """The native API's sampling_params (SGLang names)."""

    max_new_tokens: Int | None = None
    #: None = unset: the model's default (--generation-config), else OpenAI's
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int | None = None
    min_p: Float | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: Bool = False
    seed: Int | None = None
    presence_penalty: Float = 0.0
    frequency_penalty: Float = 0.0
    #: None = unset: the model's default (--generation-config), else 1 (none)
    repetition_penalty: Float | None = None
    #: token id (as a string, JSON's keys) -> a bias added to its logit, as OpenAI's logit_bias
    logit_bias: dict[str, Float] | None = None
    skip_special_tokens: Bool = True
    #: SGLang's: the stop string that ended the request stays at the end of the text
    no_stop_trim: Bool = False
    #: SGLang's: no stop before this many new tokens
    min_new_tokens: Int = 0
    #: SGLang's parallel sampling: this many samples of the prompt, each an answer of its own
    n: Int = Field(default=1, ge=1, le=SamplingParams.MAX_N)
    #: SGLang's constraints: a JSON schema (as JSON text), a regex or an EBNF grammar; one at most
    json_schema: Text | None = None
    regex: Text | None = None
    ebnf: Text | None = None

    @model_validator(mode="after")
    def _one_grammar(self) -> GenerateSampling:
        given = [name for name in ("json_schema", "regex", "ebnf") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of sampling_params.{', sampling_params.'.join(given)}")
        return self

    def grammar_spec(self) -> GrammarSpec | None:
        for name in ("json_schema", "regex", "ebnf"):
            value = getattr(self, name)
            if value is not None:
                return GrammarSpec(name, value)  # type: ignore[arg-type]
        return None

    def grammar_field(self, prefix: str = "sampling_params") -> str:
        """The grammar field's name in the body (``prefix``: where these sampling_params sit)."""
        name = next(
            (n for n in ("json_schema", "regex", "ebnf") if getattr(self, n) is not None), "json_schema"
        )
        return f"{prefix}.{name}"


#: SGLang's logprob_start_len: a position in the prompt, or -1 for none
StartLen = Annotated[Int, Field(ge=-1)]

#: /generate's fields that a batch may give one value per prompt of (SGLang's), else one for all
PER_PROMPT_FIELDS = ("sampling_params", "rid", "return_logprob", "top_logprobs_num", "logprob_start_len")


@dataclasses.dataclass
class GenerateItem:
    """One prompt of a /generate request (a batch has several) with its own fields, and the
    names the errors about it give: ``prompt_field`` (``text``, or ``text.2`` for a batch's third)
    and ``sampling_prefix`` (``sampling_params``, or ``sampling_params.2`` where each prompt has
    its own)."""

    text: str | None
    input_ids: list[int] | None
    sampling: GenerateSampling
    rid: str | None
    return_logprob: bool
    top_logprobs_num: int
    logprob_start_len: int
    prompt_field: str
    sampling_prefix: str

    def sampling_fields(self) -> dict[str, Any]:
        s = self.sampling
        return {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "max_tokens": s.max_new_tokens,
            "stop": [s.stop] if isinstance(s.stop, str) else list(s.stop or []),
            "stop_token_ids": list(s.stop_token_ids or []),
            "ignore_eos": s.ignore_eos,
            "seed": s.seed,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "repetition_penalty": s.repetition_penalty,
            "logit_bias": dict(s.logit_bias or {}),
            "logprobs": self.top_logprobs_num if self.return_logprob else None,
            # SGLang's output_token_logprobs: after the temperature (its sampler's)
            "scaled_logprobs": True,
            "prompt_logprobs": self.top_logprobs_num
            if self.return_logprob and self.logprob_start_len >= 0
            else None,
            "skip_special_tokens": s.skip_special_tokens,
            "include_stop_str_in_output": s.no_stop_trim,
            "min_tokens": s.min_new_tokens,
            "grammar": None
            if (spec := s.grammar_spec()) is None
            else {"kind": spec.kind, "value": spec.value},
        }


class GenerateRequest(StrictModel):
    #: one prompt, or SGLang's batch of them (a list of texts; a list of token id lists)
    text: Text | list[Text] | None = None
    input_ids: list[Int] | list[list[Int]] | None = None
    #: one set for every prompt, or a batch's one per prompt (so are rid, return_logprob,
    #: top_logprobs_num and logprob_start_len)
    sampling_params: GenerateSampling | list[GenerateSampling] = Field(default_factory=GenerateSampling)
    stream: Bool = False
    return_logprob: Bool | list[Bool] = False
    top_logprobs_num: Int | list[Int] = 0
    #: SGLang's: with return_logprob, the prompt's tokens from this position on get their logprobs
    #: too (meta_info input_token_logprobs; the first prompt token's is null); -1: none
    logprob_start_len: StartLen | list[StartLen] = -1
    #: SGLang's: each logprob entry's third item is its token's text, else null
    return_text_in_logprobs: Bool = False
    timeout: Float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    #: SGLang's: LARGER runs earlier (its default, without --schedule-low-priority-values-first),
    #: so the engine gets its negation; not 0 only with ``--policy priority``. (-2**63 has no
    #: negation in 64 bits: refused)
    priority: Int = Field(default=0, ge=-INT64_MAX, le=INT64_MAX)
    #: SGLang's: the answer's ``meta_info.id`` (an ``X-Request-Id`` header wins over it); a
    #: batch's: a list, one per prompt
    rid: RequestId | list[RequestId] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text or input_ids")
        prompt = "text" if self.text is not None else "input_ids"
        size = self.batch_size
        if size == 0:
            raise BodyError("an empty batch; give at least one prompt", prompt)
        for name in PER_PROMPT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, list):
                if size is not None and name == "rid" and value is not None:
                    raise BodyError(
                        f"a batch takes a list of ids, one per prompt ({size}); or send an "
                        "X-Request-Id header, whose id the answers share with their index",
                        "rid",
                    )
                continue
            if size is None:
                raise BodyError(
                    f"a list goes with a batch of prompts ({prompt} a list of prompts); "
                    "give one value for the one prompt",
                    name,
                )
            if len(value) != size:
                raise BodyError(
                    f"{len(value)} value(s) for a batch of {size} prompt(s); give one per prompt, "
                    "or one value for all" + ("" if name == "rid" else " (not a list)"),
                    name,
                )
        return self

    @property
    def batch_size(self) -> int | None:
        """The number of prompts of a batch; None for one prompt (not a list of them)."""
        if isinstance(self.text, list):
            return len(self.text)
        ids = self.input_ids
        if ids and isinstance(ids[0], list):
            return len(ids)
        return None

    def items(self) -> list[GenerateItem]:
        """Each prompt with its own fields (a batch's per-prompt lists taken apart)."""
        size = self.batch_size

        def at(name: str, i: int) -> Any:
            value = getattr(self, name)
            return value[i] if isinstance(value, list) else value

        prompts: list[Any] = (
            [self.text if self.text is not None else self.input_ids]
            if size is None
            else list(self.text if self.text is not None else self.input_ids)  # type: ignore[arg-type]
        )
        prompt = "text" if self.text is not None else "input_ids"
        return [
            GenerateItem(
                text=p if isinstance(p, str) else None,
                input_ids=None if isinstance(p, str) else list(p),
                sampling=at("sampling_params", i),
                rid=at("rid", i),
                return_logprob=at("return_logprob", i),
                top_logprobs_num=at("top_logprobs_num", i),
                logprob_start_len=at("logprob_start_len", i),
                prompt_field=prompt if size is None else f"{prompt}.{i}",
                sampling_prefix=f"sampling_params.{i}"
                if isinstance(self.sampling_params, list)
                else "sampling_params",
            )
            for i, p in enumerate(prompts)
        ]


#: /abort_request's finish message when the request gives none
ABORT_MESSAGE = "aborted by /abort_request"


class AbortRequestBody(StrictModel):
    """SGLang's /abort_request: the requests named ``rid`` (a client's id, or an answer's), or every
    unfinished one with ``abort_all``."""

    rid: Text = ""
    abort_all: Bool = False
    #: SGLang's: the aborted choices' finish message
    abort_message: Text = ABORT_MESSAGE

    @model_validator(mode="after")
    def _something_to_abort(self) -> AbortRequestBody:
        if not self.rid and not self.abort_all:
            raise BodyError("give the rid of the request to abort, or abort_all true", "rid")
        return self


#: the message of the requests /update_weights_from_disk ends with abort_all_requests
WEIGHT_UPDATE_ABORT_MESSAGE = "aborted by /update_weights_from_disk"
#: the error text of each request /pause_generation (mode abort) ends
PAUSE_ABORT_MESSAGE = "aborted by /pause_generation"


class PauseGenerationBody(StrictModel):
    """SGLang's /pause_generation (RL trainers pause rollouts around a weight update)."""

    #: ``abort``: end every unfinished request first (each answers what it made, finish reason
    #: abort); ``retract``: the running requests give their KV back and are computed again after
    #: /continue_generation; ``in_place``: they keep their KV and continue where they stopped
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueGenerationBody(StrictModel):
    """SGLang's /continue_generation: no fields."""


class UpdateWeightsBody(StrictModel):
    """SGLang's /update_weights_from_disk: new weights for the served model (a checkpoint of its
    config, e.g. a training step's) from ``model_path``, a path on the server's machine."""

    model_path: Annotated[Text, Field(min_length=1)]
    #: the format is the one model_path holds (safetensors, GGUF): auto only
    load_format: Literal["auto"] | None = None
    #: end every unfinished request first (each answers what it made, finish reason abort);
    #: otherwise the update waits for them, and requests arriving meanwhile wait for it
    abort_all_requests: Bool = False
    #: the new weights' name, /get_weight_version's answer from then on
    weight_version: Text | None = None
    #: empty the prefix cache afterwards (keys and values the old weights computed)
    flush_cache: Bool = True
    #: the trainer's step of these weights, reported beside weight_version
    token_step: Int = 0
    #: the device memory the load used goes back whatever it says
    torch_empty_cache: Bool = False
    #: nothing to recapture whatever it says: the graphs read the weights, which are copied in place
    recapture_cuda_graph: Bool = False
    is_async: Bool = False
    #: generation stays paused after the update (as by /pause_generation mode in_place) until
    #: /continue_generation; a pause before the update stays whatever it says
    keep_pause: Bool = False

    @model_validator(mode="after")
    def _supported(self) -> UpdateWeightsBody:
        for name, why in (("is_async", "the answer comes once the weights are in"),):
            if getattr(self, name):
                raise BodyError(
                    f"{name} true is not supported: {why}; leave it false", name, "unsupported_field"
                )
        return self
