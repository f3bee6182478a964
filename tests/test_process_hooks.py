"""The non-registration hooks, end to end: a real plugin distribution adds a CLI option and records
``minisgl_process_start`` / ``minisgl_process_stop`` in every process of a real ``minisgl serve``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from minisgl_core.testing import make_model_dir

PLUGIN = """
import json, os
from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


def _record(event, ctx):
    line = json.dumps({"event": event, "role": ctx.role, "tp_rank": ctx.tp_rank, "tp_size": ctx.tp_size,
                       "tag": ctx.options.get("hookcheck_tag"), "pid": os.getpid()})
    with open(os.environ["HOOKCHECK_LOG"], "a") as log:
        log.write(line + "\\n")


@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--hookcheck-tag", default="unset")


@hookimpl
def minisgl_process_start(ctx):
    _record("start", ctx)


@hookimpl
def minisgl_process_stop(ctx):
    _record("stop", ctx)
"""
READY = re.compile(r"minisgl ready in .* url=(http://\S+)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("hookcheck") / "src"
    (src / "minisgl_hookcheck").mkdir(parents=True)
    (src / "minisgl_hookcheck" / "__init__.py").write_text(PLUGIN)
    (src / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "minisgl-hookcheck"
        version = "0.1.0"
        dependencies = ["minisgl-core"]
        [project.entry-points."minisgl.plugins"]
        hookcheck = "minisgl_hookcheck"
        [tool.setuptools]
        packages = ["minisgl_hookcheck"]
    """)
    )
    target = src.parent / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(src)], check=True)  # fmt: skip
    return target


def test_cli_option_and_process_hooks_reach_every_process(site: Path, tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "model", "Qwen3ForCausalLM")
    events = tmp_path / "events.jsonl"
    log_path = tmp_path / "server.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "HOOKCHECK_LOG": str(events),
        "PYTHONUNBUFFERED": "1",
    }
    args = [
        "--port",
        "0",
        "--model",
        str(model_dir),
        "--device",
        "cpu",
        "--attn",
        "torch",
        "--num-kv-tokens",
        "2048",
        "--max-context-len",
        "256",
        "--hookcheck-tag",
        "blue",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "minisgl_core", "serve", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while not READY.search(log_path.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    records = [json.loads(line) for line in events.read_text().splitlines()]
    started = {(r["role"], r["pid"]) for r in records if r["event"] == "start"}
    stopped = {(r["role"], r["pid"]) for r in records if r["event"] == "stop"}
    assert {role for role, _ in started} == {"api", "tokenizer", "detokenizer", "scheduler"}, records
    assert stopped == started, "every process that started must run its stop hook on a clean shutdown"
    assert {r["tag"] for r in records} == {"blue"}, "the plugin's CLI option must reach every process"
    assert all(r["tp_size"] == 1 for r in records)
    assert [r["tp_rank"] for r in records if r["role"] == "scheduler"] == [0, 0]
