"""What every child process of the server does around its real work.

A child (tokenizer, detokenizer, each scheduler rank) dies with the launcher, leaves Ctrl-C to
the launcher, logs with its role in every line, loads the plugins with the launcher's settings
and checks it sees the same set (fingerprint), then runs its main function. It reports
``ProcessReady`` once it can serve, and on any exception ``ProcessFailed`` with the traceback, so
the launcher can show the real error and exit non-zero instead of waiting forever.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from typing import Any

import zmq

from minisgl_core.api import ProcessContext
from minisgl_core.checkpoint.formats import ModelPathError
from minisgl_core.messages import ProcessFailed, ProcessReady
from minisgl_core.plugins import PluginError, Plugins
from minisgl_core.processes.ipc import LINGER_MS, Endpoints, connect_push, send

logger = logging.getLogger(__name__)

#: the signals a worker ignores: they reach it with its process group, and the launcher stops it
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Start worker processes inside this: a spawned process inherits the signal mask, so it is
    born with :data:`STOP_SIGNALS` blocked until :func:`run_child` ignores them (seconds of
    imports, in which a group's Ctrl-C printed each worker's traceback). This thread's own wait
    until the end of the block, then arrive."""
    # The first spawn starts multiprocessing's resource tracker, whose start unblocks these two
    # signals whatever was blocked before (CPython's ResourceTracker.ensure_running): start it
    # first, or the first worker is born with them unblocked.
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


ReportReady = Callable[[dict[str, Any]], None]
ChildMain = Callable[["ChildSpec", Plugins, zmq.Context, ReportReady], None]


@dataclass(frozen=True)
class ChildSpec:
    """Everything a child needs, passed once at spawn (plain values only)."""

    role: str
    endpoints: Endpoints
    #: the launcher's Plugins.fingerprint()
    fingerprint: str
    disable_plugins: tuple[str, ...]
    log_level: str
    launcher_pid: int
    #: scheduler rank (0 for the other roles) and TP size, for ProcessContext
    rank: int = 0
    tp_size: int = 1
    #: parsed CLI options, for ProcessContext.options
    options: dict[str, Any] = field(default_factory=dict)
    #: role-specific settings (the EngineConfig, the DistributedSpec, the model directory)
    payload: dict[str, Any] = field(default_factory=dict)
    #: the launcher's Plugins.state(), which a mismatch of fingerprints is explained from
    plugin_state: list[Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.role} {self.rank}" if self.role == "scheduler" else self.role


def _die_with_launcher(launcher_pid: int) -> None:
    """Ask Linux to SIGKILL this process when the launcher dies, so a killed launcher leaves no orphans."""
    if sys.platform.startswith("linux"):
        try:
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
        os._exit(1)


def _name_process(spec: ChildSpec) -> None:
    """Show the role in ``ps``/``top`` (Linux's 15-character comm), e.g. ``minisgl-sched0``:
    an operator (or a test) can tell which process is which."""
    short = {"tokenizer": "tok", "detokenizer": "detok", "scheduler": f"sched{spec.rank}"}
    name = short.get(spec.role, spec.role)
    if sys.platform.startswith("linux"):
        try:
            PR_SET_NAME = 15
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, f"minisgl-{name}"[:15].encode())
        except (OSError, AttributeError):
            pass


def _refused_setting(exc: BaseException) -> bool:
    """A PluginError, ModelPathError or ConfigError: a setting (or a model's files) the process
    refused at start-up. ConfigError is looked up only where its module is loaded (it imports
    torch, which the text workers do not)."""
    config = sys.modules.get("minisgl_core.config")
    return isinstance(exc, (PluginError, ModelPathError)) or (
        config is not None and isinstance(exc, config.ConfigError)
    )


def _file_gone(exc: BaseException) -> bool:
    """A file start-up read is missing, named by the error (the model's directory deleted while
    the workers loaded it: the launcher had checked it). Its traceback adds nothing."""
    return isinstance(exc, (FileNotFoundError, NotADirectoryError)) and exc.filename is not None


def _lost_peer(exc: BaseException) -> bool:
    """A TP rank whose peer is gone (``distributed.PeerLost``): the message says it all, the
    traceback (a gloo broadcast's) adds nothing. Looked up only where torch is loaded."""
    distributed = sys.modules.get("minisgl_core.distributed")
    return distributed is not None and isinstance(exc, distributed.PeerLost)


