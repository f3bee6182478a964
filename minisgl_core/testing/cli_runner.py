"""``run_cli(args)``: ``python -m minisgl_core ARGS`` as a test sees it, without paying the imports.

A test of the command line wants a real process: its exit code, what reaches file descriptors 1
and 2 (logging included), its own ``sys.argv``, environment and working directory. Started
fresh, such a process spends 2.5 s importing torch and transformers and 1.3 s tearing them down
again for a CLI error of 0.1 s, and the suite starts a few hundred. Here one helper process per
test process (a pytest-xdist worker has its own) imports them once; each call forks it, and the
child — set up as ``python -m`` would be — runs ``minisgl_core.__main__`` and ends as the
interpreter does (``SystemExit``'s code, a traceback and 1, the joins of threads, ``atexit``;
only the modules' teardown is skipped). The call returns what ``subprocess.run`` would, and
waits, as it does, until every process holding the child's stdout or stderr has let go. The
child leads a process group of its own, and a ``timeout`` kills that group: the processes it
started go with it (``subprocess.run`` kills only its child and then waits for the pipes).

What only a new interpreter can honour falls back to ``subprocess.run``: an environment whose
import-time variables (``PYTHON*``, ``TRITON_*``, locale, thread counts...) differ from the
helper's, except a ``PYTHONPATH`` that only puts folders before the helper's (a test's plugins
installed into a folder of its own): the child puts them where the interpreter would, after
``sys.path[0]``. A CLI process that must be watched while it runs (a server) is no call for this.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

#: variables read while the interpreter starts or a module is imported, not when the CLI runs
IMPORT_TIME_PREFIXES = ("PYTHON", "TRITON", "TORCH", "OMP_", "MKL_", "CUDA", "HF_", "TRANSFORMERS",
                        "TOKENIZERS", "LANG", "LC_")  # fmt: skip
#: what the helper imports before its first fork (what every CLI command imports first)
PRELOAD = (
    "torch",
    "transformers",
    "minisgl_core.cli",
    "minisgl_core.server.cli",
    "minisgl_core.server.launcher",
    "minisgl_core.bench.cli",
)


def _import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k != "PYTHONPATH"}


def _path_before(env: Mapping[str, str], helper_env: Mapping[str, str]) -> list[str] | None:
    """The ``PYTHONPATH`` entries ``env`` puts before the helper's own, or None if it changes
    them otherwise."""
    ours, theirs = env.get("PYTHONPATH"), helper_env.get("PYTHONPATH")
    if ours == theirs:
        return []
    entries = ours.split(os.pathsep) if ours else []
    kept = theirs.split(os.pathsep) if theirs else []
    if len(entries) < len(kept) or entries[len(entries) - len(kept) :] != kept:
        return None
    return entries[: len(entries) - len(kept)]


class _Helper:
    """The forking helper process: a JSON request per line on its stdin, a JSON reply per line on
    its stdout (the child's pid, then its exit status)."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minisgl_core.testing.cli_runner"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, cwd=os.getcwd(),
        )  # fmt: skip
        self.lock = threading.Lock()

    def reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the CLI helper process exited ({self.proc.wait()})")
        return json.loads(line)

    def run(self, request: dict, timeout: float | None) -> int:
        with self.lock:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            pid = self.reply()["pid"]
            timed_out = threading.Event()
            timer = threading.Timer(timeout, _kill, (pid, timed_out)) if timeout else None
            if timer:
                timer.start()
            try:
                status = self.reply()["status"]
            finally:
                if timer:
                    timer.cancel()
            if timed_out.is_set():
                raise subprocess.TimeoutExpired(["minisgl", *request["argv"]], timeout)
            return status

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.stdout.close()


def _kill(pid: int, timed_out: threading.Event) -> None:
    """The timed-out child's whole process group: a child of its own still holding the pipes
    would keep the helper draining them until it ended."""
    timed_out.set()
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        pass


_helper: _Helper | None = None


def _get_helper() -> _Helper:
    global _helper
    if _helper is None or _helper.proc.poll() is not None:
        _helper = _Helper()
        atexit.register(_helper.close)
    return _helper


