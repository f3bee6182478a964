"""Prompt tokens served from the prefix cache, per request: chat and completions'
``usage.prompt_tokens_details.cached_tokens`` (streamed in the ``include_usage`` chunk too),
``/v1/responses``' ``usage.input_tokens_details.cached_tokens`` and ``/generate``'s
``meta_info.cached_tokens``. They were never reported (the Responses API said 0 whatever the
cache did).

Servers of their own, started fresh: a prompt of token ids no request sent before is known to
find nothing cached. Chat prompts share their template's first tokens, so a chat request's first
figure is compared, not assumed 0."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from .conftest import API_KEY, metrics

#: long enough to fill whole pages on any device (the CPU's page is one token, CUDA's 16)
LENGTH = 48
ESSAY = "Tell me about the tides, the moon and the sea, and why the water rises twice a day. " * 3


def fresh_ids(first: int) -> list[int]:
    """A prompt of token ids beginning with ``first``: each test starts its own, so nothing of it
    is cached before the test sends it."""
    return [first] + [(first * 7 + i) % 900 + 10 for i in range(LENGTH - 1)]


#: the naive server's speculative decoding (prompt lookup): its /metrics are checked below, and no
#: server of the suite speculated before (one more server start costs CI seconds it has not got);
#: it changes no cached figure, prefill is as without it
SPEC = ["--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "4"]


@pytest.fixture(scope="module")
def servers(start_server, model_dir, engine_args):
    """{cache: server} for the radix cache (the default) and the naive one (no prefix reuse),
    which also speculates (SPEC)."""
    common = ["--model", str(model_dir), "--api-key", API_KEY, *engine_args]
    return {
        "radix": start_server([*common, "--cache", "radix"]),
        "naive": start_server([*common, "--cache", "naive", *SPEC]),
    }


@pytest.fixture(scope="module")
def clients(servers):
    return {
        cache: openai.OpenAI(base_url=f"{s.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        for cache, s in servers.items()
    }


@pytest.fixture(scope="module")
def model_name(clients):
    return clients["radix"].models.list().data[0].id


def cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def test_completions_report_the_cached_part_of_a_prompt_sent_again(clients, model_name):
    client = clients["radix"]
    ids = fresh_ids(1001)
    first = client.completions.create(model=model_name, prompt=ids, max_tokens=2, temperature=0).usage
    second = client.completions.create(model=model_name, prompt=ids, max_tokens=2, temperature=0).usage
    assert first.prompt_tokens == second.prompt_tokens == LENGTH
    assert cached(first) == 0
    assert 0 < cached(second) < LENGTH  # (its last token runs again, for the first logits)
    streamed = list(
        client.completions.create(
            model=model_name, prompt=ids, max_tokens=2, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert cached(streamed[-1].usage) == cached(second)
    assert all(c.usage is None for c in streamed[:-1])


def test_a_prompt_counts_once_whatever_n(clients, model_name):
    """prompt_tokens counts a prompt once whatever n, and so does cached_tokens: the part of the
    prompt no choice computed. The first time, the first choice computes it and the others read
    its copy: 0, not their hits (n - 1 times the prompt, more than prompt_tokens)."""
    client = clients["radix"]
    ids = fresh_ids(1002)
    args = dict(model=model_name, prompt=ids, max_tokens=2, temperature=1.0, seed=3, n=3)
    first = client.completions.create(**args).usage
    again = client.completions.create(**args).usage
    assert first.prompt_tokens == again.prompt_tokens == LENGTH
    assert cached(first) == 0 and 0 < cached(again) < LENGTH


def test_chat_reports_the_cached_part_of_a_conversation_sent_again(clients, model_name):
    client = clients["radix"]
    messages = [{"role": "user", "content": "Chat: " + ESSAY}]
    args = dict(model=model_name, messages=messages, max_tokens=2, temperature=0)
    first = client.chat.completions.create(**args).usage
    second = client.chat.completions.create(**args).usage
    # (the first shares the chat template's head with any earlier chat request)
    assert cached(first) < cached(second) < second.prompt_tokens
    assert cached(second) > second.prompt_tokens // 2
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert not chunks[-1].choices and cached(usage) == cached(second)
    assert usage.prompt_tokens == second.prompt_tokens


def test_responses_report_cached_input_tokens(clients, model_name):
    client = clients["radix"]
    args = dict(model=model_name, input="Responses: " + ESSAY, max_output_tokens=2, temperature=0)
    first = client.responses.create(**args).usage
    second = client.responses.create(**args).usage
    assert first.input_tokens_details.cached_tokens < second.input_tokens_details.cached_tokens
    assert second.input_tokens_details.cached_tokens < second.input_tokens
    with client.responses.stream(**args) as stream:
        last = list(stream)[-1]  # response.incomplete: max_output_tokens ran out
    assert last.response.usage.input_tokens_details.cached_tokens == second.input_tokens_details.cached_tokens


def test_generate_meta_info_has_sglangs_cached_tokens(servers):
    url, auth = servers["radix"].url, {"Authorization": f"Bearer {API_KEY}"}
    body = {"input_ids": fresh_ids(1003), "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    first = httpx.post(f"{url}/generate", json=body, headers=auth, timeout=120).json()["meta_info"]
    second = httpx.post(f"{url}/generate", json=body, headers=auth, timeout=120).json()["meta_info"]
    assert first["cached_tokens"] == 0 and 0 < second["cached_tokens"] < second["prompt_tokens"]
    with httpx.stream(
        "POST", f"{url}/generate", json={**body, "stream": True}, headers=auth, timeout=120
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert {json.loads(e)["meta_info"]["cached_tokens"] for e in events[:-1]} == {second["cached_tokens"]}


def test_nothing_is_cached_without_prefix_reuse(clients, model_name):
    """--cache naive reuses nothing: every figure 0, and still there."""
    client = clients["naive"]
    ids = fresh_ids(1004)
    for _ in range(2):
        usage = client.completions.create(model=model_name, prompt=ids, max_tokens=2, temperature=0).usage
        assert usage.prompt_tokens == LENGTH and cached(usage) == 0
    messages = [{"role": "user", "content": ESSAY}]
    for _ in range(2):
        usage = client.chat.completions.create(model=model_name, messages=messages, max_tokens=2).usage
        assert cached(usage) == 0
    response = client.responses.create(model=model_name, input=ESSAY, max_output_tokens=2)
    assert response.usage.input_tokens_details.cached_tokens == 0


def test_flush_cache_empties_the_prefix_cache_and_is_refused_while_busy(servers, clients, model_name):
    """SGLang's /flush_cache and vLLM's /reset_prefix_cache: a prompt cached before the flush is
    computed whole after it (cached_tokens 0 again, the same greedy tokens); while a request runs
    the flush is a 400 in OpenAI's error shape and nothing is flushed."""
    url, auth = servers["radix"].url, {"Authorization": f"Bearer {API_KEY}"}
    client = clients["radix"]
    ids = fresh_ids(1007)

    def complete():
        answer = client.completions.create(model=model_name, prompt=ids, max_tokens=3, temperature=0)
        return cached(answer.usage), answer.choices[0].text

    first, second = complete(), complete()
    assert first[0] == 0 and second[0] > 0 and first[1] == second[1]
    flushed = httpx.post(f"{url}/flush_cache", headers=auth, timeout=60)
    assert flushed.status_code == 200 and flushed.json()["status"] == "ok"
    assert flushed.json()["flushed_tokens"] >= second[0]
    assert complete() == first  # computed whole again
    # vLLM's name; not GET (nor so HEAD, which runs the GET): a probe must not empty the cache
    assert complete()[0] > 0
    assert httpx.post(f"{url}/reset_prefix_cache", headers=auth, timeout=60).status_code == 200
    assert complete()[0] == 0
    assert httpx.get(f"{url}/flush_cache", headers=auth, timeout=60).status_code == 405
    assert complete()[0] > 0
    assert httpx.post(f"{url}/flush_cache", timeout=60).status_code == 401  # behind the API key

    busy = client.completions.create(
        model=model_name, prompt=fresh_ids(1008), max_tokens=400, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    next(iter(busy))  # running now
    refused = httpx.post(f"{url}/flush_cache", headers=auth, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "server_busy" and "idle" in error["message"]
    busy.close()
    assert complete()[0] > 0  # not flushed


def test_cache_salt_keeps_tenants_apart(clients, model_name):
    """vLLM's cache_salt: a prompt sent again reads the cache only under the salt it was cached
    with (completions, chat, and the Responses API, which runs as chat)."""
    client = clients["radix"]
    ids = fresh_ids(777)

    def completion(salt: str) -> int:
        extra = {"cache_salt": salt}
        return cached(
            client.completions.create(model=model_name, prompt=ids, max_tokens=2, extra_body=extra).usage
        )

    assert completion("tenant-a") == 0
    hit = completion("tenant-a")
    assert hit > 0
    assert completion("tenant-b") == 0 and completion("tenant-b") == hit
    messages = [{"role": "user", "content": f"{ESSAY} (salted)"}]

    def chat(salt: str) -> int:
        usage = client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=2, extra_body={"cache_salt": salt}
        ).usage
        return cached(usage)

    first_a = chat("chat-a")
    assert chat("chat-a") > first_a
    assert chat("chat-b") == first_a == 0  # (the template's first tokens too are the salt's)
    response = client.responses.create(
        model=model_name, input=f"{ESSAY} (salted)", max_output_tokens=2, extra_body={"cache_salt": "chat-a"}
    )
    assert response.usage.input_tokens_details.cached_tokens > 0
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model_name, prompt=ids, max_tokens=2, extra_body={"cache_salt": ""})
    assert refused.value.body["param"] == "cache_salt"


