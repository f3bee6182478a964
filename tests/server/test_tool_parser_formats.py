"""The ``mistral`` and ``pythonic`` tool parsers end to end, through the official ``openai`` client:
a server per parser (a tiny random MistralForCausalLM for ``mistral``, LlamaForCausalLM for
``pythonic``) with a chat template of the model family's layout (``data/*_tools_template.jinja``).

A random model writes no tool calls of its own, so with ``tool_choice`` ``auto`` a regex grammar
(``structured_outputs``) makes it write its family's format, which the server's parser must read
back into the ``tool_calls`` the client parses, streamed or not; the arguments are checked against
the function's parameters with ``jsonschema``. ``required`` and a named function force a JSON array
of calls whatever the parser, and must give valid calls on these servers too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import openai
import pytest

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.tokenizer.load import load_tokenizer

DATA = Path(__file__).parent / "data"
PLAN_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "plan_trip", "description": "Plan a trip", "parameters": PLAN_PARAMS},
    },
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS},
    },
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "Plan two days in Paris and tell me the weather there."}]


@dataclass(frozen=True)
class Format:
    arch: str
    #: the format's markers, whole tokens of the tiny tokenizer (as in the real ones)
    added_tokens: tuple[str, ...]
    template: Path
    #: (id, regex the model's answer is made to match, content, names of the calls)
    answers: tuple[tuple[str, str, str | None, list[str]], ...]


FORMATS = {
    "mistral": Format(
        "MistralForCausalLM",
        ("[TOOL_CALLS]",),
        DATA / "mistral_tools_template.jinja",
        (
            # tokenizer v3 (Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct)
            (
                "v3",
                r'\[TOOL_CALLS\] \[\{"name": "plan_trip", "arguments": '
                r'\{"city": "(Paris|Rome)", "days": [1-7]\}\}, \{"name": "get_weather", '
                r'"arguments": \{"city": "[A-Z][a-z]{2,8}"\}\}\]',
                None,
                ["plan_trip", "get_weather"],
            ),
            # the same as the text reads with the special token skipped (a request's default with
            # Mistral's tokenizers, where [TOOL_CALLS] is special; the tiny one keeps it as text)
            (
                "v3-skipped",
                r'\[\{"name": "plan_trip", "arguments": \{"city": "(Paris|Rome)", "days": [1-7]\}\}\]',
                None,
                ["plan_trip"],
            ),
        ),
    ),
    "pythonic": Format(
        "LlamaForCausalLM",
        ("<|python_start|>", "<|python_end|>"),
        DATA / "pythonic_tools_template.jinja",
        (
            # Llama 3.2
            (
                "llama3.2",
                r'\[plan_trip\(city="(Paris|Rome)", days=[1-7]\), get_weather\(city="[A-Z][a-z]{2,8}"\)\]',
                None,
                ["plan_trip", "get_weather"],
            ),
            # Llama 4, single quotes
            (
                "llama4",
                r"<\|python_start\|>\[plan_trip\(city='(Paris|Rome)', days=[1-7]\)\]<\|python_end\|>",
                None,
                ["plan_trip"],
            ),
        ),
    ),
}
CASES = [(name, answer) for name, fmt in FORMATS.items() for answer in fmt.answers]


@pytest.fixture(scope="module", params=sorted(FORMATS))
def served(request, start_server, engine_args, tmp_path_factory):
    """(parser name, its Format, openai client, model name, the model's directory)."""
    from minisgl_core.plugins import Plugins

    if not Plugins.load().registry.get("grammars"):
        pytest.skip("no grammar backend installed: the answers' regexes cannot be enforced")
    name = request.param
    fmt = FORMATS[name]
    model = make_model_dir(
        tmp_path_factory.mktemp("model") / f"tiny-{name}", fmt.arch, seed=3, added_tokens=fmt.added_tokens
    )
    server = start_server(
        [
            "--model",
            str(model),
            *engine_args,
            "--tool-call-parser",
            name,
            "--chat-template",
            str(fmt.template),
        ]
    )
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    return name, fmt, client, model.name, model


def _streamed(client, **kwargs) -> tuple[str, list[tuple[str, str, str]], str]:
    """A streamed answer's content, its calls (id, name, arguments) by index and its finish reason."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, ["", "", ""])
            entry[0] += part.id or ""
            entry[1] += part.function.name or ""
            entry[2] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


def _check_calls(calls: list[tuple[str, str, str]], names: list[str]) -> None:
    assert [name for _, name, _ in calls] == names, calls
    for call_id, name, arguments in calls:
        assert call_id.startswith("call_")
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])


def test_auto_reads_the_model_family_s_format(served):
    parser, fmt, client, model, _ = served
    for case, regex, content, names in fmt.answers:
        kwargs = dict(
            model=model,
            messages=ASK,
            tools=TOOLS,
            temperature=0,
            max_tokens=400,
            extra_body={"structured_outputs": {"regex": regex}},
        )
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert (choice.finish_reason, choice.message.content) == ("tool_calls", content), (
            parser,
            case,
            choice,
        )
        _check_calls(calls, names)
        streamed_content, streamed_calls, finish = _streamed(client, **kwargs)
        assert (streamed_content, finish) == (content or "", "tool_calls"), (parser, case)
        assert [c[1:] for c in streamed_calls] == [c[1:] for c in calls], (parser, case)


def test_auto_text_that_is_no_call_is_content(served):
    """The same format gone wrong (a function not offered) is content, as the parser's contract says."""
    parser, _, client, model, _ = served
    wrong = {
        "mistral": r'\[TOOL_CALLS\] \[\{"name": "delete_files", "arguments": \{"all": true\}\}\]',
        "pythonic": r"\[delete_files\(all=True\)\]",
    }[parser]
    choice = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        temperature=0,
        max_tokens=100,
        extra_body={"structured_outputs": {"regex": wrong}},
    ).choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls, choice
    assert "delete_files" in choice.message.content


