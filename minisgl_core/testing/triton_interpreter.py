"""Run a test file's own ``__main__`` under Triton's interpreter, in a child process:
``TRITON_INTERPRET`` must be set before Triton is imported, so a kernel test on the CPU re-runs its
file with the variable set and checks what it prints."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Callable


def tolerate_one_element_scalars() -> None:
    """Triton 3.6's interpreter holds a kernel's scalars as one-element arrays and turns one into a
    loop bound or an index with ``int()``, which NumPy 2.4 refuses for an array of one dimension
    ("only 0-dimensional arrays can be converted to Python scalars"): have it take the element with
    ``.item()`` instead, the same number. Call it before a kernel runs under the interpreter
    (:func:`run_under_interpreter`'s child does); nothing happens where Triton's interpreter has no
    such hook."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "takes_item", False):
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patched.takes_item = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


#: the child's start: :func:`tolerate_one_element_scalars`, then the script as ``__main__`` with
#: its own arguments and its folder first on the path, as ``python script *args`` runs it
_CHILD = """import os, runpy, sys
from minisgl_core.testing.triton_interpreter import tolerate_one_element_scalars
tolerate_one_element_scalars()
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_under_interpreter(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """``python script *args`` with ``TRITON_INTERPRET=1`` (and ``env``), after
    :func:`tolerate_one_element_scalars`; its stdout, or an assertion error carrying the ends of its
    output when it exits non-zero."""
    child_env = {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, script, *args],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


#: the lines that start a check's part of :func:`run_checks`' output, and its traceback
_SECTION, _FAILED = "== check ", "== raised"


class CheckOutputs:
    """What each check of :func:`run_checks_under_interpreter` printed."""

    def __init__(self, outputs: dict[str, str], failures: dict[str, str]) -> None:
        self.outputs, self.failures = outputs, failures

    def __getitem__(self, name: str) -> str:
        """Check ``name``'s output; an AssertionError carrying its traceback if it raised."""
        if name in self.failures:
            raise AssertionError(f"check {name} raised:\n{self.outputs[name]}\n{self.failures[name]}")
        return self.outputs[name]


def run_checks_under_interpreter(
    script: str, names: list[str], *args: str, env: dict[str, str] | None = None
) -> CheckOutputs:
    """Several of ``script``'s checks in one child under the interpreter (one start-up, torch and
    Triton imported once, not once a check): ``python script checks NAME,NAME,... *args``, whose
    ``__main__`` calls :func:`run_checks`. A check that raises does not stop the ones after it.
    Only for checks that leave nothing behind that the next could see (no patched module, no
    changed environment, no configured process)."""
    out = run_under_interpreter(script, "checks", ",".join(names), *args, env=env)
    outputs: dict[str, list[str]] = {}
    failures: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith(_SECTION):
            name = line[len(_SECTION) :]
            current = outputs[name] = []
        elif line == _FAILED and outputs:
            current = failures[name] = []
        else:
            current.append(line)
    missing = [name for name in names if name not in outputs]
    assert not missing, f"checks {missing} did not run:\n{out[-3000:]}"
    return CheckOutputs(
        {name: "\n".join(lines) for name, lines in outputs.items()},
        {name: "\n".join(lines) for name, lines in failures.items()},
    )


def run_checks(checks: dict[str, Callable[[], object]], names: str) -> None:
    """The child's side of :func:`run_checks_under_interpreter`: the checks named (comma-separated),
    in order, each after its header line, a failing one's traceback after another."""
    for name in names.split(","):
        print(_SECTION + name, flush=True)
        try:
            checks[name]()
        except Exception:
            print(_FAILED, flush=True)
            traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
