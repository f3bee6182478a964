"""A failing child stops the server with a non-zero exit and the child's error, leaving nothing behind."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from minisgl_core.testing.cli_runner import run_cli

PLUGIN = """
from minisgl_core.api import hookimpl
from minisgl_plugin_torch.backend import TorchAttentionBackend

MINISGL_API = "2.0"


class CrashBackend(TorchAttentionBackend):
    def prepare_metadata(self, batch):
        if not batch.is_prefill:  # past start-up's warm-up (a prefill): at the first decode step
            raise RuntimeError("the crash backend exploded on purpose")
        super().prepare_metadata(batch)


@hookimpl
def minisgl_register_attention_backends(register):
    register("crash", "minisgl_crash_attn:CrashBackend")
"""


#: importable in the launcher only, as if the plugin were installed on one side and not the other
LOPSIDED_PLUGIN = """
import multiprocessing

if multiprocessing.current_process().name != "MainProcess":
    raise ImportError("not installed in this process")
MINISGL_API = "2.0"
"""


def install_fake_plugin(root: Path, name: str, source: str) -> dict[str, str]:
    """A real installed-looking plugin (a dist-info with an entry point); the env that makes it visible."""
    module = f"minisgl_{name}"
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: minisgl-{name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[minisgl.plugins]\n{name} = {module}\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


def test_scheduler_crash_mid_serving_exits_nonzero(start_server, model_dir, engine_args, tmp_path):
    env = install_fake_plugin(tmp_path, "crash_attn", PLUGIN)
    server = start_server(["--model", str(model_dir), *engine_args, "--attn", "crash"], env=env)
    assert "crash_attn 0.1.0" in server.log()  # the banner lists it: every process loaded it
    children = server.children()
    named = "attention backend 'crash' (plugin 'crash_attn', minisgl-crash_attn 0.1.0) failed in "
    cause = "RuntimeError: the crash backend exploded on purpose"
    try:
        resp = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=30)
        assert resp.status_code in (500, 503)
        # the plugin and the exception's class, not just the process; the exception's text stays
        # in the log (the client got it, and gloo's C++ build paths with a peer's death)
        message = resp.json()["error"]["message"]
        assert message.startswith(
            "the engine failed: the scheduler process raised PluginFailure: " + named
        ), message
        assert message.endswith(".prepare_metadata with RuntimeError; see the server log"), message
        assert "exploded" not in message, message
    except httpx.TransportError:
        pass  # the server may already be going down
    assert server.wait_exit(30) != 0
    log = server.log()
    assert "the scheduler 0 process failed" in log
    assert cause in log and named in log  # the child's traceback
    server.assert_all_stopped(children)


def _failed_serve(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    """``minisgl serve ARGS`` that a worker refuses during start-up, as a forked CLI run (its launcher's
    imports paid once, its workers spawned as a server's are) with a private TMPDIR: its output,
    after checking it exited 2 and left no socket directory behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = run_cli(["serve", "--port", "0", *args], env={**os.environ, **(env or {}), "TMPDIR": str(tmp)})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2, log  # a usage error, said as the command line's own
    assert sorted(tmp.glob("minisgl-*")) == [], log
    return log


def test_a_kv_pool_past_the_memory_names_the_flag_and_the_bytes(model_dir, engine_args, tmp_path):
    """Refused in the scheduler process, said with the command line's flags (not the fields)."""
    args = [*engine_args, "--max-running-requests", str(10**12)]
    log = _failed_serve(["--model", str(model_dir), *args], tmp_path)
    assert (
        "minisgl: error: --max-running-requests=1000000000000 (request rows of --max-context-len=2048 tokens) "
        in log
    )
    assert "asks for 8208000000008208 bytes (7.3 PiB), more than the " in log
    assert "free on cpu: lower --max-running-requests or --max-context-len" in log
    assert "Traceback" not in log and "minisgl ready" not in log


def test_start_up_failure_exits_nonzero_with_the_error(model_dir, engine_args, tmp_path):
    # a KV pool larger than the memory free once the weights are in: only the scheduler process
    # can tell (a bad plugin name, or a backend this machine cannot run, the command line refuses
    # before anything starts: test_config_errors); the last --num-kv-tokens wins
    too_big = ["--num-kv-tokens", str(10**11)]
    log = _failed_serve(["--model", str(model_dir), *engine_args, *too_big], tmp_path)
    assert "minisgl: error: --num-kv-tokens=" in log and "lower --num-kv-tokens" in log
    assert "Traceback" not in log  # a refused setting is its message, which names the fix
    assert "minisgl ready" not in log


def test_a_process_seeing_other_plugins_stops_the_server(model_dir, engine_args, tmp_path):
    env = install_fake_plugin(tmp_path, "lopsided", LOPSIDED_PLUGIN)
    log = _failed_serve(["--model", str(model_dir), *engine_args], tmp_path, env)
    assert "sees a different set of plugins than the launcher" in log
    # what differs, plugin by plugin (the launcher hands its view to every process)
    # and why, in that process (the ImportError's text was nowhere)
    assert (
        "plugin 'lopsided' has status ok in the launcher, failed here: import failed: ImportError: "
        "not installed in this process" in log
    ), log[-2000:]
