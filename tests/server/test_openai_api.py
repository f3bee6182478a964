"""The official openai client against a live server, checked against the offline LLM."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from minisgl_core.sampling import SamplingParams
from minisgl_core.tokenizer.load import apply_chat_template

from .conftest import API_KEY

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the sea."},
]
PROMPT = "The quick brown fox jumps over"


def greedy(llm, prompt, max_tokens: int, **kw):
    return llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw))[0]


def test_models_lists_the_served_model(client, model_name):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]


def test_chat_non_stream_matches_offline(client, llm, model_name):
    resp = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=8, temperature=0)
    ids = apply_chat_template(llm.tokenizer, MESSAGES)
    ref = greedy(llm, ids, 8)
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ref.text
    assert choice.finish_reason == ref.finish_reason == "length"
    assert resp.usage.prompt_tokens == len(ids)
    assert resp.usage.completion_tokens == 8
    assert resp.usage.total_tokens == len(ids) + 8
    assert resp.object == "chat.completion" and resp.id.startswith("chatcmpl-")


def test_continue_final_message_continues_the_assistant_turn(client, server, auth, llm, model_name):
    """vLLM's continue_final_message: the prompt is the conversation rendered up to the last
    (assistant) message's text, with no end of turn after it, as transformers renders it; the reply
    is what greedy decoding of exactly that prompt gives."""
    messages = [*MESSAGES, {"role": "assistant", "content": "The sea is"}]
    want = llm.tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=False, continue_final_message=True
    )
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    closed = apply_chat_template(llm.tokenizer, messages, add_generation_prompt=False)
    assert want != closed and len(want) < len(closed)  # the turn is left open
    extra = {"add_generation_prompt": False, "continue_final_message": True}
    resp = client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=6, temperature=0, extra_body=extra
    )
    ref = greedy(llm, want, 6)
    assert resp.usage.prompt_tokens == len(want)
    assert resp.choices[0].message.content == ref.text
    tokens = httpx.post(f"{server.url}/tokenize", json={"messages": messages, **extra}, headers=auth).json()[
        "tokens"
    ]
    assert tokens == want
    # without the flags the reply starts a new assistant turn after the closed one
    plain = client.chat.completions.create(model=model_name, messages=messages, max_tokens=1)
    assert plain.usage.prompt_tokens > len(closed)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            {"continue_final_message": True},
            "add_generation_prompt",
            "continue_final_message needs add_generation_prompt turned off",
        ),
        (
            {"continue_final_message": True, "add_generation_prompt": False, "messages": MESSAGES},
            "messages",
            "continue_final_message needs the last message to be an assistant one, got 'user'",
        ),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", "request's"),
        ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs", "set by the server"),
    ],
)
def test_chat_template_controls_are_checked(server, auth, model_name, route, body, param, words):
    # the chat route and /tokenize check them alike (/tokenize said "could not tokenize", blaming
    # messages for add_generation_prompt)
    messages = [*MESSAGES, {"role": "assistant", "content": "The sea is"}]
    resp = httpx.post(
        f"{server.url}{route}",
        json={"model": model_name, "messages": messages, **body},
        headers=auth,
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert words in error["message"] and error["param"] == param, error


def test_chat_stream_with_usage(client, llm, model_name):
    stream = client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        max_completion_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    ids = apply_chat_template(llm.tokenizer, MESSAGES)
    ref = greedy(llm, ids, 8)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == len(ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_and_not(client, llm, model_name):
    ref = greedy(llm, PROMPT, 10)
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=10, temperature=0)
    assert resp.choices[0].text == ref.text and resp.choices[0].finish_reason == "length"
    assert resp.usage.prompt_tokens == len(ref.prompt_token_ids) and resp.usage.completion_tokens == 10
    stream = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completions_batch_of_prompts_and_token_ids(client, llm, model_name):
    prompts = ["Once upon a time", "In a hole in the ground"]
    resp = client.completions.create(model=model_name, prompt=prompts, max_tokens=5, temperature=0)
    refs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5))
    assert [c.index for c in resp.choices] == [0, 1]
    assert [c.text for c in resp.choices] == [r.text for r in refs]
    by_ids = client.completions.create(
        model=model_name, prompt=refs[1].prompt_token_ids, max_tokens=5, temperature=0
    )
    assert by_ids.choices[0].text == refs[1].text


def test_completions_default_to_16_tokens_capped_by_the_context(client, llm, model_name):
    """OpenAI's legacy default (vLLM's too): 16 tokens when max_tokens is not given (it ran to the
    end of the context: minutes on a real model for a client that left it out); a prompt near the
    end of the context gets what is left."""
    short = client.completions.create(
        model=model_name, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True}
    )
    assert short.usage.completion_tokens == 16 and short.choices[0].finish_reason == "length"
    prompt = [100 + i % 900 for i in range(2036)]  # 2036 tokens of a 2048-token context
    resp = client.completions.create(model=model_name, prompt=prompt, temperature=0)
    assert resp.usage.completion_tokens == 12 and resp.choices[0].finish_reason == "length"


def test_n_fans_out(client, model_name):
    resp = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=6, n=2, temperature=1.0, seed=7
    )
    assert sorted(c.index for c in resp.choices) == [0, 1]
    assert all(c.finish_reason == "length" for c in resp.choices)
    assert resp.usage.completion_tokens == 12
    # same seed, same choices
    again = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=6, n=2, temperature=1.0, seed=7
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in resp.choices]
    stream = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, n=2, stream=True)
    finished = [c.choices[0].index for c in stream if c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1]


def _stop_string(text: str) -> str:
    """A 3-letter piece from the middle of the text whose first occurrence is there."""
    for k in range(len(text) // 3, len(text) - 3):
        piece = text[k : k + 3]
        if piece.isascii() and piece.isalpha() and text.find(piece) == k:
            return piece
    pytest.skip("no usable stop string in the reference output")


def test_stop_strings(client, llm, model_name):
    full = greedy(llm, PROMPT, 24).text
    stop = _stop_string(full)
    expected = full[: full.find(stop)]
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop]
    )
    assert resp.choices[0].text == expected
    assert resp.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_string_kept_with_include_stop_str_in_output(client, server, auth, llm, model_name):
    """vLLM's include_stop_str_in_output (SGLang's no_stop_trim on /generate): the text runs up to
    the end of the stop string, streamed or not; the offline LLM does the same."""
    full = greedy(llm, PROMPT, 24).text
    stop = _stop_string(full)
    expected = full[: full.find(stop) + len(stop)]
    keep = {"include_stop_str_in_output": True}
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop], extra_body=keep
    )
    assert resp.choices[0].text == expected and resp.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True, extra_body=keep
    )
    assert "".join(c.choices[0].text for c in stream) == expected
    generated = httpx.post(
        f"{server.url}/generate",
        headers=auth,
        json={
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "stop": stop, "no_stop_trim": True},
        },
    ).json()
    assert generated["text"] == expected
    assert greedy(llm, PROMPT, 24, stop=[stop], include_stop_str_in_output=True).text == expected
    assert greedy(llm, PROMPT, 24, stop=[stop]).text == full[: full.find(stop)]


def test_a_stop_token_kept_with_include_stop_str_in_output(client, llm, model_name):
    """vLLM keeps the text of the stop token id that ended the request with
    include_stop_str_in_output; it was dropped whatever the flag said. Streamed or not, and offline."""
    full = greedy(llm, PROMPT, 12)
    token = full.token_ids[5]
    at = full.token_ids.index(token)
    with_stop = llm.tokenizer.decode(full.token_ids[: at + 1])
    keep = {"include_stop_str_in_output": True, "stop_token_ids": [token]}
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=keep
    )
    assert resp.choices[0].text == with_stop and resp.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=12, temperature=0, stream=True, extra_body=keep
    )
    assert "".join(c.choices[0].text for c in stream) == with_stop
    assert greedy(llm, PROMPT, 12, stop_token_ids=[token], include_stop_str_in_output=True).text == with_stop
    dropped = greedy(llm, PROMPT, 12, stop_token_ids=[token]).text
    assert dropped == llm.tokenizer.decode(full.token_ids[:at]) and dropped != with_stop


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(client, llm, model_name):
    """vLLM's truncate_prompt_tokens: the prompt's last k tokens only, as the usage says and as
    greedy decoding of exactly those gives; offline too."""
    ids = llm.encode(PROMPT)
    assert len(ids) > 3
    ref = greedy(llm, ids[-3:], 5)
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=5, temperature=0, extra_body={"truncate_prompt_tokens": 3}
    )
    assert resp.usage.prompt_tokens == 3 and resp.choices[0].text == ref.text
    whole = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=1, extra_body={"truncate_prompt_tokens": 10**6}
    )
    assert whole.usage.prompt_tokens == len(ids)  # a longer limit keeps it all
    offline = greedy(llm, PROMPT, 5, truncate_prompt_tokens=3)
    assert offline.prompt_token_ids == ids[-3:] and offline.token_ids == ref.token_ids
    chat = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=1, extra_body={"truncate_prompt_tokens": 4}
    )
    assert chat.usage.prompt_tokens == 4


def test_truncate_prompt_tokens_takes_a_text_longer_than_the_context_can_hold(client, llm, model_name):
    """A text too long for the context by its characters was a 400 even with truncate_prompt_tokens
    (which keeps its last k tokens, as vLLM takes it): it is tokenized from its tail, and the
    prompt is the whole text's last k tokens."""
    words = [f"w{i % 97}x{i % 13} " for i in range(200_000)]  # ~1.4 M characters, no repeating tail
    text = "".join(words)
    ids = llm.encode(text)
    ref = greedy(llm, ids[-40:], 4)
    resp = client.completions.create(
        model=model_name, prompt=text, max_tokens=4, temperature=0, extra_body={"truncate_prompt_tokens": 40}
    )
    assert resp.usage.prompt_tokens == 40 and resp.choices[0].text == ref.text
    # without it, still the 400 before tokenizing
    with pytest.raises(openai.BadRequestError, match="characters"):
        client.completions.create(model=model_name, prompt=text, max_tokens=4)


