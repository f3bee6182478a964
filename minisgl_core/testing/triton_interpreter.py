"""Run a test file's own ``__main__`` under Triton's interpreter, in a child process:
``TRITON_INTERPRET`` must be set before Triton is imported, so a kernel test on the CPU re-runs its
file with the variable set and checks what it prints."""

from __future__ import annotations

import os
import subprocess
import sys


def run_under_interpreter(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """``python script *args`` with ``TRITON_INTERPRET=1`` (and ``env``); its stdout, or an
    assertion error carrying the ends of its output when it exits non-zero."""
    child_env = {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, script, *args], env=child_env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
