"""Overload is refused early and cleanly: body size, prompt length, sequences per request, a full
queue (429 + Retry-After), request deadlines, requests that can never fit, and a /health that
follows the engine's heartbeat and the worker processes' state."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

MAX_BODY = 2_000_000
#: one server for the module, with small bounds so each is cheap to reach
LIMITS = [
    "--max-body-bytes", str(MAX_BODY),
    "--max-sequences-per-request", "4",
    "--max-queued-requests", "6",
    "--health-timeout", "3",
    "--num-kv-tokens", "1024",
]  # fmt: skip


@pytest.fixture(scope="module")
def busy_server(start_server, model_dir, engine_args):
    return start_server(["--model", str(model_dir), *engine_args, *LIMITS])


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def process_by_name(server, name: str) -> int:
    for pid in server.children():
        if Path(f"/proc/{pid}/comm").read_text().strip() == name:
            return pid
    raise AssertionError(
        f"no child named {name}: {[Path(f'/proc/{p}/comm').read_text() for p in server.children()]}"
    )


def test_body_over_the_limit_is_413(busy_server):
    body = json.dumps({"prompt": "x" * (MAX_BODY + 10), "max_tokens": 1}).encode()
    resp = httpx.post(
        f"{busy_server.url}/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert_openai_error(resp, 413, "body_too_large")

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(MAX_BODY // 100_000 + 1):
            yield b"y" * 100_000
        yield b'", "max_tokens": 1}'

    resp = httpx.post(
        f"{busy_server.url}/v1/completions", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_openai_error(resp, 413, "body_too_large")


def test_huge_prompt_is_refused_before_tokenizing(busy_server, model_name):
    # 1.5 MB of text: far over 2048 tokens x the longest vocabulary entry; tokenizing it would take
    # seconds
    started = time.monotonic()
    resp = httpx.post(
        f"{busy_server.url}/v1/completions",
        json={"model": model_name, "prompt": "lorem ipsum " * 125_000, "max_tokens": 1},
        timeout=30,
    )
    error = assert_openai_error(resp, 400, "context_length_exceeded")
    assert error["param"] == "prompt"
    assert time.monotonic() - started < 3.0  # (seconds to tokenize; loose for a busy CI machine)
    chat = httpx.post(
        f"{busy_server.url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "é" * 400_000}], "max_tokens": 1},
    )
    assert assert_openai_error(chat, 400, "context_length_exceeded")["param"] == "messages"


@pytest.mark.parametrize(
    "where",
    ["content part", "tool description", "tool parameters", "chat_template_kwargs"],
)
def test_huge_text_anywhere_the_template_renders_is_refused_before_tokenizing(busy_server, where):
    """Every string the chat template may render counts toward the prompt's size: a tool's
    description of 9.6 M characters took seconds to tokenize (every other request waiting) before
    its 400, as only the messages' own strings were counted."""
    big = "tool text " * 120_000  # 1.2 M characters, over 2048 tokens x any vocabulary entry here
    messages = [{"role": "user", "content": "hi"}]
    body: dict = {"messages": messages, "max_tokens": 1}
    if where == "content part":
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": big}]}]
    elif where == "tool description":  # (tool_choice none: the template still renders the tools)
        body["tools"] = [{"type": "function", "function": {"name": "f", "description": big}}]
        body["tool_choice"] = "none"
    elif where == "tool parameters":
        parameters = {"type": "object", "properties": {"a": {"type": "string", "description": big}}}
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
        body["tool_choice"] = "none"
    else:
        body["chat_template_kwargs"] = {"note": big}
    started = time.monotonic()
    resp = httpx.post(f"{busy_server.url}/v1/chat/completions", json=body, timeout=30)
    error = assert_openai_error(resp, 400, "context_length_exceeded")
    assert "characters" in error["message"]  # the check before tokenizing, not the tokenizer's count
    assert time.monotonic() - started < 3.0  # (seconds to tokenize; loose for a busy CI machine)