def test_truncate_prompt_tokens_takes_a_chat_longer_than_the_context_can_hold(client, llm, model_name):
    """A chat too long for the context by its characters was a 400 even with truncate_prompt_tokens,
    while a text prompt was cut: the tokenizer worker cuts the rendered chat the same way, and the
    prompt is the last k tokens of the whole conversation as the template renders it."""
    from minisgl_core.tokenizer.load import apply_chat_template

    content = "".join(f"w{i % 89}y{i % 17} " for i in range(200_000))  # ~1.4 M characters
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    ids = apply_chat_template(llm.tokenizer, messages)
    ref = greedy(llm, ids[-40:], 4)
    resp = client.chat.completions.create(
        model=model_name,
        messages=messages,
        max_tokens=4,
        temperature=0,
        extra_body={"truncate_prompt_tokens": 40},
    )
    assert resp.usage.prompt_tokens == 40 and resp.choices[0].message.content == ref.text
    with pytest.raises(openai.BadRequestError, match="characters"):  # without it, the 400 before tokenizing
        client.chat.completions.create(model=model_name, messages=messages, max_tokens=4)
    short = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=1, extra_body={"truncate_prompt_tokens": 10**6}
    )
    assert short.usage.prompt_tokens == len(apply_chat_template(llm.tokenizer, MESSAGES))


