"""Which child a failure names when several fail at once, and what clients are told of it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import zmq

from minisgl_core.messages import ProcessFailed
from minisgl_core.processes.ipc import bind_pull, connect_push, send
from minisgl_core.processes.runtime import Runtime

#: what gloo raises in rank 0 when rank 1 dies (from a probe): the build's C++ source path
GLOO_ERROR = (
    'Traceback (most recent call last):\n  File "scheduler_rank.py", line 120, in scheduler_main\n'
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
    "peer [127.0.0.1]:41234"
)


def _runtime(procs: dict, tp_size: int = 2) -> Runtime:
    """A Runtime with only what failure reports read: its children's exit codes and the TP size."""
    runtime = object.__new__(Runtime)
    runtime.procs = procs
    runtime.opts = SimpleNamespace(dist=SimpleNamespace(tp_size=tp_size, node_rank=0))
    return runtime


def test_a_rank_that_died_first_leads_the_report_of_the_rank_that_lost_it():
    """Under --tp 2, SIGKILL of scheduler 1 reached clients and the log as "the scheduler 0
    process failed: RuntimeError: [gloo] ... Connection closed by peer": rank 0's report of the
    broken connection came first and "scheduler 1" appeared nowhere (found by a probe)."""
    runtime = _runtime(
        {
            "tokenizer": SimpleNamespace(exitcode=None),
            "scheduler 0": SimpleNamespace(exitcode=None),
            "scheduler 1": SimpleNamespace(exitcode=-9),
        }
    )
    error = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: [gloo] Connection closed by peer'
    report = ProcessFailed(role="scheduler", rank=0, error=error)
    message = runtime.failure_of(report).detail
    # the consequence in one line, not its traceback (60 lines from a step down to all_reduce)
    assert message == (
        "the scheduler 1 process exited unexpectedly with code -9; then the scheduler 0 process failed: "
        "RuntimeError: [gloo] Connection closed by peer"
    ), message
    assert runtime.failure_of(report).summary == (
        "the engine failed: tensor-parallel rank 1 exited with signal 9 (SIGKILL); see the server log"
    )
    # no other child exited (or one exited cleanly): the report as it was
    runtime.procs["scheduler 1"].exitcode = 0
    assert runtime.failure_of(report).detail == f"the scheduler 0 process failed:\n{error}"
    # the reporter's own exit code is not a cause of its report
    runtime.procs["scheduler 1"].exitcode, runtime.procs["scheduler 0"].exitcode = None, 1
    assert runtime.failure_of(report).detail == f"the scheduler 0 process failed:\n{error}"


class _DiesAt:
    """A child whose exit code appears at ``when`` (time.monotonic)."""

    def __init__(self, when: float, code: int) -> None:
        self.when, self.code = when, code

    @property
    def exitcode(self) -> int | None:
        return self.code if time.monotonic() >= self.when else None


def test_a_rank_reaped_just_after_its_peer_reported_still_leads_the_report():
    """Its sockets close before it is reaped: rank 0's report of the broken connection can come
    while rank 1 has no exit code yet (a probe got "the scheduler 0 process failed: RuntimeError:
    ... gloo ... Connection reset by peer" with scheduler 1 killed)."""
    runtime = _runtime(
        {
            "scheduler 0": SimpleNamespace(exitcode=None),
            "scheduler 1": _DiesAt(time.monotonic() + 0.1, -9),
        }
    )
    report = ProcessFailed(role="scheduler", rank=0, error="RuntimeError: [gloo] Connection reset by peer")
    assert runtime.failure_of(report).detail.startswith(
        "the scheduler 1 process exited unexpectedly with code -9; then "
    )
    # alone, it goes out after the grace period
    runtime.procs["scheduler 1"] = SimpleNamespace(exitcode=None)
    started = time.monotonic()
    assert runtime.failure_of(report).detail.startswith("the scheduler 0 process failed:")
    assert time.monotonic() - started < 2


