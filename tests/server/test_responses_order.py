"""/v1/responses output items in the order the model wrote them, and each output_text's logprobs,
the same streamed or not, through the official ``openai`` client.

Found too: ``usage.output_tokens_details.reasoning_tokens`` was the reasoning's text encoded
again, not the tokens the model generated for it (``<think>``, ``H``, ``m``, ``m``, ``</think>``
counted as "Hmm" re-encodes, tags left out); it now counts those generated.

Found: text after a call (``<tool_call>...</tool_call> and some text``) streamed as a
function_call item then a message, but the whole response put the message first, text from
before and after the call joined in one message; and a delta that merged the call's last tokens
with the text after it (the route fell behind) streamed the message first too. Streamed, the
tokens after the last text went to no item, and a call's tokens joined the text before it, while
the whole response gave the one message every token's logprobs.

The engine is faked, as in test_parser_failures: the route's group yields scripted token events,
one delta per token or all merged into one (a tiny random model writes no tool calls). Every
answer and event is validated strictly against the client's own pydantic types.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import Any

import openai
import pytest
from minisgl_plugin_hermes.parser import HermesToolParser
from minisgl_plugin_qwen3_reasoning.parser import DeepSeekR1ReasoningParser, Qwen3ReasoningParser
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.testclient import TestClient

from minisgl_core.api import ReasoningDelta, ReasoningParser, ReasoningResult, TagReasoningParser, ToolParser
from minisgl_core.messages import Admission
from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.app import create_app
from minisgl_core.server.state import Delta, ModelInfo, RequestGroup, ServerState, TokenEvent

EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = [
    "<tool_call>",
    "\n",
    '{"name": "get_weather",',
    ' "arguments": {"city": "Paris"}}',
    "\n",
    "</tool_call>",
]
EOS = ""  # the end of sequence token: its event has no text


def events_of(tokens: list[str], finish: str = "stop") -> list[TokenEvent]:
    """One event per token, each with its logprob (told apart by its value), the last one ending
    the choice (``finish``: its reason)."""
    return [
        TokenEvent(
            0,
            10 + i,
            text,
            finish if i == len(tokens) - 1 else None,
            None,
            [text, -i / 100, [[text, -i / 100, 10 + i]], 10 + i, 1],
            None,
        )
        for i, text in enumerate(tokens)
    ]


@pytest.fixture
def client(monkeypatch, model_dir):
    """``client(tokens, merged)``: an openai client whose requests get ``tokens`` as the engine's
    output, a delta per token or (``merged``) all in one."""

    def make(
        tokens: list[str],
        merged: bool,
        reasoning_parser: type[ReasoningParser] | None = Qwen3ReasoningParser,
        opened: bool = False,
        *,
        starts: Collection[int] | None = None,
        finish: str = "stop",
        tool_parser: type[ToolParser] | None = HermesToolParser,
    ) -> openai.OpenAI:
        """(``opened``: the prompt ended with the reasoning's start tag; ``starts``: the tokens
        that begin a delta, for ``merged``; ``finish``: the output's finish reason)"""

        async def add(self, params, n=1, **kwargs):
            self.num_choices += n
            self.choice_prompt_tokens += [3] * n
            self.choice_prompt_ids += [None] * n
            self.prompt_tokens += 3
            return Admission(0, 3, 5, reasoning_opened=opened)

        async def deltas(self):
            out: list[Delta] = []
            for i, event in enumerate(events_of(tokens, finish)):
                if not out or (i in starts if starts is not None else not merged):
                    out.append(Delta(0))
                out[-1].add(event)
            for delta in out:
                yield delta

        monkeypatch.setattr(RequestGroup, "add", add)
        monkeypatch.setattr(RequestGroup, "deltas", deltas)
        info = ModelInfo("m", str(model_dir), max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
        options = ApiOptions(tool_parser=tool_parser, reasoning_parser=reasoning_parser)
        app = create_app(ServerState(endpoints=None, model=info), options=options)
        # no lifespan (no engine behind it): the group's add and deltas above stand for it
        http = TestClient(app, raise_server_exceptions=False)
        return openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
        )

    return make


def answer(client: openai.OpenAI, **extra: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The whole response and the events of the streamed one, both as JSON (``tools=None``:
    none offered)."""
    body = {"model": "m", "input": "Weather in Paris?", "tools": [WEATHER], **extra}
    body = {k: v for k, v in body.items() if v is not None}
    whole = client.responses.create(**body)
    Response.model_validate(whole.model_dump(mode="json"))
    events = [
        e.model_dump(mode="json", exclude_unset=True) for e in client.responses.create(**body, stream=True)
    ]
    for event in events:
        EVENTS.validate_python(event)
    return whole.model_dump(mode="json", exclude_unset=True), events


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in response.items() if k not in ("id", "created_at", "completed_at")}
    out["output"] = [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in response["output"]]
    if out.get("usage"):  # (the prompt tokens the prefix cache held differ between two sends)
        out["usage"] = {**out["usage"], "input_tokens_details": None}
    return out


def shape(response: dict[str, Any]) -> list[tuple[str, str]]:
    """Each item's type and its text or call."""
    return [
        (i["type"], i["name"] + i["arguments"] if i["type"] == "function_call" else i["content"][0]["text"])
        for i in response["output"]
    ]


ARGUMENTS = 'get_weather{"city": "Paris"}'


@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize(
    ("tokens", "items"),
    [
        (
            [*CALL, " and", " some", " text", EOS],
            [("function_call", ARGUMENTS), ("message", " and some text")],
        ),
        (
            ["Let", " me", " check.", "\n", *CALL, "\n", "Done", ".", EOS],
            [("message", "Let me check."), ("function_call", ARGUMENTS), ("message", "\nDone.")],
        ),
        (
            [*CALL, " then", " again", *CALL, EOS],
            [("function_call", ARGUMENTS), ("message", " then again"), ("function_call", ARGUMENTS)],
        ),
        (
            ["<think>", "Call", " it.", "</think>", "Sure.", *CALL, EOS],
            [("reasoning", "Call it."), ("message", "Sure."), ("function_call", ARGUMENTS)],
        ),
    ],
    ids=["call-then-text", "text-call-text", "call-text-call", "reasoning-text-call"],
)
def test_items_come_in_the_order_they_were_written_streamed_or_not(client, tokens, items, merged):
    whole, events = answer(client(tokens, merged))
    final = events[-1]
    assert final["type"] == "response.completed"
    assert without_ids(final["response"]) == without_ids(whole)
    assert shape(whole) == items
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [kind for kind, _ in items]
    indices = [e["output_index"] for e in events if "output_index" in e]
    assert indices == sorted(indices)


def logprob_tokens(item: dict[str, Any]) -> list[str]:
    return [lp["token"] for lp in item["content"][0]["logprobs"]]


@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        # the text's tokens, with the eos after it: the call's are no output_text's
        (["Let", " me", " check.", "\n", *CALL, EOS], [["Let", " me", " check."]]),
        (["Hi", ".", EOS], [["Hi", ".", EOS]]),
        # a marker's start held back, then text after all: it goes with that text
        (["a", " <tool", "x", EOS], [["a", " <tool", "x", EOS]]),
        (
            ["Let", " me", " check.", "\n", *CALL, "\n", "Done", ".", EOS],
            [["Let", " me", " check."], ["\n", "Done", ".", EOS]],
        ),
        ([*CALL, " and", " more", EOS], [[" and", " more", EOS]]),
        # the end tag's tokens are the reasoning's (reasoning_tokens counts them), split or not
        (["<think>", "Hm", "</think>", "Hi", EOS], [["Hi", EOS]]),
        (["<think>", "Hm", "</", "think>", "\n\n", "Hi", EOS], [["\n\n", "Hi", EOS]]),
        (["<think>", "Hm", "</think>Hi", EOS], [["</think>Hi", EOS]]),
    ],
    ids=[
        "text-call",
        "text",
        "held-text",
        "text-call-text",
        "call-text",
        "reasoning-text",
        "reasoning-split-tag",
        "reasoning-tag-and-text",
    ],  # fmt: skip
)
def test_each_text_has_its_own_tokens_logprobs_streamed_or_not(client, tokens, expected, merged):
    whole, events = answer(client(tokens, merged), include=["message.output_text.logprobs"], top_logprobs=1)
    final = events[-1]["response"]
    assert without_ids(final) == without_ids(whole)
    messages = [i for i in whole["output"] if i["type"] == "message"]
    assert [logprob_tokens(m) for m in messages] == expected
    done = [e["logprobs"] for e in events if e["type"] == "response.output_text.done"]
    assert done == [m["content"][0]["logprobs"] for m in messages]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    for index, item in enumerate(whole["output"]):
        if item["type"] == "message":
            streamed = [lp for e in deltas if e["output_index"] == index for lp in e["logprobs"]]
            # (an eos after the text writes no delta: its logprob comes with the text's done)
            assert streamed == [lp for lp in item["content"][0]["logprobs"] if lp["token"] != EOS]