def test_truncate_prompt_tokens_minus_one_leaves_room_for_the_output(client, llm, model_name):
    """-1 kept the whole context's worth of the prompt, so no output token fit: max_tokens 5 was a
    400 and an unset one 'leaves no room'. It keeps what fits beside max_tokens (or beside the
    default an unset one takes: 16 on completions); with neither, a 400 naming max_tokens."""
    text = "".join(f"w{i % 97}x{i % 13} " for i in range(3000))
    ids = llm.encode(text)
    context = 2048  # the test server's --max-context-len
    assert len(ids) > context
    minus_one = {"truncate_prompt_tokens": -1}
    resp = client.completions.create(
        model=model_name,
        prompt=text,
        max_tokens=5,
        temperature=0,
        extra_body={**minus_one, "ignore_eos": True},
    )
    assert resp.usage.prompt_tokens == context - 5 and resp.usage.completion_tokens == 5
    assert resp.choices[0].text == greedy(llm, ids[-(context - 5) :], 5, ignore_eos=True).text
    unset = client.completions.create(model=model_name, prompt=text, temperature=0, extra_body=minus_one)
    assert unset.usage.prompt_tokens == context - 16
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": text}], extra_body=minus_one
        )
    assert err.value.body["param"] == "max_tokens" and "set max_tokens" in err.value.body["message"]
    assert err.value.body["code"] == "context_length_exceeded"
    chat = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": text}], max_tokens=3, extra_body=minus_one
    )
    assert chat.usage.prompt_tokens == context - 3
    offline = greedy(llm, text, 5, truncate_prompt_tokens=-1, ignore_eos=True)
    assert offline.prompt_token_ids == ids[-(context - 5) :] and len(offline.token_ids) == 5
    short = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, extra_body=minus_one)
    assert short.usage.prompt_tokens == len(llm.encode(PROMPT))  # a prompt that fits is kept whole


@pytest.mark.parametrize("as_ids", [False, True])
def test_echo_of_a_truncated_prompt_is_what_was_kept(client, llm, model_name, as_ids):
    """echo with truncate_prompt_tokens sent the whole prompt back, while the usage and the
    prompt's logprobs counted the kept tokens only (their offsets pointed into the wrong text)."""
    ids = llm.encode(PROMPT)
    kept = llm.tokenizer.decode(ids[-3:])
    resp = client.completions.create(
        model=model_name, prompt=ids if as_ids else PROMPT, max_tokens=2, temperature=0, echo=True,
        logprobs=0, extra_body={"truncate_prompt_tokens": 3},
    )  # fmt: skip
    text, logprobs = resp.choices[0].text, resp.choices[0].logprobs
    assert resp.usage.prompt_tokens == 3 and text.startswith(kept) and not text.startswith(PROMPT)
    offsets = [len("".join(logprobs.tokens[:i])) for i in range(3)]  # into the text sent back
    assert "".join(logprobs.tokens[:3]) == kept and logprobs.text_offset[:3] == offsets
    streamed = client.completions.create(
        model=model_name, prompt=ids if as_ids else PROMPT, max_tokens=2, temperature=0, echo=True,
        stream=True, extra_body={"truncate_prompt_tokens": 3},
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text


def test_allowed_token_ids_and_bad_words_through_the_server_match_offline(client, llm, model_name):
    """vLLM's fields as the openai client sends them (extra_body): the server's output is the
    offline LLM's, on chat and completions (bad words tokenized by the tokenizer worker as the
    offline engine tokenizes them)."""
    from minisgl_core.request_limits import bad_words_token_ids

    base = greedy(llm, PROMPT, 16, ignore_eos=True)
    allowed = sorted(set(base.token_ids[1:]) | {5, 77})
    ref = greedy(llm, PROMPT, 16, ignore_eos=True, allowed_token_ids=allowed)
    assert set(ref.token_ids) <= set(allowed) and ref.token_ids != base.token_ids
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=16, temperature=0,
        extra_body={"allowed_token_ids": allowed, "ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    assert resp.choices[0].text == ref.text
    assert resp.choices[0].model_extra["token_ids"] == ref.token_ids

    def forms(word: str) -> tuple[tuple[int, ...], ...]:
        return bad_words_token_ids((word,), lambda t: llm.tokenizer.encode(t, add_special_tokens=False))

    # a word of the free run, one token long: it no longer appears
    word = next(w for t in base.token_ids if (w := llm.tokenizer.decode([t])).strip() and (t,) in forms(w))
    ref = greedy(llm, PROMPT, 16, ignore_eos=True, bad_words=[word])
    assert ref.token_ids != base.token_ids and not {f[0] for f in forms(word) if len(f) == 1} & set(
        ref.token_ids
    )
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=16, temperature=0,
        extra_body={"bad_words": [word], "ignore_eos": True},
    )  # fmt: skip
    assert resp.choices[0].text == ref.text
    ids = apply_chat_template(llm.tokenizer, MESSAGES)
    chat_ref = greedy(llm, ids, 8, bad_words=[word], allowed_token_ids=allowed)
    chat = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=8, temperature=0,
        extra_body={"bad_words": [word], "allowed_token_ids": allowed},
    )  # fmt: skip
    assert chat.choices[0].message.content == chat_ref.text


