"""The command-line tests' runner (minisgl_core.testing.cli_runner): a forked child answers as a
fresh ``python -m minisgl_core`` does — exit code, stdout, stderr, environment, working
directory, stdin — and what a fork cannot honour goes to a real interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

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
    assert "argument --log-level: must be one of" in results[2].stderr
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