def test_a_merged_choice_reads_token_by_token():
    """``Delta.tokens``: each event's text and logprob entry, however the deltas merged; text that
    came without events (a delta built whole) is one piece where it stands."""
    events = events_of(["a", "", "bc", "d"])
    one, two = Delta(0), Delta(0)
    for event in events[:2]:
        one.add(event)
    for event in events[2:]:
        two.add(event)
    choice = Delta(0)
    for delta in (one, Delta(0, text="XY"), two, Delta(0, text="Z")):
        choice.merge(delta)
    pieces = [(text, [e[0] for e in entries]) for text, entries in choice.tokens()]
    assert pieces == [("a", ["a"]), ("", [""]), ("XY", []), ("bc", ["bc"]), ("d", ["d"]), ("Z", [])]
    assert choice.text == "aXYbcdZ"


class UntaggedReasoning(ReasoningParser):
    """Qwen3's reading behind a parser of another shape, which tells no end tag."""

    def __init__(self) -> None:
        self._inner = Qwen3ReasoningParser()

    def parse(self, text: str) -> ReasoningResult:
        return self._inner.parse(text)

    def feed(self, text: str) -> ReasoningDelta:
        return self._inner.feed(text)

    def finish(self) -> ReasoningDelta:
        return self._inner.finish()