def test_min_tokens_through_the_server_matches_offline(client, llm, model_name):
    """vLLM's min_tokens: stop strings in the first tokens do not count; the server's text (whole
    and streamed, through the detokenizer worker) and finish reason equal the offline LLM's."""
    full = greedy(llm, PROMPT, 24).text
    pairs = [full[i : i + 2] for i in range(len(full) - 1)]
    stop = next((p for p in pairs if p.isprintable() and p.strip() and full.count(p) >= 2), None)
    if stop is None:
        pytest.skip(f"no repeated two-character piece in {full!r}")
    for min_tokens in (3, 12):
        ref = greedy(llm, PROMPT, 24, stop=[stop], min_tokens=min_tokens)
        body = {"min_tokens": min_tokens}
        resp = client.completions.create(
            model=model_name, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop], extra_body=body
        )
        assert resp.choices[0].text == ref.text and resp.choices[0].finish_reason == ref.finish_reason
        assert resp.usage.completion_tokens == len(ref.token_ids) >= min_tokens
        stream = client.completions.create(
            model=model_name,
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stop=[stop],
            stream=True,
            extra_body=body,
        )
        assert "".join(c.choices[0].text for c in stream) == ref.text


def test_continuous_usage_stats_on_every_chunk(client, model_name):
    """vLLM's stream_options.continuous_usage_stats: each chunk carries its choice's usage so far
    (prompt tokens, completion tokens up to that chunk), the last one the whole request's."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.chat.completions.create(
            model=model_name, messages=MESSAGES, max_tokens=5, n=2, stream=True, stream_options=options,
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    *choice_chunks, last = chunks
    assert not last.choices and last.usage.completion_tokens == 10
    seen = {0: 0, 1: 0}
    for chunk in choice_chunks:
        usage, index = chunk.usage, chunk.choices[0].index
        assert usage.prompt_tokens == last.usage.prompt_tokens
        assert (
            usage.completion_tokens >= seen[index]
            and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        )
        seen[index] = usage.completion_tokens
    assert seen == {0: 5, 1: 5}
    # completions: each choice its own prompt's tokens
    prompts = ["a b", "one two three four five six"]
    stream = client.completions.create(
        model=model_name, prompt=prompts, max_tokens=3, stream=True, stream_options=options,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    lengths = {}
    for chunk in stream:
        if chunk.choices:
            lengths[chunk.choices[0].index] = chunk.usage.prompt_tokens
    one = client.completions.create(model=model_name, prompt=prompts[0], max_tokens=1).usage.prompt_tokens
    two = client.completions.create(model=model_name, prompt=prompts[1], max_tokens=1).usage.prompt_tokens
    assert lengths == {0: one, 1: two} and one != two


def test_stop_token_ids_finish_with_stop(client, llm, model_name):
    ref = greedy(llm, PROMPT, 8)
    stop_id = ref.token_ids[3]
    first = ref.token_ids.index(stop_id)
    resp = client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"stop_token_ids": [stop_id]}
    )
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == first + 1
    assert resp.choices[0].text == llm.tokenizer.decode(ref.token_ids[:first])


def test_chat_logprobs(client, llm, model_name):
    resp = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    ref = greedy(llm, apply_chat_template(llm.tokenizer, MESSAGES), 5, logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == 5
    for got, want in zip(content, ref.logprobs, strict=True):
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert len(got.top_logprobs) == 3
        assert got.top_logprobs[0].logprob == pytest.approx(got.logprob, abs=1e-5)  # greedy picks the best
        assert got.token == llm.tokenizer.decode([want.token_id], skip_special_tokens=False)
        if "\ufffd" not in got.token:
            assert got.bytes == list(got.token.encode())
    # a token that is part of a character has that part's bytes (not U+FFFD's): joined, they are
    # the tokens' text
    joined = bytes(b for got in content for b in got.bytes).decode("utf-8", "replace")
    assert joined == llm.tokenizer.decode([want.token_id for want in ref.logprobs], skip_special_tokens=False)
    stream = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, stream=True
    )
    streamed = [
        e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)


def test_completion_logprobs(client, model_name):
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(
        len(top) <= 2 and max(top.values()) == pytest.approx(v, abs=1e-5)
        for top, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )
    assert lp.text_offset[0] == 0 and "".join(lp.tokens).startswith(resp.choices[0].text[:1])


def _with_sampled(lp) -> list[tuple[dict, str, float]]:
    """Each position's top dict with its token and that token's logprob (the first echoed one has none)."""
    return [
        (top, t, v) for top, t, v in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs, strict=True) if top
    ]


@pytest.mark.parametrize("k", [0, 1])
def test_completion_top_logprobs_hold_the_sampled_token(client, model_name, k):
    """OpenAI's legacy completions (and vLLM) give each position's top dict the sampled token too,
    so it holds up to k+1 tokens: it held the k most likely only, {} for logprobs 0, and a token
    sampled outside them was missing from its own position's dict. Streamed, and echoed alike."""
    kwargs = dict(model=model_name, prompt="Random words:", max_tokens=6, temperature=1.5, seed=3, logprobs=k)
    lp = client.completions.create(**kwargs).choices[0].logprobs
    entries = _with_sampled(lp)
    assert len(entries) == 6
    for top, token, logprob in entries:
        assert top[token] == pytest.approx(logprob, abs=1e-6) and len(top) <= k + 1, (top, token)
        if k == 0:
            assert top == {token: logprob}
    # (at this temperature a token outside the most likely one is sampled: the dict holds both)
    assert k == 0 or any(len(top) == 2 for top, _, _ in entries)
    chunks = [c.choices[0].logprobs for c in client.completions.create(**kwargs, stream=True) if c.choices]
    streamed = [e for c in chunks if c for e in _with_sampled(c)]
    assert [(t, top) for top, t, _ in streamed] == [(t, top) for top, t, _ in entries]
    # echo: the prompt's tokens' dicts hold each prompt token (the first has none: null)
    echoed = client.completions.create(**{**kwargs, "max_tokens": 1}, echo=True).choices[0].logprobs
    assert echoed.top_logprobs[0] is None and len(_with_sampled(echoed)) == len(echoed.tokens) - 1
    for top, token, logprob in _with_sampled(echoed):
        assert top[token] == pytest.approx(logprob, abs=1e-6) and len(top) <= k + 1
    # named by id, the token is under its own name too
    named = client.completions.create(**kwargs, extra_body={"return_tokens_as_token_ids": True})
    assert all(top[token] == logprob for top, token, logprob in _with_sampled(named.choices[0].logprobs))


