"""The chat shell answers a scripted conversation, keeping history until /reset."""

from __future__ import annotations

import os
import subprocess
import sys

from minisgl_core.sampling import SamplingParams
from minisgl_core.tokenizer.load import apply_chat_template

SCRIPT = "hello there\nand what about the sea?\n/reset\nhello there\n/exit\nnever read\n"
#: the same conversation ended by end-of-input (Ctrl-D) instead of /exit
SCRIPT_EOF = SCRIPT.split("/exit")[0]
MAX_TOKENS = 4


def expected_transcript(llm, script: str = SCRIPT) -> str:
    """What the shell must print, with each reply computed offline from the same history."""

    def reply(history: list[dict[str, str]]) -> str:
        ids = apply_chat_template(llm.tokenizer, history)
        return llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))[0].text

    lines, history = [], []
    for line in script.splitlines():
        lines.append(f"you> {line}")
        if line == "/exit":
            break
        if line == "/reset":
            history = []
            lines.append("(history cleared)")
            continue
        history.append({"role": "user", "content": line})
        answer = reply(history)
        history.append({"role": "assistant", "content": answer})
        lines.append(f"assistant> {answer}")
    return "\n".join(lines) + "\n"


def run_shell(args: list[str], tmp_path, script: str = SCRIPT) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "minisgl_core",
            "shell",
            "--temperature",
            "0",
            "--max-tokens",
            str(MAX_TOKENS),
            *args,
        ],
        input=script,
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )


def test_shell_starts_its_own_server(model_dir, engine_args, llm, tmp_path):
    result = run_shell(["--model", str(model_dir), *engine_args], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_transcript(llm)
    # while loading it says what it is doing (on stderr: stdout is the conversation)
    said = result.stderr.splitlines()
    loading = next(
        i for i, line in enumerate(said) if line.startswith(f"minisgl shell: loading {model_dir} ")
    )
    assert any(line.startswith(f"minisgl shell: {model_dir.name} ready in ") for line in said[loading + 1 :])
    assert list(tmp_path.glob("minisgl-*")) == []  # its private sockets are gone


def test_shell_attaches_to_a_running_server_and_stops_at_end_of_input(server, llm, tmp_path):
    result = run_shell(["--url", server.url, "--api-key", "test-key"], tmp_path, SCRIPT_EOF)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected_transcript(llm, SCRIPT_EOF)
