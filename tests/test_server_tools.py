"""tools/_server.sh, which the GPU-machine scripts that start a server source: a call without the
server's packages stops at once naming the fix, and a server that dies at start ends the wait at
once (a device call once spent its budget waiting 240 s for each of two dead servers)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

HELPER = Path(__file__).resolve().parents[1] / "tools" / "_server.sh"


def bash(script: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"source {HELPER}; {script}"], capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_missing_packages_stop_the_script_naming_the_fix(tmp_path) -> None:
    no_fastapi = tmp_path / "python"
    no_fastapi.write_text("#!/bin/sh\nexit 1\n")  # every import fails, as in a call without wheels
    no_fastapi.chmod(0o755)
    out = bash(f"need_server_deps {no_fastapi}; echo still-running")
    assert out.returncode == 2
    assert "still-running" not in out.stdout
    assert "prelude.sh" in out.stderr and "wheels" in out.stderr
    ok = bash(f"need_server_deps {sys.executable} && echo fine")
    assert ok.returncode == 0 and "fine" in ok.stdout, ok.stderr


def test_a_server_that_exits_ends_the_wait_at_once(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("usage: minisgl ...\nminisgl: error: unrecognized arguments: --bogus\n")
    started = time.monotonic()
    out = bash(f"sleep 0.3 & pid=$!; wait_server http://127.0.0.1:{free_port()}/health 60 $pid {log}")
    assert out.returncode == 1
    assert time.monotonic() - started < 15  # not the 60 s it was given
    assert "exited before it answered" in out.stderr
    assert "unrecognized arguments: --bogus" in out.stderr  # the log's end, printed


def test_the_wait_ends_when_the_server_answers(tmp_path) -> None:
    port = free_port()
    out = bash(
        f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path} >/dev/null 2>&1 & pid=$!; "
        f"wait_server http://127.0.0.1:{port}/ 30 $pid /dev/null; rc=$?; kill $pid; exit $rc"
    )
    assert out.returncode == 0, out.stderr


def test_a_server_that_never_answers_times_out(tmp_path) -> None:
    started = time.monotonic()
    out = bash(
        f"sleep 30 & pid=$!; wait_server http://127.0.0.1:{free_port()}/ 2 $pid /dev/null; rc=$?; kill $pid; exit $rc"
    )
    assert out.returncode == 1
    assert time.monotonic() - started < 15
    assert "no answer from" in out.stderr