def test_tokens_named_by_id_keep_their_text_offsets(client, model_name):
    """return_tokens_as_token_ids renames the tokens, not the text: each ``text_offset`` is still
    where the token's own text starts (the offsets counted the ``token_id:N`` names instead, past
    the text's end), echoed and streamed alike."""
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=0, echo=True)
    named_ids = {"return_tokens_as_token_ids": True}
    plain = client.completions.create(**kwargs).choices[0]
    named = client.completions.create(**kwargs, extra_body=named_ids).choices[0]
    assert named.text == plain.text
    assert all(t.startswith("token_id:") for t in named.logprobs.tokens)
    assert named.logprobs.text_offset == plain.logprobs.text_offset
    # the offsets themselves: each token's text at its place in the text (a token that is part
    # of a character, named by its bytes, has none of its own, and the U+FFFD of a character it
    # leaves incomplete starts the next token's span)
    ends = plain.logprobs.text_offset[1:] + [len(plain.text)]
    spans = [plain.text[a:b] for a, b in zip(plain.logprobs.text_offset, ends)]
    partial = [t.startswith("bytes:") for t in plain.logprobs.tokens]
    whole = [i for i in range(len(spans)) if not partial[i] and not (i and partial[i - 1])]
    assert len(whole) >= 6 and [spans[i] for i in whole] == [plain.logprobs.tokens[i] for i in whole]
    streamed = [
        offset
        for chunk in client.completions.create(**kwargs, extra_body=named_ids, stream=True)
        if chunk.choices and chunk.choices[0].logprobs
        for offset in chunk.choices[0].logprobs.text_offset
    ]
    assert streamed == plain.logprobs.text_offset


def test_chat_top_logprobs_are_the_most_likely_only(client, model_name):
    """OpenAI's chat format differs: top_logprobs are the k most likely tokens, the sampled one
    only if it is among them."""
    content = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=6, temperature=1.5, seed=3, logprobs=True, top_logprobs=1
    ).choices[0].logprobs.content  # fmt: skip
    assert all(len(e.top_logprobs) == 1 for e in content)
    assert any(e.top_logprobs[0].token != e.token for e in content)


def test_continuous_usage_stats_alone_implies_include_usage(client, model_name):
    """vLLM's include_usage defaults to true in stream_options: continuous_usage_stats alone was a
    400 ("needs include_usage true"); it now streams the usage on every chunk and at the end."""
    for create, args in [
        (client.chat.completions.create, {"messages": MESSAGES}),
        (client.completions.create, {"prompt": PROMPT}),
    ]:
        chunks = list(
            create(model=model_name, **args, max_tokens=3, stream=True, stream_options={"continuous_usage_stats": True},
                   extra_body={"ignore_eos": True})
        )  # fmt: skip
        *choice_chunks, last = chunks
        assert not last.choices and last.usage.completion_tokens == 3
        assert choice_chunks and all(c.usage is not None for c in choice_chunks)
        assert choice_chunks[-1].usage.completion_tokens == 3


def test_include_obfuscation_is_accepted_and_adds_no_padding(client, model_name):
    """OpenAI's stream_options.include_obfuscation (the openai client's
    ChatCompletionStreamOptionsParam has it) was a 400 "unsupported field"; true or false is
    taken, and no chunk carries OpenAI's "obfuscation" padding field either way."""
    for create, args in [
        (client.chat.completions.create, {"messages": MESSAGES}),
        (client.completions.create, {"prompt": PROMPT}),
    ]:
        for obfuscate in (True, False):
            chunks = list(
                create(model=model_name, **args, max_tokens=3, stream=True,
                       stream_options={"include_usage": True, "include_obfuscation": obfuscate})
            )  # fmt: skip
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 3
            assert not any("obfuscation" in (c.model_extra or {}) for c in chunks)


def test_text_parts_are_joined_by_newlines_and_an_assistants_refusal_is_its_text(
    client, server, auth, model_name
):
    """Content parts were joined with nothing between ("Hi", "there" read "Hithere"); vLLM joins
    them with "\n". An assistant message's refusal part (OpenAI's schema) was a 400; its text is
    now the message's text. /tokenize and the chat route render them alike."""

    def tokens(messages):
        resp = httpx.post(f"{server.url}/tokenize", json={"messages": messages}, headers=auth)
        assert resp.status_code == 200, resp.text
        return resp.json()["tokens"]

    def prompt_tokens(messages):
        return client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=1
        ).usage.prompt_tokens

    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    joined = [{"role": "user", "content": "Hi\nthere"}]
    assert tokens(parts) == tokens(joined) != tokens([{"role": "user", "content": "Hithere"}])
    assert prompt_tokens(parts) == len(tokens(joined))
    refused = [
        *joined,
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]},
        {"role": "user", "content": "Why?"},
    ]
    as_text = [*joined, {"role": "assistant", "content": "I cannot."}, {"role": "user", "content": "Why?"}]
    assert tokens(refused) == tokens(as_text)
    assert prompt_tokens(refused) == len(tokens(as_text))