assert not issubclass(UntaggedReasoning, TagReasoningParser)


@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize(
    "reading",
    [{"tools": None}, {}, {"tools": None, "include": ["message.output_text.logprobs"], "top_logprobs": 1}],
    ids=["plain", "tools", "logprobs"],
)
@pytest.mark.parametrize(
    ("tokens", "parser", "opened", "expected"),
    [
        # from the first token through the one that completed the end tag; not the whitespace
        # after it, nor the answer
        (["<think>", "H", "m", "m", ".", "</think>", "\n\n", "Hi", EOS], Qwen3ReasoningParser, False, 6),
        (["<think>", "Hm", "</", "think", ">", "\n", "Hi", EOS], Qwen3ReasoningParser, False, 5),
        (["<think>", "Hm", "</think>Hi", EOS], Qwen3ReasoningParser, False, 3),
        (["\n", "<th", "ink>", "Hm", "</think>", "Hi", EOS], Qwen3ReasoningParser, False, 5),
        (["<think>", "</think>", "Hi", EOS], Qwen3ReasoningParser, False, 2),
        (["<think>", "</thi", "nk>", "Hi", EOS], Qwen3ReasoningParser, False, 3),
        (["<think>", "Call", " it.", "</think>", *CALL, EOS], Qwen3ReasoningParser, False, 4),
        # never closed: all of the output
        (["<think>", "Hm", " more", EOS], Qwen3ReasoningParser, False, 4),
        # not opened: none
        (["Hi", " </think>", "x", EOS], Qwen3ReasoningParser, False, 0),
        # opened by the prompt, or by deepseek_r1's reading
        (["H", "m", ".", "</think>", "Hi", EOS], Qwen3ReasoningParser, True, 4),
        (["H", "m", ".", "</think>", "\n", "Hi", EOS], DeepSeekR1ReasoningParser, False, 4),
        (["<think>", "Hm", "</think>", "Hi", EOS], DeepSeekR1ReasoningParser, False, 3),
        # a parser with no tag: through the last token that gave reasoning text
        (["<think>", "Hm", " ok", "</think>", "\n", "Hi", EOS], UntaggedReasoning, False, 3),
        (["<think>", "H", "m", EOS], UntaggedReasoning, False, 4),
    ],
    ids=[
        "closed", "split-end-tag", "end-tag-and-answer", "whitespace-first", "empty",
        "empty-split-end-tag", "then-call",
        "unclosed", "not-opened", "opened-by-prompt", "deepseek", "deepseek-start-tag",
        "untagged", "untagged-unclosed",
    ],
)  # fmt: skip
def test_reasoning_tokens_are_the_tokens_generated_for_it(
    client, tokens, parser, opened, expected, reading, merged
):
    whole, events = answer(client(tokens, merged, parser, opened), **reading)
    final = events[-1]["response"]
    assert without_ids(final) == without_ids(whole)
    assert whole["usage"]["output_tokens"] == len(tokens)
    assert whole["usage"]["output_tokens_details"] == {"reasoning_tokens": expected}


#: what a random output is made of: text, whitespace, the reasoning's tags and their pieces, a
#: call's markers and their pieces, JSON pieces, a call to an unknown function, a replacement char
PIECES = ["Hi", " there", ".", "\n", "\n\n", " ", "<think>", "</think>", "<th", "ink>", "</", "think>",
          "<tool_call>", "</tool_call>", "<tool", "_call>", '{"name": "get_weather",',
          '{"name": "nope", "arguments": {}}', "{", "}", '"', "😀", "\ufffd", "<", ">"]  # fmt: skip


