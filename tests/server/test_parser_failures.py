"""A reasoning or tool-call parser is a plugin, and a plugin can raise. Found by a probe writing
one: an exception in ``parse`` was a 500 "internal error: RuntimeError: ..." naming no parser; one
in ``feed`` dropped the stream after its role chunk (no error event, no [DONE]); one in the
constructor came only after the whole generation, and a stream got a 200 with an empty body.
Now each is a 500 naming the parser's class, mid-stream an error event and [DONE], and a parser
that cannot be built is refused before anything is generated. The engine is faked (the route's
group yields one finished choice): what is under test is the route's handling of the parser."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from minisgl_core.api import TagReasoningParser
from minisgl_core.messages import Admission
from minisgl_core.server.api_options import ApiOptions
from minisgl_core.server.app import create_app
from minisgl_core.server.state import Delta, ModelInfo, RequestGroup, ServerState


class Exploding(TagReasoningParser):
    where = ""

    def __init__(self) -> None:
        if self.where == "init":
            raise RuntimeError("cannot build")
        super().__init__()

    def parse(self, text):
        if self.where == "parse":
            raise RuntimeError("parse exploded")
        if self.where == "parse-returns-str":
            return "not a ReasoningResult"
        return super().parse(text)

    def feed(self, text):
        if self.where == "feed":
            raise RuntimeError("feed exploded")
        if self.where == "feed-returns-str":
            return "not a delta"
        return super().feed(text)

    def finish(self):
        if self.where == "finish-returns-none":
            return None
        return super().finish()


def make_client(monkeypatch, options):
    added = []

    async def add(self, params, n=1, **kwargs):
        added.append(n)
        self.num_choices += n
        self.choice_prompt_tokens += [3] * n
        self.choice_prompt_ids += [None] * n
        self.prompt_tokens += 3
        return Admission(0, 3, 5)

    async def deltas(self):
        yield Delta(0, text="<think>hm</think>An answer.", token_ids=[5, 6, 7], finish_reason="stop")

    monkeypatch.setattr(RequestGroup, "add", add)
    monkeypatch.setattr(RequestGroup, "deltas", deltas)
    info = ModelInfo(name="m", path="m", max_context_len=2048, kv_capacity_tokens=16384, vocab_size=1024)
    state = ServerState(endpoints=None, model=info)
    app = create_app(state, options=options)
    # no lifespan (no engine behind it): the group's add and deltas above stand for it
    return TestClient(app, raise_server_exceptions=False), added


@pytest.fixture
def client(monkeypatch):
    return make_client(monkeypatch, ApiOptions(reasoning_parser=Exploding))


BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def test_a_working_parser_splits_the_fake_answer(client, monkeypatch):
    c, _ = client
    monkeypatch.setattr(Exploding, "where", "")
    message = c.post("/v1/chat/completions", json=BODY).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("hm", "An answer.")


@pytest.mark.parametrize("stream", [False, True])
def test_a_parser_that_cannot_be_built_is_refused_before_generating(client, monkeypatch, stream):
    c, added = client
    monkeypatch.setattr(Exploding, "where", "init")
    resp = c.post("/v1/chat/completions", json={**BODY, "stream": stream})
    assert resp.status_code == 500, resp.text
    message = resp.json()["error"]["message"]
    assert "reasoning parser" in message and "Exploding" in message and "cannot build" in message
    assert added == []  # nothing was sent to the engine


def test_parse_raising_is_a_500_naming_the_parser(client, monkeypatch):
    c, _ = client
    monkeypatch.setattr(Exploding, "where", "parse")
    resp = c.post("/v1/chat/completions", json=BODY)
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert error["type"] == "internal_server_error"
    assert "Exploding" in error["message"] and "parse exploded" in error["message"], error


def test_feed_raising_mid_stream_is_an_error_event_then_done(client, monkeypatch):
    c, _ = client
    monkeypatch.setattr(Exploding, "where", "feed")
    with c.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as resp:
        assert resp.status_code == 200
        events = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    error = json.loads(events[-2])["error"]
    assert "Exploding" in error["message"] and "feed exploded" in error["message"], error


@pytest.mark.parametrize(
    ("where", "stream", "says"),
    [
        ("parse-returns-str", False, "parse() returned str, not ReasoningResult"),
        ("feed-returns-str", True, "feed() returned str, not ReasoningDelta"),
        ("finish-returns-none", True, "finish() returned NoneType, not ReasoningDelta"),
    ],
)
def test_a_parser_returning_the_wrong_type_is_named_as_a_raising_one_is(
    client, monkeypatch, where, stream, says
):
    """A parser returning a str (found by a probe writing one) was a 500 "internal error:
    AttributeError: 'str' object has no attribute 'reasoning'", naming no parser."""
    c, _ = client
    monkeypatch.setattr(Exploding, "where", where)
    if not stream:
        resp = c.post("/v1/chat/completions", json=BODY)
        assert resp.status_code == 500, resp.text
        error = resp.json()["error"]
    else:
        with c.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as resp:
            events = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events
        error = json.loads(events[-2])["error"]
    assert "Exploding" in error["message"] and f"TypeError: {says}" in error["message"], error


@pytest.mark.parametrize("kind", ["reasoning", "tool call"])
def test_the_500_names_the_selection_the_command_line_made(monkeypatch, kind):
    """The 500 named the class and its distribution, not what the user selected: an operator reading
    it had to map ``minisgl_plugin_qwen3_reasoning.parser.Qwen3ReasoningParser`` back to
    ``--reasoning-parser qwen3``. Now it names the selection and plugin as engine errors do."""
    import argparse

    from minisgl_core.plugins import Plugins
    from minisgl_core.server.cli import _api_options

    args = argparse.Namespace(
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
        allowed_origins="",
        responses_store_size=1024,
        trust_request_chat_template=False,
    )
    options = _api_options(args, Plugins.load(), None)
    cls = options.reasoning_parser if kind == "reasoning" else options.tool_parser
    label = options.parser_labels[cls]
    flag_name = "qwen3" if kind == "reasoning" else "hermes"
    assert label.startswith(f"{kind} parser '{flag_name}' (plugin "), label

    def explode(self, *args):
        raise RuntimeError("parse exploded")

    monkeypatch.setattr(cls, "parse", explode)
    c, _ = make_client(monkeypatch, options)
    body = {**BODY, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    resp = c.post("/v1/chat/completions", json=body)
    assert resp.status_code == 500, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith(f"the {label}, class {cls.__module__}.{cls.__qualname__}, failed: "), message
    assert message.endswith("RuntimeError: parse exploded"), message
