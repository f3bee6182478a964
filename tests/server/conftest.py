"""Live servers for the server tests: real ``minisgl serve`` processes on free loopback ports.

One session-wide server (tiny Qwen3 model, API key) serves most tests; tests that need their own
(TP, signals, crashes) start one with ``start_server``. Each server gets a private TMPDIR, so a
test can check that its socket directory is gone after it stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing.live_server import LiveServer

API_KEY = "test-key"
#: small limits keep start-up and every request cheap (2048 is the tiny model's own context)
# fmt: off
ENGINE_ARGS = ["--max-context-len", "2048", "--num-kv-tokens", "16384", "--max-running-requests", "16",
               "--device", os.environ.get("MINISGL_TEST_DEVICE", "cpu"), "--attn", "torch"]
# fmt: on
# (MINISGL_TEST_DEVICE=cuda: the GPU machine runs the TP server tests on NCCL, tools/device_tp_tests.sh)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("model") / "tiny-qwen3", "Qwen3ForCausalLM", seed=1)


def stop_all(servers: list[LiveServer]) -> None:
    """SIGTERM to every server still up first, then the waits: they drain and exit side by side
    (one after the other, those left at the end of CI's session took 13 s: its last teardown)."""
    for server in servers:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    for server in servers:
        try:
            server.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        server.kill_all()


@pytest.fixture(scope="session")
def launched_servers():
    """The servers ``start_server`` started: (per module, kept for the session); all stopped at the
    session's end. (Its own fixture: a module may override ``start_server`` with a narrower scope.)"""
    servers: tuple[list[LiveServer], list[LiveServer]] = ([], [])
    yield servers
    stop_all(servers[0] + servers[1])


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory, launched_servers):
    """start_server(args, env=None) -> a ready LiveServer, stopped when the test module that started
    it ends (``keep=True``: at the session's end, for the session's shared server)."""

    def start(
        args: list[str],
        env: dict[str, str] | None = None,
        wait: bool = True,
        command: str = "serve",
        keep: bool = False,
    ) -> LiveServer:
        server = LiveServer(tmp_path_factory.mktemp("server"), args, env, command)
        launched_servers[1 if keep else 0].append(server)
        if wait:
            server.wait_ready()
        return server

    return start


@pytest.fixture(scope="module", autouse=True)
def _stop_the_modules_servers(launched_servers):
    """Each module's own servers get SIGTERM when it ends: left up to the session's end, CI's
    servers (four processes each, 1.4 GB for the real model's) held 12 GB of a 24 GB machine by a
    third of the run, and the page cache they squeezed out made every later process start read
    torch from disk. Not waited for here (an idle server takes seconds to exit, which the next
    module's tests overlap); those that exited are cleaned up at the next module's end, the rest at
    the session's."""
    servers = launched_servers[0]
    before = len(servers)
    yield
    for server in servers[before:]:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
    for server in [s for s in servers if s.proc.poll() is not None]:
        server.kill_all()  # (its children, if any outlived it)
        servers.remove(server)


@pytest.fixture(scope="session")
def server(start_server, model_dir: Path) -> LiveServer:
    return start_server(["--model", str(model_dir), "--api-key", API_KEY, *ENGINE_ARGS], keep=True)


@pytest.fixture(scope="session")
def client(server: LiveServer):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_client(server: LiveServer):
    import openai

    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def llm(model_dir: Path):
    """The offline engine with the server's settings: the reference for greedy outputs."""
    from minisgl_core.llm import LLM

    return LLM(
        model_dir,
        device="cpu",
        attn="torch",
        max_context_len=2048,
        num_kv_tokens=16384,
        max_running_requests=64,
    )


@pytest.fixture(scope="session")
def model_name(model_dir: Path) -> str:
    return model_dir.name


def metrics(url: str) -> dict[str, float]:
    """/metrics as {sample name with labels: value}."""
    import httpx

    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture(scope="session")
def grammar_backend() -> None:
    """Skip (before any server starts) unless a grammar backend plugin is installed: without one,
    response_format, text.format and forced tool calls cannot be enforced."""
    from minisgl_core.plugins import Plugins

    if not Plugins.load().registry.get("grammars"):
        pytest.skip(
            "no grammar backend installed: structured output and forced tool calls cannot be enforced"
        )


@pytest.fixture(scope="session")
def engine_args() -> list[str]:
    return list(ENGINE_ARGS)


@pytest.fixture(scope="session")
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def read_metrics(server: LiveServer):
    return lambda: metrics(server.url)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """No test of this folder may hang CI: give each a generous timeout of its own."""
    for item in items:
        if "tests/server" in str(item.fspath) and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(240))


class FakeSocket:
    """The API server's socket to the tokenizer worker, where the test plays the engine."""

    closed = False


@pytest.fixture
def sent(monkeypatch) -> list:
    """What the API server sends the tokenizer worker, in order (``ServerState`` with a
    :class:`FakeSocket`: nothing goes out)."""
    from minisgl_core.server import state as state_module

    messages: list = []
    monkeypatch.setattr(state_module, "send", lambda socket, message: messages.append(message))
    return messages
