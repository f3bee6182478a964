"""The bundled chat template ``chatml-tools`` (``serve --chat-template chatml-tools``,
``LLM.chat(chat_template="chatml-tools")``), rendered by transformers with the real default
model's tokenizer (SmolLM2-135M-Instruct, whose own ChatML template has no tools section):

- a conversation without tools renders to the very tokens of the model's own template;
- the tools it lists, the calls it writes and the results it sends back are read back exactly:
  the functions by ``json``, the calls by the ``hermes`` tool parser, the server's pairing of them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from minisgl_plugin_hermes.parser import HermesToolParser

from minisgl_core.tokenizer.chat_input import (
    BUNDLED_CHAT_TEMPLATES,
    bundled_chat_template,
    chatml_tools_hint,
    checked_template_args,
)
from minisgl_core.tokenizer.load import load_tokenizer

TEMPLATE = bundled_chat_template("chatml-tools")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def smollm(default_model_dir: Path):
    return load_tokenizer(default_model_dir)


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, chat_template=TEMPLATE, **kwargs)


def test_the_template_is_shipped_and_named():
    assert BUNDLED_CHAT_TEMPLATES == ("chatml-tools",)
    assert TEMPLATE is not None and "<|im_start|>" in TEMPLATE
    assert bundled_chat_template("chatml") is None and bundled_chat_template("../chatml-tools") is None


def test_the_template_file_is_read_once(monkeypatch):
    """``LLM.chat(chat_template="chatml-tools")`` asks for the text on every call: the file is read
    once a process, not each time."""
    import importlib.resources

    reads = []
    real = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files", lambda package: reads.append(package) or real(package))
    assert bundled_chat_template("chatml-tools") == bundled_chat_template("chatml-tools") == TEMPLATE
    assert len(reads) <= 1, reads


PLAIN = [
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], {}),
    (
        [
            {"role": "system", "content": "Answer in French.\nAlways."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Japan? 日本"},
        ],
        {},
    ),
    (
        [
            {"role": "system", "content": "x"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
        ],
        {"add_generation_prompt": False},
    ),
    (
        [
            {"role": "system", "content": "x"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "The"},
        ],
        {"add_generation_prompt": False, "continue_final_message": True},
    ),
]


@pytest.mark.parametrize(
    ("messages", "kwargs"), PLAIN, ids=["one-turn", "multi-turn", "no-prompt", "continue"]
)
def test_a_conversation_without_tools_renders_as_the_models_own_template(smollm, messages, kwargs):
    """SmolLM2's template is plain ChatML (its own default system turn aside, so each of these
    gives one): the bundled template changes nothing for a model that does not use tools."""
    own = smollm.apply_chat_template(messages, **kwargs)
    assert smollm.apply_chat_template(messages, chat_template=TEMPLATE, **kwargs) == own


def _between(text: str, start: str, end: str) -> list[str]:
    return re.findall(re.escape(start) + r"\n(.*?)\n" + re.escape(end), text, re.S)


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_the_system_turn_lists_each_function_after_the_system_message(smollm, system):
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": "Hi"}
    ]
    text = render(smollm, messages, tools=[WEATHER, CLOCK], add_generation_prompt=True)
    turn = text.split("<|im_end|>")[0]
    assert turn.startswith("<|im_start|>system\n" + (f"{system}\n\n" if system else "") + "# Tools\n")
    (listed,) = _between(turn, "<tools>", "</tools>")
    assert [json.loads(line) for line in listed.split("\n")] == [WEATHER["function"], CLOCK["function"]]
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def _assistant_turn(text: str) -> str:
    return text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
ARGUMENTS = st.dictionaries(st.text(max_size=10), JSON, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["get_weather", "now"]), ARGUMENTS, st.booleans()), min_size=1, max_size=3
    ),
    content=st.sampled_from([None, "", "Let me check."]),
)
def test_the_calls_it_writes_are_what_the_hermes_parser_reads(smollm, calls, content):
    """An assistant turn's ``tool_calls`` (arguments as OpenAI's JSON text or as an object), rendered
    into the conversation, parse back with the ``hermes`` parser to the same names and arguments,
    in order, and the same content: the format the model is shown is the format the server reads."""
    tool_calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_text else args},
        }
        for i, (name, args, as_text) in enumerate(calls)
    ]
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": content, "tool_calls": tool_calls},
    ]
    turn = _assistant_turn(render(smollm, messages, tools=[WEATHER, CLOCK], add_generation_prompt=False))
    parsed = HermesToolParser([WEATHER, CLOCK]).parse(turn)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [(n, a) for n, a, _ in calls]
    assert (parsed.content or None) == (content or None)


def test_tool_results_go_back_in_one_user_turn_in_order(smollm):
    """Consecutive ``tool`` messages (the results of one turn's parallel calls) make one user turn
    of <tool_response> blocks, in the order of the messages; the next user message its own turn."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    results = ['{"temperature": 18}', "sunny\nand dry"]
    messages = [
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": results[0]},
        {"role": "tool", "tool_call_id": "c2", "content": results[1]},
        {"role": "user", "content": "Thanks"},
    ]
    text = render(smollm, messages, tools=[WEATHER], add_generation_prompt=True)
    turns = text.split("<|im_end|>\n")
    back = [t for t in turns if "<tool_response>" in t]
    assert len(back) == 1 and back[0].startswith("<|im_start|>user\n<tool_response>\n")
    assert _between(back[0], "<tool_response>", "</tool_response>") == results
    assert turns[turns.index(back[0]) + 1] == "<|im_start|>user\nThanks"


def test_offline_chat_takes_the_bundled_name():
    args = checked_template_args("chatml-tools", True, False, None, [WEATHER])
    assert args["chat_template"] == TEMPLATE and args["tools"] == [WEATHER]
    with pytest.raises(ValueError, match=r"or the name of a bundled one \(chatml-tools\), got 'chatml'"):
        checked_template_args("chatml", True, False, None, None)


def test_only_a_chatml_models_refusal_names_the_bundled_template(smollm):
    assert chatml_tools_hint(smollm.chat_template, "HOW") == (
        "; for this ChatML model the bundled chatml-tools template does: HOW"
    )
    llama3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"
    assert chatml_tools_hint(llama3, "HOW") == "" and chatml_tools_hint(None, "HOW") == ""
