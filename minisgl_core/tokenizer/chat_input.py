"""Chat messages made ready for the chat template: :func:`template_message` is what the template
gets of one message, for the offline ``LLM.chat`` and for the server's chat route alike
(``server.schemas.ChatMessage.to_template`` hands it the message its schema checked): content
parts a line each, "developer" as "system", a tool call's JSON arguments decoded. Here also
``LLM.chat``'s own checks of its input (ValueError or TypeError saying where, ``messages[1][0]``,
and what is wrong, before the template runs), and :func:`template_args`, ``apply_chat_template``'s
keyword arguments for the server's chat route and /tokenize and for ``LLM.chat`` alike, whose one
check (with :func:`check_continued_message`'s) has one text on every path, and
:func:`check_tools_rendered`, with which both refuse tools that the chat template would drop.
The rules on a message's role and fields (:data:`CHAT_ROLES`, :func:`role_error`,
:func:`part_type_error`, :func:`message_error`, :func:`reasoning_error`) are here, once: the server's request schema
applies them (a 400) and so does :func:`template_message` offline (a ValueError or TypeError naming
``messages[i].field``), so that ``LLM.chat`` refuses what the chat route refuses. The one thing
the schema checks that the offline path does not: unknown keys of a message, which reach the
template as they are (vLLM's ``LLM.chat`` passes them on too)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from minisgl_core.sampling import LONE_SURROGATE, short_repr

#: roles a chat message may have; "developer" is OpenAI's newer name for "system"
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")

#: chat()'s own arguments, which chat_template_kwargs may not set
_CHAT_ARGUMENTS = ("add_generation_prompt", "continue_final_message", "tools", "chat_template")
#: transformers' apply_chat_template's own arguments (but ``chat_template``), which the callers set:
#: no template variable of a request or of chat() may name one
TEMPLATE_RESERVED = ("conversation", "messages", "tokenize", "return_dict", "return_tensors", "padding",
                      "truncation", "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask")  # fmt: skip


def json_strings(value: Any) -> Iterator[str]:
    """Every string (keys too) of a JSON-like value, without recursion (the nesting is the client's)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def check_valid_text(value: Any, where: str) -> None:
    """A ValueError naming ``where`` when a string of ``value`` (keys too) has a lone UTF-16
    surrogate, which no tokenizer encodes: the template's text failed in the tokenizer with a
    TypeError naming no field (the server's schema refuses it as invalid text)."""
    for text in json_strings(value):
        bad = LONE_SURROGATE.search(text)
        if bad is not None:
            raise ValueError(
                f"{where} is not valid text: {short_repr(text)} has a lone UTF-16 surrogate at index {bad.start()}"
            )


def role_error(role: str) -> str | None:
    """Why ``role`` is no chat message's role, or None."""
    if role not in CHAT_ROLES:
        return f"unknown role {short_repr(role)}; use one of {', '.join(CHAT_ROLES)}"
    return None


def part_type_error(kind: object, role: object) -> str | None:
    """Why a content part of type ``kind`` (None: not given) may not be in a ``role`` message
    (None: unknown), or None."""
    if kind == "refusal" and role not in (None, "assistant"):
        return f"content parts of type 'refusal' belong to assistant messages, not to a {short_repr(role)} message"
    if kind is not None and kind not in ("text", "refusal"):
        return f"content parts of type {short_repr(kind)} are not supported: the served models take text only"
    return None


def message_error(
    role: str, has_content: bool, tool_calls: object, tool_call_id: object
) -> tuple[str, str] | None:
    """The field in error and why, when a ``role`` message's fields do not fit its role, or None.
    ``tool_calls`` and ``tool_call_id``: the message's, None when not set."""
    if not has_content and not (role == "assistant" and tool_calls):
        article = "an" if role == "assistant" else "a"
        return "content", (
            f"{article} {role} message needs content (only an assistant message with tool_calls may omit it)"
        )
    if tool_calls is not None and role != "assistant":
        return "tool_calls", "only assistant messages may have tool_calls"
    if role == "tool" and not tool_call_id:
        return "tool_call_id", "a tool message needs the tool_call_id of the call it answers"
    return None


def reasoning_error(role: str | None, reasoning: object, reasoning_content: object) -> tuple[str, str] | None:
    """The field in error and why, when a ``role`` message (None: unknown) carries reasoning that
    does not fit, or None. An assistant message may carry its reasoning back, as the server answers
    it (``reasoning_content``) or as vLLM reads it (``reasoning``; None when not set): the template
    gets it under both names, so the two may not differ."""
    for key, value in (("reasoning_content", reasoning_content), ("reasoning", reasoning)):
        if value is not None and role is not None and role != "assistant":
            return key, f"only assistant messages may have {key} (the model's reasoning)"
    if reasoning is not None and reasoning_content is not None and reasoning != reasoning_content:
        return "reasoning", "differs from reasoning_content: both name the one reasoning, give it once"
    return None


def conversations(messages: object) -> list[list[dict[str, Any]]]:
    """``messages`` (one conversation or a list of them) as a list of conversations, each
    message checked and made as the server hands it to the template."""
    if not isinstance(messages, (list, tuple)):
        raise TypeError(
            "messages must be a list of message dicts (one conversation) or a list of such lists, "
            f"got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: give at least one message")
    if isinstance(messages[0], (list, tuple)):
        return [_conversation(c, f"messages[{i}]") for i, c in enumerate(messages)]
    return [_conversation(messages, "messages")]


def _conversation(conversation: object, where: str) -> list[dict[str, Any]]:
    if not isinstance(conversation, (list, tuple)):
        raise TypeError(f"{where} must be a list of message dicts, got {type(conversation).__name__}")
    if not conversation:
        raise ValueError(f"{where} is empty: a conversation needs at least one message")
    return [template_message(message, f"{where}[{j}]") for j, message in enumerate(conversation)]


def template_message(message: object, where: str = "message") -> dict[str, Any]:
    """One chat message as the chat template gets it: role (a "developer" one is "system") and
    content first, text whatever form it came in (None, allowed on an assistant message with tool
    calls: ""; content parts: their text, a line each, an assistant's refusal part's too), then
    the message's other keys as they are, but for null ones and an empty tool_calls, left out, and
    tool calls' arguments given as JSON text of an object, decoded; an assistant's reasoning under
    both its names (``reasoning_content`` and ``reasoning``). ValueError or TypeError naming
    ``where`` and the field when it is not a message the server's chat route takes (its roles,
    content parts and tool calls, a tool message's tool_call_id)."""
    if not isinstance(message, Mapping):
        raise TypeError(
            f'{where} must be a dict with "role" and "content", got {type(message).__name__} {short_repr(message)}'
        )
    role = message.get("role")
    if role is None:
        raise ValueError(f'{where} has no "role" (system, user, assistant or tool)')
    if not isinstance(role, str) or not role:
        raise TypeError(f"{where}: role must be a non-empty string, got {short_repr(role)}")
    error = role_error(role)
    if error is not None:
        raise ValueError(f"{where}.role: {error}")
    for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{where}.{key} must be a string, got {type(value).__name__} {short_repr(value)}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        _check_tool_calls(tool_calls, f"{where}.tool_calls")
    content = message.get("content")
    error_at = message_error(role, content is not None, tool_calls, message.get("tool_call_id"))
    if error_at is None:
        error_at = reasoning_error(role, message.get("reasoning"), message.get("reasoning_content"))
    if error_at is not None:
        raise ValueError(f"{where}.{error_at[0]}: {error_at[1]}")
    if content is None:
        content = ""
    elif isinstance(content, (list, tuple)):
        # one part a line, as vLLM joins them ("".join ran "Hi", "there" into "Hithere")
        content = "\n".join(_text_part(part, role, f"{where}.content[{k}]") for k, part in enumerate(content))
    elif not isinstance(content, str):
        raise TypeError(
            f"{where}: content must be a string or a list of text parts, got {type(content).__name__}"
        )
    bad = LONE_SURROGATE.search(content)
    if bad is not None:  # (the tokenizer's TypeError named no reason)
        raise ValueError(
            f"{where}: content is not valid text: a lone UTF-16 surrogate at index {bad.start()}"
        )
    for key, value in message.items():  # (name, tool calls, reasoning: the template may write them)
        if key != "content":
            check_valid_text(value, f"{where}.{key}")
    # role and content first, as the server's schema lists its fields; a null key or an empty
    # tool_calls left out, as the server leaves out what its request did not set (Llama 3.1's
    # template takes the tool-call branch whenever the key is there, and fails on [] or None)
    out = {"role": "system" if role == "developer" else role, "content": content}
    out.update((key, value) for key, value in message.items() if key not in out and value is not None)
    if out.get("tool_calls"):
        out["tool_calls"] = [_tool_call(call) for call in out["tool_calls"]]
    else:
        out.pop("tool_calls", None)
    # under both names, as vLLM does: Qwen3's template reads reasoning_content, others reasoning
    reasoning = out.get("reasoning_content", out.get("reasoning"))
    if reasoning is not None:
        out["reasoning_content"] = out["reasoning"] = reasoning
    return out


def _text_part(part: object, role: str, where: str) -> str:
    """A content part's text: a text part's, or an assistant's refusal part's (OpenAI's schema,
    as the server's checks it: a type, and no other key)."""
    if not isinstance(part, Mapping):
        raise TypeError(
            f'{where} must be a text part {{"type": "text", "text": "..."}}, got {short_repr(part)}'
        )
    kind = part.get("type")
    error = part_type_error(kind, role)
    if error is not None:
        raise ValueError(f"{where}: {error}")
    if kind is None:
        raise ValueError(f'{where}.type is missing: a text part is {{"type": "text", "text": "..."}}')
    key = "refusal" if kind == "refusal" else "text"
    text = part.get(key)
    if not isinstance(text, str):
        raise TypeError(f"{where}.{key} must be a string, got {short_repr(part)}")
    _no_other_keys(part, ("type", key), where)
    return text


def _no_other_keys(value: Mapping[Any, Any], known: tuple[str, ...], where: str) -> None:
    other = [key for key in value if key not in known and value[key] is not None]
    if other:
        raise ValueError(f"{where}: unknown field {short_repr(other[0])}; use {', '.join(known)}")


def _check_tool_calls(tool_calls: object, where: str) -> None:
    """An assistant message's tool calls, the server's schema of them: a list of
    ``{"id": str, "type": "function", "function": {"name": str, "arguments": str}}``."""
    if not isinstance(tool_calls, (list, tuple)):
        raise TypeError(f"{where} must be a list of tool calls, got {type(tool_calls).__name__}")
    for k, call in enumerate(tool_calls):
        at = f"{where}[{k}]"
        if not isinstance(call, Mapping):
            raise TypeError(
                f'{at} must be a tool call {{"id": ..., "type": "function", "function": {{"name": ..., '
                f'"arguments": ...}}}}, got {short_repr(call)}'
            )
        _no_other_keys(call, ("id", "type", "function"), at)
        if call.get("type") not in (None, "function"):
            raise ValueError(f"{at}.type: must be 'function', got {short_repr(call.get('type'))}")
        if not isinstance(call.get("id"), str):
            raise TypeError(f"{at}.id must be a string, got {short_repr(call.get('id'))}")
        function = call.get("function")
        if not isinstance(function, Mapping):
            raise TypeError(
                f'{at}.function must be {{"name": ..., "arguments": ...}}, got {short_repr(function)}'
            )
        _no_other_keys(function, ("name", "arguments"), f"{at}.function")
        for key in ("name", "arguments"):
            if not isinstance(function.get(key), str):
                raise TypeError(
                    f"{at}.function.{key} must be a string (arguments: JSON text), got {short_repr(function.get(key))}"
                )


def _tool_call(call: Any) -> Any:
    """A tool call as templates expect it: arguments given as JSON text of an object decoded
    (Llama's template applies tojson to them again; Qwen's writes a string as it is)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    if not isinstance(arguments, str):
        return call
    try:
        decoded = json.loads(arguments)
    except (ValueError, RecursionError):
        return call
    return {**call, "function": {**function, "arguments": decoded}} if isinstance(decoded, dict) else call


def template_args(
    add_generation_prompt: bool,
    continue_final_message: bool,
    *,
    variables: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None,
) -> dict[str, Any]:
    """apply_chat_template's keyword arguments, the same for the server's chat route, its
    /tokenize and ``LLM.chat``, whose settings are spelled alike: the template ``variables``
    (``chat_template_kwargs``), the ``tools`` (none when empty), the template's text, and the two
    settings, add_generation_prompt given only when false (the renderers' default is true).
    ValueError when continue_final_message is asked with add_generation_prompt; the last message
    is :func:`check_continued_message`'s."""
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message needs add_generation_prompt turned off (the reply continues "
            "the last message instead of starting a turn)"
        )
    args = dict(variables or {})
    if tools:
        args["tools"] = tools
    if chat_template is not None:
        args["chat_template"] = chat_template
    if not add_generation_prompt:
        args["add_generation_prompt"] = False
    if continue_final_message:
        args["continue_final_message"] = True
    return args


def check_continued_message(role: str, where: str = "") -> None:
    """ValueError (its text after ``where``) unless ``role``, the last message's, is one
    continue_final_message continues."""
    if role != "assistant":
        raise ValueError(
            f"{where}continue_final_message needs the last message to be an assistant one, got {short_repr(role)}"
        )


def compile_chat_template(text: str) -> None:
    """Compile ``text`` as transformers will (its extensions: ``{% generation %}``, loop controls);
    with an older transformers, a plain Jinja environment with loop controls. A
    ``jinja2.TemplateSyntaxError`` when it does not compile (``serve --chat-template`` and a chat
    request's own ``chat_template`` are checked with it)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        from jinja2 import Environment

        Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
        return
    _compile_jinja_template(text)


def template_does_not_compile(exc: BaseException) -> str | None:
    """What a chat request is told when the server's own chat template (the model's, or
    ``--chat-template``'s) does not compile, or None where ``exc`` is another error: the request is
    not at fault, the server's operator must give another template. The same on every route."""
    from jinja2 import TemplateSyntaxError  # (transformers renders templates with jinja2)

    if not isinstance(exc, TemplateSyntaxError):
        return None
    return (
        f"this server's chat template does not compile (line {exc.lineno}: {exc.message}), so it "
        "cannot take chat requests; its operator must start it with --chat-template FILE"
    )


class ToolsNotRendered(ValueError):
    """The chat template renders the same tokens with the tools as without them."""


def check_tools_rendered(
    ids: list[int] | str,
    args: Mapping[str, Any],
    render: Callable[[dict[str, Any]], list[int] | str | None],
    fix: str,
) -> None:
    """:class:`ToolsNotRendered` (its text ending in ``fix``, what the caller's user does about
    it) when ``args`` has tools and ``ids``, the template's tokens (or text) with ``args``, are
    what ``render`` gives with ``args`` but the tools: a template without a tools section drops
    them without a word, and the model answers as if it had none. ``render`` returns None where
    it cannot render without them (such a template uses them)."""
    if not args.get("tools"):
        return
    if ids == render({k: v for k, v in args.items() if k != "tools"}):
        raise ToolsNotRendered(f"this model's chat template does not render tools; {fix}")


#: the chat templates minisgl ships (``minisgl_core/tokenizer/templates/NAME.jinja``), taken by
#: name where a template is asked for: ``serve --chat-template NAME``, ``LLM.chat(chat_template=NAME)``
BUNDLED_CHAT_TEMPLATES = ("chatml-tools",)


def bundled_chat_template(name: str) -> str | None:
    """The text of the bundled chat template ``name`` (one of :data:`BUNDLED_CHAT_TEMPLATES`), or
    None where no bundled template has that name."""
    if name not in BUNDLED_CHAT_TEMPLATES:
        return None
    return _read_bundled(name)


@functools.cache
def _read_bundled(name: str) -> str:
    """A bundled template's text, read once a process (``LLM.chat`` asks on every call)."""
    from importlib.resources import files

    return files("minisgl_core.tokenizer").joinpath("templates", f"{name}.jinja").read_text(encoding="utf-8")


def chatml_tools_hint(own_template: object, how: str) -> str:
    """The end of a :class:`ToolsNotRendered` fix where the model's own template is ChatML (its
    turns open with ``<|im_start|>``, as the default SmolLM2's do): the bundled ``chatml-tools``
    renders tools for it, and ``how`` says how to pick it; else nothing."""
    if isinstance(own_template, str) and "<|im_start|>" in own_template:
        return f"; for this ChatML model the bundled chatml-tools template does: {how}"
    return ""


def unrendered_tools_fix(args: Mapping[str, Any], own_template: object) -> str:
    """The ``fix`` of a :class:`ToolsNotRendered` for a request rendered with ``args`` on a
    tokenizer whose template is ``own_template``: a template of the request's own that renders
    tools, else the server started with one."""
    if args.get("chat_template"):
        return "send a chat_template that does"
    return "start the server with --chat-template FILE whose template does" + chatml_tools_hint(
        own_template, "--chat-template chatml-tools --tool-call-parser hermes"
    )


def has_jinja(text: str) -> bool:
    """Whether ``text`` has a Jinja tag ({{ }} or {% %}), as a chat template has: a file's name or
    plain text has none (``LLM.chat(chat_template=...)`` and ``serve --chat-template`` refuse it)."""
    return "{{" in text or "{%" in text


def _check_tool(tool: dict[str, Any], where: str) -> None:
    """A tool as the server's schema takes one: of type "function", with a function that has a
    name (another kind of tool was rendered, or not, and then blamed on the chat template)."""
    kind = tool.get("type")
    if kind is None:
        raise ValueError(f'{where}: needs "type": "function"')
    if kind != "function":
        raise ValueError(
            f'{where}: type {short_repr(kind)} is not supported: minisgl calls functions; pass tools of type "function"'
        )
    function = tool.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f'{where}: needs "function": {{"name": ..., "parameters": {{...}}}} with a name')


def checked_template_args(
    chat_template: object,
    add_generation_prompt: object,
    continue_final_message: object,
    chat_template_kwargs: object,
    tools: object,
) -> dict[str, Any]:
    """:func:`template_args` of ``LLM.chat``'s keyword arguments, each checked first (the
    server's schema checks its request's)."""
    for name, value in (
        ("add_generation_prompt", add_generation_prompt),
        ("continue_final_message", continue_final_message),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {short_repr(value)}")
    if chat_template_kwargs is not None:
        if not isinstance(chat_template_kwargs, Mapping):
            raise TypeError(
                f"chat_template_kwargs must be a dict of template variables, got {type(chat_template_kwargs).__name__}"
            )
        for key in chat_template_kwargs:
            if key in _CHAT_ARGUMENTS:
                raise ValueError(
                    f"chat_template_kwargs: {short_repr(key)} is chat()'s own argument: pass {key}= instead"
                )
            if key in TEMPLATE_RESERVED or not isinstance(key, str):
                raise ValueError(
                    f"chat_template_kwargs: {short_repr(key)} is not a template variable chat() can pass"
                )
        check_valid_text(chat_template_kwargs, "chat_template_kwargs")
    if tools is not None:
        if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
            raise TypeError('tools must be a list of tool dicts ({"type": "function", "function": {...}})')
        tools = [dict(t) for t in tools]
        for i, tool in enumerate(tools):
            _check_tool(tool, f"tools[{i}]")
            check_valid_text(tool, f"tools[{i}]")
    if chat_template is not None:
        if not isinstance(chat_template, str):
            raise TypeError(
                f"chat_template must be the Jinja text of a template, got {type(chat_template).__name__}"
            )
        check_valid_text(chat_template, "chat_template")
        bundled = None if has_jinja(chat_template) else bundled_chat_template(chat_template)
        if bundled is not None:
            chat_template = bundled
        elif not has_jinja(chat_template):  # a file's name, say
            raise ValueError(
                f"chat_template must be the Jinja text of a template or the name of a bundled one "
                f"({', '.join(BUNDLED_CHAT_TEMPLATES)}), got {short_repr(chat_template)} (no {{{{ }}}} "
                "or {% %} in it); read a template file with Path(...).read_text()"
            )
    return template_args(
        add_generation_prompt,
        continue_final_message,
        variables=chat_template_kwargs,
        tools=tools,
        chat_template=chat_template,
    )
