"""tools/_server.sh, which the GPU-machine scripts that start a server source: a call without the
server's packages stops at once naming the fix, and a server that dies at start ends the wait at
once (a device call once spent its budget waiting 240 s for each of two dead servers)."""

from __future__ import annotations

import json
import os
import shutil
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


ROOT = HELPER.parents[1]


def test_serve_ab_serves_the_earlier_core_beside_this_one(tmp_path) -> None:
    """tools/device_serve_ab.sh on the CPU: each run's server imports its own core (the earlier
    tree's first on the path), both runs measured by the same client; plugins that differ from
    the earlier tree's stop it at once (the installed plugins serve both)."""
    from minisgl_core.demo.factories import make_model_dir

    before = tmp_path / "before"
    skip = shutil.ignore_patterns("*.egg-info", "__pycache__")
    for part in ("minisgl_core", "plugins"):
        shutil.copytree(ROOT / part, before / part, ignore=skip)
    model = make_model_dir(tmp_path / "model", "Qwen3ForCausalLM", seed=1)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3: this interpreter
        "BEFORE": str(before), "MODEL": str(model), "OUT": str(tmp_path / "out"), "PORT": str(free_port()),
        "SERVER_FLAGS": "--device cpu --attn torch --max-context-len 1024 --num-kv-tokens 4096",
        "WORKLOAD": "--workload shared-prefix --groups 2 --prompts-per-group 2 --prefix-len 48 "
                    "--question-len 8 --output-len 4",
    }  # fmt: skip
    script = ROOT / "tools" / "device_serve_ab.sh"
    run = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"core from {before}/minisgl_core/__init__.py" in run.stdout
    assert f"core from {ROOT}/minisgl_core/__init__.py" in run.stdout
    rows = [json.loads(line) for line in (tmp_path / "out" / "serve.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == ["before rate all", "after rate all"]
    assert all(r["output_tokens"] == 4 * 4 and r["prompt_tokens_served"] == 4 * 56 for r in rows)
    (before / "plugins" / "extra.txt").write_text("not in this tree\n")
    differ = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert differ.returncode == 2 and "plugins differ" in differ.stderr
