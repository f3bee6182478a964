"""``minisgl serve`` with no ``--model`` serves the real default model, and its greedy chat output
through the official ``openai`` client equals transformers' on the same GGUF, token for token."""

from __future__ import annotations

import time

import pytest

from minisgl_core.testing.real_model import MAX_TOKENS

# fmt: off
REAL_ARGS = ["--device", "cpu", "--attn", "torch", "--num-kv-tokens", "8192", "--max-running-requests", "64",
             "--max-context-len", "2048"]
# fmt: on


@pytest.fixture(scope="module")
def real_server(start_server, default_model_dir):
    # default_model_dir first: the file is in the cache, so the server does not fetch it again
    return start_server(REAL_ARGS)


@pytest.fixture(scope="module")
def real_client(real_server):
    import openai

    return openai.OpenAI(base_url=f"{real_server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_serves_smollm2_by_default(real_client):
    assert [m.id for m in real_client.models.list().data] == ["SmolLM2-135M-Instruct"]


def test_capital_of_france(real_client):
    resp = real_client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=16,
    )
    assert "Paris" in resp.choices[0].message.content


def test_responses_input_tokens_count_is_the_usage_of_the_same_request(real_client):
    """SmolLM2's own tokenizer and template: ``client.responses.input_tokens.count`` of a
    conversation (instructions, several turns, non-ASCII text) is the ``usage.input_tokens`` of
    the same request created."""
    asked = {
        "model": "SmolLM2-135M-Instruct",
        "instructions": "Answer in one word.",
        "input": [
            {"role": "user", "content": "Café or thé?"},
            {"role": "assistant", "content": "Café."},
            {"role": "user", "content": [{"type": "input_text", "text": "Why? 😀"}]},
        ],
    }
    counted = real_client.responses.input_tokens.count(**asked)
    created = real_client.responses.create(**asked, max_output_tokens=1, temperature=0)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == created.usage.input_tokens > 20


def test_a_prompt_of_long_tokens_that_fits_is_served(real_client):
    """The early size check bounds a prompt by the vocabulary's longest entry: SmolLM2 packs 64
    dashes into one token, so 57,600 of them are 900 tokens, which fit the 2,048-token context
    (a bound of 16 characters a token refused them, a 400 for a prompt that fits)."""
    resp = real_client.completions.create(
        model="SmolLM2-135M-Instruct", prompt="-" * 57_600, max_tokens=1, temperature=0
    )
    assert resp.usage.prompt_tokens == 900


def test_logprob_bytes_join_a_character_split_across_tokens(real_client):
    """OpenAI's ``bytes`` of a logprob entry are the token's own: SmolLM2 spells 😀 in three
    byte-level tokens, each of whose text alone is U+FFFD; their bytes were those of U+FFFD."""
    resp = real_client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Reply with an emoji."}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"regex": "😀"},
    )
    choice = resp.choices[0]
    assert choice.message.content == "😀"
    entries = [e for e in choice.logprobs.content if e.token != "<|im_end|>"]
    assert len(entries) == 3
    assert bytes(b for e in entries for b in e.bytes).decode("utf-8") == "😀"
    replacement = list("\ufffd".encode("utf-8"))
    for e in entries:  # no entry, chosen or top, gives U+FFFD's bytes for a part of a character
        assert all(t.bytes != replacement for t in [e, *e.top_logprobs]), e
        assert all(
            bytes(t.bytes).decode("utf-8", "replace") == t.token
            for t in e.top_logprobs
            if t.token != "\ufffd"
        )


