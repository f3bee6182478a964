"""The command-line tests' runner (minisgl_core.testing.cli_runner): a forked child answers as a
fresh ``python -m minisgl_core`` does — exit code, stdout, stderr, environment, working
directory, stdin — and what a fork cannot honour goes to a real interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from minisgl_core.testing import cli_runner
from minisgl_core.testing.cli_runner import run_cli


def fresh(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("stdin", None if "input" in kwargs else subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "minisgl_core", *args], capture_output=True, text=True,
                          timeout=120, **kwargs)  # fmt: skip


def same(forked: subprocess.CompletedProcess, started: subprocess.CompletedProcess) -> None:
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        started.returncode,
        started.stdout,
        started.stderr,
    )


def test_a_forked_run_answers_as_a_fresh_interpreter(tmp_path):
    env = {**os.environ, "MINISGL_LOG_LEVEL": "bogus"}  # read when the CLI runs, not at import
    cases = [
        (["--help"], {}),  # exit 0 and stdout
        (["serve", "--port", "0", "--api-key", "", "--model", str(tmp_path)], {}),  # exit 2, one line
        (["plugins"], {"env": env}),
        # a relative --model is read against the working directory (an empty folder there)
        (["generate", "hi", "--model", "empty", "--device", "cpu"], {"cwd": tmp_path}),
        (["shell", "--url", "notaurl"], {"input": "hi\n"}),
    ]
    (tmp_path / "empty").mkdir()
    results = []
    for args, kwargs in cases:
        results.append(run_cli(args, **kwargs))
        same(results[-1], fresh(args, **kwargs))
    assert results[0].returncode == 0 and results[0].stdout.startswith("usage: minisgl")
    assert "argument --log-level: its default from MINISGL_LOG_LEVEL must be one of" in results[2].stderr
    assert "--model empty: the directory has no config.json" in results[3].stderr
    assert results[4].returncode == 2 and "notaurl" in results[4].stderr


def test_what_the_interpreter_reads_at_start_goes_to_a_real_one(monkeypatch):
    """PYTHONIOENCODING is read when the interpreter starts: a fork would keep the helper's."""
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(cli_runner.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    env = {**os.environ, "PYTHONIOENCODING": "ascii:backslashreplace"}
    args = ["serve", "--port", "0", "--api-key", "", "--model", "caf\u00e9"]
    forked = run_cli(args, env=env)
    assert len(calls) == 1
    same(forked, fresh(args, env=env))
    # a PYTHONPATH that only adds folders in front stays in the fork
    calls.clear()
    path = os.pathsep.join(["/nowhere", os.environ.get("PYTHONPATH", "")])
    assert run_cli(["--help"], env={**os.environ, "PYTHONPATH": path}).returncode == 0
    assert calls == []


def test_a_timeout_kills_the_processes_the_child_started(tmp_path):
    """A CLI run that started a process of its own (which inherits its stdout and stderr) and then
    hangs: the timeout kills both, so the call raises at once instead of draining the pipes until
    that process ends."""
    pid_file = tmp_path / "grandchild.pid"
    (tmp_path / "minisgl_test_hang.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(90)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(90)\n"
    )
    info = tmp_path / "minisgl_test_hang-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: minisgl-test-hang\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[minisgl.plugins]\ntest_hang = minisgl_test_hang\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p is not None)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(["plugins"], env={**os.environ, "PYTHONPATH": path}, timeout=5)
    assert time.monotonic() - start < 30
    grandchild = int(pid_file.read_text())
    for _ in range(100):  # (killed at once; reaped by init, which may take a moment)
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"process {grandchild}, started by the timed-out run, is still alive")
