"""Many concurrent streams, and clients that go away mid-stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from minisgl_core.sampling import SamplingParams

N_REQUESTS = 64
MAX_TOKENS = 8


def test_64_concurrent_streams_match_offline(async_client, llm, model_name, read_metrics):
    prompts = [f"Request number {i} asks about {'sea ' * (i % 7)}and sky" for i in range(N_REQUESTS)]

    async def one(prompt: str) -> tuple[str, str | None]:
        stream = await async_client.completions.create(
            model=model_name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        text, reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def all_of_them():
        return await asyncio.gather(*(one(p) for p in prompts))

    before = read_metrics()
    results = asyncio.run(all_of_them())
    refs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [text for text, _ in results] == [r.text for r in refs]
    assert all(reason == r.finish_reason for (_, reason), r in zip(results, refs, strict=True))
    after = read_metrics()
    finished = sum(after[k] - before[k] for k in after if k.startswith("minisgl_requests_total{"))
    assert finished == N_REQUESTS
    generated = after["minisgl_generation_tokens_total"] - before["minisgl_generation_tokens_total"]
    assert generated == sum(len(r.token_ids) for r in refs)
    assert (
        after["minisgl_time_to_first_token_seconds_count"]
        - before["minisgl_time_to_first_token_seconds_count"]
        == N_REQUESTS
    )


def wait_idle(read_metrics, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = read_metrics()
        if m["minisgl_num_requests_running"] == 0 and m["minisgl_kv_request_tokens"] == 0:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_kv(server, auth, read_metrics):
    before = wait_idle(read_metrics)
    body = {
        "prompt": "Tell me a very long story",
        "max_tokens": 2000,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body, headers=auth) as resp:
            assert resp.status_code == 200
            # Read a few events; stopping a for-loop over iter_lines would close the connection already.
            lines = resp.iter_lines()
            events = 0
            while events < 3:
                events += next(lines).startswith("data: ")
        # leaving the block closes the connection mid-stream
    idle = wait_idle(read_metrics, timeout=5)
    abort = 'minisgl_requests_total{finish_reason="abort"}'
    assert idle[abort] == before[abort] + 1
    assert idle["minisgl_generation_tokens_total"] < before["minisgl_generation_tokens_total"] + 2000
    assert idle["minisgl_kv_request_tokens"] == 0 and idle["minisgl_num_requests_running"] == 0


def test_disconnect_while_waiting_for_a_non_streaming_answer(server, auth, read_metrics):
    aborted_before = wait_idle(read_metrics)['minisgl_requests_total{finish_reason="abort"}']
    body = {"prompt": "Another long story", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    try:
        httpx.post(f"{server.url}/v1/completions", json=body, headers=auth, timeout=0.1)
    except httpx.TimeoutException:
        pass
    idle = wait_idle(read_metrics, timeout=5)
    assert idle['minisgl_requests_total{finish_reason="abort"}'] == aborted_before + 1


@pytest.mark.parametrize("close", ["fin", "rst"])
def test_a_stream_whose_client_left_before_its_answer_began_is_aborted(server, auth, read_metrics, close):
    """A client gone before the server starts its streaming answer (it sent the request and closed
    the socket at once, with a FIN or an RST): the route is still waiting for the tokenizer's
    admission then (the worker is stopped meanwhile), and Starlette finds the disconnect when it
    starts the response. Each request is aborted at once, not run to its 2,000 tokens. (Checked:
    no leak with the uvicorn and Starlette in use; a guard for their upgrades.)"""
    before = wait_idle(read_metrics)
    bodies = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "A long story"}]},
        "/v1/completions": {"prompt": "A long story"},
    }
    tokenizer = next(pid for pid in server.children() if process_name(pid) == "minisgl-tok")
    where = urlsplit(server.url)
    os.kill(tokenizer, signal.SIGSTOP)
    try:
        for path, body in bodies.items():
            data = json.dumps({**body, "max_tokens": 2000, "ignore_eos": True, "stream": True}).encode()
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth['Authorization']}\r\n"
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            sock = socket.create_connection((where.hostname, where.port), timeout=30)
            if close == "rst":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(head.encode() + data)
            sock.close()
        time.sleep(0.5)
    finally:
        os.kill(tokenizer, signal.SIGCONT)
    abort = 'minisgl_requests_total{finish_reason="abort"}'
    deadline = time.monotonic() + 10
    while (now := read_metrics())[abort] < before[abort] + len(bodies):
        assert time.monotonic() < deadline, f"the requests run on: {now}"
        time.sleep(0.05)
    idle = wait_idle(read_metrics, timeout=10)
    assert idle[abort] == before[abort] + len(bodies)
    assert idle["minisgl_generation_tokens_total"] < before["minisgl_generation_tokens_total"] + 100


def process_name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()
