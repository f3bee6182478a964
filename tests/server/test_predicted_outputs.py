"""OpenAI's Predicted Outputs (``prediction`` on /v1/chat/completions) through the official client:
on a server with speculative decoding the prediction's tokens are drafts, the greedy answer is the
one without it, and ``usage.completion_tokens_details`` says how much of the prediction the answer
used; a server without speculative decoding refuses the field, naming the flag that serves it.

The real default model (SmolLM2) answers in text that tokenizes back into the tokens it wrote, so
a prediction that is its answer is its answer's tokens."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion

from .conftest import API_KEY, metrics

# fmt: off
REAL_ARGS = ["--device", "cpu", "--attn", "torch", "--num-kv-tokens", "8192", "--max-running-requests", "16",
             "--max-context-len", "2048", "--speculative-algorithm", "ngram",
             "--speculative-num-draft-tokens", "4"]
# fmt: on
MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "Write a short story about a cat named Tom who finds a key."}]
MAX_TOKENS = 40
UNRELATED = " ".join(str(i % 10) for i in range(40))


@pytest.fixture(scope="module")
def spec_server(start_server, default_model_dir):
    # default_model_dir first: the file is in the cache, so the server does not fetch it again
    return start_server(REAL_ARGS)


@pytest.fixture(scope="module")
def spec_client(spec_server):
    return openai.OpenAI(base_url=f"{spec_server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def ask(client, prediction=None, **extra) -> ChatCompletion:
    fields = {} if prediction is None else {"prediction": prediction}
    return client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
        **fields,
        **extra,
    )


@pytest.fixture(scope="module")
def reference(spec_client) -> ChatCompletion:
    """The greedy answer without a prediction (speculative decoding is lossless:
    tests/test_speculative.py holds it to the answer without drafts)."""
    out = ask(spec_client)
    assert out.usage.completion_tokens == MAX_TOKENS
    assert out.usage.completion_tokens_details is None  # (no prediction: nothing to report)
    return out


def token_count(server, text: str) -> int:
    answer = httpx.post(
        f"{server.url}/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=60
    )
    return len(answer.json()["tokens"])


def content(text: str) -> dict:
    return {"type": "content", "content": text}


def test_the_answer_with_a_prediction_is_the_answer_without(spec_client, spec_server, reference):
    text = reference.choices[0].message.content
    words = text.split(" ")
    partly = " ".join(words[: len(words) // 2] + ["suddenly", "a", "dragon"] + words[len(words) // 2 + 3 :])
    halves = [{"type": "text", "text": text[:20]}, {"type": "text", "text": text[20:]}]
    for prediction in (
        content(text),
        content(partly),
        content(UNRELATED),
        content(""),
        {"type": "content", "content": halves},
    ):
        out = ask(spec_client, prediction)
        assert out.choices[0].message.content == text, prediction
        assert out.choices[0].token_ids == reference.choices[0].token_ids  # type: ignore[attr-defined]
        details = out.usage.completion_tokens_details
        predicted = (
            "".join(p["text"] for p in halves)
            if isinstance(prediction["content"], list)
            else prediction["content"]
        )
        # every prediction token is either in the answer or not
        assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == token_count(
            spec_server, predicted
        )
        assert out.usage.completion_tokens == MAX_TOKENS  # (the answer's tokens, as without)


def decode_forwards(server, before: dict[str, float], completion_tokens: int) -> int:
    """The model's forwards after the prefill for one request run alone: one a token, less the
    drafts verification accepted (read from /metrics once the engine's stats have come)."""
    name = "minisgl_spec_decode_num_accepted_tokens_total"
    time.sleep(1.5)  # (the engine's stats come with its outputs and its idle reports)
    deadline = time.monotonic() + 10
    while (after := metrics(server.url))[name] == before.get(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    return completion_tokens - 1 - int(after[name] - before.get(name, 0))


def test_an_exact_prediction_is_accepted_and_takes_fewer_steps(spec_client, spec_server, reference):
    text = reference.choices[0].message.content
    predicted_tokens = token_count(spec_server, text)
    assert predicted_tokens == MAX_TOKENS  # (the answer's text tokenizes back into its tokens)
    before = metrics(spec_server.url)
    out = ask(spec_client, content(text))
    with_prediction = decode_forwards(spec_server, before, out.usage.completion_tokens)
    before = metrics(spec_server.url)
    ask(spec_client)
    without = decode_forwards(spec_server, before, MAX_TOKENS)
    details = out.usage.completion_tokens_details
    # every token but the prefill's (no draft precedes it) is one of the prediction's
    assert details.accepted_prediction_tokens == MAX_TOKENS - 1
    assert details.rejected_prediction_tokens == 1
    # four drafts and the target's token a forward
    assert with_prediction == -(-(MAX_TOKENS - 1) // 5) < without


def test_an_unrelated_prediction_is_rejected_whole(spec_client, spec_server, reference):
    out = ask(spec_client, content(UNRELATED))
    assert out.choices[0].message.content == reference.choices[0].message.content
    details = out.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == 0
    assert details.rejected_prediction_tokens == token_count(spec_server, UNRELATED) > 0


def test_usage_validates_as_the_clients_types_and_streams_it(spec_server, reference):
    text = reference.choices[0].message.content
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "prediction": content(text),
    }
    raw = httpx.post(f"{spec_server.url}/v1/chat/completions", json=body, timeout=300).json()
    usage = CompletionUsage.model_validate(raw["usage"])
    assert set(raw["usage"]["completion_tokens_details"]) == {
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    }
    assert usage.completion_tokens_details.accepted_prediction_tokens == MAX_TOKENS - 1
    # streamed: the usage chunk carries the same figures
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = []
    with httpx.stream("POST", f"{spec_server.url}/v1/chat/completions", json=streamed, timeout=300) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: ") :]))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text
    assert CompletionUsage.model_validate(chunks[-1]["usage"]) == usage


def test_each_choice_has_the_prediction(spec_client, spec_server, reference):
    text = reference.choices[0].message.content
    out = ask(spec_client, content(text), n=2)
    assert [c.message.content for c in out.choices] == [text, text]
    details = out.usage.completion_tokens_details
    # (the two choices reach the scheduler one after the other: where the second's prefill shares
    # a step with the first's decode, that step takes no drafts and its token is not counted)
    assert 2 * (MAX_TOKENS - 1) - 2 <= details.accepted_prediction_tokens <= 2 * (MAX_TOKENS - 1)
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == 2 * MAX_TOKENS


@pytest.mark.parametrize(
    ("prediction", "param"),
    [
        ({"type": "text", "content": "x"}, "prediction.type"),
        ({"type": "content"}, "prediction.content"),
        ({"type": "content", "content": 5}, "prediction.content"),
        ({"type": "content", "content": [{"type": "image_url", "text": "x"}]}, "prediction.content"),
        ({"type": "content", "content": "x", "extra": 1}, "prediction.extra"),
        ("x", "prediction"),
    ],
)
def test_a_malformed_prediction_is_a_400_naming_it(spec_client, prediction, param):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(spec_client, prediction)
    assert refused.value.body["param"].startswith(param), refused.value.body


def test_completions_take_no_prediction(spec_client):
    with pytest.raises(openai.BadRequestError) as refused:
        spec_client.completions.create(
            model=MODEL, prompt="Hi", max_tokens=2, extra_body={"prediction": content("Hi")}
        )
    assert refused.value.body["param"] == "prediction"


def test_a_server_without_speculative_decoding_refuses_a_prediction(server, model_name):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name, messages=MESSAGES, max_tokens=2, prediction=content("Once upon a time")
        )
    error = refused.value.body
    assert error["param"] == "prediction"
    assert error["code"] == "unsupported_field"
    assert "--speculative-algorithm ngram" in error["message"]
