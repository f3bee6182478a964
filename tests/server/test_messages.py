"""The wire format between the server's processes, and the detokenizer worker's bookkeeping."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from minisgl_core import messages as m
from minisgl_core.processes import text_workers
from minisgl_core.processes.text_workers import Admitter, Detokenizer, RequestRejected
from minisgl_core.sampling import SamplingParams, choice_seed
from minisgl_core.tokenizer.detokenize import final_text
from minisgl_core.tokenizer.load import load_tokenizer

SAMPLES = [
    m.Limits(2048, 65536, 1024),
    m.TokenizeRequest(
        [3, 4], None, [{"role": "user", "content": "hé"}], None, SamplingParams(max_tokens=None), "max_tokens"
    ),
    m.TokenizeRequest(
        [5],
        None,
        [{"role": "user", "content": "hi"}],
        None,
        SamplingParams(max_tokens=4),
        grammar_field="tool_choice",
        grammar_parts=[["tools.0.function.parameters", "the parameters of function 'f'", "{}"]],
    ),
    m.Admission(3, 17, 100, error="too long", param="messages"),
    m.EngineRequest(
        5,
        [1, 2, 3],
        SamplingParams(
            temperature=0.0, stop="x", logit_bias={"7": -1.5}, grammar={"kind": "regex", "value": "a+"}
        ),
    ),
    m.AbortRequest(5),
    m.Shutdown(),
    m.StepOutputs(
        rids=[5, 6],
        token_ids=[10, -1],
        finish_reasons=[None, "abort"],
        matched_stops=[None, None],
        logprobs=[[10, -0.5, [[10, -0.5]], 1], None],
        errors=[None, None],
        stats={"running": 1},
        prompt_logprobs=[[[3, None, [], None], [10, -1.5, [[10, -1.5]], 1]], None],
        streams=[[7, ["\n\n"], True]],
        cached_tokens=[[5, 32]],
    ),
    m.DetokOutputs([5], [10], ["hi"], ["stop"], ["</s>"], [None], [None], None, [None], [[5, 32]]),
    m.ProcessReady("scheduler", 1, {"max_context_len": 2048}),
    m.ProcessFailed("tokenizer", 0, "Traceback ...\nValueError: x"),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=[type(s).__name__ for s in SAMPLES])
def test_every_message_round_trips(msg):
    data = m.encode(msg)
    assert isinstance(data, bytes)
    assert m.decode(data) == msg
    # plain msgpack, no pickle: any msgpack reader sees a tag and the fields
    tag, *fields = msgpack.unpackb(data, strict_map_key=False)  # logit_bias maps token ids
    assert tag == msg.tag and len(fields) == len(dataclasses.fields(msg))


def test_unknown_tag_is_an_error():
    with pytest.raises(ValueError, match="unknown message tag"):
        m.decode(msgpack.packb([999]))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


def test_detokenizer_opens_a_stream_with_the_step_that_brings_it(tokenizer):
    """The scheduler sends a request's stop strings with the step that received it, no later than
    its first token: the detokenizer needs no message from the tokenizer, and no holding back."""
    ids = tokenizer.encode("hello wide world", add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    received = m.StepOutputs()
    received.open_stream(7, ["wide"], True)
    assert detok.convert(received).rids == [] and set(detok.streams) == {7}
    first = m.StepOutputs(cached_tokens=[[7, 2]])
    first.add(7, ids[0], None)
    converted = detok.convert(first)
    assert converted.cached_tokens == [[7, 2]]  # passed on to the API server with the first token
    text = converted.texts[0]
    for i, token in enumerate(ids[1:], 1):
        step = m.StepOutputs()
        step.add(7, token, "length" if i == len(ids) - 1 else None)
        text += detok.convert(step).texts[0]
    assert text == final_text(tokenizer, ids, None)
    assert detok.streams == {}  # forgotten once finished
    # a request received and given its first token in one step
    both = m.StepOutputs()
    both.open_stream(8, [], True)
    both.add(8, ids[0], "length")
    assert detok.convert(both).texts == [final_text(tokenizer, ids[:1], None)]


@pytest.mark.parametrize("keep", [False, True])
def test_detokenizer_streams_up_to_the_matched_stop_string(tokenizer, keep):
    """Token by token, a request that ends on a stop string: the streamed text is the text before
    it, or with include_stop_str_in_output (``keep``) up to its end, as ``final_text`` says."""
    ids = tokenizer.encode("hello wide world and more", add_special_tokens=False)
    whole = tokenizer.decode(ids)
    stop = "world"
    last = next(i for i in range(len(ids)) if stop in tokenizer.decode(ids[: i + 1]))
    detok = Detokenizer(tokenizer)
    text = ""
    for i, token in enumerate(ids[: last + 1]):
        step = m.StepOutputs()
        if i == 0:
            step.open_stream(9, [stop], True, keep)
        step.add(9, token, "stop" if i == last else None, stop if i == last else None)
        text += detok.convert(step).texts[0]
    expected = whole[: whole.find(stop) + (len(stop) if keep else 0)]
    assert text == expected == final_text(tokenizer, ids[: last + 1], stop, keep_stop=keep)


def test_detokenizer_adds_token_text_to_logprobs(tokenizer):
    ids = tokenizer.encode("sea", add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    step = m.StepOutputs()
    step.open_stream(1, [], True)
    step.add(1, ids[0], "length", logprob=[ids[0], -0.25, [[ids[0], -0.25], [5, -3.0]], None],
             prompt_logprobs=[[ids[0], None, [], None], [5, -1.5, [[ids[0], -0.5]], 2]])  # fmt: skip
    out = detok.convert(step)
    token_text = tokenizer.decode([ids[0]])
    assert out.logprobs[0] == [
        token_text,
        -0.25,
        [[token_text, -0.25, ids[0]], [tokenizer.decode([5]), -3.0, 5]],
        ids[0],
        None,
    ]
    # a prompt token's entry carries its vocabulary rank through
    assert out.prompt_logprobs[0] == [
        [token_text, None, [], ids[0], None],
        [tokenizer.decode([5]), -1.5, [[token_text, -0.5, ids[0]]], 5, 2],
    ]


def test_admitter_fills_max_tokens_and_names_the_bad_field(tokenizer):
    admitter = Admitter(tokenizer, m.Limits(max_context_len=64, kv_capacity_tokens=48, vocab_size=1024))

    def admit(params, text="hello", field="max_tokens"):
        return admitter.admit(m.TokenizeRequest([0], text, None, None, SamplingParams(**params), field))

    ids, sampling = admit({"max_tokens": None})
    assert isinstance(sampling, SamplingParams) and sampling.max_tokens == 48 - len(ids)  # the smaller limit
    with pytest.raises(RequestRejected) as bad:
        admit({"max_tokens": 60}, field="max_completion_tokens")
    assert bad.value.param == "max_completion_tokens"
    with pytest.raises(RequestRejected) as bad:
        admit({"max_tokens": None}, text="word " * 100)
    assert bad.value.param == "prompt" and "no room" in str(bad.value)
    with pytest.raises(RequestRejected) as bad:
        admit({"max_tokens": 4, "stop_token_ids": [1024]})
    assert bad.value.param == "stop_token_ids"


def test_a_text_far_past_the_context_is_refused_from_its_head(tokenizer, monkeypatch):
    """The tokenizer worker tokenizes a long prompt's head first and refuses it when the head
    alone is twice the context: the rest is never tokenized (a 655,360-character prompt took it
    0.5 s, with every other request waiting). Chats too, and a text whose head is short of that
    is tokenized whole and judged exactly as before."""
    admitter = Admitter(tokenizer, m.Limits(max_context_len=64, kv_capacity_tokens=4096, vocab_size=1024))
    encoded: list[int] = []
    encode = tokenizer.encode
    monkeypatch.setattr(
        tokenizer, "encode", lambda text, **kw: encoded.append(len(text)) or encode(text, **kw)
    )
    head = text_workers.HEAD_CHARS_PER_TOKEN * 64

    def admit(text=None, messages=None):
        params = SamplingParams(max_tokens=4)
        return admitter.admit(m.TokenizeRequest([0], text, messages, None, params))

    for text, messages, field in [
        ("word " * 100_000, None, "prompt"),
        (None, [{"role": "user", "content": "word " * 100_000}], "messages"),
    ]:
        encoded.clear()
        with pytest.raises(RequestRejected) as refused:
            admit(text, messages)
        assert refused.value.param == field and refused.value.code == "context_length_exceeded"
        assert f"its first {head} characters alone" in str(refused.value)
        assert encoded == [head], encoded  # the head only
    # a head short of twice the context (here: a head of 2 characters a token): tokenized whole,
    # refused by its count as before
    monkeypatch.setattr(text_workers, "HEAD_CHARS_PER_TOKEN", 2)
    encoded.clear()
    with pytest.raises(RequestRejected) as refused:
        admit("word " * 1_000)
    assert "characters alone" not in str(refused.value) and encoded[-1] == 5_000, encoded
    ids, _ = admit("word " * 20)  # a prompt that fits: as ever
    assert len(ids) == len(encode("word " * 20))


def test_sampling_params_are_validated_once_on_their_way_to_the_scheduler(tokenizer, monkeypatch):
    """The API server builds the request's SamplingParams (the one check); the tokenizer decides
    max_tokens and fans it out to n choices, and the scheduler receives the same frozen object,
    none of them checking the fields again."""
    checks = []
    original = SamplingParams._validate

    def counted(self):
        checks.append(self)
        original(self)

    monkeypatch.setattr(SamplingParams, "_validate", counted)
    params = SamplingParams(max_tokens=None, seed=5, stop=["x"], logit_bias={"3": 1.0})
    assert len(checks) == 1
    received = m.decode(m.encode(m.TokenizeRequest([0, 1], "hello", None, None, params)))
    ids, admitted = Admitter(tokenizer, m.Limits(64, 48, 1024)).admit(received)
    engine_requests = [
        m.decode(m.encode(m.EngineRequest(rid, ids, admitted.for_choice(i))))
        for i, rid in enumerate(received.rids)
    ]
    assert len(checks) == 1
    first, second = (r.params for r in engine_requests)
    assert first == dataclasses.replace(params, max_tokens=48 - len(ids))
    assert second.seed == choice_seed(5, 1) and second.max_tokens == first.max_tokens
    assert first.stop == ("x",) and first.logit_bias == {3: 1.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.max_tokens = 1  # type: ignore[misc]


def test_a_chat_template_that_does_not_compile_is_named_as_the_servers(model_dir):
    """A model whose own chat template does not compile answered every chat request "could not
    tokenize the prompt: unexpected '}'", as if the request were at fault (found by a review)."""
    tokenizer = load_tokenizer(model_dir, chat_template="{% for m in messages %}{{ m.content }{% endfor %}")
    admitter = Admitter(tokenizer, m.Limits(max_context_len=64, kv_capacity_tokens=48, vocab_size=1024))
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestRejected) as bad:
        admitter.admit(m.TokenizeRequest([0], None, messages, None, SamplingParams(max_tokens=4)))
    assert bad.value.param == "messages"
    assert str(bad.value) == (
        "this server's chat template does not compile (line 1: unexpected '}'), so it cannot take chat "
        "requests; its operator must start it with --chat-template FILE"
    )