def _refusal(exc: BaseException) -> str:
    """A refused setting as the command line that started the server says it: a ConfigError
    names its settings by their flags (``--num-kv-tokens``), not their field names."""
    if isinstance(exc, (PluginError, ModelPathError, OSError)):  # (before config: it imports torch)
        return str(exc)
    from minisgl_core.config import ConfigError
    from minisgl_core.config_args import cli_message

    return cli_message(exc) if isinstance(exc, ConfigError) else str(exc)


def _summary(exc: BaseException) -> str:
    """``exc`` as HTTP clients may see it: its class, and the words it carries for them where it
    has some (``PluginFailure.summary`` names the plugin), never its text: that can hold a C++
    library's build paths (gloo's errors do), a file path or a prompt."""
    words = getattr(exc, "summary", None)
    return f"{type(exc).__name__}: {words}" if isinstance(words, str) and words else type(exc).__name__


def load_plugins(disable: Iterable[str]) -> Plugins:
    """The plugins, as the launcher loaded them: the deprecation warnings it showed once (a 1.x
    plugin's) are not shown again by each of the server's processes."""
    return Plugins.load(disable=disable, deprecation_warnings=False)


def process_context(spec: ChildSpec, plugins: Plugins) -> ProcessContext:
    """The context of the process ``spec`` starts, as its plugins see it (``minisgl_process_start``,
    a component's ``ctx``)."""
    return ProcessContext(
        role=spec.role, tp_rank=spec.rank, tp_size=spec.tp_size, options=spec.options, _plugins=plugins
    )


def run_child(spec: ChildSpec, main: ChildMain) -> None:
    """The spawn target of every child: set-up, ``main(spec, plugins, zmq_context, report_ready)``,
    reporting. Sockets the main function opens on the context are closed here, lingering so the
    last messages (a forwarded Shutdown, the failure report) still go out."""
    _die_with_launcher(spec.launcher_pid)
    _name_process(spec)
    # Ctrl-C, and SIGTERM from a service manager, `timeout` or `kill -TERM -PGID`, reach the whole
    # process group; the launcher alone decides how to stop (it drains the accepted requests
    # first: a worker that died at SIGTERM cut them off as "the engine failed"). The launcher
    # started this process with both blocked (see Runtime.start), so one that came during the
    # interpreter's start-up is dropped here, not a traceback from the middle of an import.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    logging.basicConfig(
        level=spec.log_level.upper(),
        format=f"%(asctime)s %(levelname)s [{spec.name}] %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    ctx = zmq.Context()
    control = connect_push(ctx, spec.endpoints.control)

    ready = False

    def report_ready(info: dict[str, Any]) -> None:
        nonlocal ready
        ready = True
        # What start-up built lives as long as the process: out of the collector's full passes,
        # which otherwise stall a request-serving loop now and then (see engine._freeze_startup_objects)
        gc.collect()
        gc.freeze()
        send(control, ProcessReady(spec.role, spec.rank, info))

    plugins: Plugins | None = None
    code = 0
    try:
        plugins = load_plugins(spec.disable_plugins)
        process_ctx = process_context(spec, plugins)
        plugins.check_fingerprint(spec.fingerprint, f"the {spec.name} process", spec.plugin_state)
        plugins.call_hook("minisgl_process_start", ctx=process_ctx)
        main(spec, plugins, ctx, report_ready)
    except SystemExit as exc:
        code = 0 if not exc.code else 1
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        code = 1
        if _refused_setting(exc) or (not ready and _file_gone(exc)):  # the message says it all
            message = _refusal(exc)
            # (the launcher says it, once: logged here too, it was said twice)
            logger.debug("%s process failed: %s", spec.name, message)
            error = f"{type(exc).__name__}: {message}"
            refusal = "" if ready else message
            send(control, ProcessFailed(spec.role, spec.rank, error, _summary(exc), refusal))
        elif _lost_peer(exc):
            logger.error("%s process failed: %s", spec.name, exc)
            send(control, ProcessFailed(spec.role, spec.rank, f"{type(exc).__name__}: {exc}", _summary(exc)))
        else:
            logger.error("%s process failed: %s: %s", spec.name, type(exc).__name__, exc)
            send(control, ProcessFailed(spec.role, spec.rank, traceback.format_exc(), _summary(exc)))
    finally:
        if plugins is not None and code == 0:
            # stop hooks are logged, never fatal, and one that raises does not skip the others
            for failure in plugins.call_hook("minisgl_process_stop", keep_going=True, ctx=process_ctx):
                logger.warning("%s", failure)
        ctx.destroy(linger=LINGER_MS)
    # Everything is closed: skip the interpreter's teardown, which takes seconds with torch loaded.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