def test_speculative_counters_reach_metrics_as_the_engine_counts_them(
    servers, clients, model_name, model_dir
):
    """Engine.stats() had spec_* counters that /metrics never exported, so a server's draft
    acceptance could not be observed. They are vLLM's spec_decode_num_* counters under our prefix
    (and ours: emitted tokens, request and verify steps), on a speculating server only."""
    from minisgl_core import SamplingParams
    from minisgl_core.testing import cpu_llm

    prompts = [[101, 102, 103, 104, 105] * 8, [201, 202, 203] * 10]  # (copy-heavy: drafts are accepted)
    llm = cpu_llm(model_dir, cache="naive", speculative_algorithm="ngram", speculative_num_draft_tokens=4)
    try:
        for ids in prompts:  # one at a time, as sent below
            llm.generate([ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        expected = llm.engine.stats()
    finally:
        llm.close()
    names = {
        "minisgl_spec_decode_num_drafts_total": "spec_drafted_requests",
        "minisgl_spec_decode_num_draft_tokens_total": "spec_draft_tokens",
        "minisgl_spec_decode_num_accepted_tokens_total": "spec_accepted_tokens",
        "minisgl_spec_decode_num_emitted_tokens_total": "spec_emitted_tokens",
        "minisgl_spec_decode_request_steps_total": "spec_request_steps",
        "minisgl_spec_decode_verify_steps_total": "spec_verify_steps",
    }
    assert 0 < expected["spec_accepted_tokens"] <= expected["spec_draft_tokens"], expected

    def spec_metrics(server) -> dict[str, float]:
        return {k: v for k, v in metrics(server.url).items() if k.startswith("minisgl_spec_decode")}

    before = spec_metrics(servers["naive"])
    assert set(before) == set(names), before
    client = clients["naive"]
    for ids in prompts:
        out = client.completions.create(
            model=model_name, prompt=ids, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
        )
        assert out.usage.completion_tokens == 24
    want = {name: before[name] + expected[stat] for name, stat in names.items()}
    deadline = time.monotonic() + 10  # (the engine's stats come with its outputs and idle reports)
    while (after := spec_metrics(servers["naive"])) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after == want, (before, after, expected)
    # the server without speculation exports none of them (a 0 would read as drafts rejected)
    assert spec_metrics(servers["radix"]) == {}
