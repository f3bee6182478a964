"""vLLM's ``stop_reason`` on each choice: the stop string or the stop token id that ended it, null
for ``length`` (and for an eos)."""

from __future__ import annotations

import pytest

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def stop_reason(choice):
    return choice.model_extra["stop_reason"]


def _complete(client, model_name, stream: bool, **kw):
    """(text, finish_reason, stop_reason, every chunk's stop_reason) of one greedy completion."""
    args = dict(model=model_name, prompt=PROMPT, max_tokens=12, temperature=0, **kw)
    if not stream:
        choice = client.completions.create(**args).choices[0]
        return choice.text, choice.finish_reason, stop_reason(choice), [stop_reason(choice)]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **args) if c.choices]
    text = "".join(c.text for c in chunks)
    return text, chunks[-1].finish_reason, stop_reason(chunks[-1]), [stop_reason(c) for c in chunks]


def _chat(client, model_name, stream: bool, **kw):
    args = dict(model=model_name, messages=MESSAGES, max_tokens=12, temperature=0, **kw)
    if not stream:
        choice = client.chat.completions.create(**args).choices[0]
        return choice.message.content, choice.finish_reason, stop_reason(choice), [stop_reason(choice)]
    chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **args) if c.choices]
    text = "".join(c.delta.content or "" for c in chunks)
    return text, chunks[-1].finish_reason, stop_reason(chunks[-1]), [stop_reason(c) for c in chunks]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("call", [_complete, _chat])
def test_stop_reason_names_what_ended_the_choice(client, model_name, call, stream):
    text, reason, stop, every = call(client, model_name, stream)
    assert (reason, stop) == ("length", None)
    assert all(s is None for s in every)
    assert len(text) > 4, text

    # a stop string: the text up to it, and the string as stop_reason (on the last chunk only)
    word = text[2:4]
    cut, reason, stop, every = call(client, model_name, stream, stop=[word, "never-in-the-text"])
    assert (cut, reason, stop) == (text[: text.index(word)], "stop", word)
    assert all(s is None for s in every[:-1])

    # a stop token id: the id itself, an int
    ids = _token_ids(client, model_name, call)
    token = ids[3]
    _, reason, stop, every = call(client, model_name, stream, extra_body={"stop_token_ids": [token]})
    assert (reason, stop) == ("stop", token)
    assert isinstance(stop, int)
    assert all(s is None for s in every[:-1])


def _token_ids(client, model_name, call):
    """The greedy output's token ids (vLLM's return_token_ids)."""
    if call is _complete:
        resp = client.completions.create(
            model=model_name,
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
    else:
        resp = client.chat.completions.create(
            model=model_name, messages=MESSAGES, max_tokens=12, temperature=0,
            extra_body={"return_token_ids": True},
        )  # fmt: skip
    return resp.choices[0].model_extra["token_ids"]


def test_eos_has_no_stop_reason(client, model_name):
    """An eos (here the grammar's end, which ends on one) is finish_reason stop, stop_reason null."""
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=20, temperature=0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )  # fmt: skip
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert stop_reason(choice) is None
