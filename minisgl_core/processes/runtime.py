"""The worker processes of one server node: spawning, the ready handshake, supervision and stopping.

Node 0 runs the tokenizer, the detokenizer and its share of the scheduler ranks; other nodes run
only their scheduler ranks. Every child reports ``ProcessReady`` or ``ProcessFailed`` (with its
traceback) on the control socket; a child that dies without a word is noticed by its exit code.
Stopping sends ``Shutdown`` down the pipeline so every process exits by itself, then kills
whatever is left (SIGKILL: the workers ignore SIGTERM, which reaches them with their process
group), and removes the private socket directory.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import zmq

from minisgl_core.config import ConfigError, EngineConfig
from minisgl_core.distributed import DistributedSpec, loopback_listener
from minisgl_core.messages import Limits, ProcessFailed, ProcessReady, Shutdown
from minisgl_core.processes.child import ChildSpec, run_child, stop_signals_blocked
from minisgl_core.processes.ipc import Endpoints, bind_pull, connect_push, recv, send

logger = logging.getLogger(__name__)

#: how long stopping waits for the processes to exit by themselves before it kills them (they
#: ignore SIGTERM: it reaches them with their process group, see run_child)
GRACEFUL_STOP_S = 5.0


class ChildFailed(RuntimeError):
    """A worker process failed; the message carries its traceback or exit status."""


class StartRefused(ChildFailed, ConfigError):
    """A worker refused a setting at start-up, one only it can judge (a KV pool or request tables
    past the memory free, a backend the GPU cannot run): a usage error, as the command line's own
    refusals are, its message the worker's one line. ``serve`` exited 1 with it logged under
    "the scheduler 0 process failed:"; the command line now says it as it says its own (exit
    code 2)."""

    def __init__(self, message: str) -> None:
        ConfigError.__init__(self, message)  # (no fields: the worker named the flags already)


#: how long a child's failure report waits for another child's exit code before it goes out alone
FAILURE_GRACE_S = 0.5
#: a child ended by SIGTERM / SIGINT this soon after this process got one was ended by the same one
SIGNAL_WINDOW_S = 2.0


class Failure(NamedTuple):
    """A child's failure, said twice: ``detail`` for the server log (the child's traceback, the
    exception's text), ``summary`` in one line for HTTP clients, without the exception's text:
    "the engine failed: tensor-parallel rank 1 exited with signal 9 (SIGKILL); see the server log"."""

    detail: str
    summary: str


@dataclass(frozen=True)
class RuntimeOptions:
    config: EngineConfig
    dist: DistributedSpec
    fingerprint: str
    disable_plugins: tuple[str, ...] = ()
    log_level: str = "info"
    #: CLI options for plugins' ProcessContext
    options: dict[str, Any] | None = None
    #: what requests inherit for the sampling fields they leave unset (checkpoint/generation_defaults.py)
    sampling_defaults: dict[str, Any] | None = None
    #: Jinja text replacing the tokenizer's chat template (``--chat-template``)
    chat_template: str | None = None
    #: the launcher's Plugins.state(), for the children's check of what they load
    plugin_state: list[Any] | None = None
    #: ``--reasoning-parser``'s tags (start, end), which the tokenizer worker looks up at start-up
    reasoning_tags: list[str] | None = None


class Runtime:
    def __init__(self, opts: RuntimeOptions) -> None:
        self.opts = opts
        self.endpoints = Endpoints.create()
        self.ctx = zmq.Context()
        self.control = bind_pull(self.ctx, self.endpoints.control)
        self.to_tokenizer: zmq.Socket | None = None
        self.procs: dict[str, mp.process.BaseProcess] = {}
        #: the first failure in full, for the log (clients get ``Failure.summary``)
        self.failure: str | None = None
        self.ready = False
        self._supervisor: threading.Thread | None = None
        self._stopping = threading.Event()
        #: when this process last got SIGTERM or SIGINT (:meth:`note_signal`; monotonic): a child
        #: that the same signal, sent to the whole process group, killed is part of the stop
        self._signalled_at: float | None = None

    @property
    def is_head(self) -> bool:
        return self.opts.dist.node_rank == 0

    # ------------------------------------------------------------------ start

    def _spec(self, role: str, rank: int = 0, **payload: Any) -> ChildSpec:
        o = self.opts
        return ChildSpec(
            role=role,
            endpoints=self.endpoints,
            fingerprint=o.fingerprint,
            disable_plugins=o.disable_plugins,
            log_level=o.log_level,
            launcher_pid=os.getpid(),
            rank=rank,
            tp_size=o.dist.tp_size,
            options=dict(o.options or {}),
            payload=payload,
            plugin_state=o.plugin_state,
        )

    def start(self) -> dict[str, Any]:
        """Spawn every process and wait until all are ready; return scheduler rank 0's report."""
        from minisgl_core.processes.scheduler_rank import scheduler_main
        from minisgl_core.processes.text_workers import detokenizer_main, tokenizer_main

        spawn = mp.get_context("spawn")
        children: list[tuple[str, ChildSpec, Callable]] = []
        if self.is_head:
            model = self.opts.config.model
            children += [
                (
                    "tokenizer",
                    self._spec(
                        "tokenizer",
                        model=model,
                        sampling_defaults=self.opts.sampling_defaults or {},
                        chat_template=self.opts.chat_template,
                        grammar_backend=self.opts.config.grammar_backend,
                        reasoning_tags=self.opts.reasoning_tags,
                    ),
                    tokenizer_main,
                ),
                ("detokenizer", self._spec("detokenizer", model=model), detokenizer_main),
            ]
            self.to_tokenizer = connect_push(self.ctx, self.endpoints.tokenizer)
        dist, listener = self.opts.dist, None
        if dist.tp_size > 1 and not dist.init_addr:  # one node: rank 0's store takes this socket over
            listener = loopback_listener(dist.tp_size)
            dist = replace(dist, init_addr=f"127.0.0.1:{listener.getsockname()[1]}")
        for rank in dist.local_ranks:
            extra = {"listener": listener} if rank == 0 and listener is not None else {}
            # (the front end read the sampling defaults: the engine takes them, not the file again)
            spec = self._spec(
                "scheduler",
                rank,
                config=self.opts.config,
                dist=dist,
                sampling_defaults=self.opts.sampling_defaults or {},
                **extra,
            )
            children.append((spec.name, spec, scheduler_main))
        try:
            for name, spec, main in children:
                proc = spawn.Process(
                    target=run_child, args=(spec, main), name=f"minisgl-{name}", daemon=False
                )
                with stop_signals_blocked():
                    proc.start()  # (rank 0 gets its own copy of the listener)
                self.procs[name] = proc
        finally:
            if listener is not None:
                listener.close()
        return self._wait_ready()

    def _wait_ready(self) -> dict[str, Any]:
        waiting = set(self.procs)
        info: dict[str, Any] = {}
        others: dict[str, Any] = {}  # what the other workers report (the tokenizer's vocabulary facts)
        last_note = time.monotonic()
        while waiting:
            msg = recv(self.control, timeout_ms=200)
            if isinstance(msg, ProcessReady):
                name = _name(msg.role, msg.rank)
                waiting.discard(name)
                logger.debug("%s ready", name)
                if name == "scheduler 0":
                    info = msg.info
                    assert self.to_tokenizer is not None
                    send(
                        self.to_tokenizer,
                        Limits(
                            info["max_context_len"],
                            info["kv_capacity_tokens"],
                            info["vocab_size"],
                            info["eos_token_ids"],
                        ),
                    )
                else:
                    others.update(msg.info)
            elif isinstance(msg, ProcessFailed):
                self.failure = f"the {_name(msg.role, msg.rank)} process failed:\n{msg.error}"
                if msg.refusal:
                    raise StartRefused(msg.refusal)
                raise ChildFailed(self.failure)
            elif msg is None and (dead := self._dead_child()) is not None:
                raise ChildFailed(dead.detail)
            if time.monotonic() - last_note > 60:
                logger.info("still starting: waiting for %s", ", ".join(sorted(waiting)))
                last_note = time.monotonic()
        self.ready = True
        return {**others, **info}

    # ------------------------------------------------------------------ supervision

    def all_exited(self) -> bool:
        return all(proc.exitcode is not None for proc in self.procs.values())

    def process_problem(self) -> str | None:
        """A local worker that is gone or stopped (SIGSTOP, a debugger), in words; None if all run.
        Cheap (one /proc read per process): /health calls it on every probe."""
        for name, proc in self.procs.items():
            if proc.exitcode is not None:
                return f"the {name} process exited with code {proc.exitcode}"
            if proc.pid is not None and _process_state(proc.pid) in ("T", "t"):
                return f"the {name} process is stopped"
        return None

    def signalled_within(self, seconds: float) -> bool:
        """Whether this process noted a SIGTERM or SIGINT less than ``seconds`` ago."""
        noted = self._signalled_at
        return noted is not None and time.monotonic() - noted < seconds

    def note_signal(self) -> None:
        """Called from this process's SIGTERM / SIGINT handler, before it unwinds to :meth:`stop`.
        One assignment and no lock: a handler that set a ``threading.Event`` deadlocked when a
        second signal (``timeout`` passing on the group's SIGTERM) interrupted the first inside
        the Event's lock."""
        self._signalled_at = time.monotonic()

    def _stopped_by_signal(self, exitcode: int) -> bool:
        """Whether a child that ``exitcode`` says a SIGTERM or SIGINT ended was ended by the same
        signal as this process: one sent to the whole group (``timeout``, a terminal's Ctrl-C, a
        service manager) reaches the children too, and one of them could die before this process's
        handler ran; that was reported as a failure (a traceback and exit code 1, about one stop in
        fifteen at TP=2). The workers now ignore both signals from birth (run_child,
        stop_signals_blocked); this stays for a worker whose plugin or library installs its own
        handlers. Waits up to ``FAILURE_GRACE_S`` for this process's handler; a signal
        noted longer ago than ``SIGNAL_WINDOW_S`` was another one (a shell's Ctrl-C stops a reply
        and the server goes on)."""
        if exitcode not in (-signal.SIGTERM, -signal.SIGINT):
            return False
        deadline = time.monotonic() + FAILURE_GRACE_S
        while not self._stopping.is_set():
            noted = self._signalled_at
            if noted is not None and time.monotonic() - noted <= SIGNAL_WINDOW_S:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _dead_child(self) -> Failure | None:
        for name, proc in self.procs.items():
            # On the other nodes, scheduler ranks exit with 0 when rank 0 shuts the group down.
            if proc.exitcode is not None and (proc.exitcode != 0 or self.is_head):
                if self._stopped_by_signal(proc.exitcode):
                    return None
                # Prefer the child's own report if it managed to send one.
                msg = recv(self.control, timeout_ms=100)
                if isinstance(msg, ProcessFailed) and msg.refusal and not self.ready:
                    self.failure = f"the {_name(msg.role, msg.rank)} process failed:\n{msg.error}"
                    raise StartRefused(msg.refusal)
                if isinstance(msg, ProcessFailed):
                    failure = self.failure_of(msg)
                else:
                    failure = self._exited(name, proc.exitcode)
                self.failure = failure.detail
                return failure
        return None

    def failure_of(self, msg: ProcessFailed) -> Failure:
        """A child's failure report, led by a child that had already exited abnormally: a rank whose
        peer died reports only a broken connection (under TP=2, killing scheduler 1 was reported as
        "the scheduler 0 process failed: RuntimeError: [gloo] Connection closed by peer"). Clients
        are told only the lead (its exit) or the reporter's exception class, never its text."""
        reporter = _name(msg.role, msg.rank)
        report = f"the {reporter} process failed:\n{msg.error}"
        # The peer's sockets close before it is reaped, so the report of the broken connection
        # can arrive while the killed rank has no exit code yet (a probe saw rank 0's gloo error
        # alone): give the others a moment to show theirs.
        deadline = time.monotonic() + FAILURE_GRACE_S
        while True:
            for name, proc in self.procs.items():
                if name != reporter and proc.exitcode not in (None, 0):
                    lead = self._exited(name, proc.exitcode)
                    # the reporter's traceback (60 lines from a step down to gloo's all_reduce)
                    # says only that it lost the peer: its last line says that too
                    said = msg.error.strip().splitlines()[-1] if msg.error.strip() else "an error"
                    return Failure(f"{lead.detail}; then the {reporter} process failed: {said}", lead.summary)
            if time.monotonic() >= deadline:
                raised = f"{self._who(reporter)} raised {msg.summary or 'an error'}"
                return Failure(report, _for_clients(raised))
            time.sleep(0.02)

    def _exited(self, name: str, exitcode: int) -> Failure:
        if exitcode >= 0:
            how = f"code {exitcode}"
        else:
            try:
                how = f"signal {-exitcode} ({signal.Signals(-exitcode).name})"
            except ValueError:
                how = f"signal {-exitcode}"
        return Failure(
            f"the {name} process exited unexpectedly with code {exitcode}",
            _for_clients(f"{self._who(name)} exited with {how}"),
        )

    def _who(self, name: str) -> str:
        """A child as clients know the server: ``tensor-parallel rank 1``, ``the tokenizer process``."""
        role, _, rank = name.partition(" ")
        if role == "scheduler" and self.opts.dist.tp_size > 1:
            return f"tensor-parallel rank {rank}"
        return f"the {role} process"

    def check_children(self, timeout_ms: int = 200) -> Failure | None:
        """Wait up to ``timeout_ms`` for a child's failure report, else look for a child that
        exited abnormally; the failure (also kept in ``self.failure``) or None. One thread at a
        time: :meth:`supervise`'s, or the caller's where nothing supervises."""
        msg = recv(self.control, timeout_ms=timeout_ms)
        if isinstance(msg, ProcessFailed):
            failure = self.failure_of(msg)
            self.failure = failure.detail
            return failure
        if msg is None and not self._stopping.is_set():
            return self._dead_child()
        return None

    def supervise(self, on_failure: Callable[[str], None]) -> None:
        """Watch the children from a thread; call ``on_failure(summary)`` once if one fails, with
        the one line for clients (``self.failure`` keeps the whole report for the log)."""

        def watch() -> None:
            while not self._stopping.is_set():
                failure = self.check_children()
                if failure is not None:
                    on_failure(failure.summary)
                    return

        self._supervisor = threading.Thread(target=watch, name="minisgl-supervisor", daemon=True)
        self._supervisor.start()

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        procs = list(self.procs.values())
        graceful = self.ready and self.failure is None
        if graceful and self.to_tokenizer is not None:
            # Through the pipeline: tokenizer -> scheduler 0 (-> every rank) -> detokenizer.
            send(self.to_tokenizer, Shutdown())
        # A process still loading (or a failed peer) would not see Shutdown for a while: kill it.
        deadline = time.monotonic() + (GRACEFUL_STOP_S if graceful else 0)
        for proc in procs:
            proc.join(max(deadline - time.monotonic(), 0))
            logger.debug("%s exit code %s", proc.name, proc.exitcode)
        for proc in procs:
            if proc.is_alive():
                logger.debug("killing %s", proc.name)
                proc.kill()
        for proc in procs:
            proc.join()
        self.ctx.destroy(linger=0)
        self.endpoints.remove()


def _process_state(pid: int) -> str | None:
    """The one-letter state of a Linux process (R, S, D, T, Z...), None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _for_clients(what: str) -> str:
    return f"the engine failed: {what}; see the server log"


def _name(role: str, rank: int) -> str:
    return f"{role} {rank}" if role == "scheduler" else role