def test_clients_are_told_which_process_failed_and_how_never_the_exception_text():
    """Clients got the reporter's exception text, e.g. gloo's error with the C++ source path of
    the build ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] ...", found by a
    probe): the message says which process failed and how, and points at the log, which keeps
    the traceback."""
    runtime = _runtime(
        {"scheduler 0": SimpleNamespace(exitcode=None), "scheduler 1": SimpleNamespace(exitcode=None)}
    )
    report = ProcessFailed("scheduler", 0, GLOO_ERROR, "RuntimeError")
    failure = runtime.failure_of(report)
    assert (
        failure.summary == "the engine failed: tensor-parallel rank 0 raised RuntimeError; see the server log"
    )
    assert failure.detail == f"the scheduler 0 process failed:\n{GLOO_ERROR}"
    # one rank, and the other workers: named as processes
    alone = _runtime({"scheduler 0": SimpleNamespace(exitcode=None)}, tp_size=1)
    assert alone.failure_of(report).summary == (
        "the engine failed: the scheduler process raised RuntimeError; see the server log"
    )
    tokenizer = ProcessFailed("tokenizer", 0, "Traceback ...\nKeyError: 'secret prompt'", "KeyError")
    assert alone.failure_of(tokenizer).summary == (
        "the engine failed: the tokenizer process raised KeyError; see the server log"
    )
    # a report from an older child without a summary still names the process
    assert alone.failure_of(ProcessFailed("detokenizer", 0, "boom")).summary == (
        "the engine failed: the detokenizer process raised an error; see the server log"
    )
    # exits: a signal by number and name, an exit code as such
    assert alone._exited("detokenizer", -11).summary == (
        "the engine failed: the detokenizer process exited with signal 11 (SIGSEGV); see the server log"
    )
    assert runtime._exited("scheduler 1", 3).summary == (
        "the engine failed: tensor-parallel rank 1 exited with code 3; see the server log"
    )


def test_the_supervisor_hands_clients_the_summary_and_keeps_the_error_for_the_log():
    """What ``supervise`` passes on is what the server answers its clients (``ServerState.fail``);
    the log keeps the lost rank's error line (its traceback only said that it lost the peer)."""
    runtime = _runtime(
        {"scheduler 0": SimpleNamespace(exitcode=None), "scheduler 1": SimpleNamespace(exitcode=-9)}
    )
    ctx = zmq.Context()
    address = f"inproc://control-{id(runtime)}"
    runtime.control = bind_pull(ctx, address)
    runtime.failure, runtime._supervisor, runtime._stopping = None, None, threading.Event()
    told: list[str] = []
    try:
        runtime.supervise(told.append)
        push = connect_push(ctx, address)
        send(push, ProcessFailed("scheduler", 0, GLOO_ERROR, "RuntimeError"))
        runtime._supervisor.join(10)
        push.close(linger=0)
    finally:
        runtime._stopping.set()
        runtime.control.close(linger=0)
        ctx.term()
    assert told == [
        "the engine failed: tensor-parallel rank 1 exited with signal 9 (SIGKILL); see the server log"
    ]
    assert "pair.cc" not in told[0]
    assert runtime.failure is not None and GLOO_ERROR.splitlines()[-1] in runtime.failure  # the log's
    assert "Traceback" not in runtime.failure


def _watching(procs: dict) -> tuple[Runtime, zmq.Context]:
    """:func:`_runtime` with what :meth:`Runtime.check_children` reads: a control socket that
    nothing sends to, and the stop and signal state of a new Runtime."""
    runtime = _runtime(procs, tp_size=1)
    ctx = zmq.Context()
    runtime.control = bind_pull(ctx, f"inproc://control-{id(runtime)}")
    runtime.failure, runtime._stopping = None, threading.Event()
    runtime._signalled_at = None
    return runtime, ctx