@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_required_and_named_tool_choice_force_valid_calls(served, tool_choice):
    """The forced JSON array of calls needs nothing of the parser: it works whatever its format."""
    _, _, client, model, _ = served
    choice_field = (
        {"type": "function", "function": {"name": "plan_trip"}} if tool_choice == "named" else "required"
    )
    kwargs = dict(model=model, messages=ASK, tools=TOOLS, tool_choice=choice_field, max_tokens=200, seed=5)
    choice = client.chat.completions.create(**kwargs).choices[0]
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert choice.finish_reason == "tool_calls" and calls, choice
    _check_calls(calls, [name for _, name, _ in calls])
    if tool_choice == "named":
        assert [name for _, name, _ in calls] == ["plan_trip"]
    content, streamed, finish = _streamed(client, **kwargs)
    assert (content, finish) == ("", "tool_calls")
    _check_calls(streamed, [name for _, name, _ in streamed])


def test_a_call_and_its_result_reach_the_template(served):
    """The round trip's second request: the call the parser read, sent back with a tool result,
    renders through the family's template as transformers renders it."""
    _, fmt, client, model, model_dir = served
    _, regex, _, _ = fmt.answers[0]
    first = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        temperature=0,
        max_tokens=400,
        extra_body={"structured_outputs": {"regex": regex}},
    ).choices[0]
    calls = [c.model_dump(exclude_none=True) for c in first.message.tool_calls]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": True})} for c in calls),
    ]
    answer = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", max_tokens=4
    )
    reference = load_tokenizer(model_dir, chat_template=fmt.template.read_text())
    for call in calls:  # (the template gets the arguments decoded, as the server passes them)
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    ids = reference.apply_chat_template(history, tools=TOOLS, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert answer.usage.prompt_tokens == len(ids)
    rendered = reference.decode(ids)
    assert first.message.tool_calls[0].function.name in rendered


# ---------------------------------------------------------------- Mistral's markers as special tokens

#: Mistral's markers, special tokens as in its real tokenizers (skip_special_tokens drops them)
MISTRAL_SPECIAL = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")


@pytest.fixture(scope="module")
def mistral_special(start_server, engine_args, tmp_path_factory):
    """(openai client, model name, token id of each marker): a mistral server whose tokenizer has
    the markers as special tokens. llguidance's Lark grammars name a token by its id (``<[5]>``),
    so a random model can be made to write the special tokens themselves (a regex only spells
    their text out of ordinary tokens, and xgrammar gives special tokens no text)."""
    from minisgl_core.plugins import Plugins

    if "llguidance" not in (Plugins.load().registry.get("grammars") or {}):
        pytest.skip("llguidance is not installed: the special tokens cannot be forced")
    model = make_model_dir(
        tmp_path_factory.mktemp("model") / "tiny-mistral-special",
        "MistralForCausalLM",
        seed=3,
        special_added_tokens=MISTRAL_SPECIAL,
    )
    tokenizer = load_tokenizer(model)
    ids = {marker: tokenizer.convert_tokens_to_ids(marker) for marker in MISTRAL_SPECIAL}
    assert tokenizer.decode([ids["[ARGS]"]], skip_special_tokens=True) == ""  # special indeed
    server = start_server(
        [
            "--model",
            str(model),
            *engine_args,
            "--tool-call-parser",
            "mistral",
            "--chat-template",
            str(FORMATS["mistral"].template),
            "--grammar-backend",
            "llguidance",
        ]
    )
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    return client, model.name, ids


def _lark(ids: dict[str, int], *parts: str) -> str:
    """A Lark grammar of ``parts``: a marker becomes its token (``<[id]>``), other text a string or,
    between slashes, a regex."""
    items = [f"<[{ids[p]}]>" if p in ids else p if p.startswith("/") else json.dumps(p) for p in parts]
    return "start: " + " ".join(items)


def _v11(ids):
    """tokenizer v11's form: two calls, the second with a call id."""
    return _lark(
        ids,
        "[TOOL_CALLS]",
        "plan_trip",
        "[ARGS]",
        '{"city": "',
        "/(Paris|Rome)/",
        '", "days": ',
        "/[1-7]/",
        "}",
        "[TOOL_CALLS]",
        "get_weather",
        "[CALL_ID]",
        "/[a-zA-Z0-9]{9}/",
        "[ARGS]",
        '{"city": "',
        "/[A-Z][a-z]{2,8}/",
        '"}',
    )


def _v3_after_text(ids):
    """tokenizer v3's array after some content."""
    return _lark(
        ids,
        "Let me check.",
        "[TOOL_CALLS]",
        ' [{"name": "get_weather", "arguments": {"city": "',
        "/[A-Z][a-z]{2,8}/",
        '"}}]',
    )


@pytest.mark.parametrize(
    ("case", "content", "names"),
    [("v11", None, ["plan_trip", "get_weather"]), ("v3-after-text", "Let me check.", ["get_weather"])],
)
def test_mistral_calls_in_special_tokens_are_read_by_default(mistral_special, case, content, names):
    """No skip_special_tokens in the request (its default skips them): the mistral parser asks for
    them, reads the calls, and the content carries no special token's text."""
    client, model, ids = mistral_special
    grammar = {"v11": _v11, "v3-after-text": _v3_after_text}[case](ids)
    kwargs = dict(
        model=model,
        messages=ASK,
        tools=TOOLS,
        temperature=0,
        max_tokens=200,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    choice = client.chat.completions.create(**kwargs).choices[0]
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", content), choice
    _check_calls(calls, names)
    streamed_content, streamed_calls, finish = _streamed(client, **kwargs)
    assert (streamed_content, finish) == (content or "", "tool_calls")
    assert [c[1:] for c in streamed_calls] == [c[1:] for c in calls]
    # the stop token's text, kept by include_stop_str_in_output, is no content either
    kept = {**kwargs, "extra_body": {**kwargs["extra_body"], "include_stop_str_in_output": True}}
    choice = client.chat.completions.create(**kept).choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", content), choice
    assert _streamed(client, **kept)[0] == (content or "")


def test_mistral_special_tokens_left_in_content_are_skipped_unless_asked_for(mistral_special):
    """A marker that starts no call stays content, but as the request's skip_special_tokens has it:
    skipped by default (and when set true), kept when it is false."""
    client, model, ids = mistral_special
    grammar = _lark(ids, "Hi", "[TOOL_CALLS]", " sorry, no tool fits")
    for skip, content in [
        (None, "Hi sorry, no tool fits"),
        (True, "Hi sorry, no tool fits"),
        (False, "Hi[TOOL_CALLS] sorry, no tool fits"),
    ]:
        extra = {"structured_outputs": {"grammar": grammar}}
        if skip is not None:
            extra["skip_special_tokens"] = skip
        kwargs = dict(model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=100, extra_body=extra)
        choice = client.chat.completions.create(**kwargs).choices[0]
        assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == (
            "stop",
            content,
            None,
        ), skip
        assert _streamed(client, **kwargs) == (content, [], "stop"), skip