def test_completion_text_offsets_of_characters_split_across_tokens(client, llm, model_name):
    """A token that is part of a UTF-8 character counted as one character: the offsets of an emoji's
    byte tokens ran 0, 1, 2 and every later one pointed past the text. Each token now begins at the
    character it is part of, as the text of the tokens before it (whole characters) says."""
    prompt = "🎉日a 한국 ok"
    ids = llm.encode(prompt)
    assert len(ids) > len(prompt)  # some characters are several tokens
    want = [len(llm.tokenizer.decode(ids[:i]).rstrip("\ufffd")) for i in range(len(ids))]
    for stream in (False, True):
        resp = client.completions.create(
            model=model_name, prompt=prompt, max_tokens=1, temperature=0, echo=True, logprobs=0, stream=stream
        )
        chunks = list(resp) if stream else [resp]
        offsets = [
            o
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for o in c.choices[0].logprobs.text_offset
        ]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert offsets[: len(ids)] == want, stream
        assert all(0 <= o <= len(text) for o in offsets) and offsets == sorted(offsets), stream


def test_native_generate(server, llm, auth):
    ref = greedy(llm, PROMPT, 6)
    headers = auth
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    out = httpx.post(f"{server.url}/generate", json=body, headers=headers).json()
    assert out["text"] == ref.text and out["output_ids"] == ref.token_ids
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["meta_info"]["prompt_tokens"] == len(ref.prompt_token_ids)
    by_ids = httpx.post(
        f"{server.url}/generate",
        headers=headers,
        json={"input_ids": ref.prompt_token_ids, "sampling_params": body["sampling_params"]},
    ).json()
    assert by_ids["output_ids"] == ref.token_ids
    with httpx.stream(
        "POST", f"{server.url}/generate", json={**body, "stream": True}, headers=headers
    ) as resp:
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["text"] == ref.text and last["output_ids"] == ref.token_ids


def test_native_generate_streams_the_tokens_whose_text_is_held_back(server, auth):
    """A chunk for every token, as SGLang's: a stop string that the whole output begins holds all
    its text back until the end, yet the chunks before show the tokens (output_ids,
    completion_tokens) as they come. A token with no text to send made no chunk: a paused
    request's stream showed fewer tokens than it had made."""
    params = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(
        f"{server.url}/generate", json={"text": PROMPT, "sampling_params": params}, headers=auth
    )
    assert resp.status_code == 200, resp.text
    whole = resp.json()
    held = {**params, "stop": [whole["text"] + " and never this"]}
    body = {"text": PROMPT, "sampling_params": held, "stream": True}
    with httpx.stream("POST", f"{server.url}/generate", json=body, headers=auth) as streamed:
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert (chunks[-1]["text"], chunks[-1]["output_ids"]) == (whole["text"], whole["output_ids"])
    early = chunks[:-1]
    assert early and all(c["text"] == "" and c["meta_info"]["finish_reason"] is None for c in early), chunks
    for chunk in chunks:
        ids = chunk["output_ids"]
        assert ids == whole["output_ids"][: len(ids)] and len(ids) == chunk["meta_info"]["completion_tokens"]


@pytest.mark.parametrize("start", [0, 3])
def test_native_generate_input_logprobs(server, llm, auth, start):
    """SGLang's logprob_start_len: the prompt's tokens from that position get their logprobs in
    meta_info (the first prompt token's null), as the offline engine's prompt_logprobs."""
    ids = llm.tokenizer.encode(PROMPT)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=2, logprobs=2, prompt_logprobs=2))[0]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": start,
            "return_text_in_logprobs": True}  # fmt: skip
    meta = httpx.post(f"{server.url}/generate", json=body, headers=auth).json()["meta_info"]
    got = meta["input_token_logprobs"]
    assert [tid for _, tid, _ in got] == ids[start:]
    for (lp, _, text), want, tid in zip(got, ref.prompt_logprobs[start:], ids[start:], strict=True):
        assert text == llm.tokenizer.decode([tid])
        if want is None:
            assert lp is None
        else:
            assert lp == pytest.approx(want.logprob, abs=1e-4)
    tops = meta["input_top_logprobs"]
    assert (tops[0] is None) == (start == 0)
    assert [[t for _, t, _ in top] for top in tops if top is not None] == [
        [t for t, _ in lp.top] for lp in ref.prompt_logprobs[max(start, 1) :]
    ]
    # without return_text_in_logprobs (SGLang's default) each entry's text is null, as SGLang's
    # (it came back either way, and true was refused)
    bare = httpx.post(f"{server.url}/generate", json={**body, "return_text_in_logprobs": False}, headers=auth)
    bare_meta = bare.json()["meta_info"]
    assert [lp for lp, _, _ in bare_meta["input_token_logprobs"]] == [lp for lp, _, _ in got]
    entries = bare_meta["input_token_logprobs"] + bare_meta["output_token_logprobs"]
    entries += [e for top in bare_meta["output_top_logprobs"] for e in top]
    assert {text for _, _, text in entries} == {None}
    # without logprob_start_len (SGLang's default -1) there is none
    plain = {**body, "logprob_start_len": -1}
    assert (
        "input_token_logprobs"
        not in httpx.post(f"{server.url}/generate", json=plain, headers=auth).json()["meta_info"]
    )


def test_native_generate_takes_repetition_penalty_and_logit_bias(server, llm, auth):
    """SGLang's /generate sampling_params has repetition_penalty (and minisgl's OpenAI routes take
    logit_bias): both were a 400 'minisgl does not implement it' there; now as on completions."""
    ids = llm.tokenizer.encode(PROMPT)
    plain = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    banned = plain.token_ids[0]
    params = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, repetition_penalty=1.3, logit_bias={banned: -100}
    )
    ref = llm.generate([ids], params)[0]
    assert ref.token_ids != plain.token_ids and banned not in ref.token_ids
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True,
            "repetition_penalty": 1.3, "logit_bias": {str(banned): -100}}}  # fmt: skip
    out = httpx.post(f"{server.url}/generate", json=body, headers=auth)
    assert out.status_code == 200, out.text
    assert out.json()["output_ids"] == ref.token_ids
    bad = {"input_ids": ids, "sampling_params": {"repetition_penalty": -1.0}}
    err = httpx.post(f"{server.url}/generate", json=bad, headers=auth)
    assert err.status_code == 400 and err.json()["error"]["param"] == "sampling_params.repetition_penalty"