def test_tokenize_names_a_chat_template_that_does_not_compile_as_the_chat_route_does(
    start_server, model_dir, tmp_path
):
    """/tokenize said "could not tokenize: unexpected '}'" for the server's own broken template,
    blaming the request, after /v1/chat/completions had learnt to name the server's (a review's find)."""
    import json
    import shutil

    import httpx

    from .conftest import ENGINE_ARGS

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content }{% endfor %}"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    server = start_server(["--model", str(copy), *ENGINE_ARGS])
    messages = [{"role": "user", "content": "hi"}]
    chat = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60
    )
    tokenize = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, timeout=60)
    says = (
        "this server's chat template does not compile (line 1: unexpected '}'), so it cannot take chat "
        "requests; its operator must start it with --chat-template FILE"
    )
    for response in (chat, tokenize):
        assert response.status_code == 400
        assert response.json()["error"]["message"] == says and response.json()["error"]["param"] == "messages"
    # a plain prompt needs no template: still tokenized
    assert httpx.post(f"{server.url}/tokenize", json={"prompt": "hi"}, timeout=60).json()["count"] > 0


def test_tools_rendered_at_the_start_of_a_chat_cut_to_its_tail_are_seen(tokenizer):
    """With truncate_prompt_tokens the tokenizer worker checked that the template renders the
    tools on the tokens of the tails: a conversation longer than the context could hold, whose
    template writes the tools first, has the same tail with and without them, and was refused as
    "does not render tools". The whole texts are compared; a template that drops them is still
    refused, cut or not."""
    limits = m.Limits(max_context_len=64, kv_capacity_tokens=4096, vocab_size=1024)
    admitter = Admitter(tokenizer, limits)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "word " * 20_000}]
    first = "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    drops = "{% for m in messages %}{{ m.content }}{% endfor %}"

    def admit(template, keep):
        params = SamplingParams(max_tokens=4, truncate_prompt_tokens=keep)
        args = {"tools": tools, "chat_template": template}
        return admitter.admit(m.TokenizeRequest([0], None, messages, None, params, template_args=args))

    ids, _ = admit(first, 40)
    assert ids == tokenizer.encode("word " * 20_000, add_special_tokens=False)[-40:]
    for keep in (40, None):
        with pytest.raises(RequestRejected, match="does not render tools") as refused:
            admit(drops, keep)
        assert refused.value.param == "tools"
