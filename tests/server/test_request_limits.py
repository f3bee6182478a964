"""Valid requests at the edges keep the server alive (issue 15 items 1, 2, 8), and the API key
stays out of the plugins' options and the worker processes' command lines and environments."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import httpx
import pytest

from minisgl_core import SamplingParams
from minisgl_core.sampling import INT64_MAX

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
PENALISED = {"prompt": "hi", "temperature": 0, "frequency_penalty": 0.5, "stop": [" "], "max_tokens": 64}


def test_penalty_with_a_stop_string_answers_and_matches_offline(server, auth, llm):
    """It used to kill the scheduler with overlap on: a request finished by the step in flight
    was planned again."""
    resp = httpx.post(f"{server.url}{COMPLETIONS}", json=PENALISED, headers=auth, timeout=120)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    params = SamplingParams(temperature=0, frequency_penalty=0.5, stop=[" "], max_tokens=64)
    want = llm.generate(["hi"], params)[0]
    assert (choice["text"], choice["finish_reason"]) == (want.text, want.finish_reason)
    assert httpx.get(f"{server.url}/health").status_code == 200


async def _mixed_load(url: str, auth: dict[str, str]) -> list[httpx.Response]:
    # penalised requests that stop early at different steps, among plain and seeded ones
    bodies = []
    for i in range(12):
        body = {**PENALISED, "prompt": f"story {i}:", "presence_penalty": 0.3 * (i % 3)}
        if i % 4 == 1:
            body |= {"temperature": 0.9, "seed": i, "stop": ["e", "a"]}
        if i % 4 == 2:
            body = {"prompt": f"count {i}", "max_tokens": 8, "logprobs": 2, "temperature": 0}
        bodies.append(body)
    async with httpx.AsyncClient(timeout=180, headers=auth) as client:
        return await asyncio.gather(*(client.post(f"{url}{COMPLETIONS}", json=b) for b in bodies))


def test_concurrent_penalised_requests_with_early_stops(server, auth):
    responses = asyncio.run(_mixed_load(server.url, auth))
    assert [r.status_code for r in responses] == [200] * len(responses), [r.text for r in responses]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"


def test_seed_at_the_top_of_its_range_with_n_choices(server, auth):
    """``seed + i`` used to overflow msgpack in the tokenizer, killing it."""
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": INT64_MAX, "max_tokens": 4}
    first = httpx.post(f"{server.url}{CHAT}", json=body, headers=auth, timeout=120)
    again = httpx.post(f"{server.url}{CHAT}", json=body, headers=auth, timeout=120)
    assert first.status_code == again.status_code == 200, first.text
    texts = [c["message"]["content"] for c in first.json()["choices"]]
    assert len(texts) == 3
    assert texts == [c["message"]["content"] for c in again.json()["choices"]]  # reproducible


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hi", "seed": 2**64},
        {"prompt": [1, 2**64]},
        {"prompt": "hi", "top_k": 2**63},
        {"prompt": "hi", "stop": "\udfff"},
    ],
    ids=["seed", "prompt-ids", "top_k", "surrogate"],
)
def test_out_of_range_requests_are_counted_as_rejected(server, auth, read_metrics, body):
    before = read_metrics()
    if body.get("stop") == "\udfff":
        resp = httpx.post(
            f"{server.url}{COMPLETIONS}",
            content=r'{"prompt": "hi", "stop": "\udfff"}',
            headers={**auth, "Content-Type": "application/json"},
        )
    else:
        resp = httpx.post(f"{server.url}{COMPLETIONS}", json=body, headers=auth)
    assert resp.status_code == 400, resp.text
    after = read_metrics()
    assert after["minisgl_requests_rejected_total"] == before["minisgl_requests_rejected_total"] + 1
    # nothing was left pending: no request counted as aborted for it
    aborted = 'minisgl_requests_total{finish_reason="abort"}'
    assert after[aborted] == before[aborted]


def test_tiny_temperature_answers_like_greedy_text(server, auth):
    body = {"prompt": "hello", "temperature": 1e-320, "max_tokens": 4, "ignore_eos": True}
    resp = httpx.post(f"{server.url}{COMPLETIONS}", json=body, headers=auth)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 4


# ------------------------------------------------------------------------ the API key


def _serve_args(argv: list[str]) -> argparse.Namespace:
    from minisgl_core.server.cli import add_server_commands

    parser = argparse.ArgumentParser()
    add_server_commands(parser.add_subparsers())
    return parser.parse_args(argv)


def test_api_key_is_not_in_plugin_options(monkeypatch):
    from minisgl_core.server.cli import _plain_options

    monkeypatch.delenv("MINISGL_API_KEY", raising=False)
    args = _serve_args(["serve", "--model", "m", "--api-key", "s3cret"])
    assert args.api_key == "s3cret"
    assert "s3cret" not in repr(_plain_options(args))
    monkeypatch.setenv("MINISGL_API_KEY", "from-env")
    assert _serve_args(["serve", "--model", "m"]).api_key == "from-env"


def test_workers_see_no_api_key(server, auth):
    """Only the API server checks the key: the workers' command lines lack it."""
    key = auth["Authorization"].removeprefix("Bearer ").encode()
    workers = server.children()
    assert workers
    for pid in workers:
        assert key not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_api_key_from_the_environment_reaches_no_worker(start_server, model_dir, engine_args):
    key = "env-only-key-7f3a"
    live = start_server(["--model", str(model_dir), *engine_args], env={"MINISGL_API_KEY": key})
    try:
        assert httpx.get(f"{live.url}/v1/models").status_code == 401
        ok = httpx.get(f"{live.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200
        for pid in live.children():
            assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
            assert key.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        assert key.encode() not in Path(f"/proc/{live.proc.pid}/cmdline").read_bytes()
    finally:
        live.proc.terminate()
        live.wait_exit()
