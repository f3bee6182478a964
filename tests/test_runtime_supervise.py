"""Which child a failure names when several fail at once."""

from __future__ import annotations

import time
from types import SimpleNamespace

from minisgl_core.messages import ProcessFailed
from minisgl_core.processes.runtime import Runtime
from minisgl_core.server.launcher import failure_summary


def test_a_rank_that_died_first_leads_the_report_of_the_rank_that_lost_it():
    """Under --tp 2, SIGKILL of scheduler 1 reached clients and the log as "the scheduler 0
    process failed: RuntimeError: [gloo] ... Connection closed by peer": rank 0's report of the
    broken connection came first and "scheduler 1" appeared nowhere (found by a probe)."""
    runtime = object.__new__(Runtime)  # (only its children's exit codes are read)
    runtime.procs = {
        "tokenizer": SimpleNamespace(exitcode=None),
        "scheduler 0": SimpleNamespace(exitcode=None),
        "scheduler 1": SimpleNamespace(exitcode=-9),
    }
    error = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: [gloo] Connection closed by peer'
    report = ProcessFailed(role="scheduler", rank=0, error=error)
    message = runtime.failure_of(report)
    assert message.startswith(
        "the scheduler 1 process exited unexpectedly with code -9; then the scheduler 0 process failed:\n"
    ), message
    assert failure_summary(message) == (
        "the scheduler 1 process exited unexpectedly with code -9; then the scheduler 0 process failed: "
        "RuntimeError: [gloo] Connection closed by peer"
    )
    # no other child exited (or one exited cleanly): the report as it was
    runtime.procs["scheduler 1"].exitcode = 0
    assert runtime.failure_of(report) == f"the scheduler 0 process failed:\n{error}"
    # the reporter's own exit code is not a cause of its report
    runtime.procs["scheduler 1"].exitcode, runtime.procs["scheduler 0"].exitcode = None, 1
    assert runtime.failure_of(report) == f"the scheduler 0 process failed:\n{error}"


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
    runtime = object.__new__(Runtime)
    runtime.procs = {
        "scheduler 0": SimpleNamespace(exitcode=None),
        "scheduler 1": _DiesAt(time.monotonic() + 0.1, -9),
    }
    report = ProcessFailed(role="scheduler", rank=0, error="RuntimeError: [gloo] Connection reset by peer")
    assert runtime.failure_of(report).startswith(
        "the scheduler 1 process exited unexpectedly with code -9; then "
    )
    # alone, it goes out after the grace period
    runtime.procs["scheduler 1"] = SimpleNamespace(exitcode=None)
    started = time.monotonic()
    assert runtime.failure_of(report).startswith("the scheduler 0 process failed:")
    assert time.monotonic() - started < 2