def run_cli(
    args: Sequence[str],
    *,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float | None = 120,
    text: bool = True,
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "minisgl_core", *args], capture_output=True, ...)``:
    the same CompletedProcess (stdin is ``input`` or empty, as with ``stdin=DEVNULL``)."""
    argv = [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    helper = _get_helper()
    path_before = _path_before(env, helper.env)
    if path_before is None or _import_time_env(env) != _import_time_env(helper.env):
        return subprocess.run(
            [sys.executable, "-m", "minisgl_core", *argv], input=input, capture_output=True, text=text, env=env,
            cwd=cwd, timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL,
        )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="minisgl-cli-") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
        data = input.encode() if isinstance(input, str) else (input or b"")
        with open(paths["stdin"], "wb") as f:
            f.write(data)
        request = {"argv": argv, "env": env, "cwd": os.path.abspath(cwd or os.getcwd()), "path_before": path_before,
                   **paths}  # fmt: skip
        status = helper.run(request, timeout)
        out, err = (Path(paths[name]).read_bytes() for name in ("stdout", "stderr"))
    if text:
        out, err = out.decode(), err.decode()
    return subprocess.CompletedProcess(["minisgl", *argv], status, out, err)


def _serve() -> dict:
    """The helper's loop; returns (in a child only) the request that child is to run. Replies go
    to a copy of file descriptor 1, which itself points at /dev/null, so nothing an import prints
    can get into them."""
    replies = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    for name in PRELOAD:
        __import__(name)
    buffered = b""
    while True:
        while b"\n" not in buffered:
            chunk = os.read(0, 65536)
            if not chunk:
                raise SystemExit(0)
            buffered += chunk
        line, buffered = buffered.split(b"\n", 1)
        request = json.loads(line)
        pipes = {name: os.pipe() for name in ("stdout", "stderr")}
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)  # a process group of its own: a timeout kills its children with it
            os.close(replies)
            for fd, name in ((1, "stdout"), (2, "stderr")):
                read_end, write_end = pipes[name]
                os.dup2(write_end, fd)
                os.close(read_end)
                os.close(write_end)
            return request
        try:  # (as the child does: the group exists before its pid is known, whichever runs first)
            os.setpgid(pid, pid)
        except (PermissionError, ProcessLookupError):  # it has exec'd or exited already
            pass
        os.write(replies, json.dumps({"pid": pid}).encode() + b"\n")
        for _read_end, write_end in pipes.values():
            os.close(write_end)
        _drain({pipes[name][0]: request[name] for name in pipes})
        _, wait_status = os.waitpid(pid, 0)
        os.write(replies, json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}).encode() + b"\n")


def _drain(ends: dict[int, str]) -> None:
    """Copy each pipe into its file until every process holding its other end has closed it (what
    ``subprocess.run`` waits for: a child's own children inherit its stdout and stderr)."""
    import selectors

    files = {fd: open(path, "wb") for fd, path in ends.items()}
    with selectors.DefaultSelector() as selector:
        for fd in files:
            selector.register(fd, selectors.EVENT_READ)
        while files:
            for key, _ in selector.select():
                chunk = os.read(key.fd, 65536)
                if chunk:
                    files[key.fd].write(chunk)
                else:
                    selector.unregister(key.fd)
                    os.close(key.fd)
                    files.pop(key.fd).close()


def _become(request: dict) -> None:
    """Set this forked child up as ``python -m minisgl_core ARGV`` started in ``cwd`` with ``env``
    (its stdout and stderr are the helper's pipes already)."""
    opened = os.open(request["stdin"], os.O_RDONLY)
    os.dup2(opened, 0)
    os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # ``python -m`` puts its working directory first, then PYTHONPATH's folders (an empty entry:
    # the working directory again)
    sys.path[0:1] = [os.getcwd(), *(entry or os.getcwd() for entry in request["path_before"])]
    sys.argv = ["minisgl", *request["argv"]]  # (runpy sets argv[0] to the module's file)


def _run_as_main() -> None:
    """Run ``minisgl_core.__main__`` and end as the interpreter would — the exit code of its
    ``SystemExit`` or 1 after an uncaught exception's traceback, non-daemon threads joined,
    ``atexit`` callbacks run, stdio flushed — but without tearing the modules down (1.3 s of
    a CLI process's 3 with torch imported)."""
    import atexit
    import runpy

    try:
        runpy.run_module("minisgl_core", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter's exit calls first
    if shutdown is None:
        raise SystemExit(code)
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # (the interpreter's code for a stdout it could not flush)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    _become(_serve())
    _run_as_main()