def test_native_generate_max_new_tokens_0_scores_the_prompt(server, llm, auth):
    """SGLang's max_new_tokens 0 (it was a 400): no new text, finish reason length, and with
    return_logprob the prompt's logprobs, as the offline engine's prompt_logprobs; streamed alike.
    min_new_tokens cannot be kept then: a 400 naming it."""
    ids = llm.tokenizer.encode(PROMPT)
    ref = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1))[0]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": 0}  # fmt: skip
    out = httpx.post(f"{server.url}/generate", json=body, headers=auth).json()
    meta = out["meta_info"]
    assert (out["text"], out["output_ids"], meta["completion_tokens"]) == ("", [], 0), out
    assert meta["finish_reason"] == {"type": "length", "matched": None}
    assert meta["output_token_logprobs"] == [] and meta["prompt_tokens"] == len(ids)
    got = [lp for lp, _, _ in meta["input_token_logprobs"]]
    assert got[0] is None  # (the first prompt token's)
    assert got[1:] == pytest.approx([lp.logprob for lp in ref.prompt_logprobs[1:]], abs=1e-4)
    with httpx.stream("POST", f"{server.url}/generate", json={**body, "stream": True}, headers=auth) as resp:
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["text"] == "" and len(events) == 2, events
    plain = httpx.post(f"{server.url}/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 0}},
                       headers=auth).json()  # fmt: skip
    assert plain["text"] == "" and plain["meta_info"]["finish_reason"]["type"] == "length"
    refused = httpx.post(
        f"{server.url}/generate",
        json={"text": PROMPT, "sampling_params": {"max_new_tokens": 0, "min_new_tokens": 1}},
        headers=auth,
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "sampling_params.min_new_tokens"
    # the one token needs room: a prompt as long as the context (2048) is refused saying so
    full = httpx.post(f"{server.url}/generate", json={**body, "input_ids": [5] * 2048}, headers=auth)
    error = full.json()["error"]
    assert (full.status_code, error["param"]) == (400, "input_ids"), error
    assert error["message"].startswith("sampling_params.max_new_tokens 0 still generates one token"), error
    assert "at most 2047 tokens" in error["message"], error


@pytest.mark.parametrize("prompt", [{"input_ids": [5, 6, 7]}, {"text": PROMPT}], ids=["input_ids", "text"])
def test_native_generate_logprob_start_len_past_the_prompt_is_a_400(server, llm, auth, prompt):
    """It returned an empty input_token_logprobs, silently."""
    length = len(prompt.get("input_ids") or llm.tokenizer.encode(PROMPT))
    body = {**prompt, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
            "logprob_start_len": length}  # fmt: skip
    resp = httpx.post(f"{server.url}/generate", json=body, headers=auth)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "logprob_start_len", error
    assert f"logprob_start_len {length} " in error["message"] and f"has {length} tokens" in error["message"]
    last = httpx.post(f"{server.url}/generate", json={**body, "logprob_start_len": length - 1}, headers=auth)
    assert last.status_code == 200 and len(last.json()["meta_info"]["input_token_logprobs"]) == 1, last.text


def test_api_key_protects_all_but_health(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/generate"),
    ]:
        resp = httpx.request(method, f"{server.url}{path}", json={})
        assert resp.status_code == 401, path
        assert resp.json()["error"]["code"] == "invalid_api_key"
        wrong = httpx.request(
            method, f"{server.url}{path}", json={}, headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401, path
        wrong_scheme = httpx.request(
            method, f"{server.url}{path}", json={}, headers={"Authorization": f"Basic {API_KEY}"}
        )
        assert wrong_scheme.status_code == 401, path


def test_the_auth_scheme_is_case_insensitive(server, model_name):
    """RFC 9110: "bearer KEY" is "Bearer KEY" (a client sending it got a 401)."""
    for scheme in ("bearer", "BEARER", "Bearer"):
        resp = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"{scheme} {API_KEY}"})
        assert resp.status_code == 200, (scheme, resp.text)


def test_openai_sdk_fields_at_what_minisgl_does_are_accepted(client, model_name):
    """store, metadata, service_tier and modalities from the official SDK were 400s (vLLM ignores
    them): taken where they ask for what minisgl does anyway, refused where they ask for more.
    So were safety_identifier and prompt_cache_key (a probe), OpenAI's successors of ``user``."""
    kwargs = dict(model=model_name, messages=MESSAGES, max_tokens=2, temperature=0)
    plain = client.chat.completions.create(**kwargs)
    resp = client.chat.completions.create(
        **kwargs,
        store=False,
        metadata={"team": "search"},
        service_tier="auto",
        modalities=["text"],
        safety_identifier="user-7f3a",
        prompt_cache_key="search-v1",
        # (the prefix cache keeps prefixes in memory; OpenAI's default verbosity)
        prompt_cache_retention="in_memory",
        verbosity="medium",
    )
    assert resp.choices[0].message.content == plain.choices[0].message.content
    # refused as the other values minisgl does not serve are (the Literal checks came first: code null)
    for extra, param, says in [
        ({"store": True}, "store", "stores no completions"),
        ({"modalities": ["text", "audio"]}, "modalities", "'audio' is not supported"),
        ({"modalities": ["audio"]}, "modalities", "'audio' is not supported"),
        ({"service_tier": "flex"}, "service_tier", "'flex' is not supported"),
        ({"service_tier": "priority"}, "service_tier", "'priority' is not supported"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention", 'or "in_memory"'),
        ({"verbosity": "low"}, "verbosity", '"medium" (the default)'),
        ({"verbosity": "high"}, "verbosity", "answers at its own length"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**kwargs, **extra)
        body = refused.value.body
        assert body["param"] == param and body["code"] == "unsupported_field", body
        assert body["message"].startswith(f"{param}: ") and says in body["message"], body


def test_best_of_equal_to_n_is_accepted_and_more_is_a_400(client, model_name):
    """The openai client's ``best_of=1`` (OpenAI's default, a no-op) was refused as an unsupported
    field; best_of above n (pick the likeliest of several) is not implemented and says so."""
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, best_of=1)
    assert len(resp.choices) == 1
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, best_of=2, n=2)
    assert len(resp.choices) == 2
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2, best_of=3)
    assert refused.value.body["param"] == "best_of" and "best_of equal to n" in refused.value.body["message"]


