"""``minisgl serve`` as a child process, for tests and hand-run checks: start it on a free loopback
port with its log in a file, wait for the ready line, watch its worker processes in /proc, stop it.

The server tests' fixtures (``tests/server/conftest.py``) and the GPU checks
(``tests/server/device_*_check.py``) start servers through :class:`LiveServer`, one way.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

#: the launcher's ready line; the URL has the port the server bound (``--port 0`` picks a free one)
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
    """``python -m minisgl_core COMMAND --port 0 ARGS`` started now, in its own process group, with a
    private TMPDIR under ``workdir`` and its output in ``log_path`` (default ``workdir/server.log``)."""

    def __init__(
        self,
        workdir: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        command: str = "serve",
        log_path: Path | None = None,
    ) -> None:
        self.workdir = workdir
        self.tmpdir = workdir / "tmp"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path or workdir / "server.log"
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