def test_a_child_ended_by_the_signal_that_stops_the_server_is_no_failure():
    """SIGTERM to the whole process group (``timeout``, a service manager) reaches the children
    too: a child that died of it before the server's own handler ran was reported as a failure,
    and the stop printed a traceback and exited 1 (about one stop in fifteen at --tp 2, found by a
    probe). The same exit with no signal to the server, or a signal long before, is a failure."""
    for code in (-15, -2):
        runtime, ctx = _watching({"tokenizer": SimpleNamespace(exitcode=code)})
        try:
            # the server's handler runs 0.1 s after the child's death is seen
            threading.Timer(0.1, runtime.note_signal).start()
            assert runtime.check_children(timeout_ms=10) is None and runtime.failure is None
        finally:
            runtime.control.close(linger=0)
            ctx.term()
    # no signal to the server: the child's death is a failure, after the grace
    runtime, ctx = _watching({"tokenizer": SimpleNamespace(exitcode=-15)})
    try:
        started = time.monotonic()
        failure = runtime.check_children(timeout_ms=10)
        assert failure is not None and "exited with signal 15 (SIGTERM)" in failure.summary
        assert time.monotonic() - started >= 0.4
        # a signal noted long ago (a shell's Ctrl-C that stopped a reply) is another signal
        runtime.failure = None
        runtime.note_signal()
        runtime._signalled_at -= 10
        assert runtime.check_children(timeout_ms=10) is not None
    finally:
        runtime.control.close(linger=0)
        ctx.term()
    # SIGKILL is never the server's stop
    runtime, ctx = _watching({"tokenizer": SimpleNamespace(exitcode=-9)})
    try:
        runtime.note_signal()
        assert runtime.check_children(timeout_ms=10) is not None
    finally:
        runtime.control.close(linger=0)
        ctx.term()


#: run in a fresh interpreter: the first process it spawns also starts multiprocessing's resource
#: tracker (as the launcher's first worker does), whose start unblocked the signals
_SPAWN_THREE = """
import multiprocessing, signal, sys
from minisgl_core.processes.child import stop_signals_blocked

def report():
    print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)

if __name__ == "__main__":
    spawn = multiprocessing.get_context("spawn")
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    for _ in range(3):
        with stop_signals_blocked():
            proc = spawn.Process(target=report)
            proc.start()
        proc.join(60)
    print("parent", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])) == sorted(before))
"""


def test_every_worker_is_born_with_the_stop_signals_blocked(tmp_path):
    """A Ctrl-C to the group while the workers imported torch (the seconds before run_child set
    SIGINT ignored) printed each worker's KeyboardInterrupt traceback; the launcher now starts them
    with SIGINT and SIGTERM blocked, the first one too, and its own thread gets its mask back."""
    import json
    import signal
    import subprocess
    import sys

    script = tmp_path / "spawn_three.py"
    script.write_text(_SPAWN_THREE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    stop = {int(signal.SIGINT), int(signal.SIGTERM)}
    assert len(lines) == 4 and all(stop <= set(json.loads(line)) for line in lines[:3]), lines
    assert lines[3] == "parent True", lines


def _main_reading_a_missing_file(spec, plugins, ctx, report_ready) -> None:
    open(spec.payload["model"] + "/tokenizer.json")  # (the directory was deleted meanwhile)


def test_a_file_gone_during_start_up_is_one_line_not_a_traceback(tmp_path):
    """The model's directory deleted while the workers loaded it: each worker's FileNotFoundError
    traceback was printed (a probe's find). The file's name says it all."""
    import multiprocessing
    import os

    from minisgl_core.plugins import Plugins
    from minisgl_core.processes.child import ChildSpec, run_child
    from minisgl_core.processes.ipc import Endpoints, recv

    endpoints = Endpoints.create()
    ctx = zmq.Context()
    control = bind_pull(ctx, endpoints.control)
    plugins = Plugins.load()
    spec = ChildSpec(role="tokenizer", endpoints=endpoints, fingerprint=plugins.fingerprint(),
                     disable_plugins=(), log_level="error", launcher_pid=os.getpid(),
                     payload={"model": str(tmp_path / "gone")}, plugin_state=plugins.state())  # fmt: skip
    proc = multiprocessing.get_context("spawn").Process(
        target=run_child, args=(spec, _main_reading_a_missing_file)
    )
    try:
        proc.start()
        report = recv(control, timeout_ms=60_000)
        proc.join(30)
    finally:
        control.close(linger=0)
        ctx.term()
        endpoints.remove()
    assert isinstance(report, ProcessFailed) and proc.exitcode == 1, report
    assert "Traceback" not in report.error, report.error
    assert report.error == (
        f"FileNotFoundError: [Errno 2] No such file or directory: '{tmp_path / 'gone'}/tokenizer.json'"
    ), report.error