@pytest.mark.parametrize("field", ["prompt", "messages", "tools"])
def test_tokenize_refuses_text_past_the_context_before_tokenizing(busy_server, field):
    """/tokenize counts as the generating routes do, and a text that cannot fit the context is
    refused before the tokenizer spends seconds on it (a 6 MB prompt took 10.7 s)."""
    big = "tool text " * 120_000
    body: dict = {"messages": [{"role": "user", "content": "hi"}]}
    if field == "prompt":
        body = {"prompt": big}
    elif field == "messages":
        body = {"messages": [{"role": "user", "content": big}]}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "description": big}}]
    started = time.monotonic()
    resp = httpx.post(f"{busy_server.url}/tokenize", json=body, timeout=30)
    error = assert_openai_error(resp, 400, "context_length_exceeded")
    assert "characters" in error["message"] and time.monotonic() - started < 3.0
    assert error["param"] == ("prompt" if field == "prompt" else "messages")
    ok = httpx.post(f"{busy_server.url}/tokenize", json={"prompt": "tool text " * 10}, timeout=30)
    assert ok.status_code == 200 and ok.json()["count"] > 10


def test_prompts_times_n_is_bounded(busy_server, model_name):
    resp = httpx.post(
        f"{busy_server.url}/v1/completions",
        json={"model": model_name, "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 1},
    )
    error = assert_openai_error(resp, 400, "too_many_sequences")
    assert error["param"] == "n"
    # the prompts alone are too many: they are what the error names (n was named, at its default)
    many = httpx.post(
        f"{busy_server.url}/v1/completions",
        json={"model": model_name, "prompt": ["a", "b", "c", "d", "e"], "max_tokens": 1},
    )
    assert assert_openai_error(many, 400, "too_many_sequences")["param"] == "prompt"
    ok = httpx.post(
        f"{busy_server.url}/v1/completions",
        json={"model": model_name, "prompt": ["a", "b"], "n": 2, "max_tokens": 1},
    )
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 4


def test_more_sequences_than_the_queue_ever_holds_is_a_400_not_a_429():
    """n above --max-queued-requests on an idle server was a 429 "retry later", which no retry
    (the openai client's by default) could ever turn into room."""
    from minisgl_core.server.errors import APIError
    from minisgl_core.server.limits import ServerLimits
    from minisgl_core.server.state import ServerState

    state = ServerState(None, None, limits=ServerLimits(max_sequences_per_request=8, max_queued_sequences=3))
    with pytest.raises(APIError) as refused:
        state.check_room(0, 4)
    assert refused.value.status == 400 and refused.value.param == "n", refused.value
    assert "queues at most 3 (--max-queued-requests)" in str(refused.value)
    state.check_room(0, 3)  # fits an idle server
    state.pending = {i: None for i in range(2)}  # type: ignore[misc]
    with pytest.raises(APIError) as busy:
        state.check_room(0, 2)  # fits once the server has room: retry later
    assert busy.value.status == 429


def test_a_draining_server_says_so_before_its_queue_is_full():
    """While shutting down, /v1/completions (which checks the whole request's size first) answered
    a full queue's 429 "retry later" where chat answered 503 (found by a probe): a load balancer
    kept retrying a server going away."""
    from minisgl_core.server.errors import APIError
    from minisgl_core.server.limits import ServerLimits
    from minisgl_core.server.state import RequestGroup, ServerState

    state = ServerState(None, None, limits=ServerLimits(max_sequences_per_request=8, max_queued_sequences=3))
    state.pending = {i: None for i in range(3)}  # type: ignore[misc]
    state.start_draining()
    with pytest.raises(APIError) as refused:
        RequestGroup(state).expect(1)
    assert refused.value.status == 503 and "shutting down" in str(refused.value), refused.value


def test_a_request_that_can_never_fit_is_a_400(busy_server, model_name):
    # fits the 2048-token context but not the 1024-token KV pool: no amount of waiting helps
    resp = httpx.post(
        f"{busy_server.url}/v1/completions",
        json={"model": model_name, "prompt": [5] * 1100, "max_tokens": 4},
    )
    assert_openai_error(resp, 400)


def test_full_queue_is_429_with_retry_after(busy_server, model_name):
    client = openai.OpenAI(base_url=f"{busy_server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    body = {"model": model_name, "prompt": "Tell a long story", "max_tokens": 200, "ignore_eos": True}
    openai_body = {"model": model_name, "prompt": body["prompt"], "max_tokens": 200}
    openai_body["extra_body"] = {"ignore_eos": True}
    # three requests of n=2 fill the queue of 6: chat streams, whose role chunk comes as soon as a
    # request is admitted. Generation is paused meanwhile, so that none can end before the checks
    # below: on a busy CI machine, 900 tokens a choice once ended first (a 200, no 429)
    chat_body = {"model": model_name, "messages": [{"role": "user", "content": "Tell a long story"}]}
    chat_body |= {"max_tokens": 900, "extra_body": {"ignore_eos": True}}
    assert httpx.post(f"{busy_server.url}/pause_generation", json={"mode": "in_place"}).status_code == 200
    try:
        streams = [client.chat.completions.create(**chat_body, n=2, stream=True) for _ in range(3)]
        try:
            for s in streams:
                next(iter(s))  # each is admitted
            resp = httpx.post(f"{busy_server.url}/v1/completions", json={**body, "max_tokens": 1})
            assert_openai_error(resp, 429, "server_overloaded")
            assert int(resp.headers["retry-after"]) >= 1
            with pytest.raises(openai.RateLimitError):
                client.completions.create(**{**openai_body, "max_tokens": 1})
        finally:
            for s in streams:
                s.close()
    finally:
        assert httpx.post(f"{busy_server.url}/continue_generation").status_code == 200
    deadline = time.monotonic() + 10
    while True:  # the aborts reach the engine; then there is room again
        resp = httpx.post(f"{busy_server.url}/v1/completions", json={**body, "max_tokens": 1})
        if resp.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert resp.status_code == 200, resp.text


def test_request_deadline_ends_the_request(busy_server, model_name):
    body = {"model": model_name, "prompt": "Once", "max_tokens": 900, "ignore_eos": True, "timeout": 0.3}
    resp = httpx.post(f"{busy_server.url}/v1/completions", json=body, timeout=30)
    error = assert_openai_error(resp, 504, "request_timeout")
    assert "0.3s" in error["message"]
    with httpx.stream(
        "POST", f"{busy_server.url}/v1/completions", json={**body, "stream": True}, timeout=30
    ) as s:
        events = [line.removeprefix("data: ") for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    streamed = json.loads(events[-2])["error"]
    assert "0.3s" in streamed["message"]
    # the 504's error, in a stream too (it said "internal_server_error" with no code)
    assert (streamed["type"], streamed["param"], streamed["code"]) == (
        "timeout_error",
        "timeout",
        "request_timeout",
    )
    bad = httpx.post(f"{busy_server.url}/v1/completions", json={**body, "timeout": -1})
    assert assert_openai_error(bad, 400)["param"] == "timeout"


def test_the_deadline_holds_while_the_tokenizer_worker_is_stopped(busy_server, model_name):
    """A request waiting for the tokenizer worker had no deadline: with the worker stopped, requests
    of a 5 s --request-timeout got their 504 only once it ran again (found by a probe), holding
    their queue slots meanwhile."""
    body = {"model": model_name, "prompt": "Once", "max_tokens": 4, "timeout": 0.5}
    tokenizer = process_by_name(busy_server, "minisgl-tok")
    os.kill(tokenizer, signal.SIGSTOP)
    try:
        started = time.monotonic()
        resp = httpx.post(f"{busy_server.url}/v1/completions", json=body, timeout=30)
        waited = time.monotonic() - started
        # (a stream is admitted before its response begins: the same 504)
        streamed = httpx.post(f"{busy_server.url}/v1/completions", json={**body, "stream": True}, timeout=30)
        waited_streaming = time.monotonic() - started - waited
    finally:
        os.kill(tokenizer, signal.SIGCONT)
    for answer, seconds in ((resp, waited), (streamed, waited_streaming)):
        error = assert_openai_error(answer, 504, "request_timeout")
        assert "0.5s" in error["message"] and error["param"] == "timeout" and seconds < 5, (seconds, error)
    # the worker runs again: the timed-out requests are dropped, the next one is served
    ok = httpx.post(f"{busy_server.url}/v1/completions", json={**body, "timeout": 30}, timeout=60)
    assert ok.status_code == 200, ok.text


def test_router_info_endpoints(busy_server, model_name):
    info = httpx.get(f"{busy_server.url}/get_model_info").json()
    assert info["served_model_name"] == model_name and info["is_generation"] is True
    server_info = httpx.get(f"{busy_server.url}/get_server_info").json()
    assert server_info["max_context_len"] == 2048 and server_info["max_queued_requests"] == 6
    assert httpx.get(f"{busy_server.url}/health_generate", timeout=30).json() == {"status": "ok"}


def test_health_follows_the_engine(busy_server):
    # idle for longer than the bound: the scheduler's heartbeat keeps it healthy
    time.sleep(3.5)
    assert httpx.get(f"{busy_server.url}/health").status_code == 200
    scheduler = process_by_name(busy_server, "minisgl-sched0")
    os.kill(scheduler, signal.SIGSTOP)
    try:
        # 503 comes 3 s (--health-timeout) after the last heartbeat the API server received, which
        # may arrive just after the stop (it passes the detokenizer), and a 200 answered just
        # before then returns a little later: a deadline of exactly 3 s left no room for either
        deadline = time.monotonic() + 3 + 2
        while (resp := httpx.get(f"{busy_server.url}/health")).status_code == 200:
            assert time.monotonic() < deadline, "still healthy with the scheduler stopped"
            time.sleep(0.1)
        assert resp.status_code == 503
        assert "scheduler 0" in resp.json()["error"]
        # a request sent meanwhile waits for the engine, it is not lost
        done = threading.Event()
        result: dict = {}

        def send() -> None:
            result["resp"] = httpx.post(
                f"{busy_server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60
            )
            done.set()

        threading.Thread(target=send, daemon=True).start()
        time.sleep(0.5)
        assert not done.is_set()
    finally:
        os.kill(scheduler, signal.SIGCONT)
    assert done.wait(30) and result["resp"].status_code == 200
    deadline = time.monotonic() + 5
    while httpx.get(f"{busy_server.url}/health").status_code != 200:
        assert time.monotonic() < deadline, "not healthy again after SIGCONT"
        time.sleep(0.1)


def test_gateway_fields_at_their_defaults_are_accepted(busy_server, model_name):
    # what the SGLang Model Gateway adds to every completion it forwards (captured from 0.3.2)
    added = {"echo": False, "no_stop_trim": False, "return_hidden_states": False}
    body = {"model": model_name, "prompt": "hi", "max_tokens": 2, "temperature": 0, **added}
    assert httpx.post(f"{busy_server.url}/v1/completions", json=body).status_code == 200
    # a value that would ask for something minisgl does not do is still refused
    error = assert_openai_error(
        httpx.post(f"{busy_server.url}/v1/completions", json={**body, "return_hidden_states": True}),
        400,
        "unsupported_field",
    )
    assert error["param"] == "return_hidden_states"


def test_vllm_fields_at_their_defaults_are_accepted(busy_server, model_name):
    """Clients written for vLLM send its use_beam_search, include_reasoning and
    spaces_between_special_tokens at their defaults, which ask for what minisgl does: each was a
    400 unsupported field; another value still is."""
    added = {"use_beam_search": False, "include_reasoning": True, "spaces_between_special_tokens": True}
    chat = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **added}
    assert httpx.post(f"{busy_server.url}/v1/chat/completions", json=chat).status_code == 200
    for name, other in [("use_beam_search", True), ("include_reasoning", False)]:
        error = assert_openai_error(
            httpx.post(f"{busy_server.url}/v1/chat/completions", json={**chat, name: other}),
            400,
            "unsupported_field",
        )
        assert error["param"] == name


# ------------------------------------------------------------------------ the flags


def _limits(argv: list[str]):
    import argparse

    from minisgl_core.server.cli import add_server_commands
    from minisgl_core.server.limits import limits_from_args

    parser = argparse.ArgumentParser()
    add_server_commands(parser.add_subparsers())
    return limits_from_args(parser.parse_args(["serve", "--model", "m", *argv]))


def test_each_limit_flag_sets_its_field():
    from minisgl_core.server.limits import ServerLimits

    assert _limits([]) == ServerLimits()
    limits = _limits(
        ["--max-body-bytes", "5", "--max-sequences-per-request", "6", "--max-queued-requests", "7"]
        + ["--request-timeout", "1.5", "--shutdown-timeout", "2.5", "--health-timeout", "3.5"]
        + ["--step-timeout", "4.5"]
    )
    assert limits == ServerLimits(5, 6, 7, 1.5, 2.5, 3.5, 4.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-queued-requests", "0"], "--max-queued-requests must be at least 1"),
        (["--max-body-bytes", "0"], "--max-body-bytes must be at least 1"),
        (["--request-timeout", "-1"], "--request-timeout must not be negative"),
        (["--health-timeout", "-0.5"], "--health-timeout must not be negative"),
        # (nan started the server, then every request timed out; 0 made /health 503 for ever)
        (["--request-timeout", "nan"], "--request-timeout must be a finite number of seconds, got nan"),
        (["--shutdown-timeout", "inf"], "--shutdown-timeout must be a finite number of seconds, got inf"),
        (["--health-timeout", "0"], "--health-timeout must be more than 0 seconds"),
        # (the idle scheduler reports once a second: at 1 s /health was 503 now and then)
        (
            ["--health-timeout", "1"],
            r"--health-timeout 1 is shorter than two of the scheduler's idle "
            r"reports \(one every 1 s\): /health would answer 503 between them on a healthy server; "
            r"give 2 or more",
        ),
        (["--step-timeout", "-1"], "--step-timeout must not be negative"),
    ],
)
def test_a_bad_limit_names_its_flag(argv, message):
    from minisgl_core.config import ConfigError

    # a ConfigError: `minisgl serve` says it in one line, exit code 2 (tests/test_config_errors.py)
    with pytest.raises(ConfigError, match=message):
        _limits(argv)


def test_health_stays_ok_through_a_step_longer_than_its_bound(start_server, tmp_path_factory, engine_args):
    """/health measured the time since the scheduler's last report, and the scheduler reports
    between steps: a CPU prefill of thousands of tokens in one step (100 s for 8,000 on two cores,
    the real default model) turned it 503 for as long as the step ran, on a healthy server; so did
    /health_generate, whose probe waited behind the step. A model big enough that one 6,000-token
    prefill step outlasts the least bound (2 s)."""
    from minisgl_core.demo.factories import make_model_dir

    model = make_model_dir(
        tmp_path_factory.mktemp("slow") / "slow-qwen3", "Qwen3ForCausalLM", hidden_size=512,
        intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, max_position_embeddings=8192,
    )  # fmt: skip
    args = [
        *engine_args,
        "--max-context-len",
        "8192",
        "--num-kv-tokens",
        "8192",
        "--max-prefill-tokens",
        "8192",
    ]
    server = start_server(["--model", str(model), *args, "--health-timeout", "2"])
    result: dict = {}

    def prefill() -> None:
        prompt = [(i * 53) % 1000 + 3 for i in range(6000)]
        started = time.monotonic()
        result["resp"] = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=300
        )
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=prefill, daemon=True)
    thread.start()
    statuses, probes = [], []
    while thread.is_alive():
        statuses.append(httpx.get(f"{server.url}/health", timeout=10).status_code)
        # (the probe waits behind the step: busy, not broken; it was a 503 past the 2 s bound)
        probe = httpx.get(f"{server.url}/health_generate", timeout=10)
        probes.append((probe.status_code, probe.json().get("error")))
        time.sleep(0.25)
    thread.join()
    assert result["resp"].status_code == 200, result["resp"].text
    assert result["seconds"] > 3, f"the step took {result['seconds']:.1f} s: too short to tell"
    assert set(statuses) == {200}, statuses
    assert {status for status, _ in probes} == {200}, probes


def test_max_model_len_is_what_the_kv_pool_holds_when_it_holds_less(busy_server, model_name):
    """With --num-kv-tokens 1024 under a 2048-token context, /v1/models said max_model_len 2048,
    and a client sizing its prompt by it got a 400 ("exceeds the KV pool"); as SGLang, the pool's
    size is the limit reported (/tokenize's too)."""
    info = httpx.get(f"{busy_server.url}/get_server_info").json()
    pool = info["kv_capacity_tokens"]
    assert pool < 2048
    card = httpx.get(f"{busy_server.url}/v1/models").json()["data"][0]
    assert card["max_model_len"] == pool
    assert httpx.post(f"{busy_server.url}/tokenize", json={"prompt": "hi"}).json()["max_model_len"] == pool
    # a request of exactly that many tokens runs; one more is refused
    body = {"model": model_name, "prompt": [5] * (pool - 2), "max_tokens": 2, "ignore_eos": True}
    assert httpx.post(f"{busy_server.url}/v1/completions", json=body, timeout=60).status_code == 200
    body["max_tokens"] = 3
    assert httpx.post(f"{busy_server.url}/v1/completions", json=body, timeout=60).status_code == 400
