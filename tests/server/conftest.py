"""Live servers for the server tests: real ``minisgl serve`` processes on free loopback ports.

One session-wide server (tiny Qwen3 model, API key) serves most tests; tests that need their own
(TP, signals, crashes) start one with ``start_server``. Each server gets a private TMPDIR, so a
test can check that its socket directory is gone after it stops.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minisgl_core.demo.factories import make_model_dir

API_KEY = "test-key"
#: small limits keep start-up and every request cheap (2048 is the tiny model's own context)
# fmt: off
ENGINE_ARGS = ["--max-context-len", "2048", "--num-kv-tokens", "16384", "--max-running-requests", "16",
               "--device", "cpu", "--attn", "torch"]
# fmt: on
READY = re.compile(r"minisgl ready in .* url=(http://\S+)")
START_TIMEOUT_S = 180


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def is_running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may not reap orphans)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class LiveServer:
    def __init__(
        self, workdir: Path, args: list[str], env: dict[str, str] | None = None, command: str = "serve"
    ) -> None:
        self.workdir = workdir
        self.tmpdir = workdir / "tmp"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "server.log"
        full_env = {**os.environ, "TMPDIR": str(self.tmpdir), "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "minisgl_core", command, "--port", "0", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,  # so a failed test can still kill the whole group
            )
        self.url = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = READY.search(self.log())
            if match:
                self.url = match.group(1)
                return self.url
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode} before ready:\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout}s:\n{self.log()}")

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert time.monotonic() < deadline, f"{text!r} not in the log:\n{self.log()}"
            time.sleep(0.1)

    def wait_exit(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server still running after {timeout}s:\n{self.log()}") from None

    def children(self) -> list[int]:
        return child_pids(self.proc.pid)

    @staticmethod
    def running(pids: list[int]) -> list[int]:
        return [pid for pid in pids if is_running(pid)]

    @staticmethod
    def cpu_seconds(pids: list[int]) -> float:
        return sum(cpu_seconds(pid) for pid in pids)

    def assert_all_stopped(self, pids: list[int], timeout: float = 5.0) -> None:
        """The given (former) children are gone and the private socket directory was removed."""
        deadline = time.monotonic() + timeout
        while self.running(pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.running(pids) == [], self.log()
        assert self.socket_dirs() == [], self.log()

    def socket_dirs(self) -> list[Path]:
        return sorted(self.tmpdir.glob("minisgl-*"))

    def kill_all(self) -> None:
        """Last-resort clean-up of the whole process group."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("model") / "tiny-qwen3", "Qwen3ForCausalLM", seed=1)


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory):
    """start_server(args, env=None) -> a ready LiveServer (stopped and cleaned up at session end)."""
    servers: list[LiveServer] = []

    def start(
        args: list[str], env: dict[str, str] | None = None, wait: bool = True, command: str = "serve"
    ) -> LiveServer:
        server = LiveServer(tmp_path_factory.mktemp("server"), args, env, command)
        servers.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        server.kill_all()


@pytest.fixture(scope="session")
def server(start_server, model_dir: Path) -> LiveServer:
    return start_server(["--model", str(model_dir), "--api-key", API_KEY, *ENGINE_ARGS])


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
