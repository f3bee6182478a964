"""Scale-out: two ``minisgl serve`` workers behind the SGLang Model Gateway (``sglang-router``).

The gateway's worker checks (health, model info) must pass and its requests must be served: the
greedy answers through the router equal the offline engine's, and both workers take a share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

pytest.importorskip("sglang_router", reason="sglang-router is Linux x86-64 only")

PROMPTS = ["The quick brown fox", "Once upon a time", "In a hole in the ground", "It was a dark night"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def router(start_server, model_dir, engine_args, tmp_path_factory):
    # both start at once (their start-ups overlap), then each must be ready
    workers = [start_server(["--model", str(model_dir), *engine_args], wait=False) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("router") / "router.log"
    # fmt: off
    cmd = [sys.executable, "-m", "sglang_router.launch_router",
           "--worker-urls", *[w.url for w in workers],
           "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
           "--health-check-interval-secs", "2", "--log-level", "warn"]
    # fmt: on
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"{url}/readiness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"router not ready:\n{log_path.read_text()}"
            time.sleep(0.3)
        yield url, workers
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def finished_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("minisgl_requests_total{")
    )


def test_requests_are_served_through_the_router(router, llm, model_name):
    from minisgl_core.sampling import SamplingParams

    url, workers = router
    before = [finished_requests(w.url) for w in workers]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    expected = [o.text for o in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8))]
    got = [
        client.completions.create(model=model_name, prompt=p, max_tokens=8, temperature=0).choices[0].text
        for p in PROMPTS
    ]
    assert got == expected
    stream = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    served = [finished_requests(w.url) - b for w, b in zip(workers, before, strict=True)]
    assert all(n >= 2 for n in served), served  # round robin: both workers take a share