def test_completion_logprobs_name_a_part_of_a_character_by_its_bytes(real_client):
    """The completions format has no ``bytes`` field: a token that is a part of a character is
    named ``bytes:\\xf0\\x9f`` (OpenAI's legacy spelling), so the three tokens of 😀 read apart and
    top-k alternatives that are parts of characters no longer share the key U+FFFD (one of them
    was lost from the dict)."""
    resp = real_client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="Here is an emoji:",
        max_tokens=3,
        temperature=0,
        logprobs=5,
        extra_body={"regex": "😀"},
    )
    lp = resp.choices[0].logprobs
    assert resp.choices[0].text == "😀"
    raw = b"".join(bytes.fromhex(t.removeprefix("bytes:").replace("\\x", "")) for t in lp.tokens)
    assert raw.decode("utf-8") == "😀" and all(t.startswith("bytes:\\x") for t in lp.tokens), lp.tokens
    # every alternative under its own key: five of them, and the chosen token's (if another)
    for top, token in zip(lp.top_logprobs, lp.tokens, strict=True):
        assert token in top and len(top) in (5, 6) and "\ufffd" not in top, top
    # return_tokens_as_token_ids names them by id instead
    resp = real_client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="Here is an emoji:",
        max_tokens=3,
        temperature=0,
        logprobs=1,
        extra_body={"regex": "😀", "return_tokens_as_token_ids": True},
    )
    assert all(t.startswith("token_id:") for t in resp.choices[0].logprobs.tokens)


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("stop", [None, "😀 日本 x"])
def test_streamed_text_offsets_equal_the_whole_response(real_client, echo, stop):
    """A stream's offsets went by the text its chunks had sent, which lags the tokens: a stop
    string's possible start is held back (here all of "😀 日本 " until "o" rules it out), and
    so is a character's first tokens, so a chunk of several tokens counted afresh from there (the
    later bytes of 😀 as a character each). They now go by the tokens, counted on from chunk to
    chunk, as the whole response's do."""
    kwargs = dict(
        model="SmolLM2-135M-Instruct",
        prompt="Here is an emoji:",
        max_tokens=12,
        temperature=0,
        logprobs=1,
        echo=echo,
        stop=stop,
        extra_body={"regex": "😀 日本 ok"},
    )
    whole = real_client.completions.create(**kwargs)
    assert whole.choices[0].text.endswith("😀 日本 ok")
    want = whole.choices[0].logprobs.text_offset
    assert sum(t.startswith("bytes:") for t in whole.choices[0].logprobs.tokens) >= 3  # parts of 😀
    chunks = [c for c in real_client.completions.create(**kwargs, stream=True) if c.choices]
    streamed = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert streamed == want
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


@pytest.mark.parametrize("max_tokens", [0, 4])
def test_streamed_echo_chunks_carry_their_own_tokens_logprobs(real_client, max_tokens):
    """With echo and logprobs the echo went out as a chunk without logprobs, and the next chunk
    carried the prompt's tokens and its new ones under its new text alone (with max_tokens 0, a
    chunk of no text carried the prompt's). Each chunk's tokens now spell its own text."""
    kwargs = dict(
        model="SmolLM2-135M-Instruct",
        prompt="Hello world",
        max_tokens=max_tokens,
        temperature=0,
        logprobs=1,
        echo=True,
    )
    whole = real_client.completions.create(**kwargs)
    chunks = [c for c in real_client.completions.create(**kwargs, stream=True) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[0].choices[0].text.startswith("Hello world")
    for chunk in chunks:
        choice = chunk.choices[0]
        tokens = choice.logprobs.tokens if choice.logprobs else []
        assert "".join(tokens) == choice.text, (choice.text, tokens)
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == (
        whole.choices[0].logprobs.tokens
    )


def test_a_dropped_stream_of_many_choices_leaves_no_write_warnings(real_server):
    """A stream of n=64 dropped by its client logged 20-60 lines of asyncio's "socket.send() raised
    exception.": a step's chunks (one a choice) were written back to back in one turn of the event
    loop, so the server kept writing to the closed socket before it saw that the client had gone."""
    import httpx

    def metrics() -> dict[str, float]:
        text = httpx.get(f"{real_server.url}/metrics").text
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line[:1] not in "#"
        }

    abort = 'minisgl_requests_total{finish_reason="abort"}'
    before = metrics()
    body = {"prompt": "x", "n": 64, "max_tokens": 32, "stream": True, "ignore_eos": True}
    for _ in range(3):
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{real_server.url}/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                for events, _line in enumerate(line for line in resp.iter_lines() if line):
                    if events == 2:
                        break
        deadline = time.monotonic() + 30
        while metrics()["minisgl_num_requests_running"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert metrics()[abort] == before[abort] + 3 * 64  # every choice of the dropped streams aborted
    assert "socket.send() raised exception" not in real_server.log()


def test_greedy_chat_equals_transformers(real_client, real_references):
    from concurrent.futures import ThreadPoolExecutor

    def ask(ref):
        return real_client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=ref.messages,
            temperature=0,
            max_tokens=MAX_TOKENS,
        )

    # concurrently, so the references are checked under continuous batching too
    with ThreadPoolExecutor(len(real_references)) as pool:
        responses = list(pool.map(ask, real_references))
    for ref, resp in zip(real_references, responses, strict=True):
        choice = resp.choices[0]
        assert resp.usage.prompt_tokens == len(ref.prompt_ids), ref.label
        assert choice.message.content == ref.text, f"{ref.label}: {choice.message.content!r} != {ref.text!r}"
        ended = len(ref.output_ids) < MAX_TOKENS
        assert choice.finish_reason == ("stop" if ended else "length"), ref.label
        assert resp.usage.completion_tokens == len(ref.output_ids), ref.label