def test_what_minisgl_does_not_implement_is_code_unsupported_field(client, model_name):
    """As the README promises for ``best_of``: a value asking for what minisgl does not do (best_of
    other than n, suffix, store) was a 400 with code null, unlike an unknown field's."""
    for create, kwargs, param in [
        (client.completions.create, {"prompt": PROMPT, "best_of": 3}, "best_of"),
        (client.completions.create, {"prompt": PROMPT, "suffix": "end"}, "suffix"),
        (client.chat.completions.create, {"messages": MESSAGES, "store": True}, "store"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            create(model=model_name, max_tokens=2, **kwargs)
        body = refused.value.body
        assert body["param"] == param and body["code"] == "unsupported_field", body


def test_an_empty_suffix_is_taken_as_none(client, model_name):
    """suffix "" was refused as fill-in-the-middle ("suffix is not supported") while null was
    taken; an empty suffix asks for nothing after the completion, so it is answered as without one."""
    plain = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0)
    empty = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0, suffix="")
    assert empty.choices[0].text == plain.choices[0].text


def test_get_load_counts_what_requests_hold_not_the_prefix_cache(server, auth):
    """SGLang's /get_load num_tokens leaves out the cache it can reclaim; ours reported every used
    KV token, so an idle server with a warm prefix cache read as loaded (to the gateway's
    load-aware routing)."""
    import re
    import time

    body = {"prompt": "a prompt the prefix cache keeps " * 8, "max_tokens": 2, "temperature": 0}
    assert httpx.post(f"{server.url}/v1/completions", json=body, headers=auth).status_code == 200
    deadline = time.monotonic() + 10
    while True:  # the engine's stats come every quarter second or so
        load = httpx.get(f"{server.url}/get_load", headers=auth).json()[0]
        text = httpx.get(f"{server.url}/metrics", headers=auth).text
        used = int(float(re.search(r"^minisgl_kv_used_tokens (\S+)$", text, re.M).group(1)))
        held = int(float(re.search(r"^minisgl_kv_request_tokens (\S+)$", text, re.M).group(1)))
        if (load["num_reqs"] == 0 and used > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert load["num_reqs"] == 0 and used > 0, (load, used)
    assert load["num_tokens"] == held == 0


def test_native_generate_without_max_new_tokens_stops_at_sglangs_default(server, llm, auth):
    """SGLang's /generate default is 128 new tokens (ours ran to the end of the context: minutes
    of a CPU for a request that left the field out)."""
    ids = llm.tokenizer.encode(PROMPT)
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "ignore_eos": True}}
    out = httpx.post(f"{server.url}/generate", json=body, headers=auth, timeout=300).json()
    assert out["meta_info"]["completion_tokens"] == 128
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_native_generate_logprobs_follow_the_temperature(server, model_dir, llm, auth):
    """SGLang's /generate reports the sampled distribution's logprobs: log_softmax((logits + bias)
    / temperature), before top-k/top-p (they were the model's own at any temperature, as vLLM's,
    which the OpenAI routes keep). The reference is transformers' logits for the prompt."""
    import torch
    import transformers

    ids = llm.tokenizer.encode(PROMPT)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    biased = int(logits.argsort()[-5])  # the fifth most likely token, lifted by a bias
    for temperature, bias in [(0.5, {}), (2.0, {}), (0, {}), (0.7, {biased: 3.0})]:
        shifted = logits.clone()
        for token, value in bias.items():
            shifted[token] += value
        want = torch.log_softmax(shifted / (temperature or 1.0), dim=-1)
        sampling = {"max_new_tokens": 1, "temperature": temperature, "top_p": 0.9, "seed": 5,
                    "logit_bias": {str(k): v for k, v in bias.items()}}  # fmt: skip
        body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True, "top_logprobs_num": 3}
        meta = httpx.post(f"{server.url}/generate", json=body, headers=auth).json()["meta_info"]
        [(lp, token, _)] = meta["output_token_logprobs"]
        assert lp == pytest.approx(float(want[token]), abs=1e-3), (temperature, bias)
        top = [(t, v) for v, t, _ in meta["output_top_logprobs"][0]]
        values, order = want.topk(3)
        assert [t for t, _ in top] == order.tolist(), (temperature, bias)
        assert [v for _, v in top] == pytest.approx(values.tolist(), abs=1e-3)
    # the OpenAI routes keep vLLM's: the model's own distribution whatever the temperature
    raw = torch.log_softmax(logits, dim=-1)
    out = httpx.post(
        f"{server.url}/v1/completions",
        json={
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.5,
            "seed": 5,
            "logprobs": 1,
            "return_token_ids": True,
        },
        headers=auth,
    ).json()["choices"][0]
    [token] = out["token_ids"]
    assert out["logprobs"]["token_logprobs"][0] == pytest.approx(float(raw[token]), abs=1e-3)