def random_output(rng: random.Random) -> list[str]:
    """Maybe reasoning (closed or not), then calls, calls cut short and random pieces."""
    tokens = []
    if rng.random() < 0.4:
        tokens += ["<think>", *rng.choices(PIECES[:6], k=rng.randint(0, 3))]
        tokens += ["</think>"] if rng.random() < 0.8 else []
    for _ in range(rng.randint(0, 5)):
        kind = rng.random()
        if kind < 0.3:
            tokens += CALL
        elif kind < 0.4:
            tokens += CALL[: rng.randint(1, len(CALL))]
        else:
            tokens += rng.choices(PIECES, k=rng.randint(1, 3))
    return [*tokens, EOS]


def events_in_order(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check a stream's events are OpenAI's order (numbered from 0; created, in progress; each
    item added, its part, its deltas, their done events and the item's done, one item at a time,
    each event naming the open item by id and index; each done's text the deltas'); the items the
    done events gave, which must be the final response's output."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    items: list[dict[str, Any]] = []
    item_open = part_open = False
    written: dict[str, str] = {}  # a delta event's type: the text of the open item's deltas
    for event in events[2:-1]:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert not item_open and event["output_index"] == len(items)
            items.append(event["item"])
            item_open, written = True, {}
            continue
        assert item_open and event["output_index"] == len(items) - 1
        if kind == "response.output_item.done":
            assert not part_open and event["item"]["id"] == items[-1]["id"]
            items[-1], item_open = event["item"], False
            continue
        assert event["item_id"] == items[-1]["id"] and event.get("content_index", 0) == 0
        if kind in ("response.content_part.added", "response.content_part.done"):
            assert part_open == kind.endswith(".done")
            part_open = not part_open
        elif kind.endswith(".delta"):
            assert part_open or kind == "response.function_call_arguments.delta"
            written[kind] = written.get(kind, "") + event["delta"]
        else:
            done = event["arguments"] if kind == "response.function_call_arguments.done" else event["text"]
            assert done == written.get(kind.replace(".done", ".delta"), "")
    assert not item_open
    return items


def texts(response: dict[str, Any], kind: str) -> str:
    """The text of a response's items of a ``kind`` (message, reasoning), joined."""
    return "".join(i["content"][0]["text"] for i in response["output"] if i["type"] == kind)


@pytest.mark.parametrize("seed", range(40))
def test_random_outputs_read_alike_streamed_whole_and_on_chat(client, seed):
    """A seeded property test: a random output (reasoning, text, calls whole and cut short, tag and
    marker pieces) coming in random deltas, finished or cut off, read with or without a tool
    parser, tools (parallel calls or one), logprobs, either reasoning parser or none: the stream's
    events are in OpenAI's order and build its final response, which is the whole one; its calls,
    reasoning and text are chat's for the same output."""
    rng = random.Random(seed)
    tokens = random_output(rng)
    finish = rng.choice(["stop", "stop", "length"])
    starts = set(rng.sample(range(1, len(tokens)), rng.randint(0, len(tokens) - 1)))
    parser = rng.choice([Qwen3ReasoningParser, DeepSeekR1ReasoningParser, None])
    tool_parser = HermesToolParser if rng.random() < 0.8 else None
    served = client(
        tokens, False, parser, parser is not None and rng.random() < 0.2,
        starts=starts, finish=finish, tool_parser=tool_parser,
    )  # fmt: skip
    tools = [WEATHER] if tool_parser is not None and rng.random() < 0.8 else None
    single = {"parallel_tool_calls": False} if tools and rng.random() < 0.3 else {}
    reading = {"include": ["message.output_text.logprobs"]} if rng.random() < 0.4 else {}
    whole, events = answer(served, tools=tools, **single, **reading)
    final = events[-1]["response"]
    assert events_in_order(events) == final["output"]
    assert without_ids(final) == without_ids(whole)
    assert whole["status"] == ("incomplete" if finish == "length" else "completed")
    offered = {
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["parameters"]}}
        ]
    }
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    chat = served.chat.completions.create(
        model="m", messages=messages, **(offered if tools else {}), **single
    )
    message = chat.choices[0].message
    assert [(i["name"], i["arguments"]) for i in whole["output"] if i["type"] == "function_call"] == [
        (call.function.name, call.function.arguments) for call in message.tool_calls or ()
    ]
    assert texts(whole, "reasoning") == ((message.model_extra or {}).get("reasoning_content") or "")
    assert texts(whole, "message") == (message.content or "")
